/*
 * The PostgreSQL store on a real, throwaway server: the store contract as
 * the LMDB tests check it (epochs, batches, idempotency keys, expiry,
 * scans), and what only this backend has: the handler's own SQL in the
 * batch's transaction, the schema migrations, a connection lost mid-batch
 * and the pool. One server for the suite, a fresh database per test.
 * Skips, saying why, when PostgreSQL is not installed.
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
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "keylane/store.h"
#include "support/pg_group.h"
#include "support/support.h"
#include "worker/store_backend.h"
#include "worker/store_internal.h"
#include "worker/store_pg.h"

#define TOPIC "orders"

static int t_db_seq;

typedef struct t_state {
  char uri[256];
  PGconn *admin; /* a connection of the test's own, to the test's db */
} t_state_t;

/* ---- fixtures -------------------------------------------------------- */

static int t_setup(void **state) {
  if (!kl_t_pg_group())
    return 0;
  t_state_t *st = calloc(1, sizeof(*st));
  char name[32];
  snprintf(name, sizeof(name), "t%d", ++t_db_seq);
  if (kl_t_pg_createdb(kl_t_pg_group(), name, st->uri, sizeof(st->uri)))
    return -1;
  st->admin = PQconnectdb(st->uri);
  if (PQstatus(st->admin) != CONNECTION_OK)
    return -1;
  *state = st;
  return 0;
}

static int t_teardown(void **state) {
  t_state_t *st = *state;
  kl__store_set_clock(NULL);
  if (st) {
    PQfinish(st->admin);
    free(st);
  }
  return 0;
}

/* Opens the store with "key", "value", ... NULL settings. */
static kl_err_t t_try_open_v(const char *uri, kl_store_t **store, va_list ap) {
  kl_conf_t *conf = kl_conf_new();
  const char *key;
  while ((key = va_arg(ap, const char *)) != NULL) {
    const char *value = va_arg(ap, const char *);
    if (kl_conf_set(conf, key, value, NULL, 0) != KL_OK) {
      kl_conf_destroy(conf);
      return KL_ECONF;
    }
  }
  kl_err_t err = kl_store_open(uri, conf, store);
  kl_conf_destroy(conf);
  return err;
}

static kl_store_t *t_open(const char *uri, ...) {
  kl_store_t *store = NULL;
  va_list ap;
  va_start(ap, uri);
  kl_err_t err = t_try_open_v(uri, &store, ap);
  va_end(ap);
  if (err)
    fail_msg("open: %s: %s", kl_err_name(err), kl_err_detail());
  return store;
}

static uint64_t t_acquire(kl_store_t *store, int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, TOPIC, partition, &ps), KL_OK);
  return ps.epoch;
}

static kl_partition_state_t t_part(kl_store_t *store, int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(store, TOPIC, partition, &ps), KL_OK);
  return ps;
}

static kl_txn_t *t_begin(kl_store_t *store, int32_t partition, uint64_t epoch) {
  kl_txn_t *txn = NULL;
  kl_err_t err = kl_store_begin(store, TOPIC, partition, epoch, &txn);
  if (err)
    fail_msg("begin: %s: %s", kl_err_name(err), kl_err_detail());
  return txn;
}

static void t_commit(kl_txn_t *txn, int64_t watermark) {
  kl_err_t err = kl_store_commit(txn, watermark);
  if (err)
    fail_msg("commit: %s: %s", kl_err_name(err), kl_err_detail());
}

static void t_put(kl_txn_t *txn, const char *key, const char *val) {
  assert_int_equal(kl_txn_put(txn, key, strlen(key), val, strlen(val)), KL_OK);
}

static const char *t_get(kl_txn_t *txn, const char *key) {
  static char buf[256];
  const void *val;
  size_t len;
  kl_err_t err = kl_txn_get(txn, key, strlen(key), &val, &len);
  if (err == KL_ENOTFOUND)
    return NULL;
  assert_int_equal(err, KL_OK);
  assert_true(len < sizeof(buf));
  memcpy(buf, val, len);
  buf[len] = '\0';
  return buf;
}

static kl_mark_t t_seen(kl_txn_t *txn, const char *id) {
  kl_mark_t mark = (kl_mark_t)-1;
  assert_int_equal(kl_txn_seen(txn, id, strlen(id), &mark), KL_OK);
  return mark;
}

