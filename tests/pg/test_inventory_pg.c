/*
 * The handlers on the PostgreSQL store: the inventory example's decrement
 * on the batch's connection (reserved, then sold out, each recorded once;
 * a fenced batch decrements nothing), and the ledger handler through
 * kl_txn_get/put. Events go through the steps the worker takes: seen,
 * handler, mark, commit.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "keylane/handlers.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/sql.h"
#include "common/sqlstate.h"
#include "handlers/inventory.h"
#include "handlers/ledger.h"
#include "store/pg.h"
#include "store/store_internal.h"

#define TOPIC "orders"

static int t_db_seq;

typedef struct t_state {
  const char *topic; /* the batches' and the fences' */
  char uri[256];
  PGconn *admin;
  kl_store_t *store;
  uint64_t epoch;
  int64_t offset;
} t_state_t;

static int t_setup(void **state) {
  if (!kl_t_pg_group())
    return 0;
  t_state_t *st = calloc(1, sizeof(*st));
  char name[32];
  snprintf(name, sizeof(name), "inv%d", ++t_db_seq);
  if (kl_t_pg_createdb(kl_t_pg_group(), name, st->uri, sizeof(st->uri)))
    return -1;
  st->admin = PQconnectdb(st->uri);
  if (PQstatus(st->admin) != CONNECTION_OK ||
      kl_store_open(st->uri, NULL, &st->store))
    return -1;
  kl_partition_state_t ps;
  if (kl_store_acquire(st->store, TOPIC, 0, &ps))
    return -1;
  st->epoch = ps.epoch;
  st->topic = TOPIC;
  *state = st;
  return 0;
}

static int t_teardown(void **state) {
  t_state_t *st = *state;
  if (st) {
    kl_store_destroy(st->store);
    PQfinish(st->admin);
    free(st);
  }
  return 0;
}

/* One event as the worker applies it: skipped when seen, else handled and
 * marked. Returns the handler's verdict (OK for a duplicate). */
static kl_handler_result_t t_apply(t_state_t *st, kl_txn_t *txn,
                                   kl_handler_fn_t *handler, const char *key,
                                   const char *id, const char *type,
                                   const void *payload, size_t payload_len,
                                   char *why, size_t why_size) {
  kl_mark_t mark;
  assert_int_equal(kl_txn_seen(txn, key, strlen(key), id, strlen(id), &mark),
                   KL_OK);
  if (mark != KL_MARK_NONE) {
    kl_txn_count_duplicate(txn);
    return KL_HANDLER_OK;
  }
  kl_event_t event = {key,         strlen(key),  id, strlen(id),
                      type,        strlen(type), 0,  payload,
                      payload_len, NULL,         0,  0};
  kl_fence_t fence = {st->topic, 0, st->epoch, st->offset++};
  kl_handler_result_t r = handler(NULL, &event, &fence, txn, why, why_size);
  if (r == KL_HANDLER_OK)
    assert_int_equal(
        kl_txn_mark(txn, key, strlen(key), id, strlen(id), KL_MARK_APPLIED),
        KL_OK);
  return r;
}

static kl_txn_t *t_begin(t_state_t *st) {
  kl_txn_t *txn = NULL;
  assert_int_equal(kl_store_begin(st->store, st->topic, 0, st->epoch, &txn),
                   KL_OK);
  return txn;
}

static void t_reserve(t_state_t *st, kl_txn_t *txn, const char *sku,
                      const char *id) {
  char why[512] = "";
  kl_handler_result_t r = t_apply(st, txn, kl__inventory_handler, sku, id,
                                  "reserve", "", 0, why, sizeof(why));
  if (r != KL_HANDLER_OK)
    fail_msg("reserve %s: %s", id, why);
}

/* An event of @p type on sku-1 gets @p want, with @p says in its reason. */
static void t_expect(t_state_t *st, kl_txn_t *txn, const char *id,
                     const char *type, kl_handler_result_t want,
                     const char *says) {
  char why[512] = "";
  kl_handler_result_t r = t_apply(st, txn, kl__inventory_handler, "sku-1", id,
                                  type, "", 0, why, sizeof(why));
  if (r != want || !strstr(why, says))
    fail_msg("%s %s: %d (%s), not %d saying \"%s\"", type, id, r, why, want,
             says);
}

