/*
 * keylane-sim's parts (sim.c says what is simulated and why): the world of
 * one schedule (sim_world.c: stores, keys, the log, the model and its
 * invariants), its owners (sim_owner.c: batches, dead letters, the outbox
 * publisher, pauses and crashes), the temporary owners (sim_tools.c:
 * replay, redrive, rebuild) and the steps (sim_steps.c: decoding a choice
 * into a step, the client, the drain and the final checks).
 *
 * One schedule runs at a time in a process, on its one thread: the world
 * is a global (W). An owner paused between its handlers and its commit
 * keeps its own stack (ucontext) while other steps run.
 */
#ifndef KEYLANE_TESTS_SIM_H
#define KEYLANE_TESTS_SIM_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include "keylane/store.h"
#include "store/store_internal.h"
#include "worker/apply.h"

/* Two topics share one store (`--topics 2`, the default): the model
 * numbers their partitions and keys as one range, topic t's partition p
 * being part t * cfg.partitions + p and its key k key t * cfg.keys + k
 * (sim_topic(), sim_tpart(), sim_key_topic()); both topics have the same
 * partition count and the same key names, so each key name has an entry,
 * marks and an owner cache segment per topic. */
#define SIM_TOPICS 2
#define SIM_TOPIC_P 4 /* partitions of a topic */
#define SIM_TOPIC_K 8 /* entity keys of a topic */
#define SIM_MAXP (SIM_TOPIC_P * SIM_TOPICS)
#define SIM_MAXO 4 /* owners */
#define SIM_MAXK (SIM_TOPIC_K * SIM_TOPICS)
#define SIM_BATCH 64 /* records of one batch at most (drain, rebuild) */
#define SIM_NONE UINT32_MAX
#define SIM_ATTEMPTS 3 /* runs of an event that says RETRY, then a letter */
/* LMDB environments: the live store, the one a rebuild moves the fleet
 * to, and the rebuild the end compares */
#define SIM_ENVS 3

typedef enum sim_backend { SIM_LMDB = 0, SIM_PG = 1 } sim_backend_t;

/* What a schedule is made of, from its seed (not from its choices, so
 * that a shrunk schedule keeps it). */
typedef struct sim_cfg {
  int partitions, owners, keys, batch_max;
} sim_cfg_t;

typedef enum sim_kind {
  SIM_CREDIT,
  SIM_DEBIT,
  SIM_TRANSFER,
  SIM_FOLLOWUP, /* the credit a transfer emits */
  SIM_HOSTILE,  /* a credit a producer that is not keylane wrote (--hostile) */
  /* cancels and delayed follow-ups (sim_timers.c) */
  SIM_CANCEL,   /* cancels a delayed event of its key (kl_txn_cancel()) */
  SIM_DEFER,    /* emits a delayed credit (kl_txn_emit_opts()) to its `to` */
  SIM_DEFERRED, /* the credit a defer emits: a follow-up with a time */
} sim_kind_t;

/** Kinds whose handler emits a follow-up: a transfer, a defer. */
static inline int sim_emits(int kind) {
  return kind == SIM_TRANSFER || kind == SIM_DEFER;
}
/** Kinds of a follow-up's event. */
static inline int sim_followup(int kind) {
  return kind == SIM_FOLLOWUP || kind == SIM_DEFERRED;
}

/* What a store (the live one, or a rebuild) decided about one event. */
typedef struct sim_mark {
  uint8_t applied;  /* committed applications: 0 or 1, 2 is a violation */
  uint8_t dead;     /* a dead-letter mark committed over no mark */
  uint8_t refused;  /* dead-lettered by the lanes with no mark: a reserved
                       id no follow-up has (kl__id_check()) */
  uint8_t redriven; /* applied by a redrive (after later events, by design) */
  int64_t timer;    /* a delayed event's timer the store holds: the offset
                       of the record that scheduled it, plus 1; else 0 */

  /* a cancel took its timer: the cancel's offset, plus 1 (a copy read
   * later may schedule it again: timer then says so; sim_timers.c) */
  int64_t cancelled;
} sim_mark_t;