static void t_mark(kl_txn_t *txn, const char *id, kl_mark_t mark) {
  assert_int_equal(kl_txn_mark(txn, id, strlen(id), mark), KL_OK);
}

/* Runs SQL on @p pg and returns the first value as a number (0 if none). */
static long long t_sql(PGconn *pg, const char *sql) {
  PGresult *res = PQexec(pg, sql);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(res));
  long long v = s == PGRES_TUPLES_OK && PQntuples(res) > 0
                    ? strtoll(PQgetvalue(res, 0, 0), NULL, 10)
                    : 0;
  PQclear(res);
  return v;
}

static int64_t t_now_ms;
static int64_t t_clock(void) {
  return t_now_ms;
}

/* ---- epochs ---------------------------------------------------------- */

static void test_acquire_increments_and_persists(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  assert_int_equal(t_part(store, 3).epoch, 0);
  assert_int_equal(t_acquire(store, 3), 1);
  assert_int_equal(t_acquire(store, 3), 2);
  assert_int_equal(t_acquire(store, 4), 1);
  kl_store_destroy(store);

  store = t_open(st->uri, NULL);
  assert_int_equal(t_part(store, 3).epoch, 2);
  assert_int_equal(t_acquire(store, 3), 3);
  assert_int_equal(t_part(store, 4).epoch, 1);
  kl_store_destroy(store);
}

typedef struct t_racer {
  kl_store_t *store;
  uint64_t epochs[50];
} t_racer_t;

static void *t_race_acquire(void *opaque) {
  t_racer_t *r = opaque;
  for (int i = 0; i < 50; i++) {
    kl_partition_state_t ps;
    if (kl_store_acquire(r->store, TOPIC, 0, &ps) == KL_OK)
      r->epochs[i] = ps.epoch;
  }
  return NULL;
}

/* Epochs are an atomic increment: concurrent acquirers never share one. */
static void test_concurrent_acquires_get_distinct_epochs(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *a = t_open(st->uri, NULL), *b = t_open(st->uri, NULL);
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
  assert_int_equal(t_part(a, 0).epoch, 100);
  kl_store_destroy(a);
  kl_store_destroy(b);
}

/* ---- batches --------------------------------------------------------- */

static void test_batch_visibility(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);

  kl_txn_t *a = t_begin(store, 0, epoch);
  t_put(a, "acct/1", "100");
  assert_string_equal(t_get(a, "acct/1"), "100");
  t_put(a, "acct/1", "150");
  assert_string_equal(t_get(a, "acct/1"), "150");
  t_put(a, "acct/2", "7");
  assert_int_equal(kl_txn_del(a, "acct/2", 6), KL_OK);
  assert_null(t_get(a, "acct/2"));

  kl_txn_t *b = t_begin(store, 0, epoch);
  assert_null(t_get(b, "acct/1"));
  t_commit(a, 10);
  assert_null(t_get(b, "acct/1")); /* b's snapshot predates the commit */
  kl_store_abort(b);

  kl_txn_t *c = t_begin(store, 0, epoch);
  assert_string_equal(t_get(c, "acct/1"), "150");
  assert_null(t_get(c, "acct/2"));
  assert_int_equal(kl_txn_del(c, "acct/1", 6), KL_OK);
  assert_null(t_get(c, "acct/1"));
  t_commit(c, 11);
  kl_store_destroy(store);

  store = t_open(st->uri, NULL);
  kl_txn_t *d = t_begin(store, 0, epoch);
  assert_null(t_get(d, "acct/1"));
  kl_store_abort(d);
  assert_int_equal(t_part(store, 0).watermark, 11);
  /* Binary values and keys come back byte for byte. */
  d = t_begin(store, 0, epoch);
  const unsigned char key[3] = {0, 0xff, 1}, val[4] = {0, 1, 0, 0xfe};
  assert_int_equal(kl_txn_put(d, key, 3, val, 4), KL_OK);
  t_commit(d, 12);
  d = t_begin(store, 0, epoch);
  const void *got;
  size_t len;
  assert_int_equal(kl_txn_get(d, key, 3, &got, &len), KL_OK);
  assert_int_equal(len, 4);
  assert_memory_equal(got, val, 4);
  kl_store_abort(d);
  kl_store_destroy(store);
}

