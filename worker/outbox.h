/*
 * The worker's outbox publisher: publishes the follow-up events that its
 * lanes' commits put in the store's outbox (kl_txn_emit()), and removes
 * each from the store once Kafka acknowledged it.
 *
 * Per owned partition it lists the store's outbox from the seq it listed
 * last (commit order), publishes those records with a kl_producer_t
 * (acks=all, idempotent, murmur2 routing: kl_publish()'s guarantees) and,
 * as acks come back, removes them in one short store write per partition
 * and tick. A failed delivery is published again with the same id. When a
 * partition is taken (kl__outbox_own()) it lists from the beginning: what
 * a crashed or fenced predecessor committed and never removed is published
 * first, before anything this owner commits.
 *
 * Bound: at most worker.outbox.max records of a partition are held (listed
 * and not removed); the lanes pause the partition while it holds that many
 * (kl__outbox_full()) and resume it below half.
 *
 * A follow-up Kafka refuses for good (kl_err_is_retriable() is false: it
 * is larger than the destination accepts, the topic is invalid, ...) would
 * be refused again forever and hold back every follow-up after it: it is
 * set aside instead, as a dead letter of reason "outbox" (dlq.h), and once
 * Kafka acknowledged the letter it is removed from the store like a
 * published one. Nothing is removed before a whole copy is in Kafka: one
 * whose letter is refused too (larger than the dead-letter topic takes)
 * is kept in the store, listed by `keylane store outbox`, counted by
 * kl__outbox_stats().kept (/healthz says "degraded"; not a stall: it
 * waits for an operator, whom a restart would not replace), and published
 * again every 10 s until it goes through or an operator drops it
 * (`keylane store outbox --drop`). kl_txn_emit() refuses the follow-ups
 * the worker's limits already rule out (kl__txn_set_message_max()), so
 * this is left to a destination that takes less than the worker's own
 * topic or producer. Other failures are retried every second; while a
 * partition's outbox holds records and none is acknowledged, its stall
 * (kl__outbox_stats()) grows: /healthz fails past worker.outbox.stall.ms.
 *
 * A failed store call (a list or a removal: a server that is down) is
 * logged once, and the store is called again 1 s later, not at every
 * tick: what was listed stays queued, what was acknowledged stays to be
 * removed.
 *
 * The producer is made on the first record to publish: a worker whose
 * handlers emit nothing runs no second producer.
 *
 * Caveats: every call runs on the worker's poll thread, and so do the
 * delivery reports (inside kl__outbox_tick()); kl__outbox_stats() is read
 * from any thread.
 */
#ifndef KEYLANE_WORKER_OUTBOX_H
#define KEYLANE_WORKER_OUTBOX_H

#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/store.h"

typedef struct kl__outbox kl__outbox_t;

/** Creates the publisher of @p topic's follow-ups; @p conf is copied
 *  (its kafka.* keys reach the producer), @p store and @p dlq (where
 *  follow-ups are set aside) borrowed. */
struct kl__dlq;
kl_err_t kl__outbox_new(const kl_conf_t *conf, const char *topic,
                        kl_store_t *store, struct kl__dlq *dlq,
                        kl__outbox_t **out);

/**
 * Waits up to @p wait_ms for the deliveries in flight, removes what was
 * acknowledged, then frees @p ob; accepts NULL. What is left stays in the
 * store for the partition's next owner.
 */
void kl__outbox_destroy(kl__outbox_t *ob, int wait_ms);

/** @p partition was taken with lane generation @p gen: its outbox is
 *  listed from the start at the next tick. */
void kl__outbox_own(kl__outbox_t *ob, int32_t partition, uint64_t gen);

/** A commit of @p partition (generation @p gen) wrote follow-ups: they are
 *  listed and published at the next tick. Accepts a NULL @p ob. */
void kl__outbox_committed(kl__outbox_t *ob, int32_t partition, uint64_t gen);

/**
 * @p partition is given up in order (a revoke): publishes what its commits
 * left for up to @p wait_ms, so that the next owner need not, and removes
 * what was acknowledged. Then kl__outbox_drop().
 */
void kl__outbox_drain(kl__outbox_t *ob, int32_t partition, int wait_ms);

/** @p partition was given up or fenced: nothing more of it is published
 *  (deliveries in flight are still removed once acknowledged). */
void kl__outbox_drop(kl__outbox_t *ob, int32_t partition);

/** Lists, publishes, serves delivery reports and removes what was
 *  acknowledged. Never blocks for long: the poll loop calls it each turn. */
void kl__outbox_tick(kl__outbox_t *ob);

/** @returns nonzero when @p partition holds worker.outbox.max records or
 *  more; with @p half, when it holds more than half of that. */
int kl__outbox_full(const kl__outbox_t *ob, int32_t partition, int half);

/** @returns the records @p partition holds: listed, not yet removed. */
size_t kl__outbox_held(const kl__outbox_t *ob, int32_t partition);

/** Counters for kl_worker_stats(), over every partition. Any thread. */
typedef struct kl__outbox_stats {
  uint64_t pending;    /* records held now (listed or not yet) */
  uint64_t published;  /* published and acknowledged since the start */
  uint64_t aside;      /* set aside as dead letters since the start */
  uint64_t kept;       /* refused with their dead letters: kept in the
                          store until an operator acts (gauge) */
  uint64_t stalled_ms; /* the longest time a partition has held records
                          without one acknowledged */
} kl__outbox_stats_t;
void kl__outbox_stats(const kl__outbox_t *ob, kl__outbox_stats_t *stats);

struct kl__dlq_ref;
/** The ack of a follow-up set aside (its dead letter's delivery report,
 *  whose ref names KL__DLQ_OUTBOX_GEN): on the poll thread. */
void kl__outbox_aside_acked(kl__outbox_t *ob, const struct kl__dlq_ref *ref,
                            kl_err_t err, const char *errstr);

#endif
