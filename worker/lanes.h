/*
 * The per-partition engine: one lane per owned partition, used by
 * worker.c (the poll thread) and lanes_pool.c (the executors).
 *
 * A lane holds a window of the partition's records from its watermark on,
 * in offset order; each record is a slot (QUEUED, RUNNING, WAITING in
 * backoff, DLQ_PENDING, then final: DONE or DLQ_DONE). Per event key the
 * pending slots form a FIFO; only the head of a key that is not running,
 * waiting or being dead-lettered is ready. So one key's events run
 * strictly in order, other keys' run concurrently, and a failing key
 * holds up only itself.
 *
 * The poll thread group-commits a lane's final slots in ONE fenced store
 * transaction: every completed event's writes and idempotency mark
 * (applied, or dead-lettered), duplicate counts, and the watermark = the
 * first slot that is not final. Final slots beyond it are committed too;
 * after a restart they are consumed again and skipped by their marks.
 * The lanes due at one tick share one store commit (one LMDB write
 * transaction), each still guarded by its own epoch.
 *
 * Bounds: a lane's window holds at most worker.window.max records and the
 * worker at most worker.waiting.max keys in backoff; past either the
 * partition is paused (Kafka pause) and resumed below half.
 *
 * Memory: bookkeeping that cannot be allocated aborts the process. The
 * store is the source of truth, and a restarted worker resumes from it;
 * a lane that dropped a record instead would commit past it.
 */
#ifndef KEYLANE_WORKER_LANES_H
#define KEYLANE_WORKER_LANES_H

#include <librdkafka/rdkafka.h>

#include "keylane/worker.h"
#include "worker/apply.h"
#include "store/store_internal.h"
#include "worker/dlq.h"

typedef struct kl__lanes kl__lanes_t;
typedef struct kl__lane kl__lane_t;
struct kl__slot;
struct kl__child;

/** One event handed to an executor. */
typedef struct kl__job {
  kl__lane_t *lane;
  struct kl__slot *slot;
  uint64_t lane_gen;
  int32_t partition;
  uint64_t epoch;
  const rd_kafka_message_t *msg; /* valid until kl__lanes_done() */
} kl__job_t;

typedef enum kl__outcome {
  KL__RUN_APPLIED,   /* the handler said OK; writes in the child */
  KL__RUN_DUPLICATE, /* its id was seen */
  KL__RUN_RETRY,     /* the handler said RETRY */
  KL__RUN_FAIL,      /* the handler said FAIL */
  KL__RUN_DECODE,    /* the record is not a valid envelope */
  KL__RUN_RESERVED,  /* its id begins with '~' and is no follow-up's */
  KL__RUN_STORE,     /* the store failed: run it again, not an attempt */
  KL__RUN_FENCED,    /* kl_store_begin() said a newer owner holds it */
  KL__RUN_MISROUTED, /* its key routes to another partition: not run */
} kl__outcome_t;

typedef struct kl__run {
  kl__outcome_t outcome;
  const char *why; /* RETRY, FAIL, DECODE, RESERVED, STORE */
  const char *id;  /* the decoded idempotency key as a sid (scoped by its
                      entity key: store_internal.h), or NULL */
  size_t id_len;
  struct kl__child *child;    /* APPLIED: merged into the lane's overlay */
  int32_t expected_partition; /* MISROUTED: where its key routes */
  int64_t ts_ms;     /* APPLIED: the envelope's ts, for the latency histogram */
  int64_t scheduled; /* APPLIED: a delayed event became a timer (its
                        writes), due then; 0: it did not */
  int early;         /* DUPLICATE: a firing record read before its time */
  int64_t due_ms;    /* APPLIED: the not_before of a fired timer's event,
                        for its lateness; 0: not one */
} kl__run_t;

/** Counters and gauges, as kl_worker_stats() reports them. */
void kl__lanes_stats(const kl__lanes_t *lanes, kl_worker_stats_t *stats);

/**
 * Creates the engine. @p applier is copied (its decoder stays the
 * caller's); @p rk (the consumer) and @p dlq are borrowed.
 * worker.concurrency = 1 selects inline mode: the poll thread runs the
 * events itself, inside the lane's open group transaction.
 */
kl_err_t kl__lanes_new(const kl_conf_t *conf, const kl__applier_t *applier,
                       rd_kafka_t *rk, kl__dlq_t *dlq, kl__lanes_t **out);
void kl__lanes_destroy(kl__lanes_t *lanes);

