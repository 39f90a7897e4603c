/*
 * A lane's group commit and what follows from its outcome: success
 * (advance the watermark, let stored overlay entries go), fencing (roll
 * everything back, pause), a failed commit (run the events again after a
 * backoff); giving a lane up; and dead letters.
 *
 * Everything here runs on the poll thread with kl__lanes_t.mu held, except
 * where it drops the lock around a store or Kafka call that may block.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "common/metrics.h"
#include "worker/lanes.h"
#include "worker/lanes_internal.h"
#include "worker/fire.h"
#include "worker/outbox.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"

#define KL_COMP "worker"
#define KL_DLQ_DRAIN_MS 5000 /* how long a release waits for letters' acks */

/* ---- building the commit ----------------------------------------------- */

typedef struct kl_build {
  kl__lane_t *lane;
  kl_txn_t *txn;
  uint64_t gen;           /* the overlay generation it holds */
  kl__ov_entry_t **built; /* the overlay entries put into txn */
  size_t nbuilt;
  kl__slots_t slots; /* the final slots it commits */
  int64_t watermark;
  size_t emits; /* follow-ups it commits into the outbox */
} kl_build_t;

/* The offset of the first slot that is not final: the new watermark. */
static int64_t lane_first_open(const kl__lane_t *lane) {
  for (size_t i = 0; i < lane->ring_count; i++) {
    const kl__slot_t *s = kl__lane_at(lane, i);
    /* Test only (common/mutant.h): KL__MUTANT_WATERMARK passes an event
     * waiting for its retry. */
    if (s->state == KL__SLOT_WAITING && KL__MUTANT(KL__MUTANT_WATERMARK))
      continue;
    if (s->state != KL__SLOT_DONE && s->state != KL__SLOT_DLQ_DONE)
      return s->offset;
  }
  return lane->next_offset;
}

static kl_err_t build_entry(kl_txn_t *txn, const kl__ov_entry_t *e) {
  const unsigned char *key = e->key + 1;
  size_t len = e->key_len - 1;
  if (e->key[0] == KL__OV_ID)
    return kl__txn_mark_sid(txn, (const char *)key, len, (kl_mark_t)e->tag);
  if (e->tag == KL__OV_DEL)
    return kl__txn_kv_del(txn, key, len);
  return kl__txn_kv_put(txn, key, len, e->val, e->val_len);
}

/* Moves the overlay's dirty entries and the final slots into b->txn. In
 * inline mode b->txn is the group txn, which holds the events' writes
 * already, and the overlay only dead letters' marks; those go last, as
 * they came last: an event run after a mark was set saw it, and was a
 * duplicate. */
/* The identity of the record at the new watermark - 1, which the store
 * keeps with it (kl__txn_set_last()); a build that does not move the
 * watermark leaves the stored one. */
static kl_err_t build_last(kl__lanes_t *lanes, kl__lane_t *lane,
                           kl_build_t *b) {
  if (b->watermark <= lane->watermark)
    return KL_OK;
  kl__slot_t *s = kl__lane_find(lane, b->watermark - 1);
  return s && s->msg
             ? kl__apply_set_last(lanes->applier.decoder, b->txn, s->msg)
             : KL_OK;
}

static kl_err_t commit_build(kl__lanes_t *lanes, kl__lane_t *lane,
                             kl_build_t *b) {
  size_t n;
  kl__ov_entry_t *list = kl__ov_take_dirty(&lane->ov, &n);
  b->gen = lane->ov.gen - 1;
  b->built = malloc((n ? n : 1) * sizeof(*b->built));
  if (!b->built)
    return KL_ENOMEM;
  kl_err_t err = KL_OK;
  for (kl__ov_entry_t *e = list; e; e = e->dnext) {
    b->built[b->nbuilt++] = e;
    if (!err)
      err = build_entry(b->txn, e);
  }
  b->slots = lane->final;
  memset(&lane->final, 0, sizeof(lane->final));
  for (size_t i = 0; i < b->slots.n; i++) {
    kl__slot_t *s = b->slots.v[i];
    s->building = 1;
    if (s->duplicate)
      kl_txn_count_duplicate(b->txn);
    int taken = 0; /* a firing record's dead letter takes its timer */
    if (s->state == KL__SLOT_DLQ_DONE && s->msg && !err)
      err = kl__apply_dead_letter(&lanes->applier, lane->partition, b->txn,
                                  s->msg, &taken);
    if (s->state == KL__SLOT_DLQ_DONE)
      s->timers = -taken;
    if (s->emits && !err && (err = kl__txn_add_emits(b->txn, s->emits)) == 0)
      b->emits += s->emits->count;
    kl__emits_free(s->emits); /* a rewind runs its event again */
    s->emits = NULL;
  }
  b->watermark = lane_first_open(lane);
  return err ? err : build_last(lanes, lane, b);
}

/* ---- outcomes ---------------------------------------------------------- */

/* One offset commit, for lag monitoring, of what the store committed:
 * the store is the source of truth. Each offset carries its lane's epoch
 * in the metadata (common/kafka.h): epochs outlive the store. A fenced or
 * released lane sends nothing: its partition has, or will have, a newer
 * owner, whose commit must not be overwritten. */
