/*
 * The store commands of the executable (KEYLANE_BIN) on a PostgreSQL
 * database that holds no keylane store: those that read or change a store
 * (replay, its dry run and --from-dlq, store rebuild --dry-run, store
 * reset, store stats) refuse it and create no table, and store migrate,
 * the way to create the schema by hand, still creates it. They open the
 * store before they talk to Kafka, so none is needed. Skips, saying why,
 * when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "support/pg_group.h"
#include "support/run.h"
#include "support/sql.h"
#include "store/pg.h"

static long long t_keylane_tables(const char *uri) {
  PGconn *pg = PQconnectdb(uri);
  assert_int_equal(PQstatus(pg), CONNECTION_OK);
  long long n = kl_t_sql(pg, "SELECT count(*) FROM pg_tables WHERE "
                             "tablename LIKE 'keylane%'");
  PQfinish(pg);
  return n;
}

static void test_no_schema_is_created_but_by_migrate(void **state) {
  (void)state;
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(kl_t_pg_need(), "empty", uri, sizeof(uri)),
                   0);
  const char *const runs[][16] = {
      {"replay", "-b", "127.0.0.1:1", "-t", "e", "-p", "0", "--from", "0",
       "--store", uri, "--handler", "ledger", "--dry-run", NULL},
      {"replay", "-b", "127.0.0.1:1", "-t", "e", "-p", "0", "--from", "0",
       "--store", uri, "--handler", "ledger", NULL},
      {"replay", "-b", "127.0.0.1:1", "--from-dlq", "e.dlq", "--store", uri,
       "--handler", "ledger", "--dry-run", NULL},
      {"store", "rebuild", "-b", "127.0.0.1:1", "-t", "e", "--store", uri,
       "--handler", "ledger", "--dry-run", NULL},
      {"store", "reset", "-t", "e", "-p", "0", "--store", uri, NULL},
      {"store", "stats", "--store", uri, NULL},
  };
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for(runs[i], NULL, 0, 30000, &r);
    if (r.rc != 1 || !strstr(r.err, "database empty holds no keylane store"))
      fail_msg("keylane %s %s: exit %d, stderr: %s", runs[i][0], runs[i][1],
               r.rc, r.err);
    kl_t_run_free(&r);
    if (t_keylane_tables(uri) != 0)
      fail_msg("keylane %s %s created keylane's tables", runs[i][0],
               runs[i][1]);
  }

  /* store migrate on the empty database creates the schema. */
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"store", "migrate", "--store", uri, NULL}, NULL,
               0, 30000, &r);
  char want[64];
  snprintf(want, sizeof(want), "schema version 0 -> %d", KL__PG_SCHEMA_VERSION);
  if (r.rc != 0 || !strstr(r.out, want))
    fail_msg("store migrate: exit %d, stdout: %s, stderr: %s", r.rc, r.out,
             r.err);
  kl_t_run_free(&r);
  assert_true(t_keylane_tables(uri) > 0);
  /* and the others now open it */
  kl_t_run_for((const char *[]){"store", "reset", "-t", "e", "-p", "0",
                                "--store", uri, NULL},
               NULL, 0, 30000, &r);
  if (r.rc != 1 || !strstr(r.err, "has no partition of topic e"))
    fail_msg("store reset: exit %d, stderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_schema_is_created_but_by_migrate),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
