/* Resolving `--handler SPEC` to a handler function. */
#ifndef KEYLANE_WORKER_HANDLER_H
#define KEYLANE_WORKER_HANDLER_H

#include "keylane/worker.h"

typedef struct kl_handler_ref {
  kl_handler_fn_t *fn;
  void *opaque;
  void *dl; /* dlopen() handle of an "so:" handler, or NULL */
  /* 1 for the built-in handlers, whose only effects are the store's
   * writes: a dry run may run them. 0 for exec: and so:, which may act
   * outside the store: a dry run never calls them. */
  int store_only;
} kl_handler_ref_t;

/**
 * Resolves SPEC: "ledger" (built in), "exec:COMMAND" (worker/handler_exec.h)
 * or "so:PATH[:SYMBOL]", a shared object
 * exporting a kl_handler_fn_t named SYMBOL (default "keylane_handler").
 * On failure *ref is untouched and kl_err_detail() says why.
 */
kl_err_t kl__handler_resolve(const char *spec, kl_handler_ref_t *ref);

/** Releases what kl__handler_resolve() took. */
void kl__handler_release(kl_handler_ref_t *ref);

#endif
