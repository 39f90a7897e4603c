/*
 * The timers' metrics (issue 36, docs/metrics.md), on the embedded cluster
 * with the ledger handler, on LMDB and on PostgreSQL, the store's clock
 * the test's (kl_t_store_clock_set()):
 *  - timers_pending: a worker that takes a partition counts the timers
 *    its predecessor left in the store, then its own commits move it up
 *    (scheduled) and down (fired);
 *  - timers_late: fired more than KL__FIRE_LATE_MS after their time;
 *  - keylane_worker_timer_lateness_seconds: one observation per fired
 *    timer, in the bucket of its lateness by the store's clock;
 *  - many timers due at once, run slower than they fall due: the owner
 *    has at most KL__FIRE_AHEAD firing records in flight (worker/fire.h).
 */
#include <inttypes.h>
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
#include "support/timer_checks.h"
#include "common/internal.h"
#include "common/metrics.h"
#include "store/store_internal.h"
#include "worker/fire.h"
#include "worker/worker_internal.h"

static int64_t t0;
static int t_db_seq;

/* A credit of 1 of @p key, id @p id, due at @p not_before. */
static void publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                    int64_t not_before) {
  uint8_t p[9];
  kl_t_timers_amount(p, 1);
  kl_t_timers_publish(fx, key, id, "credit", p, sizeof(p), not_before);
}

typedef struct kl_want {
  uint64_t applied, scheduled, pending, late;
} kl_want_t;

/* Waits (30 s at most) until @p w's counters are @p want, then checks
 * them. */
static void wait_stats(kl_t_worker_t *w, kl_want_t want) {
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.applied == want.applied && st.timers_scheduled == want.scheduled &&
        st.timers_pending == want.pending && st.timers_late == want.late)
      break;
    kl_t_sleep_ms(50);
  }
  assert_int_equal(st.applied, want.applied);
  assert_int_equal(st.timers_scheduled, want.scheduled);
  assert_int_equal(st.timers_pending, want.pending);
  assert_int_equal(st.timers_late, want.late);
}

/* The value of the line of the worker's metrics that begins with
 * @p series (name and labels), or -1 when there is none. */
static double series_value(kl_t_worker_t *w, const char *series) {
  size_t len;
  char *text = kl__metrics_render(kl__worker_metrics(w->worker), &len);
  assert_non_null(text);
  double v = -1;
  for (char *line = text; line && *line;) {
    char *end = strchr(line, '\n');
    if (strncmp(line, series, strlen(series)) == 0 &&
        line[strlen(series)] == ' ')
      v = strtod(line + strlen(series) + 1, NULL);
    line = end ? end + 1 : NULL;
  }
  free(text);
  return v;
}

static double lateness(kl_t_worker_t *w, const char *topic, const char *what,
                       const char *le) {
  char series[256];
  if (le)
    snprintf(series, sizeof(series),
             "keylane_worker_timer_lateness_seconds_%s{topic=\"%s\",le=\"%s\"}",
             what, topic, le);
  else
    snprintf(series, sizeof(series),
             "keylane_worker_timer_lateness_seconds_%s{topic=\"%s\"}", what,
             topic);
  return series_value(w, series);
}

static void metrics_case(const char *store_uri, const char *name) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  const char *group = kl_t_group(fx.cluster, name);
  /* a first owner keeps three timers and stops */
  publish(&fx, "a", "a1", t0 + 10000);
  publish(&fx, "b", "b1", t0 + 10000);
  publish(&fx, "c", "c1", t0 + 60000);
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, NULL);
  wait_stats(w, (kl_want_t){.scheduled = 3, .pending = 3});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  /* the next owner counts them at take, then its own */
  w = kl_t_worker_start(fx.boot, fx.topic, group, fx.store, NULL);
  wait_stats(w, (kl_want_t){.pending = 3});
  publish(&fx, "d", "d1", t0 + 10000);
  wait_stats(w, (kl_want_t){.scheduled = 1, .pending = 4});
  assert_int_equal(lateness(w, fx.topic, "count", NULL), 0);

  /* three fall due and run 3 s after their time: late */
  kl_t_store_clock_set(t0 + 13000);
  wait_stats(
      w, (kl_want_t){.applied = 3, .scheduled = 1, .pending = 1, .late = 3});
  assert_int_equal(lateness(w, fx.topic, "count", NULL), 3);
  assert_int_equal(lateness(w, fx.topic, "bucket", "2.5"), 0);
  assert_int_equal(lateness(w, fx.topic, "bucket", "5"), 3);
  assert_true(lateness(w, fx.topic, "sum", NULL) >= 9.0);

  /* the last runs at its time, by the store's clock: not late */
  kl_t_store_clock_set(t0 + 60000);
  wait_stats(
      w, (kl_want_t){.applied = 4, .scheduled = 1, .pending = 0, .late = 3});
  assert_int_equal(lateness(w, fx.topic, "count", NULL), 4);
  assert_int_equal(lateness(w, fx.topic, "bucket", "0.001"), 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

/* Runs each event in half a millisecond at least: slower than firing
 * records are written. */
static kl_handler_result_t slow_ok(void *opaque, const kl_event_t *event,
                                   const kl_fence_t *fence, kl_txn_t *txn,
                                   char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)event, (void)fence, (void)txn, (void)errbuf,
      (void)errbuf_size;
  nanosleep(&(struct timespec){0, 500000}, NULL);
  return KL_HANDLER_OK;
}

/* 2 * KL__FIRE_AHEAD timers of one partition fall due at once; their runs
 * are slow. The firing records acknowledged never run ahead of the runs
 * committed by more than KL__FIRE_AHEAD (inline mode: the poll thread
 * reads the index and counts the commits), and all run once, within
 * KL__FIRE_AGAIN_MS (nothing is written twice). */
static void test_firing_is_bounded(void **state) {
  (void)state;
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "tahead", 1, 1, 3, NULL);
  const uint64_t n = 2 * KL__FIRE_AHEAD;
  for (uint64_t i = 0; i < n; i++) {
    char key[32];
    snprintf(key, sizeof(key), "k%" PRIu64, i % 50);
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "tick",
                     .type_len = 4,
                     .not_before = t0 + 1000};
    assert_int_equal(kl_publish(fx.producer, fx.topic, &ev, NULL), KL_OK);
  }
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, "tahead"),
                           fx.store, NULL, slow_ok, NULL);
  kl_t_worker_go(w);
  wait_stats(w, (kl_want_t){.scheduled = n, .pending = n});
  kl_t_store_clock_set(t0 + 1000);
  kl_worker_stats_t st = {0};
  uint64_t most = 0;
  for (int i = 0; i < 1200 && st.applied < n; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.timers_fired > st.applied && st.timers_fired - st.applied > most)
      most = st.timers_fired - st.applied;
    kl_t_sleep_ms(5);
  }
  assert_true(most <= KL__FIRE_AHEAD);
  wait_stats(w, (kl_want_t){.applied = n, .scheduled = n});
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.timers_fired, n);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_timer_metrics_lmdb(void **state) {
  (void)state;
  metrics_case(NULL, "tmetrics");
}

static void test_timer_metrics_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char db[32], uri[256];
  snprintf(db, sizeof(db), "tmm%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, sizeof(uri)), 0);
  metrics_case(uri, "tmetricspg");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_timer_metrics_lmdb),
      cmocka_unit_test(test_timer_metrics_pg),
      cmocka_unit_test(test_firing_is_bounded),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
