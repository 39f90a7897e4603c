/*
 * Replay: reads a range of a topic's partitions again and applies it
 * through the worker's own batch path, kl__apply_batch(): records below the
 * store's watermark are skipped as applied, records whose idempotency key
 * the store has seen are skipped as duplicates, the rest run the handler,
 * and each batch is ONE store commit fenced by an owner epoch. So a replay
 * never applies an event twice, whatever range it is given. Used by
 * `keylane replay` and `keylane store rebuild`.
 *
 * It reads with a consumer of its own that assigns the partitions by hand
 * (no group: it never joins the fleet's group, so it never causes a
 * rebalance), from each partition's start to its end, the high watermark
 * when the replay started (or --to). Events published meanwhile are left to
 * the fleet.
 *
 * Coexistence with a live fleet: a replay takes ownership by epoch. Before
 * reading a partition it calls kl_store_acquire(), like any new owner, and
 * applies from the watermark that call returned. The live owner of the
 * partition is fenced by that: its next commit fails, nothing of that batch
 * is applied, and it stops applying the partition until the partition's
 * state has not changed for worker.fenced.retake.ms (the replay is over,
 * paused or dead: a working replay beats every partition it holds at least
 * every third of its opts->conf's period, between events and during
 * backoffs, kl__store_beat()), or the group hands the partition to a
 * member again;
 * either acquires a newer epoch and resumes from the store's watermark,
 * past what the replay applied. The other way round is safe as well: a
 * member that acquires the partition while the replay runs fences the
 * replay, which stops that partition and reports where to resume. Either
 * way every event applies once. What a fenced live owner costs is time:
 * the partition waits for that quiet period; the CLI says which
 * partitions had an owner before the replay took them.
 *
 * A dry run (dry_run) takes no epoch and commits nothing: it runs the
 * handlers against the partition's current epoch (kl_store_partition())
 * and rolls every batch back, so it never fences a live owner, and the
 * store stays byte-identical, epochs included. Its batch is the whole range
 * of a partition, up to batch_max events, so that a duplicate or a handler
 * state inside the range is seen as a real replay would see it; past one
 * batch its counts are estimates (`exact` is 0). A never-owned partition
 * (epoch 0) cannot open a batch without an epoch, so its dry run runs
 * against an empty scratch LMDB store, removed afterwards: nothing of such
 * a partition can be in the real store but another topic's state. The
 * handler itself runs in a dry run only when opts->dry_run_handler says
 * its effects are all in the store; any other handler (exec:, so:, which
 * may call HTTP services, write files, ...) is never called: the events
 * that would run it are counted as applied.
 *
 * Dead letters: a record the handler or the decoder refuses (FAIL, or
 * RETRY past its attempts) is looked up in the fleet's dead-letter topic
 * (worker.dlq.topic, default <topic>.dlq), read once on the first such
 * record. When the fleet dead-lettered it, the replay records it as the
 * fleet did (its id marked KL_MARK_DEAD_LETTER, the watermark past it, no
 * handler: skipped_dead_letter) and goes on, so a rebuild reproduces the
 * fleet's store; redrive them with `keylane replay --from-dlq`. Otherwise
 * the records before it are applied and the partition stops there
 * (failed), to be fixed and resumed. Over a live store such a record is
 * never run again: its id is recorded already (skipped_duplicate).
 *
 * History: a partition whose log starts above the store's watermark has
 * lost events to retention; the replay reads what is left and reports it
 * (history_from). A start above the watermark while the log still holds
 * the events in between is refused unless allow_gap: the watermark would
 * jump over them and no worker would ever apply them.
 *
 * Ownership: a replay borrows opts->store, opts->conf and the strings of
 * opts, which must outlive it.
 *
 * Caveats:
 * - kl__replay_run() runs on the calling thread, and so do the handler
 *   and opts->on_progress. *opts->stop may be set from a signal handler.
 * - LMDB opens a directory once per process: a replay beside a worker in
 *   one process must share the worker's kl_store_t.
 */
#ifndef KEYLANE_WORKER_REPLAY_H
#define KEYLANE_WORKER_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "common/kafka_pos.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "worker/worker_internal.h"

/* Events per batch: a replay's default, and a dry run's (its window). */
#define KL__REPLAY_BATCH 1000
#define KL__REPLAY_DRY_BATCH 100000

typedef enum kl__replay_status {
  KL__REPLAY_PENDING = 0, /* not started */
  KL__REPLAY_RUNNING,
  KL__REPLAY_DONE,    /* read to its end */
  KL__REPLAY_STOPPED, /* asked to stop: resume from `next` */
  KL__REPLAY_FENCED,  /* a newer owner took it: resume from `next` */
  KL__REPLAY_FAILED,  /* the handler or decoder refused the event `next` */
  KL__REPLAY_ERROR,   /* the store or Kafka failed: resume from `next` */
} kl__replay_status_t;

