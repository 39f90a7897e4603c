/*
 * Delayed events (issue 36, docs/design.md "Timers") on the embedded
 * cluster with the ledger handler, on LMDB and on PostgreSQL. The store's
 * clock is the test's (kl_t_store_clock_set()), which the worker's timers
 * read too, so time moves without sleeping:
 *  - a delayed credit waits as a timer while the key's later events apply,
 *    is applied once when its time comes, never before, and copies of it
 *    published before or after are duplicates;
 *  - a record that names the timer (its keylane.timer header) read before
 *    the time, as a producer that is not keylane could write it, is early
 *    and changes nothing;
 *  - a not_before past timer.max.delay is a dead letter; kl_publish()
 *    refuses it first;
 *  - `keylane store rebuild` from the log holds the same balances and the
 *    same pending timers as the live store.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "keylane/handlers.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/ledger_checks.h"
#include "support/kafka_read.h"
#include "support/pg_group.h"
#include "support/spawn.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "support/timer_checks.h"
#include "common/internal.h"
#include "store/store_internal.h"
#include "store/timers.h"

#define DAY_MS (24 * 3600 * 1000LL)
/* The delay of the main case's credit: the store's clock is moved to it,
 * and a rebuild waits for the real one to pass it. */
#define DUE 4000

static int64_t t0;
static int t_db_seq;

/* A credit of @p amount (0..127) without a seq: applied in any order. */
static kl_event_t credit(const char *key, const char *id, const uint8_t *p,
                         int64_t not_before) {
  return (kl_event_t){.key = key,
                      .key_len = strlen(key),
                      .id = id,
                      .id_len = strlen(id),
                      .type = "credit",
                      .type_len = 6,
                      .ts = t0, /* so that a raw copy is the same bytes */
                      .payload = p,
                      .payload_len = 9,
                      .not_before = not_before};
}

static void publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                    int n, int64_t not_before) {
  uint8_t p[9];
  kl_t_timers_amount(p, n);
  kl_event_t ev = credit(key, id, p, not_before);
  assert_int_equal(kl_publish(fx->producer, fx->topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(fx->producer, 10000), KL_OK);
}

/* Writes a firing record of the credit of (@p key, @p id) scheduled at
 * offset 0, with this host's clock, as a producer that is not keylane
 * could write it (docs/design.md, "Timers"). */
static void produce_firing(kl_t_ledger_fx_t *fx, const char *key,
                           const char *id, int n, int64_t not_before,
                           int64_t stamped) {
  uint8_t p[9];
  kl_t_timers_amount(p, n);
  kl_event_t ev = credit(key, id, p, not_before);
  void *env;
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &env, &len), KL_OK);
  const char *hdrs[] = {"keylane.timer", "0", NULL};
  assert_int_equal(
      kl_t_produce_raw_at(fx->boot, fx->topic, 0, key, env, len, hdrs, stamped),
      0);
  free(env);
}

/* Waits for the counters this test checks (not fired, nor failed). */
static void wait_stats(kl_t_worker_t *w, kl_t_timers_want_t want) {
  want.fired = want.failed = KL_T_ANY;
  kl_t_timers_wait(w, want);
}
typedef struct kl_pending {
  size_t n;
  int64_t due[4];
} kl_pending_t;

static int pending_one(void *opaque, const kl__timer_t *t, const void *key,
                       size_t key_len, const void *env, size_t env_len) {
  (void)key, (void)key_len, (void)env, (void)env_len;
  kl_pending_t *p = opaque;
  if (p->n < 4)
    p->due[p->n] = t->due_ms;
  p->n++;
  return 0;
}

static kl_pending_t pending(kl_store_t *store, const char *topic) {
  kl_pending_t p = {0};
  size_t bad = 0;
  assert_int_equal(kl__timers_scan(store, topic, -1, pending_one, &p, &bad),
                   KL_OK);
  assert_int_equal(bad, 0);
  return p;
}

typedef struct kl_t_stamped {
  int firing;
  int64_t fired_at;
} kl_t_stamped_t;

/* Counts the records that carry the keylane.timer header, and keeps the
 * timestamp of the last. */
