/*
 * The state a worker holds, as JSON, on its metrics listener
 * (cli/metrics_server.c): read-only, no payloads. docs/operations.md has
 * the reference; in short:
 *
 *   GET /v1/partitions   every partition the worker owns, and those the
 *                        log guard stopped: epoch, watermark, committed
 *                        offset, high watermark and lag, records held,
 *                        running, in retry, follow-ups unpublished, the
 *                        last commit, and why a stopped one stopped:
 *     {"topic": "events", "group": "keylane",
 *      "partitions": [{"topic": "events", "partition": 0, "owned": true,
 *                      "status": "OK", "epoch": 3, "watermark": 120, ...}]}
 *
 *   GET /v1/keys[?state=waiting,retrying,parked][&limit=N][&from=P:O]
 *                        the keys with events in the window, a page of
 *                        them (limit 1..1000, 100 by default), in
 *                        partition then offset order; "next" is where the
 *                        next page starts (from=), null at the end:
 *     {"keys": [{"key": "acct-7", "partition": 2, "state": "retrying",
 *                "offset": 41, "pending": 3, "attempts": 2,
 *                "next_retry_ms": ..., "error": "...", ...}],
 *      "total": 1, "next": null}
 *
 *   GET /v1/keys/{key}   one key (percent-encoded, 1..1024 bytes): 200
 *                        with its entry, 404 when it holds no event here.
 *
 *   GET /v1/fences       the last 64 partitions the worker was fenced
 *                        from (a commit refused by a newer epoch), newest
 *                        first (kl_worker_foreach_fence()):
 *     {"fences": [{"partition": 2, "epoch": 1, "current_epoch": 2,
 *                  "at_ms": ...}], "kept": 64}
 *
 * Key bytes are written as kl__escape() writes them (printable text,
 * UTF-8 included, as is; control bytes and bytes that are not UTF-8 as
 * \xHH). Errors are {"error": "..."} with 400, 404,
 * 405 or 503.
 */
#ifndef KEYLANE_CLI_WORKER_API_H
#define KEYLANE_CLI_WORKER_API_H

#include "common/http.h"
#include "keylane/worker.h"

/** The default page of GET /v1/keys. */
#define KL_WORKER_API_KEYS_PAGE 100

/**
 * Parses the query of GET /v1/keys ("state=retrying&limit=10", without
 * the '?') into @p q.
 * @returns 0; -1 with what is wrong and the fix in @p why.
 */
int kl__worker_api_keys_query(const char *query, kl_worker_keys_query_t *q,
                              char *why, size_t size);

/**
 * Decodes the KEY of GET /v1/keys/KEY into @p out, which holds
 * 3 * KL_KEY_MAX bytes.
 * @returns its length, 1..KL_KEY_MAX; -1 with what is wrong in @p why.
 */
long kl__worker_api_key(const char *encoded, char *out, char *why, size_t size);

/**
 * Answers @p req when @p path is one of the routes above.
 * @param is_get  whether the method is GET (others get 405).
 * @returns 1 when it answered, 0 when @p path is none of its routes.
 */
int kl__worker_api(kl__http_req_t *req, kl_worker_t *worker, const char *topic,
                   const char *group, int is_get, const char *path,
                   const char *query);

#endif
