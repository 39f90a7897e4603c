/*
 * The PostgreSQL store on a real, throwaway server: the store contract
 * (support/store_contract.h: epochs, batches, idempotency keys, expiry,
 * scans), and what only this backend has: concurrent acquirers, a second
 * mark of an id, the handler's own SQL in the batch's transaction, the
 * schema migrations, a connection lost mid-batch and the pool. The owner
 * cache and a batch's round trips are test_store_pg_cache.c. One server
 * for the suite, a fresh database per test (support/pg_db.h). Skips,
 * saying why, when PostgreSQL is not installed.
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

/* ---- epochs ---------------------------------------------------------- */

typedef struct t_racer {
  kl_store_t *store;
  uint64_t epochs[50];
} t_racer_t;

static void *t_race_acquire(void *opaque) {
  t_racer_t *r = opaque;
  for (int i = 0; i < 50; i++) {
    kl_partition_state_t ps;
    if (kl_store_acquire(r->store, KL_T_TOPIC, 0, &ps) == KL_OK)
      r->epochs[i] = ps.epoch;
  }
  return NULL;
}

/* Epochs are an atomic increment: concurrent acquirers never share one. */
static void test_concurrent_acquires_get_distinct_epochs(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *a = kl_t_store_open(st->fx.where, NULL),
             *b = kl_t_store_open(st->fx.where, NULL);
  t_racer_t ra = {a, {0}}, rb = {b, {0}};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, t_race_acquire, &ra);
  pthread_create(&tb, NULL, t_race_acquire, &rb);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  char seen[101] = {0};
  for (int i = 0; i < 50; i++) {
    assert_in_range(ra.epochs[i], 1, 100);
    assert_in_range(rb.epochs[i], 1, 100);
    assert_int_equal(seen[ra.epochs[i]]++, 0);
    assert_int_equal(seen[rb.epochs[i]]++, 0);
  }
  assert_int_equal(kl_t_store_partition(a, 0).epoch, 100);
  kl_store_destroy(a);
  kl_store_destroy(b);
}

/* ---- batches --------------------------------------------------------- */

/* A second mark of an id ends applied: an applied record stands (LMDB
 * overwrites it), a dead letter gives way (a redrive applied it). */
static void test_second_mark_keeps_applied(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, uuid, KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "order-17-created", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);
  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, uuid, KL_MARK_DEAD_LETTER); /* the first record stands */
  kl_t_txn_mark(txn, "order-17-created", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 3);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "order-17-created"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2);
  /* The insert time is the server clock's. */
  assert_true(kl_t_sql(st->admin, "SELECT min(inserted_ms) FROM keylane_ids") >
              1600000000000LL);
  kl_store_destroy(store);
}

/* Ids the prefetch found absent are written by a plain insert, the others
 * by the upsert: both kinds in one batch keep the marks' rules. */
static void test_prefetched_ids_new_and_known(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "was-dead", KL_MARK_DEAD_LETTER);
  kl_t_txn_mark(txn, "was-applied", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  const char *ids[] = {"was-dead", "was-applied", "new-applied", "new-dead"};
  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_prefetch(txn, ids, 4);
  kl_t_txn_mark(txn, "was-dead", KL_MARK_APPLIED); /* a redrive applied it */
  kl_t_txn_mark(txn, "was-applied", KL_MARK_DEAD_LETTER); /* it stands */
  kl_t_txn_mark(txn, "new-applied", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "new-dead", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, "was-dead"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "was-applied"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "new-applied"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "new-dead"), KL_MARK_DEAD_LETTER);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* An id the prefetch found absent, recorded meanwhile by another
 * partition's batch (one id on two keys): the commit fails retriably,
 * says why, applies nothing, and the re-run finds the id a duplicate. */
