/*
 * The worker on a PostgreSQL store that refuses its writes:
 * - a role whose sessions are read-only (default_transaction_read_only),
 *   or that may not write keylane_partitions, cannot take the partitions
 *   it is assigned: `keylane worker` tries for worker.acquire.wait, then
 *   exits 3 naming the cause, with no "offset -1001 is out of the log";
 *   stopped by SIGTERM while it tries, it exits 0;
 * - sessions that turned read-only while it ran fail every commit: its
 *   /healthz turns 503 within seconds (not after worker.stall.ms), and
 *   once the role's setting is reverted the worker commits again by
 *   itself, its pool having replaced each session that failed that way
 *   (no backend killed by hand after the revert).
 * On the embedded cluster. Skips, saying why, when PostgreSQL is not
 * installed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/internal.h"
#include "keylane/embedded.h"
#include "support/http.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/spawn.h"
#include "support/sql.h"
#include "support/support.h"
#include "cli/metrics_server.h"

/* A database @p name of the group's server, its schema made by the
 * server's superuser, and role @p role (LOGIN, every privilege on the
 * schema's tables unless @p select_only) whose URI goes to @p uri. */
static PGconn *t_db_with_role(const char *name, const char *role,
                              int select_only, char *uri, size_t size) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char admin_uri[256], sql[256];
  assert_int_equal(kl_t_pg_createdb(pg, name, admin_uri, sizeof(admin_uri)), 0);
  kl_store_t *store;
  assert_int_equal(kl_store_open(admin_uri, NULL, &store), KL_OK);
  kl_store_destroy(store);
  PGconn *admin = PQconnectdb(admin_uri);
  assert_int_equal(PQstatus(admin), CONNECTION_OK);
  snprintf(sql, sizeof(sql), "CREATE ROLE %s LOGIN", role);
  kl_t_sql(admin, sql);
  snprintf(sql, sizeof(sql), "GRANT %s ON ALL TABLES IN SCHEMA public TO %s",
           select_only ? "SELECT" : "ALL", role);
  kl_t_sql(admin, sql);
  snprintf(sql, sizeof(sql),
           "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO %s", role);
  kl_t_sql(admin, sql);
  snprintf(uri, size, "postgresql://%s@127.0.0.1:%d/%s", role, pg->port, name);
  return admin;
}

/* `keylane worker` as @p role on @p uri: exits 3 within the bound,
 * naming the cause @p cause. */
static void t_worker_exits_unowned(const char *uri, const char *cause) {
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  const char *args[] = {"worker",
                        "-b",
                        kl_embedded_bootstrap(cluster),
                        "-t",
                        "events",
                        "--store",
                        uri,
                        "--handler",
                        "ledger",
                        "--session-timeout-ms",
                        "3000",
                        "-X",
                        "worker.acquire.wait=3s",
                        NULL};
  int64_t began = kl__mono_ns();
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  int64_t took_ms = (kl__mono_ns() - began) / 1000000;
  kl_embedded_destroy(cluster);
  if (r.rc != 3 || !strstr(r.err, "cannot take partition=") ||
      !strstr(r.err, "worker.acquire.wait") || !strstr(r.err, cause))
    fail_msg("want exit 3 naming \"%s\", got exit %d:\n%s", cause, r.rc, r.err);
  if (strstr(r.err, "-1001"))
    fail_msg("a partition it never took was reported out of the log:\n%s",
             r.err);
  /* 3 s of tries after the group's join; the bound, not a stall. */
  if (took_ms > 30000)
    fail_msg("exited after %lld ms:\n%s", (long long)took_ms, r.err);
  fprintf(stderr, "exit 3 after %lld ms, naming \"%s\"\n", (long long)took_ms,
          cause);
  kl_t_run_free(&r);
}

static void test_readonly_role_cannot_take(void **state) {
  (void)state;
  char uri[256];
  PGconn *admin = t_db_with_role("ro", "kl_ro", 0, uri, sizeof(uri));
  kl_t_sql(admin, "ALTER ROLE kl_ro SET default_transaction_read_only = on");
  t_worker_exits_unowned(uri, "read-only transaction");
  PQfinish(admin);
}

static void test_role_without_write_cannot_take(void **state) {
  (void)state;
  char uri[256];
  PGconn *admin = t_db_with_role("norw", "kl_norw", 1, uri, sizeof(uri));
  t_worker_exits_unowned(uri, "permission denied");
  PQfinish(admin);
}

