/*
 * The PostgreSQL store's sweep per topic (issue 39): each topic's sweep
 * keeps its own position in keylane_topic_sweeps, so two fleets' sweeps
 * never fight over one row; and a store at schema 9, whose one
 * store-wide position any fleet's sweep moved, is migrated to 10 with
 * its ids kept, none swept earlier than its own topic's retention. The
 * contract's sweep tests (support/store_contract.h) run in
 * test_store_pg.c. Skips, saying why, when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "keylane/store.h"
#include "store/pg.h"
#include "store/store_internal.h"
#include "support/pg_db.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "support/store_contract.h"

typedef kl_t_pg_db_t t_state_t;

/* Opens the store with @p retention and marks event "credit-1" of entity
 * "acct-1" applied on partition 0 of @p topic. */
static kl_store_t *t_mark(const char *uri, const char *retention,
                          const char *topic) {
  kl_store_t *store =
      kl_t_store_open(uri, "store.dedup.retention", retention, NULL);
  kl_t_topic_mark(store, topic, kl_t_topic_acquire(store, topic), 1);
  return store;
}

static long long t_ids_of(PGconn *admin, const char *topic) {
  char sql[128];
  snprintf(sql, sizeof(sql),
           "SELECT count(*) FROM keylane_ids WHERE topic = '%s'", topic);
  return kl_t_sql(admin, sql);
}

/* Two fleets sweep at once: each takes its own topic's row, so neither
 * call is skipped for the other's, and each removes its own ids alone. */
static void test_two_topics_sweep_from_their_own_rows(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *a = t_mark(st->fx.where, "1s", "audit");
  kl_store_t *p = t_mark(st->fx.where, "7d", "payments");
  kl_t_store_clock_add(86400 * 1000);
  /* payments' sweep holds its row, as while it runs. */
  kl_t_sql(st->admin, "INSERT INTO keylane_topic_sweeps (topic) VALUES "
                      "('payments')");
  kl_t_sql(st->admin, "BEGIN");
  kl_t_sql(st->admin, "SELECT 1 FROM keylane_topic_sweeps WHERE topic = "
                      "'payments' FOR UPDATE");
  size_t removed = 0;
  assert_int_equal(kl_store_sweep(a, 1000, &removed), KL_OK);
  assert_int_equal(removed, 1);
  /* payments' own sweep, while another holds its row, returns at once. */
  assert_int_equal(kl_store_sweep(p, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);
  kl_t_sql(st->admin, "ROLLBACK");
  assert_int_equal(kl_store_sweep(p, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(t_ids_of(st->admin, "payments"), 1);
  assert_int_equal(t_ids_of(st->admin, "audit"), 0);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM "
                                       "keylane_topic_sweeps"),
                   2);
  assert_int_equal(kl_t_sql(st->admin, "SELECT retention_ms FROM "
                                       "keylane_topic_sweeps WHERE topic = "
                                       "'audit'"),
                   1000);
  kl_store_destroy(a);
  kl_store_destroy(p);
}

/* Schema 9 as it was: one store-wide position (and no table of topic
 * owners, schema 11's; ids stored key first, before schema 12). */
#define T_SCHEMA_9                                                             \
  KL_T_PG_UNDO_12                                                              \
  "DROP TABLE keylane_topic_sweeps;"                                           \
  "DROP TABLE keylane_topic_owners;"                                           \
  "CREATE TABLE keylane_sweep ("                                               \
  "  one boolean PRIMARY KEY DEFAULT true CHECK (one),"                        \
  "  next_page bigint NOT NULL);"                                              \
  "INSERT INTO keylane_sweep (next_page) VALUES (0);"                          \
  "DELETE FROM keylane_schema_version WHERE version >= 10"

/* `keylane store migrate` moves a schema-9 store on: the ids written
 * before are kept, the store-wide table is gone (an older worker's sweep,
 * which names it, fails instead of sweeping every topic), and from then
 * on a 1 s sweep of one topic leaves the other's day-old ids. */
static void test_schema9_upgrade_keeps_ids(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_destroy(t_mark(st->fx.where, "7d", "payments"));
  kl_store_destroy(t_mark(st->fx.where, "7d", "audit"));
  kl_t_sql(st->admin, T_SCHEMA_9);
  int from = 0, to = 0;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  assert_int_equal(from, 9);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_tables WHERE "
                                       "tablename = 'keylane_sweep'"),
                   0);
  assert_int_equal(t_ids_of(st->admin, "payments"), 1);
  assert_int_equal(t_ids_of(st->admin, "audit"), 1);

  kl_t_store_clock_add(86400 * 1000);
  kl_store_t *a = t_mark(st->fx.where, "1s", "audit");
  kl_t_store_clock_add(2000);
  size_t removed = 0;
  assert_int_equal(kl_store_sweep(a, 1000, &removed), KL_OK);
  assert_int_equal(removed, 1);
  assert_int_equal(t_ids_of(st->admin, "payments"), 1);
  kl_store_destroy(a);

  kl_store_t *p =
      kl_t_store_open(st->fx.where, "store.dedup.retention", "7d", NULL);
  assert_int_equal(
      kl_t_topic_seen(p, "payments", kl_t_topic_acquire(p, "payments")),
      KL_MARK_APPLIED);
  kl_store_destroy(p);
}

#define T(name)                                                                \
  cmocka_unit_test_setup_teardown(name, kl_t_pg_db_setup, kl_t_pg_db_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_two_topics_sweep_from_their_own_rows),
      T(test_schema9_upgrade_keeps_ids),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