/* One event: a (key, id) and where it first occurs in the log. */
typedef struct sim_event {
  char id[112];
  uint8_t id_len;
  uint8_t key, to; /* indexes in W->keys; to: a transfer's destination */
  uint8_t kind;    /* sim_kind_t */
  uint8_t valid;   /* the ledger handler accepts it */
  uint8_t gone;    /* its records went with a recreated topic */
  uint8_t aside;   /* a follow-up Kafka refused: its letter holds it */
  uint8_t placed;  /* in its key's list (a delayed event: at its first
                      firing record, where it runs among the key's events) */
  int64_t amount;
  int64_t not_before; /* a delayed event's time (the sim clock), or 0 */
  int32_t part;
  int64_t first;     /* offset of its first record in W->log[part] */
  uint32_t key_pos;  /* index in its key's list of events */
  uint32_t followup; /* a transfer's follow-up event, SIM_NONE until seen */
  uint32_t next;     /* hash chain */
  uint32_t target;   /* a cancel's delayed event, or SIM_NONE: an id none has */
  int64_t emit_nb;   /* a defer's follow-up's time (the sim clock) */
} sim_event_t;

/* One record of the simulated log: a message filled by hand. */
typedef struct sim_rec {
  rd_kafka_message_t msg;
  uint32_t event;
  int64_t ts;    /* its timestamp (CreateTime: its writer's clock) */
  int64_t names; /* a firing record's keylane.timer header: the offset it
                    names; else -1 */
  rd_kafka_headers_t *headers; /* what rd_kafka_message_headers() gives */
} sim_rec_t;

typedef struct sim_log {
  sim_rec_t **v; /* pointers: a paused batch's records must not move */
  size_t n, cap;
} sim_log_t;

typedef struct sim_key {
  char name[64];
  size_t name_len;
  int32_t part;
  uint32_t *events; /* in log order */
  size_t n, cap;
} sim_key_t;

/* A store's decisions as the model knows them: the live store's, or a
 * rebuild's. */
typedef struct sim_view {
  sim_mark_t *marks; /* per event */
  size_t cap;
  size_t resolved[SIM_MAXK]; /* per key: its first events applied or dead */
  int64_t balance[SIM_MAXK];
  /* applied amounts, per topic */
  int64_t credits[SIM_TOPICS], debits[SIM_TOPICS];
  int64_t transfers[SIM_TOPICS], followups[SIM_TOPICS];
  /* per key name: events applied on either topic (sim_shared_count()) */
  int64_t shared[SIM_TOPIC_K];
  uint64_t epoch[SIM_MAXP]; /* the store's current epochs */
  int64_t watermark[SIM_MAXP];
  /* the partitions' counters (kl_partition_state_t) */
  uint64_t applied[SIM_MAXP], duplicates[SIM_MAXP], dead[SIM_MAXP];
} sim_view_t;

/* A dead letter: a record of the simulated dead-letter topic. */
typedef struct sim_letter {
  int32_t part; /* -1: a follow-up Kafka refused, set aside by the outbox */
  int64_t offset;
  uint32_t event;
  void *bytes; /* part -1: the follow-up's record, which a redrive
                  publishes to its destination */
  size_t len;
} sim_letter_t;

/* What a group commit holds of one record (sim_owner.c reads it from the
 * lane's slots before the commit). */
enum { SIM_DONE_APPLIED, SIM_DONE_DUP, SIM_DONE_DEAD, SIM_DONE_SCHEDULED };
typedef struct sim_done {
  int64_t offset;
  int what; /* SIM_DONE_* */

  int cancel; /* a cancel's run: what kl_txn_cancel() answered it */
} sim_done_t;

/* What the handler of a cancel at (part, offset) saw kl_txn_cancel()
 * answer, kept until its commit reads it (sim_timers.c). */
typedef struct sim_seen {
  int32_t part;
  int64_t offset;
  int err;
} sim_seen_t;

/* One group commit about to be made: its partition, epoch and records. */
typedef struct sim_pend {
  int32_t part;
  uint64_t epoch;
  sim_done_t *v;
  size_t n, cap;
} sim_pend_t;

/* An owner's Kafka: its letters and follow-ups in flight (sim_seams.c). */
typedef struct sim_fake sim_fake_t;

struct sim_owner;

/* One batch in flight (an owner's, or a temporary owner's). */
/* What an owner's next group commit meets (sim_seams.c). */
typedef enum sim_fate {
  SIM_COMMIT_GO = 0, /* it commits */
  SIM_COMMIT_ABORT,  /* it fails: KL_ESTORE_BUSY, nothing written; or the
                        owner dies there */
  SIM_COMMIT_LOST,   /* it commits, and its answer is lost: KL_ESTORE_BUSY */
} sim_fate_t;

