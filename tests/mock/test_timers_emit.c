/*
 * Follow-ups with a delay (issue 36): kl_txn_emit_opts()'s not_before,
 * and an exec handler's "not_before"/"delay" emits.
 *  - the outbox's record keeps a follow-up's not_before, and a record
 *    written before delayed follow-ups (no not_before) still reads as it
 *    was written (kl_txn_emit_opts()'s limits: test_handler_exec);
 *  - on the embedded cluster, a handler (C, then exec; C on PostgreSQL
 *    too) emits a delayed follow-up to a key of another partition: it is
 *    published at once, waits there as a timer, and is applied once, only
 *    after the store's clock (kl_t_store_clock_set()) passed its time; a
 *    copy of the source event emits nothing again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/handlers.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "support/timer_checks.h"
#include "common/internal.h"
#include "handlers/exec.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "store/timers.h"

/* ---- the outbox record ---- */

/* A record as keylane wrote it before delayed follow-ups: topic "t", key
 * "k", id "i", type "y", ts 2, payload "p", and when @p trace a
 * traceparent "tp" (not a valid one: the codec does not judge it). */
static size_t old_record(unsigned char *b, int trace) {
  static const unsigned char head[] = {1, 0, 1, 1, 1, 0, 0, 0, 0,
                                       0, 0, 0, 2, 0, 0, 0, 1};
  memcpy(b, head, sizeof(head));
  memcpy(b + sizeof(head), "tkiyp", 5);
  size_t n = sizeof(head) + 5;
  if (trace) {
    memcpy(b + n, "\x02\x00\x00tp", 5);
    n += 5;
  }
  return n;
}

static void test_outbox_record_keeps_not_before(void **state) {
  (void)state;
  unsigned char old[64];
  kl__outbox_rec_t rec;
  for (int trace = 0; trace < 2; trace++) {
    size_t len = old_record(old, trace);
    assert_int_equal(kl__outbox_rec_decode(old, len, &rec), 0);
    assert_memory_equal(rec.event.payload, "p", 1);
    assert_int_equal(rec.event.ts, 2);
    assert_int_equal(rec.event.not_before, 0);
    assert_int_equal(rec.event.header_count, (size_t)trace);
    /* written again, the same bytes: a record without a not_before is
     * what an older keylane reads */
    kl__emits_t emits = {0};
    assert_int_equal(kl__emits_add(&emits, &rec), KL_OK);
    assert_int_equal(emits.len, 4 + len);
    assert_memory_equal(emits.bytes + 4, old, len);
    free(emits.bytes);
  }
  /* with a not_before, with and without a trace context */
  for (int trace = 0; trace < 2; trace++) {
    size_t len = old_record(old, trace);
    assert_int_equal(kl__outbox_rec_decode(old, len, &rec), 0);
    rec.event.not_before = 1767225600000;
    kl__emits_t emits = {0};
    assert_int_equal(kl__emits_add(&emits, &rec), KL_OK);
    size_t off = 0, n;
    const void *bytes;
    assert_true(kl__emits_next(&emits, &off, &bytes, &n));
    assert_int_equal(n, (trace ? len : len + 3) + 8);
    kl__outbox_rec_t back;
    assert_int_equal(kl__outbox_rec_decode(bytes, n, &back), 0);
    assert_int_equal(back.event.not_before, 1767225600000);
    assert_int_equal(back.event.header_count, (size_t)trace);
    assert_memory_equal(back.event.payload, "p", 1);
    /* an older keylane's reading of the same bytes: it ends at the body or
     * at a non-empty trace section, so it refuses them rather than
     * publish the follow-up at once */
    const unsigned char *b = bytes;
    size_t base = 22; /* the head and "tkiyp" */
    int old_reads =
        n == base ||
        (n >= base + 3 && b[base] &&
         n == base + 3 + b[base] + (size_t)(b[base + 1] << 8 | b[base + 2]));
    assert_false(old_reads);
    /* cut or with a time of 0: not a record */
    assert_int_equal(kl__outbox_rec_decode(bytes, n - 1, &back), -1);
    memset((unsigned char *)emits.bytes + 4 + n - 8, 0, 8);
    assert_int_equal(kl__outbox_rec_decode(bytes, n, &back), -1);
    free(emits.bytes);
  }
}

/* ---- on the embedded cluster ---- */

