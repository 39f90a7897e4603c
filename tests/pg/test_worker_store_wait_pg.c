/*
 * A worker started before its PostgreSQL store can serve it (here: the
 * database is created after the worker starts, as a server that comes up
 * after the worker would be, then its schema by `keylane store migrate`)
 * waits for it, logging each try with the cause (worker.store.wait), and once
 * the store answers takes its partitions and runs; SIGTERM then exits 0. On the
 * embedded cluster. Skips, saying why, when PostgreSQL is not installed.
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

#include "keylane/embedded.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/spawn.h"
#include "support/support.h"

/* Waits (60 s at most) for a line holding @p needle in worker 0's log. */
static void t_await_log(const char *dir, const char *needle) {
  char line[2048];
  for (int i = 0; i < 600; i++) {
    if (kl_t_log_find(dir, 0, needle, line, sizeof(line)))
      return;
    kl_t_sleep_ms(100);
  }
  fail_msg("no \"%s\" in %s/worker-0.log", needle, dir);
}

static void test_worker_waits_for_the_store(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  char dir[64], uri[256];
  kl_t_tmpdir(dir);
  snprintf(uri, sizeof(uri), "postgresql://keylane@127.0.0.1:%d/late",
           pg->port);
  const char *argv[] = {
      kl_t_bin(),     "worker", "-b",        kl_embedded_bootstrap(cluster),
      "-t",           "events", "-g",        "g-late",
      "--store",      uri,      "--handler", "ledger",
      "--store-wait", "1m",     NULL};
  pid_t pid = kl_t_spawn_worker(dir, 0, argv);
  t_await_log(dir, "(try 1)");
  t_await_log(dir, "database \"late\" does not exist");
  char made[256];
  assert_int_equal(kl_t_pg_createdb(pg, "late", made, sizeof(made)), 0);
  /* A worker creates no schema (store.pg.migrate=never): it waits for the
   * migration as it waited for the database. */
  t_await_log(dir, "`keylane store migrate --store URI`");
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "migrate", "--store", made, NULL}, NULL, 0,
           &r);
  assert_int_equal(r.rc, 0);
  kl_t_run_free(&r);
  t_await_log(dir, "assigned partition=");
  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char line[2048] = "";
    kl_t_log_find(dir, 0, "keylane worker:", line, sizeof(line));
    fail_msg("the worker ended with status 0x%x: %s", status, line);
  }
  kl_t_rmrf(dir);
  kl_embedded_destroy(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_waits_for_the_store),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
