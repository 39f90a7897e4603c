/*
 * The PostgreSQL store's owner cache and a batch's round trips, on a real,
 * throwaway server: ids prefetched and values cached answer from memory;
 * the cache is dropped on a fence, an epoch change, a revoke and a failed
 * commit, and bounded; a put over a key deleted behind the owner fails;
 * several partitions' commits in flight at once, each under its own fence;
 * a batch begun ahead (kl__store_begin_ahead()). The rest of the backend
 * is test_store_pg.c. One server for the suite, a fresh database per test.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/internal.h"
#include "keylane/store.h"
#include "support/pg_db.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "worker/apply.h"
#include "store/backend.h"
#include "store/store_internal.h"
#include "store/pg.h"

typedef kl_t_pg_db_t t_state_t;

static kl__cache_stats_t t_cache(kl_store_t *store) {
  kl__cache_stats_t stats;
  kl__store_cache_stats(store, &stats);
  return stats;
}

/* A batch's prefetched ids and the values its partition's owner read or
 * wrote before are answered from memory: with its connection gone, they
 * still answer; anything else needs the server. */
static void test_prefetch_and_cache_need_no_round_trip(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_put(txn, "acct/1", "100");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  assert_int_equal(t_cache(store).entries, 1); /* written through */

  txn = kl_t_store_begin(store, 0, epoch);
  const char *ids[] = {"id-1", "id-2"};
  kl_t_txn_prefetch(txn, ids, 2);
  kl_t_pg_terminate_others(st->admin);
  assert_int_equal(kl_t_txn_seen(txn, "id-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "id-2"), KL_MARK_NONE);
  assert_string_equal(kl_t_txn_get(txn, "acct/1"), "100");
  assert_int_equal(t_cache(store).hits, 1);
  kl_mark_t mark;
  assert_int_equal(kl_txn_seen(txn, "k", 1, "id-3", 4, &mark), KL_ESTORE_BUSY);
  const void *val;
  size_t len;
  assert_int_equal(kl_txn_get(txn, "acct/2", 6, &val, &len), KL_ESTORE_BUSY);
  assert_int_equal(kl_store_commit(txn, 2), KL_ESTORE_BUSY);
  /* A failed commit's outcome may be unknown: the partition is dropped. */
  assert_int_equal(t_cache(store).entries, 0);
  kl_store_destroy(store);
}

/* The case: a fenced owner whose cache kept its own write regains
 * the partition after another owner wrote, and must read that owner's
 * value. The fence itself drops the cache (defence in depth: the regain's
 * new epoch would too). */
static void test_fenced_owner_regains_and_sees_the_other_write(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *mine = kl_t_store_open(st->fx.where, NULL),
             *other = kl_t_store_open(st->fx.where, NULL);
  uint64_t e1 = kl_t_store_acquire(mine, 3);
  kl_txn_t *txn = kl_t_store_begin(mine, 3, e1);
  kl_t_txn_put(txn, "acct/7", "mine");
  kl_t_store_commit(txn, 1);
  txn = kl_t_store_begin(mine, 3, e1);
  assert_string_equal(kl_t_txn_get(txn, "acct/7"), "mine"); /* a hit */
  kl_t_store_commit(txn, 1);
  assert_int_equal(t_cache(mine).hits, 1);

  uint64_t e2 = kl_t_store_acquire(other, 3); /* a new owner writes */
  txn = kl_t_store_begin(other, 3, e2);
  assert_string_equal(kl_t_txn_get(txn, "acct/7"), "mine");
  kl_t_txn_put(txn, "acct/7", "other");
  kl_t_store_commit(txn, 2);

  kl__cache_stats_t before = t_cache(mine);
  assert_int_equal(before.entries, 1);
  assert_int_equal(kl_store_begin(mine, KL_T_TOPIC, 3, e1, &txn), KL_EFENCED);
  kl__cache_stats_t after = t_cache(mine);
  assert_int_equal(after.entries, 0);
  assert_int_equal(after.drops, before.drops + 1);

  /* Fenced at the commit instead of the begin: the same. */
  uint64_t e3 = kl_t_store_acquire(mine, 3);
  txn = kl_t_store_begin(mine, 3, e3);
  assert_string_equal(kl_t_txn_get(txn, "acct/7"), "other");
  kl_t_store_commit(txn, 3);
  txn = kl_t_store_begin(mine, 3, e3);
  assert_string_equal(kl_t_txn_get(txn, "acct/7"), "other"); /* cached */
  kl_t_txn_put(txn, "acct/7", "lost");
  uint64_t e4 = kl_t_store_acquire(other, 3);
  before = t_cache(mine);
  assert_int_equal(kl_store_commit(txn, 4), KL_EFENCED);
  assert_int_equal(t_cache(mine).entries, 0);
  assert_int_equal(t_cache(mine).drops, before.drops + 1);
  txn = kl_t_store_begin(other, 3, e4);
  kl_t_txn_put(txn, "acct/7", "other-2");
  kl_t_store_commit(txn, 5);

  txn = kl_t_store_begin(mine, 3, kl_t_store_acquire(mine, 3));
  assert_string_equal(kl_t_txn_get(txn, "acct/7"), "other-2");
  kl_store_abort(txn);
  kl_store_destroy(other);
  kl_store_destroy(mine);
}

/* A batch begun with another epoch than the cache holds (taken by another
 * handle, say replay's) reads afresh what the owners between wrote. */
static void test_cache_dropped_on_epoch_change(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *mine = kl_t_store_open(st->fx.where, NULL),
             *other = kl_t_store_open(st->fx.where, NULL);
  uint64_t e1 = kl_t_store_acquire(mine, 1);
  kl_txn_t *txn = kl_t_store_begin(mine, 1, e1);
  kl_t_txn_put(txn, "k", "1");
  kl_t_store_commit(txn, 1);
  uint64_t e2 = kl_t_store_acquire(other, 1);
  txn = kl_t_store_begin(other, 1, e2);
  kl_t_txn_put(txn, "k", "2");
  kl_t_store_commit(txn, 2);
  uint64_t e3 = kl_t_store_acquire(other, 1); /* for mine, elsewhere */
  txn = kl_t_store_begin(mine, 1, e3);
  assert_int_equal(t_cache(mine).entries, 0);
  assert_string_equal(kl_t_txn_get(txn, "k"), "2");
  kl_store_abort(txn);
  kl_store_destroy(other);
  kl_store_destroy(mine);
}

typedef struct t_cutter {
  PGconn *admin;
  int runs;
} t_cutter_t;

/* A handler that writes nothing and, at its first event, cuts every store
 * connection: what the batch still needs of the server after that fails. */
static kl_handler_result_t t_cut_handler(void *opaque, const kl_event_t *ev,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *why, size_t size) {
  (void)ev, (void)fence, (void)txn, (void)why, (void)size;
  t_cutter_t *cut = opaque;
  if (cut->runs++ == 0)
    kl_t_pg_terminate_others(cut->admin);
  return KL_HANDLER_OK;
}

/* A batch's ids are looked up before its handlers run, in one round trip
 * (kl__apply_batch(), as replay and redrive run it; the worker's group
 * transaction the same way): with the connection cut by the first event's
 * handler, the later events' seen still answers, so every handler runs
 * and only the commit fails. */
static void test_apply_prefetches_the_batch_ids(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  rd_kafka_message_t msgs[5], *ptrs[5];
  void *bufs[5];
  for (int i = 0; i < 5; i++) {
    char id[16];
    snprintf(id, sizeof(id), "event-%d", i);
    kl_event_t ev = {.key = "acct",
                     .key_len = 4,
                     .id = id,
                     .id_len = strlen(id),
                     .type = "t",
                     .type_len = 1,
                     .ts = 1,
                     .payload = "p",
                     .payload_len = 1};
    size_t len;
    assert_int_equal(kl_event_encode(&ev, &bufs[i], &len), KL_OK);
    msgs[i] = (rd_kafka_message_t){.partition = 0,
                                   .payload = bufs[i],
                                   .len = len,
                                   .key = "acct",
                                   .key_len = 4,
                                   .offset = i};
    ptrs[i] = &msgs[i];
  }
  t_cutter_t cut = {st->admin, 0};
  kl__applier_t applier = {.store = store,
                           .topic = KL_T_TOPIC,
                           .handler = t_cut_handler,
                           .handler_opaque = &cut,
                           .decoder = kl_decoder_new()};
  kl__apply_result_t res;
  assert_int_equal(kl__apply_batch(&applier, 0, epoch, 0, ptrs, 5, &res),
                   KL_ESTORE_BUSY);
  assert_int_equal(cut.runs, 5);
  assert_int_equal(res.verdict, KL_HANDLER_OK);
  kl_decoder_destroy(applier.decoder);
  for (int i = 0; i < 5; i++)
    free(bufs[i]);
  kl_store_destroy(store);
}

/* The worker's group commit of several lanes: each batch's pipeline is
 * sent on its own connection before any is read, and each keeps its own
 * fence and outcome: a fenced one and one whose handler SQL failed apply
 * nothing, the others commit and are written through to the cache. */
static void test_commit_many_each_under_its_own_fence(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, "store.pg.pool", "8", NULL);
  uint64_t e[4];
  kl_txn_t *txn[4];
  for (int32_t p = 0; p < 4; p++) {
    e[p] = kl_t_store_acquire(store, p);
    txn[p] = kl_t_store_begin(store, p, e[p]);
    char key[8], id[8];
    snprintf(key, sizeof(key), "k%d", (int)p);
    snprintf(id, sizeof(id), "id-%d", (int)p);
    kl_t_txn_put(txn[p], key, "v");
    kl_t_txn_mark(txn[p], id, KL_MARK_APPLIED);
  }
  PGresult *res = PQexec(kl_txn_pg_conn(txn[1]), "SELECT 1/0");
  PQclear(res);
  kl_t_store_acquire(store, 2); /* a new owner of partition 2 */
  kl__store_commit_t c[4] = {{txn[0], 5, KL_OK, ""},
                             {txn[1], 6, KL_OK, ""},
                             {txn[2], 7, KL_OK, ""},
                             {txn[3], 8, KL_OK, ""}};
  kl__store_commit_many(c, 4);
  assert_int_equal(c[0].err, KL_OK);
  assert_int_equal(c[1].err, KL_ESTORE);
  assert_non_null(strstr(c[1].why, "aborted by a failed statement"));
  assert_int_equal(c[2].err, KL_EFENCED);
  assert_non_null(strstr(c[2].why, "fenced partition=2"));
  assert_int_equal(c[3].err, KL_OK);
  int64_t want[4] = {5, 0, 0, 8};
  for (int32_t p = 0; p < 4; p++)
    assert_int_equal(kl_t_store_partition(store, p).watermark, want[p]);
  assert_int_equal(t_cache(store).entries, 2); /* k0 and k3 */
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_ids"), 2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_kv"), 2);
  kl_store_destroy(store);
}

