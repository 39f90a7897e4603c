/*
 * How soon the worker applies an event, on the embedded cluster (or
 * KEYLANE_TEST_BOOTSTRAP's): a batch does not wait worker.batch.wait.ms
 * to fill when nothing else is left to run; the latency histograms count
 * what was applied; a worker of an embedded cluster fetches with a short
 * fetch.wait.max.ms, since that cluster holds an empty fetch for all of it;
 * each group commit's duration has a histogram of its own; offsets go to
 * Kafka at most every KL__KAFKA_COMMIT_MS, not once per group commit, and
 * the last watermark gets there without another commit.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/kafka.h"
#include "common/metrics.h"
#include "support/cluster.h"
#include "support/support.h"
#include "worker/lanes_internal.h"
#include "worker/worker_internal.h"

/* A batch wait far beyond the test's patience: only the idle commit can
 * apply the events before the test gives up. */
static const char *const kl_slow_batches[] = {
    "worker.session.timeout.ms=3000", "worker.batch.wait.ms=10000", NULL};

static void kl_wait_owned(kl_worker_t *worker, int32_t partitions) {
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 3000 && st.owned < partitions; i++) {
    kl_t_sleep_ms(10);
    kl_worker_stats(worker, &st, sizeof(st));
  }
  assert_int_equal(st.owned, partitions);
}

/* A worker on @p partitions partitions of a new topic, owning them all,
 * a durable store, and a ledger publisher. */
typedef struct kl_fx {
  char dir[64];
  kl_t_cluster_t *cluster;
  const char *topic;
  kl_store_t *store;
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
  kl_t_worker_t *w;
} kl_fx_t;

static void kl_fx_start(kl_fx_t *fx, const char *name, int32_t partitions,
                        const char *const *conf) {
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_t_cluster_new(1, name, partitions, &fx->cluster), KL_OK);
  fx->topic = kl_t_topic(fx->cluster);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
  fx->gen = kl__ledger_gen_new(10, partitions, 7);
  fx->producer = kl_t_producer(kl_t_bootstrap(fx->cluster), fx->gen);
  fx->w = kl_t_worker_start(kl_t_bootstrap(fx->cluster), fx->topic,
                            kl_t_group(fx->cluster, name), fx->store, conf);
  kl_wait_owned(fx->w->worker, partitions);
}

static void kl_fx_stop(kl_fx_t *fx) {
  assert_int_equal(kl_t_worker_stop(fx->w), KL_OK);
  kl_producer_destroy(fx->producer);
  kl__ledger_gen_destroy(fx->gen);
  kl_store_destroy(fx->store);
  kl_t_cluster_destroy(fx->cluster);
  kl_t_rmrf(fx->dir);
}

/* The store commits' own histogram counted at least one commit, and as
 * many observations as its +Inf bucket holds. */
static void kl_assert_commits_timed(const char *text, const char *topic) {
  char name[256];
  snprintf(name, sizeof(name),
           "keylane_worker_store_commit_seconds_count{topic=\"%s\"} ", topic);
  const char *at = strstr(text, name);
  if (!at)
    fail_msg("\"%s\" not in:\n%s", name, text);
  long commits = strtol(at + strlen(name), NULL, 10);
  assert_true(commits >= 1);
  snprintf(name, sizeof(name),
           "keylane_worker_store_commit_seconds_bucket{topic=\"%s\","
           "le=\"+Inf\"} %ld\n",
           topic, commits);
  if (!strstr(text, name))
    fail_msg("\"%s\" not in:\n%s", name, text);
}

static void test_idle_worker_commits_without_waiting(void **state) {
  kl_fx_t fx;
  kl_fx_start(&fx, "idle", 2, kl_slow_batches);
  for (int i = 0; i < 5; i++)
    assert_int_equal(kl__ledger_gen_publish(fx.gen, fx.producer, fx.topic),
                     KL_OK);
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  /* Committed (the store's watermarks) well before the batch wait. */
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 8000), 0);
  assert_int_equal(kl_t_workers_applied(&fx.w, 1, 5, 10000), 5);
  size_t len;
  char *text = kl__metrics_render(kl__worker_metrics(fx.w->worker), &len);
  char line[256];
  snprintf(line, sizeof(line),
           "keylane_worker_event_latency_seconds_count{topic=\"%s\"} 5\n",
           fx.topic);
  if (!strstr(text, line))
    fail_msg("\"%s\" not in:\n%s", line, text);
  kl_assert_commits_timed(text, fx.topic);
  free(text);
  kl_fx_stop(&fx);
}