/** @returns "done", "stopped", "fenced", ... */
const char *kl__replay_status_name(kl__replay_status_t status);

/** One partition of a replay. Counters count records of [start, end). */
typedef struct kl__replay_part {
  int32_t partition;
  kl__replay_status_t status;
  int64_t low, high;        /* the retained log when the replay started */
  int64_t start, end;       /* the range read, [start, end) */
  int64_t watermark_before; /* the store's, before the replay */
  int64_t watermark;        /* the store's as the replay left it (dry: would) */
  int64_t next;             /* first offset not yet decided: resume here */
  int64_t position;         /* next offset to read (progress) */
  uint64_t epoch;           /* the replay's epoch (dry run: the current one) */
  uint64_t previous_epoch;  /* the owner it fenced (0: none ever) */
  uint64_t read, applied, skipped_applied, skipped_duplicate, failed;
  uint64_t skipped_dead_letter; /* failed here, dead-lettered by the fleet */
  uint64_t batches;
  int64_t history_from; /* -1; else events [watermark_before, it) are gone */
  int history_skipped;  /* history_from is --from (allow_gap), not retention */
  int scratch;          /* dry run against the scratch store (epoch 0) */
  int exact;            /* dry run: counts are those a replay would have */
  char why[512];        /* what stopped it */
} kl__replay_part_t;

typedef struct kl__replay kl__replay_t;

typedef struct kl__replay_opts {
  const kl_conf_t *conf; /* kafka.*, worker.expect.partitions, retries */
  const char *topic;
  const char *partitions; /* "0,2,5-7"; NULL or "all": every partition */
  kl__pos_t from, to;
  kl_store_t *store;
  kl_handler_fn_t *handler;
  void *handler_opaque;
  int dry_run;
  /* A dry run runs the handler (one whose effects are all in the store:
   * the built-in ledger, inventory); 0: it never calls the handler, which
   * may act outside the store, and counts the events that would run it as
   * applied (a handler's failure is then not foreseen). */
  int dry_run_handler;
  int allow_gap;      /* start above the watermark on purpose */
  int rebuild;        /* the store must hold nothing of the topic yet */
  size_t batch_max;   /* 0: KL__REPLAY_BATCH (dry run: KL__REPLAY_DRY_BATCH) */
  volatile int *stop; /* nonzero: stop after the batch in flight */
  void (*on_progress)(void *opaque, const kl__replay_t *replay);
  void *progress_opaque;
  kl__worker_hook_fn *before_commit; /* test hook; may be NULL */
  void *hook_opaque;
} kl__replay_opts_t;

/**
 * Connects, checks the topic and resolves every partition's range. Changes
 * nothing in the store.
 * @returns KL_OK and *out (free with kl__replay_destroy()); KL_EINVAL,
 *          KL_ENOTFOUND, KL_EPARTITIONS or a Kafka error with the detail.
 */
kl_err_t kl__replay_new(const kl__replay_opts_t *opts, kl__replay_t **out);

/**
 * Checks every partition against the store (refusing, before taking any,
 * a gap or a non-empty store for a rebuild), takes them, and applies their
 * ranges until done, stopped, or failed.
 * @returns KL_OK when the replay ran (each partition's status says how it
 *          ended); an error, with nothing taken, when it refused to start.
 */
kl_err_t kl__replay_run(kl__replay_t *replay);

/** @returns the partitions (borrowed, valid until destroy) and their count. */
const kl__replay_part_t *kl__replay_parts(const kl__replay_t *replay,
                                          size_t *count);

/** Sums the partitions' counters into @p total (status: the worst). */
void kl__replay_totals(const kl__replay_t *replay, kl__replay_part_t *total);

/** Replaces opts->on_progress (the row count is known only after new). */
void kl__replay_set_progress(kl__replay_t *replay,
                             void (*on_progress)(void *opaque,
                                                 const kl__replay_t *replay),
                             void *opaque);

/** The topic and options the replay was made with (borrowed). */
const kl__replay_opts_t *kl__replay_opts(const kl__replay_t *replay);

/** Frees @p replay; accepts NULL. */
void kl__replay_destroy(kl__replay_t *replay);

/**
 * What reading from @p start means for a partition whose store watermark
 * is @p watermark and whose log begins at @p low: 0 nothing is skipped;
 * 1 retention deleted [watermark, low) (start == low); 2 the range skips
 * events the log still holds.
 */
int kl__replay_gap(int64_t watermark, int64_t low, int64_t start);

#endif
