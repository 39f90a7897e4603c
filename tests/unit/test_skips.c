/*
 * A test that skips is not a test that passed (support/skips.h): this
 * program runs itself as a child, whose tests pass, skip for want of
 * PostgreSQL, or fail, and checks the child's exit status and words.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/pg.h"
#include "support/skips.h"
#include "support/support.h"

/* ---- the child's tests ------------------------------------------------- */

static void child_passes(void **state) {
  assert_true(1);
}

/* What a pg test does when the server cannot start. */
static void child_needs_postgresql(void **state) {
  char why[1024];
  kl_t_pg_t *pg = kl_t_pg_start(0, why, sizeof(why));
  if (!pg) {
    fprintf(stderr, "skipped: %s\n", why);
    skip();
  }
  kl_t_pg_stop(pg);
  fail_msg("PostgreSQL started from KEYLANE_PG_BIN=%s",
           getenv("KEYLANE_PG_BIN"));
}

static void child_fails(void **state) {
  fail_msg("this child test fails on purpose");
}

static int kl_child(const char *mode) {
  const struct CMUnitTest pass_skip[] = {
      cmocka_unit_test(child_passes),
      cmocka_unit_test(child_needs_postgresql),
  };
  const struct CMUnitTest fail_skip[] = {
      cmocka_unit_test(child_needs_postgresql),
      cmocka_unit_test(child_fails),
  };
  const struct CMUnitTest pass[] = {cmocka_unit_test(child_passes)};
  if (strcmp(mode, "pass-skip") == 0)
    return cmocka_run_group_tests(pass_skip, NULL, NULL);
  if (strcmp(mode, "fail-skip") == 0)
    return cmocka_run_group_tests(fail_skip, NULL, NULL);
  return cmocka_run_group_tests(pass, NULL, NULL);
}

/* ---- the parent -------------------------------------------------------- */

/* Runs this program as a child in @p mode, with KEYLANE_TEST_REQUIRE set
 * to @p require (NULL: unset) and a PostgreSQL that cannot start; its
 * output goes to @p out (4096). @returns its exit status, -1 if it did not
 * exit. */
static int kl_run_child(const char *mode, const char *require, char *out) {
  char dir[64], log[96];
  kl_t_tmpdir(dir);
  snprintf(log, sizeof(log), "%s/out", dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("KL_T_SKIPS_CHILD", mode, 1);
    setenv("KEYLANE_PG_BIN", "/nonexistent/keylane-test", 1);
    if (require)
      setenv("KEYLANE_TEST_REQUIRE", require, 1);
    else
      unsetenv("KEYLANE_TEST_REQUIRE");
    execl("/proc/self/exe", "test_skips", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  FILE *f = fopen(log, "r");
  size_t n = f ? fread(out, 1, 4095, f) : 0;
  out[n] = '\0';
  if (f)
    fclose(f);
  kl_t_rmrf(dir);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_a_skip_is_not_a_pass(void **state) {
  char out[4096];
  assert_int_equal(kl_run_child("pass-skip", NULL, out), KL_T_SKIP_CODE);
  assert_non_null(strstr(out, "[  PASSED  ] 1 test(s)."));
  assert_non_null(strstr(out, "[  SKIPPED ] child_needs_postgresql"));
  assert_int_equal(kl_run_child("pass", NULL, out), 0);
}

static void test_a_failure_outranks_a_skip(void **state) {
  char out[4096];
  assert_int_equal(kl_run_child("fail-skip", NULL, out), 1);
  assert_non_null(strstr(out, "[  FAILED  ] child_fails"));
}

static void test_a_required_thing_missing_fails(void **state) {
  char out[4096];
  assert_int_equal(kl_run_child("pass-skip", "wrk,postgresql", out), 1);
  assert_non_null(strstr(out, "[  FAILED  ] child_needs_postgresql"));
  assert_non_null(strstr(out, "postgresql is missing, and "
                              "KEYLANE_TEST_REQUIRE=wrk,postgresql requires "
                              "it"));
  /* Only what the list names: a prefix or another name is not it. */
  assert_int_equal(kl_run_child("pass-skip", "postgres,wrk", out),
                   KL_T_SKIP_CODE);
}

int main(void) {
  const char *child = getenv("KL_T_SKIPS_CHILD");
  if (child)
    return kl_child(child);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_skip_is_not_a_pass),
      cmocka_unit_test(test_a_failure_outranks_a_skip),
      cmocka_unit_test(test_a_required_thing_missing_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
