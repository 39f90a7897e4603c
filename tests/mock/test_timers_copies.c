/*
 * The integrity of delayed events against their copies and their letters
 * (issue 36, docs/design.md "Timers"), on the embedded cluster with the
 * ledger handler, on LMDB and on PostgreSQL. The store's clock is the
 * test's (kl_t_store_clock_set()), which the worker's timers read too.
 *  - a copy of a waiting delayed event without `nb` (same key and id: a
 *    retry that dropped the delay, a producer keylane did not write) is a
 *    duplicate: the event runs once, at its time, from its timer; so are
 *    copies, with or without `nb`, of one whose timer a handler cancelled;
 *  - a delayed event whose time lies before its record's by more than
 *    store.dedup.retention (nb in seconds, say) is a dead letter saying so;
 *  - `keylane replay --from-dlq` of a delayed event whose time is still
 *    ahead schedules it again (it runs at its time); a firing record that
 *    failed runs at once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "keylane/handlers.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/kafka_read.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "common/internal.h"
#include "store/store_internal.h"
#include "store/timers.h"
#include "worker/redrive.h"

#define DAY_MS (24 * 3600 * 1000LL)
#define DUE 4000

static int64_t t0;
static int t_db_seq;

static int64_t balance_of(kl_store_t *store, const char *key) {
  kl_ledger_entry_t e;
  return kl_t_ledger_find(store, NULL, key, &e) ? e.balance : INT64_MIN;
}

/* The envelope of a credit of @p n (0..127) of (@p key, @p id), due at
 * @p not_before (0: none); the caller frees *env. */
static void credit_env(const char *key, const char *id, int n,
                       int64_t not_before, void **env, size_t *len) {
  uint8_t p[9];
  memcpy(p,
         "\x81\xa6"
         "amount",
         8);
  p[8] = (uint8_t)n;
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = "credit",
                   .type_len = 6,
                   .ts = t0,
                   .payload = p,
                   .payload_len = 9,
                   .not_before = not_before};
  assert_int_equal(kl_event_encode(&ev, env, len), KL_OK);
}

/* Writes the credit raw to partition 0, past kl_publish()'s checks, as a
 * producer that is not keylane could. */
static void produce(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                    int n, int64_t not_before) {
  void *env;
  size_t len;
  credit_env(key, id, n, not_before, &env, &len);
  assert_int_equal(
      kl_t_produce_raw(fx->boot, fx->topic, 0, key, env, len, NULL), 0);
  free(env);
}

/* The ledger, and events of type "cancel" whose payload names the id of a
 * delayed event of their key, whose timer they cancel. While *refuse is
 * set (the opaque), a credit whose id begins with "bad" fails. */
static kl_handler_result_t handler(void *opaque, const kl_event_t *event,
                                   const kl_fence_t *fence, kl_txn_t *txn,
                                   char *errbuf, size_t errbuf_size) {
  if (opaque && *(int *)opaque && event->id_len > 3 &&
      memcmp(event->id, "bad", 3) == 0) {
    snprintf(errbuf, errbuf_size, "refused by the test");
    return KL_HANDLER_FAIL;
  }
  if (event->type_len != 6 || memcmp(event->type, "cancel", 6) != 0)
    return kl_ledger_handler(NULL, event, fence, txn, errbuf, errbuf_size);
  kl_err_t err =
      kl_txn_cancel(txn, event->key, event->key_len,
                    (const char *)event->payload, event->payload_len);
  return err ? KL_HANDLER_FAIL : KL_HANDLER_OK;
}

typedef struct kl_want {
  uint64_t applied, scheduled, duplicates, dead;
} kl_want_t;

/* Waits (30 s at most) until @p w's counters reach @p want, then checks
 * they are exactly that. */
static void wait_stats(kl_t_worker_t *w, kl_want_t want) {
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.applied >= want.applied && st.timers_scheduled >= want.scheduled &&
        st.duplicates >= want.duplicates && st.dead_letters >= want.dead)
      break;
    kl_t_sleep_ms(50);
  }
  assert_int_equal(st.applied, want.applied);
  assert_int_equal(st.timers_scheduled, want.scheduled);
  assert_int_equal(st.duplicates, want.duplicates);
  assert_int_equal(st.dead_letters, want.dead);
}

