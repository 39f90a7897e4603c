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
 *    failed runs at once;
 *  - the dead letter of a firing record takes its timer, in the fleet's
 *    store and in a rebuild's alike, and kl_txn_cancel() finds no timer
 *    of a dead-lettered id before that commit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
#include "support/timer_checks.h"
#include "common/internal.h"
#include "store/store_internal.h"
#include "store/timers.h"
#include "worker/letters.h"
#include "worker/redrive.h"
#include "worker/replay.h"

#define DAY_MS (24 * 3600 * 1000LL)
#define DUE 4000

static int64_t t0;
static int t_db_seq;

/* The envelope of a credit of @p n (0..127) of (@p key, @p id), due at
 * @p not_before (0: none); the caller frees *env. */
static void credit_env(const char *key, const char *id, int n,
                       int64_t not_before, void **env, size_t *len) {
  uint8_t p[9];
  kl_t_timers_amount(p, n);
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

/* Waits for the counters this test checks (not early, fired, failed). */
static void wait_stats(kl_t_worker_t *w, kl_t_timers_want_t want) {
  want.early = want.fired = want.failed = KL_T_ANY;
  kl_t_timers_wait(w, want);
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
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 2, .scheduled = 3, .duplicates = 3, .dead = 2});
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), INT64_MIN); /* not yet */
  assert_int_equal(kl_t_ledger_balance(fx.store, "c"), INT64_MIN);
  assert_int_equal(kl_t_ledger_balance(fx.store, "p"), 4);
  assert_int_equal(pending(fx.store, fx.topic), 1);
  assert_int_equal(stored_mark(fx.store, "later"), KL__MARK_TIMER);
  assert_int_equal(stored_mark(fx.store, "gone"), KL__MARK_CANCELLED);

  kl_t_store_clock_set(t0 + DUE); /* its time: it runs, once */
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 3, .scheduled = 3, .duplicates = 3, .dead = 2});
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 7);
  assert_int_equal(stored_mark(fx.store, "later"), KL_MARK_APPLIED);
  produce(&fx, "d", "later", 7, 0); /* a copy after it ran */
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 3, .scheduled = 3, .duplicates = 4, .dead = 2});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_ledger_balance(fx.store, "d"), 7);
  assert_int_equal(kl_t_ledger_balance(fx.store, "c"), INT64_MIN);
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

/* Rebuilds the fixture's topic from its log into @p where (an empty
 * store), in this process, so on the test's clock, with @p extra conf
 * ("name=value"), as `keylane store rebuild` does. */
