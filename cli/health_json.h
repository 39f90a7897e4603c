/*
 * /healthz as JSON (`GET /healthz?format=json`, or `Accept:
 * application/json`): the plain-text answer's HTTP status and message,
 * and a Burrow-style status per owned partition, so tools built for
 * Burrow's consumer-status endpoint read it:
 *
 *   {"error": false, "message": "ok: owns 2 partitions",
 *    "status": {"topic": "events", "group": "keylane", "status": "OK",
 *               "partition_count": 2, "maxlag_seconds": 0.0,
 *               "partitions": [{"topic": "events", "partition": 0,
 *                               "status": "OK", "watermark": 120,
 *                               "records": 0, "waiting": 0,
 *                               "unmoved_ms": 0, "lag_seconds": 0.0}]}}
 *
 * A partition is ERR when the log guard stopped it (its log went
 * backwards or lost records), STALL when it holds records and its
 * watermark has not moved for worker.stall.ms, WARN when a key of it
 * waits in retry backoff or its watermark has not moved for half of
 * worker.stall.ms while holding records, and OK otherwise. The group's
 * status is ERR when the plain answer is 503, else WARN when a partition
 * is not OK or the answer is degraded (200, KL__HEALTH_DEGRADED), else OK.
 * Not installed.
 */
#ifndef KEYLANE_CLI_HEALTH_JSON_H
#define KEYLANE_CLI_HEALTH_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "worker/lanes_stall.h"
#include "worker/worker_health.h" /* KL__HEALTH_DEGRADED, the statuses */

/** What /healthz knows; every pointer borrowed for the call. */
typedef struct kl__health {
  int http_status;     /* the plain answer's: 200 or 503 */
  const char *message; /* the plain answer's body */
  const char *topic, *group;
  const kl__stall_t *stalls; /* the owned partitions */
  size_t stall_count;
  const int32_t *stopped; /* partitions the log guard stopped */
  size_t stopped_count;
  int64_t stall_ms; /* worker.stall.ms; 0: not watched */
  int64_t now_ms;   /* for lag_seconds, against the envelopes' ts */
} kl__health_t;

/**
 * Renders @p health as the JSON document above.
 * @returns a malloc()ed NUL-terminated string the caller frees, with its
 *          length in @p len; NULL when out of memory.
 */
char *kl__health_json(const kl__health_t *health, size_t *len);

#endif