/**
 * The lanes' own metrics, kept across scrapes: the latency histograms
 * keylane_worker_event_latency_seconds (envelope ts to the commit that
 * applied the event) and keylane_worker_event_commit_latency_seconds
 * (taken from the consumer to that commit), by topic. Borrowed, valid
 * until kl__lanes_destroy(); render it from any thread.
 */
struct kl__metrics *kl__lanes_metrics(kl__lanes_t *lanes);

/** Offset commits sent to Kafka so far (lanes_internal.h says how
 *  often at most). Any thread. */
uint64_t kl__lanes_kafka_commits(kl__lanes_t *lanes);

/**
 * The outcome of an offset commit (the consumer's offset_commit_cb): a
 * partition whose commit failed (a rebalance in progress, a coordinator
 * that moved) is sent again at the next tick, or an idle partition's
 * group offset would stay behind its watermark for good. Poll thread.
 */
void kl__lanes_kafka_committed(kl__lanes_t *lanes,
                               const rd_kafka_topic_partition_list_t *offsets,
                               rd_kafka_resp_err_t err);

/** Group transactions begun ahead, their ids looked up while another
 *  partition's handlers ran (PostgreSQL, inline mode). Any thread. */
uint64_t kl__lanes_ahead(kl__lanes_t *lanes);

/** The bounds (seconds) of those two latency histograms' buckets, for
 *  whoever measures a latency to compare with them (keylane-bench). */
extern const double kl__lanes_latency_buckets[];
extern const size_t kl__lanes_latency_buckets_count;

/**
 * Checks every record's routing from now on: its key must route
 * (kl_partition()) to its partition among @p partitions, else it is
 * misrouted and, by @p policy (worker.misrouted), dead-lettered ("dlq") or
 * re-published to its key's partition ("forward"); "apply" checks nothing.
 * Before the executors start (kl__lanes_pool_new() copies the applier).
 */
void kl__lanes_route(kl__lanes_t *lanes, int32_t partitions,
                     const char *policy);

/**
 * Misrouted records seen per partition since the worker started: fills
 * @p by_partition[0..n-1]. Any thread. @returns n (at most @p max).
 */
size_t kl__lanes_misrouted(kl__lanes_t *lanes, uint64_t *by_partition,
                           size_t max);

/**
 * The topic's partition count changed: every lane is paused for good (the
 * bounds' resumes leave it paused); events already in the windows still
 * run and commit. Poll thread.
 */
void kl__lanes_stop_taking(kl__lanes_t *lanes);

/** Makes room for partitions 0..@p count-1. Poll thread. */
void kl__lanes_reserve(kl__lanes_t *lanes, int32_t count);

/** Takes @p partition, owned with @p epoch, from @p watermark. Poll thread. */
void kl__lanes_own(kl__lanes_t *lanes, int32_t partition, uint64_t epoch,
                   int64_t watermark);

/**
 * The partitions whose lane is fenced (and not yet revoked), at most
 * @p max of them into @p out. Poll thread. @returns how many.
 */
size_t kl__lanes_fenced(kl__lanes_t *lanes, int32_t *out, size_t max);

/* Settles the commit in flight and stops the committer thread for good;
 * later commits run on the calling thread. Call it before the consumer
 * closes: the committer wakes the consumer's queue, which would cut the
 * close's own polls short. Also done by kl__lanes_pool_destroy(). */
void kl__lanes_flight_stop(kl__lanes_t *lanes);

/**
 * Gives @p partition up: stops scheduling it, waits for its running
 * events, and with @p commit waits a while for its dead letters' acks and
 * group-commits what is final. Poll thread.
 * @returns the lane's committed watermark; -1 when it was not owned.
 */
int64_t kl__lanes_release(kl__lanes_t *lanes, int32_t partition, int commit,
                          uint64_t *epoch);

/** Where an owned lane stands, for the log checks (log_guard.c). */
typedef struct kl__lane_pos {
  uint64_t epoch;
  int64_t watermark;      /* committed: the store's */
  int64_t next_offset;    /* the offset the lane takes next */
  int64_t below;          /* lowest offset delivered below next_offset
                             since the last kl__lanes_pos(), or -1 */
  uint64_t below_applied; /* of those records, below the watermark */
  int paused;             /* paused for any reason (KL__PAUSE_*) */
} kl__lane_pos_t;

/**
 * Fills @p pos for @p partition and clears its record of offsets below
 * its position. Poll thread. @returns 0, or -1 when it is not owned.
 */
int kl__lanes_pos(kl__lanes_t *lanes, int32_t partition, kl__lane_pos_t *pos);

