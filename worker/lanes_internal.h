/*
 * The key-parallel engine's state, shared by lanes.c (window, keys,
 * scheduling), lanes_commit.c (group commit, fencing, rewind, release,
 * dead letters) and lanes_pool.c (the executors); each lane keeps an overlay
 * (store/ov.h) that the handlers' child txns (store/child.h) read through.
 * Not installed.
 *
 * Locking: one mutex per worker, kl__lanes_t.mu, guards every lane, key,
 * slot and overlay. Handlers run without it; an executor takes it to pick
 * a slot, to read the overlay and to hand its result back. The poll thread
 * takes it to add records, to build a group commit and to apply its
 * outcome; it drops it around store and Kafka calls that may block. In
 * inline mode there are no executors, and a child reads the overlay
 * without it (store/child.h).
 */
#ifndef KEYLANE_WORKER_LANES_INTERNAL_H
#define KEYLANE_WORKER_LANES_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/hmap.h"
#include "store/ov.h"
#include "worker/apply.h"
#include "worker/dlq.h"
#include "worker/lanes.h"

typedef struct kl__lkey kl__lkey_t;
typedef struct kl__slot kl__slot_t;

/* ---- keys, slots, lanes ---------------------------------------------- */

/* An event key (the Kafka message key) of one lane: its pending slots in
 * offset order, and the overlay entries its events wrote. Freed once it
 * has neither. */
struct kl__lkey {
  kl__hnode_t node;        /* in the lane's keys */
  kl__slot_t *head, *tail; /* pending (not final) slots; head runs first */
  kl__ov_writer_t ov;      /* the overlay entries it wrote last */
  size_t refs;             /* slots of the window, final ones included */
  size_t len;
  unsigned char bytes[];
};

/* Keys up to this long are allocated this long, so that a spare one
 * (kl__lanes_t.spare_keys) fits any of them. */
#define KL__LKEY_SPARE_LEN 48

/* The key whose overlay writer @p w is. */
static inline kl__lkey_t *kl__lkey_of(kl__ov_writer_t *w) {
  return (kl__lkey_t *)(void *)((char *)w - offsetof(kl__lkey_t, ov));
}

typedef enum kl__slot_state {
  KL__SLOT_QUEUED,      /* waits for its turn */
  KL__SLOT_RUNNING,     /* an executor runs it */
  KL__SLOT_WAITING,     /* backoff until due_ns, then QUEUED */
  KL__SLOT_DLQ_PENDING, /* its dead letter is produced, not yet acked */
  KL__SLOT_DONE,        /* applied or duplicate: final */
  KL__SLOT_DLQ_DONE,    /* dead letter acknowledged: final */
} kl__slot_state_t;

struct kl__slot {
  rd_kafka_message_t *msg;
  int64_t offset;
  kl__lkey_t *key;
  kl__slot_t *next; /* the key's next pending slot */
  kl__slot_state_t state;
  int duplicate;     /* DONE because its id was seen */
  int timers;        /* DONE: timers its writes add (less those deleted) */
  int64_t scheduled; /* DONE as a timer due then (kl__run_t) */
  int64_t fired_due; /* DONE as a fired timer's run, due then (kl__run_t) */
  int building;      /* final, in the group commit being built or in flight */
  int committed;     /* final and in a committed group commit */
  int attempts;      /* handler runs */
  int store_errors;  /* failed runs the handler did not cause */
  int store_wait;    /* its last run failed in the store: it holds the
                        lane's commits (kl__lane_t.store_held) */
  int dlq_inflight;  /* produced, no delivery report yet */
  int64_t due_ns;    /* WAITING: when it may run; DLQ_PENDING: resend at */
  int64_t wait_since_ns;
  int64_t first_failure_ms, last_failure_ms;
  kl__dlq_reason_t reason;    /* once dead-lettered */
  int32_t expected_partition; /* MISROUTED: where its key routes */
  int forward; /* MISROUTED: re-published there, not dead-lettered */
  char *id;    /* the idempotency key's sid, kept for a dead letter */
  size_t id_len;
  char *why;               /* the last failure, for the dead letter */
  int64_t taken_ns;        /* when kl__lanes_push() took it from the consumer */
  int64_t ts_ms;           /* applied: its envelope's ts */
  struct kl__emits *emits; /* DONE: its follow-ups (outbox_rec.h), until
                              the group commit is built */
};