static void test_seen_and_mark(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  const char *upper = "0190F5C4-7D2A-7B3E-9F00-1234567890AB";

  kl_txn_t *txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_NONE);
  t_mark(txn, uuid, KL_MARK_APPLIED);
  t_mark(txn, "order-17-created", KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(t_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, upper), KL_MARK_NONE);
  t_commit(txn, 2);

  txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(t_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, upper), KL_MARK_NONE);
  assert_int_equal(t_seen(txn, "order-17"), KL_MARK_NONE);
  t_mark(txn, uuid, KL_MARK_DEAD_LETTER); /* the first record stands */
  t_commit(txn, 3);
  txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_APPLIED);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2);
  /* The insert time is the store clock's. */
  assert_true(t_sql(st->admin, "SELECT min(inserted_ms) FROM keylane_ids") >
              1600000000000LL);
  kl_store_destroy(store);
}

/* The article's point: the handler's own SQL commits with the fence or
 * not at all. */
static void test_fenced_commit_rolls_back_handler_sql(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t old = t_acquire(store, 2);
  kl_txn_t *txn = t_begin(store, 2, old);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_non_null(pg);
  t_sql(pg, "INSERT INTO effects VALUES (1)");
  assert_int_equal(t_sql(pg, "SELECT count(*) FROM effects"), 1);
  t_put(txn, "acct/9", "1");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);

  /* A new owner takes over while the old batch is open: the fence takes
   * no lock before the commit, so this does not wait for the old owner. */
  uint64_t now = t_acquire(store, 2);
  assert_int_equal(kl_store_commit(txn, 50), KL_EFENCED);
  assert_non_null(
      strstr(kl_err_detail(), "fenced partition=2 my_epoch=1 current_epoch=2"));

  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  kl_partition_state_t ps = t_part(store, 2);
  assert_int_equal(ps.epoch, now);
  assert_int_equal(ps.watermark, 0);
  assert_int_equal(ps.applied + ps.duplicates + ps.dead_letters, 0);
  txn = t_begin(store, 2, now);
  assert_null(t_get(txn, "acct/9"));
  assert_int_equal(t_seen(txn, "id-1"), KL_MARK_NONE);
  kl_store_abort(txn);

  /* A stale owner is refused at begin, before its handlers run. */
  kl_txn_t *stale = NULL;
  assert_int_equal(kl_store_begin(store, TOPIC, 2, old, &stale), KL_EFENCED);
  assert_null(stale);
  /* The same with the acquire committed between the fence's snapshot and
   * its commit, from another process's store. */
  kl_store_t *other = t_open(st->uri, NULL);
  txn = t_begin(store, 2, now);
  t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (2)");
  assert_int_equal(t_acquire(other, 2), now + 1);
  assert_int_equal(kl_store_commit(txn, 60), KL_EFENCED);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  kl_store_destroy(other);
  kl_store_destroy(store);
}

static void test_committed_handler_sql_is_visible(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (1)");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  t_commit(txn, 1);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 1);
  kl_store_destroy(store);
}

/* One event's SQL undone, the batch's kept: what a worker running events
 * one after another in one batch transaction needs for a RETRY. */
static void test_savepoint_undoes_one_event(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  t_sql(pg, "INSERT INTO effects VALUES (1)");
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_RELEASE), KL_OK);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  t_sql(pg, "INSERT INTO effects VALUES (2)"); /* this event retries */
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_ROLLBACK), KL_OK);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  PQclear(PQexec(pg, "SELECT * FROM no_such_table")); /* this one fails */
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_ROLLBACK), KL_OK);
  t_sql(pg, "INSERT INTO effects VALUES (3)");
  t_commit(txn, 3);
  assert_int_equal(t_sql(st->admin, "SELECT sum(n) FROM effects"), 4);
  kl_store_destroy(store);
  /* On an LMDB batch it does nothing. */
  char dir[] = "/tmp/kl-pg-sp-XXXXXX";
  assert_non_null(mkdtemp(dir));
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  epoch = t_acquire(store, 0);
  txn = t_begin(store, 0, epoch);
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_handler_must_not_end_the_txn(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_sql(kl_txn_pg_conn(txn), "COMMIT");
  assert_int_equal(kl_store_commit(txn, 5), KL_ESTORE);
  assert_non_null(strstr(kl_err_detail(), "statements only"));
  /* A failed statement aborts the batch: nothing is committed. */
  txn = t_begin(store, 0, epoch);
  t_put(txn, "k", "v");
  PQclear(PQexec(kl_txn_pg_conn(txn), "SELECT * FROM no_such_table"));
  assert_int_equal(kl_store_commit(txn, 6), KL_ESTORE);
  assert_int_equal(t_part(store, 0).watermark, 0);
  kl_store_destroy(store);
}