static void test_inventory_reserves_then_sold_out(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC
                      "', 'sku-1', 2), ('" TOPIC "', 'sku-2', 0)");

  kl_txn_t *txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  t_reserve(st, txn, "sku-1", "order-2");
  t_reserve(st, txn, "sku-1", "order-3"); /* the third: sold out */
  t_reserve(st, txn, "sku-2", "order-4");
  t_reserve(st, txn, "sku-9", "order-5"); /* no stock row: no stock */
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = "
                                       "'sku-1'"),
                   2); /* not committed yet */
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);

  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = "
                                       "'sku-1'"),
                   0);
  assert_int_equal(kl_t_sql(st->admin,
                            "SELECT count(*) FROM "
                            "keylane_inventory_outcomes WHERE outcome "
                            "= 'reserved'"),
                   2);
  assert_int_equal(kl_t_sql(st->admin,
                            "SELECT count(*) FROM "
                            "keylane_inventory_outcomes WHERE outcome "
                            "= 'sold_out'"),
                   3);
  assert_int_equal(kl_t_sql(st->admin, "SELECT event_offset FROM "
                                       "keylane_inventory_outcomes WHERE id = "
                                       "'order-3'::bytea AND outcome = "
                                       "'sold_out' AND epoch = 1"),
                   2);

  /* Re-published and redelivered: seen, so nothing is taken again. */
  kl_t_sql(st->admin, "UPDATE stock SET qty = 5 WHERE sku = 'sku-1'");
  txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  t_reserve(st, txn, "sku-1", "order-3");
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = "
                                       "'sku-1'"),
                   5);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(st->store, TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.applied, 5);
  assert_int_equal(ps.duplicates, 2);
}

static void test_inventory_fenced_takes_nothing(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC "', 'sku-1', 3)");
  kl_txn_t *txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(st->store, TOPIC, 0, &ps), KL_OK);
  assert_int_equal(kl_store_commit(txn, st->offset), KL_EFENCED);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock"), 3);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_inventory_outcomes"),
                   0);
  /* The new owner applies it, once. */
  st->epoch = ps.epoch;
  txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock"), 2);
}

/* A dropped stock table is the setup's fault, not the event's: a store
 * failure (KL__HANDLER_STORE), naming the table to create, never a dead
 * letter; an event that is not a
 * reservation is the event's: FAIL. */
static void test_inventory_without_stock_table_retries(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_txn_t *txn = t_begin(st);
  t_expect(st, txn, "o-2", "restock", KL_HANDLER_FAIL, "not reserve");
  t_expect(st, txn, "o-1", "reserve", (kl_handler_result_t)KL__HANDLER_STORE,
           "CREATE TABLE stock");
  /* The failed statement aborted the batch: it can only be discarded. */
  assert_int_equal(kl_store_commit(txn, 1), KL_ESTORE);
}

/* Ids are scoped by entity key: z1..z3 on s1 and on s2 are six events, and
 * each records its own outcome (issue 39, finding 2). */
static void t_reserve_shared_ids(t_state_t *st) {
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC
                      "', 's1', 5), ('" TOPIC "', 's2', 5)");
  kl_txn_t *txn = t_begin(st);
  const char *skus[] = {"s1", "s2"}, *ids[] = {"z1", "z2", "z3"};
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 3; i++)
      t_reserve(st, txn, skus[s], ids[i]);
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = "
                                       "'s1'"),
                   2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = "
                                       "'s2'"),
                   2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_inventory_outcomes WHERE id = "
                                       "'z1'::bytea AND topic = '" TOPIC "'"),
                   2);
}

static void test_inventory_one_id_on_two_skus(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_reserve_shared_ids(st);
}

/* A store whose outcomes table has the primary key on id alone (schema 8,
 * with the changes of schemas 9 to 12 undone) is moved to (topic, sku, id) by
 * `keylane store migrate`, its rows kept under the store's only topic. */
