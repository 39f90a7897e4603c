/*
 * The one classification of PostgreSQL's SQLSTATEs keylane makes: which
 * failures may pass when the same work runs again. The PostgreSQL store
 * maps them to KL_ESTORE_BUSY (store/pg.c), the built-in handlers that run
 * SQL on the batch's connection to KL_HANDLER_RETRY (handlers/inventory.c):
 * one list, so that a lock timeout the store retries is never a dead
 * letter in a handler. A second list tells what a person fixes (a revoked
 * privilege): the handlers answer KL__HANDLER_STORE for those, and the
 * worker treats them as it treats a failure of the store's own statements.
 * Plain strings, no libpq: common/ links nothing.
 */
#ifndef KEYLANE_COMMON_SQLSTATE_H
#define KEYLANE_COMMON_SQLSTATE_H

/**
 * A built-in handler's verdict beyond the public three (kl_handler_result_t):
 * the event's SQL failed for the store's setup (kl__sqlstate_setup()), not
 * for the event. The worker takes it as a failure of the store
 * (worker/apply.c): the event runs again after a backoff and counts no
 * attempt toward worker.max.attempts, its partition commits nothing past
 * it meanwhile, and /healthz turns 503 with the handler's reason; once a
 * person fixed the setup, the event applies. Never a dead letter: every
 * event would be one.
 */
#define KL__HANDLER_STORE 3

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
 * after a backoff, never dead-lettered: every event would be
 * (KL__HANDLER_STORE).
 */
int kl__sqlstate_setup(const char *state);

#endif