/**
 * The partitions to which the consumer delivered records below the lane's
 * position (the lane dropped them, counting nothing) since the last call,
 * at most @p max of them into @p out. Without a lock when there are none:
 * the poll loop asks every turn. Poll thread. @returns how many.
 */
size_t kl__lanes_below(kl__lanes_t *lanes, int32_t *out, size_t max);

/**
 * Pauses @p partition (and drops what it is given) while its log is
 * checked or after the check failed; its window still runs and commits.
 * Poll thread.
 */
void kl__lanes_halt(kl__lanes_t *lanes, int32_t partition);

/**
 * Ends kl__lanes_halt(): the lane takes records from offset @p from on
 * (when it is beyond its position) and resumes; @p redelivered records
 * dropped meanwhile are counted as redelivered. Seek the consumer first.
 * Poll thread.
 */
void kl__lanes_go_on(kl__lanes_t *lanes, int32_t partition, int64_t from,
                     uint64_t redelivered);

/**
 * Takes @p m (ownership passes) into its lane's window, taken from the
 * consumer at @p taken_ns (kl__mono_ns()), for the commit latency. One at
 * a time: a record that fills its window pauses the partition before the
 * consumer hands over the next one (the bound is exact). Poll thread.
 */
void kl__lanes_push(kl__lanes_t *lanes, rd_kafka_message_t *m,
                    int64_t taken_ns);

/**
 * Picks a ready event; with @p wait blocks until there is one or
 * kl__lanes_stop(). @returns 1 with *job filled, 0 otherwise.
 */
int kl__lanes_take(kl__lanes_t *lanes, kl__job_t *job, int wait);

/** Hands back what running @p job gave. Any thread. */
void kl__lanes_done(kl__lanes_t *lanes, const kl__job_t *job,
                    const kl__run_t *run);

/**
 * Inline mode: the lane's open group transaction, begun when there is
 * none. Poll thread.
 */
kl_err_t kl__lanes_batch(kl__lanes_t *lanes, const kl__job_t *job,
                         kl_txn_t **txn);

/**
 * The poll thread's periodic work: retries that are due, dead letters to
 * produce, group commits that are due, fencing, pause and resume, gauges
 * and the 10 s report line.
 */
void kl__lanes_tick(kl__lanes_t *lanes);

/** @returns nonzero when some event is ready to run. */
int kl__lanes_has_ready(kl__lanes_t *lanes);

/** Wakes the executors blocked in kl__lanes_take() for good. */
void kl__lanes_stop(kl__lanes_t *lanes);

/** Sets the largest record a follow-up may be (kl__txn_set_message_max()),
 *  before the executors start. */
void kl__lanes_set_message_max(kl__lanes_t *lanes, size_t message_max,
                               const char *source);

/** The test hook of worker_internal.h. */
void kl__lanes_set_before_commit(kl__lanes_t *lanes, kl__worker_hook_fn *fn,
                                 void *opaque);

/** The test seam kl__worker_set_run_fault(). */
void kl__lanes_set_run_fault(kl__lanes_t *lanes, kl__run_fault_fn *fn,
                             void *opaque);

/** The test hook kl__worker_set_after_commit(). */
void kl__lanes_set_after_commit(kl__lanes_t *lanes, kl__worker_hook_fn *fn,
                                void *opaque);

/** The dead-letter producer's ack callback (opaque: the lanes). */
void kl__lanes_dlq_ack(void *opaque, const kl__dlq_ref_t *ref, kl_err_t err,
                       const char *errstr);

/**
 * The store keeps @p ident as the record at @p offset, the watermark - 1
 * of @p partition, which its owner now resumes at @p offset instead of the
 * watermark: that record, when it arrives, is compared with @p ident
 * (kl__apply_ident()) and dropped as applied. Another record there means
 * the log was replaced (kl__lanes_replaced()). @p ident is copied. Poll
 * thread, after kl__lanes_own().
 */
void kl__lanes_verify(kl__lanes_t *lanes, int32_t partition, int64_t offset,
                      const char *ident, size_t len);

/** What kl__lanes_replaced() reports of one partition. */
typedef struct kl__lane_replaced {
  int32_t partition;
  uint64_t epoch;
  int64_t offset; /* the record compared: the watermark - 1 */
  char expected[KL__SID_MAX], found[KL__SID_MAX];
  size_t expected_len, found_len;
} kl__lane_replaced_t;

/**
 * Takes one owned partition whose log was replaced (its record at the
 * watermark - 1 is another than the store applied), now halted, into
 * @p out. @returns 1, or 0 when there is none. Poll thread.
 */
int kl__lanes_replaced(kl__lanes_t *lanes, kl__lane_replaced_t *out);

#endif
