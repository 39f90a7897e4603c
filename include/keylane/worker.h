/**
 * @file worker.h
 * @brief The consume side: partition ownership, fenced group commits,
 *        key-parallel lanes, retries, dead letters and the handler contract.
 *
 * A worker joins a consumer group (cooperative-sticky). For each partition
 * it is assigned it acquires a new owner epoch from the store and resumes
 * from the store's watermark, not from the Kafka committed offset: the
 * store is the source of truth.
 *
 * Inside a partition (a lane) events of one key (the Kafka message key)
 * run strictly in offset order; events of different keys run concurrently
 * on "worker.concurrency" threads (default 1: the polling thread runs
 * them, in offset order unless a key waits). Completed events are
 * group-committed in ONE store transaction guarded by the epoch: their
 * writes, their idempotency keys, and the watermark, which is the first
 * event not yet complete. Events complete beyond it are committed too; a
 * new owner consumes them again and skips them by their idempotency keys.
 * A commit whose epoch is stale is rolled back, the partition is dropped
 * locally and the worker logs
 * `fenced partition=P my_epoch=E current_epoch=E2`. Kafka offsets are
 * committed after the store, for lag monitoring, each with its partition's
 * epoch in the commit metadata ("keylane.epoch=E", also committed as soon
 * as a partition is taken): a new owner's epoch is above both the store's
 * and that one, so a new or rebuilt store never reuses an epoch.
 *
 * Retries and dead letters: KL_HANDLER_RETRY runs the event again after
 * an exponential backoff with jitter ("worker.retry.initial.ms", doubling
 * up to "worker.retry.max.ms"); only its key waits, and the watermark
 * stops at it. After "worker.max.attempts" runs, at once on
 * KL_HANDLER_FAIL, and at once for a record whose envelope does not
 * decode or whose id begins with KL_ID_RESERVED but is no follow-up's
 * (another producer's), the original record goes unchanged to the
 * dead-letter topic (`<topic>.dlq`, or "worker.dlq.topic") with
 * keylane.dlq.* headers (reason
 * decode|reserved_id|handler_fail|max_attempts, error, attempts, topic,
 * partition, offset, first_failure_ms, last_failure_ms). Only once Kafka
 * acknowledged it is its idempotency key recorded as dead-lettered (not
 * applied) and its key released; an unacknowledged letter is produced
 * again, never dropped. The dead-letter topic must exist when the worker
 * starts. A record may reach it twice when its owner changes or crashes
 * between the acknowledgement and the commit.
 *
 * The log is checked, not trusted: the consumer runs with
 * auto.offset.reset=error (kl_worker_new() refuses another
 * "kafka.auto.offset.reset"), and a partition whose position is out of its
 * log, or whose records arrive below its position, has its log's low and
 * high offsets compared with the store's watermark. A log that ends below
 * the watermark (recreated or truncated topic) stops the partition (an
 * ERROR, /healthz 503) until `keylane store reset` rewinds it; a log that
 * starts above it (retention deleted unapplied records) stops it too,
 * unless "worker.on.gap" is "skip", which goes on from the log's start and
 * counts the records lost. Nothing unapplied is counted as redelivered.
 *
 * Bounds: a partition holds at most "worker.window.max" records (default
 * 10000) from its watermark on, and a worker at most "worker.waiting.max"
 * keys in backoff (default 1000). Past either bound the partition is
 * paused (Kafka pause) instead of growing, and resumed below half.
 *
 * Caveats:
 * - kl_worker_run() runs on the calling thread, and so do the rebalance
 *   work, the commits and, at concurrency 1, the handler. At concurrency
 *   N > 1 the handler runs on N executor threads: it must be thread-safe,
 *   and it must read and write only its own event key's entity through
 *   @p txn. Two keys' events run at the same time, each on its own view:
 *   a write to another key's state is neither seen by that key's running
 *   events nor ordered with them.
 * - At concurrency N > 1 each event reads its own store snapshot (a
 *   kl_store_begin() per event: with a PostgreSQL store.pg.pool below
 *   N + 1 executors wait for each other's connections), and
 *   kl_txn_pg_conn() returns NULL: a handler's own SQL
 *   cannot share one transaction with events running concurrently. Use
 *   the kl_txn_* calls, or concurrency 1, where the handler's SQL runs on
 *   the group transaction inside a SAVEPOINT per event (RETRY and FAIL
 *   roll it back).
 * - kl_worker_stop() may be called from any thread and from a signal
 *   handler.
 * - The handler must keep to its own partition's entities: writing another
 *   partition's entity breaks the single-writer rule. To change another
 *   key, emit a follow-up event for it with kl_txn_emit() (store.h): it is
 *   committed with the handler's writes and published after the commit
 *   (at most "worker.outbox.max" unpublished per partition; past it the
 *   partition pauses).
 * - At concurrency 1 the polling thread checks its time budget before each
 *   event, so it polls again within that budget plus ONE handler call. A
 *   call must therefore end well within librdkafka's max.poll.interval.ms
 *   (300 s), or the group evicts a member that is working: declare the
 *   bound as "worker.handler.timeout.ms", and kl_worker_new() refuses one
 *   above half of "kafka.max.poll.interval.ms" (KL_ECONF). On PostgreSQL
 *   the batch's session is idle while a handler works, and the server ends
 *   it after "store.pg.idle.timeout": kl_worker_new() refuses a bound not
 *   below that, and a call that lasts that long counts as an attempt of
 *   its event (its batch could not commit), never as the store's failure.
 * - A partition fenced by an owner outside the group (keylane replay or
 *   redrive) is taken back once its state in the store, with the
 *   heartbeats such an owner writes while it works, has not changed for
 *   "worker.fenced.retake.ms": a replay that works is never taken back, one
 *   paused or dead for that long is, and its later commit is refused.
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

/**
 * The owner's fencing token, to pass to any external resource.
 *
 * What such a resource must do, both in the transaction of the write:
 * - refuse a write whose epoch is older than the newest it has stored for
 *   (topic, partition), and store the newer one: a deposed owner then
 *   applies nothing there;
 * - keep each event's write unique, by the event's id (or by topic,
 *   partition and offset): apply it once, and answer a repeat as done.
 * The epoch alone is not enough. A handler call that RETRYs, fails or
 * times out (an exec child killed after "worker.handler.timeout.ms") is
 * run again with the SAME fence, and a write the first call had already
 * sent may land after the second call's: same epoch, so only the id
 * refuses it. deploy/examples/handler_fence_sqlite.py does both (its
 * `fence` and `applied` tables).
 */
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
 * On RETRY or FAIL the event's writes to @p txn are discarded. When the
 * store's connection was lost under the handler (a PostgreSQL restart),
 * its RETRY or FAIL is taken for the store's failure: the event runs again
 * and counts no attempt toward worker.max.attempts (unless the call itself
 * lasted "store.pg.idle.timeout", whose end lost it: see above).
 *
 * @param event  borrowed; valid for the call only.
 * @param txn    borrowed; valid for the call only. It sees the writes of
 *               the key's earlier events, committed or not.
 * @param errbuf receives the reason for RETRY or FAIL (it goes into the
 *               dead letter's keylane.dlq.error header).
 */
typedef kl_handler_result_t(kl_handler_fn_t)(void *opaque,
                                             const kl_event_t *event,
                                             const kl_fence_t *fence,
                                             kl_txn_t *txn, char *errbuf,
                                             size_t errbuf_size);

typedef struct kl_worker kl_worker_t;

/**
 * Counters since the worker started, and gauges (now), as
 * kl_worker_stats() fills them.
 *
 * The struct grows without breaking the ABI: a new field is only ever
 * appended, never inserted, and no field is removed, reordered or
 * retyped; the caller passes the size of the struct it was compiled with
 * (kl_worker_stats()). A program built against an older, smaller struct
 * gets the fields it knows of and nothing is written past them; one built
 * against a newer struct than the library's keeps its own values in the
 * fields the library does not know (initialize it, = {0}, to read 0 there).
 */
typedef struct kl_worker_stats {
  uint64_t applied;           /**< events whose effects were committed */
  uint64_t duplicates;        /**< events skipped: idempotency key seen (this
                                   includes events committed beyond the
                                   watermark and consumed again by a new owner) */
  uint64_t redelivered;       /**< events skipped: offset below the watermark of
                                   a log that still holds it */
  uint64_t batches;           /**< partition batches committed (one store
                                   write may carry several partitions') */
  uint64_t fenced;            /**< group commits rejected by the epoch check */
  uint64_t failed;            /**< events dead-lettered by the handler's verdict
                                   (FAIL, or RETRY until max.attempts) */
  int32_t owned;              /**< partitions owned now */
  uint64_t dead_letters;      /**< records written to the dead-letter topic
                                   (acknowledged), decode failures included */
  uint64_t waiting_keys;      /**< gauge: keys waiting in retry backoff */
  uint64_t oldest_wait_ms;    /**< gauge: how long the longest of them waits */
  uint64_t window_events;     /**< gauge: records held in the lanes' windows */
  int32_t paused;             /**< gauge: partitions paused by a bound */
  int32_t retention_override; /**< gauge: 1 when a topic's retention
                                   exceeds store.dedup.retention and
                                   worker.retention.check=warn runs the
                                   worker anyway */
  int32_t retention_unchecked; /**< gauge: 1 when the cluster could not
                                    tell a topic's retention */
  uint64_t misrouted; /**< records whose key routes (murmur2) to another
                           partition: dead-lettered or forwarded, never
                           applied (worker.misrouted) */
  uint64_t forwarded; /**< misrouted records re-published to their key's
                           partition and acknowledged */
  int32_t partitions_expected; /**< the topic's partition count the fleet
                                    expects (worker.expect.partitions, or
                                    the count at start) */
  int32_t partitions_live;     /**< gauge: its count as last read (every
                                    worker.partitions.check.ms); when it
                                    differs the worker stops taking the topic */
  uint64_t outbox_pending;     /**< gauge: follow-up events (kl_txn_emit())
                                    committed and not yet acknowledged by
                                    Kafka, of the partitions owned */
  uint64_t outbox_published;   /**< follow-ups published and acknowledged */
  uint64_t outbox_aside;       /**< follow-ups Kafka refused for good, set
                                    aside as dead letters (reason outbox) */
  uint64_t outbox_stalled_ms;  /**< gauge: the longest time an owned
                                    partition's outbox has held follow-ups
                                    without one acknowledged */
  uint64_t outbox_kept;        /**< gauge: follow-ups Kafka refused, and
                                    their dead letters too, kept in the
                                    store's outbox until an operator drops
                                    them or the limits let them through */
  uint64_t timers_scheduled;   /**< delayed events (not_before) read and kept
                                    as timers, to run once due */
  uint64_t timers_fired;       /**< due timers' firing records written and
                                    acknowledged by Kafka */
  uint64_t timers_early;       /**< firing records read before their time (a
                                    clock stepped back, or another producer):
                                    their timers wait on */
  uint64_t timers_pending;     /**< gauge: timers waiting in the partitions
                                    owned: each one's count in the store when
                                    the worker took it, plus the timers its
                                    commits wrote since, less those they
                                    deleted (fired, settled, cancelled) */
  uint64_t timers_late;        /**< fired timers whose run committed more
                                    than 1 s after their time (the store's
                                    clock) */
} kl_worker_stats_t;

/**
 * Creates a worker for @p topic. @p conf is copied; "kafka.*" keys reach the
 * consumer (kafka.bootstrap.servers is required). @p store is borrowed and
 * must outlive the worker.
 * @returns KL_OK; KL_ECONF for a missing bootstrap, a retake period within
 *          the session timeout, or a kafka.auto.offset.reset other than
 *          "error" (the detail says why).
 */
KL_EXPORT kl_err_t kl_worker_new(const kl_conf_t *conf, const char *topic,
                                 kl_store_t *store, kl_handler_fn_t *handler,
                                 void *handler_opaque, kl_worker_t **out);

/**
 * Consumes and applies until kl_worker_stop(); then lets the running
 * events finish, commits what completed, leaves the group and returns
 * KL_OK. Events waiting for a retry are left to the next owner.
 * @returns an error when the worker cannot run (topic or dead-letter
 *          topic missing, partition count differs from
 *          worker.expect.partitions, a topic's or the dead-letter topic's
 *          retention.ms longer than store.dedup.retention unless
 *          worker.retention.check=warn, ...); or the store's error when
 *          it would not let the worker take an assigned partition within
 *          worker.acquire.wait (the worker then stopped, as after
 *          kl_worker_stop()).
 */
KL_EXPORT kl_err_t kl_worker_run(kl_worker_t *worker);

/** Asks kl_worker_run() to drain and return. Async-signal-safe. */
KL_EXPORT void kl_worker_stop(kl_worker_t *worker);

/**
 * Copies the counters into @p stats: the first @p size bytes of the
 * library's kl_worker_stats_t, at most sizeof(kl_worker_stats_t) of the
 * library; the bytes of @p stats past them are left as they were.
 *
 *     kl_worker_stats_t st;
 *     kl_worker_stats(worker, &st, sizeof st);
 *
 * @param size  sizeof(kl_worker_stats_t) as the caller was compiled: a
 *              program built against an older, smaller struct passes its
 *              size and gets the fields it knows of (see kl_worker_stats_t).
 * @returns KL_OK, or KL_EINVAL when @p worker or @p stats is NULL.
 * @remark Safe from any thread; the gauges are refreshed by the worker
 *         every few ms.
 */
KL_EXPORT kl_err_t kl_worker_stats(const kl_worker_t *worker,
                                   kl_worker_stats_t *stats, size_t size);

/** Frees @p worker (after kl_worker_run() returned); accepts NULL. */
KL_EXPORT void kl_worker_destroy(kl_worker_t *worker);

/* ---- Health and partition state, for an embedder's own probes ---------
 *
 * What `keylane worker --metrics-listen` serves as /healthz and per
 * partition, as calls: a program that embeds the worker answers its own
 * probes with them (docs/operations.md, "Metrics, health and the
 * dashboard"). Both read the worker from any thread while kl_worker_run()
 * runs, and before and after it. Each call reads the store once (a
 * PostgreSQL round trip), on a thread of the worker's, and waits for that
 * read 2 s at most from its start; calls that come while a read waits
 * share it. So a store that accepts and never answers holds no caller
 * longer: kl_worker_health() then says FAILING, cause
 * KL_WORKER_CAUSE_STORE, "the store has not answered a read for N ms",
 * and kl_worker_foreach_partition() gives epochs of 0.
 */

/** The verdict of kl_worker_health(). */
typedef enum kl_worker_health_status {
  KL_WORKER_HEALTH_OK = 0,       /**< runs and commits (/healthz 200 "ok") */
  KL_WORKER_HEALTH_DEGRADED = 1, /**< runs, but needs an operator; a
                                      restart would not help (200
                                      "degraded: ...") */
  KL_WORKER_HEALTH_FAILING = 2,  /**< cannot make progress (503
                                      "unhealthy: ...") */
} kl_worker_health_status_t;

/** Which check decided a verdict other than OK: the first that failed,
 *  in this order. */
typedef enum kl_worker_health_cause {
  KL_WORKER_CAUSE_NONE = 0,
  KL_WORKER_CAUSE_KAFKA_WAIT = 1,      /**< kl_worker_run() waits for Kafka
                                            at start (worker.kafka.wait) */
  KL_WORKER_CAUSE_PARTITION_COUNT = 2, /**< the topic's partition count is
                                            not the one the fleet expects */
  KL_WORKER_CAUSE_STORE = 3,           /**< the store does not answer, or
                                            the last 3 or more event runs
                                            failed in it (a handler's SQL
                                            refused for the store's setup:
                                            a revoked privilege), none
                                            applied since (checked after
                                            COMMITS_FAILING) */
  KL_WORKER_CAUSE_COMMITS_FAILING = 4, /**< the last 3 or more group
                                            commits failed, none since */
  KL_WORKER_CAUSE_FENCED = 5,          /**< fenced, nothing committed since */
  KL_WORKER_CAUSE_LOG_STOPPED = 6,     /**< a partition's log went
                                            backwards or lost records */
  KL_WORKER_CAUSE_STALLED = 7,         /**< a partition holds records and
                                            its watermark has not moved for
                                            worker.stall.ms */
  KL_WORKER_CAUSE_OUTBOX_STALLED = 8,  /**< follow-ups unacknowledged for
                                            worker.outbox.stall.ms */
  KL_WORKER_CAUSE_OUTBOX_KEPT = 9,     /**< follow-ups Kafka refuses are kept
                                            in the store (DEGRADED) */
} kl_worker_health_cause_t;

/**
 * The worker's health. The caller sets @c size to sizeof(kl_worker_health_t)
 * before the call; the library fills only that many bytes, so a program
 * built against an older header keeps working when fields are added here,
 * at the end.
 */
typedef struct kl_worker_health {
  size_t size; /**< in: sizeof(kl_worker_health_t) as the caller knows it */
  kl_worker_health_status_t status;
  kl_worker_health_cause_t cause;
  int32_t owned; /**< partitions owned now (Kafka's assignment) */
  /** For a person: "ok: owns 2 partitions", or what is wrong, the figures
   *  and the fix (what /healthz answers; ends with a newline). */
  char reason[1536];
} kl_worker_health_t;

/**
 * Decides the worker's health as `keylane worker`'s /healthz does.
 * @param health  its @c size set by the caller; filled.
 * @returns KL_OK (also for a FAILING verdict: the verdict is in
 *          @p health); KL_EINVAL for a NULL argument or a @c size below
 *          offsetof(kl_worker_health_t, reason) + 1.
 * @remark  Any thread. Remembers the fenced count it saw, so "fenced and
 *          nothing committed since" spans calls.
 */
KL_EXPORT kl_err_t kl_worker_health(kl_worker_t *worker,
                                    kl_worker_health_t *health);

/** A partition's verdict (Burrow's consumer statuses). */
typedef enum kl_worker_partition_status {
  KL_WORKER_PARTITION_OK = 0,
  KL_WORKER_PARTITION_WARN = 1,  /**< a key waits in retry backoff, or the
                                      watermark has not moved for half of
                                      worker.stall.ms while holding records */
  KL_WORKER_PARTITION_STALL = 2, /**< not moved for worker.stall.ms */
  KL_WORKER_PARTITION_ERR = 3,   /**< stopped: its log went backwards or
                                      lost records (keylane store reset) */
} kl_worker_partition_status_t;

/** Flags of kl_worker_partition_t: why a partition does not move. */
#define KL_WORKER_PARTITION_STOPPED 0x1u  /**< by the log guard (ERR) */
#define KL_WORKER_PARTITION_STALLED 0x2u  /**< see _STALL */
#define KL_WORKER_PARTITION_RETRYING 0x4u /**< keys wait in retry backoff */
#define KL_WORKER_PARTITION_RESIZED                                            \
  0x8u /**< the topic's partition count                                        \
            changed: nothing more is taken */
#define KL_WORKER_PARTITION_OWNED                                              \
  0x10u /**< owned now (a stopped partition                                    \
             may be listed after it is not) */

/**
 * One partition of the worker's topic, as kl_worker_foreach_partition()
 * hands it over: borrowed for the callback only. @c size is
 * sizeof(kl_worker_partition_t) as the library was built: a program built
 * against a newer header reads a field only when it lies within @c size.
 */
typedef struct kl_worker_partition {
  size_t size;
  int32_t partition;
  kl_worker_partition_status_t status;
  unsigned flags;         /**< KL_WORKER_PARTITION_* */
  uint64_t epoch;         /**< the owner epoch in the store; 0: none read */
  int64_t watermark;      /**< next offset to apply */
  int64_t high;           /**< Kafka's high watermark as last fetched; -1
                               unknown */
  int64_t lag;            /**< high - watermark (>= 0); -1 when unknown */
  double lag_seconds;     /**< age of the oldest unapplied record taken in,
                               from its envelope ts; 0 when none waits */
  int64_t oldest_ts_ms;   /**< that record's envelope ts (ms since the
                               epoch); 0: none held, or none with a ts */
  uint64_t records;       /**< records held in the partition's window */
  uint64_t waiting;       /**< of them, in retry backoff */
  int64_t unmoved_ms;     /**< how long the watermark has not moved while
                               holding records; 0 when it holds none */
  int64_t committed;      /**< the offset last committed to the group's
                               offsets in Kafka (for lag monitors; the store's
                               watermark is the truth); -1: none yet */
  uint64_t running;       /**< events its handlers run now */
  uint64_t outbox;        /**< follow-ups committed and not yet published */
  int64_t last_commit_ms; /**< the last store commit of its events (ms
                               since the epoch); 0: none since it was
                               taken */
  /** STOPPED: "went_backwards", "retention_gap", "log_replaced", ...; the
   *  same word as the metric's reason label. NULL when not stopped. */
  const char *stop_reason;
  /** STOPPED: the figures, the likely cause and the fixes, for a person
   *  (one line). NULL when not stopped. */
  const char *stop_detail;
} kl_worker_partition_t;

/** @returns 0 to go on, nonzero to stop kl_worker_foreach_partition(). */
typedef int(kl_worker_partition_cb_t)(void *opaque,
                                      const kl_worker_partition_t *partition);

/**
 * Calls @p cb for every partition the worker owns, in partition order,
 * then for every partition the log guard stopped that it no longer owns.
 * @returns KL_OK (also when @p cb stopped it); KL_EINVAL for NULL
 *          arguments; KL_ENOMEM.
 * @remark  Any thread; @p cb runs on the calling thread.
 */
KL_EXPORT kl_err_t kl_worker_foreach_partition(kl_worker_t *worker,
                                               kl_worker_partition_cb_t *cb,
                                               void *opaque);

/** The fences kl_worker_foreach_fence() remembers, the oldest dropped. */
#define KL_WORKER_FENCES_MAX 64

/**
 * A partition this worker was fenced from: a group commit of its refused
 * because a newer owner took the partition's epoch. @c size as in
 * kl_worker_partition_t.
 */
typedef struct kl_worker_fence {
  size_t size;
  int32_t partition;
  uint64_t epoch;         /**< this worker's epoch, refused */
  uint64_t current_epoch; /**< the store's epoch when the worker looked:
                               the newer owner's */
  int64_t at_ms;          /**< when it looked (ms since the Unix epoch),
                               within a second of the refused commit */
} kl_worker_fence_t;

/** @returns 0 to go on, nonzero to stop kl_worker_foreach_fence(). */
typedef int(kl_worker_fence_cb_t)(void *opaque, const kl_worker_fence_t *fence);

/**
 * Calls @p cb for the last KL_WORKER_FENCES_MAX fences of the worker,
 * newest first. A fence is seen by the check that takes a partition back
 * from a fencer gone quiet, so none is recorded with
 * worker.fenced.retake.ms=0.
 * @returns KL_OK (also when @p cb stopped it); KL_EINVAL for NULL
 *          arguments.
 * @remark  Any thread; @p cb runs on the calling thread, under a lock the
 *          poll thread takes: return soon.
 */
KL_EXPORT kl_err_t kl_worker_foreach_fence(kl_worker_t *worker,
                                           kl_worker_fence_cb_t *cb,
                                           void *opaque);

/** What holds a key (kl_worker_key_t.state); as a mask in
 *  kl_worker_keys_query_t.states. */
typedef enum kl_worker_key_state {
  KL_WORKER_KEY_WAITING = 0x1,  /**< its events wait their turn: queued, or
                                     behind the one that runs */
  KL_WORKER_KEY_RETRYING = 0x2, /**< its next event failed and waits for, or
                                     runs, its next attempt */
  KL_WORKER_KEY_PARKED = 0x4,   /**< its next event cannot go on until
                                     something else happens: its dead
                                     letter awaits Kafka's ack, its store
                                     failure the next commit, or its
                                     partition's new owner (fenced) */
} kl_worker_key_state_t;

/**
 * One key with events in the worker's window, as kl_worker_foreach_key()
 * hands it over: borrowed for the callback only. Its payloads are never
 * included. @c size as in kl_worker_partition_t.
 */
typedef struct kl_worker_key {
  size_t size;
  int32_t partition;
  kl_worker_key_state_t state;
  const void *key; /**< its bytes (the Kafka message key) */
  size_t key_len;
  int64_t offset;           /**< its next event's offset */
  uint64_t pending;         /**< its events in the window, not yet final */
  int attempts;             /**< its next event's handler runs so far */
  int64_t next_retry_ms;    /**< RETRYING: when the next attempt is due (ms
                                 since the epoch); 0 otherwise */
  int64_t first_failure_ms; /**< its next event's first failure; 0: none */
  int64_t last_failure_ms;  /**< and its last one; 0: none */
  const char *error;        /**< that failure, for a person; "" none */
  const char *parked;       /**< PARKED: on what, for a person; "" else */
} kl_worker_key_t;

/** Which keys kl_worker_foreach_key() hands over. */
typedef struct kl_worker_keys_query {
  size_t size;     /**< sizeof(kl_worker_keys_query_t) as the caller knows
                        it */
  unsigned states; /**< a mask of kl_worker_key_state_t; 0: every state */
  /** Only the keys at or after this place, in the order they are handed
   *  over (partition, then its next event's offset): the next page starts
   *  at the last key's partition and offset + 1. Zero: from the start. */
  int32_t from_partition;
  int64_t from_offset;
  size_t limit;    /**< keys handed over at most: 1..KL_WORKER_KEYS_MAX;
                        0: KL_WORKER_KEYS_MAX */
  const void *key; /**< non-NULL: only this key (key_len bytes) */
  size_t key_len;
} kl_worker_keys_query_t;

/** kl_worker_foreach_key()'s largest page. */
#define KL_WORKER_KEYS_MAX 1000

/** @returns 0 to go on, nonzero to stop kl_worker_foreach_key(). */
typedef int(kl_worker_key_cb_t)(void *opaque, const kl_worker_key_t *key);

/**
 * Calls @p cb for the keys of the worker's owned partitions that have
 * events in its window and match @p query, in partition order and, in a
 * partition, by the offset of each key's next event; at most
 * query->limit. The keys are copied out under the worker's lock first,
 * so @p cb may take its time.
 * @param total  if not NULL, receives how many keys match in all (the
 *               page's place aside), which may exceed what @p cb saw.
 * @returns KL_OK; KL_EINVAL for NULL arguments, a size of 0 or a limit
 *          above KL_WORKER_KEYS_MAX; KL_ENOMEM.
 * @remark  Any thread; @p cb runs on the calling thread.
 */
KL_EXPORT kl_err_t kl_worker_foreach_key(kl_worker_t *worker,
                                         const kl_worker_keys_query_t *query,
                                         kl_worker_key_cb_t *cb, void *opaque,
                                         size_t *total);

#ifdef __cplusplus
}
#endif
#endif