static int64_t t_nb;    /* the follow-up's not_before */
static char t_dest[16]; /* its key, on another partition than "src" */
static char t_log[128]; /* the exec child's log of what it ran */

/* "schedule" emits a credit of its payload to t_dest, due at t_nb; the
 * rest is the ledger's. */
static kl_handler_result_t
schedule_handler(void *opaque, const kl_event_t *event, const kl_fence_t *fence,
                 kl_txn_t *txn, char *errbuf, size_t size) {
  (void)opaque;
  if (event->type_len != 8 || memcmp(event->type, "schedule", 8) != 0)
    return kl_ledger_handler(NULL, event, fence, txn, errbuf, size);
  kl_emit_opts_t opts = {.size = sizeof(opts), .not_before = t_nb};
  if (kl_txn_emit_opts(txn, NULL, t_dest, strlen(t_dest), "credit",
                       event->payload, event->payload_len, &opts)) {
    snprintf(errbuf, size, "%s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  return KL_HANDLER_OK;
}

static void publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                    const char *type, int amount) {
  uint8_t p[9];
  kl_t_timers_amount(p, amount);
  kl_t_timers_publish(fx, key, id, type, p, sizeof(p), 0);
}

/* Waits for @p applied events applied, @p scheduled timers and
 * @p duplicates, then checks nothing else happened (no dead letter, none
 * early). */
static void wait_stats(kl_t_worker_t *w, uint64_t applied, uint64_t scheduled,
                       uint64_t duplicates) {
  kl_t_timers_wait(w, (kl_t_timers_want_t){.applied = applied,
                                           .scheduled = scheduled,
                                           .duplicates = duplicates,
                                           .fired = KL_T_ANY,
                                           .failed = KL_T_ANY});
}
typedef struct kl_pending {
  size_t n;
  int64_t due;
} kl_pending_t;

static int pending_one(void *opaque, const kl__timer_t *t, const void *key,
                       size_t key_len, const void *env, size_t env_len) {
  (void)env, (void)env_len;
  kl_pending_t *p = opaque;
  assert_int_equal(key_len, strlen(t_dest));
  assert_memory_equal(key, t_dest, key_len);
  p->n++;
  p->due = t->due_ms;
  return 0;
}

static kl_pending_t pending(kl_store_t *store, const char *topic,
                            int32_t partition) {
  kl_pending_t p = {0};
  size_t bad = 0;
  assert_int_equal(
      kl__timers_scan(store, topic, partition, pending_one, &p, &bad), KL_OK);
  assert_int_equal(bad, 0);
  return p;
}

/* Lines of the exec child's log holding @p text. */
static int log_count(const char *text) {
  FILE *f = fopen(t_log, "r");
  char line[4096];
  int n = 0;
  while (f && fgets(line, sizeof(line), f))
    n += strstr(line, text) != NULL;
  if (f)
    fclose(f);
  return n;
}

/* The delayed follow-up's case with an exec child as the handler when
 * @p use_exec, else the C schedule_handler(), on the store at @p store_uri
 * (NULL: LMDB). */
static void followup_case(const char *name, int use_exec,
                          const char *store_uri) {
  int64_t t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  t_nb = t0 + 60000;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 2, 1, 5, store_uri);
  int32_t src_p = kl_partition("src", 3, 2), dest_p = 0;
  for (int i = 0; dest_p == src_p || i == 0; i++) {
    snprintf(t_dest, sizeof(t_dest), "dest-%d", i);
    dest_p = kl_partition(t_dest, strlen(t_dest), 2);
  }
  kl__exec_t *exec = NULL;
  if (use_exec) {
    snprintf(t_log, sizeof(t_log), "%s/exec.log", fx.dir);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "while read -r l; do echo \"$l\" >> %s; case \"$l\" in "
             "*'\"type\":\"schedule\"'*) echo '{\"status\":\"ok\",\"emit\":"
             "[{\"key\":\"%s\",\"type\":\"credit\",\"payload\":{\"amount\":7},"
             "\"not_before\":%lld}]}';; *) echo '{\"status\":\"ok\"}';; "
             "esac; done",
             t_log, t_dest, (long long)t_nb);
    assert_int_equal(kl__exec_new(cmd, &exec), KL_OK);
  }
  publish(&fx, "src", "s-1", "schedule", 7);
  kl_t_worker_t *w = kl_t_worker_new_with(
      fx.boot, fx.topic, kl_t_group(fx.cluster, name), fx.store, NULL,
      exec ? kl__exec_handler : schedule_handler, exec);
  kl_t_worker_go(w);
  /* the source applied, its follow-up published and kept as a timer on
   * its key's partition */
  wait_stats(w, 1, 1, 0);
  kl_pending_t p = pending(fx.store, fx.topic, dest_p);
  assert_int_equal(p.n, 1);
  assert_int_equal(p.due, t_nb);
  assert_int_equal(pending(fx.store, fx.topic, src_p).n, 0);
  /* before its time the key's later events go on without it */
  kl_t_store_clock_set(t_nb - 1);
  publish(&fx, t_dest, "marker", "credit", 1);
  publish(&fx, "src", "s-1", "schedule", 7); /* a copy: emits nothing */
  wait_stats(w, 2, 1, 1);
  if (exec)
    assert_int_equal(log_count("\"not_before\""), 0);
  else
    assert_int_equal(kl_t_ledger_balance(fx.store, t_dest), 1);
  assert_int_equal(pending(fx.store, fx.topic, dest_p).n, 1);
  /* its time: applied, once */
  kl_t_store_clock_set(t_nb);
  wait_stats(w, 3, 1, 1);
  assert_int_equal(pending(fx.store, fx.topic, dest_p).n, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  if (exec) {
    char nb[64];
    snprintf(nb, sizeof(nb), "\"not_before\":%lld", (long long)t_nb);
    assert_int_equal(log_count(nb), 1); /* the request carries its time */
    assert_int_equal(log_count("\"type\":\"credit\""), 2);
    kl__exec_destroy(exec);
  } else {
    assert_int_equal(kl_t_ledger_balance(fx.store, t_dest), 8);
  }
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_delayed_followup(void **state) {
  (void)state;
  followup_case("tmremit", 0, NULL);
}

static void test_delayed_followup_exec(void **state) {
  (void)state;
  followup_case("tmrexec", 1, NULL);
}

/* PostgreSQL keeps the outbox record, its not_before too, as LMDB does. */
static void test_delayed_followup_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "tmremit", uri, sizeof(uri)), 0);
  followup_case("tmremitpg", 0, uri);
}

