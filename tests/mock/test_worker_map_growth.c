/*
 * A worker whose LMDB map must grow (store.map.size) while it owns several
 * partitions, on the embedded cluster. At worker.concurrency 1 every
 * lane's group txn is on the worker's thread, and a growth waits for every
 * transaction of the process to end: a commit of some lanes that needed
 * the growth waited 2 s for the others' open batches, on its own thread,
 * and failed (KL_ESTORE_BUSY), again and again, until all lanes happened
 * to commit together. `keylane-bench timers --timers 1000000` kept 4,828
 * timers a second through the one growth of the default 256 MiB map
 * (39 failed commits in 137 s), 20,862 with `--map-mib 2048`. Now after
 * such a failure the next commit takes every lane that may commit, so
 * that the growth finds no batch open: at most one failed commit per
 * growth (this test: 8 failed for 3 growths before, 20,000 timers not
 * kept in 60 s; 14 s now).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "common/internal.h"
#include "store/store_internal.h"

#define TOPIC "mapgrow"
#define PARTITIONS 8
#define EVENTS 20000
#define VALUE 600 /* bytes each event writes: ~5 MB, three growths of 1M */

/* Writes VALUE bytes under the event's key and id. */
static kl_handler_result_t write_value(void *opaque, const kl_event_t *event,
                                       const kl_fence_t *fence, kl_txn_t *txn,
                                       char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)fence;
  static const char v[VALUE];
  char k[128];
  int n = snprintf(k, sizeof(k), "%.*s/%.*s", (int)event->key_len,
                   (const char *)event->key, (int)event->id_len, event->id);
  kl_err_t err = kl_txn_put(txn, k, (size_t)n, v, sizeof(v));
  if (err) {
    snprintf(errbuf, errbuf_size, "%s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}

/* The failed commits @p log tells of: a failed group commit logs a line
 * per lane, all in the same second (its timestamp's first 19 characters),
 * and a growth that fails waits 2 s, so each second with such lines is
 * one. */
static int failed_commits(const char *log) {
  static const char what[] = "failed (KL_ESTORE_BUSY)";
  char last[20] = "";
  int n = 0;
  for (const char *at = log; (at = strstr(at, what)); at += strlen(what)) {
    const char *line = at;
    while (line > log && line[-1] != '\n')
      line--;
    if (at - line >= 19 && strncmp(line, last, 19) != 0) {
      memcpy(last, line, 19);
      n++;
    }
  }
  return n;
}

static void test_map_grows_under_lanes(void **state) {
  (void)state;
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, TOPIC, PARTITIONS, &cluster), KL_OK);
  const char *boot = kl_t_bootstrap(cluster), *topic = kl_t_topic(cluster);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store = kl_t_store_open(dir, "store.map.size", "1M", NULL);
  kl_conf_t *pconf = kl_conf_new();
  kl_producer_t *producer = NULL;
  assert_int_equal(kl_conf_set(pconf, "kafka.bootstrap.servers", boot), KL_OK);
  assert_int_equal(kl_producer_new(pconf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(pconf);
  kl_t_stderr_t err;
  kl_t_stderr_begin(&err);
  kl_t_worker_t *w = kl_t_worker_new_with(
      boot, topic, kl_t_group(cluster, TOPIC), store, NULL, write_value, NULL);
  kl_t_worker_go(w);
  int64_t nb = kl__now_ms() + 3600000;
  for (int i = 0; i < EVENTS; i++) {
    char key[16];
    snprintf(key, sizeof(key), "key-%05d", i % 10000);
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "put",
                     .type_len = 3,
                     .payload = "x",
                     .payload_len = 1,
                     .not_before = nb};
    assert_int_equal(kl_publish(producer, topic, &ev, NULL), KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 1200 && st.timers_scheduled < EVENTS; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  kl_err_t stopped = kl_t_worker_stop(w);
  char *log = kl_t_stderr_end(&err);
  kl__store_usage_t u;
  assert_int_equal(kl__store_lmdb_usage(store, &u), KL_OK);
  int grown = 0;
  for (size_t m = 1u << 20; m < u.map_size; m *= 2)
    grown++;
  int busy = failed_commits(log);
  free(log);
  kl_producer_destroy(producer);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
  kl_t_cluster_destroy(cluster);
  assert_int_equal(stopped, KL_OK);
  assert_int_equal(st.timers_scheduled, EVENTS);
  assert_true(grown >= 1);
  if (busy > grown)
    fail_msg("%d commits failed KL_ESTORE_BUSY for %d map growths", busy,
             grown);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_grows_under_lanes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