static void stamped_one(void *opaque, const rd_kafka_message_t *m, int i) {
  (void)i;
  kl_t_stamped_t *st = opaque;
  rd_kafka_headers_t *h = NULL;
  const void *v;
  size_t n;
  if (rd_kafka_message_headers((rd_kafka_message_t *)m, &h) == 0 && h &&
      rd_kafka_header_get_last(h, "keylane.timer", &v, &n) == 0) {
    st->firing++;
    st->fired_at = rd_kafka_message_timestamp(m, NULL);
  }
}

static void timers_case(const char *store_uri, const char *name) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  /* offset 0: due in DUE ms; 1: the key's next event; 2: a copy of 0 */
  publish(&fx, "d", "later", 7, t0 + DUE);
  publish(&fx, "d", "now", 5, 0);
  publish(&fx, "d", "later", 7, t0 + DUE);
  /* 3: the record that fires it, from a producer that is not keylane,
   * before its time: early */
  produce_firing(&fx, "d", "later", 7, t0 + DUE, 0);
  /* 4: due in five days, pending at the end; 5: past timer.max.delay (7d) */
  publish(&fx, "e", "far", 3, t0 + 5 * DAY_MS);
  uint8_t p[9];
  kl_t_timers_amount(p, 1);
  kl_event_t ev = credit("e", "too-far", p, t0 + 8 * DAY_MS);
  void *env;
  size_t len;
  assert_int_equal(kl_publish(fx.producer, fx.topic, &ev, NULL), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "timer.max.delay"));
  assert_int_equal(kl_event_encode(&ev, &env, &len), KL_OK);
  assert_int_equal(kl_t_produce_raw(fx.boot, fx.topic, 0, "e", env, len, NULL),
                   0);
  free(env);
  /* 6: a record that names the timer, stamped at its time, with other
   * contents: a copy, not the event; 7: a raw event past timer.max.delay
   * stamped close to its time: a dead letter all the same */
  produce_firing(&fx, "d", "later", 99, t0 + DUE, t0 + DUE);
  ev = credit("e", "far-stamped", p, t0 + 30 * DAY_MS);
  assert_int_equal(kl_event_encode(&ev, &env, &len), KL_OK);
  assert_int_equal(kl_t_produce_raw_at(fx.boot, fx.topic, 0, "e", env, len,
                                       NULL, t0 + 30 * DAY_MS - 1000),
                   0);
  free(env);

  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, name), fx.store, NULL);
  wait_stats(w, (kl_t_timers_want_t){.applied = 1,
                                     .scheduled = 2,
                                     .duplicates = 3,
                                     .dead = 2,
                                     .early = 1});
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 5);
  assert_int_equal(pending(fx.store, fx.topic).n, 2);

  kl_t_store_clock_set(t0 + DUE); /* its time: it fires, once */
  wait_stats(w, (kl_t_timers_want_t){.applied = 2,
                                     .scheduled = 2,
                                     .duplicates = 3,
                                     .dead = 2,
                                     .early = 1});
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 12);
  kl_pending_t left = pending(fx.store, fx.topic);
  assert_int_equal(left.n, 1);
  assert_int_equal(left.due[0], t0 + 5 * DAY_MS);
  publish(&fx, "d", "later", 7, t0 + DUE); /* a copy after: a duplicate */
  wait_stats(w, (kl_t_timers_want_t){.applied = 2,
                                     .scheduled = 2,
                                     .duplicates = 4,
                                     .dead = 2,
                                     .early = 1});
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_true(st.timers_fired >= 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 12);
  assert_int_equal(kl_t_ledger_balance(fx.store, "e"), INT64_MIN);

  /* the log rebuilds the same: its firing record applies the credit, and
   * the far timer waits. The rebuild starts once the real clock passed
   * the records' times, as it would in life: this test's store clock ran
   * ahead of it */
  kl__store_set_clock(NULL);
  while (kl__now_ms() <= t0 + DUE)
    kl_t_sleep_ms(100);
  char rebuilt[300];
  if (store_uri) {
    kl_t_pg_t *pg = kl_t_pg_need();
    char db[32];
    snprintf(db, sizeof(db), "tmr%d", ++t_db_seq);
    assert_int_equal(kl_t_pg_createdb(pg, db, rebuilt, sizeof(rebuilt)), 0);
  } else {
    snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
  }
  kl_store_t *copy = kl_t_ledger_fx_rebuild(&fx, rebuilt, NULL, NULL);
  assert_int_equal(kl_t_ledger_balance(copy, "d"), 12);
  left = pending(copy, fx.topic);
  assert_int_equal(left.n, 1);
  assert_int_equal(left.due[0], t0 + 5 * DAY_MS);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_timers_lmdb(void **state) {
  (void)state;
  timers_case(NULL, "timers");
}

