/*
 * Allocations on the worker's steady path: a ledger worker applying
 * credits over 500 keys may not call malloc, calloc or realloc per event,
 * and calls a bounded few per batch: a batch's store transaction reuses
 * the buffers of a finished one (store/txn_buffer.h), so what is left is
 * the Kafka commit and the lanes' bookkeeping.
 *
 * The test program counts malloc, calloc and realloc calls
 * (support/alloc_count.h) made by every thread but the test's own, while
 * armed, by the library the call comes from. librdkafka's
 * own calls are counted apart: it allocates an op per message it fetches,
 * which keylane cannot change. So are LMDB's: it keeps every dirty page it
 * ever allocated for the next write, and allocates one more only as the
 * batches' writes touch more pages than before (the ids' tree grows with
 * the events), a cost per event, bounded as such. The bound per batch is
 * on the rest (keylane, the handler, msgpack-c, libc on their behalf).
 * Not built with a sanitizer, which brings its own malloc.
 */
#include "support/alloc_count.h"

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
#include "support/support.h"
#include "cli/ledger_gen.h"

enum { LIB_RDKAFKA, LIB_LMDB, LIB_REST };
static kl_t_alloc_lib_t libs[] = {{.name = "librdkafka"},
                                  {.name = "liblmdb"},
                                  {.name = "keylane and the rest"}};

enum { EVENTS = 40000, KEYS = 500, WARM = 10000, MEASURE_TO = 35000 };

/* The bound per batch on the rest's allocations. */
#define KL_T_ALLOCS_PER_BATCH 20

static void steady_path_allocates_nothing_per_event(void **state) {
  (void)state;
  /* both are linked in */
  assert_true(kl_t_allocs_init(libs, sizeof(libs) / sizeof(libs[0])));
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "allocs", 4, &cluster), KL_OK);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(cluster)),
      KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  for (int i = 0; i < EVENTS; i++) {
    char key[16];
    int n = snprintf(key, sizeof(key), "acct-%d", i % KEYS);
    assert_int_equal(kl__ledger_gen_send(producer, kl_t_topic(cluster), key,
                                         (size_t)n, NULL, "credit", 1, 0, NULL),
                     KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  /* A window of 2,000 records per partition: the 40,000 events pass through
   * it 5 times, as a worker's window turns over in production. */
  const char *const extra[] = {"worker.window.max=2000", NULL};
  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(cluster), kl_t_topic(cluster),
                        kl_t_group(cluster, "allocs"), store, extra);
  uint64_t from = kl_t_workers_applied(&w, 1, WARM, 60000);
  assert_true(from >= WARM);
  kl_worker_stats_t st0, st1;
  kl_t_allocs_arm(true);
  kl_worker_stats(w->worker, &st0, sizeof(st0));
  uint64_t to = kl_t_workers_applied(&w, 1, MEASURE_TO, 60000);
  kl_worker_stats(w->worker, &st1, sizeof(st1));
  kl_t_allocs_arm(false);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_true(to >= MEASURE_TO);
  /* The counts cover the events and batches committed while armed, give
   * or take the batch the worker was in at either end. */
  double events = (double)(st1.applied - st0.applied);
  double batches = (double)(st1.batches - st0.batches);
  double rest = (double)atomic_load(&libs[LIB_REST].calls);
  double lmdb = (double)atomic_load(&libs[LIB_LMDB].calls);
  printf("over %.0f events in %.0f batches:\n", events, batches);
  for (int i = 0; i < 3; i++) {
    double n = (double)atomic_load(&libs[i].calls);
    printf("%7.0f allocations by %s: %.4f per event, %.1f per batch\n", n,
           libs[i].name, n / events, n / batches);
  }
  kl_t_allocs_print_sites();
  /* A batch's transaction and commit may allocate a few; an event may not.
   * Measured (2 cores, shared): 10 to 20 per batch, from the Kafka commit
   * and the lanes (worker/); 55 to 60 before a batch reused a finished
   * one's buffers. */
  assert_true(batches >= 1);
  assert_true(rest <= events / 1000 + KL_T_ALLOCS_PER_BATCH * batches);
  /* LMDB's new dirty pages as the ids' tree grows: about 0.012 per event. */
  assert_true(lmdb <= events / 50 + 4 * batches);

  kl_producer_destroy(producer);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
  kl_t_cluster_destroy(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(steady_path_allocates_nothing_per_event),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