void kl__lanes_commit_kafka(kl__lanes_t *lanes, int64_t now_ns, int now_too) {
  if (!lanes->rk || (!now_too && now_ns - lanes->kafka_sent_ns <
                                     KL__KAFKA_COMMIT_MS * 1000000LL))
    return;
  rd_kafka_topic_partition_list_t *offsets =
      rd_kafka_topic_partition_list_new(lanes->count);
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || lane->watermark == lane->kafka_watermark || lane->lost ||
        (lane->state != KL__LANE_OWNED && lane->state != KL__LANE_DRAINING))
      continue;
    rd_kafka_topic_partition_t *tp =
        rd_kafka_topic_partition_list_add(offsets, lanes->topic, p);
    tp->offset = lane->watermark;
    kl__kafka_epoch_set(tp, lane->epoch);
    lane->kafka_watermark = lane->watermark;
  }
  if (offsets->cnt) {
    rd_kafka_resp_err_t kerr = rd_kafka_commit(lanes->rk, offsets, 1);
    if (kerr)
      KL_LOG_D(KL_COMP, "offset commit of %d partitions: %s", offsets->cnt,
               rd_kafka_err2str(kerr));
    lanes->kafka_sent_ns = now_ns;
    lanes->kafka_commits++;
  }
  rd_kafka_topic_partition_list_destroy(offsets);
}

void kl__lanes_kafka_committed(kl__lanes_t *lanes,
                               const rd_kafka_topic_partition_list_t *offsets,
                               rd_kafka_resp_err_t err) {
  pthread_mutex_lock(&lanes->mu);
  for (int i = 0; offsets && i < offsets->cnt; i++) {
    const rd_kafka_topic_partition_t *tp = &offsets->elems[i];
    kl__lane_t *lane = tp->partition >= 0 && tp->partition < lanes->count
                           ? lanes->lanes[tp->partition]
                           : NULL;
    rd_kafka_resp_err_t e = err ? err : tp->err;
    if (lane && e && e != RD_KAFKA_RESP_ERR__NO_OFFSET &&
        strcmp(tp->topic, lanes->topic) == 0 &&
        lane->kafka_watermark == tp->offset)
      lane->kafka_watermark = -1; /* sent again at the next tick */
  }
  pthread_mutex_unlock(&lanes->mu);
}

/* An applied event's latencies, into @p o (the two histograms, each
 * added once per commit): publish (its envelope's ts, a wall clock) and
 * taken from the consumer (the monotonic clock) to now, its commit. */
static void observe_applied(kl__observed_t o[2], const kl__slot_t *s,
                            int64_t now_ms, int64_t now_ns) {
  /* Negative when the producer's clock runs ahead of this host's. */
  int64_t since_ts = now_ms - s->ts_ms;
  kl__observed_add(&o[0], since_ts > 0 ? (double)since_ts / 1e3 : 0);
  kl__observed_add(&o[1], (double)(now_ns - s->taken_ns) / 1e9);
}

/* A committed slot's timers: the owner's count, and a fired one's
 * lateness by the store's clock, which judged it due (worker/fire.c). */
static void observe_timers(kl__lanes_t *lanes, const kl__lane_t *lane,
                           const kl__slot_t *s) {
  if (s->timers)
    kl__fire_count(lanes->fire, lane->partition, s->timers);
  if (s->fired_due <= 0)
    return;
  int64_t late = kl__store_now_ms() - s->fired_due;
  kl__series_observe(lanes->lateness, late > 0 ? (double)late / 1e3 : 0);
  if (late > KL__FIRE_LATE_MS)
    lanes->timers_late++;
}

static void commit_committed(kl__lanes_t *lanes, kl__lane_t *lane,
                             kl_build_t *b) {
  lane->ov.committed_gen = b->gen;
  int64_t now_ms = kl__now_ms(), now_ns = kl__mono_ns();
  kl__observed_t latencies[2];
  kl__observed_init(&latencies[0], lanes->latency);
  kl__observed_init(&latencies[1], lanes->commit_latency);
  uint64_t applied = 0;
  for (size_t i = 0; i < b->slots.n; i++) {
    kl__slot_t *s = b->slots.v[i];
    s->building = 0;
    s->committed = 1;
    if (s->state == KL__SLOT_DONE)
      observe_timers(lanes, lane, s);
    else if (s->timers) /* a dead letter that took its timer */
      kl__fire_count(lanes->fire, lane->partition, s->timers);
    if (s->state == KL__SLOT_DONE && s->duplicate) {
      lanes->duplicates++;
    } else if (s->state == KL__SLOT_DONE && s->scheduled) {
      lanes->timers_scheduled++;
      kl__fire_soon(lanes->fire, lane->partition, s->scheduled);
    } else if (s->state == KL__SLOT_DONE) {
      applied++;
      observe_applied(latencies, s, now_ms, now_ns);
    }
  }
  lanes->applied += applied; /* an atomic add per commit, not per event */
  kl__observed_flush(&latencies[0]);
  kl__observed_flush(&latencies[1]);
  /* An entry may go once stored, if no event of its key runs or waits:
   * such an event may hold a snapshot older than this commit. */
  for (size_t i = 0; i < b->nbuilt; i++) {
    kl__ov_entry_t *e = b->built[i];
    kl__lkey_t *writer = kl__lkey_of(e->writer);
    if (!e->dirty && e->gen <= b->gen && !writer->head) {
      kl__ov_free_entry(&lane->ov, e);
      kl__key_maybe_free(lanes, lane, writer);
    }
  }
  while (lane->ring_count && kl__lane_at(lane, 0)->committed)
    kl__lane_pop(lanes, lane);
  lane->watermark = b->watermark;
  lane->last_commit_ms = now_ms;
  lane->commit_backoff_ms = 0;
  lanes->batches++;
  lanes->commits_failing.n = 0;
  lanes->commit_sync = 0;
}

