/*
 * How keylane's PostgreSQL sessions look from both ends: they are named
 * keylane-ROLE-INSTANCE in pg_stat_activity unless the URI names them;
 * the server's notices and warnings, and libpq's errors that span lines,
 * reach the log as log lines, one each; a URI libpq cannot read is said
 * to be so, with no connect timeout that played no part; and the
 * doctor's store-version check fails for a schema whose version row says
 * current while a column keylane needs was dropped. Skips, saying why,
 * when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/log.h"
#include "keylane/store.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "support/support.h"
#include "store/pg.h"
#include "worker/checks.h"

static void t_db(const char *name, char *uri, size_t size) {
  assert_int_equal(kl_t_pg_createdb(kl_t_pg_need(), name, uri, size), 0);
}

static void test_application_name(void **state) {
  (void)state;
  char uri[256], named[320];
  t_db("appname", uri, sizeof(uri));
  PGconn *admin = PQconnectdb(uri);
  assert_int_equal(PQstatus(admin), CONNECTION_OK);
  kl__pg_set_application("worker", "w-7");
  kl_store_t *store;
  assert_int_equal(kl_store_open(uri, NULL, &store), KL_OK);
  assert_true(kl_t_sql(admin, "SELECT count(*) FROM pg_stat_activity WHERE "
                              "application_name = 'keylane-worker-w-7'") >= 1);
  kl_store_destroy(store);
  /* The URI's own name wins. */
  snprintf(named, sizeof(named), "%s?application_name=billing", uri);
  assert_int_equal(kl_store_open(named, NULL, &store), KL_OK);
  assert_true(kl_t_sql(admin, "SELECT count(*) FROM pg_stat_activity WHERE "
                              "application_name = 'billing'") >= 1);
  kl_store_destroy(store);
  kl__pg_set_application("cli", NULL);
  PQfinish(admin);
}

/* Fails unless every line of @p log is a log line (it starts with the
 * year of its timestamp and names its level). */
static void t_assert_log_lines(const char *log) {
  for (const char *line = log; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len && (strncmp(line, "20", 2) != 0 || !memchr(line, ':', len)))
      fail_msg("a line outside the log's format: \"%.*s\" in:\n%s", (int)len,
               line, log);
    line += len + (end != NULL);
  }
}

static void test_notices_and_errors_are_log_lines(void **state) {
  (void)state;
  char uri[256];
  t_db("notices", uri, sizeof(uri));
  PGconn *pg;
  assert_int_equal(kl__pg_connect(uri, 10, KL_ESTORE, &pg), KL_OK);
  kl_t_stderr_t capture;
  kl_t_stderr_begin(&capture);
  PQclear(PQexec(pg, "DO $$BEGIN RAISE NOTICE 'two%lines', E'\\n'; "
                     "RAISE WARNING 'careful'; END$$"));
  /* A store error that spans lines, as libpq's do, logged as the outbox
   * and the lanes log them. */
  PGresult *res = PQexec(pg, "SELECT 1/0 FROM nowhere");
  kl_err_t err = kl__pg_err(pg, res, "read nowhere");
  PQclear(res);
  assert_int_equal(err, KL_ESTORE);
  KL_LOG_W("worker", "reading the outbox failed: %s", kl_err_detail());
  KL_LOG_W("worker", "raw: first\nsecond\r\tthird");
  char *log = kl_t_stderr_end(&capture);
  PQfinish(pg);
  if (!strstr(log, "INFO [") || !strstr(log, "postgresql says: NOTICE:  two"
                                             "\\x0alines"))
    fail_msg("the notice is not an INFO log line:\n%s", log);
  if (!strstr(log, "WARN [") || !strstr(log, "postgresql says: WARNING:  "
                                             "careful"))
    fail_msg("the warning is not a WARN log line:\n%s", log);
  if (!strstr(log, "raw: first\\x0asecond\\x0d\\x09third"))
    fail_msg("the newlines are not escaped:\n%s", log);
  t_assert_log_lines(log);
  free(log);
}

static void test_unreadable_uri_says_so(void **state) {
  (void)state;
  kl_store_t *store;
  assert_int_equal(
      kl_store_open("postgresql://127.0.0.1:1/x?bogus=1", NULL, &store),
      KL_ESTORE);
  const char *detail = kl_err_detail();
  if (!strstr(detail, "cannot read the store location: invalid URI query "
                      "parameter: \"bogus\"") ||
      strstr(detail, "connect timeout"))
    fail_msg("%s", detail);
  assert_int_equal(kl_store_open("host=127.0.0.1 port", NULL, &store),
                   KL_ESTORE);
  assert_non_null(strstr(kl_err_detail(), "missing \"=\" after \"port\""));
}

static void test_doctor_sees_a_dropped_column(void **state) {
  (void)state;
  char uri[256];
  t_db("dropped", uri, sizeof(uri));
  kl_store_t *store;
  assert_int_equal(kl_store_open(uri, NULL, &store), KL_OK);
  kl__check_t c;
  kl__check_store_version(store, "the store", &c);
  if (c.status != KL__CHECK_OK)
    fail_msg("%s", c.msg);
  PGconn *admin = PQconnectdb(uri);
  kl_t_sql(admin, "ALTER TABLE keylane_partitions DROP COLUMN last_ident_wm");
  kl_t_sql(admin, "ALTER TABLE keylane_outbox RENAME COLUMN rec TO payload");
  PQfinish(admin);
  kl__check_store_version(store, "the store", &c);
  if (c.status != KL__CHECK_FAIL ||
      !strstr(c.msg, "lacks columns keylane needs: "
                     "keylane_outbox.rec, keylane_partitions.last_ident_wm"))
    fail_msg("%s", c.msg);
  kl_store_destroy(store);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_application_name),
      cmocka_unit_test(test_notices_and_errors_are_log_lines),
      cmocka_unit_test(test_unreadable_uri_says_so),
      cmocka_unit_test(test_doctor_sees_a_dropped_column),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
