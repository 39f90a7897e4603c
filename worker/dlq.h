/*
 * The dead-letter topic: the worker's own idempotent producer (acks=all)
 * that writes a record the worker gives up on, unchanged (key, value,
 * headers), to `<topic>.dlq` (worker.dlq.topic overrides), with headers
 * that say why and where it came from:
 *
 *   keylane.dlq.reason            decode | handler_fail | max_attempts |
 *                                 misrouted | outbox | reserved_id
 *   keylane.dlq.error             the decoder's or the handler's text
 *   keylane.dlq.attempts          handler runs (0 for decode, reserved_id)
 *   keylane.dlq.topic / .partition / .offset   the origin
 *   keylane.dlq.first_failure_ms / .last_failure_ms  ms since the epoch
 *   keylane.dlq.expected_partition  misrouted: the partition its key routes
 *                                 to (.partition is where it arrived)
 *
 * A follow-up (kl_txn_emit()) that Kafka refuses for good is set aside by
 * the outbox as a letter of reason outbox, so that the follow-ups behind it
 * go on: its key and value are the follow-up's, keylane.dlq.topic,
 * .partition and .offset name the event that emitted it (read from the
 * follow-up's id), and
 *
 *   keylane.dlq.destination       the topic the follow-up was for
 *
 * `keylane redrive` re-publishes it to its destination, as it re-publishes
 * a misrouted letter to its key's partition.
 *
 * The same producer forwards misrouted records (worker.misrouted=forward)
 * and redrives misrouted letters: the record, unchanged but for its
 * keylane.dlq.* headers, to its key's partition of the origin topic, with
 * keylane.forward.partition / .offset naming where it came from.
 *
 * Delivery reports come back through the ack callback; an error is handed
 * back too, and the caller produces the letter again: a letter is never
 * dropped. Records are keyed by their original key, partitioned like
 * keylane's producer (murmur2, Java-compatible).
 *
 * A letter is always the whole record: none is ever cut short. One Kafka
 * refuses for good because of the record itself (too large with the
 * headers for message.max.bytes, or for the dead-letter topic's
 * max.message.bytes) is reported to the caller, whose source then stays
 * where it is (the lane's record at its offset, the outbox's follow-up in
 * the store) until the limits let the letter through or an operator acts.
 * Letters that older versions cut short carry keylane.dlq.truncated (and
 * keylane.dlq.original_size); `keylane replay --from-dlq` refuses them
 * (letters.h).
 *
 * Caveats: kl__dlq_send() and kl__dlq_poll() run on the worker's poll
 * thread; the ack callback runs inside kl__dlq_poll().
 */
#ifndef KEYLANE_WORKER_DLQ_H
#define KEYLANE_WORKER_DLQ_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "keylane/conf.h"
#include "keylane/error.h"
#include "keylane/event.h"
#include "keylane/store.h"

typedef enum kl__dlq_reason {
  KL__DLQ_DECODE = 0,
  KL__DLQ_HANDLER_FAIL,
  KL__DLQ_MAX_ATTEMPTS,
  KL__DLQ_MISROUTED,
  KL__DLQ_OUTBOX,
  KL__DLQ_RESERVED_ID, /* an id beginning with '~' that no follow-up has */
} kl__dlq_reason_t;

/** @returns "decode", "handler_fail", "max_attempts", "misrouted",
 *  "outbox" or "reserved_id". */
const char *kl__dlq_reason_name(kl__dlq_reason_t reason);

typedef struct kl__dlq kl__dlq_t;

/** What identifies a letter in its ack: the lane's generation and origin;
 *  for a follow-up set aside, KL__DLQ_OUTBOX_GEN, the source partition and
 *  the outbox seq. */
typedef struct kl__dlq_ref {
  int32_t partition;
  int64_t offset;
  uint64_t lane_gen;
} kl__dlq_ref_t;
#define KL__DLQ_OUTBOX_GEN UINT64_MAX
/* A firing record's (worker/fire.h): the partition and the offset that
 * scheduled the timer. */
#define KL__DLQ_TIMER_GEN (UINT64_MAX - 1)
/* The Kafka header of a firing record: the offset of the record that
 * scheduled the timer (docs/design.md, "Timers"). */
#define KL__TIMER_HEADER "keylane.timer"
/* The Kafka headers of a redriven delayed event published back to its
 * partition (kl__dlq_redrive()): the offset of the record whose letter it
 * is, and that letter's record key (worker/letters.h). */
#define KL__REDRIVE_HEADER "keylane.redrive"
#define KL__REDRIVE_LETTER_HEADER "keylane.redrive.letter"