typedef struct sim_batch {
  struct sim_owner *owner; /* NULL for replay, redrive, rebuild */
  sim_view_t *view;        /* what its commit changes */
  kl_store_t *store;
  int32_t part;
  uint64_t epoch;
  int64_t from;
  size_t count;
  int inject_at, inject; /* the handler call that says inject (RETRY/FAIL) */
  int calls;
  int pause;
  int acks; /* an owner's reports this step: 0 none, 1 all, 2 the first
               fails (sim_seams.c) */
  sim_fate_t fate;
  int crash;  /* the owner dies at the commit */
  int flight; /* when the owner's turn runs its commit in flight (queued by
                 a tick), bits: 1 before its events run, 2 after them, 4
                 after the tick, which leaves its outcome to the next tick
                 or a settle; none: a later turn or a settle (sim_owner.c) */
  int redrive, rebuild;
  const char *letter_key;
  size_t letter_key_len;
  struct {
    uint32_t event;
    int64_t offset;
    int cancel; /* a cancel's: what kl_txn_cancel() answered */
  } apps[SIM_BATCH];
  size_t napps;
  rd_kafka_message_t *msgs[SIM_BATCH];
  kl__apply_result_t res;
  kl_err_t err;
} sim_batch_t;

typedef struct sim_owner {
  int no;
  kl_store_t *store;       /* LMDB: the world's; PostgreSQL: its own */
  uint64_t held[SIM_MAXP]; /* the epoch it acquired a partition with, or 0 */
  /* per topic, the worker's engine in inline mode (a worker runs one
   * topic: an owner of both topics is two workers of one process) */
  struct kl__lanes *lanes[SIM_TOPICS];
  struct kl__lanes_pool *pool[SIM_TOPICS];
  kl_decoder_t *decoder;
  sim_fake_t *fake[SIM_TOPICS]; /* its Kafka: dead-letter topic, producer */
  int tno;  /* the topic whose engine the running call is in */
  int dead; /* crashed: what its engine still does reaches nothing */
  /* per topic, the group commits its hook read, until their commit (a
   * worker's commit in flight is committed after its hook, later in the
   * owner's turn or in a later one: each topic may have one queued) */
  sim_pend_t pend[SIM_TOPICS][SIM_TOPIC_P];
  size_t npend[SIM_TOPICS];
  ucontext_t ctx;
  char *stack;
  int running, paused;
  int resumed;       /* its hook paused and was resumed: the commit it held runs
                        right after its tick, with the fate the resume chose */
  sim_batch_t batch; /* its step's faults; the handler's opaque */
  sim_seen_t *seen;  /* its cancels' answers (sim_timers.c) */
  size_t nseen, seen_cap;
} sim_owner_t;

/* Counts for the report. */
typedef struct sim_stats {
  uint64_t steps, noops, schedules, commits, applied, duplicates, fenced;
  uint64_t pauses, crashes, lost, aborted, letters, redriven, replays;
  uint64_t rebuilds, published, drain_batches, hostile, recreated;
  uint64_t busy;       /* commits the store refused as busy (not by a fate) */
  uint64_t swept;      /* sweeps by a third topic's fleet (sim_steps.c) */
  uint64_t swept_ids;  /* ids they removed: none but with a mutant */
  uint64_t foreign;    /* takes by a foreign fleet, refused (sim_steps.c) */
  uint64_t delayed;    /* delayed events the client published */
  uint64_t scheduled;  /* timers committed (scheduling records) */
  uint64_t fired;      /* firing records the owners wrote */
  uint64_t timers_run; /* delayed events run by a firing record */
  uint64_t early;      /* firing records read before their time */
  uint64_t jumps;      /* steps whose wall clock jumped */
  uint64_t cancels;    /* cancels applied (sim_timers.c) */
  uint64_t cancelled;  /* of them, those that took a waiting timer */
  uint64_t defers;     /* delayed follow-ups published */
  uint64_t deferred;   /* delayed follow-ups run by their timer */
} sim_stats_t;