typedef struct t_many {
  kl__store_commit_t c[2];
} t_many_t;

static void *t_commit_many(void *opaque) {
  kl__store_commit_many(((t_many_t *)opaque)->c, 2);
  return NULL;
}

/* The batches of kl__store_commit_many() are in flight at once: with the
 * first one's partition row locked by someone else, the second commits
 * all the same. */
static void test_commit_many_in_flight_at_once(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  t_many_t many;
  for (int32_t p = 0; p < 2; p++) {
    kl_txn_t *txn = kl_t_store_begin(store, p, kl_t_store_acquire(store, p));
    kl_t_txn_put(txn, p ? "b" : "a", "v");
    many.c[p] = (kl__store_commit_t){txn, 5 + p, KL_OK, ""};
  }
  kl_t_sql(st->admin, "BEGIN");
  kl_t_sql(st->admin,
           "SELECT epoch FROM keylane_partitions WHERE partition = 0 "
           "FOR UPDATE");
  pthread_t thread;
  pthread_create(&thread, NULL, t_commit_many, &many);
  long long second = 0;
  for (int i = 0; i < 100 && second != 6; i++) {
    kl_t_sleep_ms(50);
    PGconn *look = PQconnectdb(st->fx.where);
    second = kl_t_sql(look, "SELECT watermark FROM keylane_partitions WHERE "
                            "partition = 1");
    PQfinish(look);
  }
  kl_t_sql(st->admin, "ROLLBACK");
  pthread_join(thread, NULL);
  assert_int_equal(second, 6);
  assert_int_equal(many.c[0].err, KL_OK);
  assert_int_equal(many.c[1].err, KL_OK);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 5);
  kl_store_destroy(store);
}

