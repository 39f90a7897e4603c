/*
 * Allocations on the worker's steady path: a ledger worker applying
 * credits over 500 keys may not call malloc, calloc or realloc per event,
 * and calls a bounded few per batch: a batch's store transaction reuses
 * the buffers of a finished one (store/txn_buffer.h), so what is left is
 * the Kafka commit and the lanes' bookkeeping.
 *
 * The test program interposes malloc, calloc and realloc (glibc's
 * __libc_* do the work) and counts the calls made by every thread but the
 * test's own, while armed, by the library the call comes from. librdkafka's
 * own calls are counted apart: it allocates an op per message it fetches,
 * which keylane cannot change. So are LMDB's: it keeps every dirty page it
 * ever allocated for the next write, and allocates one more only as the
 * batches' writes touch more pages than before (the ids' tree grows with
 * the events), a cost per event, bounded as such. The bound per batch is
 * on the rest (keylane, the handler, msgpack-c, libc on their behalf).
 * Not built with a sanitizer, which brings its own malloc.
 */
#define _GNU_SOURCE
#include <link.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <inttypes.h>
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
#include "support/ledger_checks.h"
#include "support/support.h"
#include "worker/lanes_internal.h"
#include "worker/worker_state.h"
#include "cli/ledger_gen.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

/* Where a call comes from: a library's loaded code, [lo, hi). */
typedef struct lib {
  const char *name;
  uintptr_t lo, hi;
  atomic_ulong calls;
} lib_t;

enum { LIB_RDKAFKA, LIB_LMDB, LIB_REST };
static lib_t libs[] = {{.name = "librdkafka"},
                       {.name = "liblmdb"},
                       {.name = "keylane and the rest"}};

/* The call sites of the rest, two levels: the return address in the
 * function that called malloc and the one in its caller (a wrapper such
 * as kl__xcalloc() says little alone), and their count. */
enum { SITES = 64 };
static struct {
  uintptr_t at[2];
  unsigned long calls;
} sites[SITES];
static atomic_flag sites_lock = ATOMIC_FLAG_INIT; /* few calls: a spin */

static atomic_bool armed;
static _Thread_local bool is_test_thread, in_count;

/* The caller's caller of malloc: the frame after @p caller in this
 * thread's stack, or 0. backtrace() allocates on its first call only (it
 * loads the unwinder), which the test thread makes before arming. */
static uintptr_t caller_of(uintptr_t caller) {
  void *frames[8];
  int n = backtrace(frames, 8);
  for (int i = 0; i + 1 < n; i++)
    if ((uintptr_t)frames[i] == caller)
      return (uintptr_t)frames[i + 1];
  return 0;
}

static void count_site(uintptr_t a) {
  uintptr_t b = caller_of(a);
  while (atomic_flag_test_and_set(&sites_lock))
    ;
  for (int i = 0; i < SITES; i++) {
    if (!sites[i].calls)
      sites[i].at[0] = a, sites[i].at[1] = b;
    if (sites[i].at[0] == a && sites[i].at[1] == b) {
      sites[i].calls++;
      break;
    }
  }
  atomic_flag_clear(&sites_lock);
}

static void count(void *caller) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed) || is_test_thread ||
      in_count)
    return;
  in_count = true;
  uintptr_t a = (uintptr_t)caller;
  int l = 0;
  while (l < LIB_REST && !(a >= libs[l].lo && a < libs[l].hi))
    l++;
  atomic_fetch_add_explicit(&libs[l].calls, 1, memory_order_relaxed);
  if (l == LIB_REST)
    count_site(a);
  in_count = false;
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

/* Sets the code range of each library of libs[] that is loaded. */
static int find_libs(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size, (void)data;
  for (int l = 0; l < LIB_REST; l++) {
    lib_t *lib = &libs[l];
    if (!strstr(info->dlpi_name, lib->name))
      continue;
    for (int i = 0; i < info->dlpi_phnum; i++) {
      const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
      if (ph->p_type != PT_LOAD)
        continue;
      uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
      if (!lib->lo || lo < lib->lo)
        lib->lo = lo;
      if (hi > lib->hi)
        lib->hi = hi;
    }
  }
  return 0;
}

/* Prints where an address lies, for addr2line -f -i -e FILE ADDRESS-1. */
static void print_at(const char *prefix, uintptr_t a) {
  Dl_info info;
  if (a && dladdr((void *)a, &info) && info.dli_fname)
    printf("%s%s+%#lx (%s)\n", prefix, info.dli_fname,
           (unsigned long)(a - (uintptr_t)info.dli_fbase),
           info.dli_sname ? info.dli_sname : "static");
  else
    printf("%s%#lx\n", prefix, (unsigned long)a);
}

/* Prints the rest's call sites, each with its caller. */
static void print_sites(void) {
  for (int i = 0; i < SITES && sites[i].calls; i++) {
    printf("  %5lu calls from ", sites[i].calls);
    print_at("", sites[i].at[0]);
    print_at("              called from ", sites[i].at[1]);
  }
}

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
  is_test_thread = true;
  void *frame;
  backtrace(&frame, 1); /* loads the unwinder, which allocates, now */
  dl_iterate_phdr(find_libs, NULL);
  for (int i = 0; i < LIB_REST; i++)
    assert_true(libs[i].lo && libs[i].hi); /* both are linked in */
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
  double rest = (double)atomic_load(&libs[LIB_REST].calls);
  double lmdb = (double)atomic_load(&libs[LIB_LMDB].calls);
  printf("over %.0f events in %.0f batches:\n", events, batches);
  for (int i = 0; i < 3; i++) {
    double n = (double)atomic_load(&libs[i].calls);
    printf("%7.0f allocations by %s: %.4f per event, %.1f per batch\n", n,
           libs[i].name, n / events, n / batches);
  }
  print_sites();
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
  is_test_thread = true;
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
