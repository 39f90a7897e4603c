/*
 * keylane worker on a PostgreSQL database without keylane's schema: it
 * created the schema itself, though docs/production.md says the worker's
 * role never creates anything (issue 39's second attack, MEDIUM-5). It
 * now refuses, exit 1, naming `keylane store migrate` and
 * store.pg.migrate, and leaves the database as it was; with
 * -X store.pg.migrate=auto it creates the schema, as before. Skips,
 * saying why, when PostgreSQL is not installed.
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
#include "support/support.h"

/* Whether the database at @p uri holds keylane's schema. */
static int t_has_schema(const char *uri) {
  PGconn *pg = PQconnectdb(uri);
  assert_int_equal(PQstatus(pg), CONNECTION_OK);
  long long has = kl_t_sql(pg, "SELECT (to_regclass('keylane_schema_version') "
                               "IS NOT NULL)::int");
  PQfinish(pg);
  return (int)has;
}

static void test_worker_refuses_an_unmigrated_database(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "unmigrated", uri, sizeof(uri)), 0);
  const char *args[] = {
      "worker",  "-b", "127.0.0.1:1", "-t",     "events",       "-g", "g",
      "--store", uri,  "--handler",   "ledger", "--store-wait", "0",  NULL};
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 30000, &r);
  if (r.rc != 1 || !strstr(r.err, "keylane store migrate --store URI") ||
      !strstr(r.err, "store.pg.migrate"))
    fail_msg("a worker on an empty database: exit %d, stderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
  assert_int_equal(t_has_schema(uri), 0);

  /* Allowed: it creates the schema, then reaches for Kafka (there is
   * none at 127.0.0.1:1) until SIGTERM. */
  const char *auto_args[] = {"worker",
                             "-b",
                             "127.0.0.1:1",
                             "-t",
                             "events",
                             "-g",
                             "g",
                             "--store",
                             uri,
                             "--handler",
                             "ledger",
                             "-X",
                             "store.pg.migrate=auto",
                             NULL};
  kl_t_run_term(auto_args, 3000, 30000, &r);
  if (!t_has_schema(uri))
    fail_msg("-X store.pg.migrate=auto: exit %d, no schema; stderr: %s", r.rc,
             r.err);
  kl_t_run_free(&r);

  /* Migrated: the default opens it. */
  kl_t_run_term(args, 3000, 30000, &r);
  if (strstr(r.err, "no keylane schema"))
    fail_msg("a migrated database refused: %s", r.err);
  kl_t_run_free(&r);

  /* An older schema (its last migration's record taken away): refused at
   * once, whatever store.pg.migrate says, naming the same command. */
  PGconn *admin = PQconnectdb(uri);
  assert_int_equal(PQstatus(admin), CONNECTION_OK);
  kl_t_sql(admin, "DELETE FROM keylane_schema_version WHERE version = "
                  "(SELECT max(version) FROM keylane_schema_version)");
  PQfinish(admin);
  for (int i = 0; i < 2; i++) {
    kl_t_run_for(i ? auto_args : args, NULL, 0, 30000, &r);
    if (r.rc != 1 || !strstr(r.err, "keylane store migrate"))
      fail_msg("an older schema%s: exit %d, stderr: %s",
               i ? " with store.pg.migrate=auto" : "", r.rc, r.err);
    kl_t_run_free(&r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_refuses_an_unmigrated_database),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
