/*
 * kl_worker_health() and kl_worker_foreach_partition() (keylane/worker.h)
 * as a program that embeds a worker calls them, on the embedded cluster:
 * a size the caller did not set is refused, naming the fix; a worker that
 * applies its events is OK and lists its partition with its epoch,
 * watermark and lag; once its handler keeps asking to retry, the
 * partition is RETRYING, then stalled past worker.stall.ms, and the
 * worker FAILING with the cause STALLED and a reason naming the
 * partition; a caller built with a shorter struct gets its part only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/worker.h"

#include "support/cluster.h"
#include "support/support.h"

static atomic_int kl_retry; /* the handler asks to retry while set */

static kl_handler_result_t kl_handler(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)event, (void)fence, (void)txn;
  if (!atomic_load(&kl_retry))
    return KL_HANDLER_OK;
  snprintf(errbuf, errbuf_size, "the test's handler says retry");
  return KL_HANDLER_RETRY;
}

/* What kl_worker_foreach_partition() listed: the last partition. */
typedef struct kl_seen {
  int count;
  kl_worker_partition_t last;
} kl_seen_t;

static int kl_collect(void *opaque, const kl_worker_partition_t *partition) {
  kl_seen_t *seen = opaque;
  seen->count++;
  memcpy(&seen->last, partition,
         partition->size < sizeof(seen->last) ? partition->size
                                              : sizeof(seen->last));
  return 0;
}

static kl_seen_t kl_partitions(kl_worker_t *worker) {
  kl_seen_t seen = {0};
  assert_int_equal(kl_worker_foreach_partition(worker, kl_collect, &seen),
                   KL_OK);
  return seen;
}

static kl_worker_health_t kl_health(kl_worker_t *worker) {
  kl_worker_health_t health = {.size = sizeof(health)};
  assert_int_equal(kl_worker_health(worker, &health), KL_OK);
  assert_int_equal(health.size, sizeof(health));
  return health;
}

static void test_health_and_partitions(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "health", 1, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster), *boot = kl_t_bootstrap(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  static const char *const conf[] = {
      "worker.session.timeout.ms=3000", "worker.stall.ms=1500",
      "worker.max.attempts=1000",       "worker.retry.initial.ms=50",
      "worker.retry.max.ms=100",        NULL};
  kl_t_worker_t *w = kl_t_worker_new_with(boot, topic, kl_t_group(cluster, "g"),
                                          store, conf, kl_handler, NULL);

  /* Misuse: no size set, and NULL arguments. */
  kl_worker_health_t unset = {0};
  assert_int_equal(kl_worker_health(w->worker, &unset), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "sizeof(kl_worker_health_t)"));
  assert_int_equal(kl_worker_health(NULL, &unset), KL_EINVAL);
  assert_int_equal(kl_worker_foreach_partition(w->worker, NULL, NULL),
                   KL_EINVAL);

  /* Healthy: it applies what it is given and owns its partition. */
  kl_t_worker_go(w);
  for (int i = 0; i < 3; i++) {
    char key[8], id[40];
    snprintf(key, sizeof(key), "k%d", i);
    snprintf(id, sizeof(id), "0190a0a0-0000-7000-8000-00000000000%d", i);
    assert_int_equal(kl_t_produce_credit(boot, topic, 0, key, id, 5), 0);
  }
  kl_seen_t seen = {0};
  for (int i = 0; i < 300; i++) { /* until applied and the lag known */
    seen = kl_partitions(w->worker);
    if (seen.count == 1 && seen.last.watermark == 3 && seen.last.lag == 0)
      break;
    kl_t_sleep_ms(100);
  }
  assert_int_equal(seen.count, 1);
  assert_int_equal(seen.last.size, sizeof(kl_worker_partition_t));
  assert_int_equal(seen.last.partition, 0);
  assert_int_equal(seen.last.status, KL_WORKER_PARTITION_OK);
  assert_int_equal(seen.last.flags, KL_WORKER_PARTITION_OWNED);
  assert_true(seen.last.epoch > 0);
  assert_int_equal(seen.last.watermark, 3);
  assert_int_equal(seen.last.high, 3);
  assert_int_equal(seen.last.lag, 0);
  assert_int_equal(seen.last.records, 0);
  assert_int_equal(seen.last.oldest_ts_ms, 0);
  assert_true(seen.last.lag_seconds == 0);
  kl_worker_health_t health = kl_health(w->worker);
  assert_int_equal(health.status, KL_WORKER_HEALTH_OK);
  assert_int_equal(health.cause, KL_WORKER_CAUSE_NONE);
  assert_int_equal(health.owned, 1);
  assert_string_equal(health.reason, "ok: owns 1 partitions\n");

  /* A handler that keeps asking to retry holds the partition: RETRYING at
   * once, stalled after worker.stall.ms, and the worker FAILING. */
  atomic_store(&kl_retry, 1);
  assert_int_equal(kl_t_produce_credit(boot, topic, 0, "k9",
                                       "0190a0a0-0000-7000-8000-000000000009",
                                       5),
                   0);
  for (int i = 0; i < 300; i++) {
    health = kl_health(w->worker);
    if (health.status == KL_WORKER_HEALTH_FAILING)
      break;
    kl_t_sleep_ms(100);
  }
  assert_int_equal(health.status, KL_WORKER_HEALTH_FAILING);
  assert_int_equal(health.cause, KL_WORKER_CAUSE_STALLED);
  if (!strstr(health.reason, "partition 0 holds 1 records, watermark 3"))
    fail_msg("the reason does not name the partition: %s", health.reason);
  seen = kl_partitions(w->worker);
  assert_int_equal(seen.count, 1);
  assert_int_equal(seen.last.status, KL_WORKER_PARTITION_STALL);
  assert_int_equal(seen.last.flags, KL_WORKER_PARTITION_OWNED |
                                        KL_WORKER_PARTITION_STALLED |
                                        KL_WORKER_PARTITION_RETRYING);
  assert_int_equal(seen.last.watermark, 3);
  assert_int_equal(seen.last.records, 1);
  assert_int_equal(seen.last.waiting, 1);
  assert_true(seen.last.unmoved_ms >= 1500);
  assert_int_equal(seen.last.lag, 1);
  /* kl_t_produce_credit() stamps its envelopes ts = 1 (ms). */
  assert_int_equal(seen.last.oldest_ts_ms, 1);
  assert_true(seen.last.lag_seconds > 1.7e9);

  /* A caller built when the struct ended inside the reason gets that much,
   * still a string, and nothing past its size is written. */
  struct {
    kl_worker_health_t health;
    char guard[16];
  } small;
  memset(&small, 0x5a, sizeof(small));
  size_t cut = offsetof(kl_worker_health_t, reason) + 12;
  small.health.size = cut;
  assert_int_equal(kl_worker_health(w->worker, &small.health), KL_OK);
  assert_int_equal(small.health.size, cut);
  assert_int_equal(small.health.status, KL_WORKER_HEALTH_FAILING);
  assert_string_equal(small.health.reason, "unhealthy: ");
  assert_int_equal(((unsigned char *)&small.health)[cut], 0x5a);

  atomic_store(&kl_retry, 0); /* let it drain, so that it stops */
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_health_and_partitions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