static void test_timers_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char db[32], uri[256];
  snprintf(db, sizeof(db), "tm%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, sizeof(uri)), 0);
  timers_case(uri, "timerspg");
}

/* The partition moves while its timer waits: the next owner reads the
 * due index when it takes the partition and runs the timer, once. */
static void test_timer_moves_with_its_partition(void **state) {
  (void)state;
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "tmove", 1, 1, 3, NULL);
  publish(&fx, "m", "moved", 9, t0 + 60000);
  const char *group = kl_t_group(fx.cluster, "tmove");
  kl_t_worker_t *a =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, NULL);
  wait_stats(a, (kl_t_timers_want_t){.scheduled = 1});
  assert_int_equal(kl_t_worker_stop(a), KL_OK);
  kl_t_worker_t *b =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, NULL);
  kl_t_store_clock_set(t0 + 60000);
  wait_stats(b, (kl_t_timers_want_t){.applied = 1});
  assert_int_equal(kl_t_worker_stop(b), KL_OK);
  assert_int_equal(kl_t_ledger_balance(fx.store, "m"), 9);
  assert_int_equal(pending(fx.store, fx.topic).n, 0);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

/* A worker process SIGKILLed after its timer committed and before it was
 * due: the worker that follows runs it once, from the store, on the real
 * clock; the record that ran it is stamped at or after its time. */
static void test_timer_survives_sigkill(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "tkill", 1, 1, 3, NULL);
  int64_t due = kl__now_ms() + 12000; /* past the first worker's join */
  publish(&fx, "k", "killed", 11, due);
  const char *argv[] = {
      kl_t_bin(), "worker", "-b",        fx.boot,
      "-t",       fx.topic, "-g",        kl_t_group(fx.cluster, "tkill"),
      "--store",  fx.dir,   "--handler", "ledger",
      NULL};
  pid_t pid = kl_t_spawn_worker(fx.dir, 0, argv);
  for (int i = 0; i < 300 && pending(fx.store, fx.topic).n == 0; i++)
    kl_t_sleep_ms(50);
  assert_int_equal(pending(fx.store, fx.topic).n, 1);
  assert_true(kl__now_ms() < due); /* killed before its time */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  assert_int_equal(kl_t_ledger_balance(fx.store, "k"), INT64_MIN);
  pid = kl_t_spawn_worker(fx.dir, 1, argv);
  for (int i = 0; i < 1200 && kl_t_ledger_balance(fx.store, "k") == INT64_MIN;
       i++)
    kl_t_sleep_ms(50);
  assert_int_equal(kl_t_ledger_balance(fx.store, "k"), 11);
  assert_int_equal(pending(fx.store, fx.topic).n, 0);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  kl_t_stamped_t st = {0};
  rd_kafka_t *rk =
      kl_t_consumer(fx.boot, kl_t_group(fx.cluster, "tkill-r"), fx.topic);
  assert_non_null(rk);
  assert_int_equal(kl_t_consume(rk, 2, 20000, stamped_one, &st), 2);
  kl_t_consumer_destroy(rk);
  assert_int_equal(st.firing, 1);
  assert_true(st.fired_at >= due);
  assert_int_equal(kl_t_ledger_balance(fx.store, "k"), 11);
  kl_t_ledger_fx_down(&fx);
}

/* A handler may not write keylane's own keys: it could schedule or cancel
 * any event. */
