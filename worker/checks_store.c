/*
 * The store's checks of checks.h, for keylane doctor: its layout version,
 * the retentions its topics' sweeps judge ids by and, for PostgreSQL, the
 * skew between this host's clock and the server's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* What kl__check_sweeps() gathers from kl__store_sweeps(). */
typedef struct kl_sweeps_seen {
  const char *topic;
  int64_t retention_ms; /* the topic's; -1: no sweep removed its ids yet */
  char others[384];     /* "audit 1s, orders 30d" */
  size_t n_others;
} kl_sweeps_seen_t;

static int sweeps_seen(void *opaque, const char *topic, int64_t retention_ms,
                       int64_t at_ms) {
  (void)at_ms;
  kl_sweeps_seen_t *seen = opaque;
  if (strcmp(topic, seen->topic) == 0) {
    seen->retention_ms = retention_ms;
    return 0;
  }
  char keep[32];
  size_t len = strlen(seen->others);
  kl__duration_format(retention_ms, keep, sizeof(keep));
  if (len + 8 < sizeof(seen->others))
    snprintf(seen->others + len, sizeof(seen->others) - len, "%s%.80s %s",
             seen->n_others ? ", " : "", topic, keep);
  seen->n_others++;
  return 0;
}

int kl__check_sweeps(kl_store_t *store, const char *topic, int64_t dedup_ms,
                     kl__check_t *out) {
  kl_sweeps_seen_t seen = {.topic = topic, .retention_ms = -1};
  if (kl__store_sweeps(store, sweeps_seen, &seen)) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg),
             "cannot read the retentions the store's sweeps judge ids by: %s",
             kl_err_detail());
    return 1;
  }
  if (seen.retention_ms < 0 && !seen.n_others)
    return 0; /* no sweep has removed an id yet */
  char keep[32], want[32], others[160] = ""; /* fits out->msg whole */
  kl__duration_format(seen.retention_ms, keep, sizeof(keep));
  kl__duration_format(dedup_ms, want, sizeof(want));
  if (seen.n_others)
    snprintf(
        others, sizeof(others),
        "; other topics on the store sweep their own ids alone, at: %.100s",
        seen.others);
  out->status = seen.retention_ms >= 0 && seen.retention_ms < dedup_ms
                    ? KL__CHECK_WARN
                    : KL__CHECK_OK;
  if (out->status == KL__CHECK_WARN)
    snprintf(out->msg, sizeof(out->msg),
             "the last sweep that removed topic %.100s's ids judged them by "
             "a retention of %s, shorter than the store.dedup.retention "
             "given here (%s): a worker of %.100s runs with another "
             "store.dedup.retention, and an event of it read again after "
             "%s is applied twice; give every worker of the topic the same "
             "--dedup-retention%s",
             topic, keep, want, topic, keep, others);
  else if (seen.retention_ms >= 0)
    snprintf(out->msg, sizeof(out->msg),
             "topic %.100s's ids are swept by its own workers, at %s%s", topic,
             keep, others);
  else
    snprintf(out->msg, sizeof(out->msg),
             "no sweep has removed topic %.100s's ids yet%s", topic, others);
  return 1;
}