typedef enum kl__lane_state {
  KL__LANE_FREE = 0, /* not owned */
  KL__LANE_OWNED,    /* consuming and scheduling */
  KL__LANE_DRAINING, /* being released: running events finish, no new */
  KL__LANE_FENCED,   /* a newer owner exists: apply nothing until revoked */
} kl__lane_state_t;

enum {
  KL__PAUSE_WINDOW = 1,
  KL__PAUSE_WAITING = 2,
  KL__PAUSE_FENCED = 4,
  KL__PAUSE_LOG = 8, /* its log is being checked, or went wrong: log_guard.c */
  KL__PAUSE_TOPIC = 16,  /* the topic's partition count changed: for good */
  KL__PAUSE_OUTBOX = 32, /* worker.outbox.max follow-ups unpublished */
};

/* A growable array of slot pointers. */
typedef struct kl__slots {
  kl__slot_t **v;
  size_t n, cap;
} kl__slots_t;

struct kl__lane {
  int32_t partition;
  kl__lane_state_t state;
  uint64_t epoch;
  uint64_t gen;      /* bumped on every change of ownership: stale acks lose */
  int64_t watermark; /* committed: the next offset a new owner applies */
  int64_t kafka_watermark; /* the watermark last sent to the group's offsets */
  int64_t next_offset;     /* the offset after the last record taken in */
  kl__slot_t **ring;       /* the window, in offset order */
  size_t ring_head, ring_count, ring_cap;
  kl__hmap_t keys;     /* of kl__lkey_t */
  kl__slots_t ready;   /* min-heap by offset: heads of idle keys */
  kl__slots_t final;   /* became final since the last build */
  kl__slots_t waiting; /* WAITING slots */
  kl__slots_t dlq;     /* DLQ_PENDING slots */
  kl__overlay_t ov;
  size_t running;
  int64_t first_final_ns; /* when the oldest entry of `final` got there */
  int64_t next_due_ns;    /* the earliest due_ns in `waiting`, or 0 */
  unsigned paused;        /* KL__PAUSE_* reasons */
  /* The most slots its window held, the keys of up to KL__LKEY_SPARE_LEN
   * bytes it holds, and the most it held (kl__lanes_t.spare). */
  size_t ring_peak, keys_live, keys_peak;
  kl_txn_t *batch;       /* inline mode: the open group transaction */
  int64_t batch_ns;      /* batch: when it began (kl__mono_ns()) */
  int64_t prefetched_to; /* batch: the window's ids below are prefetched */
  uint64_t misrouted;    /* records whose key routes elsewhere, ever */
  int fence_seen;        /* an executor's begin said KL_EFENCED */
  int inflight; /* inline mode: its build is in the commit in flight, and
                   none of its events runs until that ends (lanes_commit.c) */
  int lost;     /* released without a commit (a lost partition): no offset of
                   it goes to Kafka, also from a commit in flight it settles */
  int rewind;   /* the overlay is unusable: run events again */
  int64_t hold_until_ns;  /* after a failed commit */
  int64_t last_commit_ms; /* the last store commit of its events; 0: none */
  size_t outbox_held;     /* its follow-ups unpublished, as the last tick
                             saw them (kl__outbox_held()) */
  /* Slots whose last run failed in the store (store_wait): while any
   * waits, the lane commits nothing, so that no later event counts as
   * applied before it (kl__lane_may_commit()). */
  size_t store_held;
  int commit_backoff_ms;
  int64_t below;          /* lowest offset delivered below next_offset, or -1 */
  uint64_t below_applied; /* of those, below the committed watermark */
  /* lanes_stall.c: the watermark and ownership last seen, since when */
  int64_t stall_watermark, stall_since_ns;
  uint64_t stall_gen;
  int stalled;
  /* The record at the watermark - 1 the store applied (kl__lanes_verify()),
   * compared with the log's when it arrives; replaced: they differ, found
   * is the log's (log_guard.c stops the partition). */
  int64_t verify_offset; /* -1: nothing to compare */
  char *verify_ident, *found_ident;
  size_t verify_len, found_len;
  int replaced;
};

