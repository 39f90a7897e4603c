/*
 * The worker's guard against a log that went backwards or lost records
 * (docs/design.md, "Assumptions are checks"). The store's watermark says which
 * offsets were applied; that holds only while the partition's log is the
 * one they were applied from. So the worker's consumer runs with
 * auto.offset.reset=error, and when librdkafka says a position is out of
 * the log, or a lane is given records below its position, the partition
 * is halted and its retained log [low, high) compared with the lane's
 * position (checks_log.h):
 * - the log still holds the position: the consumer is moved back to it
 *   and the partition goes on (records below the watermark it dropped are
 *   then counted as redelivered);
 * - the log ends below it (recreated or truncated topic): the partition
 *   stays stopped, with an ERROR, until `keylane store reset` rewinds its
 *   watermark; the guard sees that in the store (a newer epoch and a lower
 *   watermark) and starts the partition again from there;
 * - the log starts above it (retention deleted unapplied records): the
 *   same stop, unless worker.on.gap=skip, which goes on from the log's
 *   start and counts the records lost.
 * librdkafka's word can be lost (a pause purges it, and the partition is
 * never fetched again): so every 5 s an owned partition that is not
 * paused and took nothing is checked too, when the log no longer holds
 * its position (guard_watch() in log_guard.c).
 * A stop is not stored: a worker that takes the partition finds it again.
 * A new owner checks the log before it takes the partition's epoch
 * (kl__checks_log_owner()), so that a worker on another cluster than its
 * store's, or on a store that never saw the fleet's owners, fences nobody:
 * such a partition is stopped untaken (kl__log_guard_refuse()).
 *
 * Caveats: everything but kl__log_guard_stops() runs on the poll thread.
 */
#ifndef KEYLANE_WORKER_LOG_GUARD_H
#define KEYLANE_WORKER_LOG_GUARD_H

#include <librdkafka/rdkafka.h>

#include "keylane/conf.h"
#include "keylane/store.h"
#include "worker/lanes.h"
#include "worker/checks_log.h"

typedef struct kl__log_guard kl__log_guard_t;

/** One partition as /metrics and /healthz show it. */
typedef struct kl__log_guard_stop {
  int32_t partition;
  int stopped; /**< stopped now; check says why */
  kl__checks_log_result_t check;
  uint64_t gap_records; /**< skipped by worker.on.gap=skip, in total */
} kl__log_guard_stop_t;

/**
 * Creates the guard of @p topic; reads worker.on.gap from @p conf. @p rk
 * (the consumer), @p store and @p lanes are borrowed.
 */
kl_err_t kl__log_guard_new(const kl_conf_t *conf, const char *topic,
                           rd_kafka_t *rk, kl_store_t *store,
                           kl__lanes_t *lanes, kl__log_guard_t **out);
void kl__log_guard_destroy(kl__log_guard_t *guard);

/** librdkafka said @p partition's position @p offset is out of its log
 *  (RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET). Poll thread. */
void kl__log_guard_out_of_range(kl__log_guard_t *guard, int32_t partition,
                                int64_t offset);

/** Checks what is due: lanes given records below their position, owned
 *  partitions that took nothing while their position fell out of the log
 *  (every 5 s), halted partitions, stopped ones whose store state was
 *  reset. Poll thread.
 *  @returns how many partitions refused before they were taken it took
 *  (the worker now owns them too). */
int kl__log_guard_tick(kl__log_guard_t *guard);

/**
 * Stops @p partition before the worker takes it: a new owner's check
 * (kl__checks_log_owner()) found @p check's verdict, and a new epoch
 * would fence the partition's owner for nothing (logged as an ERROR with
 * the fix). The worker leaves the partition paused and does not own it;
 * it starts as any stopped one once `keylane store reset` moved its
 * watermark back, except a store that does not know it
 * (KL__CHECKS_LOG_STORE_UNKNOWN) or records another cluster or group as
 * the topic's owner (KL__CHECKS_LOG_CLUSTER_MISMATCH, _GROUP_MISMATCH),
 * which only a restart ends (on the fleet's store, or after `keylane store
 * bind`). Poll thread.
 */
void kl__log_guard_refuse(kl__log_guard_t *guard, int32_t partition,
                          const kl__checks_log_result_t *check);

/** @p partition was assigned or revoked: its stop, if any, is over (a new
 *  owner checks again). Poll thread. */
void kl__log_guard_forget(kl__log_guard_t *guard, int32_t partition);

/**
 * Copies the partitions that stopped or skipped records, at most @p max,
 * into @p out. Any thread. @returns how many.
 */
size_t kl__log_guard_stops(kl__log_guard_t *guard, kl__log_guard_stop_t *out,
                           size_t max);

#endif