/* A revoke (kl__store_forget()) drops the partition and frees it; other
 * partitions keep theirs. */
static void test_cache_dropped_on_revoke(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  for (int32_t p = 0; p < 2; p++) {
    kl_txn_t *txn = kl_t_store_begin(store, p, kl_t_store_acquire(store, p));
    kl_t_txn_put(txn, p ? "b" : "a", "v");
    kl_t_store_commit(txn, 1);
  }
  assert_int_equal(t_cache(store).entries, 2);
  kl__store_forget(store, KL_T_TOPIC, 0);
  assert_int_equal(t_cache(store).entries, 1);
  kl__store_forget(store, KL_T_TOPIC, 9); /* never begun: nothing */
  assert_int_equal(t_cache(store).entries, 1);
  kl_store_destroy(store);
}

/* store.cache.max bounds the bytes, least recently used out first; 0
 * turns the cache off. */
static void test_cache_bounded_lru(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store =
      kl_t_store_open(st->fx.where, "store.cache.max", "4096", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  char key[16], val[101];
  memset(val, 'v', 100);
  val[100] = '\0';
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  for (int i = 0; i < 100; i++) {
    snprintf(key, sizeof(key), "k%03d", i);
    kl_t_txn_put(txn, key, val);
  }
  kl_t_store_commit(txn, 1);
  kl__cache_stats_t stats = t_cache(store);
  assert_int_equal(stats.max_bytes, 4096);
  assert_true(stats.bytes <= 4096 && stats.entries > 0);
  assert_true(stats.evictions >= 100 - stats.entries);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_string_equal(kl_t_txn_get(txn, "k000"), val); /* from the server */
  assert_int_equal(t_cache(store).misses, stats.misses + 1);
  assert_string_equal(kl_t_txn_get(txn, "k000"), val); /* filled */
  assert_int_equal(t_cache(store).hits, stats.hits + 1);
  kl_store_abort(txn);
  kl_store_destroy(store);

  store = kl_t_store_open(st->fx.where, "store.cache.max", "0", NULL);
  txn = kl_t_store_begin(store, 0, kl_t_store_acquire(store, 0));
  assert_string_equal(kl_t_txn_get(txn, "k001"), val);
  assert_int_equal(t_cache(store).entries, 0);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* Handler SQL bypasses the cache: the batch reads what its SQL wrote, and
 * its commit drops the partition, since the SQL may have changed any
 * handler key. */
static void test_handler_sql_bypasses_the_cache(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_put(txn, "k", "1");
  kl_t_txn_put(txn, "j", "1");
  kl_t_store_commit(txn, 1);
  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_sql(kl_txn_pg_conn(txn),
           "UPDATE keylane_kv SET value = '\\x39' WHERE key = '\\x6b'");
  assert_string_equal(kl_t_txn_get(txn, "k"), "9");
  kl_t_store_commit(txn, 2);
  assert_int_equal(t_cache(store).entries, 0);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_string_equal(kl_t_txn_get(txn, "k"), "9");
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* A store whose partition 0 holds k = "1", committed by its owner, so
 * that the owner cache knows k is stored; with @p absent, k is only read,
 * so that the owner cache knows it is not. */
static kl_store_t *t_store_knowing_k(t_state_t *st, uint64_t *epoch,
                                     int absent) {
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  *epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, *epoch);
  if (absent)
    assert_null(kl_t_txn_get(txn, "k"));
  else
    kl_t_txn_put(txn, "k", "1");
  kl_t_store_commit(txn, 1);
  return store;
}

static kl_store_t *t_store_with_k(t_state_t *st, uint64_t *epoch) {
  return t_store_knowing_k(st, epoch, 0);
}

static long long t_k_is_2(t_state_t *st) {
  return kl_t_sql(st->admin, "SELECT count(*) FROM keylane_kv WHERE key = "
                             "'\\x6b' AND value = '\\x32'");
}

/* The owner's batch puts what it read plus one, first with the stale
 * cached "1" after @p behind (SQL of another writer) changed the row:
 * that commit fails and applies nothing rather than write over the other
 * writer; the failed commit dropped the cache, so the batch run again
 * reads the row afresh (@p fresh: NULL for a deleted row) and writes
 * @p last. */
static void t_put_over_a_stale_key(t_state_t *st, const char *behind,
                                   const char *fresh, const char *last) {
  uint64_t epoch;
  kl_store_t *store =
      t_store_knowing_k(st, &epoch, strncmp(behind, "INSERT", 6) == 0);
  kl_t_sql(st->admin, behind);
  for (int run = 0; run < 2; run++) {
    kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
    const char *was = kl_t_txn_get(txn, "k");
    kl_t_txn_put(txn, "k", run == 0 ? "2" : last);
    kl_t_txn_mark(txn, "e1", KL_MARK_APPLIED);
    if (run == 0) { /* the cache still says "1", or that k is absent */
      if (strncmp(behind, "INSERT", 6) == 0) {
        assert_null(was);
      } else {
        assert_non_null(was);
        assert_string_equal(was, "1");
      }
      assert_int_equal(kl_store_commit(txn, 2), KL_ESTORE_BUSY);
      assert_non_null(
          strstr(kl_err_detail(), "written since by another writer"));
      assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_ids"),
                       0);
    } else {
      if (fresh)
        assert_string_equal(was, fresh);
      else
        assert_null(was);
      kl_t_store_commit(txn, 2);
    }
  }
  char sql[128];
  snprintf(sql, sizeof(sql),
           "SELECT count(*) FROM keylane_kv WHERE key = '\\x6b' AND "
           "value = '\\x%02x'",
           (unsigned char)last[0]);
  assert_int_equal(kl_t_sql(st->admin, sql), 1);
  kl_store_destroy(store);
}

/* A put over a key the owner cache knows is stored is an UPDATE. Should
 * the key be gone (deleted outside the partition's fence), the commit
 * fails rather than lose the put. */
static void test_put_over_a_key_deleted_behind_the_owner(void **state) {
  kl_t_pg_need();
  t_put_over_a_stale_key(*state, "DELETE FROM keylane_kv WHERE key = '\\x6b'",
                         NULL, "2");
}

/* The owner cache trusts that its owner is the only writer of its keys;
 * when another writer changed one behind it (another topic's owner writing
 * the same key, issue 39), the put computed from the stale value fails at
 * the commit instead of overwriting the other writer's "5", and the batch
 * run again writes "6". */
static void test_put_over_a_key_changed_behind_the_owner(void **state) {
  kl_t_pg_need();
  t_put_over_a_stale_key(*state,
                         "UPDATE keylane_kv SET value = '\\x35' WHERE key = "
                         "'\\x6b'",
                         "5", "6");
}

/* The same for a key the owner cache knows is absent: its put is an
 * INSERT, and another writer's row written meanwhile ("5": another topic's
 * owner, whose first put of the key this owner read as absent) fails the
 * commit rather than being overwritten, found by the simulator's shared
 * row after a commit that failed; run again, the batch writes "6". */
static void test_put_over_a_key_written_behind_the_owner(void **state) {
  kl_t_pg_need();
  t_put_over_a_stale_key(*state,
                         "INSERT INTO keylane_kv (key, value) VALUES "
                         "('\\x6b', '\\x35')",
                         "5", "6");
}

/* Once the handler's own SQL ran, every put is an upsert: that SQL may
 * have deleted a row the cache knew. */
static void test_put_after_handler_sql_deleted_the_key(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  uint64_t epoch;
  kl_store_t *store = t_store_with_k(st, &epoch);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  assert_string_equal(kl_t_txn_get(txn, "k"), "1");
  kl_t_txn_put(txn, "k", "2"); /* the cache knows k: an update, so far */
  kl_t_sql(kl_txn_pg_conn(txn), "DELETE FROM keylane_kv WHERE key = '\\x6b'");
  kl_t_store_commit(txn, 2);
  assert_int_equal(t_k_is_2(st), 1);
  kl_store_destroy(store);
}

/* ---- begun ahead (kl__store_begin_ahead) ----------------------------- */

/* A store of at most @p pool connections, one of them idle, @p epoch its
 * partition 0's, with acct/1 = 100 and id-1 applied. */
static kl_store_t *t_store_ahead(t_state_t *st, const char *pool,
                                 uint64_t *epoch) {
  kl_store_t *store =
      kl_t_store_open(st->fx.where, "store.pg.pool", pool, NULL);
  *epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, *epoch);
  kl_t_txn_put(txn, "acct/1", "100");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  return store;
}