static void test_inventory_outcomes_key_migrated(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL_T_PG_UNDO_12
           "ALTER TABLE keylane_inventory_outcomes DROP CONSTRAINT "
           "keylane_inventory_outcomes_pkey, DROP COLUMN topic, "
           "ADD PRIMARY KEY (id);"
           "DROP TABLE keylane_topic_sweeps;"
           "DROP TABLE keylane_topic_owners;"
           "CREATE TABLE keylane_sweep (one boolean PRIMARY KEY DEFAULT true "
           "CHECK (one), next_page bigint NOT NULL);"
           "INSERT INTO keylane_sweep (next_page) VALUES (0);"
           "DELETE FROM keylane_schema_version WHERE version >= 9;"
           "INSERT INTO keylane_inventory_outcomes (id, sku, outcome, "
           "partition, epoch, event_offset) VALUES ('old-1', 's1', "
           "'reserved', 0, 1, 0)");
  int from = 0, to = 0;
  assert_int_equal(kl__store_pg_migrate(st->uri, &from, &to), KL_OK);
  assert_int_equal(from, 8);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  assert_int_equal(
      kl_t_sql(st->admin, "SELECT count(*) FROM keylane_inventory_outcomes "
                          "WHERE id = 'old-1'::bytea AND topic = '" TOPIC "'"),
      1);
  assert_int_equal(kl_t_sql(st->admin,
                            "SELECT count(*) FROM pg_index i JOIN pg_attribute "
                            "a ON a.attrelid = i.indrelid AND a.attnum = "
                            "ANY(i.indkey) WHERE i.indisprimary AND "
                            "i.indrelid = 'keylane_inventory_outcomes'::"
                            "regclass AND a.attname IN ('topic', 'sku', "
                            "'id')"),
                   3);
  t_reserve_shared_ids(st);
}

/* A lock timeout (55P03) is transient, as it is for the store: the handler
 * asks for a retry instead of a dead letter, and once the lock is released
 * the event applies (issue 39, finding 5). */
static void test_inventory_lock_timeout_retries(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC "', 'sku-1', 3)");
  kl_t_sql(st->admin, "BEGIN");
  kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = 'sku-1' FOR UPDATE");

  kl_txn_t *txn = t_begin(st);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_non_null(pg);
  PGresult *res = PQexec(pg, "SET LOCAL lock_timeout = '100ms'");
  assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
  PQclear(res);
  t_expect(st, txn, "order-1", "reserve", KL_HANDLER_RETRY, "lock timeout");
  kl_store_abort(txn);

  kl_t_sql(st->admin, "COMMIT"); /* the other session lets go */
  txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock"), 2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_inventory_outcomes"),
                   1);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(st->store, TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.applied, 1);
  assert_int_equal(ps.dead_letters, 0);
}

/* Two topics sharing the store sell one SKU from rows of their own: an
 * owner of "orders" that holds its row (a batch open, its worker paused)
 * does not hold the other topic's owner, which takes its unit at once
 * (issue 39's attack, finding 3: one shared row stalled it for the
 * server's idle timeout). */
static void test_inventory_topics_own_their_rows(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC "', 'sku-1', 1), "
                      "('returns', 'sku-1', 1)");
  kl_txn_t *paused = t_begin(st);
  t_reserve(st, paused, "sku-1", "order-1");

  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(st->store, "returns", 0, &ps), KL_OK);
  uint64_t epoch = st->epoch;
  st->topic = "returns";
  st->epoch = ps.epoch;
  kl_txn_t *txn = t_begin(st);
  PGresult *res = PQexec(kl_txn_pg_conn(txn), "SET LOCAL lock_timeout = "
                                              "'200ms'");
  assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
  PQclear(res);
  t_reserve(st, txn, "sku-1", "order-1"); /* a lock wait fails it */
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  st->topic = TOPIC;
  st->epoch = epoch;
  assert_int_equal(kl_store_commit(paused, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT sum(qty) FROM stock"), 0);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_inventory_outcomes WHERE "
                                       "outcome = 'reserved'"),
                   2);
}

static void t_check_says(t_state_t *st, const kl_conf_t *conf,
                         const char *says) {
  kl_txn_t *txn = NULL;
  assert_int_equal(kl__store_begin_check(st->store, TOPIC, &txn), KL_OK);
  kl_err_t err = kl__inventory_check(txn, TOPIC, conf);
  if (err != KL_ECONF || !strstr(kl_err_detail(), says))
    fail_msg("check: %s (%s), not saying \"%s\"", kl_err_name(err),
             kl_err_detail(), says);
  kl_store_abort(txn);
}

/* What would make the handler fail every event is refused before a
 * worker starts, naming the fix: key-parallel executors, no stock table,
 * a stock table keyed by SKU alone (moved by the statement the refusal
 * gives, its rows kept), no outcomes table (issue 39's attack, finding 4).
 * A good setup passes, and the check wrote and locked nothing. */