/* The failed commit's events run again: each keeps why, as its last
 * failure, for an operator (kl_worker_foreach_key(), GET /v1/keys), who
 * otherwise saw them waiting with no error while every commit failed. No
 * attempt is counted: the store failed, not the event (a handler step that
 * left the session idle past store.pg.idle.timeout counted one already,
 * lanes_pool.c), so the run its commit lost is taken back; else attempts
 * passed worker.max.attempts with no dead letter. */
static void slots_commit_failed(const kl__slots_t *slots, const char *text) {
  static const char what[] = "the group commit failed, the event runs again: ";
  int64_t now = kl__now_ms();
  for (size_t i = 0; i < slots->n; i++) {
    kl__slot_t *s = slots->v[i];
    char *why =
        s->state == KL__SLOT_DONE ? malloc(sizeof(what) + strlen(text)) : NULL;
    if (!why)
      continue; /* a dead letter's reason stays; short of memory: the old */
    snprintf(why, sizeof(what) + strlen(text), "%s%s", what, text);
    free(s->why);
    s->why = why;
    if (!s->duplicate && s->attempts > 0)
      s->attempts--; /* done_ok() counted the run */
    if (!s->first_failure_ms)
      s->first_failure_ms = now;
    s->last_failure_ms = now;
  }
}

/* The store refused or failed: nothing of the build is applied. */
static void commit_failed(kl__lanes_t *lanes, kl__lane_t *lane,
                          const kl__slots_t *slots, kl_err_t err,
                          const char *detail) {
  int ms = lane->commit_backoff_ms ? lane->commit_backoff_ms
                                   : (int)lanes->retry_initial_ms;
  char text[KL__ESCAPED_SIZE(512)]; /* a store's error may quote a key */
  KL_LOG_W(KL_COMP,
           "group commit of partition=%" PRId32 " failed (%s), its "
           "events run again in %d ms: %s",
           lane->partition, kl_err_name(err), ms,
           kl__escape(text, sizeof(text), detail, strlen(detail)));
  slots_commit_failed(slots, text);
  lanes->commit_all |= err == KL_ESTORE_BUSY;
  lanes->commit_sync |= err == KL_ESTORE_BUSY;
  lane->hold_until_ns = kl__mono_ns() + (int64_t)ms * 1000000;
  kl__failing_note(&lanes->commits_failing, text);
  lane->commit_backoff_ms =
      ms * 2 > lanes->retry_max_ms ? (int)lanes->retry_max_ms : ms * 2;
  kl__lane_rewind(lanes, lane);
}

/* Takes @p lane's open group txn, or begins one, and builds it into @p b.
 * A lane that cannot is dealt with here. @returns nonzero when built. */
static int build_lane(kl__lanes_t *lanes, kl__lane_t *lane, kl_build_t *b) {
  kl_err_t err = KL_OK;
  char detail[512] = "";
  memset(b, 0, sizeof(*b));
  b->lane = lane;
  b->txn = lane->batch;
  lane->batch = NULL;
  /* One begun ahead and not yet settled holds no writes (final dead-letter
   * marks come from the overlay): when it failed or waited too long, the
   * begin below decides, as in kl__lanes_batch(). */
  if (b->txn && kl__store_settle(b->txn)) {
    kl_store_abort(b->txn);
    b->txn = NULL;
  }
  if (!b->txn) {
    pthread_mutex_unlock(&lanes->mu);
    err = kl_store_begin(lanes->store, lanes->topic, lane->partition,
                         lane->epoch, &b->txn);
    snprintf(detail, sizeof(detail), "%s", err ? kl_err_detail() : "");
    pthread_mutex_lock(&lanes->mu);
  }
  if (!err && (err = commit_build(lanes, lane, b)) != KL_OK) {
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    kl_store_abort(b->txn);
  }
  if (err == KL_EFENCED)
    kl__lane_fenced(lanes, lane);
  else if (err)
    commit_failed(lanes, lane, &b->slots, err, detail);
  if (err) {
    free(b->built);
    free(b->slots.v);
  }
  return !err;
}

/* The before-commit hook of each build, and its commit's arguments, on
 * the poll thread (a pause there is a pause of the whole worker, as a
 * stalled process's would be). mu not held. */
static void builds_before(kl__lanes_t *lanes, kl_build_t *b,
                          kl__store_commit_t *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (lanes->applier.before_commit)
      lanes->applier.before_commit(lanes->applier.hook_opaque, lanes->topic,
                                   b[i].lane->partition, b[i].lane->epoch);
    c[i] = (kl__store_commit_t){b[i].txn, b[i].watermark, KL_OK, ""};
  }
}

/* The builds' one store commit. mu not held. */
static void builds_commit(kl__lanes_t *lanes, const kl_build_t *b,
                          kl__store_commit_t *c, size_t n) {
  int64_t began_ns = kl__mono_ns();
  kl__store_commit_many(c, n);
  kl__series_observe(lanes->store_commit,
                     (double)(kl__mono_ns() - began_ns) / 1e9);
  for (size_t i = 0; i < n; i++)
    if (!c[i].err && b[i].emits && lanes->applier.after_commit)
      lanes->applier.after_commit(lanes->applier.after_opaque, lanes->topic,
                                  b[i].lane->partition, b[i].lane->epoch);
}