/* Failures in a row of one kind, none succeeded since: how many, when
 * the first of them failed, and the last one's error (lanes_stall.h). */
typedef struct kl__failing {
  uint64_t n;
  int64_t since_ns;
  char why[512];
} kl__failing_t;

/* Counts one failure with its (escaped) @p text in @p f. mu held. */
void kl__failing_note(kl__failing_t *f, const char *text);

struct kl__lanes {
  pthread_mutex_t mu;
  pthread_cond_t work; /* executors: a slot became ready, or stop */
  pthread_cond_t idle; /* the poll thread: a lane's running count fell */
  kl_store_t *store;
  const char *topic;
  kl__applier_t applier; /* handler, hook; its decoder is the poll thread's */
  rd_kafka_t *rk;        /* the consumer: pause, resume, offset commits */
  kl__dlq_t *dlq;
  struct kl__outbox *outbox; /* the follow-ups' publisher (outbox.h) */
  struct kl__fire *fire;     /* the due timers' writer (fire.h) */
  kl__lane_t **lanes;
  kl__lane_t **due; /* count entries: the tick's lanes to commit */
  /* Freed slots for reuse (linked by next) and freed keys of up to
   * KL__LKEY_SPARE_LEN bytes (linked by their map node): a slot per record
   * and a key that leaves the window and comes back need no calloc each
   * time. Each list holds at most window_max per lane made (nlanes): no
   * more than the windows held at once, so memory stays under the
   * windows' bound. The slots and those keys made, live and spare
   * (nslots, nkeys), are at least the sum of the lanes' peaks
   * (slots_peaks, keys_peaks): the most each lane held may come again,
   * and at the same time as the others', so they are made when a lane
   * reaches a new peak, not the first time the windows hold them together,
   * which the executors' pace against the fetcher's may delay for long
   * (the steady path then calls calloc for none). */
  kl__slot_t *spare;
  size_t nspare;
  kl__lkey_t *spare_keys;
  size_t nspare_keys;
  size_t nslots, slots_peaks, nkeys, keys_peaks;
  size_t nlanes;
  int32_t count;
  int32_t rr;  /* where the next take starts looking */
  size_t turn; /* events taken from lane rr in a row */
  int inline_mode;
  int stopping;
  /* Inline mode: the group commit in flight, built on the poll thread and
   * committed by the committer thread (lanes_flight.c) while the poll
   * thread consumes and runs other lanes' events (lanes_commit.c says
   * what it may and may not do meanwhile). One at a time. Guarded by mu,
   * as is flight_cv: a flight queued or done, or the committer to stop. */
  struct kl__flight *flight;
  pthread_cond_t flight_cv;
  pthread_t committer;
  int committer_on, committer_stop;
  /* A commit failed KL_ESTORE_BUSY: commits stay on the poll thread until
   * one succeeds (lanes.c, lanes_commit_due()). */
  int commit_sync;
  rd_kafka_queue_t *consumer_q; /* yielded when a flight is done */
  size_t window_max, waiting_max, batch_max;
  /* Store txns the poll thread holds at once at most: the store's bound
   * (store.pg.pool) less one left to its single statements; 0: none. */
  size_t txn_max;
  int64_t batch_wait_ns;
  int commit_all; /* a commit failed KL_ESTORE_BUSY: the next commits every
                     lane that may, so that no batch of this thread holds
                     its snapshot open through the store's map growth */
  int64_t retry_initial_ms, retry_max_ms;
  int max_attempts;
  /* kl__store_idle_ms(): in inline mode, a handler step this long left the
   * group txn's session idle past what the server allows (lanes_pool.c); 0: no
   * bound. */
  int64_t idle_ms;
  /* Inline mode: the longest handler step seen, in ms; a group txn ends
   * before its age plus this nears idle_ms (lane_batch_old()). Poll
   * thread only. */
  int64_t step_max_ms;
  uint64_t seed;
  size_t waiting_keys; /* over every lane */
  int64_t last_report_ns;
  uint64_t reported_dead_letters;
  atomic_int below_seen;       /* a lane noted records below its position */
  int forward_misrouted;       /* worker.misrouted=forward */
  int64_t misrouted_warned_ns; /* the last misrouted WARN */
  uint64_t misrouted_unwarned; /* misrouted records since then */
  struct kl__metrics *metrics; /* the latency histograms, kl__lanes_metrics() */
  struct kl__series *latency, *commit_latency; /* this topic's series */
  struct kl__series *store_commit; /* each group commit's duration */
  struct kl__series *lateness;     /* a fired timer's run after its time */
  int64_t kafka_sent_ns;           /* the last offset commit to Kafka */
  _Atomic uint64_t applied, duplicates, redelivered, batches, fenced, failed,
      dead_letters, waiting_now, oldest_wait_ms, window_events, paused_now,
      misrouted_total, forwarded, kafka_commits, timers_scheduled, timers_early,
      timers_late;
  _Atomic uint64_t ahead; /* group transactions begun ahead (lanes_commit.c) */
  /* Group commits failed in a row, none committed since (lanes_stall.h).
   * Guarded by mu. */
  kl__failing_t commits_failing;
  /* Event runs that failed in the store (a revoked privilege on a
   * handler's table, say), none applied since. Guarded by mu. */
  kl__failing_t runs_failing;
};