static void test_inventory_check_refuses_what_fails_every_event(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "worker.concurrency", "4"), KL_OK);
  t_check_says(st, conf, "run it with --concurrency 1");
  kl_conf_destroy(conf);

  t_check_says(st, NULL, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "CREATE TABLE stock (sku text PRIMARY KEY, qty integer "
                      "NOT NULL CHECK (qty >= 0));"
                      "INSERT INTO stock VALUES ('sku-1', 4)");
  char migrate[512];
  snprintf(migrate, sizeof(migrate), KL__INVENTORY_STOCK_MIGRATE, TOPIC);
  t_check_says(st, NULL, migrate);
  kl_t_sql(st->admin, migrate);

  kl_t_sql(st->admin, "ALTER TABLE keylane_inventory_outcomes RENAME TO "
                      "outcomes_away");
  t_check_says(st, NULL, "keylane store migrate");
  kl_t_sql(st->admin, "ALTER TABLE outcomes_away RENAME TO "
                      "keylane_inventory_outcomes");

  kl_txn_t *txn = NULL;
  assert_int_equal(kl__store_begin_check(st->store, TOPIC, &txn), KL_OK);
  assert_int_equal(kl__inventory_check(txn, TOPIC, NULL), KL_OK);
  kl_store_abort(txn);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_inventory_outcomes"),
                   0);
  txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1"); /* the kept row, now the topic's */
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock WHERE topic = "
                                       "'" TOPIC "' AND sku = 'sku-1'"),
                   3);
}

/* A role without UPDATE on stock: refused at start, naming the GRANT; a
 * REVOKE while the worker runs makes the event a store failure
 * (KL__HANDLER_STORE: no attempt counted, not a dead letter), and once
 * granted again it applies (issue 39's attack, finding 4; the worker's
 * side: test_worker_pg's test_inventory_revoked_privilege_waits_on_pg). */
static void test_inventory_revoked_privilege_retries(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('" TOPIC "', 'sku-1', 2)");
  kl_t_sql(st->admin, "DO $$ BEGIN CREATE ROLE kl_inv_w LOGIN; EXCEPTION "
                      "WHEN duplicate_object THEN NULL; END $$;"
                      "GRANT ALL ON ALL TABLES IN SCHEMA public TO kl_inv_w;"
                      "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO kl_inv_w;"
                      "REVOKE UPDATE ON stock FROM kl_inv_w");
  char uri[300];
  const char *at = strchr(st->uri, '@');
  assert_non_null(at);
  snprintf(uri, sizeof(uri), "postgresql://kl_inv_w%s", at);
  kl_store_t *store = st->store;
  assert_int_equal(kl_store_open(uri, NULL, &st->store), KL_OK);
  t_check_says(st, NULL, "GRANT SELECT, UPDATE ON stock");

  kl_txn_t *txn = t_begin(st);
  t_expect(st, txn, "order-1", "reserve",
           (kl_handler_result_t)KL__HANDLER_STORE, "permission denied");
  kl_store_abort(txn);

  kl_t_sql(st->admin, "GRANT UPDATE ON stock TO kl_inv_w");
  txn = t_begin(st);
  t_reserve(st, txn, "sku-1", "order-1");
  assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  assert_int_equal(kl_t_sql(st->admin, "SELECT qty FROM stock"), 1);
  kl_store_destroy(st->store);
  st->store = store;
}

/* `keylane worker --handler inventory` refuses before it reaches for
 * Kafka, exit 2, what kl__inventory_check() refuses, also on a topic no
 * owner has taken yet (its partitions at epoch 0). */
