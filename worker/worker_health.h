/*
 * The worker's health and partition state (kl_worker_health(),
 * kl_worker_foreach_partition() in keylane/worker.h), and the rules they
 * share with /healthz's JSON (cli/health_json.h). Not installed.
 */
#ifndef KEYLANE_WORKER_HEALTH_H
#define KEYLANE_WORKER_HEALTH_H

#include <stdint.h>

#include "worker/lanes_stall.h"

/** The start of a DEGRADED verdict's reason: the worker runs well but
 *  needs an operator (follow-ups kept in the outbox); restarting it would
 *  not help, so it is not FAILING, which a liveness probe restarts. */
#define KL__HEALTH_DEGRADED "degraded: "

/** @returns "OK", "WARN", "ERR" or "STALL" for one owned partition
 *  (kl_worker_partition_status_t says when). */
const char *kl__health_partition_status(const kl__stall_t *stall, int stopped,
                                        int64_t stall_ms);

/** @returns the seconds since @p stall's oldest unapplied record's ts, or
 *  0 when it holds none. */
double kl__health_lag_seconds(const kl__stall_t *stall, int64_t now_ms);

#endif
