/*
 * Dead-letter redrive: the letters of a dead-letter topic go back through
 * the handler with their original idempotency keys, each in a batch of its
 * own through kl__apply_batch(), in its origin partition, fenced by an
 * epoch like any owner (the rule of replay.h: the live owner of that
 * partition is fenced). A letter whose id the store recorded as
 * dead-lettered runs the handler and, when it succeeds, is recorded as
 * applied, so a second redrive skips it: each letter applies at most once.
 * The outcome of each letter is reported: applied, duplicate (its id was
 * applied already), failed (the handler or the decoder refused it again;
 * it stays a dead letter), pending (its origin offset is not below the
 * partition's watermark yet: the owner has not recorded it, and applying
 * it would move the watermark over events not yet applied), fenced.
 *
 * A redriven event is applied after the later events of its key: that is
 * what a redrive is, and why it is an operator's decision.
 *
 * Both stores record a dead-lettered id as applied once it is redriven,
 * and never an applied id as dead-lettered (kl__mark_merge()), which is
 * what makes a second redrive skip it. An id is swept after
 * store.dedup.retention while its letter may stay longer, so the same
 * commit also puts the letter's own record (letters.h, kl__letter_key()),
 * which is never swept: a letter found there is a duplicate whatever its
 * id's mark.
 *
 * A misrouted letter (reason misrouted: its key routes to another
 * partition than the one it arrived on) is not applied here: it is
 * re-published, unchanged but for its keylane.dlq.* headers, to its key's
 * partition (murmur2, the topic's partition count now), and the owner of
 * that partition applies it once, in order with the key's other events
 * from then on (republished). Such a letter has no dead-letter mark (its id
 * was never read), so the owner treats it as a new event; a second
 * redrive re-publishes it again, and the owner skips that copy by its id.
 * An outbox letter (a follow-up Kafka refused, set aside by the outbox:
 * outbox.h) is re-published the same way to its key's partition of its
 * destination topic (keylane.dlq.destination), once the operator has fixed
 * what made Kafka refuse it; its id, derived from the event that emitted
 * it, makes a second copy harmless.
 *
 * A delayed event's letter that is no failed firing record (scheduled) is
 * not applied here either: it is published back to its origin partition
 * with the headers KL__REDRIVE_HEADER and KL__REDRIVE_LETTER_HEADER
 * (dlq.h), and its owner schedules it from that record as a first reading
 * and puts the letter's record (worker/apply.c), so that a rebuild, which
 * reads that record too, holds the same timer. A second copy is a
 * duplicate there.
 *
 * Ownership and caveats: as replay.h (opts are borrowed; runs on the
 * calling thread; *opts->stop may be set from a signal handler).
 */
#ifndef KEYLANE_WORKER_REDRIVE_H
#define KEYLANE_WORKER_REDRIVE_H

#include "worker/letters.h"
#include "worker/replay.h"

typedef enum kl__outcome {
  KL__OUT_FILTERED = 0, /* not asked for (--reason, --key, other topic) */
  KL__OUT_APPLIED,
  KL__OUT_DUPLICATE,
  KL__OUT_FAILED,
  KL__OUT_PENDING,
  KL__OUT_FENCED,
  KL__OUT_ERROR,       /* not a keylane dead letter, or the store failed */
  KL__OUT_STOPPED,     /* not reached before a stop */
  KL__OUT_REPUBLISHED, /* misrouted: sent to its key's partition (acked) */
  KL__OUT_SCHEDULED,   /* delayed (no firing record): published back to its
                          partition, whose owner schedules it as a timer
                          (worker/apply.c) and runs it when due */
} kl__outcome_t;

/** @returns "applied", "duplicate", ... */
const char *kl__outcome_name(kl__outcome_t outcome);

typedef struct kl__redriven {
  const kl__letter_t *letter; /* borrowed from the redrive */
  kl__outcome_t outcome;
  uint64_t epoch;
  char id[KL_ID_MAX + 1]; /* "" when the envelope does not decode */
  char why[512];
} kl__redriven_t;

typedef struct kl__redrive_opts {
  const kl_conf_t *conf; /* kafka.* */
  const char *dlq_topic;
  const char *topic;  /* origin topic; NULL: dlq_topic without ".dlq" */
  const char *reason; /* only letters of this reason; NULL: all */
  const char *key;    /* only letters of this entity key; NULL: all */
  kl__pos_t from, to; /* in the dead-letter topic */
  /* Only these letters, read where they are (from and to unused): the
   * console's selection. NULL: every letter in [from, to). */
  const kl__letter_ref_t *only;
  size_t nonly;
  kl_store_t *store;
  kl_handler_fn_t *handler;
  void *handler_opaque;
  int dry_run;
  int dry_run_handler; /* as kl__replay_opts_t's */
  volatile int *stop;
} kl__redrive_opts_t;

typedef struct kl__redrive kl__redrive_t;

/**
 * Reads the letters and redrives those asked for.
 * @returns KL_OK and *out (each letter's outcome; free it with
 *          kl__redrive_destroy()); an error when it could not start.
 */
kl_err_t kl__redrive_run(const kl__redrive_opts_t *opts, kl__redrive_t **out);

/** @returns every letter read (borrowed) and their count. */
const kl__redriven_t *kl__redrive_results(const kl__redrive_t *redrive,
                                          size_t *count);

/** Counts the letters of @p outcome. */
size_t kl__redrive_count(const kl__redrive_t *redrive, kl__outcome_t outcome);

/** Partitions taken from an owner (previous epoch > 0): @p n of them. */
const kl__replay_part_t *kl__redrive_taken(const kl__redrive_t *redrive,
                                           size_t *n);

/** The origin topic the letters were redriven into (borrowed). */
const char *kl__redrive_topic(const kl__redrive_t *redrive);

void kl__redrive_destroy(kl__redrive_t *redrive);

#endif
