/*
 * The store reads of the worker's observers: kl_worker_health(),
 * kl_worker_foreach_partition() and `keylane worker`'s /metrics read the
 * watermarks and epochs of the worker's topic here, on a thread of their
 * own, and wait for them for at most KL__STORE_READ_WAIT_MS.
 *
 * Why: a store that accepts and never answers (a PostgreSQL server
 * stopped, a network that drops packets without a reset) would hold a
 * read in libpq for as long as it lasts. Made on the caller's thread, it
 * held the metrics server's loop thread, so /healthz, /metrics and then
 * /livez answered nothing, and the hang was seen by no probe. Here the
 * caller gives up at the bound and says how long the read has waited.
 *
 * A read under way is shared: callers that come while one waits wait for
 * that one, and no second read starts behind a hung one. So a hung store
 * holds this one thread and no more; once the read is older than the
 * bound, every caller answers at once.
 */
#ifndef KEYLANE_WORKER_STORE_READ_H
#define KEYLANE_WORKER_STORE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/store.h"

/** How long a caller waits for a read, counted from the read's start. */
#define KL__STORE_READ_WAIT_MS 2000
/** A cached reader's outcome older than this starts a read anew. */
#define KL__STORE_READ_FRESH_MS 1000
/** Partitions of the topic one read keeps, at most. */
#define KL__STORE_READ_PARTS_MAX 4096

typedef struct kl__store_read kl__store_read_t;

/** One partition of the worker's topic as the store has it. */
typedef struct kl__store_part {
  int32_t partition;
  kl_partition_state_t state;
} kl__store_part_t;

/** Starts the reader's thread for @p topic of @p store (both borrowed).
 *  @returns KL_OK, KL_ENOMEM or KL_EIO (no thread). */
kl_err_t kl__store_read_new(kl_store_t *store, const char *topic,
                            kl__store_read_t **out);

/**
 * Makes @p reader cached, as the metrics server wants it: after its first
 * read, a caller never waits; it gets the last read's outcome (at most
 * KL__STORE_READ_FRESH_MS old when it came, another read started in the
 * background past that), or KL_ETIMEOUT once the read under way is older
 * than KL__STORE_READ_WAIT_MS. A store slower than that bound still fails
 * the health check; one slower than a probe's timeout no longer holds the
 * probes of /livez queued behind /healthz.
 */
void kl__store_read_cached(kl__store_read_t *reader);

/** Stops the thread, after the read under way if one is. NULL is a no-op. */
void kl__store_read_destroy(kl__store_read_t *reader);

/**
 * Reads the topic's partitions from the store: joins the read under way,
 * or starts one, and waits for it until KL__STORE_READ_WAIT_MS after its
 * start. Any thread.
 * @param out  up to @p cap partitions, in the store's order; may be NULL
 *             when @p cap is 0 (only whether the store answers).
 * @param n    receives how many were copied.
 * @returns KL_OK; KL_ETIMEOUT when the read has waited longer than the
 *          bound ("the store has not answered a read for N ms ..."); the
 *          store's error, with its detail.
 */
kl_err_t kl__store_read(kl__store_read_t *reader, kl__store_part_t *out,
                        size_t cap, size_t *n);

/** @returns how long the read under way has waited, in ms; 0 when none
 *  is under way. Any thread. */
int64_t kl__store_read_age_ms(kl__store_read_t *reader);

#endif
