/*
 * The PostgreSQL store over TLS: the throwaway server with ssl=on and a CA
 * of its own, a database that refuses every session without TLS, and the
 * store URI from a --config file with sslmode=verify-full and the CA.
 * keylane store migrate and a worker applying an event on the embedded
 * cluster work there; a session without TLS is refused (the check is
 * real); a CA that did not sign the server's certificate fails with an
 * error that says so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "support/cluster.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/spawn.h"
#include "support/support.h"

static void write_conf(const char *path, const char *uri) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "# the store over TLS\nstore.uri = %s\n", uri);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
}

/* Every session of database "tls" must use TLS (the first line of
 * pg_hba.conf wins); kl_t_pg_tls() reloads it. */
static void require_tls(const kl_t_pg_t *pg) {
  char path[128], cmd[512];
  snprintf(path, sizeof(path), "%s/data/pg_hba.conf", pg->dir);
  snprintf(cmd, sizeof(cmd), "sed -i '1i hostnossl tls all all reject' '%s'",
           path);
  assert_int_equal(system(cmd), 0);
}

static void test_store_over_tls(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char plain[256], ca[128], other[128], uri[512], conf[128], dir[64];
  assert_int_equal(kl_t_pg_createdb(pg, "tls", plain, sizeof(plain)), 0);
  require_tls(pg);
  assert_int_equal(kl_t_pg_tls(pg, ca, other, sizeof(ca)), 0);
  kl_t_tmpdir(dir);
  snprintf(conf, sizeof(conf), "%s/store.conf", dir);

  /* without TLS the database refuses: the rule is in force */
  kl_t_run_t r;
  snprintf(uri, sizeof(uri), "%s?sslmode=disable", plain);
  write_conf(conf, uri);
  kl_t_run((const char *[]){"store", "migrate", "--config", conf, NULL}, NULL,
           0, &r);
  assert_int_not_equal(r.rc, 0);
  if (!strstr(r.err, "no encryption"))
    fail_msg("a session without TLS: %s", r.err);
  kl_t_run_free(&r);

  /* verify-full with the server's CA: migrate, then a worker applies */
  snprintf(uri, sizeof(uri), "%s?sslmode=verify-full&sslrootcert=%s", plain,
           ca);
  write_conf(conf, uri);
  kl_t_run((const char *[]){"store", "migrate", "--config", conf, NULL}, NULL,
           0, &r);
  if (r.rc != 0)
    fail_msg("migrate over TLS: %s", r.err);
  kl_t_run_free(&r);

  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "pgtls", 2, &cluster), KL_OK);
  const char *boot = kl_t_bootstrap(cluster), *topic = kl_t_topic(cluster);
  const char *ev = "{\"key\":\"acct-1\",\"type\":\"credit\",\"id\":\"c1\","
                   "\"payload\":{\"amount\":7,\"seq\":1}}\n";
  kl_t_run((const char *[]){"publish", "-b", boot, "-t", topic, NULL}, ev,
           strlen(ev), &r);
  assert_int_equal(r.rc, 0);
  kl_t_run_free(&r);
  const char *argv[] = {
      kl_t_bin(),  "worker", "--config", conf, "-b",
      boot,        "-t",     topic,      "-g", kl_t_group(cluster, "g"),
      "--handler", "ledger", NULL};
  pid_t pid = kl_t_spawn_worker(dir, 0, argv);
  int applied = kl_t_run_until(
      (const char *[]){"ledger", "--config", conf, "--json", NULL},
      "\"acct-1\":{\"balance\":7", 30000);
  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!applied) {
    char line[1024] = "";
    kl_t_log_find(dir, 0, "ERROR", line, sizeof(line));
    fail_msg("the worker on the TLS store applied nothing: %s", line);
  }
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  kl_t_cluster_destroy(cluster);

  /* a CA that did not sign the server's certificate */
  snprintf(uri, sizeof(uri), "%s?sslmode=verify-full&sslrootcert=%s", plain,
           other);
  write_conf(conf, uri);
  kl_t_run((const char *[]){"store", "stats", "--config", conf, NULL}, NULL, 0,
           &r);
  assert_int_not_equal(r.rc, 0);
  if (!strstr(r.err, "certificate verify failed"))
    fail_msg("a wrong CA says: %s", r.err);
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store_over_tls),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