/* Applies each build's outcome. mu held. */
static void builds_outcome(kl__lanes_t *lanes, kl_build_t *b,
                           const kl__store_commit_t *c, size_t n) {
  for (size_t i = 0; i < n; i++)
    b[i].lane->inflight = 0; /* before a fence's drop settles (lanes.c) */
  for (size_t i = 0; i < n; i++) {
    kl__lane_t *lane = b[i].lane;
    if (!c[i].err) {
      commit_committed(lanes, lane, &b[i]);
      if (b[i].emits) /* the poll loop publishes them (outbox.c) */
        kl__outbox_committed(lanes->outbox, lane->partition, lane->gen);
    } else if (c[i].err == KL_EFENCED) {
      kl__lane_fenced(lanes, lane);
    } else {
      commit_failed(lanes, lane, &b[i].slots, c[i].err, c[i].why);
    }
    free(b[i].built);
    free(b[i].slots.v);
  }
  kl__lanes_commit_kafka(lanes, kl__mono_ns(), 0);
}

/* Commits the builds @p b in one store commit and applies each outcome. */
static void commit_builds(kl__lanes_t *lanes, kl_build_t *b,
                          kl__store_commit_t *c, size_t n) {
  pthread_mutex_unlock(&lanes->mu);
  builds_before(lanes, b, c, n);
  builds_commit(lanes, b, c, n);
  pthread_mutex_lock(&lanes->mu);
  builds_outcome(lanes, b, c, n);
}

/* A due lane without a batch begins one in its build: first the lanes
 * that are not due let theirs go when they hold nothing to commit (a batch
 * begun ahead, say), or that begin could wait for connections only this
 * thread can give back. mu held. */
static void lanes_room_for_builds(kl__lanes_t *lanes, kl__lane_t *const *due,
                                  size_t n) {
  int begins = 0;
  for (size_t i = 0; i < n; i++)
    begins |= !due[i]->batch;
  for (int32_t p = 0; begins && lanes->txn_max && p < lanes->count; p++) {
    kl__lane_t *l = lanes->lanes[p];
    if (l && l->batch && !l->final.n && !l->running) {
      kl_store_abort(l->batch);
      l->batch = NULL;
    }
  }
}

void kl__lanes_commit(kl__lanes_t *lanes, kl__lane_t *const *due, size_t n) {
  kl__lanes_settle(lanes);
  lanes_room_for_builds(lanes, due, n);
  kl_build_t one_build;
  kl__store_commit_t one_commit;
  kl_build_t *b = n > 1 ? malloc(n * sizeof(*b)) : NULL;
  kl__store_commit_t *c = n > 1 ? malloc(n * sizeof(*c)) : NULL;
  if (!b || !c) { /* one lane, or no memory for more: one at a time */
    free(b);
    free(c);
    for (size_t i = 0; i < n; i++)
      if (build_lane(lanes, due[i], &one_build))
        commit_builds(lanes, &one_build, &one_commit, 1);
    return;
  }
  /* Builds begin store txns: at most txn_max held at once, or a begin
   * would wait for the ones this thread holds. */
  size_t built = 0;
  for (size_t i = 0; i < n; i++) {
    if (lanes->txn_max && built >= lanes->txn_max) {
      commit_builds(lanes, b, c, built);
      built = 0;
    }
    built += build_lane(lanes, due[i], &b[built]);
  }
  if (built)
    commit_builds(lanes, b, c, built);
  free(b);
  free(c);
}

/* ---- the commit in flight (inline mode) ---------------------------------
 *
 * The tick builds the due lanes as kl__lanes_commit() does, and the
 * committer thread commits them while the poll thread consumes and runs
 * the events of other lanes. What makes that safe:
 * - A lane in flight runs no event (kl__lane_schedulable()) and builds
 *   no other commit (kl__lane_may_commit()) until the outcome is applied:
 *   its group txn went into the build, and a new one would read a
 *   snapshot without the writes in flight.
 * - Whatever changes a lane's window or ownership (a fence, a rewind, a
 *   release, a new owner: kl__lane_wait_idle(), kl__lane_drop()) and the
 *   synchronous commits (kl__lanes_commit()) settle the flight first, so
 *   an outcome is applied to the lane as it was built.
 * - The store commits before Kafka's offsets as before: the outcome, which
 *   moves the watermark the offsets carry, is applied after the commit.
 * - The before-commit hook runs on the poll thread, before the flight
 *   leaves it; after-commit on the committer. */

typedef enum {
  KL_FLIGHT_NONE,    /* none: the tick may build one */
  KL_FLIGHT_QUEUED,  /* built, waiting for the committer */
  KL_FLIGHT_RUNNING, /* the store commits it */
  KL_FLIGHT_DONE,    /* committed or failed, its outcome not applied */
  KL_FLIGHT_REAPING, /* its outcome being applied */
} kl_flight_state_t;

struct kl__flight {
  kl_flight_state_t state;
  size_t n, cap;
  kl_build_t *b;
  kl__store_commit_t *c;
};

void kl__lanes_flight_free(kl__lanes_t *lanes) {
  if (lanes->flight) {
    free(lanes->flight->b);
    free(lanes->flight->c);
    free(lanes->flight);
  }
  lanes->flight = NULL;
}

int kl__lanes_flight_queued(const kl__lanes_t *lanes) {
  return lanes->flight && lanes->flight->state == KL_FLIGHT_QUEUED;
}

int kl__lanes_flight_run(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  struct kl__flight *f = lanes->flight;
  if (!f || f->state != KL_FLIGHT_QUEUED) {
    pthread_mutex_unlock(&lanes->mu);
    return 0;
  }
  f->state = KL_FLIGHT_RUNNING;
  pthread_mutex_unlock(&lanes->mu);
  builds_commit(lanes, f->b, f->c, f->n);
  pthread_mutex_lock(&lanes->mu);
  f->state = KL_FLIGHT_DONE;
  kl__lanes_flight_done(lanes);
  pthread_mutex_unlock(&lanes->mu);
  return 1;
}