static void test_prefetched_new_id_taken_meanwhile(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t e0 = kl_t_store_acquire(store, 0), e1 = kl_t_store_acquire(store, 1);
  const char *ids[] = {"shared-id", "own-id"};
  kl_txn_t *a = kl_t_store_begin(store, 0, e0),
           *b = kl_t_store_begin(store, 1, e1);
  kl_t_txn_prefetch(a, ids, 1);
  kl_t_txn_prefetch(b, ids, 2);
  assert_int_equal(kl_t_txn_seen(b, "shared-id"), KL_MARK_NONE);
  kl_t_txn_mark(a, "shared-id", KL_MARK_APPLIED);
  kl_t_txn_mark(b, "shared-id", KL_MARK_APPLIED);
  kl_t_txn_mark(b, "own-id", KL_MARK_APPLIED);
  kl_t_txn_put(b, "acct/1", "b");
  kl_t_store_commit(a, 1);
  assert_int_equal(kl_store_commit(b, 1), KL_ESTORE_BUSY);
  /* The server names the id, in hex: "shared-id". */
  assert_non_null(strstr(kl_err_detail(), "\\x7368617265642d6964"));
  assert_non_null(strstr(kl_err_detail(), "since the batch looked it up"));
  assert_int_equal(kl_t_store_partition(store, 1).watermark, 0);

  b = kl_t_store_begin(store, 1, e1);
  kl_t_txn_prefetch(b, ids, 2);
  assert_int_equal(kl_t_txn_seen(b, "shared-id"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(b, "own-id"), KL_MARK_NONE);
  const void *val;
  size_t len;
  assert_int_equal(kl_txn_get(b, "acct/1", 6, &val, &len), KL_ENOTFOUND);
  kl_store_abort(b);
  kl_store_destroy(store);
}

/* The article's point: the handler's own SQL commits with the fence or
 * not at all. (The rest of a fenced batch: the contract's
 * test_fenced_commit_applies_nothing.) */
static void test_fenced_commit_rolls_back_handler_sql(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t old = kl_t_store_acquire(store, 2);
  kl_txn_t *txn = kl_t_store_begin(store, 2, old);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_non_null(pg);
  kl_t_sql(pg, "INSERT INTO effects VALUES (1)");
  assert_int_equal(kl_t_sql(pg, "SELECT count(*) FROM effects"), 1);
  uint64_t now = kl_t_store_acquire(store, 2); /* a new owner takes over */
  assert_int_equal(kl_store_commit(txn, 50), KL_EFENCED);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 0);

  /* The same with the acquire committed between the fence's snapshot and
   * its commit, from another process's store. */
  kl_store_t *other = kl_t_store_open(st->fx.where, NULL);
  txn = kl_t_store_begin(store, 2, now);
  kl_t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (2)");
  assert_int_equal(kl_t_store_acquire(other, 2), now + 1);
  assert_int_equal(kl_store_commit(txn, 60), KL_EFENCED);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  kl_store_destroy(other);
  kl_store_destroy(store);
}

static void test_committed_handler_sql_is_visible(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (1)");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  kl_t_store_commit(txn, 1);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 1);
  kl_store_destroy(store);
}

/* One event's SQL undone, the batch's kept: what a worker running events
 * one after another in one batch transaction needs for a RETRY. */
static void test_savepoint_undoes_one_event(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  kl_t_sql(pg, "INSERT INTO effects VALUES (1)");
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_RELEASE), KL_OK);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  kl_t_sql(pg, "INSERT INTO effects VALUES (2)"); /* this event retries */
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_ROLLBACK), KL_OK);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  PQclear(PQexec(pg, "SELECT * FROM no_such_table")); /* this one fails */
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_ROLLBACK), KL_OK);
  kl_t_sql(pg, "INSERT INTO effects VALUES (3)");
  kl_t_store_commit(txn, 3);
  assert_int_equal(kl_t_sql(st->admin, "SELECT sum(n) FROM effects"), 4);
  kl_store_destroy(store);
  /* On an LMDB batch it does nothing. */
  char dir[64];
  kl_t_tmpdir(dir);
  store = kl_t_store_open(dir, NULL);
  epoch = kl_t_store_acquire(store, 0);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_handler_must_not_end_the_txn(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_sql(kl_txn_pg_conn(txn), "COMMIT");
  assert_int_equal(kl_store_commit(txn, 5), KL_ESTORE);
  assert_non_null(strstr(kl_err_detail(), "statements only"));
  /* A failed statement aborts the batch: nothing is committed. */
  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_put(txn, "k", "v");
  PQclear(PQexec(kl_txn_pg_conn(txn), "SELECT * FROM no_such_table"));
  assert_int_equal(kl_store_commit(txn, 6), KL_ESTORE);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 0);
  kl_store_destroy(store);
}

/* ---- idempotency keys ------------------------------------------------ */

typedef struct t_ids {
  char seen[4][64];
  int n;
} t_ids_t;

static int t_ids_cb(void *opaque, const char *topic, const void *key,
                    size_t key_len, const char *id, size_t id_len,
                    int64_t time_ms, kl_mark_t mark) {
  t_ids_t *t = opaque;
  (void)key, (void)key_len;
  snprintf(t->seen[t->n++], 64, "%s/%.*s@%lld/%d", topic, (int)id_len, id,
           (long long)time_ms, (int)mark);
  return t->n == 2; /* stops after two */
}

static void test_ids_walk(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "b", KL_MARK_DEAD_LETTER);
  kl_t_txn_mark(txn, "a", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "c", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  t_ids_t t = {0};
  assert_int_equal(kl__store_ids_walk(store, t_ids_cb, &t), KL_OK);
  assert_int_equal(t.n, 2);
  assert_string_equal(t.seen[0], KL_T_TOPIC "/a@1700000000000/1");
  assert_string_equal(t.seen[1], KL_T_TOPIC "/b@1700000000000/2");
  kl_store_destroy(store);
}

