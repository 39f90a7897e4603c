/* SQL from a test, on a connection to a throwaway server (support/pg.h). */
#ifndef KEYLANE_TESTS_SUPPORT_SQL_H
#define KEYLANE_TESTS_SUPPORT_SQL_H

#include <libpq-fe.h>

/**
 * Runs @p sql on @p pg; a failure fails the test, naming the statement.
 * @returns the first column of the first row as a number, 0 when there is
 *          none.
 */
long long kl_t_sql(PGconn *pg, const char *sql);

#endif