static void test_watermark_never_goes_back(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  t_commit(t_begin(store, 0, epoch), 100);
  assert_int_equal(t_part(store, 0).watermark, 100);
  t_commit(t_begin(store, 0, epoch), 50);
  assert_int_equal(t_part(store, 0).watermark, 100);
  t_commit(t_begin(store, 0, epoch), 101);
  assert_int_equal(t_part(store, 0).watermark, 101);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.watermark, 101);
  kl_store_destroy(store);
}

static void test_counters(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 1);
  kl_txn_t *txn = t_begin(store, 1, epoch);
  t_mark(txn, "a", KL_MARK_APPLIED);
  t_mark(txn, "b", KL_MARK_APPLIED);
  t_mark(txn, "c", KL_MARK_DEAD_LETTER);
  t_mark(txn, "a", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);
  kl_txn_count_duplicate(txn);
  t_commit(txn, 5);
  txn = t_begin(store, 1, epoch);
  t_mark(txn, "d", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);
  t_commit(txn, 6);
  kl_txn_t *aborted = t_begin(store, 1, epoch);
  t_mark(aborted, "e", KL_MARK_APPLIED);
  kl_store_abort(aborted);

  kl_partition_state_t ps = t_part(store, 1);
  assert_int_equal(ps.applied, 3);
  assert_int_equal(ps.dead_letters, 1);
  assert_int_equal(ps.duplicates, 3);
  kl_store_destroy(store);
}

/* ---- scans ----------------------------------------------------------- */

typedef struct t_scan {
  char keys[1200][16];
  int n, stop_after;
} t_scan_t;

static int t_scan_cb(void *opaque, const void *key, size_t key_len,
                     const void *val, size_t val_len) {
  t_scan_t *s = opaque;
  snprintf(s->keys[s->n++], 16, "%.*s=%.*s", (int)key_len, (const char *)key,
           (int)val_len, (const char *)val);
  return s->stop_after && s->n >= s->stop_after;
}

static void test_scan_order_and_prefix(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  const char *keys[] = {"b/2", "a/1", "b/1", "b/10", "c", "b", "ba"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    t_put(txn, keys[i], "v");
  t_put(txn, "\xff\xff", "v");
  t_put(txn, "\xff\xff\x01", "w");
  t_commit(txn, 1);

  t_scan_t *s = calloc(1, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "b/", 2, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 3);
  assert_string_equal(s->keys[0], "b/1=v");
  assert_string_equal(s->keys[1], "b/10=v");
  assert_string_equal(s->keys[2], "b/2=v");

  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, NULL, 0, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 9);
  assert_string_equal(s->keys[0], "a/1=v");
  assert_string_equal(s->keys[1], "b=v");
  assert_string_equal(s->keys[6], "c=v");

  memset(s, 0, sizeof(*s));
  s->stop_after = 2;
  assert_int_equal(kl_store_scan(store, "b", 1, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 2);

  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "zz", 2, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 0);

  memset(s, 0, sizeof(*s)); /* a prefix with no successor */
  assert_int_equal(kl_store_scan(store, "\xff\xff", 2, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 2);

  /* More rows than one fetch of the cursor. */
  txn = t_begin(store, 0, epoch);
  char key[16];
  for (int i = 0; i < 1100; i++) {
    snprintf(key, sizeof(key), "m/%05d", i);
    t_put(txn, key, "x");
  }
  t_commit(txn, 2);
  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "m/", 2, t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 1100);
  assert_string_equal(s->keys[1099], "m/01099=x");
  free(s);
  kl_store_destroy(store);
}

typedef struct t_parts {
  char seen[8][64];
  int n;
} t_parts_t;