/* A host whose clock jumped ten years ahead. */
static int64_t t_host_clock_ahead(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + 3650LL * 86400000LL;
}

/* Ids are stamped and swept by the server's clock: a host whose clock
 * jumps forward neither sweeps the fleet's young ids nor stamps its own
 * far in the future. */
static void test_sweep_uses_the_server_clock(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store =
      kl_t_store_open(st->fx.where, "store.dedup.retention", "1h", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "young-1", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "young-2", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);
  kl__set_now_ms(t_host_clock_ahead);
  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "young-3", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 3);
  size_t removed = 99;
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  kl__set_now_ms(NULL);
  assert_int_equal(removed, 0);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 3);
  /* Every insert time is the server's now, not the jumped host's. */
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_ids WHERE "
                                       "abs(inserted_ms - extract(epoch FROM "
                                       "clock_timestamp()) * 1000) > 600000"),
                   0);
  kl_store_destroy(store);
}

/* Marks @p n ids "<prefix><i>" applied, 1000 a batch. */
static void t_mark_ids(kl_store_t *store, uint64_t epoch, const char *prefix,
                       int n) {
  for (int i = 0; i < n;) {
    kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
    for (int end = i + 1000; i < n && i < end; i++) {
      char id[64];
      snprintf(id, sizeof(id), "%s%05d", prefix, i);
      kl_t_txn_mark(txn, id, KL_MARK_APPLIED);
    }
    kl_t_store_commit(txn, i);
  }
}

/* The sweep walks keylane_ids' pages, so a commit writes one index entry
 * per id (the primary key's, id first), not a second one on insert times;
 * the position is the topic's: a second store of the topic's fleet goes on
 * where the first one stopped. A call removes at most max keys and stays on
 * pages that held more. */
static void test_sweep_walks_pages_from_the_topics_position(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *a =
      kl_t_store_open(st->fx.where, "store.dedup.retention", "1h", NULL);
  kl_store_t *b =
      kl_t_store_open(st->fx.where, "store.dedup.retention", "1h", NULL);
  kl_t_store_acquire(b, 1); /* another worker of the topic */
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_indexes "
                                       "WHERE tablename = 'keylane_ids'"),
                   1);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_indexes "
                                       "WHERE tablename = 'keylane_ids' AND "
                                       "indexdef LIKE '%(id, topic)'"),
                   1);
  uint64_t epoch = kl_t_store_acquire(a, 0);
  /* 36-byte ids, about 97 to a page: 10 pages hold under 1000. */
  t_mark_ids(a, epoch, "0190f3a2-5b7c-7d4e-8f01-2a3b4c5", 3000);
  kl_t_store_clock_add(3600 * 1000 + 1);
  t_mark_ids(a, epoch, "young-", 100);

  size_t removed_a = 0, removed_b = 0;
  assert_int_equal(kl_store_sweep(a, 1000, &removed_a), KL_OK);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT next_page FROM keylane_topic_sweeps"), 10);
  assert_int_equal(kl_store_sweep(b, 1000, &removed_b), KL_OK);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT next_page FROM keylane_topic_sweeps"), 20);
  assert_true(removed_a > 900 && removed_a < 1000);
  assert_true(removed_b > 900 && removed_b < 1000);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_ids "
                                       "WHERE ctid < '(20,0)'"),
                   0);
  size_t total = removed_a + removed_b, removed = 0;
  for (int calls = 0; total < 3000 && calls < 10; calls++) {
    assert_int_equal(kl_store_sweep(calls % 2 ? a : b, 1000, &removed), KL_OK);
    assert_true(removed <= 1000);
    total += removed;
  }
  assert_int_equal(total, 3000);
  uint64_t count = 0;
  assert_int_equal(kl_store_id_count(a, &count), KL_OK);
  assert_int_equal(count, 100);

  /* Short ids, about 150 to a page: a call of 100 removes 100 and stays
   * on its page; the next one takes the rest of it and moves on. */
  kl_t_store_clock_add(-(3600 * 1000 + 1));
  t_mark_ids(a, epoch, "s", 400);
  kl_t_store_clock_add(3600 * 1000 + 1);
  const char *fullest = "SELECT (ctid::text::point)[0]::int8 FROM keylane_ids "
                        "WHERE substr(id, 1, 1) = 's' GROUP BY 1 ORDER BY "
                        "count(*) DESC LIMIT 1";
  long long page = kl_t_sql(st->admin, fullest), on_page;
  char sql[256];
  snprintf(sql, sizeof(sql),
           "SELECT count(*) FROM keylane_ids WHERE substr(id, 1, 1) = 's' "
           "AND (ctid::text::point)[0] = %lld",
           page);
  on_page = kl_t_sql(st->admin, sql);
  assert_true(on_page > 100);
  snprintf(sql, sizeof(sql), "UPDATE keylane_topic_sweeps SET next_page = %lld",
           page);
  kl_t_sql(st->admin, sql);
  assert_int_equal(kl_store_sweep(a, 100, &removed), KL_OK);
  assert_int_equal(removed, 100);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT next_page FROM keylane_topic_sweeps"), page);
  assert_int_equal(kl_store_sweep(b, 100, &removed), KL_OK);
  assert_int_equal(removed, on_page - 100);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT next_page FROM keylane_topic_sweeps"),
      page + 1);
  /* Past the table's end the walk starts over at page 0. */
  kl_t_sql(st->admin, "UPDATE keylane_topic_sweeps SET next_page = 100000");
  assert_int_equal(kl_store_sweep(a, 100, &removed), KL_OK);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT next_page FROM keylane_topic_sweeps"), 1);
  kl_store_destroy(a);
  kl_store_destroy(b);
}