static int count_one(void *opaque, const kl__timer_t *t, const void *key,
                     size_t key_len, const void *env, size_t env_len) {
  (void)t, (void)key, (void)key_len, (void)env, (void)env_len;
  (*(size_t *)opaque)++;
  return 0;
}

static size_t pending(kl_store_t *store, const char *topic) {
  size_t n = 0;
  assert_int_equal(kl__timers_scan(store, topic, -1, count_one, &n, NULL),
                   KL_OK);
  return n;
}

typedef struct kl_marks {
  const char *id;
  kl_mark_t mark; /* of the id, as the store keeps it */
} kl_marks_t;

static int mark_of(void *opaque, const char *topic, const void *key,
                   size_t key_len, const char *id, size_t id_len,
                   int64_t time_ms, kl_mark_t mark) {
  (void)topic, (void)key, (void)key_len, (void)time_ms;
  kl_marks_t *m = opaque;
  if (id_len == strlen(m->id) && memcmp(id, m->id, id_len) == 0)
    m->mark = mark;
  return 0;
}

static kl_mark_t stored_mark(kl_store_t *store, const char *id) {
  kl_marks_t m = {id, KL_MARK_NONE};
  assert_int_equal(kl__store_ids_walk(store, mark_of, &m), KL_OK);
  return m.mark;
}

typedef struct kl_letters {
  int n, past; /* letters; those whose error names their bound */
} kl_letters_t;

static void letter_one(void *opaque, const rd_kafka_message_t *m, int i) {
  (void)i;
  kl_letters_t *l = opaque;
  rd_kafka_headers_t *h = NULL;
  char error[512];
  rd_kafka_message_headers((rd_kafka_message_t *)m, &h);
  kl_t_header(h, "keylane.dlq.error", error, sizeof(error));
  l->n++;
  l->past += (strstr(error, "more than store.dedup.retention (7d)") &&
              strstr(error, "in the past")) ||
             strstr(error, "it looks like seconds; give milliseconds");
}

static void store_for(char *uri, size_t size, const char *prefix) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char db[32];
  snprintf(db, sizeof(db), "%s%d", prefix, ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, size), 0);
}

