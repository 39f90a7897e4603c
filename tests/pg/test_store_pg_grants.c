/*
 * docs/production.md's PostgreSQL roles, run as written: its ```sql block
 * (an owner role, a worker role with row rights only, default privileges)
 * on a throwaway server, then `keylane store migrate` as the owner, and a
 * ledger worker as the worker role on the embedded cluster applies a
 * credit and a transfer, whose follow-up goes through the outbox (its
 * sequence) and credits the other key. A grant the workers need and the
 * page lacks fails this test. Skips when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "keylane/embedded.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/source.h"
#include "support/spawn.h"
#include "support/sql.h"
#include "support/support.h"

static PGconn *t_connect(const kl_t_pg_t *pg, const char *db) {
  char uri[256];
  snprintf(uri, sizeof(uri), "postgresql://keylane@127.0.0.1:%d/%s", pg->port,
           db); /* the server's superuser (support/pg.c) */
  PGconn *conn = PQconnectdb(uri);
  if (PQstatus(conn) != CONNECTION_OK)
    fail_msg("connect to %s: %s", uri, PQerrorMessage(conn));
  return conn;
}

/* Runs the page's first ```sql block as psql would: statements end with
 * ';' at a line's end, "--" lines are comments, "\c DB" connects to DB. */
static void t_run_page_sql(const kl_t_pg_t *pg) {
  char *page = kl_t_source_file("docs/production.md");
  char *block = strstr(page, "```sql\n");
  assert_non_null(block);
  block += strlen("```sql\n");
  char *end = strstr(block, "\n```");
  assert_non_null(end);
  *end = '\0';
  PGconn *conn = t_connect(pg, "postgres");
  kl__strbuf_t stmt = KL__STRBUF_INIT;
  int statements = 0;
  for (char *line = strtok(block, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "--", 2) == 0)
      continue;
    if (strncmp(line, "\\c ", 3) == 0) {
      PQfinish(conn);
      conn = t_connect(pg, line + 3);
      continue;
    }
    kl__strbuf_printf(&stmt, "%s\n", line);
    size_t len = strlen(line);
    if (len && line[len - 1] == ';') {
      kl_t_sql(conn, stmt.data);
      statements++;
      kl__strbuf_free(&stmt);
    }
  }
  assert_int_equal(stmt.len, 0); /* no statement left unfinished */
  assert_true(statements >= 6);
  PQfinish(conn);
  free(page);
}

static void test_page_grants_run_a_worker(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  t_run_page_sql(pg);
  char owner[256], worker[256];
  snprintf(owner, sizeof(owner),
           "postgresql://keylane_owner@127.0.0.1:%d/keylane", pg->port);
  snprintf(worker, sizeof(worker),
           "postgresql://keylane_worker@127.0.0.1:%d/keylane", pg->port);
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"store", "migrate", "--store", owner, NULL},
               NULL, 0, 60000, &r);
  if (r.rc != 0)
    fail_msg("store migrate as keylane_owner: exit %d: %s", r.rc, r.err);
  kl_t_run_free(&r);

  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  const char *b = kl_embedded_bootstrap(cluster);
  static const char events[] =
      "{\"key\":\"acct-a\",\"type\":\"credit\",\"id\":\"g-1\","
      "\"payload\":{\"amount\":10,\"seq\":1}}\n"
      "{\"key\":\"acct-a\",\"type\":\"transfer\",\"id\":\"g-2\","
      "\"payload\":{\"to\":\"acct-b\",\"amount\":4,\"seq\":2}}\n";
  kl_t_run_for((const char *[]){"publish", "-b", b, "-t", "events", NULL},
               events, strlen(events), 60000, &r);
  assert_int_equal(r.rc, 0);
  kl_t_run_free(&r);
  char dir[64];
  kl_t_tmpdir(dir);
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        b,
                        "-t",
                        "events",
                        "--store",
                        worker,
                        "--handler",
                        "ledger",
                        "--session-timeout-ms",
                        "3000",
                        NULL};
  pid_t pid = kl_t_spawn_worker(dir, 0, argv);
  int applied = kl_t_run_until(
      (const char *[]){"ledger", "--store", worker, NULL}, "acct-b\t4", 60000);
  char line[1024] = "";
  int denied = kl_t_log_find(dir, 0, "permission denied", line, sizeof(line));
  kill(pid, SIGTERM);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  kl_t_rmrf(dir);
  kl_embedded_destroy(cluster);
  if (!applied || denied)
    fail_msg("the worker role of docs/production.md did not apply the "
             "transfer and its follow-up%s%s",
             denied ? ": " : "", line);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_page_grants_run_a_worker),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
