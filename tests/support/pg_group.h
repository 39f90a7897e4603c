/*
 * One throwaway PostgreSQL server (support/pg.h) per cmocka test program:
 * pass kl_t_pg_group_setup and kl_t_pg_group_teardown to
 * cmocka_run_group_tests(). Without PostgreSQL installed the group still
 * runs, and every test that needs the server skips, saying why: ctest
 * reports the program as skipped, and under KEYLANE_TEST_REQUIRE=postgresql
 * (make test) those tests fail instead (support/skips.h).
 */
#ifndef KEYLANE_TESTS_SUPPORT_PG_GROUP_H
#define KEYLANE_TESTS_SUPPORT_PG_GROUP_H

#include "support/pg.h"

int kl_t_pg_group_setup(void **state);
int kl_t_pg_group_teardown(void **state);

/** kl_t_pg_group_setup() with a KL_T_PG_RESTARTABLE server, for programs
 *  that restart it (kl_t_pg_restart()). */
int kl_t_pg_group_setup_restartable(void **state);

/** The group's server, or NULL when it did not start. */
kl_t_pg_t *kl_t_pg_group(void);

/** The group's server; skips the running test when it did not start. */
kl_t_pg_t *kl_t_pg_need(void);

#endif