static void test_own_keys_are_refused(void **state) {
  (void)state;
  char dir[] = "/tmp/keylane-tmr-XXXXXX";
  assert_non_null(mkdtemp(dir));
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "t", 0, &ps), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, ps.epoch, &txn), KL_OK);
  assert_int_equal(kl_txn_put(txn, "~dx", 3, "1", 1), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "keylane's own"));
  assert_int_equal(kl_txn_del(txn, "~tx", 3), KL_EINVAL);
  assert_int_equal(kl_txn_put(txn, "x~", 2, "1", 1), KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* The ledger, and events of type "cancel" whose payload names the id of
 * a delayed event of the same key: their handler cancels its timer. One
 * that names no pending timer fails, saying why. */
static kl_handler_result_t cancel_handler(void *opaque, const kl_event_t *event,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size) {
  if (event->type_len != 6 || memcmp(event->type, "cancel", 6) != 0)
    return kl_ledger_handler(opaque, event, fence, txn, errbuf, errbuf_size);
  kl_err_t err =
      kl_txn_cancel(txn, event->key, event->key_len,
                    (const char *)event->payload, event->payload_len);
  if (err == KL_ENOTFOUND) {
    snprintf(errbuf, errbuf_size, "%s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  return err ? KL_HANDLER_RETRY : KL_HANDLER_OK;
}

static void publish_cancel(kl_t_ledger_fx_t *fx, const char *key,
                           const char *id) {
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = "cancel-1",
                   .id_len = 8,
                   .type = "cancel",
                   .type_len = 6,
                   .payload = id,
                   .payload_len = strlen(id)};
  if (strcmp(id, "never") == 0)
    ev.id = "cancel-2";
  assert_int_equal(kl_publish(fx->producer, fx->topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(fx->producer, 10000), KL_OK);
}

/* A handler cancels a delayed credit of its key: the credit is never
 * applied while the clock passes its time and the key's other timer
 * fires, a firing record of it is a duplicate, and so is a copy published
 * after the cancel (its id keeps the timer's mark: a retry of the first
 * publish does not bring it back). */
static void cancel_case(const char *store_uri, const char *name,
                        const char *const *extra) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  publish(&fx, "d", "later", 7, t0 + 30000);   /* 0: to be cancelled */
  publish(&fx, "d", "witness", 3, t0 + 60000); /* 1: fires after it */
  publish_cancel(&fx, "d", "later");           /* 2 */
  /* 3: its firing record, as if the owner wrote it before 2 */
  produce_firing(&fx, "d", "later", 7, t0 + 30000, 0);
  publish_cancel(&fx, "d", "never"); /* 4: no such timer: fails */

  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, extra, cancel_handler, NULL);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 1, .scheduled = 2, .duplicates = 1, .dead = 1});
  kl_pending_t left = pending(fx.store, fx.topic);
  assert_int_equal(left.n, 1);
  assert_int_equal(left.due[0], t0 + 60000);

  /* past both times: only the witness fires */
  kl_t_store_clock_set(t0 + 60000);
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 2, .scheduled = 2, .duplicates = 1, .dead = 1});
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 3);
  assert_int_equal(pending(fx.store, fx.topic).n, 0);

  publish(&fx, "d", "later", 7, t0 + 30000); /* a copy after the cancel */
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 2, .scheduled = 2, .duplicates = 2, .dead = 1});
  assert_int_equal(pending(fx.store, fx.topic).n, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 3);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_cancel_lmdb(void **state) {
  (void)state;
  cancel_case(NULL, "tcancel", NULL);
}

static void test_cancel_key_parallel_lmdb(void **state) {
  (void)state;
  const char *extra[] = {"worker.concurrency=4", NULL};
  cancel_case(NULL, "tcancelkp", extra);
}

static void test_cancel_key_parallel_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char db[32], uri[256];
  snprintf(db, sizeof(db), "tc%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, sizeof(uri)), 0);
  const char *extra[] = {"worker.concurrency=4", NULL};
  cancel_case(uri, "tcancelpg", extra);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_own_keys_are_refused),
      cmocka_unit_test(test_timers_lmdb),
      cmocka_unit_test(test_timers_pg),
      cmocka_unit_test(test_timer_moves_with_its_partition),
      cmocka_unit_test(test_timer_survives_sigkill),
      cmocka_unit_test(test_cancel_lmdb),
      cmocka_unit_test(test_cancel_key_parallel_lmdb),
      cmocka_unit_test(test_cancel_key_parallel_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
