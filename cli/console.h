/*
 * `keylane console`: one process per fleet serving a web page and the JSON
 * it reads, made from the store, Kafka and the workers' JSON API
 * (cli/worker_api.h). docs/console.md is the reference; in short:
 *
 *   GET /api/fleet        every partition of the topic: the worker that
 *                         owns it (or stopped it) and its status, the
 *                         store's epoch and watermark, the group's
 *                         committed offset and the log's end from Kafka,
 *                         the lag; and which workers answered.
 *   GET /api/keys/KEY     one key (percent-encoded, 1..1024 bytes): its
 *                         partition, that partition's store state, the
 *                         handler rows of the key, and whether a worker
 *                         holds it waiting, retrying or parked, and why.
 *   GET /api/stuck[?limit=N]  the keys the workers hold retrying or
 *                         parked, N (1..1000, 100 by default) per worker.
 *
 * Errors are {"error": "..."} with 400, 401, 404 or 405.
 */
#ifndef KEYLANE_CLI_CONSOLE_H
#define KEYLANE_CLI_CONSOLE_H

#include <stddef.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "cli/console_fetch.h"
#include "keylane/store.h"

/** Partitions a fleet view lists at most. */
#define KL__CONSOLE_PARTS_MAX 4096
/** Workers given with --worker at most. */
#define KL__CONSOLE_WORKERS_MAX 64
/** How long the console waits for the workers (all at once), and for
 *  each of Kafka's answers: a worker slower than this is "unreachable". */
#define KL__CONSOLE_WAIT_MS 1000
/** The stuck keys asked of each worker: by default, and at most. */
#define KL__CONSOLE_STUCK_PAGE 100
#define KL__CONSOLE_STUCK_MAX 1000

/** What the API reads; every pointer borrowed for the console's life. */
typedef struct kl__console {
  const char *topic;
  const char *group;
  kl_store_t *store;
  rd_kafka_t *rk; /**< a consumer of the group (never subscribed) */
  kl__fetch_addr_t workers[KL__CONSOLE_WORKERS_MAX];
  size_t nworkers;
} kl__console_t;

/**
 * Answers GET @p path with @p query (without the '?').
 * @param doc  receives the JSON answer, json_decref()ed by the caller: the
 *             document on 200, {"error": ...} otherwise.
 * @returns the HTTP status; 0 when @p path is not an /api/ route.
 */
int kl__console_api(kl__console_t *console, const char *path, const char *query,
                    json_t **doc);

#endif
