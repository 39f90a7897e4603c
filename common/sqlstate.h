/*
 * The one classification of PostgreSQL's SQLSTATEs keylane makes: which
 * failures may pass when the same work runs again. The PostgreSQL store
 * maps them to KL_ESTORE_BUSY (store/pg.c), the built-in handlers that run
 * SQL on the batch's connection to KL_HANDLER_RETRY (handlers/inventory.c):
 * one list, so that a lock timeout the store retries is never a dead
 * letter in a handler. A second list tells what a person fixes (a revoked
 * privilege): the handlers retry that too, as the store does every
 * failure of its own statements. Plain strings, no libpq: common/ links
 * nothing.
 */
#ifndef KEYLANE_COMMON_SQLSTATE_H
#define KEYLANE_COMMON_SQLSTATE_H

/**
 * @returns nonzero when @p state (a five-character SQLSTATE, or NULL) is
 * transient: a connection exception (class 08), insufficient resources
 * (class 53: too many connections, out of memory or disk), a serialization
 * failure or deadlock, a lock or statement timeout, an administrator's or
 * a crash's termination, a server still starting, an idle session timed
 * out. A lost link that left no SQLSTATE is the caller's to add (libpq's
 * PQstatus()).
 */
int kl__sqlstate_transient(const char *state);

/**
 * @returns nonzero when @p state tells of the setup rather than of the
 * work: a privilege the role lacks (42501), a table or column that is not
 * there (42P01, 42703), a read-only transaction (25006). A person fixes
 * those without the work changing, so what failed on them is run again
 * after a backoff, never dead-lettered: every event would be.
 */
int kl__sqlstate_setup(const char *state);

#endif