typedef struct t_sweeper {
  kl_store_t *store;
  size_t removed;
  kl_err_t err;
  atomic_int done;
} t_sweeper_t;

static void *t_sweep(void *opaque) {
  t_sweeper_t *sw = opaque;
  sw->err = kl_store_sweep(sw->store, 1000, &sw->removed);
  atomic_store(&sw->done, 1);
  return NULL;
}

/* A key a commit holds (here an open transaction's row lock) is left for
 * the next walk: the sweep neither waits for the commit nor can deadlock
 * with one. */
static void test_sweep_skips_keys_a_commit_holds(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_store_clock_set(1700000000000LL);
  t_sweeper_t sw = {.store = kl_t_store_open(
                        st->fx.where, "store.dedup.retention", "1h", NULL)};
  t_mark_ids(sw.store, kl_t_store_acquire(sw.store, 0), "held-", 10);
  kl_t_store_clock_add(3600 * 1000 + 1);
  kl_t_sql(st->admin, "BEGIN");
  kl_t_sql(st->admin, "SELECT 1 FROM keylane_ids WHERE id = 'held-00003' FOR "
                      "UPDATE");
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, t_sweep, &sw), 0);
  for (int i = 0; i < 50 && !atomic_load(&sw.done); i++)
    usleep(100 * 1000);
  int waited = !atomic_load(&sw.done);
  kl_t_sql(st->admin, "ROLLBACK");
  pthread_join(thread, NULL);
  assert_false(waited);
  assert_int_equal(sw.err, KL_OK);
  assert_int_equal(sw.removed, 9);
  size_t removed = 0; /* the next walk, from page 0 again */
  assert_int_equal(kl_store_sweep(sw.store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 1);
  kl_store_destroy(sw.store);
}

/* ---- schema ---------------------------------------------------------- */

static void test_open_creates_the_schema(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  assert_int_equal(kl_t_sql(st->admin, "SELECT max(version) FROM "
                                       "keylane_schema_version"),
                   KL__PG_SCHEMA_VERSION);
  kl_store_destroy(store);
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  assert_int_equal(from, KL__PG_SCHEMA_VERSION);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
}

/* store.create=no (read-only commands): a database without the schema is
 * KL_ENOTFOUND and stays without it. */
static void test_open_existing_creates_nothing(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "store.create", "no"), KL_OK);
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, conf, &store), KL_ENOTFOUND);
  assert_null(store);
  assert_non_null(strstr(kl_err_detail(), "holds no keylane store"));
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_tables WHERE "
                                       "tablename LIKE 'keylane%'"),
                   0);
  kl_store_destroy(kl_t_store_open(st->fx.where, NULL)); /* creates it */
  assert_int_equal(kl_store_open(st->fx.where, conf, &store), KL_OK);
  kl_store_destroy(store);
  kl_conf_destroy(conf);
}

static void test_newer_schema_is_refused(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_destroy(kl_t_store_open(st->fx.where, NULL));
  kl_t_sql(st->admin,
           "INSERT INTO keylane_schema_version (version) VALUES (99)");
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, NULL, &store),
                   KL_ESTORE_VERSION);
  assert_null(store);
  assert_non_null(strstr(kl_err_detail(), "version 99"));
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to),
                   KL_ESTORE_VERSION);
  assert_int_equal(from, 99);
}

/* Writes the schema an older keylane made, at @p version (1 or 2), with
 * that layout directly: idempotency keys unscoped, keyed by id alone. */