/* ---- lanes.c, for lanes_commit.c -------------------------------------- */

kl_err_t kl__slots_push(kl__slots_t *slots, kl__slot_t *slot);
void kl__slots_remove(kl__slots_t *slots, kl__slot_t *slot);
void kl__ready_push(kl__lane_t *lane, kl__slot_t *slot);
/* @p lane has final events to commit and nothing holds them back: a
 * failed commit's backoff, an event waiting on a store error (mu held). */
int kl__lane_may_commit(const kl__lane_t *lane, int64_t now_ns);
/* @p lane is owned and has an event ready to run now (mu held). */
int kl__lane_schedulable(const kl__lane_t *lane);
/* Makes @p slot, its key's head, final and lets the key's next slot run. */
void kl__lane_finish(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                     kl__slot_state_t state);
/* Frees every slot, key and overlay entry of @p lane; the lane is empty. */
void kl__lane_drop(kl__lanes_t *lanes, kl__lane_t *lane);
/* The window's i-th slot; its first, committed, slot removed. */
kl__slot_t *kl__lane_at(const kl__lane_t *lane, size_t i);
void kl__lane_pop(kl__lanes_t *lanes, kl__lane_t *lane);
/* @p key went idle: frees its stored overlay entries, and it when unused. */
void kl__key_release(kl__lanes_t *lanes, kl__lane_t *lane, kl__lkey_t *key);
void kl__key_maybe_free(kl__lanes_t *lanes, kl__lane_t *lane, kl__lkey_t *key);
void kl__lane_pause(kl__lanes_t *lanes, kl__lane_t *lane, unsigned reason);
void kl__lane_resume(kl__lanes_t *lanes, kl__lane_t *lane, unsigned reason);
/* Waits, with mu held, until no executor runs an event of @p lane. */
void kl__lane_wait_idle(kl__lanes_t *lanes, kl__lane_t *lane);
kl__slot_t *kl__lane_find(const kl__lane_t *lane, int64_t offset);
int64_t kl__backoff_ms(const kl__lanes_t *lanes, const kl__slot_t *slot,
                       int attempt);