int kl__lanes_reap(kl__lanes_t *lanes) {
  struct kl__flight *f = lanes->flight;
  if (!f || f->state != KL_FLIGHT_DONE)
    return 0;
  f->state = KL_FLIGHT_REAPING; /* an outcome's settle waits for nothing */
  builds_outcome(lanes, f->b, f->c, f->n);
  f->n = 0;
  f->state = KL_FLIGHT_NONE;
  return 1;
}

void kl__lanes_settle(kl__lanes_t *lanes) {
  struct kl__flight *f = lanes->flight;
  if (!f)
    return;
  if (f->state == KL_FLIGHT_QUEUED) {
    pthread_mutex_unlock(&lanes->mu);
    kl__lanes_flight_run(lanes); /* or the committer took it meanwhile */
    pthread_mutex_lock(&lanes->mu);
  }
  while (f->state == KL_FLIGHT_QUEUED || f->state == KL_FLIGHT_RUNNING)
    pthread_cond_wait(&lanes->flight_cv, &lanes->mu);
  kl__lanes_reap(lanes);
}

/* The flight, made on first use, with room for @p n builds. */
static struct kl__flight *flight_room(kl__lanes_t *lanes, size_t n) {
  struct kl__flight *f = lanes->flight;
  if (!f && !(f = lanes->flight = calloc(1, sizeof(*f))))
    return NULL;
  if (f->cap >= n)
    return f;
  kl_build_t *b = realloc(f->b, n * sizeof(*b));
  if (b)
    f->b = b;
  kl__store_commit_t *c = b ? realloc(f->c, n * sizeof(*c)) : NULL;
  if (c)
    f->c = c;
  if (!b || !c)
    return NULL;
  f->cap = n;
  return f;
}

void kl__lanes_commit_async(kl__lanes_t *lanes, kl__lane_t *const *due,
                            size_t n) {
  struct kl__flight *f = lanes->flight;
  if (f && f->state != KL_FLIGHT_NONE)
    return;                           /* one at a time: these commit after it */
  if (!(f = flight_room(lanes, n))) { /* short of memory: as before */
    kl__lanes_commit(lanes, due, n);
    return;
  }
  lanes_room_for_builds(lanes, due, n);
  /* Builds begin store txns: at most txn_max, as kl__lanes_commit(). */
  size_t built = 0;
  for (size_t i = 0; i < n && (!lanes->txn_max || built < lanes->txn_max); i++)
    built += build_lane(lanes, due[i], &f->b[built]);
  if (!built)
    return;
  for (size_t i = 0; i < built; i++)
    f->b[i].lane->inflight = 1;
  f->n = built;
  f->state = KL_FLIGHT_RUNNING; /* the hooks run: no one takes it yet */
  pthread_mutex_unlock(&lanes->mu);
  builds_before(lanes, f->b, f->c, built);
  pthread_mutex_lock(&lanes->mu);
  f->state = KL_FLIGHT_QUEUED;
  if (kl__lanes_flight_start(lanes))
    kl__lanes_settle(lanes); /* no committer: here, as before */
}

/* The store txns the commit in flight holds. mu held. */
static size_t lanes_flight_txns(const kl__lanes_t *lanes) {
  const struct kl__flight *f = lanes->flight;
  return f && f->state != KL_FLIGHT_NONE ? f->n : 0;
}

/* The store txns this thread holds: the lanes' batches and the flight's.
 * mu held. */
static size_t lanes_open_txns(const kl__lanes_t *lanes) {
  size_t open = lanes_flight_txns(lanes);
  for (int32_t p = 0; p < lanes->count; p++)
    open += lanes->lanes[p] && lanes->lanes[p]->batch;
  return open;
}

/* Up to worker.batch.max records of @p lane's window still to run, from
 * offset @p from: what the group transaction prefetches the ids of next.
 * A chunk at a time, not the whole window (up to worker.window.max): a
 * transaction holds about a batch, and the next one would look the rest
 * up again, each id about window/batch times. Poll thread. @returns a
 * malloc()ed array of *@p n, or NULL. */
static rd_kafka_message_t **window_msgs(kl__lanes_t *lanes, kl__lane_t *lane,
                                        int64_t from, size_t *n) {
  pthread_mutex_lock(&lanes->mu);
  size_t max =
      lane->ring_count < lanes->batch_max ? lane->ring_count : lanes->batch_max;
  rd_kafka_message_t **msgs = max ? malloc(max * sizeof(*msgs)) : NULL;
  *n = 0;
  for (size_t i = 0; msgs && *n < max && i < lane->ring_count; i++) {
    const kl__slot_t *slot = kl__lane_at(lane, i);
    if (slot->offset >= from &&
        (slot->state == KL__SLOT_QUEUED || slot->state == KL__SLOT_RUNNING))
      msgs[(*n)++] = slot->msg;
  }
  pthread_mutex_unlock(&lanes->mu);
  return msgs;
}

/* Inline mode, before @p lane begins a group transaction: when the other
 * lanes' open ones are as many as the store allows (txn_max, from
 * store.pg.pool), they end first, committed when they hold final events
 * and rolled back when they hold none; otherwise the begin would wait for
 * connections only this thread can give back. Poll thread, mu not held. */