static int t_parts_cb(void *opaque, const char *topic, int32_t partition,
                      const kl_partition_state_t *ps) {
  t_parts_t *p = opaque;
  snprintf(p->seen[p->n++], 64, "%s/%d@%llu", topic, (int)partition,
           (unsigned long long)ps->epoch);
  return 0;
}

static void test_foreach_partition_order(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "b", 0, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 300, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a.b", 0, &ps), KL_OK);
  t_parts_t p = {0};
  assert_int_equal(kl_store_foreach_partition(store, t_parts_cb, &p), KL_OK);
  assert_int_equal(p.n, 4);
  assert_string_equal(p.seen[0], "a/2@2");
  assert_string_equal(p.seen[1], "a/300@1");
  assert_string_equal(p.seen[2], "a.b/0@1");
  assert_string_equal(p.seen[3], "b/0@1");
  kl_store_destroy(store);
}

/* ---- expiry ---------------------------------------------------------- */

static void t_mark_many(kl_store_t *store, uint64_t epoch, uint64_t from,
                        uint64_t n) {
  char id[40];
  for (uint64_t done = 0; done < n;) {
    kl_txn_t *txn = t_begin(store, 0, epoch);
    for (int i = 0; i < 1000 && done < n; i++, done++) {
      snprintf(id, sizeof(id), "id-%llu", (unsigned long long)(from + done));
      t_mark(txn, id, KL_MARK_APPLIED);
    }
    t_commit(txn, (int64_t)(from + done));
  }
}

static void test_sweep_bounded_and_keeps_young(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_now_ms = 1700000000000LL;
  kl__store_set_clock(t_clock);
  kl_store_t *store = t_open(st->uri, "store.dedup.retention", "1h", NULL);
  uint64_t epoch = t_acquire(store, 0);
  t_mark_many(store, epoch, 0, 5000);
  t_now_ms += 3600 * 1000 + 1;
  t_mark_many(store, epoch, 5000, 300);

  size_t removed = 0, total = 0;
  int calls = 0;
  uint64_t count = 0;
  do {
    assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
    assert_true(removed <= 1000);
    total += removed;
    calls++;
    assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  } while (count > 300 && calls < 20);
  assert_int_equal(total, 5000);
  assert_int_equal(calls, 5);
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);

  kl_txn_t *txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, "id-4999"), KL_MARK_NONE);
  assert_int_equal(t_seen(txn, "id-5000"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

static void test_sweep_keeps_a_key_for_the_retention(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_now_ms = 1700000000000LL;
  kl__store_set_clock(t_clock);
  kl_store_t *store = t_open(st->uri, "store.dedup.retention", "1000ms", NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_mark(txn, "k", KL_MARK_APPLIED);
  t_commit(txn, 1);
  size_t removed = 9;
  t_now_ms += 1000;
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 0);
  t_now_ms += 1;
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 1);
  kl_store_destroy(store);
}

typedef struct t_ids {
  char seen[4][64];
  int n;
} t_ids_t;

static int t_ids_cb(void *opaque, const char *id, size_t id_len,
                    int64_t time_ms, kl_mark_t mark) {
  t_ids_t *t = opaque;
  snprintf(t->seen[t->n++], 64, "%.*s@%lld/%d", (int)id_len, id,
           (long long)time_ms, (int)mark);
  return t->n == 2; /* stops after two */
}

static void test_ids_walk(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_now_ms = 1700000000000LL;
  kl__store_set_clock(t_clock);
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_mark(txn, "b", KL_MARK_DEAD_LETTER);
  t_mark(txn, "a", KL_MARK_APPLIED);
  t_mark(txn, "c", KL_MARK_APPLIED);
  t_commit(txn, 1);
  t_ids_t t = {0};
  assert_int_equal(kl__store_ids_walk(store, t_ids_cb, &t), KL_OK);
  assert_int_equal(t.n, 2);
  assert_string_equal(t.seen[0], "a@1700000000000/1");
  assert_string_equal(t.seen[1], "b@1700000000000/2");
  kl_store_destroy(store);
}

/* ---- schema ---------------------------------------------------------- */

static void test_open_creates_the_schema(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  assert_int_equal(t_sql(st->admin, "SELECT max(version) FROM "
                                    "keylane_schema_version"),
                   KL__PG_SCHEMA_VERSION);
  kl_store_destroy(store);
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->uri, &from, &to), KL_OK);
  assert_int_equal(from, KL__PG_SCHEMA_VERSION);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
}

