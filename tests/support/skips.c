/*
 * The --wrap targets of skips.h: __wrap__skip() stands for cmocka's
 * _skip(), which skip() calls, and __wrap__cmocka_run_group_tests() for
 * the function cmocka_run_group_tests() calls. Only programs linked with
 * those --wrap options reference them, so only they pull this file in.
 */
#include "support/skips.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

void __real__skip(const char *const file, const int line);
int __real__cmocka_run_group_tests(const char *group_name,
                                   const struct CMUnitTest *const tests,
                                   const size_t num_tests,
                                   CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);
void __wrap__skip(const char *const file, const int line);
int __wrap__cmocka_run_group_tests(const char *group_name,
                                   const struct CMUnitTest *const tests,
                                   const size_t num_tests,
                                   CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown);

static int kl_skipped;

void __wrap__skip(const char *const file, const int line) {
  const char *why;
  const char *need = kl_t_missing_required(&why);
  if (need) {
    print_error("[  ERROR   ] --- %s is missing, and KEYLANE_TEST_REQUIRE=%s "
                "requires it, so this test fails instead of skipping: %s\n",
                need, getenv("KEYLANE_TEST_REQUIRE"), why);
    _fail(file, line);
  }
  kl_skipped = 1;
  __real__skip(file, line);
}

int __wrap__cmocka_run_group_tests(const char *group_name,
                                   const struct CMUnitTest *const tests,
                                   const size_t num_tests,
                                   CMFixtureFunction group_setup,
                                   CMFixtureFunction group_teardown) {
  int failed = __real__cmocka_run_group_tests(group_name, tests, num_tests,
                                              group_setup, group_teardown);
  return failed ? failed : kl_skipped ? KL_T_SKIP_CODE : 0;
}