/* A follow-up due at @p nb that kl_txn_emit_opts() refuses, @p where
 * ("from now", "in the past") of its source's time by more than
 * timer.max.delay, fails its source event, whole: a dead letter whose
 * reason says so, nothing emitted. */
static void emit_refused(const char *name, int64_t nb, const char *where) {
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 5, NULL);
  snprintf(t_dest, sizeof(t_dest), "dest");
  t_nb = nb;
  publish(&fx, "src", "s-far", "schedule", 3);
  kl_t_stderr_t err;
  kl_t_stderr_begin(&err);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, NULL, schedule_handler, NULL);
  kl_t_worker_go(w);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !st.dead_letters; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    kl_t_sleep_ms(50);
  }
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  char *log = kl_t_stderr_end(&err);
  assert_int_equal(st.dead_letters, 1);
  assert_int_equal(st.applied, 0);
  assert_int_equal(st.timers_scheduled, 0);
  assert_non_null(strstr(log, where));
  assert_non_null(strstr(log, "more than timer.max.delay (7d) allows"));
  free(log);
  kl_t_ledger_fx_down(&fx);
}

/* A follow-up due past timer.max.delay (7 days). */
static void test_emit_past_max_dead_letters(void **state) {
  (void)state;
  emit_refused("tmrfar", kl__now_ms() + 8 * 24 * 3600 * 1000LL, "from now");
}

/* Issue 36 (M1): one due more than timer.max.delay ago, which the outbox's
 * publish would refuse (a dead letter "outbox" after its source
 * committed), and the worker too, is refused when it is emitted. */
static void test_emit_long_past_dead_letters(void **state) {
  (void)state;
  emit_refused("tmrpast", kl__now_ms() - 8 * 24 * 3600 * 1000LL, "in the past");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outbox_record_keeps_not_before),
      cmocka_unit_test(test_delayed_followup),
      cmocka_unit_test(test_delayed_followup_exec),
      cmocka_unit_test(test_delayed_followup_pg),
      cmocka_unit_test(test_emit_past_max_dead_letters),
      cmocka_unit_test(test_emit_long_past_dead_letters),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