static void t_write_old_schema(PGconn *admin, int version) {
  kl_t_sql(admin,
           "CREATE TABLE keylane_schema_version ("
           "  version integer PRIMARY KEY,"
           "  applied_at timestamptz NOT NULL DEFAULT now());"
           "CREATE TABLE keylane_partitions ("
           "  topic text COLLATE \"C\" NOT NULL,"
           "  partition integer NOT NULL,"
           "  epoch bigint NOT NULL DEFAULT 0,"
           "  watermark bigint NOT NULL DEFAULT 0,"
           "  applied bigint NOT NULL DEFAULT 0,"
           "  duplicates bigint NOT NULL DEFAULT 0,"
           "  dead_letters bigint NOT NULL DEFAULT 0,"
           "  PRIMARY KEY (topic, partition));"
           "CREATE TABLE keylane_ids ("
           "  id bytea PRIMARY KEY,"
           "  mark smallint NOT NULL,"
           "  inserted_ms bigint NOT NULL);"
           "CREATE INDEX keylane_ids_inserted ON keylane_ids (inserted_ms);"
           "CREATE TABLE keylane_kv ("
           "  key bytea PRIMARY KEY,"
           "  value bytea NOT NULL);"
           "INSERT INTO keylane_schema_version (version) VALUES (1);");
  if (version < 2)
    return;
  kl_t_sql(admin, "CREATE TABLE keylane_inventory_outcomes ("
                  "  id bytea PRIMARY KEY,"
                  "  sku text NOT NULL,"
                  "  outcome text NOT NULL,"
                  "  partition integer NOT NULL,"
                  "  epoch bigint NOT NULL,"
                  "  event_offset bigint NOT NULL,"
                  "  recorded_at timestamptz NOT NULL DEFAULT now());"
                  "INSERT INTO keylane_schema_version (version) VALUES (2);");
}

/* The sids of a migrated store, read back through kl__store_ids_walk(). */
static int t_sids_cb(void *opaque, const char *topic, const void *key,
                     size_t key_len, const char *id, size_t id_len,
                     int64_t time_ms, kl_mark_t mark) {
  t_ids_t *t = opaque;
  (void)topic, (void)time_ms;
  if (t->n < 4)
    snprintf(t->seen[t->n], 64, "%.*s/%.*s/%d", (int)key_len,
             key ? (const char *)key : "", (int)id_len, id, (int)mark);
  t->n++;
  return 0;
}

static uint64_t t_id_queries(kl_store_t *store) {
  kl__cache_stats_t stats = {0};
  kl__store_cache_stats(store, &stats);
  return stats.id_queries;
}

#define T_SID_ROWS                                                             \
  "SELECT count(*) FROM keylane_ids WHERE substr(id, 1, 1) = '\\x00'::bytea"

/* Version 11 -> 12 stores a scoped id id first, so that a batch's new ids
 * land at the primary key's tail. A rolling upgrade keeps dedup exact: an
 * id an older worker recorded (as its sid, key first) still suppresses
 * its event's copy on a newer worker, and an older worker still running
 * after the migration cannot record an id the newer ones would not find:
 * its insert is refused. */
