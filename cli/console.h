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
 *                         handler rows of the key, its pending timers,
 *                         and whether a worker holds it waiting, retrying
 *                         or parked, and why.
 *   GET /api/stuck[?limit=N]  the keys the workers hold retrying or
 *                         parked, N (1..1000, 100 by default) per worker.
 *   GET /api/letters[?reason=R&key=K&limit=N]  the newest dead letters of
 *                         TOPIC.dlq, N (1..500, 50 by default) of the
 *                         last 1,000 records of each of its partitions.
 *   GET /api/letters/P/OFFSET  one dead letter, its envelope decoded.
 *   GET /api/outbox       the follow-ups the store holds per partition.
 *   GET /api/fencing      each worker's refused commits, and the epoch
 *                         changes the console saw in the store.
 *   GET /api/timers[?partition=P&key=K&limit=N&payload=1]  the store's
 *                         pending timers, the soonest N (1..1000, 100 by
 *                         default), as `keylane store timers --json`.
 *   POST /api/redrive     {"letters": ["P@OFFSET", ...], "dry_run": B}:
 *                         the one redrive (worker/redrive.h) of those
 *                         letters; a token, application/json and a
 *                         same-origin Origin (if any) are required.
 *
 * Errors are {"error": "..."} with 400, 401, 403, 404, 405, 409, 415 or
 * 503.
 */
#ifndef KEYLANE_CLI_CONSOLE_H
#define KEYLANE_CLI_CONSOLE_H

#include <stddef.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "cli/console_fetch.h"
#include "keylane/conf.h"
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

/** The dead letters GET /api/letters lists: by default, and at most. */
#define KL__CONSOLE_LETTERS_PAGE 50
#define KL__CONSOLE_LETTERS_MAX 500
/** The records GET /api/letters reads back from the end of each
 *  partition of the dead-letter topic, whatever its filter: a page is
 *  the newest matching letters of that tail, never the whole topic. */
#define KL__CONSOLE_LETTERS_TAIL 1000
/** The follow-ups GET /api/outbox lists per partition: by default, and
 *  at most; and in all. */
#define KL__CONSOLE_OUTBOX_PAGE 20
#define KL__CONSOLE_OUTBOX_MAX 1000
#define KL__CONSOLE_OUTBOX_ROWS 5000
/** The timers GET /api/timers lists: by default, and at most; the key
 *  view lists a key's first KL__CONSOLE_TIMERS_PAGE. A page holds that
 *  many rows at most, however many timers the store holds. */
#define KL__CONSOLE_TIMERS_PAGE 100
#define KL__CONSOLE_TIMERS_MAX 1000
/** The letters one POST /api/redrive takes at most. */
#define KL__CONSOLE_REDRIVE_MAX 50

/** The epoch changes GET /api/fencing remembers, the oldest dropped. */
#define KL__CONSOLE_FENCES_MAX 256

/** An epoch change of a partition the console saw in the store: a new
 *  owner, which fenced the one before it. */
typedef struct kl__console_fence {
  int64_t at_ms; /**< when the console saw it */
  int32_t partition;
  uint64_t from, to; /**< the fenced owner's epoch, the new one's */
  char by[64];       /**< "redrive" when the console's redrive took it;
                          else "" (a worker, replay or another tool) */
} kl__console_fence_t;

struct kl_handler_ref;

/** What the API reads; every pointer borrowed for the console's life. */
typedef struct kl__console {
  const char *topic;
  char dlq_topic[256];            /**< TOPIC.dlq */
  const kl_conf_t *conf;          /**< kafka.* for the dead letters' readers */
  struct kl_handler_ref *handler; /**< --handler; NULL: no redrive */
  const char *group;
  kl_store_t *store;
  rd_kafka_t *rk; /**< a consumer of the group (never subscribed) */
  kl__fetch_addr_t workers[KL__CONSOLE_WORKERS_MAX];
  size_t nworkers;
  /** The epochs last seen in the store, by partition (0: none), and the
   *  changes seen, a ring (on the console's one thread). */
  uint64_t seen_epoch[KL__CONSOLE_PARTS_MAX];
  kl__console_fence_t fences[KL__CONSOLE_FENCES_MAX];
  size_t nfences; /**< ever recorded; the ring holds the last 256 */
} kl__console_t;

/**
 * Answers GET @p path with @p query (without the '?').
 * @param doc  receives the JSON answer, json_decref()ed by the caller: the
 *             document on 200, {"error": ...} otherwise.
 * @returns the HTTP status; 0 when @p path is not an /api/ route.
 */
int kl__console_api(kl__console_t *console, const char *path, const char *query,
                    json_t **doc);

/** {"error": message} with *@p status set to @p code. */
json_t *kl__console_err(int *status, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** @p s as a JSON string, bytes that are not printable as \xHH. */
json_t *kl__console_text(const void *s, size_t len);

/**
 * Parses the value of limit= (@p vlen bytes, still encoded), 1..@p max
 * @p what.
 * @returns NULL with *@p limit set, or the 400 error document.
 */
json_t *kl__console_limit(const char *v, size_t vlen, const char *what,
                          long max, long *limit, int *status);

/**
 * Parses the value of key= (@p vlen bytes, percent-encoded) into @p key,
 * which holds 3 * KL_KEY_MAX bytes.
 * @returns NULL with *@p len set (1..KL_KEY_MAX), or the 400 error
 *          document.
 */
json_t *kl__console_key_param(const char *v, size_t vlen, char *key,
                              size_t *len, int *status);

/**
 * Notes @p partition's store epoch @p epoch: a change from the epoch seen
 * before is a fence, recorded with @p by ("" or "redrive").
 */
void kl__console_epoch_seen(kl__console_t *console, int32_t partition,
                            uint64_t epoch, const char *by);

/**
 * Answers GET /api/letters[?...] and /api/letters/P/OFFSET (@p path),
 * as kl__console_api().
 */
int kl__console_letters(kl__console_t *console, const char *path,
                        const char *query, json_t **doc);

/**
 * Answers POST @p path with @p body (@p len bytes, JSON): /api/redrive.
 * The caller checked the token and the request's origin.
 * @returns the HTTP status; 0 when @p path takes no POST.
 */
int kl__console_post(kl__console_t *console, const char *path, const char *body,
                     size_t len, json_t **doc);

/**
 * Answers GET /api/timers[?...] (cli/console_timers.c), as
 * kl__console_api().
 */
int kl__console_timers(kl__console_t *console, const char *query, json_t **doc);

/**
 * The pending timers of @p key (@p len bytes) in @p partition, the
 * soonest KL__CONSOLE_TIMERS_PAGE: {"pending": [rows], "more", "error"}.
 * @returns a new reference.
 */
json_t *kl__console_key_timers(kl__console_t *console, int32_t partition,
                               const char *key, size_t len);

#endif