typedef struct sim_world {
  sim_cfg_t cfg;
  sim_backend_t backend;
  uint64_t seed;
  int verbose;
  char tag[48]; /* makes topics and keys unique on a shared PostgreSQL */
  int ntopics;  /* 1 or 2 (sim_topics) */
  int nparts;   /* the model's partitions: ntopics * cfg.partitions */
  int nkeys;    /* the model's keys: ntopics * cfg.keys */
  int shared;   /* the events count themselves in one row per key name */
  char topics[SIM_TOPICS][96]; /* the topics' names */
  char dlqs[SIM_TOPICS][112];  /* their dead-letter topics' */
  int env; /* the live store's LMDB environment (sim_lmdb_env()) */
  const char *pg_uri;
  kl_conf_t *conf;
  kl_store_t *store; /* the world's: LMDB's only one; PostgreSQL's tools' */
  kl__store_owner_t fleet;    /* the owners' cluster and group (sim_owner.c) */
  int fleet_took[SIM_TOPICS]; /* an owner took a partition of the topic in
                                 this store: it recorded the fleet's */
  sim_key_t keys[SIM_MAXK];
  sim_log_t log[SIM_MAXP];
  sim_event_t *events;
  uint32_t nevents;
  size_t events_cap;
  uint32_t *hash;
  size_t hash_cap;
  sim_letter_t *letters;
  size_t nletters, letters_cap;
  size_t letters_gone; /* the first ones: redriven, their records went with
                          a recreated topic (the dead-letter topic stays) */
  sim_owner_t owners[SIM_MAXO];
  sim_view_t live;
  uint64_t max_epoch[SIM_MAXP]; /* ever acquired, across rebuilds */
  int64_t now_ms;
  int64_t skew_ms; /* the wall clock's jumps (sim_clock()): the store's, the
                      firing records' stamps; the lanes' monotonic clock
                      does not jump */
  uint64_t sweeper_ids; /* ids the third topic's fleet applied (sim_steps.c) */
  uint64_t next_id;
  int64_t seq[SIM_MAXK]; /* the client's per key */
  int calm;              /* the drain: no injected faults */
  int hostile;           /* a hostile producer writes too (sim_hostile) */
  size_t recreate_at;    /* the step the topic is created again at, or 0 */
  int recreated;         /* it was: the log is not the store's whole past */
  sim_log_t gone;        /* the records of the log before it */
  int gen;               /* store generation: rebuilds so far */
  size_t step;
  int dirty; /* the step committed or acquired: check the store */

  int failed;
  char fail_code[32];
  char fail_msg[1024];
  size_t fail_step;
  sim_stats_t stats;
  sim_owner_t *acting; /* whose engine the running call is in, or NULL */
  int64_t drift_ns;    /* the engine's waits, on top of now_ms */
  uint64_t sends;      /* records the owners sent (sim_seams.c) */
  ucontext_t sched;    /* the scheduler's context */
  sim_owner_t *coro;   /* the owner a coroutine starts for */
} sim_world_t;

extern sim_world_t *W;

/** The topic of the model's partition @p part, and its partition there. */
static inline int sim_topic_no(int32_t part) {
  return part / W->cfg.partitions;
}
static inline const char *sim_topic(int32_t part) {
  return W->topics[part / W->cfg.partitions];
}
static inline int32_t sim_tpart(int32_t part) {
  return part % W->cfg.partitions;
}
/** The model's partition of partition @p p of topic @p topic. */
static inline int32_t sim_mpart(const char *topic, int32_t p) {
  int t = W->ntopics > 1 && strcmp(topic, W->topics[1]) == 0;
  return t * W->cfg.partitions + p;
}
/** The topic of the model's key @p k. */
static inline int sim_key_topic(int k) {
  return k / W->cfg.keys;
}

/* ---- sim_world.c -------------------------------------------------------- */