static void test_schema11_ids_stored_id_first(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark_key(txn, "acct-1", "e-1", KL_MARK_APPLIED);
  kl_t_txn_mark_key(txn, "acct-2", "e-1", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);
  kl_store_destroy(store);
  assert_int_equal(kl_t_sql(st->admin,
                            "SELECT count(*) FROM keylane_ids WHERE id = "
                            "convert_to('e-1', 'UTF8') || '\\x00'::bytea || "
                            "convert_to('acct-1', 'UTF8')"),
                   1);
  assert_int_equal(kl_t_sql(st->admin, T_SID_ROWS), 0);

  /* Back to schema 11, where an older worker records one more id as its
   * sid, beside an unscoped id of before schema 7. */
  kl_t_sql(st->admin, KL_T_PG_UNDO_12
           "DELETE FROM keylane_schema_version WHERE version = 12;"
           "INSERT INTO keylane_ids (topic, id, mark, inserted_ms) VALUES "
           "('" KL_T_TOPIC "', '\\x00'::bytea || int2send(6::int2) || "
           "convert_to('acct-3e-2', 'UTF8'), 1, 1), ('" KL_T_TOPIC
           "', 'old-1', 1, 1)");
  assert_int_equal(kl_t_sql(st->admin, T_SID_ROWS), 3);
  int from = 0, to = 0;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  assert_int_equal(from, 11);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  assert_int_equal(kl_t_sql(st->admin, T_SID_ROWS), 0);

  store = kl_t_store_open(st->fx.where, NULL);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "e-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", "e-1"),
                   KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-9", "e-1"), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen(txn, "old-1"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  /* The batch lookup reads them back as the sids it asked for. */
  txn = kl_t_store_begin(store, 0, epoch);
  const void *keys[] = {"acct-3", "acct-9"};
  const char *ids[] = {"e-2", "e-2"};
  size_t key_lens[] = {6, 6}, id_lens[] = {3, 3};
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, id_lens, 2),
                   KL_OK);
  uint64_t asked = t_id_queries(store);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-3", "e-2"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-9", "e-2"), KL_MARK_NONE);
  assert_int_equal(t_id_queries(store), asked);
  kl_store_abort(txn);
  t_ids_t t = {0};
  assert_int_equal(kl__store_ids_walk(store, t_sids_cb, &t), KL_OK);
  assert_int_equal(t.n, 4);
  assert_string_equal(t.seen[0], "acct-1/e-1/1");
  assert_string_equal(t.seen[1], "acct-2/e-1/2");
  assert_string_equal(t.seen[2], "acct-3/e-2/1");
  assert_string_equal(t.seen[3], "/old-1/1");
  kl_store_destroy(store);

  /* An older worker still running: its sid is refused, by name. */
  PGresult *res =
      PQexec(st->admin, "INSERT INTO keylane_ids (topic, id, mark, "
                        "inserted_ms) VALUES ('" KL_T_TOPIC "', '\\x00'::bytea "
                        "|| int2send(6::int2) || convert_to('acct-4e-3', "
                        "'UTF8'), 1, 1)");
  assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
  assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "23514");
  assert_non_null(
      strstr(PQresultErrorMessage(res), "keylane_ids_stored_id_first"));
  PQclear(res);
}

/* Version 2 -> 3 scopes ids by topic: an id of the older schema still
 * suppresses its event's duplicates, on each topic the store knew; new
 * ids are scoped. */
static void test_schema2_ids_are_migrated(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_write_old_schema(st->admin, 2);
  kl_t_sql(st->admin,
           "INSERT INTO keylane_partitions (topic, partition, epoch, "
           "watermark) VALUES ('" KL_T_TOPIC "', 0, 1, 10), "
           "('payments', 0, 1, 5);"
           "INSERT INTO keylane_ids VALUES ('old-1', 1, 1700000000000),"
           " ('dead-1', 2, 1700000000000)");
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, NULL, &store),
                   KL_ESTORE_VERSION);
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  assert_int_equal(from, 2);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  store = kl_t_store_open(st->fx.where, NULL);
  int version = 0, latest = 0;
  assert_int_equal(kl__store_version(store, &version, &latest), KL_OK);
  assert_int_equal(version, KL__PG_SCHEMA_VERSION);
  assert_int_equal(latest, KL__PG_SCHEMA_VERSION);

  /* Ids kept before they were scoped by entity key still suppress their
   * events' copies, whatever the key, until the retention has passed since
   * the newest of them (schema 7); then only the unscoped lookup finds
   * them. */
  kl_t_store_clock_set(1700000000000LL + 3600 * 1000);
  kl_txn_t *txn = kl_t_store_begin(store, 0, 1);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "old-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "dead-1"),
                   KL_MARK_DEAD_LETTER);
  const void *keys[] = {"acct-2"};
  const char *ids[] = {"old-1"};
  size_t key_lens[] = {6}, id_lens[] = {5};
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, id_lens, 1),
                   KL_OK);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", "old-1"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  kl_t_store_clock_add(8LL * 24 * 3600 * 1000);
  txn = kl_t_store_begin(store, 0, 1);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "old-1"), KL_MARK_NONE);
  kl_store_abort(txn);
  kl__store_set_clock(NULL);

  txn = kl_t_store_begin(store, 0, 1);
  assert_int_equal(kl_t_txn_seen(txn, "old-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "dead-1"), KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, "new-1"), KL_MARK_NONE);
  kl_t_txn_mark(txn, "new-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 11);
  assert_int_equal(kl_store_begin(store, "payments", 0, 1, &txn), KL_OK);
  assert_int_equal(kl_t_txn_seen(txn, "old-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "new-1"), KL_MARK_NONE); /* scoped */
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2 * 2 + 1);
  /* The migrated ids (of 2023) are past the retention: the page walk of
   * version 6 finds them without the index it dropped, each topic's by
   * that topic's sweep (version 10), in turn. */
  kl_partition_state_t ps;
  kl_t_store_acquire(store, 1);
  assert_int_equal(kl_store_acquire(store, "payments", 1, &ps), KL_OK);
  size_t removed = 0;
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 2);
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 2);
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 1);
  kl_store_destroy(store);
}

