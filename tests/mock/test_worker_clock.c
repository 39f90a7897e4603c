/*
 * Clock reads on the worker's steady path: a ledger worker in inline mode
 * reads the clock a bounded few times per event, not once per step of
 * each event (issue 37: they were 3 % of the poll thread, four per event).
 *
 * The test program defines clock_gettime(), which every call in the
 * process then reaches (librdkafka's too), and counts, while armed, the
 * calls made from this program's own code (keylane's, linked in
 * statically) by every thread but the test's. librdkafka's own reads are
 * not counted: keylane cannot change them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "keylane/handlers.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/ledger_checks.h"
#include "support/support.h"
#include "cli/ledger_gen.h"

/* This program's code, where a counted call returns to. */
extern char __executable_start[], etext[];

static atomic_bool armed;
static atomic_ulong reads, runs;
static pthread_t test_thread;
typedef int clock_fn(clockid_t, struct timespec *);
static clock_fn *_Atomic real_clock_gettime;

int clock_gettime(clockid_t id, struct timespec *ts) {
  clock_fn *real = atomic_load(&real_clock_gettime);
  if (!real) { /* libc's, the next definition after this one */
    real = (clock_fn *)dlsym(RTLD_NEXT, "clock_gettime");
    atomic_store(&real_clock_gettime, real);
  }
  uintptr_t at = (uintptr_t)__builtin_return_address(0);
  if (atomic_load_explicit(&armed, memory_order_relaxed) &&
      at >= (uintptr_t)__executable_start && at < (uintptr_t)etext &&
      !pthread_equal(pthread_self(), test_thread))
    atomic_fetch_add_explicit(&reads, 1, memory_order_relaxed);
  return real(id, ts);
}

/* The ledger's handler, counting its runs while armed: the events the
 * reads were made for, counted as they run (the applied counter moves at
 * the commits, a batch or more later). */
static kl_handler_result_t
counting_handler(void *opaque, const kl_event_t *event, const kl_fence_t *fence,
                 kl_txn_t *txn, char *errbuf, size_t errbuf_size) {
  if (atomic_load_explicit(&armed, memory_order_relaxed))
    atomic_fetch_add_explicit(&runs, 1, memory_order_relaxed);
  return kl_ledger_handler(opaque, event, fence, txn, errbuf, errbuf_size);
}

/* Published (and every tenth once more, a duplicate), applied before the
 * count starts, and when it stops. */
enum { EVENTS = 40000, WARM = 10000, MEASURE_TO = 35000 };

/* The bound per handler run. Measured (2 cores, shared): 2.0 per event,
 * the start and end of its step (lanes_pool.c), plus one per 256 records
 * taken from the consumer and a few per batch, and a duplicate's step
 * (a tenth of the events, whose handler does not run): 2.2 per run; 4.0
 * when the records and the inline loop read the clock each. */
#define KL_T_READS_PER_EVENT 2.5

static void steady_path_reads_the_clock_twice_per_event(void **state) {
  (void)state;
  test_thread = pthread_self();
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "clock", 4, 500, 1, NULL);
  kl_t_ledger_fx_publish(&fx, EVENTS);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, "clock"),
                           fx.store, NULL, counting_handler, NULL);
  kl_t_worker_go(w);
  uint64_t from = kl_t_workers_applied(&w, 1, WARM, 60000);
  assert_true(from >= WARM);
  atomic_store(&armed, true);
  uint64_t to = kl_t_workers_applied(&w, 1, MEASURE_TO, 60000);
  atomic_store(&armed, false);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_true(to >= MEASURE_TO);
  double events = (double)atomic_load(&runs);
  double n = (double)atomic_load(&reads);
  printf("over %.0f events run: %.0f clock reads by keylane, %.3f per "
         "event\n",
         events, n, n / events);
  assert_true(events >= 1000);
  assert_true(n <= KL_T_READS_PER_EVENT * events);

  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(steady_path_reads_the_clock_twice_per_event),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
