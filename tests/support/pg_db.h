/*
 * A fresh database of the group's server (support/pg_group.h) per test,
 * for the PostgreSQL store's test programs: pass kl_t_pg_db_setup and
 * kl_t_pg_db_teardown to each test. The state starts with the store
 * contract's fixture (support/store_contract.h), whose where is the
 * database's URI.
 */
#ifndef KEYLANE_TESTS_SUPPORT_PG_DB_H
#define KEYLANE_TESTS_SUPPORT_PG_DB_H

#include <libpq-fe.h>

#include "support/store_contract.h"

typedef struct kl_t_pg_db {
  kl_t_store_fixture_t fx; /* first, for the contract; where = the db URI */
  PGconn *admin; /* a connection of the test's own, to the test's db */
} kl_t_pg_db_t;

/** Makes the database; without a server leaves *state NULL (the tests
 *  skip). */
int kl_t_pg_db_setup(void **state);

/** Closes the admin connection and puts the store's clocks back. */
int kl_t_pg_db_teardown(void **state);

/** Ends every connection to @p admin's database but @p admin: what the
 *  stores hold breaks, without asking a txn for its connection. */
void kl_t_pg_terminate_others(PGconn *admin);

#endif
