#include "handlers/handler.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "handlers/exec.h"
#include "handlers/inventory.h"
#include "keylane/handlers.h"

static kl_err_t handler_so(const char *spec, kl_handler_ref_t *ref) {
  char *path = strdup(spec);
  if (!path)
    return KL_ENOMEM;
  /* so:PATH[:SYMBOL]: the symbol follows the last ':' after the last '/'. */
  const char *symbol = "keylane_handler";
  char *slash = strrchr(path, '/');
  char *colon = strrchr(slash ? slash : path, ':');
  if (colon) {
    *colon = '\0';
    symbol = colon + 1;
  }
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    kl_err_t err = kl__err(KL_ECONF, "--handler so:%s: %s", spec, dlerror());
    free(path);
    return err;
  }
  void *fn = dlsym(dl, symbol);
  if (!fn) {
    kl_err_t err = kl__err(KL_ECONF,
                           "--handler so:%s: %s exports no symbol \"%s\"; name "
                           "the handler function with so:PATH:SYMBOL",
                           spec, path, symbol);
    dlclose(dl);
    free(path);
    return err;
  }
  free(path);
  /* POSIX guarantees a data pointer from dlsym converts to a function. */
  memcpy(&ref->fn, &fn, sizeof(fn));
  ref->opaque = NULL;
  ref->dl = dl;
  ref->store_only = 0;
  ref->needs_pg = 0;
  return KL_OK;
}

kl_err_t kl__handler_resolve(const char *spec, kl_handler_ref_t *ref) {
  if (!spec)
    return kl__err(KL_ECONF, "no handler: pass --handler ledger or "
                             "--handler so:PATH[:SYMBOL]");
  if (strcmp(spec, "ledger") == 0 || strcmp(spec, "inventory") == 0) {
    int inventory = spec[0] == 'i';
    ref->fn = inventory ? kl__inventory_handler : kl_ledger_handler;
    ref->opaque = NULL;
    ref->dl = NULL;
    ref->store_only = 1;
    ref->needs_pg = inventory;
    return KL_OK;
  }
  if (strncmp(spec, "so:", 3) == 0 && spec[3])
    return handler_so(spec + 3, ref);
  if (strncmp(spec, "exec:", 5) == 0) {
    kl__exec_t *exec;
    kl_err_t err = kl__exec_check_command(spec + 5);
    if (err || (err = kl__exec_new(spec + 5, &exec)))
      return err;
    ref->fn = kl__exec_handler;
    ref->opaque = exec;
    ref->dl = NULL;
    ref->store_only = 0;
    ref->needs_pg = 0;
    return KL_OK;
  }
  return kl__err(KL_ECONF,
                 "unknown handler \"%s\": use ledger, inventory, "
                 "so:PATH[:SYMBOL] or exec:COMMAND",
                 spec);
}

kl_err_t kl__handler_check_store(const kl_handler_ref_t *ref, const char *spec,
                                 kl_store_t *store) {
  if (ref->needs_pg && strcmp(kl_store_backend(store), "postgresql") != 0)
    return kl__err(KL_ECONF,
                   "--handler %s runs its SQL on the batch's PostgreSQL "
                   "connection, and the %s store has none: every event "
                   "would be dead-lettered; use --store postgresql://...",
                   spec, kl_store_backend(store));
  return KL_OK;
}

kl_err_t kl__handler_check_batch(const kl_handler_ref_t *ref, kl_txn_t *txn,
                                 const char *topic, const kl_conf_t *conf) {
  return ref->fn == kl__inventory_handler
             ? kl__inventory_check(txn, topic, conf)
             : KL_OK;
}

void kl__handler_release(kl_handler_ref_t *ref) {
  if (ref->fn == kl__exec_handler)
    kl__exec_destroy(ref->opaque);
  ref->opaque = NULL;
  if (ref->dl)
    dlclose(ref->dl);
  ref->dl = NULL;
}
