/*
 * A dead-letter topic read back: its records, with the keylane.dlq.*
 * headers the worker wrote (worker/dlq.h) parsed into the origin (topic,
 * partition, offset) and the reason. For `keylane replay --from-dlq`
 * (redrive.h) and for replay, which records as dead letters the events the
 * fleet dead-lettered instead of stopping at them.
 *
 * Ownership: the letters own their messages; kl__letters_clear() frees
 * them.
 */
#ifndef KEYLANE_WORKER_LETTERS_H
#define KEYLANE_WORKER_LETTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/kafka_pos.h"
#include "keylane/conf.h"

#define KL__LETTER_TOPIC_MAX 249

typedef struct kl__letter {
  rd_kafka_message_t *msg; /* the dead letter: original key, value, headers */
  int32_t dlq_partition;
  int64_t dlq_offset;
  char topic[KL__LETTER_TOPIC_MAX + 1]; /* origin; "" when not a letter */
  int32_t partition; /* origin; -1 when the headers are missing */
  int64_t offset;
  char reason[32]; /* decode | handler_fail | max_attempts | misrouted |
                      outbox */
  char destination[KL__LETTER_TOPIC_MAX + 1]; /* outbox: the follow-up's
                                                 topic; "" otherwise */
  /* A letter older versions cut short (keylane.dlq.truncated): why Kafka
   * refused the whole record, and the record's size; "" and -1 for a
   * whole letter. It holds no event: it is never redriven. */
  char truncated[128];
  int64_t original_size;
} kl__letter_t;

typedef struct kl__letters {
  kl__letter_t *v;
  size_t n, cap;
  rd_kafka_t *rk; /* its messages hold it: destroyed after them */
} kl__letters_t;

/**
 * Reads the records of every partition of @p dlq_topic in [@p from, @p to)
 * ("kafka.*" of @p conf reach the consumer), sorted by origin topic,
 * partition and offset (records that are not letters first).
 * @param stop  may be NULL; when set, reading stops (what was read stays).
 * @returns KL_OK; KL_ENOTFOUND when the topic does not exist; a Kafka
 *          error with the detail.
 */
kl_err_t kl__letters_read(const kl_conf_t *conf, const char *dlq_topic,
                          const kl__pos_t *from, const kl__pos_t *to,
                          volatile int *stop, kl__letters_t *out);

/** A dead letter's place: its partition and offset in the dead-letter
 *  topic. */
typedef struct kl__letter_ref {
  int32_t partition;
  int64_t offset;
} kl__letter_ref_t;

/** Whether kl__letters_tail() keeps @p letter (parsed, msg set). */
typedef bool(kl__letters_keep_fn)(void *opaque, const kl__letter_t *letter);

/**
 * Reads the last @p tail records of each partition of @p dlq_topic (from
 * each partition's end offset back, never before its start) and keeps the
 * letters @p keep accepts (NULL: every one), @p max of them at most: past
 * it the oldest kept (record timestamp, then partition and offset) is
 * destroyed at once, so that it holds @p max messages whatever the topic
 * holds. The letters come sorted newest first.
 * @param stop     as kl__letters_read()'s.
 * @param scanned  receives the records read; may be NULL.
 * @param more     receives whether a letter @p keep accepted was dropped
 *                 for @p max; may be NULL.
 * @returns as kl__letters_read().
 */
kl_err_t kl__letters_tail(const kl_conf_t *conf, const char *dlq_topic,
                          int64_t tail, size_t max, kl__letters_keep_fn *keep,
                          void *opaque, volatile int *stop, kl__letters_t *out,
                          size_t *scanned, bool *more);

/**
 * Reads the records at @p refs (@p n of them, each read alone: their
 * offsets may lie far apart), sorted as kl__letters_read() sorts. A ref
 * outside its partition's retained log, or of a partition the topic does
 * not have, is not read: out->n tells how many were.
 * @returns as kl__letters_read().
 */
kl_err_t kl__letters_read_at(const kl_conf_t *conf, const char *dlq_topic,
                             const kl__letter_ref_t *refs, size_t n,
                             volatile int *stop, kl__letters_t *out);

/*
 * A redriven letter's record in the store, a handler key of its own:
 * "keylane.redriven/<dead-letter topic>/<partition>/<offset>", the letter's
 * position. A redrive puts it in the commit that applies the letter, and
 * finds it there before running a letter: unlike the letter's idempotency
 * key, it is never swept, so a letter redriven after its id's retention
 * passed is still a duplicate. One record per letter ever redriven.
 */
#define KL__LETTER_KEY_PREFIX "keylane.redriven/"
#define KL__LETTER_KEY_MAX                                                     \
  (sizeof(KL__LETTER_KEY_PREFIX) + KL__LETTER_TOPIC_MAX + 2 + 11 + 20)

/** Writes @p letter's record key into @p key (KL__LETTER_KEY_MAX bytes).
 *  @returns its length. */
size_t kl__letter_key(const char *dlq_topic, const kl__letter_t *letter,
                      char *key);

/** Frees the messages and the array; leaves @p letters empty. */
void kl__letters_clear(kl__letters_t *letters);

/** @returns the letter of an origin record, or NULL. */
const kl__letter_t *kl__letters_find(const kl__letters_t *letters,
                                     const char *topic, int32_t partition,
                                     int64_t offset);

#endif