/* No session of the test's database is left in a transaction. */
static void t_assert_no_open_txn(t_state_t *st) {
  assert_int_equal(kl_t_sql(st->admin,
                            "SELECT count(*) FROM pg_stat_activity WHERE "
                            "datname = current_database() AND state LIKE "
                            "'idle in transaction%'"),
                   0);
}

static const char *const t_ids[] = {"id-1", "id-2"};
static const size_t t_id_lens[] = {4, 4};

/* BEGIN, the epoch and the lookup leave at once; settled, the txn is what
 * a begin and a prefetch make: the ids answered from memory, then a
 * commit. A txn used before it is settled settles first. */
static void test_begun_ahead_is_a_begin_and_a_prefetch(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  uint64_t epoch;
  kl_store_t *store = t_store_ahead(st, "2", &epoch);
  kl_txn_t *txn;
  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_OK);
  assert_true(kl__store_pending(txn));
  assert_int_equal(kl__store_settle(txn), KL_OK);
  assert_false(kl__store_pending(txn));
  assert_int_equal(kl_t_txn_seen(txn, "id-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "id-2"), KL_MARK_NONE);
  assert_int_equal(t_cache(store).id_queries, 0);
  assert_string_equal(kl_t_txn_get(txn, "acct/1"), "100");
  kl_t_txn_put(txn, "acct/1", "150");
  kl_t_txn_mark(txn, "id-2", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 2);

  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_OK);
  assert_int_equal(kl_t_txn_seen(txn, "id-2"), KL_MARK_APPLIED); /* settles */
  assert_false(kl__store_pending(txn));
  assert_string_equal(kl_t_txn_get(txn, "acct/1"), "150");
  assert_int_equal(t_cache(store).id_queries, 0);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* The ids a prefetch asks about count as unseen only once it answered: a
 * prefetch that failed (the link lost) leaves the txn failing, never
 * answering "unseen" for an id it could not look up. */
static void test_failed_prefetch_answers_nothing(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  uint64_t epoch;
  kl_store_t *store = t_store_ahead(st, "2", &epoch);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_pg_terminate_others(st->admin);
  assert_int_equal(kl__txn_prefetch_sids(txn, t_ids, t_id_lens, 2),
                   KL_ESTORE_BUSY);
  kl_mark_t mark = KL_MARK_NONE;
  assert_int_equal(kl_txn_seen(txn, "k", 1, "id-1", 4, &mark), KL_ESTORE_BUSY);
  assert_int_equal(kl_store_commit(txn, 2), KL_ESTORE_BUSY);
  kl_store_destroy(store);
}

/* The epoch check travels with it: settled under a newer owner it is
 * KL_EFENCED, and the owner cache is dropped, as a begin's would be. */
static void test_begun_ahead_is_fenced_when_settled(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  uint64_t epoch;
  kl_store_t *store = t_store_ahead(st, "1", &epoch),
             *other = kl_t_store_open(st->fx.where, NULL);
  kl_t_store_acquire(other, 0);
  kl_txn_t *txn;
  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_OK);
  assert_int_equal(t_cache(store).entries, 1);
  assert_int_equal(kl__store_settle(txn), KL_EFENCED);
  assert_int_equal(t_cache(store).entries, 0);
  /* Used anyway, it stays fenced: nothing can run or commit in it. */
  kl_mark_t mark;
  assert_int_equal(kl_txn_seen(txn, "k", 1, "id-2", 4, &mark), KL_EFENCED);
  assert_int_equal(kl_txn_put(txn, "acct/1", 6, "0", 1), KL_OK);
  assert_int_equal(kl_store_commit(txn, 9), KL_EFENCED);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 1);
  kl_store_destroy(other);
  kl_store_destroy(store);
}

