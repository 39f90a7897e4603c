/*
 * Tests that skip are counted as skipped, never as passed.
 *
 * cmocka's skip() lets a program exit 0, so ctest would count a test that
 * ran nothing as passed. Every cmocka program of tests/ is linked with
 * -Wl,--wrap=_skip,--wrap=_cmocka_run_group_tests (tests/CMakeLists.txt),
 * which routes both through skips.c:
 *  - a program in which a test skipped and none failed exits
 *    KL_T_SKIP_CODE, ctest's SKIP_RETURN_CODE: "Not Run (Skipped)";
 *  - a test that skips after kl_t_missing() recorded something it needs
 *    that KEYLANE_TEST_REQUIRE names (a comma-separated list, e.g.
 *    "postgresql"; `make test` sets it) fails instead, saying what is
 *    missing, why, and how to get it.
 *
 * kl_t_missing() has no cmocka in it (require.c): the benchmark links the
 * fixtures that call it.
 */
#ifndef KEYLANE_TESTS_SUPPORT_SKIPS_H
#define KEYLANE_TESTS_SUPPORT_SKIPS_H

/** The exit status of a program in which a test skipped and none failed
 * (the automake convention, which ctest's SKIP_RETURN_CODE takes). */
#define KL_T_SKIP_CODE 77

/**
 * Records that @p need (e.g. "postgresql") is missing, and @p why (how to
 * get it). Call it where a fixture finds out, before the test skips.
 * Only the first missing thing that KEYLANE_TEST_REQUIRE names is kept.
 */
void kl_t_missing(const char *need, const char *why);

/**
 * The first missing thing KEYLANE_TEST_REQUIRE names, or NULL; @p why is
 * set to what kl_t_missing() was told. Valid for the program's life.
 */
const char *kl_t_missing_required(const char **why);

#endif