static void test_older_schema_needs_store_migrate(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_write_old_schema(st->admin, 1); /* as a database an older keylane made */
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, NULL, &store),
                   KL_ESTORE_VERSION);
  assert_non_null(strstr(kl_err_detail(), "keylane store migrate"));
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  assert_int_equal(from, 1);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  store = kl_t_store_open(st->fx.where, NULL);
  kl_store_destroy(store);
}

/* Runs `keylane store migrate --store URI`; returns its exit status and
 * its first line of output. */
static int t_cli_migrate(const char *uri, char *line, size_t size) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "'%s' store migrate --store '%s' 2>&1", kl_t_bin(),
           uri);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  line[0] = '\0';
  if (!fgets(line, (int)size, p))
    line[0] = '\0';
  char rest[256];
  while (fgets(rest, sizeof(rest), p))
    ;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_cli_store_migrate(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  char line[512];
  assert_int_equal(t_cli_migrate(st->fx.where, line, sizeof(line)), 0);
  char want[64];
  snprintf(want, sizeof(want), "schema version 0 -> %d", KL__PG_SCHEMA_VERSION);
  assert_non_null(strstr(line, want));
  assert_int_equal(t_cli_migrate(st->fx.where, line, sizeof(line)), 0);
  assert_non_null(strstr(line, "nothing to do"));
  kl_t_sql(st->admin,
           "INSERT INTO keylane_schema_version (version) VALUES (99)");
  assert_int_equal(t_cli_migrate(st->fx.where, line, sizeof(line)), 1);
  assert_non_null(strstr(line, "newer than this build"));
}

static void test_unreachable_server(void **state) {
  kl_t_pg_need();
  kl_store_t *store = NULL;
  kl_err_t err = kl_store_open("postgresql://keylane@127.0.0.1:1/none"
                               "?connect_timeout=2",
                               NULL, &store);
  assert_int_equal(err, KL_ESTORE);
  assert_non_null(strstr(kl_err_detail(), "cannot connect"));
}

/* ---- connections ----------------------------------------------------- */

/* Ends a backend from outside, as an operator or a failover would. */
static void t_terminate(PGconn *admin, PGconn *victim) {
  char sql[96];
  snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)::int",
           PQbackendPID(victim));
  assert_int_equal(kl_t_sql(admin, sql), 1);
}

/* A lost connection mid-batch: retriable, nothing applied, and the next
 * begin reconnects. */
static void test_connection_lost_mid_batch(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  PGconn *pg = kl_txn_pg_conn(txn);
  kl_t_sql(pg, "INSERT INTO effects VALUES (1)");
  kl_t_txn_put(txn, "acct/1", "5");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  t_terminate(st->admin, pg);
  kl_err_t err = kl_store_commit(txn, 10);
  assert_int_equal(err, KL_ESTORE_BUSY);
  assert_true(kl_err_is_retriable(err));

  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 0);
  txn = kl_t_store_begin(store, 0, epoch); /* a new connection */
  assert_int_equal(kl_t_txn_seen(txn, "id-1"), KL_MARK_NONE);
  assert_null(kl_t_txn_get(txn, "acct/1"));
  /* The re-run applies once. */
  kl_t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (1)");
  kl_t_txn_put(txn, "acct/1", "5");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 10);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM effects"), 1);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 10);

  /* Idle pooled connections lost to a server-side kill are replaced. */
  kl_t_pg_terminate_others(st->admin);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 10);
  txn = kl_t_store_begin(store, 0, epoch);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* A lost link during a handler's read: the call fails retriably. */
static void test_connection_lost_during_get(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  t_terminate(st->admin, kl_txn_pg_conn(txn));
  const void *val;
  size_t len;
  assert_int_equal(kl_txn_get(txn, "k", 1, &val, &len), KL_ESTORE_BUSY);
  kl_mark_t mark;
  assert_int_equal(kl_txn_seen(txn, "k", 1, "i", 1, &mark), KL_ESTORE_BUSY);
  assert_int_equal(kl_store_commit(txn, 1), KL_ESTORE_BUSY);
  kl_t_store_commit(kl_t_store_begin(store, 0, epoch), 1);
  kl_store_destroy(store);
}

typedef struct t_holder {
  kl_store_t *store;
  uint64_t epoch;
  int64_t begun_ns;
} t_holder_t;

static void *t_second_batch(void *opaque) {
  t_holder_t *h = opaque;
  kl_txn_t *txn = NULL;
  if (kl_store_begin(h->store, KL_T_TOPIC, 0, h->epoch, &txn) == KL_OK) {
    h->begun_ns = kl__mono_ns();
    kl_store_commit(txn, 2);
  }
  return NULL;
}

/* The pool's bound: with one connection a second batch waits for the
 * first to end. */