static void lanes_make_room(kl__lanes_t *lanes, const kl__lane_t *lane) {
  pthread_mutex_lock(&lanes->mu);
  size_t open = lanes_open_txns(lanes), n = 0;
  if (open >= lanes->txn_max && lanes_flight_txns(lanes)) {
    kl__lanes_settle(lanes); /* its txns end first */
    open = lanes_open_txns(lanes);
  }
  for (int32_t p = 0; open >= lanes->txn_max && p < lanes->count; p++) {
    kl__lane_t *other = lanes->lanes[p];
    if (!other || other == lane || !other->batch || other->running)
      continue;
    if (other->final.n && other->state == KL__LANE_OWNED) {
      lanes->due[n++] = other;
    } else if (!other->final.n) {
      kl_store_abort(other->batch);
      other->batch = NULL;
    }
  }
  if (n)
    kl__lanes_commit(lanes, lanes->due, n);
  pthread_mutex_unlock(&lanes->mu);
}

/* The group transaction looks the ids of the lane's window up a chunk at a
 * time (kl__apply_prefetch()) before their handlers run: when it begins,
 * and when @p job is past what it looked up. */
static kl_err_t lanes_prefetch(kl__lanes_t *lanes, const kl__job_t *job) {
  kl__lane_t *lane = job->lane;
  if (!kl__store_has_prefetch(lanes->store) ||
      job->msg->offset < lane->prefetched_to)
    return KL_OK;
  size_t n;
  rd_kafka_message_t **msgs = window_msgs(lanes, lane, job->msg->offset, &n);
  kl_err_t err = kl__apply_prefetch(&lanes->applier, lane->batch, msgs, n, 0);
  if (n)
    lane->prefetched_to = msgs[n - 1]->offset + 1;
  free(msgs);
  return err;
}

/* Inline mode, as @p lane starts a group transaction: the next lane in
 * turn with events ready begins its own and looks their ids up ahead
 * (kl__apply_begin_ahead()), so that the server answers while @p lane's
 * handlers run, instead of after them. Only on an idle pooled connection
 * and within txn_max; a lane that cannot simply begins when its turn
 * comes. Poll thread, mu not held. */
static void lanes_ahead(kl__lanes_t *lanes, const kl__lane_t *lane) {
  if (!kl__store_has_prefetch(lanes->store))
    return;
  kl__lane_t *next = NULL;
  pthread_mutex_lock(&lanes->mu);
  size_t open = lanes_open_txns(lanes);
  for (int32_t i = 1; !next && i < lanes->count; i++) {
    kl__lane_t *l = lanes->lanes[(lane->partition + i) % lanes->count];
    if (kl__lane_schedulable(l) && !l->batch && !l->final.n && !l->running)
      next = l;
  }
  pthread_mutex_unlock(&lanes->mu);
  if (!next || (lanes->txn_max && open >= lanes->txn_max))
    return;
  size_t n;
  rd_kafka_message_t **msgs = window_msgs(lanes, next, 0, &n);
  kl_txn_t *txn;
  if (n && kl__apply_begin_ahead(&lanes->applier, next->partition, next->epoch,
                                 msgs, n, &txn) == KL_OK) {
    next->batch = txn;
    next->batch_ns = kl__mono_ns(); /* its BEGIN is on the way */
    next->prefetched_to = msgs[n - 1]->offset + 1;
    lanes->ahead++;
  }
  free(msgs);
}

kl_err_t kl__lanes_batch(kl__lanes_t *lanes, const kl__job_t *job,
                         kl_txn_t **txn) {
  kl__lane_t *lane = job->lane;
  kl_err_t err = KL_OK;
  int starts = lane->batch && kl__store_pending(lane->batch);
  /* Begun ahead: when that failed (or waited too long), the begin below
   * fails the same way, or succeeds (a connection that lost its link is
   * replaced there). */
  if (lane->batch && kl__store_settle(lane->batch)) {
    kl_store_abort(lane->batch);
    lane->batch = NULL;
  }
  if (!lane->batch && lanes->txn_max)
    lanes_make_room(lanes, lane);
  if (!lane->batch) {
    err = kl_store_begin(lanes->store, lanes->topic, job->partition, job->epoch,
                         &lane->batch);
    lane->batch_ns = kl__mono_ns();
    lane->prefetched_to = 0;
    starts = 1;
  }
  if (!err && starts)
    lanes_ahead(lanes, lane);
  if (!err && (err = lanes_prefetch(lanes, job))) {
    kl_store_abort(lane->batch);
    lane->batch = NULL;
    /* What the lane's final events wrote was in it: they run again. */
    if (lane->final.n)
      lane->rewind = 1;
  }
  *txn = lane->batch;
  return err;
}

/* ---- fencing and rewinding ---------------------------------------------- */

void kl__lane_fenced(kl__lanes_t *lanes, kl__lane_t *lane) {
  lane->state = KL__LANE_FENCED;
  kl__lane_wait_idle(lanes, lane);
  size_t events = lane->ring_count;
  kl_partition_state_t now = {0};
  pthread_mutex_unlock(&lanes->mu);
  kl_store_partition(lanes->store, lanes->topic, lane->partition, &now);
  pthread_mutex_lock(&lanes->mu);
  KL_LOG_W(KL_COMP,
           "fenced partition=%" PRId32 " my_epoch=%" PRIu64
           " current_epoch=%" PRIu64 ": a newer owner holds it; the %zu "
           "events of its window were rolled back; the partition waits for "
           "the group to move it, or for that owner to go quiet "
           "(worker.fenced.retake.ms)",
           lane->partition, lane->epoch, now.epoch, events);
  lanes->fenced++;
  kl__outbox_drop(lanes->outbox, lane->partition);
  if (lanes->fire)
    kl__fire_drop(lanes->fire, lane->partition);
  kl__lane_drop(lanes, lane);
  lane->gen++;
  kl__lane_pause(lanes, lane, KL__PAUSE_FENCED);
}