static void test_worker_refuses_inventory_that_cannot_work(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  static const struct {
    const char *topic, *concurrency, *says;
  } cases[] = {
      {TOPIC, "4", "worker.concurrency=4"},
      {TOPIC, "1", "CREATE TABLE stock"},
      {"fresh", "1", "CREATE TABLE stock"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for((const char *[]){"worker", "-b", "127.0.0.1:1", "-t",
                                  cases[i].topic, "--store", st->uri,
                                  "--handler", "inventory", "--concurrency",
                                  cases[i].concurrency, "--kafka-wait", "0",
                                  NULL},
                 NULL, 0, 20000, &r);
    if (r.rc != 2 || !strstr(r.err, cases[i].says))
      fail_msg("-t %s --concurrency %s: exit %d, stderr: %s", cases[i].topic,
               cases[i].concurrency, r.rc, r.err);
    kl_t_run_free(&r);
  }
}

/* A handler timeout not below store.pg.idle.timeout is refused at start,
 * naming both and the fix: a handler call that long ends the batch's
 * session before its commit (issue 39's attack, finding 5). Below it, the
 * worker goes on (here to a broker that is not there). */
static void test_worker_refuses_handler_timeout_past_idle(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  static const struct {
    const char *timeout_ms;
    int refused;
  } cases[] = {{"2000", 1}, {"5000", 1}, {"1999", 0}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for((const char *[]){"worker", "-b", "127.0.0.1:1", "-t", TOPIC,
                                  "--store", st->uri, "--handler", "ledger",
                                  "--handler-timeout-ms", cases[i].timeout_ms,
                                  "-X", "store.pg.idle.timeout=2s",
                                  "--kafka-wait", "0", NULL},
                 NULL, 0, 20000, &r);
    int refused = strstr(r.err, "is not below store.pg.idle.timeout (2000 "
                                "ms)") != NULL &&
                  strstr(r.err, "--handler-timeout-ms") != NULL;
    if (r.rc == 0 || refused != cases[i].refused)
      fail_msg("--handler-timeout-ms %s: exit %d, stderr: %s",
               cases[i].timeout_ms, r.rc, r.err);
    kl_t_run_free(&r);
  }
}

static void t_ledger_payload(msgpack_sbuffer *buf, int64_t amount,
                             int64_t seq) {
  msgpack_sbuffer_init(buf);
  msgpack_packer pk;
  msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  msgpack_pack_str(&pk, 6);
  msgpack_pack_str_body(&pk, "amount", 6);
  msgpack_pack_int64(&pk, amount);
  msgpack_pack_str(&pk, 3);
  msgpack_pack_str_body(&pk, "seq", 3);
  msgpack_pack_int64(&pk, seq);
}

static int t_ledger_row(void *opaque, const void *key, size_t key_len,
                        const void *val, size_t val_len) {
  kl_ledger_entry_t *e = opaque;
  assert_int_equal(kl__ledger_decode(val, val_len, e), 0);
  return 0;
}

static void test_ledger_on_pg(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  const char *types[] = {"credit", "credit", "debit"};
  const int64_t amounts[] = {100, 20, 30};
  char why[512];
  for (int round = 0; round < 2; round++) { /* the second: all duplicates */
    kl_txn_t *txn = t_begin(st);
    for (int i = 0; i < 3; i++) {
      msgpack_sbuffer buf;
      t_ledger_payload(&buf, amounts[i], i + 1);
      char id[16];
      snprintf(id, sizeof(id), "ev-%d", i);
      assert_int_equal(t_apply(st, txn, kl_ledger_handler, "acct-7", id,
                               types[i], buf.data, buf.size, why, sizeof(why)),
                       KL_HANDLER_OK);
      msgpack_sbuffer_destroy(&buf);
    }
    assert_int_equal(kl_store_commit(txn, st->offset), KL_OK);
  }
  kl_ledger_entry_t e = {0};
  assert_int_equal(kl_store_scan(st->store, KL_LEDGER_PREFIX,
                                 strlen(KL_LEDGER_PREFIX), t_ledger_row, &e),
                   KL_OK);
  assert_int_equal(e.balance, 90);
  assert_int_equal(e.last_seq, 3);
  assert_int_equal(e.violations, 0);
}

#define T(name) cmocka_unit_test_setup_teardown(name, t_setup, t_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_inventory_reserves_then_sold_out),
      T(test_inventory_fenced_takes_nothing),
      T(test_inventory_without_stock_table_retries),
      T(test_inventory_one_id_on_two_skus),
      T(test_inventory_outcomes_key_migrated),
      T(test_inventory_lock_timeout_retries),
      T(test_inventory_topics_own_their_rows),
      T(test_inventory_check_refuses_what_fails_every_event),
      T(test_inventory_revoked_privilege_retries),
      T(test_worker_refuses_inventory_that_cannot_work),
      T(test_worker_refuses_handler_timeout_past_idle),
      T(test_ledger_on_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
