/*
 * The outbox publisher while its PostgreSQL server is down: it calls the
 * store once a second, not at every tick for every partition (each call a
 * connection attempt and a warning), and loses nothing: a removal that
 * failed is made with the same acks once the server is back, and the
 * records committed before the outage are published and removed. The
 * store calls are counted by wrapping the store's outbox operations. On
 * the embedded cluster, with a server of its own (one the test stops).
 * Skips, saying why, when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/cluster.h"
#include "support/pg_group.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "worker/outbox.h"
#include "store/backend.h"
#include "store/store_internal.h"

#define NREC 3

/* ---- the store's outbox operations, counted ------------------------- */

static struct {
  const kl__store_ops_t *real;
  kl__store_ops_t ops;
  int lists, dels;
  int refuse_dels; /* removals fail as a lost link would */
  kl__outbox_ack_t last[NREC];
  size_t nlast;
} t_calls;

static kl_err_t t_list(kl_store_t *store, const char *topic, int32_t partition,
                       uint64_t after, size_t max, kl__outbox_cb_t *cb,
                       void *opaque) {
  t_calls.lists++;
  return t_calls.real->outbox_list(store, topic, partition, after, max, cb,
                                   opaque);
}

static kl_err_t t_del(kl_store_t *store, const char *topic,
                      const kl__outbox_ack_t *acks, size_t n) {
  t_calls.dels++;
  t_calls.nlast = n < NREC ? n : NREC;
  memcpy(t_calls.last, acks, t_calls.nlast * sizeof(*acks));
  if (t_calls.refuse_dels)
    return kl__err(KL_ESTORE_BUSY, "test: the removal is refused");
  return t_calls.real->outbox_del(store, topic, acks, n);
}

static void t_count_calls(kl_store_t *store) {
  memset(&t_calls, 0, sizeof(t_calls));
  t_calls.real = store->ops;
  t_calls.ops = *store->ops;
  t_calls.ops.outbox_list = t_list;
  t_calls.ops.outbox_del = t_del;
  store->ops = &t_calls.ops;
}

/* ---- the fixture ------------------------------------------------------ */

typedef struct t_fx {
  kl_t_cluster_t *cluster;
  const char *topic;
  kl_store_t *store;
  kl__outbox_t *ob;
  uint64_t seqs[NREC]; /* the outbox's records, committed before */
} t_fx_t;

static int t_seq_cb(void *opaque, uint64_t seq, const void *rec, size_t len) {
  (void)rec, (void)len;
  t_fx_t *fx = opaque;
  for (int i = 0; i < NREC; i++)
    if (!fx->seqs[i]) {
      fx->seqs[i] = seq;
      break;
    }
  return 0;
}

/* How many records partition 0's outbox holds in the store. */
static size_t t_stored(t_fx_t *fx) {
  size_t n = 0;
  memset(fx->seqs, 0, sizeof(fx->seqs));
  assert_int_equal(
      t_calls.real->outbox_list(fx->store, fx->topic, 0, 0, 100, t_seq_cb, fx),
      KL_OK);
  for (int i = 0; i < NREC; i++)
    n += fx->seqs[i] != 0;
  return n;
}

/* A store on a database of its own whose partition 0 committed NREC
 * follow-ups, its outbox calls counted, and an outbox publisher owning
 * partition 0 that publishes to the embedded cluster. */
static void t_fx_up(t_fx_t *fx, const char *db) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, db, uri, sizeof(uri)), 0);
  assert_int_equal(kl_t_cluster_new(1, db, 1, &fx->cluster), KL_OK);
  fx->topic = kl_t_topic(fx->cluster);
  fx->store = kl_t_store_open(uri, NULL);
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(fx->store, fx->topic, 0, &st), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(fx->store, fx->topic, 0, st.epoch, &txn),
                   KL_OK);
  kl__txn_source(txn, fx->topic, 0, 0);
  for (int i = 0; i < NREC; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "credit", "p", 1), KL_OK);
  kl__txn_source(txn, NULL, 0, 0);
  assert_int_equal(kl_store_commit(txn, 1), KL_OK);
  t_count_calls(fx->store);
  assert_int_equal(t_stored(fx), NREC);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)),
      KL_OK);
  assert_int_equal(kl__outbox_new(conf, fx->topic, fx->store, NULL, &fx->ob),
                   KL_OK);
  kl_conf_destroy(conf);
  kl__outbox_own(fx->ob, 0, 1);
}