/* Puts @p slot, not final, at the end of its key's FIFO. */
static void fifo_append(kl__slot_t *slot) {
  kl__lkey_t *key = slot->key;
  slot->next = NULL;
  if (key->tail)
    key->tail->next = slot;
  else
    key->head = slot;
  key->tail = slot;
}

/*
 * The overlay can no longer be trusted (a failed commit took the writes
 * it held, or memory ran out while merging): every completed event that is
 * not committed is run again, from the store. Dead letters stay written;
 * their marks go back into the overlay.
 */
void kl__lane_rewind(kl__lanes_t *lanes, kl__lane_t *lane) {
  kl__lane_wait_idle(lanes, lane);
  lane->rewind = 0;
  if (lane->batch) {
    kl_store_abort(lane->batch);
    lane->batch = NULL;
  }
  kl__ov_clear(&lane->ov);
  for (size_t i = 0; i < lane->ring_count; i++)
    kl__lane_at(lane, i)->key->head = kl__lane_at(lane, i)->key->tail = NULL;
  lane->ready.n = lane->final.n = 0;
  int64_t now = kl__mono_ns();
  for (size_t i = 0; i < lane->ring_count; i++) {
    kl__slot_t *s = kl__lane_at(lane, i);
    s->building = 0;
    if (s->committed)
      continue;
    if (s->state == KL__SLOT_DONE) {
      s->state = KL__SLOT_QUEUED;
      s->duplicate = s->scheduled = 0;
      kl__emits_free(s->emits); /* it emits them again when it runs */
      s->emits = NULL;
    }
    if (s->state == KL__SLOT_DLQ_DONE) {
      if (!lane->final.n)
        lane->first_final_ns = now;
      kl__slots_push(&lane->final, s);
      if (s->id)
        kl__ov_set(&lane->ov, &s->key->ov, KL__OV_ID, s->id, s->id_len, NULL, 0,
                   KL_MARK_DEAD_LETTER);
      continue;
    }
    fifo_append(s);
    if (s->key->head == s && s->state == KL__SLOT_QUEUED)
      kl__ready_push(lane, s);
  }
}

/* ---- giving a lane up --------------------------------------------------- */

static size_t lane_letters_inflight(const kl__lane_t *lane) {
  size_t n = 0;
  for (size_t i = 0; i < lane->dlq.n; i++)
    n += lane->dlq.v[i]->dlq_inflight;
  return n;
}

/* Gives the lane's letters in flight a while to be acknowledged, so that
 * their slots commit now instead of being dead-lettered again by the next
 * owner. */
static void lane_drain_letters(kl__lanes_t *lanes, kl__lane_t *lane) {
  int64_t deadline = kl__mono_ns() + KL_DLQ_DRAIN_MS * 1000000LL;
  while (lane_letters_inflight(lane) && kl__mono_ns() < deadline) {
    pthread_mutex_unlock(&lanes->mu);
    kl__dlq_poll(lanes->dlq, 50);
    pthread_mutex_lock(&lanes->mu);
  }
}

int64_t kl__lanes_release(kl__lanes_t *lanes, int32_t partition, int commit,
                          uint64_t *epoch) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = partition < lanes->count ? lanes->lanes[partition] : NULL;
  if (!lane || lane->state == KL__LANE_FREE) {
    pthread_mutex_unlock(&lanes->mu);
    return -1;
  }
  if (lane->state == KL__LANE_OWNED)
    lane->state = KL__LANE_DRAINING;
  lane->lost = !commit;
  kl__lane_wait_idle(lanes, lane);
  if (commit && lane->state == KL__LANE_DRAINING) {
    lane_drain_letters(lanes, lane);
    if (lane->rewind) /* its txn was lost: only what is final commits */
      kl__lane_rewind(lanes, lane);
    /* One waiting on a store error holds the rest: its next owner runs
     * them all (a failed commit's backoff does not hold: it is over). */
    if (lane->final.n && !lane->store_held)
      kl__lanes_commit(lanes, &lane, 1);
    kl__lanes_commit_kafka(lanes, kl__mono_ns(), 1);
    pthread_mutex_unlock(&lanes->mu);
    kl__outbox_drain(lanes->outbox, partition, KL_DLQ_DRAIN_MS);
    pthread_mutex_lock(&lanes->mu);
  }
  kl__outbox_drop(lanes->outbox, partition);
  if (lanes->fire)
    kl__fire_drop(lanes->fire, partition);
  int64_t watermark = lane->watermark;
  *epoch = lane->epoch;
  kl__lane_drop(lanes, lane);
  lane->gen++;
  lane->state = KL__LANE_FREE;
  lane->paused = 0;
  pthread_mutex_unlock(&lanes->mu);
  return watermark;
}

/* ---- dead letters ------------------------------------------------------- */

void kl__lane_dead_letter(kl__lanes_t *lanes, kl__lane_t *lane,
                          kl__slot_t *slot, kl__dlq_reason_t reason,
                          const char *why) {
  slot->state = KL__SLOT_DLQ_PENDING;
  slot->reason = reason;
  slot->due_ns = 0;                 /* at once */
  char text[KL__ESCAPED_SIZE(512)]; /* the handler's or decoder's text */
  if (reason != KL__DLQ_MISROUTED)  /* lanes_route.c warns, rate-limited */
    KL_LOG_W(KL_COMP,
             "dead letter partition=%" PRId32 " offset=%" PRId64
             " reason=%s attempts=%d: %s",
             lane->partition, slot->offset, kl__dlq_reason_name(reason),
             slot->attempts,
             kl__escape(text, sizeof(text), why, why ? strlen(why) : 0));
  kl__slots_push(&lane->dlq, slot);
  (void)lanes;
}

