/**
 * @file worker.h
 * @brief The consume side: partition ownership, fenced batch commits, and
 *        the handler contract.
 *
 * A worker joins a consumer group (cooperative-sticky). For each partition
 * it is assigned it acquires a new owner epoch from the store and resumes
 * from the store's watermark, not from the Kafka committed offset: the
 * store is the source of truth. Events are applied in offset order, in
 * batches; each batch is ONE store transaction (handler writes, idempotency
 * keys, watermark) guarded by the epoch. A batch whose epoch is stale is
 * rolled back, the partition is dropped locally and the worker logs
 * `fenced partition=P my_epoch=E current_epoch=E2`. Kafka offsets are
 * committed after the store, for lag monitoring only.
 *
 * Caveats:
 * - kl_worker_run() runs on the calling thread, and so do the handler and
 *   the rebalance work. kl_worker_stop() may be called from any thread and
 *   from a signal handler.
 * - The handler must keep to its own partition's entities: writing another
 *   partition's entity breaks the single-writer rule.
 */
#ifndef KEYLANE_WORKER_H
#define KEYLANE_WORKER_H

#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/event.h"
#include "keylane/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The owner's fencing token, to pass to any external resource. */
typedef struct kl_fence {
  const char *topic;
  int32_t partition;
  uint64_t epoch; /**< grows with every change of owner */
  int64_t offset; /**< the event's offset */
} kl_fence_t;

typedef enum kl_handler_result {
  KL_HANDLER_OK = 0,    /**< apply the txn's writes with the batch */
  KL_HANDLER_RETRY = 1, /**< transient: run the event again later */
  KL_HANDLER_FAIL = 2,  /**< permanent: the event cannot be applied */
} kl_handler_result_t;

/**
 * Applies one event. Reads and writes go through @p txn, which commits
 * atomically with the event's idempotency record; nothing else should be
 * changed except through an external resource that checks @p fence.
 *
 * @param event  borrowed; valid for the call only.
 * @param errbuf receives the reason for RETRY or FAIL.
 */
typedef kl_handler_result_t(kl_handler_fn_t)(void *opaque,
                                             const kl_event_t *event,
                                             const kl_fence_t *fence,
                                             kl_txn_t *txn, char *errbuf,
                                             size_t errbuf_size);

/** The built-in ledger handler (see README: credit/debit with seq). */
KL_EXPORT kl_handler_result_t kl_ledger_handler(void *opaque,
                                                const kl_event_t *event,
                                                const kl_fence_t *fence,
                                                kl_txn_t *txn, char *errbuf,
                                                size_t errbuf_size);

typedef struct kl_worker kl_worker_t;

/** Counters since the worker started. */
typedef struct kl_worker_stats {
  uint64_t applied;     /**< events whose effects were committed */
  uint64_t duplicates;  /**< events skipped: idempotency key seen */
  uint64_t redelivered; /**< events skipped: offset below the watermark */
  uint64_t batches;     /**< store commits */
  uint64_t fenced;      /**< batches rejected by the epoch check */
  uint64_t failed;      /**< events the handler failed */
  int32_t owned;        /**< partitions owned now */
} kl_worker_stats_t;

/**
 * Creates a worker for @p topic. @p conf is copied; "kafka.*" keys reach the
 * consumer (kafka.bootstrap.servers is required). @p store is borrowed and
 * must outlive the worker.
 */
KL_EXPORT kl_err_t kl_worker_new(const kl_conf_t *conf, const char *topic,
                                 kl_store_t *store, kl_handler_fn_t *handler,
                                 void *handler_opaque, kl_worker_t **out);

/**
 * Consumes and applies until kl_worker_stop(); then finishes the batch in
 * flight, commits, leaves the group and returns KL_OK.
 * @returns an error when the worker cannot run (topic missing, partition
 *          count differs from worker.expect.partitions, ...).
 */
KL_EXPORT kl_err_t kl_worker_run(kl_worker_t *worker);

/** Asks kl_worker_run() to drain and return. Async-signal-safe. */
KL_EXPORT void kl_worker_stop(kl_worker_t *worker);

/** Copies the counters into @p stats. Safe from any thread. */
KL_EXPORT void kl_worker_stats(const kl_worker_t *worker,
                               kl_worker_stats_t *stats);

/** Frees @p worker (after kl_worker_run() returned); accepts NULL. */
KL_EXPORT void kl_worker_destroy(kl_worker_t *worker);

#ifdef __cplusplus
}
#endif
#endif
