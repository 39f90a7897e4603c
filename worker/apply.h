/*
 * Applying a batch of one partition's records: the path every owner takes,
 * the worker's lanes and `keylane replay` alike.
 *
 * For each record in offset order: skip it when its offset is below the
 * watermark (redelivered); decode it and check its id (kl_publish()'s
 * rules), refusing a record that fails them (decode, reserved_id); refuse
 * a valid one whose key routes to another partition (misrouted, with
 * applier->partitions set); skip it when its idempotency key was seen
 * (re-published); else run the handler. Its own validity is judged before
 * its routing, so a record has one reason whichever partition it is on.
 * Then ONE store commit holds the handlers' writes, the new idempotency
 * keys and the new watermark, guarded by the owner's epoch.
 */
#ifndef KEYLANE_WORKER_APPLY_H
#define KEYLANE_WORKER_APPLY_H

#include <librdkafka/rdkafka.h>

#include "keylane/worker.h"
#include "worker/worker_internal.h"

/* Called between the events of a batch with the batch's partition: an
 * owner outside the group beats there (replay.c, redrive.c). KL_OK goes
 * on; another error stops the batch, which applies nothing and returns it. */
typedef kl_err_t(kl__tick_fn)(void *opaque, int32_t partition);

/* Test seam of the lanes' executors (kl__worker_set_run_fault()). */
typedef int(kl__run_fault_fn)(void *opaque, int32_t partition, int64_t offset);

typedef struct kl__applier {
  kl_store_t *store;
  const char *topic;
  kl_handler_fn_t *handler;
  void *handler_opaque;
  kl_decoder_t *decoder;             /* one per thread */
  kl__worker_hook_fn *before_commit; /* test hook; may be NULL */
  void *hook_opaque;
  /* Test hook: a group commit that wrote follow-ups succeeded, and none
   * of them is published yet. May be NULL. */
  kl__worker_hook_fn *after_commit;
  void *after_opaque;
  int dry_run; /* abort instead of committing */
  /* A dry run runs the handler: only for one whose effects are all in the
   * store (the built-in ledger and inventory). Otherwise (0) a dry run
   * never calls it, since it may act outside the store, and counts each
   * event that would run it as applied. */
  int dry_run_handler;
  int redrive; /* a dead-lettered id runs again (keylane replay --from-dlq) */
  /* Redrive: the letter's own record (kl__letter_key()), NULL otherwise.
   * Set, it makes the event a duplicate, and it is put with the event's
   * effects; it outlives the id's retention (redrive.h). Borrowed. */
  const char *letter_key;
  size_t letter_key_len;
  /* The largest record a follow-up may be (kl__txn_set_message_max()),
   * and the limit's name; 0: KL_MESSAGE_MAX. */
  size_t message_max;
  char message_max_src[128];
  int32_t partitions; /* > 0: a key must route (murmur2) to its partition */
  kl__tick_fn *tick;  /* may be NULL */
  void *tick_opaque;
  /* Test seam of the lanes' executors: nonzero makes the run of the record
   * at @p offset of @p partition a store failure, its handler not called,
   * as when the store's link breaks under an event. NULL: none. */
  kl__run_fault_fn *run_fault;
  void *fault_opaque;
  /* timer.max.delay in ms: a delayed event due later is a dead letter;
   * 0: no bound */
  int64_t timer_max_ms;
  /* store.dedup.retention in ms: a delayed event whose time lies before
   * its record's by more is a dead letter; 0: no bound */
  int64_t timer_past_ms;
} kl__applier_t;

typedef struct kl__apply_result {
  int64_t next; /* watermark after the batch */
  uint64_t applied, duplicates, redelivered;
  uint64_t scheduled;    /* delayed events that became timers */
  int64_t scheduled_due; /* the last one's due time */
  uint64_t timers_early; /* firing records read before their time */
  /* redrive: delayed letters to publish back to their partition for their
   * owner to schedule (kl__dlq_redrive()); nothing of them is written */
  uint64_t redrive_back;
  kl_handler_result_t verdict; /* OK, or the first RETRY/FAIL */
  int64_t failed_offset;
  kl_err_t failed_err; /* KL_EDECODE_* when the record did not decode */
  kl_err_t store_err;  /* the store error behind a RETRY of seen/mark */
  int misrouted;       /* FAIL: the key routes to expected_partition */
  int reserved_id;     /* FAIL (failed_err set): a '~' id no follow-up has */
  int committed;       /* the store commit succeeded (for the test seam's
                          lost answers: even when KL_ESTORE_BUSY says not) */
  int32_t expected_partition;
  char why[512];
} kl__apply_result_t;