static void test_pool_bound(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = kl_t_store_open(st->fx.where, "store.pg.pool", "1", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  t_holder_t h = {store, epoch, 0};
  pthread_t th;
  pthread_create(&th, NULL, t_second_batch, &h);
  struct timespec pause = {0, 300 * 1000000L};
  nanosleep(&pause, NULL);
  assert_int_equal(h.begun_ns, 0);
  int64_t ended = kl__mono_ns();
  kl_t_store_commit(txn, 1);
  pthread_join(th, NULL);
  assert_true(h.begun_ns >= ended);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_stat_activity "
                                       "WHERE datname = current_database()"),
                   2); /* the store's one, and the test's */
  kl_store_destroy(store);
}

/* A paused owner's handler SQL holds row locks; the server ends its idle
 * transaction after store.pg.idle.timeout, so the new owner's handler
 * waits that long at most, and the zombie applies nothing. */
static void test_paused_owner_row_locks_end_with_idle_timeout(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "CREATE TABLE stock (sku text PRIMARY KEY, qty int)");
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('s', 10)");
  kl_store_t *zombie =
      kl_t_store_open(st->fx.where, "store.pg.idle.timeout", "1s", NULL);
  kl_store_t *owner = kl_t_store_open(st->fx.where, NULL);
  uint64_t old = kl_t_store_acquire(zombie, 0);
  kl_txn_t *ztxn = kl_t_store_begin(zombie, 0, old);
  kl_t_sql(kl_txn_pg_conn(ztxn),
           "UPDATE stock SET qty = qty - 1 WHERE sku = 's'");
  kl_t_txn_mark(ztxn, "z-1", KL_MARK_APPLIED);
  /* ... and the zombie pauses here. */
  uint64_t now = kl_t_store_acquire(owner, 0); /* not blocked by the zombie */
  kl_txn_t *txn = kl_t_store_begin(owner, 0, now);
  int64_t t0 = kl__mono_ns();
  kl_t_sql(kl_txn_pg_conn(txn),
           "UPDATE stock SET qty = qty - 1 WHERE sku = 's'");
  int64_t waited_ms = (kl__mono_ns() - t0) / 1000000;
  assert_true(waited_ms >= 500 && waited_ms < 10000);
  kl_t_txn_mark(txn, "o-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  /* The zombie wakes: its connection is gone, then it is fenced. */
  kl_err_t err = kl_store_commit(ztxn, 1);
  assert_true(err == KL_ESTORE_BUSY || err == KL_EFENCED);
  kl_txn_t *stale = NULL;
  assert_int_equal(kl_store_begin(zombie, KL_T_TOPIC, 0, old, &stale),
                   KL_EFENCED);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock"), 9);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM keylane_ids"), 1);
  kl_store_destroy(zombie);
  kl_store_destroy(owner);
}

static void test_lmdb_has_no_pg_conn(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store = kl_t_store_open(dir, NULL);
  kl_txn_t *txn = kl_t_store_begin(store, 0, kl_t_store_acquire(store, 0));
  assert_null(kl_txn_pg_conn(txn));
  kl_store_abort(txn);
  kl_store_destroy(store);
  assert_null(kl_txn_pg_conn(NULL));
  kl_t_rmrf(dir);
}

#define T(name)                                                                \
  cmocka_unit_test_setup_teardown(name, kl_t_pg_db_setup, kl_t_pg_db_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      KL_T_STORE_CONTRACT_TESTS(kl_t_pg_db_setup,
                                kl_t_pg_db_teardown) /* then our own: */
      T(test_concurrent_acquires_get_distinct_epochs),
      T(test_second_mark_keeps_applied),
      T(test_prefetched_ids_new_and_known),
      T(test_prefetched_new_id_taken_meanwhile),
      T(test_fenced_commit_rolls_back_handler_sql),
      T(test_committed_handler_sql_is_visible),
      T(test_savepoint_undoes_one_event),
      T(test_handler_must_not_end_the_txn),
      T(test_ids_walk),
      T(test_sweep_uses_the_server_clock),
      T(test_sweep_walks_pages_from_the_topics_position),
      T(test_sweep_skips_keys_a_commit_holds),
      T(test_open_creates_the_schema),
      T(test_open_existing_creates_nothing),
      T(test_newer_schema_is_refused),
      T(test_older_schema_needs_store_migrate),
      T(test_schema2_ids_are_migrated),
      T(test_schema11_ids_stored_id_first),
      T(test_cli_store_migrate),
      T(test_unreachable_server),
      T(test_connection_lost_mid_batch),
      T(test_connection_lost_during_get),
      T(test_pool_bound),
      T(test_paused_owner_row_locks_end_with_idle_timeout),
      cmocka_unit_test(test_lmdb_has_no_pg_conn),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