static void copies_case(const char *store_uri, const char *name,
                        const char *const *extra) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  produce(&fx, "d", "later", 7, t0 + DUE); /* 0: waits */
  produce(&fx, "d", "later", 7, 0);        /* 1: a copy without nb */
  produce(&fx, "c", "gone", 5, t0 + DUE);  /* 2: waits, then cancelled */
  kl_event_t cancel = {.key = "c",
                       .key_len = 1,
                       .id = "cancel-1",
                       .id_len = 8,
                       .type = "cancel",
                       .type_len = 6,
                       .payload = "gone",
                       .payload_len = 4};
  assert_int_equal(kl_publish(fx.producer, fx.topic, &cancel, NULL), KL_OK);
  assert_int_equal(kl_flush(fx.producer, 10000), KL_OK); /* 3 */
  produce(&fx, "c", "gone", 5, 0);        /* 4: a copy after the cancel */
  produce(&fx, "c", "gone", 5, t0 + DUE); /* 5: with nb, after it too */
  /* 6: its time more than store.dedup.retention (7 d) before its
   * record's; 7: in seconds; 8: a day ago, within it: runs at once */
  produce(&fx, "p", "too-old", 1, t0 - 8 * DAY_MS);
  produce(&fx, "p", "seconds", 2, t0 / 1000 + 60);
  produce(&fx, "p", "yesterday", 4, t0 - DAY_MS);

  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, extra, handler, NULL);
  kl_t_worker_go(w);
  /* applied: the cancel, and yesterday's once its timer fires */
  wait_stats(
      w, (kl_want_t){.applied = 2, .scheduled = 3, .duplicates = 3, .dead = 2});
  assert_int_equal(balance_of(fx.store, "d"), INT64_MIN); /* not yet */
  assert_int_equal(balance_of(fx.store, "c"), INT64_MIN);
  assert_int_equal(balance_of(fx.store, "p"), 4);
  assert_int_equal(pending(fx.store, fx.topic), 1);
  assert_int_equal(stored_mark(fx.store, "later"), KL__MARK_TIMER);
  assert_int_equal(stored_mark(fx.store, "gone"), KL__MARK_CANCELLED);

  kl_t_store_clock_set(t0 + DUE); /* its time: it runs, once */
  wait_stats(
      w, (kl_want_t){.applied = 3, .scheduled = 3, .duplicates = 3, .dead = 2});
  assert_int_equal(balance_of(fx.store, "d"), 7);
  assert_int_equal(stored_mark(fx.store, "later"), KL_MARK_APPLIED);
  produce(&fx, "d", "later", 7, 0); /* a copy after it ran */
  wait_stats(
      w, (kl_want_t){.applied = 3, .scheduled = 3, .duplicates = 4, .dead = 2});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "d"), 7);
  assert_int_equal(balance_of(fx.store, "c"), INT64_MIN);
  assert_int_equal(pending(fx.store, fx.topic), 0);

  char dlq[300];
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx.topic);
  rd_kafka_t *rk = kl_t_consumer(fx.boot, kl_t_group(fx.cluster, "tcl"), dlq);
  assert_non_null(rk);
  kl_letters_t l = {0};
  assert_int_equal(kl_t_consume(rk, 2, 20000, letter_one, &l), 2);
  kl_t_consumer_destroy(rk);
  assert_int_equal(l.past, 2);
  /* the cancelled one's id is marked so (no timer waits for it: issue 36),
   * which `keylane store get` names */
  assert_int_equal(stored_mark(fx.store, "gone"), KL__MARK_CANCELLED);
  kl_t_run_t run;
  kl_t_run((const char *[]){"store", "get", "--id", "gone", "--store", fx.where,
                            "--json", NULL},
           NULL, 0, &run);
  assert_int_equal(run.rc, 0);
  json_t *got = kl_t_run_json(&run);
  kl_t_run_free(&run);
  assert_string_equal(json_string_value(json_object_get(got, "mark")),
                      "cancelled");
  json_decref(got);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_copies_lmdb(void **state) {
  (void)state;
  copies_case(NULL, "tcopies", NULL);
}

static void test_copies_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "tcp");
  copies_case(uri, "tcopiespg", NULL);
}

/* The lanes' key-parallel executors run each event on a child txn, whose
 * marks reach the batch through the lane's overlay. */
static void test_copies_key_parallel_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "tck");
  const char *extra[] = {"worker.concurrency=4", NULL};
  copies_case(uri, "tcopieskp", extra);
}

/* A redrive of every letter; @p dry_run: what it would do. With @p max
 * (timer.max.delay) set, the redrive is refused: NULL. */
static kl__redrive_t *redrive_with(kl_t_ledger_fx_t *fx, int *refuse,
                                   int dry_run, const char *max) {
  char dlq[300];
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx->topic);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  if (max)
    assert_int_equal(kl_conf_set(conf, "timer.max.delay", max), KL_OK);
  kl__redrive_opts_t o = {.conf = conf,
                          .dlq_topic = dlq,
                          .topic = fx->topic,
                          .store = fx->store,
                          .handler = handler,
                          .handler_opaque = refuse,
                          .dry_run = dry_run,
                          .from = {KL__POS_BEGINNING, 0},
                          .to = {KL__POS_END, 0}};
  kl__redrive_t *r = NULL;
  assert_int_equal(kl__redrive_run(&o, &r), max ? KL_ECONF : KL_OK);
  kl_conf_destroy(conf);
  return r;
}

static kl__redrive_t *redrive(kl_t_ledger_fx_t *fx, int *refuse) {
  return redrive_with(fx, refuse, 0, NULL);
}

/* Issue 36 (H1 A): a redrive schedules timers under its own
 * timer.max.delay; one longer than store.dedup.retention (7 d) is refused
 * as the worker refuses it at start, naming both and the fix. */
static void redrive_refuses_max(kl_t_ledger_fx_t *fx) {
  assert_null(redrive_with(fx, NULL, 0, "8d"));
  assert_non_null(strstr(kl_err_detail(), "timer.max.delay (8d) is longer "
                                          "than store.dedup.retention (7d)"));
}

