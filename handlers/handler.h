/* Resolving `--handler SPEC` to a handler function. */
#ifndef KEYLANE_HANDLERS_HANDLER_H
#define KEYLANE_HANDLERS_HANDLER_H

#include "keylane/store.h"
#include "keylane/worker.h"

typedef struct kl_handler_ref {
  kl_handler_fn_t *fn;
  void *opaque;
  void *dl; /* dlopen() handle of an "so:" handler, or NULL */
  /* 1 for the built-in handlers, whose only effects are the store's
   * writes: a dry run may run them. 0 for exec: and so:, which may act
   * outside the store: a dry run never calls them. */
  int store_only;
  /* 1 for inventory, which runs its SQL on the batch's PostgreSQL
   * connection (kl_txn_pg_conn()): on another store it fails every
   * event. */
  int needs_pg;
} kl_handler_ref_t;

/**
 * Resolves SPEC: "ledger" or "inventory" (built in), "exec:COMMAND"
 * (handlers/exec.h; a COMMAND whose program the shell cannot run is
 * refused, see kl__exec_check_command()) or "so:PATH[:SYMBOL]", a shared
 * object exporting a kl_handler_fn_t named SYMBOL (default
 * "keylane_handler").
 * On failure *ref is untouched and kl_err_detail() says why.
 */
kl_err_t kl__handler_resolve(const char *spec, kl_handler_ref_t *ref);

/**
 * Checks that the handler @p ref, resolved from @p spec, can work on
 * @p store, so that a worker refuses to start rather than dead-letter
 * every event: inventory needs a PostgreSQL store.
 * @returns KL_OK, or KL_ECONF with the reason and the fix in
 *          kl_err_detail().
 */
kl_err_t kl__handler_check_store(const kl_handler_ref_t *ref, const char *spec,
                                 kl_store_t *store);

/**
 * Checks what a handler with needs_pg needs of a worker of @p topic
 * configured by @p conf, on @p txn, a batch of the topic begun for the
 * check (kl__store_begin_check(); the caller aborts it): inventory's
 * kl__inventory_check(). KL_OK for any other handler.
 * @returns KL_OK, or KL_ECONF with the reason and the fix in
 *          kl_err_detail().
 */
kl_err_t kl__handler_check_batch(const kl_handler_ref_t *ref, kl_txn_t *txn,
                                 const char *topic, const kl_conf_t *conf);

/** Releases what kl__handler_resolve() took. */
void kl__handler_release(kl_handler_ref_t *ref);

#endif
