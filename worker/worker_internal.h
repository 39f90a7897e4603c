/* Internal worker interfaces: test hooks. Not installed. */
#ifndef KEYLANE_WORKER_INTERNAL_H
#define KEYLANE_WORKER_INTERNAL_H

#include "keylane/worker.h"
#include "worker/lanes_stall.h"
#include "worker/store_read.h"

typedef struct kl__log_guard kl__log_guard_t; /* worker/log_guard.h */
struct rd_kafka_conf_s;                       /* librdkafka/rdkafka.h */

/**
 * Called on the worker's thread after the handlers of a batch ran and
 * before its store commit: the window in which a GC pause or a stalled VM
 * lets another owner take the partition. Tests block here to make exactly
 * that happen.
 */
typedef void(kl__worker_hook_fn)(void *opaque, const char *topic,
                                 int32_t partition, uint64_t epoch);

void kl__worker_set_before_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                  void *opaque);

/** The worker's consumer, for tests that read its settings: borrowed,
 *  valid until kl_worker_destroy(). */
struct rd_kafka_s *kl__worker_consumer(kl_worker_t *worker);

/** Offset commits the worker sent to Kafka so far, for lag monitoring
 *  (at most one per KL__KAFKA_COMMIT_MS, worker/lanes_internal.h). Any
 *  thread. */
uint64_t kl__worker_kafka_commits(kl_worker_t *worker);

/** kl__lanes_ahead() of the worker. Any thread. */
uint64_t kl__worker_ahead(kl_worker_t *worker);

/**
 * The librdkafka configuration of the consumer a worker run with @p conf
 * makes: keylane's consumer defaults (kl__rdk_consumer_defaults(), the
 * embedded cluster's short fetch wait), then @p conf's "kafka.*" keys. The
 * worker adds its rebalance callback; keylane-bench latency --handler none
 * makes a bare consumer of it, to measure Kafka without keylane.
 * @param out  on KL_OK, the configuration: the caller's, for rd_kafka_new()
 *             or rd_kafka_conf_destroy().
 * @returns KL_OK, or the error of a setting kl_err_detail() names.
 */
kl_err_t kl__worker_kafka_conf(const kl_conf_t *conf,
                               struct rd_kafka_conf_s **out);

/** The worker's own metrics registry, kept across scrapes (the latency
 *  histograms, lanes.h kl__lanes_metrics()): borrowed, valid until
 *  kl_worker_destroy(); render it from any thread. */
struct kl__metrics *kl__worker_metrics(kl_worker_t *worker);

/**
 * Called on the worker's thread right after a store commit that wrote
 * follow-up events (kl_txn_emit()) and before any of them is published:
 * the window a crash between the commit and the publish falls in. Tests
 * exit the process here.
 */
void kl__worker_set_after_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                 void *opaque);

/**
 * Key-parallel executors ask @p fn before each event's run; nonzero makes
 * that run a store failure (the handler not called), as when the store's
 * link breaks under it. Set before kl_worker_run(). Tests only.
 */
void kl__worker_set_run_fault(kl_worker_t *worker,
                              int (*fn)(void *opaque, int32_t partition,
                                        int64_t offset),
                              void *opaque);

/** The worker's log guard, for /metrics, /healthz and tests: borrowed,
 *  valid until kl_worker_destroy(); read it with kl__log_guard_stops(). */
kl__log_guard_t *kl__worker_log_guard(kl_worker_t *worker);

/**
 * @returns 1 while kl_worker_run() waits for Kafka to answer for the topic
 *          at start (worker.kafka.wait), with what it waits for in @p why;
 *          0 otherwise. Any thread (the metrics server's /healthz).
 */
int kl__worker_waiting(kl_worker_t *worker, char *why, size_t size);

/**
 * @returns how long ago, in ms, kl_worker_run()'s loop last turned (it
 *          turns at least every few ms while it runs, also while it waits
 *          for Kafka at start); -1 before kl_worker_run(). Any thread
 *          (the metrics server's /livez).
 */
int64_t kl__worker_loop_age_ms(kl_worker_t *worker);

/**
 * Misrouted records seen per partition since the worker started (the
 * metric keylane_worker_misrouted_total): fills @p by_partition[0..n-1].
 * Any thread. @returns n, at most @p max.
 */
size_t kl__worker_misrouted(kl_worker_t *worker, uint64_t *by_partition,
                            size_t max);

/**
 * Called on the poll thread before a retake moves the consumer back to the
 * watermark of @p partition: a nonzero librdkafka error makes that seek
 * fail as if librdkafka had returned it. Tests use it to see what a failed
 * retake costs.
 */
typedef int(kl__worker_seek_hook_fn)(void *opaque, int32_t partition);

void kl__worker_set_seek_hook(kl_worker_t *worker, kl__worker_seek_hook_fn *fn,
                              void *opaque);

/**
 * The partitions @p worker owns, stalled or not (worker/lanes_stall.h), up
 * to @p max into @p out. Any thread. @returns how many it owns.
 */
size_t kl__worker_stalls(kl_worker_t *worker, kl__stall_t *out, size_t max);

/** kl__lanes_keys() of the worker's lanes (lanes_keys.h). Any thread. */
kl_err_t kl__worker_keys(kl_worker_t *worker, const kl_worker_keys_query_t *q,
                         kl_worker_key_t *out, size_t *n, size_t *total);

/** @returns nonzero when kl_worker_run() stopped because the store would
 *  not let it take an assigned partition within worker.acquire.wait. */
int kl__worker_unowned(const kl_worker_t *worker);

/** kl__lanes_commits_failing() of the worker's lanes (lanes_stall.h), or
 *  with @p runs kl__lanes_store_failing(). */
uint64_t kl__worker_commits_failing(kl_worker_t *worker, int runs,
                                    int64_t *for_ms, char *why, size_t size);

/* ---- what kl_worker_health() (worker_health.c) reads ---- */

/** The worker's topic, store and configuration: borrowed, valid until
 *  kl_worker_destroy(). Any thread. */
const char *kl__worker_topic(const kl_worker_t *worker);
kl_store_t *kl__worker_store(const kl_worker_t *worker);
/** The reads of the worker's observers (store_read.h): health, the
 *  partitions' listing, /metrics. */
kl__store_read_t *kl__worker_reader(const kl_worker_t *worker);
const kl_conf_t *kl__worker_conf(const kl_worker_t *worker);

/**
 * Remembers @p batches when @p fenced (stats.fenced) grew since the last
 * call. Any thread.
 * @returns the batch count at the last growth of the fenced count: no
 *          commit since a fence while stats.batches still equals it.
 */
uint64_t kl__worker_fence_batches(kl_worker_t *worker, uint64_t fenced,
                                  uint64_t batches);

#endif
