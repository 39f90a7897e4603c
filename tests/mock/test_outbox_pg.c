/*
 * The outbox on the PostgreSQL store: the bank test (transfers debit one
 * account and emit the other's credit, committed with the debit) conserves
 * money and verifies every balance at concurrency 1 and in key-parallel
 * lanes, a store rebuilt from the log into another database holds none
 * of the follow-ups the log holds (issue 39, finding 7: a worker on it
 * republished every one), and a fenced batch's follow-ups are never
 * written. Skips, saying
 * why, when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/support.h"
#include "store/store_internal.h"

#define PARTS 4

static int t_db_seq;

static void kl_fx_up(kl_t_ledger_fx_t *fx, const char *topic) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char name[32], uri[256];
  snprintf(name, sizeof(name), "ob%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, name, uri, sizeof(uri)), 0);
  kl_t_ledger_fx_up(fx, topic, PARTS, 20, 23, uri);
}

typedef struct kl_seqs {
  size_t n;
  uint64_t s[8];
} kl_seqs_t;

static int kl_seqs_cb(void *opaque, uint64_t seq, const void *rec, size_t len) {
  (void)rec, (void)len;
  kl_seqs_t *got = opaque;
  if (got->n < 8)
    got->s[got->n++] = seq;
  return 0;
}

static void kl_bank_pg(const char *topic, const char *concurrency) {
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, topic);
  const char *extra[] = {concurrency, "store.pg.pool=8", NULL};
  kl_t_worker_t *w = kl_t_worker_start(fx.boot, fx.topic, "g", fx.store, extra);
  for (int i = 0; i < 300; i++) {
    assert_int_equal(
        i % 3 == 2 ? kl__ledger_gen_transfer(fx.gen, fx.producer, fx.topic)
                   : kl__ledger_gen_publish(fx.gen, fx.producer, fx.topic),
        KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(fx.gen, fx.producer, fx.topic),
                       KL_OK);
  }
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(fx.gen, fx.store, fx.topic, &v),
                   KL_OK);
  assert_true(v.transfers > 0);
  assert_int_equal(v.total, v.total_expected);
  assert_true(v.total_ok);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(fx.gen) + v.transfers);
  kl_worker_stats_t ws;
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  if (!v.ok)
    fprintf(stderr,
            "verdict: published=%llu transfers=%llu violations=%llu "
            "duplicates=%llu (republished "
            "%llu) caught_up=%llu\n",
            (unsigned long long)ws.outbox_published,
            (unsigned long long)v.transfers, (unsigned long long)v.violations,
            (unsigned long long)v.duplicates,
            (unsigned long long)kl__ledger_gen_republished(fx.gen),
            (unsigned long long)v.caught_up);
  assert_true(v.ok);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, PARTS), 0);
  char name[32], uri[256];
  snprintf(name, sizeof(name), "ob%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(kl_t_pg_need(), name, uri, sizeof(uri)), 0);
  kl_store_t *copy = kl_t_ledger_fx_rebuild(&fx, uri, NULL, NULL);
  assert_int_equal(kl_t_outbox_held(copy, fx.topic, PARTS), 0);
  assert_int_equal(kl__ledger_gen_verify(fx.gen, copy, fx.topic, &v), KL_OK);
  assert_int_equal(v.total, v.total_expected);
  assert_int_equal(v.keys_bad, 0);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
}

static void test_bank_conserved_on_pg(void **state) {
  (void)state;
  kl_bank_pg("bank1", "worker.concurrency=1");
}

static void test_bank_conserved_on_pg_lanes(void **state) {
  (void)state;
  kl_bank_pg("bank4", "worker.concurrency=4");
}

/* A batch fenced at commit writes none of its follow-ups; a committed
 * one's are listed in commit order and removed once published. */
static void test_outbox_fenced_on_pg(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "fence");
  kl_partition_state_t st, newer;
  assert_int_equal(kl_store_acquire(fx.store, "t", 0, &st), KL_OK);
  kl_txn_t *a, *b;
  assert_int_equal(kl_store_begin(fx.store, "t", 0, st.epoch, &a), KL_OK);
  kl__txn_source(a, "t", 0, 0);
  assert_int_equal(kl_txn_emit(a, NULL, "k", 1, "credit", "x", 1), KL_OK);
  assert_int_equal(kl_txn_emit(a, NULL, "k", 1, "credit", "y", 1), KL_OK);
  assert_int_equal(kl_store_commit(a, 1), KL_OK);
  assert_int_equal(kl_store_begin(fx.store, "t", 0, st.epoch, &b), KL_OK);
  kl__txn_source(b, "t", 0, 1);
  assert_int_equal(kl_txn_emit(b, NULL, "k", 1, "credit", "z", 1), KL_OK);
  assert_int_equal(kl_store_acquire(fx.store, "t", 0, &newer), KL_OK);
  assert_int_equal(kl_store_commit(b, 2), KL_EFENCED);
  kl_seqs_t got = {0, {0}};
  assert_int_equal(
      kl__store_outbox_list(fx.store, "t", 0, 0, 8, kl_seqs_cb, &got), KL_OK);
  assert_int_equal(got.n, 2); /* a's two; nothing of b */
  assert_true(got.s[0] < got.s[1]);
  kl__outbox_ack_t acks[2] = {{0, got.s[0]}, {0, got.s[1]}};
  assert_int_equal(kl__store_outbox_del(fx.store, "t", acks, 2), KL_OK);
  got.n = 0;
  assert_int_equal(
      kl__store_outbox_list(fx.store, "t", 0, 0, 8, kl_seqs_cb, &got), KL_OK);
  assert_int_equal(got.n, 0);
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bank_conserved_on_pg),
      cmocka_unit_test(test_bank_conserved_on_pg_lanes),
      cmocka_unit_test(test_outbox_fenced_on_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
