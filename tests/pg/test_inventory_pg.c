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
#include "support/sql.h"
#include "handlers/inventory.h"
#include "handlers/ledger.h"
#include "store/pg.h"

#define TOPIC "orders"

static int t_db_seq;

typedef struct t_state {
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
                      payload_len, NULL,         0};
  kl_fence_t fence = {TOPIC, 0, st->epoch, st->offset++};
  kl_handler_result_t r = handler(NULL, &event, &fence, txn, why, why_size);
  if (r == KL_HANDLER_OK)
    assert_int_equal(
        kl_txn_mark(txn, key, strlen(key), id, strlen(id), KL_MARK_APPLIED),
        KL_OK);
  return r;
}

static kl_txn_t *t_begin(t_state_t *st) {
  kl_txn_t *txn = NULL;
  assert_int_equal(kl_store_begin(st->store, TOPIC, 0, st->epoch, &txn), KL_OK);
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

static void test_inventory_reserves_then_sold_out(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('sku-1', 2), ('sku-2', 0)");

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
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('sku-1', 3)");
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

static void test_inventory_without_stock_table_fails(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_txn_t *txn = t_begin(st);
  char why[512] = "";
  assert_int_equal(t_apply(st, txn, kl__inventory_handler, "sku-1", "o-2",
                           "restock", "", 0, why, sizeof(why)),
                   KL_HANDLER_FAIL);
  assert_non_null(strstr(why, "not reserve"));
  assert_int_equal(t_apply(st, txn, kl__inventory_handler, "sku-1", "o-1",
                           "reserve", "", 0, why, sizeof(why)),
                   KL_HANDLER_FAIL);
  assert_non_null(strstr(why, "CREATE TABLE stock"));
  /* The failed statement aborted the batch: it can only be discarded. */
  assert_int_equal(kl_store_commit(txn, 1), KL_ESTORE);
}

/* Ids are scoped by entity key: z1..z3 on s1 and on s2 are six events, and
 * each records its own outcome (issue 39, finding 2). */
static void t_reserve_shared_ids(t_state_t *st) {
  kl_t_sql(st->admin, KL__INVENTORY_STOCK_DDL);
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('s1', 5), ('s2', 5)");
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
 * with schema 9's and 10's changes undone) is moved to (topic, sku, id) by
 * `keylane store migrate`, its rows kept under the store's only topic. */
static void test_inventory_outcomes_key_migrated(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin,
           "ALTER TABLE keylane_inventory_outcomes DROP CONSTRAINT "
           "keylane_inventory_outcomes_pkey, DROP COLUMN topic, "
           "ADD PRIMARY KEY (id);"
           "DROP TABLE keylane_topic_sweeps;"
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
  kl_t_sql(st->admin, "INSERT INTO stock VALUES ('sku-1', 3)");
  kl_t_sql(st->admin, "BEGIN");
  kl_t_sql(st->admin, "SELECT qty FROM stock WHERE sku = 'sku-1' FOR UPDATE");

  kl_txn_t *txn = t_begin(st);
  PGconn *pg = kl_txn_pg_conn(txn);
  assert_non_null(pg);
  PGresult *res = PQexec(pg, "SET LOCAL lock_timeout = '100ms'");
  assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
  PQclear(res);
  char why[512] = "";
  assert_int_equal(t_apply(st, txn, kl__inventory_handler, "sku-1", "order-1",
                           "reserve", "", 0, why, sizeof(why)),
                   KL_HANDLER_RETRY);
  assert_non_null(strstr(why, "lock timeout"));
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
  kl_ledger_entry_t e = {0, 0, 0, 0};
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
      T(test_inventory_without_stock_table_fails),
      T(test_inventory_one_id_on_two_skus),
      T(test_inventory_outcomes_key_migrated),
      T(test_inventory_lock_timeout_retries),
      T(test_ledger_on_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