/* Kafka refused @p slot's whole letter for good. A copy cut short would
 * lose the record's tail (and a redrive would publish the stump), so the
 * partition waits at this record and says why; the letter is tried again
 * every KL_LETTER_REFUSED_NS, so that raising the limits moves it on
 * without a restart. The partition stalls meanwhile (/healthz, the
 * keylane_worker_partition_stalled metric). */
#define KL_LETTER_REFUSED_NS 10000000000LL
static void letter_refused(kl__lane_t *lane, kl__slot_t *slot,
                           const char *why) {
  KL_LOG_E(KL_COMP,
           "dead letter partition=%" PRId32 " offset=%" PRId64
           " (%zu bytes, reason %s) was refused for good (%s); a letter is "
           "never cut short, so the partition waits at this record and "
           "tries again in %lld s: raise the dead-letter topic's "
           "max.message.bytes and the worker's kafka.message.max.bytes "
           "above the record plus 1 KiB of keylane.dlq.* headers",
           lane->partition, slot->offset, slot->msg->len,
           kl__dlq_reason_name(slot->reason), why,
           KL_LETTER_REFUSED_NS / 1000000000LL);
  slot->due_ns = kl__mono_ns() + KL_LETTER_REFUSED_NS;
}

static kl_err_t letter_send(kl__lanes_t *lanes, kl__lane_t *lane,
                            kl__slot_t *slot) {
  int misrouted = slot->reason == KL__DLQ_MISROUTED;
  kl__dlq_letter_t letter = {slot->msg,
                             slot->reason,
                             slot->why,
                             slot->attempts,
                             slot->first_failure_ms,
                             slot->last_failure_ms,
                             misrouted ? slot->expected_partition : -1,
                             misrouted && slot->forward,
                             NULL};
  kl__dlq_ref_t ref = {lane->partition, slot->offset, lane->gen};
  return kl__dlq_send(lanes->dlq, lanes->topic, &letter, &ref);
}

static void lane_send_letters(kl__lanes_t *lanes, kl__lane_t *lane,
                              int64_t now) {
  for (size_t i = 0; i < lane->dlq.n; i++) {
    kl__slot_t *s = lane->dlq.v[i];
    if (s->dlq_inflight || now < s->due_ns)
      continue;
    kl_err_t err = letter_send(lanes, lane, s);
    if (err == KL_OK) {
      s->dlq_inflight = 1;
    } else if (err == KL_EKAFKA) {
      letter_refused(lane, s, kl_err_detail());
    } else {
      KL_LOG_W(KL_COMP,
               "dead letter partition=%" PRId32 " offset=%" PRId64
               " is produced again in 1 s: %s",
               lane->partition, s->offset, kl_err_detail());
      s->due_ns = now + 1000000000LL;
    }
  }
}

void kl__lanes_send_dead_letters(kl__lanes_t *lanes, int64_t now) {
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (lane && lane->state == KL__LANE_OWNED && lane->dlq.n)
      lane_send_letters(lanes, lane, now);
  }
}

static void letter_acked(kl__lanes_t *lanes, kl__lane_t *lane,
                         kl__slot_t *slot) {
  kl__slots_remove(&lane->dlq, slot);
  if (slot->id && kl__ov_set(&lane->ov, &slot->key->ov, KL__OV_ID, slot->id,
                             slot->id_len, NULL, 0, KL_MARK_DEAD_LETTER))
    lane->rewind = 1;
  if (slot->forward)
    lanes->forwarded++;
  else
    lanes->dead_letters++;
  if (slot->reason != KL__DLQ_DECODE && slot->reason != KL__DLQ_MISROUTED &&
      slot->reason != KL__DLQ_RESERVED_ID) /* the record's fault */
    lanes->failed++;
  kl__lane_finish(lanes, lane, slot, KL__SLOT_DLQ_DONE);
}

void kl__lanes_dlq_ack(void *opaque, const kl__dlq_ref_t *ref, kl_err_t err,
                       const char *errstr) {
  kl__lanes_t *lanes = opaque;
  if (ref->lane_gen == KL__DLQ_OUTBOX_GEN) { /* the outbox's, not a lane's */
    kl__outbox_aside_acked(lanes->outbox, ref, err, errstr);
    return;
  }
  if (ref->lane_gen == KL__DLQ_TIMER_GEN) { /* a firing record */
    kl__fire_acked(lanes->fire, ref, err);
    return;
  }
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane =
      ref->partition < lanes->count ? lanes->lanes[ref->partition] : NULL;
  kl__slot_t *slot = NULL;
  if (lane && lane->gen == ref->lane_gen &&
      (lane->state == KL__LANE_OWNED || lane->state == KL__LANE_DRAINING))
    slot = kl__lane_find(lane, ref->offset);
  if (slot && slot->state == KL__SLOT_DLQ_PENDING) {
    slot->dlq_inflight = 0;
    if (err == KL_EKAFKA) {
      letter_refused(lane, slot, errstr);
    } else if (err) {
      KL_LOG_W(KL_COMP,
               "dead letter partition=%" PRId32 " offset=%" PRId64
               " was not acknowledged, it is produced again: %s",
               ref->partition, ref->offset, errstr);
      slot->due_ns = kl__mono_ns() + 1000000000LL;
    } else {
      letter_acked(lanes, lane, slot);
    }
  }
  pthread_mutex_unlock(&lanes->mu);
}