static void test_newer_schema_is_refused(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_destroy(t_open(st->uri, NULL));
  t_sql(st->admin, "INSERT INTO keylane_schema_version (version) VALUES (99)");
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->uri, NULL, &store), KL_ESTORE_VERSION);
  assert_null(store);
  assert_non_null(strstr(kl_err_detail(), "version 99"));
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->uri, &from, &to),
                   KL_ESTORE_VERSION);
  assert_int_equal(from, 99);
}

static void test_older_schema_needs_store_migrate(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_destroy(t_open(st->uri, NULL));
  /* Back to version 1, as a database an older keylane made. */
  t_sql(st->admin, "DROP TABLE keylane_inventory_outcomes");
  t_sql(st->admin, "DELETE FROM keylane_schema_version WHERE version > 1");
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->uri, NULL, &store), KL_ESTORE_VERSION);
  assert_non_null(strstr(kl_err_detail(), "keylane store migrate"));
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->uri, &from, &to), KL_OK);
  assert_int_equal(from, 1);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  store = t_open(st->uri, NULL);
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
  assert_int_equal(t_cli_migrate(st->uri, line, sizeof(line)), 0);
  assert_non_null(strstr(line, "schema version 0 -> 2"));
  assert_int_equal(t_cli_migrate(st->uri, line, sizeof(line)), 0);
  assert_non_null(strstr(line, "nothing to do"));
  t_sql(st->admin, "INSERT INTO keylane_schema_version (version) VALUES (7)");
  assert_int_equal(t_cli_migrate(st->uri, line, sizeof(line)), 1);
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
  assert_int_equal(t_sql(admin, sql), 1);
}

/* A lost connection mid-batch: retriable, nothing applied, and the next
 * begin reconnects. */
static void test_connection_lost_mid_batch(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_sql(st->admin, "CREATE TABLE effects (n integer)");
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  PGconn *pg = kl_txn_pg_conn(txn);
  t_sql(pg, "INSERT INTO effects VALUES (1)");
  t_put(txn, "acct/1", "5");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  t_terminate(st->admin, pg);
  kl_err_t err = kl_store_commit(txn, 10);
  assert_int_equal(err, KL_ESTORE_BUSY);
  assert_true(kl_err_is_retriable(err));

  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 0);
  assert_int_equal(t_part(store, 0).watermark, 0);
  txn = t_begin(store, 0, epoch); /* a new connection */
  assert_int_equal(t_seen(txn, "id-1"), KL_MARK_NONE);
  assert_null(t_get(txn, "acct/1"));
  /* The re-run applies once. */
  t_sql(kl_txn_pg_conn(txn), "INSERT INTO effects VALUES (1)");
  t_put(txn, "acct/1", "5");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  t_commit(txn, 10);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM effects"), 1);
  assert_int_equal(t_part(store, 0).watermark, 10);

  /* Idle pooled connections lost to a server-side kill are replaced. */
  char sql[160];
  snprintf(sql, sizeof(sql),
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
           "WHERE datname = current_database() AND pid <> %d",
           PQbackendPID(st->admin));
  t_sql(st->admin, sql);
  assert_int_equal(t_part(store, 0).watermark, 10);
  txn = t_begin(store, 0, epoch);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* A lost link during a handler's read: the call fails retriably. */
static void test_connection_lost_during_get(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_terminate(st->admin, kl_txn_pg_conn(txn));
  const void *val;
  size_t len;
  assert_int_equal(kl_txn_get(txn, "k", 1, &val, &len), KL_ESTORE_BUSY);
  kl_mark_t mark;
  assert_int_equal(kl_txn_seen(txn, "i", 1, &mark), KL_ESTORE_BUSY);
  assert_int_equal(kl_store_commit(txn, 1), KL_ESTORE_BUSY);
  t_commit(t_begin(store, 0, epoch), 1);
  kl_store_destroy(store);
}

typedef struct t_holder {
  kl_store_t *store;
  uint64_t epoch;
  int64_t begun_ns;
} t_holder_t;

static int64_t t_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *t_second_batch(void *opaque) {
  t_holder_t *h = opaque;
  kl_txn_t *txn = NULL;
  if (kl_store_begin(h->store, TOPIC, 0, h->epoch, &txn) == KL_OK) {
    h->begun_ns = t_mono_ns();
    kl_store_commit(txn, 2);
  }
  return NULL;
}