/* Its session is idle in a transaction until it is settled, which the
 * server ends after store.pg.idle.timeout: one that waited longer than
 * half of that (or KL__STORE_AHEAD_MAX_MS) is no longer pending, and
 * settling it says so; aborted, it leaves nothing open. */
static void test_begun_ahead_goes_stale(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, "store.pg.pool", "2",
                                      "store.pg.idle.timeout", "400ms", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_t_store_commit(kl_t_store_begin(store, 0, epoch), 1);
  kl_txn_t *txn;
  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_OK);
  assert_true(kl__store_pending(txn));
  struct timespec pause = {0, 250 * 1000000L};
  nanosleep(&pause, NULL);
  assert_false(kl__store_pending(txn));
  assert_int_equal(kl__store_settle(txn), KL_ESTORE_BUSY);
  if (!strstr(kl_err_detail(), "begun ahead waited"))
    fail_msg("detail: %s", kl_err_detail());
  kl_store_abort(txn);
  t_assert_no_open_txn(st);
  kl_store_destroy(store);
}

/* It never connects or waits: without an idle pooled connection it says
 * so at once. Aborted unsettled, it gives its connection back with no
 * transaction left open on the server. */
static void test_begun_ahead_only_on_an_idle_connection(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  uint64_t epoch;
  kl_store_t *store = t_store_ahead(st, "1", &epoch);
  kl_txn_t *held = kl_t_store_begin(store, 0, epoch), *txn = NULL;
  int64_t t0 = kl__mono_ns();
  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_ESTORE_BUSY);
  assert_true(kl__mono_ns() - t0 < 1000000000LL);
  assert_null(txn);
  kl_store_abort(held);

  assert_int_equal(kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, t_ids,
                                         t_id_lens, 2, &txn),
                   KL_OK);
  kl_store_abort(txn);
  t0 = kl__mono_ns();
  txn = kl_t_store_begin(store, 0, epoch); /* the pool's one connection */
  assert_true(kl__mono_ns() - t0 < 1000000000LL);
  kl_store_abort(txn);
  t_assert_no_open_txn(st);
  kl_store_destroy(store);
}

#define T(name)                                                                \
  cmocka_unit_test_setup_teardown(name, kl_t_pg_db_setup, kl_t_pg_db_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_begun_ahead_is_a_begin_and_a_prefetch),
      T(test_begun_ahead_is_fenced_when_settled),
      T(test_begun_ahead_only_on_an_idle_connection),
      T(test_begun_ahead_goes_stale),
      T(test_failed_prefetch_answers_nothing),
      T(test_prefetch_and_cache_need_no_round_trip),
      T(test_fenced_owner_regains_and_sees_the_other_write),
      T(test_cache_dropped_on_epoch_change),
      T(test_cache_dropped_on_revoke),
      T(test_cache_bounded_lru),
      T(test_handler_sql_bypasses_the_cache),
      T(test_put_over_a_key_deleted_behind_the_owner),
      T(test_put_over_a_key_changed_behind_the_owner),
      T(test_put_over_a_key_written_behind_the_owner),
      T(test_put_after_handler_sql_deleted_the_key),
      T(test_apply_prefetches_the_batch_ids),
      T(test_commit_many_each_under_its_own_fence),
      T(test_commit_many_in_flight_at_once),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
