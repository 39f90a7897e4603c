/*
 * Allocations on the worker's steady path: a ledger worker applying
 * credits over 500 keys may not call malloc, calloc or realloc per event.
 * A few per batch (a store transaction and its commit) are fine; more
 * than one per 100 events is not.
 *
 * The test program interposes malloc, calloc and realloc (glibc's
 * __libc_* do the work) and counts the calls made by every thread but the
 * test's own, while armed. librdkafka's own calls are counted apart: it
 * allocates an op per message it fetches, which keylane cannot change, so
 * the bound is on the rest (keylane, the handler, msgpack-c, LMDB, libc on
 * their behalf). Not built with a sanitizer, which brings its own malloc.
 */
#define _GNU_SOURCE
#include <link.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

static atomic_bool armed;
static atomic_ulong n_keylane, n_rdkafka;
static uintptr_t rdkafka_lo, rdkafka_hi;
static _Thread_local bool is_test_thread;
static _Atomic uintptr_t dbg_k[64];
static atomic_ulong dbg_c[64];

static void count(void *caller) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed) || is_test_thread)
    return;
  uintptr_t a = (uintptr_t)caller;
  if (a >= rdkafka_lo && a < rdkafka_hi)
    atomic_fetch_add_explicit(&n_rdkafka, 1, memory_order_relaxed);
  else {
    atomic_fetch_add_explicit(&n_keylane, 1, memory_order_relaxed);
    for (int i = 0; i < 64; i++) {
      uintptr_t z = 0;
      if (atomic_load(&dbg_k[i]) == a ||
          atomic_compare_exchange_strong(&dbg_k[i], &z, a) || z == a) {
        atomic_fetch_add(&dbg_c[i], 1);
        break;
      }
    }
  }
}

void *malloc(size_t size) {
  count(__builtin_return_address(0));
  return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
  count(__builtin_return_address(0));
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
  count(__builtin_return_address(0));
  return __libc_realloc(p, size);
}

/* librdkafka's loaded code: [rdkafka_lo, rdkafka_hi). */
static int find_rdkafka(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size, (void)data;
  if (!strstr(info->dlpi_name, "librdkafka"))
    return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD)
      continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (!rdkafka_lo || lo < rdkafka_lo)
      rdkafka_lo = lo;
    if (hi > rdkafka_hi)
      rdkafka_hi = hi;
  }
  return 1;
}

enum { EVENTS = 40000, KEYS = 500, WARM = 10000, MEASURE_TO = 35000 };

static void steady_path_allocates_nothing_per_event(void **state) {
  (void)state;
  is_test_thread = true;
  assert_int_equal(dl_iterate_phdr(find_rdkafka, NULL), 1);
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
  atomic_store(&armed, true);
  kl_worker_stats(w->worker, &st0, sizeof(st0));
  uint64_t to = kl_t_workers_applied(&w, 1, MEASURE_TO, 60000);
  kl_worker_stats(w->worker, &st1, sizeof(st1));
  atomic_store(&armed, false);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_true(to >= MEASURE_TO);
  /* The counts cover the events and batches committed while armed, give
   * or take the batch the worker was in at either end. */
  double events = (double)(st1.applied - st0.applied);
  double batches = (double)(st1.batches - st0.batches);
  double allocs = (double)atomic_load(&n_keylane);
  printf("%.0f allocations by keylane and its handler over %.0f events in "
         "%.0f batches: %.4f per event, %.1f per batch; %.4f per event by "
         "librdkafka\n",
         allocs, events, batches, allocs / events, allocs / batches,
         (double)atomic_load(&n_rdkafka) / events);
  /* A batch's transaction and commit may allocate; an event may not. */
  assert_true(batches >= 1);
  assert_true(allocs <= events / 100 + 96 * batches);

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
