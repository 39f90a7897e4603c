/*
 * keylane worker at start, with a PostgreSQL store that does not answer
 * (a port nobody listens on; no server and no Kafka needed: the store is
 * opened first): it tries again with backoff for worker.store.wait,
 * logging each try with the store (its password masked) and the cause,
 * then exits 1 naming the store, the cause and the key; --store-wait 0
 * tries once; a location that does not read is not waited for; a SIGTERM
 * while it waits exits 0. tests/pg/test_worker_store_wait_pg.c shows the
 * wait end when the store comes up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "support/run.h"

#define T_STORE "postgresql://kl:Pw-s3cr3t-71@127.0.0.1:1/x"

static int t_count(const char *s, const char *needle) {
  int n = 0;
  for (; (s = strstr(s, needle)) != NULL; s++)
    n++;
  return n;
}

static double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* keylane worker on @p store with --store-wait @p wait; SIGTERM after
 * @p term_ms when > 0. */
static void t_worker(const char *store, const char *wait, int term_ms,
                     kl_t_run_t *r) {
  const char *args[] = {
      "worker",  "-b",           "127.0.0.1:1", "-t",     "t",
      "--store", store,          "--handler",   "ledger", "--kafka-wait",
      "0",       "--store-wait", wait,          NULL};
  if (term_ms > 0)
    kl_t_run_term(args, term_ms, 30000, r);
  else
    kl_t_run_for(args, NULL, 0, 30000, r);
}

static void test_waits_then_exits_1(void **state) {
  (void)state;
  kl_t_run_t r;
  double t0 = t_now();
  t_worker(T_STORE, "3s", 0, &r);
  double took = t_now() - t0;
  const char *retry = "cannot open the store "
                      "postgresql://kl:****@127.0.0.1:1/x (try ";
  if (r.rc != 1 || t_count(r.err, retry) < 2 ||
      !strstr(r.err, "Connection refused") ||
      !strstr(r.err, "(worker.store.wait, --store-wait)") ||
      !strstr(r.err, "ms (worker.store.wait, --store-wait)\n") ||
      strstr(r.err, "Pw-s3cr3t-71") || took < 2.5)
    fail_msg("exit %d after %.1f s, want 1 after 3 s of tries:\n%s", r.rc, took,
             r.err);
  kl_t_run_free(&r);
}

static void test_wait_0_tries_once(void **state) {
  (void)state;
  kl_t_run_t r;
  t_worker(T_STORE, "0", 0, &r);
  if (r.rc != 1 || strstr(r.err, "(try ") || strstr(r.err, "tried ") ||
      !strstr(r.err, "keylane worker: cannot open the store "
                     "postgresql://kl:****@127.0.0.1:1/x: ") ||
      !strstr(r.err, "Connection refused"))
    fail_msg("exit %d, want 1 at the first try:\n%s", r.rc, r.err);
  kl_t_run_free(&r);
}

static void test_unreadable_location_not_waited_for(void **state) {
  (void)state;
  kl_t_run_t r;
  double t0 = t_now();
  t_worker("postgresql://127.0.0.1:1/x?bogus=1", "1m", 0, &r);
  if (r.rc != 1 || strstr(r.err, "(try ") || t_now() - t0 > 10 ||
      !strstr(r.err, "cannot read the store location"))
    fail_msg("exit %d, want 1 at once:\n%s", r.rc, r.err);
  kl_t_run_free(&r);
}

static void test_sigterm_ends_the_wait(void **state) {
  (void)state;
  kl_t_run_t r;
  t_worker(T_STORE, "1m", 2000, &r);
  if (r.rc != 0 || !strstr(r.err, "(try 1)"))
    fail_msg("exit %d, want 0 after SIGTERM while waiting:\n%s", r.rc, r.err);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_waits_then_exits_1),
      cmocka_unit_test(test_wait_0_tries_once),
      cmocka_unit_test(test_unreadable_location_not_waited_for),
      cmocka_unit_test(test_sigterm_ends_the_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