/**
 * Delivery report of one letter: @p err is KL_OK once Kafka acknowledged
 * it with acks=all; KL_EKAFKA when Kafka refuses this record for good
 * (it never takes it as it is); else KL_EKAFKA_TRANSIENT. @p errstr says why;
 * it is a static string.
 */
typedef void(kl__dlq_ack_fn)(void *opaque, const kl__dlq_ref_t *ref,
                             kl_err_t err, const char *errstr);

typedef struct kl__dlq_letter {
  const rd_kafka_message_t *msg; /* the original record; borrowed */
  kl__dlq_reason_t reason;
  const char *error;
  int attempts;
  int64_t first_failure_ms, last_failure_ms;
  int32_t expected_partition; /* misrouted: its key's partition; else -1 */
  int forward; /* re-publish to expected_partition of the source topic */
  const char *destination; /* KL__DLQ_OUTBOX: the follow-up's topic; msg
                              is then built, not consumed (no headers) */
} kl__dlq_letter_t;

/**
 * Creates the producer for the dead letters of @p topic. "kafka.*" keys of
 * @p conf reach it (consumer-only ones are ignored by librdkafka).
 */
kl_err_t kl__dlq_new(const kl_conf_t *conf, const char *topic,
                     kl__dlq_ack_fn *ack, void *opaque, kl__dlq_t **out);

/** Sets the ack callback's opaque (before the first kl__dlq_send()). */
void kl__dlq_set_opaque(kl__dlq_t *dlq, void *opaque);

/** Frees @p dlq (letters still in flight are not acked); accepts NULL. */
void kl__dlq_destroy(kl__dlq_t *dlq);

/** @returns the dead-letter topic's name; valid while @p dlq lives. */
const char *kl__dlq_topic(const kl__dlq_t *dlq);

/**
 * Checks that the dead-letter topic exists, so that a missing one fails
 * the worker at start, not at its first dead letter.
 * @returns KL_OK, or KL_ENOTFOUND whose detail says how to create it.
 */
kl_err_t kl__dlq_check(kl__dlq_t *dlq, const char *source_topic);

/**
 * Produces @p letter. On KL_OK its ack will come; on KL_EKAFKA the record
 * itself is refused (larger than the producer's message.max.bytes): it is
 * never taken as it is, and its source must stay where it is; on another
 * error (a full queue, ...) nothing was produced: try again later.
 */
kl_err_t kl__dlq_send(kl__dlq_t *dlq, const char *source_topic,
                      const kl__dlq_letter_t *letter, const kl__dlq_ref_t *ref);

/**
 * Produces a due timer's firing record to @p partition of @p topic: the
 * key, the stored envelope @p env, and the header KL__TIMER_HEADER naming
 * @p offset, the record that scheduled it; acked under KL__DLQ_TIMER_GEN.
 */
kl_err_t kl__dlq_timer(kl__dlq_t *dlq, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const void *env,
                       size_t env_len, int64_t offset);

/**
 * Re-publishes @p msg (key, value, and its headers but keylane.dlq.*) to
 * @p partition of @p topic, acked like a letter: the way a misrouted
 * record reaches the owner of its key.
 */
kl_err_t kl__dlq_forward(kl__dlq_t *dlq, const char *topic, int32_t partition,
                         const rd_kafka_message_t *msg,
                         const kl__dlq_ref_t *ref);

/**
 * As kl__dlq_forward(), with the headers KL__REDRIVE_HEADER naming
 * @p msg's offset (the record the letter was) and KL__REDRIVE_LETTER_HEADER
 * holding @p letter_key, stamped by the store's clock: a redriven delayed
 * event, which its owner schedules as a first reading (worker/apply.c).
 */
kl_err_t kl__dlq_redrive(kl__dlq_t *dlq, const char *topic, int32_t partition,
                         const rd_kafka_message_t *msg, const char *letter_key,
                         const kl__dlq_ref_t *ref);

/** Serves delivery reports for up to @p timeout_ms. */
void kl__dlq_poll(kl__dlq_t *dlq, int timeout_ms);

/*
 * The record's value names the event that was redriven (its sid,
 * store_internal.h) in the record of a redriven letter (letters.h): a delayed
 * event published back names its letter in a header any producer can write, so
 * a record of another event that names the letter must not take it for done
 * (the letter would never run). A value of "1", written before the record named
 * its event, is done.
 */
/** Puts @p letter_key's record for @p event in @p txn. */
kl_err_t kl__letter_done_put(kl_txn_t *txn, const char *letter_key,
                             size_t letter_key_len, const kl_event_t *event);
/** Whether the record's value @p v (@p len bytes) says @p event was
 *  redriven (the caller's key and id, @p key, @p id). */
bool kl__letter_done_by(const void *v, size_t len, const void *key,
                        size_t key_len, const char *id, size_t id_len);

#endif