static kl_store_t *rebuild(kl_t_ledger_fx_t *fx, const char *where,
                           const char *extra, int *refuse) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  char name[64];
  const char *eq = strchr(extra, '=');
  snprintf(name, sizeof(name), "%.*s", (int)(eq - extra), extra);
  assert_int_equal(kl_conf_set(conf, name, eq + 1), KL_OK);
  kl_store_t *store;
  assert_int_equal(kl_store_open(where, NULL, &store), KL_OK);
  kl__replay_part_t t;
  kl_t_rebuild_into(conf, fx->topic, store, handler, refuse, &t);
  if (t.status != KL__REPLAY_DONE)
    fail_msg("the rebuild ended %s: %s", kl__replay_status_name(t.status),
             t.why);
  kl_conf_destroy(conf);
  return store;
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
  /* 0: past this fleet's timer.max.delay (1 d): a dead letter; 1: its
   * firing record fails: a dead letter that carries the keylane.timer
   * header, whose commit takes its timer */
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
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 1, .dead = 3});
  kl_t_store_clock_set(t0 + DUE);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 1, .dead = 4});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  /* a decode letter: not marked (its record's fault) */
  assert_int_equal(stored_mark(fx.store, "far"), KL_MARK_NONE);
  assert_int_equal(stored_mark(fx.store, "bad-1"), KL_MARK_DEAD_LETTER);
  assert_int_equal(pending(fx.store, fx.topic), 0);
  kl_partition_state_t ps; /* its dead letter, over its timer's mark */
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &ps), KL_OK);
  assert_int_equal(ps.dead_letters, 1);

  /* A day and a half later "far" is within the bound: its redrive
   * publishes it back, stamped now, and the owner schedules it from that
   * record; the failed firing record runs at once. */
  kl_t_store_clock_set(t0 + DAY_MS + DAY_MS / 2);
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
  assert_int_equal(kl_t_ledger_balance(fx.store, "r"),
                   5); /* the firing: at once */
  assert_int_equal(kl_t_ledger_balance(fx.store, "s"), INT64_MIN); /* not yet */
  assert_int_equal(kl_t_ledger_balance(fx.store, "q"), INT64_MIN); /* never */
  assert_int_equal(pending(fx.store, fx.topic), 0); /* in the log */
  w = kl_t_worker_new_with(fx.boot, fx.topic, group, fx.store, extra, handler,
                           &refuse);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
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
  wait_stats(w, (kl_t_timers_want_t){.applied = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_ledger_balance(fx.store, "s"), 3);
  assert_int_equal(kl_t_ledger_balance(fx.store, "r"), 5);
  assert_int_equal(pending(fx.store, fx.topic), 0);

  /* A rebuild with the fleet's bound refuses "far" where it was first
   * read, as the fleet did, and schedules it from its redrive's record:
   * its firing record runs it there too (the failed one of "bad-1", which
   * the handler takes now, applies it). Before, the redrive wrote that
   * timer to the store alone, and a rebuild never ran "far". */
  char rebuilt[300];
  if (store_uri) {
    store_for(rebuilt, sizeof(rebuilt), "trr");
  } else {
    snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
    assert_int_equal(mkdir(rebuilt, 0700), 0);
  }
  kl_store_t *copy = rebuild(&fx, rebuilt, "timer.max.delay=1d", &refuse);
  assert_int_equal(kl_t_ledger_balance(copy, "s"), 3);
  assert_int_equal(kl_t_ledger_balance(copy, "r"), 5);
  assert_int_equal(pending(copy, fx.topic), 0);
  assert_int_equal(stored_mark(copy, "far"), KL_MARK_APPLIED);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

/* A delayed record of another event whose headers name a letter (a
 * producer that is not keylane) does not take that letter for redriven:
 * the letter's record names the event it redrove, and a redrive of the
 * letter still runs it (attack 2, H1: the letter was a "duplicate" for
 * good, its event lost). */
static void forged_letter_case(const char *store_uri, const char *name) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  produce(&fx, "x", "bad-x", 4, 0); /* the handler fails it: letter 0/0 */
  int refuse = 1;
  const char *group = kl_t_group(fx.cluster, name);
  kl_t_worker_t *w = kl_t_worker_new_with(fx.boot, fx.topic, group, fx.store,
                                          NULL, handler, &refuse);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){.dead = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  /* where the letter landed, as a dry run lists it */
  char dlq[300], letter[KL__LETTER_KEY_MAX + 1];
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx.topic);
  kl__redrive_t *r = redrive_with(&fx, &refuse, 1, NULL);
  size_t n;
  const kl__redriven_t *x = kl__redrive_results(r, &n);
  assert_int_equal(n, 1);
  letter[kl__letter_key(dlq, x->letter, letter)] = '\0';
  kl__redrive_destroy(r);
  void *env;
  size_t len;
  credit_env("z", "forged", 9, t0 + 1000, &env, &len);
  const char *const hdrs[] = {"keylane.redrive", "0", "keylane.redrive.letter",
                              letter, NULL};
  assert_int_equal(kl_t_produce_raw(fx.boot, fx.topic, 0, "z", env, len, hdrs),
                   0);
  free(env);
  w = kl_t_worker_new_with(fx.boot, fx.topic, group, fx.store, NULL, handler,
                           &refuse);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  refuse = 0;
  r = redrive(&fx, &refuse);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_DUPLICATE), 0);
  kl__redrive_destroy(r);
  assert_int_equal(kl_t_ledger_balance(fx.store, "x"), 4);
  r = redrive(&fx, &refuse); /* done now: its own record names it */
  assert_int_equal(kl__redrive_count(r, KL__OUT_DUPLICATE), 1);
  kl__redrive_destroy(r);
  assert_int_equal(kl_t_ledger_balance(fx.store, "x"), 4);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_forged_letter_lmdb(void **state) {
  (void)state;
  forged_letter_case(NULL, "tforged");
}

static void test_forged_letter_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "tfp");
  forged_letter_case(uri, "tforgedpg");
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

/* The dead letter of a firing record takes its timer, in the fleet's
 * commit and in a rebuild's alike: a rebuild records the fleet's dead
 * letters where they were, so both hold the same pending timers. Before,
 * the fleet's timer waited for the next firing record, and that record
 * read again above the watermark took it where a rebuild kept it. */