static void test_sigterm_while_trying_exits_0(void **state) {
  (void)state;
  char uri[256], dir[64], line[1024];
  PGconn *admin = t_db_with_role("roterm", "kl_roterm", 0, uri, sizeof(uri));
  kl_t_sql(admin,
           "ALTER ROLE kl_roterm SET default_transaction_read_only = on");
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  kl_t_tmpdir(dir);
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        kl_embedded_bootstrap(cluster),
                        "-t",
                        "events",
                        "--store",
                        uri,
                        "--handler",
                        "ledger",
                        "--session-timeout-ms",
                        "3000",
                        NULL}; /* worker.acquire.wait: its 60 s */
  pid_t pid = kl_t_spawn_worker(dir, 0, argv);
  int trying = 0;
  for (int i = 0; i < 300 && !trying; i++) {
    trying = kl_t_log_find(dir, 0, "acquire partition=", line, sizeof(line));
    if (!trying)
      kl_t_sleep_ms(100);
  }
  kill(pid, SIGTERM);
  int64_t began = kl__mono_ns();
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  int64_t took_ms = (kl__mono_ns() - began) / 1000000;
  int stopped =
          kl_t_log_find(dir, 0, "not taking partition=", line, sizeof(line)),
      failed = kl_t_log_find(dir, 0, "cannot take", line, sizeof(line));
  kl_t_rmrf(dir);
  kl_embedded_destroy(cluster);
  PQfinish(admin);
  assert_true(trying);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !stopped || failed)
    fail_msg("SIGTERM while trying: status %d, \"not taking\" %s, "
             "\"cannot take\" %s",
             status, stopped ? "logged" : "missing",
             failed ? "logged" : "absent");
  if (took_ms > 15000) /* the session timeout bounds the leave */
    fail_msg("exited %lld ms after SIGTERM", (long long)took_ms);
}

/* GET /healthz until it answers @p want with @p needle in its body (NULL:
 * any), for up to @p ms. @returns the last answer's status, its body into
 * @p body. */
static int t_health(int port, int want, const char *needle, int ms, char *body,
                    size_t size) {
  int status = 0;
  for (int t = 0; t <= ms; t += 100) {
    kl_t_http_resp_t resp = {0};
    if (kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &resp) == 0) {
      status = resp.status;
      snprintf(body, size, "%s", resp.body ? resp.body : "");
    }
    kl_t_http_resp_free(&resp);
    if (status == want && (!needle || strstr(body, needle)))
      break;
    kl_t_sleep_ms(100);
  }
  return status;
}

static void t_publish(kl__ledger_gen_t *gen, kl_producer_t *producer, int n) {
  for (int i = 0; i < n; i++)
    assert_int_equal(kl__ledger_gen_publish(gen, producer, "events"), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
}

static void test_readonly_sessions_heal(void **state) {
  (void)state;
  char uri[256], body[1024];
  PGconn *admin = t_db_with_role("heal", "kl_heal", 0, uri, sizeof(uri));
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  const char *boot = kl_embedded_bootstrap(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(uri, NULL, &store), KL_OK);
  const char *extra[] = {"worker.session.timeout.ms=3000",
                         "worker.retry.initial.ms=50",
                         "worker.retry.max.ms=500", NULL};
  kl_t_worker_t *tw = kl_t_worker_start(boot, "events", "heal", store, extra);
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", boot);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, "events",
                                            tw->worker, store, &server),
                   KL_OK);
  int port = kl__metrics_server_port(server);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(8, 2, 7);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  t_publish(gen, producer, 20);
  assert_int_equal(kl_t_workers_applied(&tw, 1, 20, 30000), 20);
  assert_int_equal(t_health(port, 200, NULL, 5000, body, sizeof(body)), 200);

  /* The role turns read-only; its sessions are made anew (the setting
   * takes new sessions only): every commit fails from now on. */
  kl_t_sql(admin, "ALTER ROLE kl_heal SET default_transaction_read_only = on");
  kl_t_sql(admin, "SELECT count(pg_terminate_backend(pid)) FROM "
                  "pg_stat_activity WHERE usename = 'kl_heal'");
  t_publish(gen, producer, 20);
  int64_t began = kl__mono_ns();
  int status =
      t_health(port, 503, "group commits failed", 20000, body, sizeof(body));
  int64_t took_ms = (kl__mono_ns() - began) / 1000000;
  if (status != 503 || !strstr(body, "group commits failed") ||
      !strstr(body, "read-only"))
    fail_msg("/healthz answered %d after %lld ms, want 503 naming the "
             "failed commits: %s",
             status, (long long)took_ms, body);
  fprintf(stderr,
          "/healthz 503 %lld ms after the sessions turned "
          "read-only: %s",
          (long long)took_ms, body);

  /* Reverted, and no backend killed: the worker commits again. */
  kl_t_sql(admin, "ALTER ROLE kl_heal RESET default_transaction_read_only");
  began = kl__mono_ns();
  uint64_t applied = kl_t_workers_applied(&tw, 1, 40, 30000);
  took_ms = (kl__mono_ns() - began) / 1000000;
  if (applied != 40)
    fail_msg("applied %llu of 40 in %lld ms after the revert: the pool "
             "kept its read-only sessions",
             (unsigned long long)applied, (long long)took_ms);
  fprintf(stderr, "all applied %lld ms after the revert\n", (long long)took_ms);
  assert_int_equal(t_health(port, 200, NULL, 10000, body, sizeof(body)), 200);
  kl__ledger_verdict_t verdict;
  assert_int_equal(kl__ledger_gen_verify(gen, store, "events", &verdict),
                   KL_OK);
  assert_true(verdict.ok);

  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(tw), KL_OK);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_conf_destroy(conf);
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  PQfinish(admin);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_readonly_role_cannot_take),
      cmocka_unit_test(test_role_without_write_cannot_take),
      cmocka_unit_test(test_sigterm_while_trying_exits_0),
      cmocka_unit_test(test_readonly_sessions_heal),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