/** Records the first violation of a schedule (the rest is noise). */
void sim_fail(const char *code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/** Prints a step's line when verbose. */
void sim_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** Opens the store at @p where (a directory, or a PostgreSQL URI). */
kl_store_t *sim_store_open(const char *where);
/** The process's LMDB environment @p slot (0 to SIM_ENVS - 1), opened when
 *  first asked; shared by the schedules, whose topics are their own. */
kl_store_t *sim_lmdb_env(int slot);
/** Closes and removes them all; sim_lmdb_envs_tick() every so many
 *  schedules, so that they do not grow without bound. */
void sim_lmdb_envs_close(void);
void sim_lmdb_envs_tick(void);

/** An event of (@p key, @p id), or SIM_NONE. A follow-up may have the id of
 *  another event (a hostile record's, an earlier log's follow-up's), and
 *  they are two events, though the store sees one id. */
uint32_t sim_event_find(uint8_t key, const char *id, size_t id_len);
uint32_t sim_event_add(uint8_t key, const char *id, size_t id_len);
/** Appends a record of event @p e (its envelope in @p bytes, taken) to its
 *  key's partition, stamped with the wall clock. @returns its offset. */
int64_t sim_log_append(uint32_t e, void *bytes, size_t len);
/** The same with timestamp @p ts and, when @p names >= 0, the header
 *  keylane.timer naming offset @p names (a firing record). */
int64_t sim_log_append_at(uint32_t e, void *bytes, size_t len, int64_t ts,
                          int64_t names);
/** A delayed event @p e takes its place among its key's events (its first
 *  firing record). */
void sim_key_place(uint32_t e);
/** The wall clock (ms since the Unix epoch): the store's, kl__now_ms(). */
int64_t sim_clock(void);
/** The key of topic @p topic named @p name, or -1. */
int sim_key_by_name(int topic, const void *name, size_t len);
/** With W->shared, counts the event of @p b's handler at @p fence in the
 *  row of its key name, which the topics share: the state of a handler
 *  that does not scope by topic (sim_world.c says why). @returns @p r, or
 *  what the count's store calls say. */
kl_handler_result_t sim_shared_count(kl_txn_t *txn, const kl_event_t *event,
                                     kl_handler_result_t r, char *errbuf,
                                     size_t errbuf_size);

void sim_view_init(sim_view_t *v);
void sim_view_free(sim_view_t *v);
/** A commit of @p epoch to @p part succeeded, to @p watermark: its epoch
 *  must be the store's. */
void sim_view_committed(sim_view_t *v, int32_t part, uint64_t epoch,
                        int64_t watermark);
/** A batch of @p b committed (truly: maybe its owner thinks not). */
void sim_view_commit(sim_batch_t *b);
/** An owner's group commit @p pd committed to @p watermark (truly). */
void sim_view_commit_lane(sim_view_t *v, const sim_pend_t *pd,
                          int64_t watermark);
/** Nonzero when event @p e was applied or dead-lettered (marked, or
 *  refused with no mark) in @p v. */
int sim_view_resolved(const sim_view_t *v, uint32_t e);
/** Event @p e was recorded a dead letter by a commit of @p epoch. */
void sim_view_dead(sim_view_t *v, uint32_t e, int32_t part, uint64_t epoch,
                   int64_t watermark);
/** A committed record at @p offset of @p part that the handler did not
 *  run (a tool's batch): a delayed event's scheduling, or a duplicate. */
void sim_view_skipped(sim_view_t *v, int32_t part, int64_t offset);
/** The store's pending timers against @p v's. */
void sim_view_check_timers(const sim_view_t *v, kl_store_t *store,
                           const char *who);
/** Checks what the store said of @p e's mark against @p v. */
void sim_view_check_mark(const sim_view_t *v, uint32_t e, kl_mark_t mark,
                         const char *who);
/** `keylane store reset` of @p part answered @p st: a new epoch, and the
 *  watermark 0. */
void sim_view_reset(sim_view_t *v, int32_t part,
                    const kl_partition_state_t *st);
/** An acquire of @p part answered @p st: epochs only grow. @p adopt: the
 *  fleet goes on with this store (not a rebuild made to compare). */
void sim_view_acquired(sim_view_t *v, int32_t part,
                       const kl_partition_state_t *st, int adopt);
/** Balances, epochs and watermarks of @p store against @p v. */
void sim_view_check_store(const sim_view_t *v, kl_store_t *store,
                          int conserved);
/** Reads the balances of @p store into @p out, every topic's keys.
 *  @returns 0, or -1. */
int sim_balances(kl_store_t *store, int64_t out[SIM_MAXK]);

/* ---- sim_owner.c -------------------------------------------------------- */

void sim_owner_init(sim_owner_t *o, int no);
void sim_owner_free(sim_owner_t *o);
/** The owner starts afresh: its memory is lost, and on PostgreSQL its
 *  connections and its owner cache with it. */
void sim_owner_restart(sim_owner_t *o);
/** The owner dies (and restarts): its memory and its open txn are lost. */
void sim_owner_crash(sim_owner_t *o);
/** Takes @p part with a new epoch; one it holds is given up first
 *  (committing what is final when @p w says so). */
void sim_owner_acquire(sim_owner_t *o, int32_t part, uint64_t w);
/** Hands the owner records of @p part and runs one turn of its engine;
 *  @p w is the step's choice (faults, how many records). */
void sim_owner_batch(sim_owner_t *o, int32_t part, uint64_t w);
/** One turn without new records; @p acks as sim_batch_t.acks. */
void sim_owner_tick(sim_owner_t *o, uint64_t w, int acks);
/** Resumes a paused owner with the commit fate and death @p w says. */
void sim_owner_resume(sim_owner_t *o, uint64_t w);
/** Nonzero when the owner has records of @p part to take or run. */
int sim_owner_can_work(const sim_owner_t *o, int32_t part);
/** Nonzero when the owner holds @p part with nothing left to run and no
 *  report in flight. */
int sim_owner_settled(const sim_owner_t *o, int32_t part);
/** Letters and follow-ups of the owner whose reports have not come. */
size_t sim_owner_inflight(const sim_owner_t *o);
/** Runs a tool's batch @p b through kl__apply_batch() (the applier its
 *  fields say): replay, redrive and rebuild run that path. */
void sim_batch_apply(sim_batch_t *b);

/* ---- sim_seams.c -------------------------------------------------------- */

/** The Kafka of owner @p o's engine of topic @p tno. */
sim_fake_t *sim_fake_new(sim_owner_t *o, int tno);
void sim_fake_free(sim_fake_t *f);
size_t sim_fake_inflight(const sim_fake_t *f);
/** What marks a record of the simulated log (its msg._private). */
void *sim_rec_private(void);

/* ---- sim_timers.c ------------------------------------------------------- */

/** The handler of a cancel or a defer (kind of @p e), run by @p b at
 *  @p part and @p offset through the real kl_txn_cancel() or
 *  kl_txn_emit_opts(); *@p seen: what the cancel answered. */
kl_handler_result_t sim_timers_handle(sim_batch_t *b, uint32_t e, int32_t part,
                                      int64_t offset, const kl_event_t *event,
                                      kl_txn_t *txn, int *seen, char *errbuf,
                                      size_t errbuf_size);
/** What @p o's handler saw of the cancel at @p part, @p offset (-1: it
 *  ran none); sim_timers_forget() drops them all (a restart). */
int sim_timers_seen(const sim_owner_t *o, int32_t part, int64_t offset);
void sim_timers_forget(sim_owner_t *o);
/** Cancel @p c ran in @p v at @p offset, its handler saw @p seen: the
 *  model's prediction (sim_world.c). */
void sim_view_cancel(sim_view_t *v, uint32_t c, int64_t offset, int seen);

/* ---- sim_tools.c -------------------------------------------------------- */

/** Dead-letters @p offset of @p part as an owner of @p epoch does after
 *  the letter is sent: its mark and the watermark past it, in one commit.
 *  @returns the commit's outcome. */
kl_err_t sim_dead_letter(kl_store_t *store, sim_view_t *v, int32_t part,
                         uint64_t epoch, int64_t offset, sim_fate_t fate);
void sim_replay(int32_t part);
/** @returns 0 when the letter is pending (not below its partition's
 *  watermark yet): nothing was done. */
int sim_redrive(size_t letter);
/** Rebuilds the store from the whole log into @p store, which holds
 *  nothing of the topic: @p v receives its decisions. @p adopt as
 *  sim_view_acquired() says. A violation says when it could not. */
void sim_rebuild(kl_store_t *store, sim_view_t *v, int adopt);
/** A rebuild that the fleet moves to: the store is replaced by it. */
void sim_rebuild_switch(void);

/* ---- sim_steps.c -------------------------------------------------------- */

sim_cfg_t sim_cfg_of(uint64_t seed);
/** Runs one schedule: its steps @p words, the drain, the final checks.
 *  @returns 0, or -1 with W->fail_* set. */
int sim_run(uint64_t seed, sim_backend_t backend, const uint64_t *words,
            size_t n, int verbose, sim_stats_t *stats, char *code,
            size_t code_size, char *msg, size_t msg_size);
/** The @p n choices of schedule @p seed. */
void sim_words(uint64_t seed, uint64_t *words, size_t n);
uint64_t sim_mix(uint64_t x);
/** The PostgreSQL database the PostgreSQL schedules share. */
extern const char *sim_pg_uri;
/** Nonzero: the schedules' publishes include a hostile producer's. */
extern int sim_hostile;
/** Nonzero: each schedule creates its topic again once, with a store
 *  reset (topic_recreate()). */
extern int sim_recreate;
/** The topics each schedule's store holds: 1, or 2 (the default). */
extern int sim_topics;

#endif