static void redrive_case(const char *store_uri, const char *name) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  /* 0: past this fleet's timer.max.delay (1 d): a dead letter, which the
   * redrive (7 d) schedules; 1: its firing record fails: a dead letter
   * that carries the keylane.timer header */
  produce(&fx, "s", "far", 3, t0 + 2 * DAY_MS);
  produce(&fx, "r", "bad-1", 5, t0 + DUE);
  /* 2: a time in seconds, 3: past by more than store.dedup.retention:
   * decode letters, which a redrive keeps so (issue 36, H2) */
  produce(&fx, "q", "seconds", 6, t0 / 1000 + DAY_MS / 1000);
  produce(&fx, "q", "ancient", 6, t0 - 8 * DAY_MS);
  int refuse = 1;
  const char *extra[] = {"timer.max.delay=1d", NULL};
  const char *group = kl_t_group(fx.cluster, name);
  kl_t_worker_t *w = kl_t_worker_new_with(fx.boot, fx.topic, group, fx.store,
                                          extra, handler, &refuse);
  kl_t_worker_go(w);
  wait_stats(w, (kl_want_t){.scheduled = 1, .dead = 3});
  kl_t_store_clock_set(t0 + DUE);
  wait_stats(w, (kl_want_t){.scheduled = 1, .dead = 4});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  /* a decode letter: not marked (its record's fault) */
  assert_int_equal(stored_mark(fx.store, "far"), KL_MARK_NONE);
  assert_int_equal(stored_mark(fx.store, "bad-1"), KL_MARK_DEAD_LETTER);
  kl_partition_state_t ps; /* its dead letter, over its timer's mark */
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &ps), KL_OK);
  assert_int_equal(ps.dead_letters, 1);

  refuse = 0;
  redrive_refuses_max(&fx);
  kl__redrive_t *r = redrive_with(&fx, &refuse, 1, NULL); /* predicts: */
  assert_int_equal(kl__redrive_count(r, KL__OUT_SCHEDULED), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_FAILED), 2);
  kl__redrive_destroy(r);
  r = redrive(&fx, &refuse);
  assert_int_equal(kl__redrive_count(r, KL__OUT_SCHEDULED), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_FAILED), 2);
  size_t n;
  const kl__redriven_t *x = kl__redrive_results(r, &n);
  for (size_t i = 0; i < n; i++, x++) {
    if (x->outcome == KL__OUT_FAILED)
      assert_true(strstr(x->why, "looks like seconds") ||
                  strstr(x->why, "store.dedup.retention"));
  }
  kl__redrive_destroy(r);
  assert_int_equal(balance_of(fx.store, "r"), 5); /* the firing: at once */
  assert_int_equal(balance_of(fx.store, "s"), INT64_MIN); /* not yet */
  assert_int_equal(balance_of(fx.store, "q"), INT64_MIN); /* never */
  assert_int_equal(pending(fx.store, fx.topic), 1);
  assert_int_equal(stored_mark(fx.store, "far"), KL__MARK_TIMER);
  r = redrive(&fx, &refuse); /* again: both done, the others refused */
  assert_int_equal(kl__redrive_count(r, KL__OUT_DUPLICATE), 2);
  assert_int_equal(kl__redrive_count(r, KL__OUT_FAILED), 2);
  kl__redrive_destroy(r);

  w = kl_t_worker_new_with(fx.boot, fx.topic, group, fx.store, extra, handler,
                           &refuse);
  kl_t_worker_go(w);
  kl_t_store_clock_set(t0 + 2 * DAY_MS); /* its time: the owner runs it */
  wait_stats(w, (kl_want_t){.applied = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "s"), 3);
  assert_int_equal(balance_of(fx.store, "r"), 5);
  assert_int_equal(pending(fx.store, fx.topic), 0);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_redrive_lmdb(void **state) {
  (void)state;
  redrive_case(NULL, "tredrive");
}

static void test_redrive_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "trp");
  redrive_case(uri, "tredrivepg");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copies_lmdb),
      cmocka_unit_test(test_redrive_lmdb),
      cmocka_unit_test(test_copies_pg),
      cmocka_unit_test(test_copies_key_parallel_pg),
      cmocka_unit_test(test_redrive_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