static void t_fx_down(t_fx_t *fx) {
  kl__outbox_destroy(fx->ob, 5000);
  fx->store->ops = t_calls.real;
  kl_store_destroy(fx->store);
  kl_t_cluster_destroy(fx->cluster);
}

/* Ticks as the worker's poll loop does (every 5 ms) for @p ms. */
static void t_tick_for(t_fx_t *fx, int ms) {
  int64_t end = kl__mono_ns() + (int64_t)ms * 1000000;
  while (kl__mono_ns() < end) {
    kl__outbox_tick(fx->ob);
    kl_t_sleep_ms(5);
  }
}

/* Ticks until the outbox holds @p pending records and published
 * @p published, for 30 s at most. */
static void t_tick_until(t_fx_t *fx, uint64_t pending, uint64_t published) {
  kl__outbox_stats_t st = {0};
  int64_t end = kl__mono_ns() + 30000000000LL;
  while (kl__mono_ns() < end) {
    kl__outbox_tick(fx->ob);
    kl__outbox_stats(fx->ob, &st);
    if (st.pending == pending && st.published == published)
      return;
    kl_t_sleep_ms(5);
  }
  fail_msg("the outbox holds %llu and published %llu, not %llu and %llu",
           (unsigned long long)st.pending, (unsigned long long)st.published,
           (unsigned long long)pending, (unsigned long long)published);
}

/* The records it found no way to list are listed, published and removed
 * once the server is back. The old outbox read the store at every tick:
 * about 300 attempts in 1.5 s. */
static void test_listing_backs_off_while_the_server_is_down(void **state) {
  (void)state;
  t_fx_t fx;
  t_fx_up(&fx, "ob_list");
  kl_t_pg_halt(kl_t_pg_group());
  t_tick_for(&fx, 1500);
  fprintf(stderr, "server down 1.5 s: %d reads of the outbox\n", t_calls.lists);
  /* Asserted with the server back, for the next test. */
  int lists = t_calls.lists;
  assert_int_equal(kl_t_pg_resume(kl_t_pg_group()), 0);
  assert_true(lists >= 1 && lists <= 3);
  t_tick_until(&fx, 0, NREC);
  assert_int_equal(t_stored(&fx), 0);
  t_fx_down(&fx);
}

/* Published records whose removal fails stay held, are not published
 * again, and are removed with the same acks once the server is back. */
static void test_removal_backs_off_while_the_server_is_down(void **state) {
  (void)state;
  t_fx_t fx;
  t_fx_up(&fx, "ob_del");
  uint64_t seqs[NREC];
  memcpy(seqs, fx.seqs, sizeof(seqs));
  t_calls.refuse_dels = 1;
  t_tick_until(&fx, NREC, NREC); /* published, acknowledged, held */
  assert_true(t_calls.dels >= 1);
  kl_t_pg_halt(kl_t_pg_group());
  t_calls.refuse_dels = 0;
  t_calls.dels = t_calls.lists = 0;
  t_tick_for(&fx, 1500);
  fprintf(stderr, "server down 1.5 s: %d removals of the outbox\n",
          t_calls.dels);
  int dels = t_calls.dels, lists = t_calls.lists;
  kl__outbox_stats_t st;
  kl__outbox_stats(fx.ob, &st);
  assert_int_equal(kl_t_pg_resume(kl_t_pg_group()), 0);
  assert_true(dels >= 1 && dels <= 3);
  assert_int_equal(lists, 0);
  assert_int_equal(st.pending, NREC);
  assert_int_equal(st.published, NREC);
  t_tick_until(&fx, 0, NREC);
  assert_int_equal(t_calls.nlast, NREC);
  for (int i = 0; i < NREC; i++) { /* the same acks, in any order */
    int found = 0;
    for (int j = 0; j < NREC; j++)
      found += t_calls.last[j].partition == 0 && t_calls.last[j].seq == seqs[i];
    assert_int_equal(found, 1);
  }
  assert_int_equal(t_stored(&fx), 0);
  t_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_listing_backs_off_while_the_server_is_down),
      cmocka_unit_test(test_removal_backs_off_while_the_server_is_down),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup_restartable,
                                kl_t_pg_group_teardown);
}
