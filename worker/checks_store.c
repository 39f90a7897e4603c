/*
 * The store's checks of checks.h, for keylane doctor: its layout version
 * and, for PostgreSQL, the skew between this host's clock and the
 * server's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/checks.h"
#include "store/store_internal.h"

void kl__check_store_version(kl_store_t *store, const char *location,
                             kl__check_t *out) {
  int version = 0, latest = 0;
  const char *what = kl__store_layout(store);
  if (kl__store_version(store, &version, &latest)) {
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg),
             "cannot read the %s version of store %s: %s", what, location,
             kl_err_detail());
    return;
  }
  char missing[512] = "";
  if (version == latest && kl__store_missing(store, missing, sizeof(missing))) {
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg),
             "cannot read the columns of store %s: %s", location,
             kl_err_detail());
    return;
  }
  if (version == latest && missing[0]) {
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg),
             "store %s (%s) says schema version %d, but lacks columns "
             "keylane needs: %.300s; they were dropped or renamed by hand, "
             "and migrate does not apply a version again: restore them as "
             "store/pg_migrations.c defines them, or rebuild into a new "
             "store (keylane store rebuild)",
             location, kl_store_backend(store), version, missing);
    return;
  }
  if (version == latest) {
    out->status = KL__CHECK_OK;
    snprintf(out->msg, sizeof(out->msg),
             "store %s (%s) has %s version %d, the one this build writes",
             location, kl_store_backend(store), what, version);
    return;
  }
  out->status = KL__CHECK_FAIL;
  snprintf(out->msg, sizeof(out->msg),
           "store %s (%s) has %s version %d, this build writes %d: run the "
           "keylane that matches it, or `keylane store migrate --store %s`",
           location, kl_store_backend(store), what, version, latest, location);
}

int kl__check_clock(kl_store_t *store, int64_t bound_ms, kl__check_t *out) {
  int64_t server = 0, before = 0, after = 0;
  kl_err_t err = kl__store_server_clock(store, &server, &before, &after);
  if (err == KL_ENOTFOUND) /* this host's clock stamps the keys */
    return 0;
  if (err) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg),
             "cannot compare this host's clock with the PostgreSQL "
             "server's: %s",
             kl_err_detail());
    return 1;
  }
  /* The server read its clock somewhere in [before, after]. */
  int64_t skew = server - (before + after) / 2;
  int64_t slack = (after - before) / 2 + 1;
  int64_t off = (skew < 0 ? -skew : skew) - slack;
  out->status = off > bound_ms ? KL__CHECK_WARN : KL__CHECK_OK;
  if (out->status == KL__CHECK_OK)
    snprintf(out->msg, sizeof(out->msg),
             "this host's clock is within %" PRId64
             " ms of the PostgreSQL server's (warned above %" PRId64 " ms)",
             (skew < 0 ? -skew : skew) + slack, bound_ms);
  else
    snprintf(out->msg, sizeof(out->msg),
             "this host's clock is %" PRId64
             " ms %s the PostgreSQL server's (more than %" PRId64 " ms): "
             "idempotency keys are stamped and swept by the server's clock "
             "alone, so the store is safe, but this host's event "
             "timestamps (ts), logs and @-DURATION positions are off by "
             "as much; synchronise the clocks of this host and the server "
             "(chrony, systemd-timesyncd)",
             skew < 0 ? -skew : skew, skew < 0 ? "ahead of" : "behind",
             bound_ms);
  return 1;
}