/* The pool's bound: with one connection a second batch waits for the
 * first to end. */
static void test_pool_bound(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->uri, "store.pg.pool", "1", NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_holder_t h = {store, epoch, 0};
  pthread_t th;
  pthread_create(&th, NULL, t_second_batch, &h);
  struct timespec pause = {0, 300 * 1000000L};
  nanosleep(&pause, NULL);
  assert_int_equal(h.begun_ns, 0);
  int64_t ended = t_mono_ns();
  t_commit(txn, 1);
  pthread_join(th, NULL);
  assert_true(h.begun_ns >= ended);
  assert_int_equal(t_part(store, 0).watermark, 2);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM pg_stat_activity "
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
  t_sql(st->admin, "CREATE TABLE stock (sku text PRIMARY KEY, qty int)");
  t_sql(st->admin, "INSERT INTO stock VALUES ('s', 10)");
  kl_store_t *zombie = t_open(st->uri, "store.pg.idle.timeout", "1s", NULL);
  kl_store_t *owner = t_open(st->uri, NULL);
  uint64_t old = t_acquire(zombie, 0);
  kl_txn_t *ztxn = t_begin(zombie, 0, old);
  t_sql(kl_txn_pg_conn(ztxn), "UPDATE stock SET qty = qty - 1 WHERE sku = 's'");
  t_mark(ztxn, "z-1", KL_MARK_APPLIED);
  /* ... and the zombie pauses here. */
  uint64_t now = t_acquire(owner, 0); /* not blocked by the zombie */
  kl_txn_t *txn = t_begin(owner, 0, now);
  int64_t t0 = t_mono_ns();
  t_sql(kl_txn_pg_conn(txn), "UPDATE stock SET qty = qty - 1 WHERE sku = 's'");
  int64_t waited_ms = (t_mono_ns() - t0) / 1000000;
  assert_true(waited_ms >= 500 && waited_ms < 10000);
  t_mark(txn, "o-1", KL_MARK_APPLIED);
  t_commit(txn, 1);
  /* The zombie wakes: its connection is gone, then it is fenced. */
  kl_err_t err = kl_store_commit(ztxn, 1);
  assert_true(err == KL_ESTORE_BUSY || err == KL_EFENCED);
  kl_txn_t *stale = NULL;
  assert_int_equal(kl_store_begin(zombie, TOPIC, 0, old, &stale), KL_EFENCED);
  assert_int_equal(t_sql(st->admin, "SELECT qty FROM stock"), 9);
  assert_int_equal(t_sql(st->admin, "SELECT count(*) FROM keylane_ids"), 1);
  kl_store_destroy(zombie);
  kl_store_destroy(owner);
}

static void test_lmdb_has_no_pg_conn(void **state) {
  char dir[] = "/tmp/kl-pg-lmdb-XXXXXX";
  assert_non_null(mkdtemp(dir));
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, TOPIC, 0, &ps), KL_OK);
  kl_txn_t *txn = NULL;
  assert_int_equal(kl_store_begin(store, TOPIC, 0, ps.epoch, &txn), KL_OK);
  assert_null(kl_txn_pg_conn(txn));
  kl_store_abort(txn);
  kl_store_destroy(store);
  assert_null(kl_txn_pg_conn(NULL));
  char cmd[64];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

#define T(name) cmocka_unit_test_setup_teardown(name, t_setup, t_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_acquire_increments_and_persists),
      T(test_concurrent_acquires_get_distinct_epochs),
      T(test_batch_visibility),
      T(test_seen_and_mark),
      T(test_fenced_commit_rolls_back_handler_sql),
      T(test_committed_handler_sql_is_visible),
      T(test_savepoint_undoes_one_event),
      T(test_handler_must_not_end_the_txn),
      T(test_watermark_never_goes_back),
      T(test_counters),
      T(test_scan_order_and_prefix),
      T(test_foreach_partition_order),
      T(test_sweep_bounded_and_keeps_young),
      T(test_sweep_keeps_a_key_for_the_retention),
      T(test_ids_walk),
      T(test_open_creates_the_schema),
      T(test_newer_schema_is_refused),
      T(test_older_schema_needs_store_migrate),
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