static void dead_case(const char *store_uri, const char *name) {
  t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  /* 0: a delayed event of a type the ledger refuses: its firing record is
   * a dead letter; 1: a credit that waits five days */
  void *env;
  size_t len;
  kl_event_t bad = {.key = "n",
                    .key_len = 1,
                    .id = "nope-1",
                    .id_len = 6,
                    .type = "nope",
                    .type_len = 4,
                    .ts = t0,
                    .payload = "\x80",
                    .payload_len = 1,
                    .not_before = t0 + DUE};
  assert_int_equal(kl_event_encode(&bad, &env, &len), KL_OK);
  assert_int_equal(kl_t_produce_raw(fx.boot, fx.topic, 0, "n", env, len, NULL),
                   0);
  free(env);
  produce(&fx, "d", "later", 7, t0 + 5 * DAY_MS);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, NULL, handler, NULL);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 2});
  kl_t_store_clock_set(t0 + DUE);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 2, .dead = 1});
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(stored_mark(fx.store, "nope-1"), KL_MARK_DEAD_LETTER);
  assert_int_equal(pending(fx.store, fx.topic), 1); /* the credit's */

  /* the firing record is stamped by the test's clock: the rebuild reads
   * it once the real one passed it, as it would in life */
  kl__store_set_clock(NULL);
  while (kl__now_ms() <= t0 + DUE)
    kl_t_sleep_ms(100);
  char rebuilt[300];
  if (store_uri)
    store_for(rebuilt, sizeof(rebuilt), "tdr");
  else
    snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
  kl_store_t *copy = kl_t_ledger_fx_rebuild(&fx, rebuilt, NULL, NULL);
  assert_int_equal(stored_mark(copy, "nope-1"), KL_MARK_DEAD_LETTER);
  assert_int_equal(pending(copy, fx.topic), 1);
  assert_int_equal(stored_mark(copy, "later"), KL__MARK_TIMER);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

/* A timer whose id was dead-lettered no longer waits, though its row
 * stays until the commit that records the dead letter takes it: a cancel
 * run before that commit (its key's next event, once the letter was
 * acknowledged) finds none, as in a rebuild, where the dead letter took
 * it at its place in the log. */
static void dead_cancel_case(const char *store_uri) {
  char dir[256] = "";
  if (!store_uri)
    kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(store_uri ? store_uri : dir, NULL, &store),
                   KL_OK);
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(store, "tdc", 0, &st), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "tdc", 0, st.epoch, &txn), KL_OK);
  kl__timer_t t = {kl__now_ms() + 60000, 0, 0};
  assert_int_equal(
      kl__timer_put(txn, "tdc", 0, "k", 1, "later", 5, &t, "env", 3), KL_OK);
  assert_int_equal(kl_store_commit(txn, 1), KL_OK);
  assert_int_equal(kl_store_begin(store, "tdc", 0, st.epoch, &txn), KL_OK);
  assert_int_equal(kl_txn_mark(txn, "k", 1, "later", 5, KL_MARK_DEAD_LETTER),
                   KL_OK);
  kl_event_t ev = {.key = "k", .key_len = 1, .id = "c", .id_len = 1};
  kl_fence_t fence = {"tdc", 0, st.epoch, 2};
  kl__txn_source_event(txn, &ev, &fence);
  assert_int_equal(kl_txn_cancel(txn, "k", 1, "later", 5), KL_ENOTFOUND);
  kl_store_abort(txn);
  kl_store_destroy(store);
  if (!store_uri)
    kl_t_rmrf(dir);
}

static void test_dead_cancel_lmdb(void **state) {
  (void)state;
  dead_cancel_case(NULL);
}

static void test_dead_cancel_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "tdx");
  dead_cancel_case(uri);
}

static void test_dead_lmdb(void **state) {
  (void)state;
  dead_case(NULL, "tdead");
}

static void test_dead_pg(void **state) {
  (void)state;
  char uri[256];
  store_for(uri, sizeof(uri), "tdp");
  dead_case(uri, "tdeadpg");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copies_lmdb),
      cmocka_unit_test(test_redrive_lmdb),
      cmocka_unit_test(test_forged_letter_lmdb),
      cmocka_unit_test(test_dead_lmdb),
      cmocka_unit_test(test_dead_cancel_lmdb),
      cmocka_unit_test(test_copies_pg),
      cmocka_unit_test(test_copies_key_parallel_pg),
      cmocka_unit_test(test_redrive_pg),
      cmocka_unit_test(test_forged_letter_pg),
      cmocka_unit_test(test_dead_pg),
      cmocka_unit_test(test_dead_cancel_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
