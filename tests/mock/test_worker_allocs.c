/*
 * Allocations on the worker's steady path: a ledger worker applying
 * credits over 500 keys may not call malloc, calloc or realloc per event,
 * and calls a bounded few per batch: a batch's store transaction reuses
 * the buffers of a finished one (store/txn_buffer.h), so what is left is
 * the Kafka commit and the lanes' bookkeeping.
 *
 * The test program counts the calls to malloc, calloc and realloc
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
#include "support/ledger_checks.h"
#include "support/support.h"
#include "worker/lanes_internal.h"
#include "worker/worker_state.h"
#include "cli/ledger_gen.h"

enum { LIB_RDKAFKA, LIB_LMDB, LIB_REST };
static kl_t_alloc_lib_t libs[] = {{.name = "librdkafka"},
                                  {.name = "liblmdb"},
                                  {.name = "keylane and the rest"}};

/* Starts a ledger worker on @p fx with a window of @p window records. */
static kl_t_worker_t *fx_worker(kl_t_ledger_fx_t *fx, int window) {
  char max[48];
  snprintf(max, sizeof(max), "worker.window.max=%d", window);
  const char *const extra[] = {max, NULL};
  return kl_t_worker_start(fx->boot, fx->topic,
                           kl_t_group(fx->cluster, "allocs"), fx->store, extra);
}

enum {
  EVENTS = 40000,
  KEYS = 500,
  PARTITIONS = 4,
  WINDOW = 2000,
  WARM = 10000,
  MEASURE_TO = 35000
};

/* The bound per batch on the rest's allocations. */
#define KL_T_ALLOCS_PER_BATCH 20

static void steady_path_allocates_nothing_per_event(void **state) {
  (void)state;
  /* both are linked in */
  assert_true(kl_t_allocs_init(libs, sizeof(libs) / sizeof(libs[0])));
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "allocs", PARTITIONS, KEYS, 1, NULL);
  kl_t_cluster_t *cluster = fx.cluster;
  kl_producer_t *producer = fx.producer;
  for (int i = 0; i < EVENTS; i++) {
    char key[16];
    int n = snprintf(key, sizeof(key), "acct-%d", i % KEYS);
    assert_int_equal(kl__ledger_gen_send(producer, kl_t_topic(cluster), key,
                                         (size_t)n, NULL, "credit", 1, 0, NULL),
                     KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  /* A window of 2,000 records per partition: the 40,000 events pass through
   * it 5 times, as a worker's window turns over in production. The windows
   * fill in the warm-up, together or in turn (a loaded machine's), and the
   * lanes then hold the slots of them all (windows_filled_in_turn_...()). */
  kl_t_worker_t *w = fx_worker(&fx, WINDOW);
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

  kl_t_ledger_fx_down(&fx);
}

/* The slots and keys the lanes have made, live and spare. */
typedef struct made {
  size_t slots, keys;
} made_t;

static made_t lanes_made(kl_worker_t *worker) {
  kl__lanes_t *lanes = worker->lanes;
  pthread_mutex_lock(&lanes->mu);
  made_t m = {lanes->nspare, lanes->nspare_keys};
  for (int32_t p = 0; p < lanes->count; p++)
    if (lanes->lanes[p]) {
      m.slots += lanes->lanes[p]->ring_count;
      m.keys += lanes->lanes[p]->keys.count;
    }
  pthread_mutex_unlock(&lanes->mu);
  return m;
}

/* Publishes @p n credits over keys of @p partition (of 2) only. */
static void publish_to(kl_producer_t *producer, const char *topic,
                       int32_t partition, int n) {
  for (int i = 0, k = 0; i < n; k++) {
    char key[16];
    int len = snprintf(key, sizeof(key), "acct-%d", k % KEYS);
    if (kl_partition(key, (size_t)len, 2) != partition)
      continue;
    assert_int_equal(kl__ledger_gen_send(producer, topic, key, (size_t)len,
                                         NULL, "credit", 1, 0, NULL),
                     KL_OK);
    i++;
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
}

/* Two partitions whose windows fill in turn, never together: each may fill
 * again at any time, together with the other, so the lanes then hold two
 * windows of slots, and the keys of both. They held one window's and one
 * partition's (the most the windows had held at once), and the first time
 * both filled together, under load, the steady path calloc()ed the rest
 * (2,089 slots in steady_path_allocates_nothing_per_event, once; 108 keys
 * another time). */
static void windows_filled_in_turn_keep_their_slots(void **state) {
  (void)state;
  enum { W = 300 };
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "turns", 2, KEYS, 1, NULL);
  kl_t_cluster_t *cluster = fx.cluster;
  kl_producer_t *producer = fx.producer;
  kl_t_worker_t *w = fx_worker(&fx, W);
  /* Partition 0's window fills and drains; then partition 1's, from the
   * slots partition 0 gave back. */
  publish_to(producer, kl_t_topic(cluster), 0, 4 * W);
  uint64_t first = kl_t_workers_applied(&w, 1, 4 * W, 60000);
  publish_to(producer, kl_t_topic(cluster), 1, 4 * W);
  uint64_t both = kl_t_workers_applied(&w, 1, 8 * W, 60000);
  made_t made = lanes_made(w->worker);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  printf("after %" PRIu64 " and %" PRIu64 " events: %zu slots for 2 windows "
         "of %d, %zu keys for %d\n",
         first, both, made.slots, W, made.keys, KEYS);
  assert_true(first >= 4 * W && both >= 8 * W);
  assert_true(made.slots >= 2 * W);
  assert_true(made.keys >= KEYS); /* each partition's window held its all */

  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(steady_path_allocates_nothing_per_event),
      cmocka_unit_test(windows_filled_in_turn_keep_their_slots),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