/* ---- lanes_commit.c --------------------------------------------------- */

/* Group-commits the final slots of the @p n lanes @p due in ONE store
 * commit, each lane guarded by its own epoch (mu held; dropped meanwhile).
 * A fenced lane is rolled back, one whose commit failed runs its events
 * again; the others are committed. */
void kl__lanes_commit(kl__lanes_t *lanes, kl__lane_t *const *due, size_t n);
/* Inline mode, the tick's commit: builds the @p n lanes @p due and hands
 * them to the committer thread as the commit in flight, unless one is in
 * flight already (they stay due). mu held; dropped meanwhile. */
void kl__lanes_commit_async(kl__lanes_t *lanes, kl__lane_t *const *due,
                            size_t n);
/* Applies the outcome of the commit in flight once it is done. mu held.
 * @returns nonzero when it applied one. */
int kl__lanes_reap(kl__lanes_t *lanes);
/* Waits for the commit in flight, running it on this thread when the
 * committer has not taken it yet, and applies its outcome. Whatever
 * changes a lane's window or ownership settles first. mu held. */
void kl__lanes_settle(kl__lanes_t *lanes);
/* Runs the store commit of the flight queued, if one is (mu not held):
 * the committer's work, or a settle's. @returns nonzero when it ran one. */
int kl__lanes_flight_run(kl__lanes_t *lanes);
/* Frees the flight, none in it (kl__lanes_flight_stop()). */
void kl__lanes_flight_free(kl__lanes_t *lanes);
/* Whether a flight waits for the committer. mu held. */
int kl__lanes_flight_queued(const kl__lanes_t *lanes);
/* lanes_flight.c: wakes the committer thread for the flight queued,
 * starting it on first use. mu held. keylane-sim wraps it, and runs the
 * flights itself (tests/sim/sim_owner.c). @returns nonzero when no thread
 * could start: the caller settles the flight itself. */
int kl__lanes_flight_start(kl__lanes_t *lanes);
/* Says a flight is done: the poll thread, waiting for records, returns
 * to reap it (lanes_flight.c). mu held. */
void kl__lanes_flight_done(kl__lanes_t *lanes);
/* Kafka offset commits, for lag monitoring, at most one per this long:
 * each is a write to the broker's __consumer_offsets, and one per group
 * commit (hundreds a second) took broker time from the fetches that
 * deliver the records. */
#define KL__KAFKA_COMMIT_MS 100
/* Sends the committed watermarks Kafka does not have yet, of the owned
 * and draining lanes, each with its epoch, when KL__KAFKA_COMMIT_MS passed
 * since the last commit, or at once with @p now_too (a lane given up
 * sends its last watermark before it goes). mu held. */
void kl__lanes_commit_kafka(kl__lanes_t *lanes, int64_t now_ns, int now_too);
/* A newer owner holds @p lane: roll everything back (mu held). */
void kl__lane_fenced(kl__lanes_t *lanes, kl__lane_t *lane);
/* Runs every completed, uncommitted event again (mu held). */
void kl__lane_rewind(kl__lanes_t *lanes, kl__lane_t *lane);
/* Dead letters due to be produced, for every lane (mu held). */
void kl__lanes_send_dead_letters(kl__lanes_t *lanes, int64_t now_ns);
/* lanes_route.c: @p slot's key routes elsewhere (run->expected_partition):
 * counts it, warns (rate-limited) and dead-letters or forwards it. */
void kl__lane_misrouted(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                        const kl__run_t *run);
/* Moves @p slot, its key's head, to DLQ_PENDING (mu held). */
void kl__lane_dead_letter(kl__lanes_t *lanes, kl__lane_t *lane,
                          kl__slot_t *slot, kl__dlq_reason_t reason,
                          const char *why);

#endif