/* The offset the group committed for partition 0, or -1. */
static int64_t kl_group_offset(kl_worker_t *worker, const char *topic) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, 0);
  int64_t offset = -1;
  if (rd_kafka_committed(kl__worker_consumer(worker), l, 5000) == 0 &&
      !l->elems[0].err)
    offset = l->elems[0].offset;
  rd_kafka_topic_partition_list_destroy(l);
  return offset;
}

static void test_offsets_go_to_kafka_at_most_every_interval(void **state) {
  const char *const conf[] = {"worker.session.timeout.ms=3000", NULL};
  kl_fx_t fx;
  kl_fx_start(&fx, "offsets", 1, conf);
  uint64_t before = kl__worker_kafka_commits(fx.w->worker);
  /* One event at a time, each applied before the next: a group commit
   * each. */
  const int events = 60;
  int64_t t0 = kl__mono_ns();
  for (int i = 0; i < events; i++) {
    assert_int_equal(kl__ledger_gen_publish(fx.gen, fx.producer, fx.topic),
                     KL_OK);
    assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
    assert_int_equal(kl_t_workers_applied(&fx.w, 1, (uint64_t)i + 1, 10000),
                     (uint64_t)i + 1);
  }
  int64_t elapsed_ms = (kl__mono_ns() - t0) / 1000000;
  kl_worker_stats_t st;
  kl_worker_stats(fx.w->worker, &st, sizeof(st));
  uint64_t sent = kl__worker_kafka_commits(fx.w->worker) - before;
  assert_true(st.batches >= (uint64_t)events);
  if (sent > (uint64_t)(elapsed_ms / KL__KAFKA_COMMIT_MS + 2))
    fail_msg("%" PRIu64 " offset commits for %" PRIu64 " group commits in "
             "%" PRId64 " ms: more than one per %d ms",
             sent, st.batches, elapsed_ms, KL__KAFKA_COMMIT_MS);
  /* The last watermark reaches Kafka though nothing is committed after. */
  int64_t offset = -1;
  for (int i = 0; i < 100 && offset != events; i++) {
    offset = kl_group_offset(fx.w->worker, fx.topic);
    if (offset != events)
      kl_t_sleep_ms(50);
  }
  assert_int_equal(offset, events);
  kl_fx_stop(&fx);
}

static void kl_assert_fetch_wait(kl_worker_t *worker, const char *want) {
  char have[32] = "";
  size_t size = sizeof(have);
  assert_int_equal(rd_kafka_conf_get(rd_kafka_conf(kl__worker_consumer(worker)),
                                     "fetch.wait.max.ms", have, &size),
                   RD_KAFKA_CONF_OK);
  assert_string_equal(have, want);
}

static void test_embedded_consumer_fetches_promptly(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "fetch", 1, &cluster), KL_OK);
  char boot[256];
  snprintf(boot, sizeof(boot), "%s", kl_t_bootstrap(cluster));
  int real = kl_t_cluster_is_real(cluster);
  assert_int_equal(kl__embedded_local(boot), !real);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_t_worker_t *w = kl_t_worker_new(boot, kl_t_topic(cluster),
                                     kl_t_group(cluster, "fetch"), store, NULL);
  /* Kafka answers a fetch when records come: its default stays. */
  kl_assert_fetch_wait(w->worker, real ? "500" : KL_EMBEDDED_FETCH_WAIT_MS);
  kl_worker_destroy(w->worker);
  free(w);
  /* Any other cluster: Kafka's default (kl_worker_new() connects to
   * nothing yet). */
  w = kl_t_worker_new("127.0.0.1:1", kl_t_topic(cluster),
                      kl_t_group(cluster, "fetch"), store, NULL);
  kl_assert_fetch_wait(w->worker, "500");
  kl_worker_destroy(w->worker);
  free(w);
  /* A setting of the user's wins. */
  const char *const mine[] = {"kafka.fetch.wait.max.ms=77", NULL};
  w = kl_t_worker_new(boot, kl_t_topic(cluster), kl_t_group(cluster, "fetch"),
                      store, mine);
  kl_assert_fetch_wait(w->worker, "77");
  kl_worker_destroy(w->worker);
  free(w);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  assert_false(kl__embedded_local(boot));
  assert_false(kl__embedded_local(NULL));
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idle_worker_commits_without_waiting),
      cmocka_unit_test(test_embedded_consumer_fetches_promptly),
      cmocka_unit_test(test_offsets_go_to_kafka_at_most_every_interval),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
