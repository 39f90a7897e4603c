/*
 * The owner writes one firing record per due timer (worker/fire.c), on the
 * embedded cluster, on LMDB and on PostgreSQL, the store's clock the
 * test's (kl_t_store_clock_set()): timers committed due before those whose
 * records are in flight (written, their runs held behind a key's first
 * one) get their records, and the records in flight are not written
 * again, nor when the store's clock steps back.
 * Found by the fault suite: each such commit had the next read write every
 * due timer in flight again, up to 32 records for one timer.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "common/internal.h"
#include "store/store_internal.h"

/* The key whose runs wait for the gate. */
#define HOLD "hold"
/* Its timers, and those committed while their records are in flight. */
#define N_HELD 200
#define N_SOON 100

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static int t_db_seq;

static void gate_set(int open) {
  pthread_mutex_lock(&gate_mu);
  gate_open = open;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
}

/* Runs HOLD's events once the gate is open (or a minute passed, so that a
 * failed test's worker still stops), any other at once. */
static kl_handler_result_t gated_ok(void *opaque, const kl_event_t *event,
                                    const kl_fence_t *fence, kl_txn_t *txn,
                                    char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)fence, (void)txn, (void)errbuf, (void)errbuf_size;
  if (event->key_len != strlen(HOLD) ||
      memcmp(event->key, HOLD, event->key_len) != 0)
    return KL_HANDLER_OK;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  pthread_mutex_lock(&gate_mu);
  while (!gate_open &&
         pthread_cond_timedwait(&gate_cv, &gate_mu, &until) == 0) {
  }
  pthread_mutex_unlock(&gate_mu);
  return KL_HANDLER_OK;
}

static void publish(kl_t_ledger_fx_t *fx, const char *key, int64_t nb) {
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .type = "tick",
                   .type_len = 4,
                   .not_before = nb};
  assert_int_equal(kl_publish(fx->producer, fx->topic, &ev, NULL), KL_OK);
}

/* Waits (60 s at most) until @p w applied @p applied events and scheduled
 * @p scheduled timers, @p pending still waiting; @returns its stats. */
static kl_worker_stats_t wait_stats(kl_t_worker_t *w, uint64_t applied,
                                    uint64_t scheduled, uint64_t pending) {
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 1200; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.applied == applied && st.timers_scheduled == scheduled &&
        st.timers_pending == pending)
      break;
    kl_t_sleep_ms(50);
  }
  assert_int_equal(st.applied, applied);
  assert_int_equal(st.timers_scheduled, scheduled);
  assert_int_equal(st.timers_pending, pending);
  return st;
}

static void fire_case(const char *store_uri, const char *name) {
  int64_t t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  gate_set(0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  for (int i = 0; i < N_HELD; i++)
    publish(&fx, HOLD, t0 + 1000);
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  static const char *const extra[] = {"worker.concurrency=4", NULL};
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, extra, gated_ok, NULL);
  kl_t_worker_go(w);
  wait_stats(w, 0, N_HELD, N_HELD);

  /* they fall due: all their records are written, their runs held */
  kl_t_store_clock_set(t0 + 2000);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 1200 && st.timers_fired < N_HELD; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    kl_t_sleep_ms(50);
  }
  assert_int_equal(st.timers_fired, N_HELD);
  assert_int_equal(st.applied, 0);

  /* the clock steps back, still past their time: the records in flight,
   * stamped later, run them all the same. Timers due before them,
   * committed in small batches while they are in flight: each gets its
   * record, and runs */
  kl_t_store_clock_set(t0 + 1500);
  for (int i = 0; i < N_SOON; i++) {
    char key[16];
    snprintf(key, sizeof(key), "s%d", i % 10);
    publish(&fx, key, t0 + 500);
    if (i % 10 == 9)
      assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  }
  wait_stats(w, N_SOON, N_HELD + N_SOON, N_HELD);
  gate_set(1);
  st = wait_stats(w, N_HELD + N_SOON, N_HELD + N_SOON, 0);
  /* the acks of the last records read may come after their runs */
  for (int i = 0; i < 200 && st.timers_fired < N_HELD + N_SOON; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  /* one record per timer: none written twice, none read as a duplicate */
  assert_int_equal(st.timers_fired, N_HELD + N_SOON);
  assert_int_equal(st.duplicates, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_timer_fire_once_lmdb(void **state) {
  (void)state;
  fire_case(NULL, "tfire");
}

static void test_timer_fire_once_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char db[32], uri[256];
  snprintf(db, sizeof(db), "tfire%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, sizeof(uri)), 0);
  fire_case(uri, "tfirepg");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_timer_fire_once_lmdb),
      cmocka_unit_test(test_timer_fire_once_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