/**
 * The step every event takes, in a batch or in a key-parallel lane: decode
 * @p m; skip it when its id was seen (counted in res->duplicates); else run
 * the handler on @p txn and mark the id applied (res->applied).
 * @param event  receives the decoded event; it borrows from @p m and from
 *               applier->decoder, as kl_event_decode() says.
 * @returns KL_HANDLER_OK (applied or duplicate); RETRY or FAIL with res->why.
 *          The cause: res->failed_err is a KL_EDECODE_* code for a
 *          record that did not decode (FAIL, judged before its routing),
 *          or KL_EINVAL with
 *          res->reserved_id for one whose id begins with KL_ID_RESERVED
 *          and is no follow-up's (kl__id_check(): the rule kl_publish()
 *          keeps, kept on what any producer wrote; FAIL, not run);
 *          res->misrouted for a valid event whose key routes to
 *          res->expected_partition (FAIL, not run); res->store_err a store
 * error of seen/mark (RETRY); both KL_OK when the handler said so.
 */
kl_handler_result_t kl__apply_event(const kl__applier_t *applier,
                                    int32_t partition, uint64_t epoch,
                                    kl_txn_t *txn, const rd_kafka_message_t *m,
                                    kl_event_t *event, kl__apply_result_t *res);

/**
 * Looks up the idempotency keys of @p msgs (@p n records) in one go, so
 * that kl__apply_event()'s kl_txn_seen() answers from memory
 * (kl_txn_prefetch()): one round trip for a batch on PostgreSQL. Does
 * nothing on a store without it. Records below @p from (redelivered) and
 * records that do not decode are left out; kl__apply_event() deals with
 * them. Uses a decoder of its own.
 * @returns KL_OK, or a store error (the batch is to be re-run).
 */
kl_err_t kl__apply_prefetch(const kl__applier_t *applier, kl_txn_t *txn,
                            rd_kafka_message_t *const *msgs, size_t n,
                            int64_t from);

/**
 * kl__apply_prefetch() of @p msgs in a txn begun ahead
 * (kl__store_begin_ahead()): nothing is waited for. Only on a store
 * with kl__store_has_prefetch() (PostgreSQL).
 * @returns KL_OK with *@p txn pending; else nothing was begun (KL_EINVAL:
 *          a store that does not begin ahead, or no records; KL_ENOMEM: no id
 * decoded, or no memory; KL_ESTORE_BUSY: no idle connection; a send's failure).
 */
kl_err_t kl__apply_begin_ahead(const kl__applier_t *applier, int32_t partition,
                               uint64_t epoch, rd_kafka_message_t *const *msgs,
                               size_t n, kl_txn_t **txn);

/**
 * The identity of record @p m that the store keeps for the record at its
 * watermark - 1 (kl__txn_set_last()) and a new owner compares with the log:
 * its sid (store_internal.h) when it decodes, else a tag byte 1 and the
 * FNV-1a of its key and of its value (8 bytes each). @p out holds
 * KL__SID_MAX bytes. @returns the length.
 */
size_t kl__apply_ident(kl_decoder_t *decoder, const rd_kafka_message_t *m,
                       char *out);

/**
 * Keeps the identity of record @p m (kl__apply_ident()) in @p txn, for the
 * watermark its commit sets at m's offset + 1 (kl__txn_set_last()): the
 * one way every batch path (the lanes' group commit, kl__apply_batch())
 * records what a new owner compares with the log.
 */
kl_err_t kl__apply_set_last(kl_decoder_t *decoder, kl_txn_t *txn,
                            const rd_kafka_message_t *m);

/**
 * The dead letter of @p m takes its timer in @p txn: when @p m is the
 * firing record of the timer that waits for its event (the offset its
 * header names and the very envelope the timer holds), that timer is
 * deleted, as the run's applied mark would have taken it. Every commit of
 * a dead letter calls it (the lanes', replay's and a rebuild's), so that a
 * rebuild, which records the fleet's dead letters where they were, holds
 * the timers the fleet holds (docs/design.md, "Timers").
 * @param taken  receives the timers deleted (0 or 1); may be NULL.
 * @returns KL_OK (also when @p m is no firing record, or its timer is
 *          gone), or the store's failure.
 */
kl_err_t kl__apply_dead_letter(const kl__applier_t *applier, int32_t partition,
                               kl_txn_t *txn, const rd_kafka_message_t *m,
                               int *taken);

/**
 * Writes @p ident (kl__apply_ident()) for a log line: "key=K id=I" for a
 * sid, "a record that is no keylane event" otherwise, escaped.
 * @returns @p out.
 */
const char *kl__apply_ident_text(const char *ident, size_t len, char *out,
                                 size_t size);

/**
 * Sleeps @p ms (a retry's backoff) in short steps, calling applier->tick
 * between them, so that an owner outside the group goes on beating.
 */
void kl__apply_sleep(const kl__applier_t *applier, int32_t partition, int ms);

/**
 * Applies @p msgs (@p count records of @p partition, in offset order) once.
 * @returns KL_OK with res->verdict OK when committed (or, dry run, when it
 *          would have been); KL_OK with verdict RETRY/FAIL when a handler
 *          or the decoder stopped the batch (nothing applied); KL_EFENCED;
 *          what applier->tick returned (nothing applied); or a store error
 *          (nothing applied; retriable ones may be re-run).
 */
kl_err_t kl__apply_batch(const kl__applier_t *applier, int32_t partition,
                         uint64_t epoch, int64_t watermark,
                         rd_kafka_message_t *const *msgs, size_t count,
                         kl__apply_result_t *res);

#endif
