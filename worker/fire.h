/*
 * Firing timers (docs/design.md, "Timers"): for each partition the worker
 * owns, the owner reads the store's due index in due order, a window at a
 * time, and writes a firing record (kl__dlq_timer()) for each timer whose
 * time has come; the record, read back through the key's lane, runs the
 * event (worker/apply.c). It keeps which records are in flight (written,
 * their timers still in the index), so that a read writes each due timer
 * once while its owner holds the partition, whatever commits land before
 * it; a record not read back within KL__FIRE_AGAIN_MS (lost, or not
 * acknowledged) is written again. Writing one twice is harmless (the
 * second is a duplicate), but costs a Kafka record, a read and a dedup
 * check: a new owner writes again what its predecessor had in flight.
 *
 * Reads: the owner is the only writer of its partitions' timers, so it
 * reads a partition's index when it takes the partition, then only when a
 * timer it read is due, when it committed a new one (kl__fire_soon()), or
 * to write again what was not read back: a partition without timers costs
 * one read per take, and a walk of its index to count them
 * (kl__fire_own()).
 *
 * Memory: per partition, a few times and counters, and the records in
 * flight, 24 bytes each (the timer's due and h, when it was written): at
 * most KL__FIRE_AHEAD, 96 KiB, plus as much again while a read builds the
 * next set. They are dropped as a read walks past where their timers were
 * (a commit took them), and with the partition. Work: a read walks the
 * index from its start, past the records in flight (at most
 * KL__FIRE_AHEAD: no more are written until some are taken), to at most
 * KL__FIRE_WINDOW due ones to write, and stops at the first not due.
 */
#ifndef KEYLANE_WORKER_FIRE_H
#define KEYLANE_WORKER_FIRE_H

#include <stdint.h>

#include "keylane/store.h"
#include "worker/dlq.h"

/* When a partition's due index could not be read, it is read again this
 * much later, in ms. */
#define KL__FIRE_POLL_MS 1000
/* A firing record not read back (its timer still there) this long after
 * it was written is written again. */
#define KL__FIRE_AGAIN_MS 10000
/* The most firing records one partition writes per tick. */
#define KL__FIRE_WINDOW 256
/* The most firing records of one partition in flight: written and their
 * timers not yet taken by a commit. The owner writes no more until those
 * are read back, so that its producer's queue and the log's unread tail
 * stay bounded when many timers fall due at once, and a read walks at
 * most this many entries before the first to write. */
#define KL__FIRE_AHEAD 4096
/* A fired timer's run committed more than this after its time, in ms,
 * counts as late (timers_late): past what the owner's read at the due
 * time and the firing record's trip through Kafka and the key's lane take
 * when the worker keeps up (docs/benchmarks.md, "Timers"). */
#define KL__FIRE_LATE_MS 1000
/* A partition holding KL__FIRE_AHEAD records in flight reads its index
 * again once a commit took timers of it (kl__fire_count()), or this much
 * later, in ms. */
#define KL__FIRE_HELD_MS 100

typedef struct kl__fire kl__fire_t;

/** @p topic and @p store are borrowed, @p dlq writes the records. */
kl_err_t kl__fire_new(const char *topic, kl_store_t *store, kl__dlq_t *dlq,
                      kl__fire_t **out);
void kl__fire_destroy(kl__fire_t *fire);

/** The worker owns @p partition now: its due index is read at the next
 *  tick. Counts its pending timers (kl__timers_count(), a walk of its
 *  index): call it on the poll thread before any commit of the partition
 *  can land, and not under the lanes' lock. */
void kl__fire_own(kl__fire_t *fire, int32_t partition);
/** The worker gave @p partition up: nothing more is written for it. */
void kl__fire_drop(kl__fire_t *fire, int32_t partition);

/** A commit of the lanes of @p partition wrote a timer due at @p due_ms:
 *  its index is read at the next tick, which writes the due ones not in
 *  flight (this one, when it is due), not those in flight again. */
void kl__fire_soon(kl__fire_t *fire, int32_t partition, int64_t due_ms);

/** Writes the due timers' records of the owned partitions whose read is
 *  due. On the poll thread, not under the lanes' lock (store reads). */
void kl__fire_tick(kl__fire_t *fire);

/** The ack of a firing record (a ref of KL__DLQ_TIMER_GEN). */
void kl__fire_acked(kl__fire_t *fire, const kl__dlq_ref_t *ref, kl_err_t err);

/** A commit of @p partition's lanes wrote @p delta more timers than it
 *  deleted (scheduled less fired, settled and cancelled). */
void kl__fire_count(kl__fire_t *fire, int32_t partition, int64_t delta);

/** Timers pending in the partitions owned: each one's count at take,
 *  kept by kl__fire_count(). Any thread. */
uint64_t kl__fire_pending(kl__fire_t *fire);

/** firing records written and acknowledged by Kafka. */
uint64_t kl__fire_sent(const kl__fire_t *fire);

#endif
