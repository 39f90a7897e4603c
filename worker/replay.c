/*
 * The replay engine (see replay.h for the rules it keeps): one consumer
 * with partitions assigned by hand, one buffer per partition, and
 * kl__apply_batch() for every batch, as a worker's lane does.
 */
#include "worker/replay.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "worker/apply.h"
#include "worker/checks.h"
#include "worker/letters.h"
#include "worker/rebuild.h"
#include "store/store_internal.h"

#define KL_COMP "replay"
#define KL_KAFKA_TIMEOUT_MS 10000
/* Attempts of a batch whose handler or store asks for a retry. */
#define KL_REPLAY_ATTEMPTS 5

typedef struct kl_rpart {
  kl__replay_part_t *p; /* in kl__replay.pub, the array callers read */
  rd_kafka_message_t **msgs;
  size_t count;
} kl_rpart_t;

struct kl__replay {
  kl__replay_opts_t opts;
  rd_kafka_t *rk;
  kl__replay_part_t *pub;
  kl_rpart_t *parts;
  size_t count;
  int32_t topic_partitions;
  size_t batch_max;
  kl__applier_t applier; /* the store's */
  kl__applier_t scratch; /* a dry run's empty store, for epoch-0 parts */
  char scratch_dir[64];
  kl__letters_t letters; /* the fleet's dead letters, once needed */
  int letters_read;
  int64_t beat_period_ns; /* kl__beat_period_ns() of opts.conf */
  int64_t beat_ns;        /* when the partitions last beat */
  kl__beat_t *beats;      /* room for one beat per partition */
  int bound;              /* a rebuild recorded the topic's owner */
  int owner_checked;      /* the store's recorded owner is this side's */
};

const char *kl__replay_status_name(kl__replay_status_t status) {
  static const char *const names[] = {"pending", "running", "done", "stopped",
                                      "fenced",  "failed",  "error"};
  return status <= KL__REPLAY_ERROR ? names[status] : "?";
}

int kl__replay_gap(int64_t watermark, int64_t low, int64_t start) {
  if (start <= watermark)
    return 0;
  return start == low ? 1 : 2;
}

/* ---- beating --------------------------------------------------------- */

/*
 * The applier's tick, between the events of a batch, between the steps of
 * a backoff and once per read loop: every partition this replay holds
 * beats once a beat period has passed, so that a live worker it fenced
 * sees it work and does not take it back (worker.c) however long a batch
 * takes. A replay that stops being called here (paused, hung in a handler,
 * dead) stops beating and is taken back. @returns KL_EFENCED when
 * @p partition (-1: none) has a newer owner, which stops its batch.
 */
static kl_err_t replay_tick(void *opaque, int32_t partition) {
  kl__replay_t *r = opaque;
  int64_t now = kl__mono_ns();
  if (r->opts.dry_run || now - r->beat_ns < r->beat_period_ns)
    return KL_OK;
  r->beat_ns = now;
  size_t n = 0;
  for (size_t i = 0; i < r->count; i++) {
    const kl__replay_part_t *p = r->parts[i].p;
    if (p->status == KL__REPLAY_RUNNING)
      r->beats[n++] = (kl__beat_t){p->partition, p->epoch, KL_OK};
  }
  kl_err_t err = kl__store_beat(r->opts.store, r->opts.topic, r->beats, n);
  if (err) {
    KL_LOG_W(KL_COMP, "no heartbeat: %s", kl_err_detail());
    return KL_OK; /* a store that is down fails the commit as well */
  }
  for (size_t i = 0; i < n; i++)
    if (r->beats[i].partition == partition && r->beats[i].err)
      return kl__err(KL_EFENCED,
                     "fenced: partition %" PRId32 " of %s has "
                     "an owner newer than this replay's epoch %" PRIu64
                     ", which refused its heartbeat",
                     partition, r->opts.topic, r->beats[i].epoch);
  return KL_OK; /* another fenced partition: its next commit says so */
}

/* ---- setup ------------------------------------------------------------ */

static kl_err_t replay_topic(kl__replay_t *r) {
  kl_err_t err = kl__kafka_partition_count(
      r->rk, r->opts.topic, KL_KAFKA_TIMEOUT_MS, &r->topic_partitions);
  if (err)
    return err;
  int64_t want = kl__conf_int(r->opts.conf, "worker.expect.partitions");
  if (want && want != r->topic_partitions)
    return kl__err(KL_EPARTITIONS,
                   "topic %s has %" PRId32 " partitions, the fleet expects "
                   "%" PRId64 ": keys would have moved between owners; "
                   "recreate the topic or pass --partitions %" PRId32,
                   r->opts.topic, r->topic_partitions, want,
                   r->topic_partitions);
  return KL_OK;
}

static kl_err_t replay_ranges(kl__replay_t *r) {
  int32_t *list;
  size_t n;
  kl_err_t err =
      kl__pos_partitions(r->opts.partitions, r->topic_partitions, &list, &n);
  if (err)
    return err;
  kl__tp_range_t *ranges = calloc(n, sizeof(*ranges));
  r->parts = calloc(n, sizeof(*r->parts));
  r->pub = calloc(n, sizeof(*r->pub));
  r->beats = calloc(n, sizeof(*r->beats));
  if (!ranges || !r->parts || !r->pub || !r->beats) {
    free(list);
    free(ranges);
    return KL_ENOMEM;
  }
  r->count = n;
  for (size_t i = 0; i < n; i++) {
    ranges[i].partition = list[i];
    r->parts[i].p = &r->pub[i];
  }
  free(list);
  err = kl__kafka_resolve(r->rk, r->opts.topic, ranges, n, &r->opts.from,
                          &r->opts.to, KL_KAFKA_TIMEOUT_MS);
  for (size_t i = 0; !err && i < n; i++) {
    kl__replay_part_t *p = r->parts[i].p;
    p->partition = ranges[i].partition;
    p->low = ranges[i].low;
    p->high = ranges[i].high;
    p->start = ranges[i].start;
    p->end = ranges[i].end;
    p->history_from = -1;
  }
  free(ranges);
  return err;
}

kl_err_t kl__replay_new(const kl__replay_opts_t *opts, kl__replay_t **out) {
  if (!opts || !opts->topic || !*opts->topic || !opts->store ||
      !opts->handler || !opts->conf || !out)
    return kl__err(KL_EINVAL, "kl__replay_new: conf, topic, store and "
                              "handler are required");
  if (!kl_conf_get(opts->conf, "kafka.bootstrap.servers"))
    return kl__err(KL_ECONF, "no bootstrap servers: pass -b HOST:PORT");
  kl_err_t err = kl__conf_timer_check(opts->conf);
  if (err)
    return err;
  kl__replay_t *r = calloc(1, sizeof(*r));
  if (!r)
    return KL_ENOMEM;
  r->opts = *opts;
  r->batch_max = opts->batch_max ? opts->batch_max
                 : opts->dry_run ? KL__REPLAY_DRY_BATCH
                                 : KL__REPLAY_BATCH;
  r->applier = (kl__applier_t){
      .store = opts->store,
      .topic = opts->topic,
      .handler = opts->handler,
      .handler_opaque = opts->handler_opaque,
      .decoder = kl_decoder_new(),
      .before_commit = opts->before_commit,
      .hook_opaque = opts->hook_opaque,
      .dry_run = opts->dry_run,
      .dry_run_handler = opts->dry_run_handler,
      .tick = replay_tick,
      .tick_opaque = r,
      .timer_max_ms = kl__conf_int(opts->conf, "timer.max.delay"),
      .timer_past_ms = kl__conf_int(opts->conf, "store.dedup.retention")};
  r->beat_period_ns = kl__beat_period_ns(opts->conf);
  /* A start that retention deleted meanwhile must fail, not skip. */
  err = r->applier.decoder ? kl__kafka_reader_new(opts->conf, "keylane-replay",
                                                  "error", &r->rk)
                           : KL_ENOMEM;
  if (!err)
    err = replay_topic(r);
  if (!err)
    err = replay_ranges(r);
  if (err) {
    kl__replay_destroy(r);
    return err;
  }
  *out = r;
  return KL_OK;
}

/* ---- planning: the store's view, checked before anything is taken ----- */

static kl_err_t plan_part(kl__replay_t *r, kl__replay_part_t *p) {
  kl_partition_state_t st;
  kl_err_t err =
      kl_store_partition(r->opts.store, r->opts.topic, p->partition, &st);
  if (err)
    return err;
  if (r->opts.rebuild && (st.epoch || st.watermark))
    return kl__err(KL_EINVAL,
                   "the store already holds topic %s partition %" PRId32
                   " (epoch %" PRIu64 ", watermark %" PRId64 "): a rebuild "
                   "writes into an empty store; point --store at a new "
                   "location, or use keylane replay to re-apply a range",
                   r->opts.topic, p->partition, st.epoch, st.watermark);
  p->epoch = st.epoch;
  p->watermark_before = p->watermark = st.watermark;
  if (p->start < 0) /* --from watermark */
    p->start = st.watermark < p->low    ? p->low
               : st.watermark > p->high ? p->high
                                        : st.watermark;
  p->next = p->position = p->start;
  int gap = kl__replay_gap(st.watermark, p->low, p->start);
  if (gap == 2 && !r->opts.allow_gap)
    return kl__err(KL_EINVAL,
                   "partition %" PRId32 ": the range starts at offset %" PRId64
                   ", above the store's watermark %" PRId64 ", and the log "
                   "still holds the events in between: the watermark would "
                   "jump over them and no worker would apply them; start at "
                   "--from watermark (or an offset <= %" PRId64 "), or pass "
                   "--allow-gap to skip them on purpose",
                   p->partition, p->start, st.watermark, st.watermark);
  if (gap) {
    p->history_from = p->start;
    p->history_skipped = gap == 2;
  }
  return KL_OK;
}

static kl_err_t replay_plan(kl__replay_t *r) {
  for (size_t i = 0; i < r->count; i++) {
    kl_err_t err = plan_part(r, r->parts[i].p);
    if (err)
      return err;
  }
  return KL_OK;
}

/* ---- taking the partitions -------------------------------------------- */

static kl_err_t scratch_open(kl__replay_t *r) {
  if (r->scratch.store)
    return KL_OK;
  const char *tmp = getenv("TMPDIR");
  snprintf(r->scratch_dir, sizeof(r->scratch_dir), "%s/keylane-dry-XXXXXX",
           tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  if (!mkdtemp(r->scratch_dir)) {
    r->scratch_dir[0] = '\0';
    return kl__err(KL_EIO,
                   "dry run: cannot make a scratch directory in "
                   "%s; set TMPDIR to a writable directory",
                   tmp && *tmp ? tmp : "/tmp");
  }
  kl_conf_t *conf = kl_conf_new();
  kl_err_t err =
      conf ? kl_conf_set(conf, "store.durability", "none") : KL_ENOMEM;
  kl_store_t *store = NULL;
  if (!err)
    err = kl_store_open(r->scratch_dir, conf, &store);
  kl_conf_destroy(conf);
  if (err)
    return err;
  r->scratch = r->applier;
  r->scratch.store = store;
  return KL_OK;
}

/* The store for a partition's batches: the scratch one for a dry run of a
 * never-owned partition. */
static const kl__applier_t *replay_applier(const kl__replay_t *r,
                                           const kl__replay_part_t *p) {
  return p->scratch ? &r->scratch : &r->applier;
}

static kl_err_t take_dry(kl__replay_t *r, kl__replay_part_t *p) {
  if (p->epoch > 0)
    return KL_OK;
  kl_partition_state_t st;
  kl_err_t err = scratch_open(r);
  if (!err)
    err = kl_store_acquire(r->scratch.store, r->opts.topic, p->partition, &st);
  if (!err) {
    p->scratch = 1;
    p->epoch = st.epoch;
  }
  return err;
}

/* A rebuild records its cluster and group (-X worker.group) as the
 * topic's owner (kl__store_bind()), before its first take: the store it
 * builds is the one a fleet of that cluster and group runs on next. A
 * cluster that does not say its id is logged: the next worker records its
 * own then. */
static void rebuild_bind(kl__replay_t *r) {
  kl__store_owner_t owner;
  if (!r->opts.rebuild || r->opts.dry_run || r->bound)
    return;
  r->bound = 1;
  kl_err_t err =
      kl__checks_kafka_owner(r->rk, kl_conf_get(r->opts.conf, "worker.group"),
                             KL_KAFKA_TIMEOUT_MS, &owner);
  if (!err)
    err = kl__store_bind(r->opts.store, r->opts.topic, &owner);
  if (err)
    KL_LOG_W(KL_COMP,
             "the rebuilt store records no owner of topic %s: %s; its first "
             "worker records its own cluster and group",
             r->opts.topic, kl_err_detail());
}

/* Takes @p p with an epoch above @p floor, the fleet's (replay_fleet_epochs).
 */
static kl_err_t take_part(kl__replay_t *r, kl__replay_part_t *p,
                          uint64_t floor) {
  p->status = KL__REPLAY_RUNNING;
  p->exact = r->opts.dry_run;
  if (r->opts.dry_run)
    return take_dry(r, p);
  kl_partition_state_t st, before = {0};
  kl_err_t err;
  /* Before the rebuild records its owner: a store of another cluster (or,
   * for a rebuild, group) is refused, not taken nor bound over. */
  if (!r->owner_checked) {
    const char *group =
        r->opts.rebuild ? kl_conf_get(r->opts.conf, "worker.group") : NULL;
    if ((err = kl__checks_hand_owner(
             r->rk, r->opts.store, r->opts.topic, group, KL_KAFKA_TIMEOUT_MS,
             r->opts.rebuild ? "store rebuild" : "replay")))
      return err;
    r->owner_checked = 1;
  }
  rebuild_bind(r);
  if (floor) /* for previous_epoch: the acquire's answer hides it */
    kl_store_partition(r->opts.store, r->opts.topic, p->partition, &before);
  for (int attempt = 1;; attempt++) {
    err = kl__store_acquire_above(r->opts.store, r->opts.topic, p->partition,
                                  floor, &st);
    if (!err || !kl_err_is_retriable(err) || attempt >= KL_REPLAY_ATTEMPTS)
      break;
    kl__sleep_ms(100 << attempt);
  }
  if (err)
    return err;
  p->epoch = st.epoch;
  p->previous_epoch = st.epoch - 1 > floor ? st.epoch - 1 : before.epoch;
  /* The owner may have committed since the plan: the watermark only grows,
   * so the gap checked there only shrank. */
  p->watermark = st.watermark;
  KL_LOG_D(KL_COMP,
           "took partition=%" PRId32 " epoch=%" PRIu64 " watermark=%" PRId64
           " range=[%" PRId64 ",%" PRId64 ")",
           p->partition, p->epoch, p->watermark, p->start, p->end);
  return KL_OK;
}

/*
 * The epochs the fleet's group (worker.group) recorded in its offset
 * commits, one per partition to replay: a rebuilt or new store starts above
 * them, as a worker does (common/kafka.h). A dry run takes no epoch.
 * @returns the floors to free(), or NULL with the error in *err.
 */
static uint64_t *replay_fleet_epochs(kl__replay_t *r, kl_err_t *err) {
  uint64_t *floors = calloc(r->count + 1, sizeof(*floors));
  int32_t *ids = calloc(r->count + 1, sizeof(*ids));
  *err = floors && ids ? KL_OK : KL_ENOMEM;
  for (size_t i = 0; !*err && i < r->count; i++)
    ids[i] = r->parts[i].p->partition;
  const char *group = kl_conf_get(r->opts.conf, "worker.group");
  if (!*err && !r->opts.dry_run)
    *err = kl__kafka_group_epochs(r->opts.conf, group, r->opts.topic, ids,
                                  r->count, floors, NULL, 10000);
  free(ids);
  if (*err) {
    free(floors);
    return NULL;
  }
  return floors;
}

/* Takes every partition with something to read and assigns it. */
static kl_err_t replay_take(kl__replay_t *r) {
  kl_err_t err;
  uint64_t *floors = replay_fleet_epochs(r, &err);
  if (!floors)
    return err;
  rd_kafka_topic_partition_list_t *l =
      rd_kafka_topic_partition_list_new((int)r->count);
  for (size_t i = 0; !err && i < r->count; i++) {
    kl__replay_part_t *p = r->parts[i].p;
    if (p->start >= p->end) {
      p->status = KL__REPLAY_DONE;
      continue;
    }
    if ((err = take_part(r, p, floors[i])) != KL_OK) {
      p->status = KL__REPLAY_ERROR;
      snprintf(p->why, sizeof(p->why), "%s", kl_err_detail());
      break;
    }
    rd_kafka_topic_partition_list_add(l, r->opts.topic, p->partition)->offset =
        p->start;
  }
  if (!err && l->cnt > 0) {
    rd_kafka_resp_err_t kerr = rd_kafka_assign(r->rk, l);
    if (kerr)
      err = kl__err(KL_EKAFKA, "cannot assign the partitions of %s: %s",
                    r->opts.topic, rd_kafka_err2str(kerr));
  }
  rd_kafka_topic_partition_list_destroy(l);
  free(floors);
  return err;
}

/* ---- applying ---------------------------------------------------------- */

static void drop_msgs(kl_rpart_t *rp) {
  for (size_t i = 0; i < rp->count; i++)
    rd_kafka_message_destroy(rp->msgs[i]);
  rp->count = 0;
}

/* Ends a partition: stops fetching it and drops what was not applied. */
static void part_end(kl__replay_t *r, kl_rpart_t *rp,
                     kl__replay_status_t status, const char *why) {
  rp->p->status = status;
  if (why && !rp->p->why[0])
    snprintf(rp->p->why, sizeof(rp->p->why), "%s", why);
  drop_msgs(rp);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, r->opts.topic, rp->p->partition);
  rd_kafka_pause_partitions(r->rk, l);
  rd_kafka_topic_partition_list_destroy(l);
}

static void replay_account(kl__replay_part_t *p, const kl__apply_result_t *res,
                           size_t count, int64_t last_offset, int dry_run) {
  if (dry_run && p->batches > 0)
    p->exact = 0; /* this batch did not see the previous one's keys */
  p->read += count;
  p->applied += res->applied;
  p->skipped_duplicate += res->duplicates;
  p->skipped_applied += res->redelivered;
  p->watermark = res->next;
  p->next = last_offset + 1;
  p->batches++;
}

static kl_err_t apply_once(kl__replay_t *r, kl_rpart_t *rp, size_t count,
                           kl__apply_result_t *res) {
  kl__replay_part_t *p = rp->p;
  return kl__apply_batch(replay_applier(r, p), p->partition, p->epoch,
                         p->watermark, rp->msgs, count, res);
}

/* A dry run was fenced by a new owner: nothing was written, so it goes on
 * with that owner's epoch. Returns nonzero when it may retry. */
static int dry_refence(kl__replay_t *r, kl__replay_part_t *p) {
  kl_partition_state_t st;
  if (!r->opts.dry_run || p->scratch ||
      kl_store_partition(r->opts.store, r->opts.topic, p->partition, &st) ||
      st.epoch == p->epoch)
    return 0;
  p->epoch = st.epoch;
  return 1;
}

static size_t index_of(const kl_rpart_t *rp, int64_t offset) {
  size_t i = 0;
  while (i < rp->count && rp->msgs[i]->offset < offset)
    i++;
  return i;
}

static void replay_apply(kl__replay_t *r, kl_rpart_t *rp, size_t count);

/* The fleet's dead letters of the topic, read when a record first fails:
 * a record the fleet dead-lettered fails here too. */
static const kl__letters_t *fleet_letters(kl__replay_t *r) {
  if (r->letters_read)
    return &r->letters;
  r->letters_read = 1;
  const char *name = kl_conf_get(r->opts.conf, "worker.dlq.topic");
  char fallback[300];
  if (!name || !*name) {
    snprintf(fallback, sizeof(fallback), "%s.dlq", r->opts.topic);
    name = fallback;
  }
  kl__pos_t from = {KL__POS_BEGINNING, 0}, to = {KL__POS_END, 0};
  if (kl__letters_read(r->opts.conf, name, &from, &to, r->opts.stop,
                       &r->letters) != KL_OK)
    KL_LOG_D(KL_COMP, "no dead letters from %s: %s", name, kl_err_detail());
  return &r->letters;
}

/* Records the first buffered record as dead-lettered, as its fleet did:
 * its id marked KL_MARK_DEAD_LETTER (when it decodes), a firing record's
 * timer taken (kl__apply_dead_letter()) and the watermark past it, in one
 * fenced commit; no handler runs. */
static kl_err_t record_dead_letter(kl__replay_t *r, kl_rpart_t *rp) {
  kl__replay_part_t *p = rp->p;
  const kl__applier_t *a = replay_applier(r, p);
  rd_kafka_message_t *m = rp->msgs[0];
  kl_txn_t *txn;
  kl_err_t err =
      kl_store_begin(a->store, r->opts.topic, p->partition, p->epoch, &txn);
  if (err)
    return err;
  kl_event_t ev;
  kl_mark_t mark = KL_MARK_NONE;
  if (kl_event_decode(a->decoder, m->key, m->key_len, m->payload, m->len,
                      &ev) == KL_OK &&
      (err = kl_txn_seen(txn, ev.key, ev.key_len, ev.id, ev.id_len, &mark)) ==
          KL_OK &&
      mark == KL_MARK_NONE)
    err = kl_txn_mark(txn, ev.key, ev.key_len, ev.id, ev.id_len,
                      KL_MARK_DEAD_LETTER);
  if (!err) /* a firing record's: its timer goes, as the fleet's went */
    err = kl__apply_dead_letter(a, p->partition, txn, m, NULL);
  if (err || r->opts.dry_run)
    kl_store_abort(txn);
  else
    err = kl_store_commit(txn, m->offset + 1);
  if (err)
    return err;
  p->read++;
  p->skipped_dead_letter++;
  p->watermark = p->next = m->offset + 1;
  rd_kafka_message_destroy(m);
  memmove(rp->msgs, rp->msgs + 1, (rp->count - 1) * sizeof(*rp->msgs));
  rp->count--;
  return KL_OK;
}

/* The record at res->failed_offset failed: apply what came before it;
 * then, when the fleet dead-lettered it, record it so and go on, else
 * stop the partition there. @returns the records used up (the prefix and
 * the dead letter), 0 when the partition stopped. */
static size_t apply_failed(kl__replay_t *r, kl_rpart_t *rp,
                           const kl__apply_result_t *res) {
  kl__replay_part_t *p = rp->p;
  size_t k = index_of(rp, res->failed_offset);
  char why[600];
  snprintf(why, sizeof(why), "offset %" PRId64 ": %s", res->failed_offset,
           res->why);
  if (k > 0)
    replay_apply(r, rp, k);
  if (p->status != KL__REPLAY_RUNNING)
    return 0; /* the prefix itself did not commit */
  if (kl__letters_find(fleet_letters(r), r->opts.topic, p->partition,
                       res->failed_offset)) {
    kl_err_t err = record_dead_letter(r, rp);
    if (!err)
      return k + 1;
    part_end(r, rp, err == KL_EFENCED ? KL__REPLAY_FENCED : KL__REPLAY_ERROR,
             kl_err_detail());
    return 0;
  }
  p->read++;
  p->failed++;
  p->next = res->failed_offset;
  part_end(r, rp, KL__REPLAY_FAILED, why);
  return 0;
}

/* Applies the first @p count buffered records of a partition as one
 * batch, and drops them. */
static void replay_apply(kl__replay_t *r, kl_rpart_t *rp, size_t count) {
  kl__replay_part_t *p = rp->p;
  int backoff_ms = 100;
  for (int attempt = 1; count > 0 && p->status == KL__REPLAY_RUNNING;
       attempt++) {
    kl__apply_result_t res;
    kl_err_t err = apply_once(r, rp, count, &res);
    if (!err && res.verdict == KL_HANDLER_OK) {
      replay_account(p, &res, count, rp->msgs[count - 1]->offset,
                     r->opts.dry_run);
      for (size_t i = 0; i < count; i++)
        rd_kafka_message_destroy(rp->msgs[i]);
      memmove(rp->msgs, rp->msgs + count,
              (rp->count - count) * sizeof(*rp->msgs));
      rp->count -= count;
      return;
    }
    int exhausted = !err && res.verdict == KL_HANDLER_RETRY &&
                    attempt >= KL_REPLAY_ATTEMPTS;
    if ((!err && res.verdict == KL_HANDLER_FAIL) || exhausted) {
      size_t used = apply_failed(r, rp, &res);
      count = used ? count - used : 0;
      attempt = 0;
      continue;
    }
    if (err == KL_EFENCED && dry_refence(r, p))
      continue;
    if (err == KL_EFENCED) {
      part_end(r, rp, KL__REPLAY_FENCED, kl_err_detail());
      return;
    }
    const char *why = err ? kl_err_detail() : res.why;
    if (r->opts.stop && *r->opts.stop) {
      part_end(r, rp, KL__REPLAY_STOPPED, why);
      return;
    }
    if ((err && !kl_err_is_retriable(err)) || attempt >= KL_REPLAY_ATTEMPTS) {
      part_end(r, rp, KL__REPLAY_ERROR, why);
      return;
    }
    char text[KL__ESCAPED_SIZE(512)]; /* may be a handler's text */
    KL_LOG_W(KL_COMP,
             "batch of partition=%" PRId32 " at offset %" PRId64
             " will be retried in %d ms: %s",
             p->partition, rp->msgs[0]->offset, backoff_ms,
             kl__escape(text, sizeof(text), why, strlen(why)));
    kl__apply_sleep(&r->applier, p->partition, backoff_ms);
    backoff_ms *= 2;
  }
}

/* ---- reading ---------------------------------------------------------- */

static kl_rpart_t *rpart_find(kl__replay_t *r, int32_t partition) {
  for (size_t i = 0; i < r->count; i++)
    if (r->parts[i].p->partition == partition)
      return &r->parts[i];
  return NULL;
}

static void part_flush_done(kl__replay_t *r, kl_rpart_t *rp) {
  replay_apply(r, rp, rp->count);
  if (rp->p->status == KL__REPLAY_RUNNING) {
    rp->p->next = rp->p->end;
    part_end(r, rp, KL__REPLAY_DONE, NULL);
  }
}

static void on_error(kl__replay_t *r, rd_kafka_message_t *m) {
  kl_rpart_t *rp = m->rkt ? rpart_find(r, m->partition) : NULL;
  if (!rp || rp->p->status != KL__REPLAY_RUNNING) {
    if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
      KL_LOG_W(KL_COMP, "consume: %s", rd_kafka_message_errstr(m));
  } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    if (m->offset >= rp->p->end)
      part_flush_done(r, rp);
  } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET ||
             m->err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE) {
    char why[600];
    snprintf(why, sizeof(why),
             "offset %" PRId64 " is no longer in the log "
             "(retention deleted it while the replay ran): %s",
             rp->p->position, rd_kafka_message_errstr(m));
    replay_apply(r, rp, rp->count);
    part_end(r, rp, KL__REPLAY_ERROR, why);
  } else {
    KL_LOG_W(KL_COMP, "consume partition=%" PRId32 ": %s", m->partition,
             rd_kafka_message_errstr(m));
  }
  rd_kafka_message_destroy(m);
}

static void on_message(kl__replay_t *r, rd_kafka_message_t *m) {
  kl_rpart_t *rp = rpart_find(r, m->partition);
  if (!rp || rp->p->status != KL__REPLAY_RUNNING || m->offset >= rp->p->end) {
    rd_kafka_message_destroy(m);
    if (rp && rp->p->status == KL__REPLAY_RUNNING)
      part_flush_done(r, rp);
    return;
  }
  if (!rp->msgs && !(rp->msgs = malloc(r->batch_max * sizeof(*rp->msgs)))) {
    rd_kafka_message_destroy(m);
    part_end(r, rp, KL__REPLAY_ERROR, "out of memory for a batch");
    return;
  }
  rp->msgs[rp->count++] = m;
  rp->p->position = m->offset + 1;
  if (m->offset + 1 >= rp->p->end)
    part_flush_done(r, rp);
  else if (rp->count >= r->batch_max)
    replay_apply(r, rp, rp->count);
}

static size_t replay_running(const kl__replay_t *r) {
  size_t n = 0;
  for (size_t i = 0; i < r->count; i++)
    n += r->parts[i].p->status == KL__REPLAY_RUNNING;
  return n;
}

/* Nothing arrived for a while: apply what is buffered, so that a slow
 * fetch still commits (and shows) progress. Not in a dry run, whose batch
 * is the range. */
static void apply_idle(kl__replay_t *r) {
  if (r->opts.dry_run)
    return;
  for (size_t i = 0; i < r->count; i++)
    if (r->parts[i].count && r->parts[i].p->status == KL__REPLAY_RUNNING)
      replay_apply(r, &r->parts[i], r->parts[i].count);
}

static void replay_progress(kl__replay_t *r) {
  if (r->opts.on_progress)
    r->opts.on_progress(r->opts.progress_opaque, r);
}

static void replay_loop(kl__replay_t *r) {
  while (replay_running(r) > 0) {
    if (r->opts.stop && *r->opts.stop)
      break;
    replay_tick(r, -1);
    rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, 100);
    if (m && m->err)
      on_error(r, m);
    else if (m)
      on_message(r, m);
    else
      apply_idle(r);
    replay_progress(r);
  }
  for (size_t i = 0; i < r->count; i++)
    if (r->parts[i].p->status == KL__REPLAY_RUNNING)
      part_end(r, &r->parts[i], KL__REPLAY_STOPPED,
               "stopped by a signal after the batch in flight");
}

/* ---- a rebuild's outbox ------------------------------------------------ */

typedef struct kl_rb_read {
  kl__rebuild_t *rb;
  const char *topic;
  kl_decoder_t *decoder;
} kl_rb_read_t;

static int rebuild_record(void *opaque, rd_kafka_message_t *m) {
  kl_rb_read_t *x = opaque;
  kl_event_t ev;
  if (kl_event_decode(x->decoder, m->key, m->key_len, m->payload, m->len,
                      &ev) == KL_OK)
    kl__rebuild_see(x->rb, x->topic, &ev);
  return 0;
}

/* Feeds every retained record of @p topic to @p rb. A topic that does not
 * exist holds no follow-up. */
static kl_err_t rebuild_read(kl__replay_t *r, rd_kafka_t *rk, kl_rb_read_t *x) {
  int32_t n = 0;
  kl_err_t err =
      kl__kafka_partition_count(rk, x->topic, KL_KAFKA_TIMEOUT_MS, &n);
  if (err == KL_ENOTFOUND)
    return KL_OK;
  kl__tp_range_t *ranges = err ? NULL : calloc((size_t)n, sizeof(*ranges));
  if (!err && !ranges)
    err = kl__err(KL_ENOMEM, "out of memory");
  for (int32_t p = 0; !err && p < n; p++)
    ranges[p].partition = p;
  kl__pos_t from = {KL__POS_BEGINNING, 0}, to = {KL__POS_END, 0};
  if (!err)
    err = kl__kafka_resolve(rk, x->topic, ranges, (size_t)n, &from, &to,
                            KL_KAFKA_TIMEOUT_MS);
  if (!err)
    err = kl__kafka_read(rk, x->topic, ranges, (size_t)n, rebuild_record, x,
                         r->opts.stop);
  free(ranges);
  return err;
}

/* Feeds the follow-ups the fleet set aside (dead letters of reason
 * outbox: Kafka refused them) to @p x->rb, as records of their
 * destination: their letter holds them, and its redrive publishes them,
 * so the rebuilt outbox must not derive them again under another id. */
static void rebuild_aside(kl__replay_t *r, kl_rb_read_t *x) {
  const kl__letters_t *letters = fleet_letters(r);
  for (size_t i = 0; i < letters->n; i++) {
    const kl__letter_t *l = &letters->v[i];
    const rd_kafka_message_t *m = l->msg;
    kl_event_t ev;
    if (strcmp(l->reason, "outbox") == 0 && l->destination[0] &&
        !l->truncated[0] &&
        kl_event_decode(x->decoder, m->key, m->key_len, m->payload, m->len,
                        &ev) == KL_OK)
      kl__rebuild_see(x->rb, l->destination, &ev);
  }
}

/* A rebuild derived every follow-up again: those its destination's log
 * holds were published by the fleet, and those its dead-letter topic holds
 * were set aside by it; both leave the outbox (rebuild.h). */
static kl_err_t rebuild_outbox(kl__replay_t *r) {
  int32_t *parts = malloc((r->count ? r->count : 1) * sizeof(*parts));
  if (!parts)
    return kl__err(KL_ENOMEM, "out of memory");
  for (size_t i = 0; i < r->count; i++)
    parts[i] = r->parts[i].p->partition;
  kl_rb_read_t x = {NULL, NULL, kl_decoder_new()};
  rd_kafka_t *rk = NULL;
  kl_err_t err = x.decoder ? kl__rebuild_new(r->opts.store, r->opts.topic,
                                             parts, r->count, &x.rb)
                           : kl__err(KL_ENOMEM, "out of memory");
  free(parts);
  if (!err && kl__rebuild_topic(x.rb, 0))
    err = kl__kafka_reader_new(r->opts.conf, "keylane-rebuild-outbox",
                               "earliest", &rk);
  for (size_t i = 0; !err && (x.topic = kl__rebuild_topic(x.rb, i)); i++)
    err = rebuild_read(r, rk, &x);
  if (!err && kl__rebuild_topic(x.rb, 0))
    rebuild_aside(r, &x);
  uint64_t dropped = 0, kept = 0;
  if (!err && !(r->opts.stop && *r->opts.stop))
    err = kl__rebuild_prune(x.rb, &dropped, &kept);
  else if (!err)
    err = kl__err(KL_ESTOPPED, "stopped by a signal");
  if (!err)
    KL_LOG_I(KL_COMP,
             "outbox: %" PRIu64 " follow-ups the log holds already are not "
             "kept; %" PRIu64 " it does not hold are kept, to be published",
             dropped, kept);
  if (rk)
    rd_kafka_destroy(rk);
  kl__rebuild_destroy(x.rb);
  kl_decoder_destroy(x.decoder);
  return err;
}

kl_err_t kl__replay_run(kl__replay_t *r) {
  kl_err_t err = replay_plan(r);
  if (!err)
    err = replay_take(r);
  if (err) {
    /* Whatever was taken before the failure is left to the fleet. */
    for (size_t i = 0; i < r->count; i++)
      if (r->parts[i].p->status == KL__REPLAY_RUNNING)
        r->parts[i].p->status = KL__REPLAY_ERROR;
    return err;
  }
  replay_progress(r);
  replay_loop(r);
  rd_kafka_assign(r->rk, NULL);
  replay_progress(r);
  if (r->opts.rebuild && !r->opts.dry_run && (err = rebuild_outbox(r)))
    return kl__err(err,
                   "the rebuilt store's outbox holds the follow-ups derived "
                   "again, and which of them the log holds could not be "
                   "read (%s): do not run a worker on it (it would publish "
                   "them a second time); rebuild into an empty store again",
                   kl_err_detail());
  return KL_OK;
}

/* ---- results ----------------------------------------------------------- */

const kl__replay_part_t *kl__replay_parts(const kl__replay_t *r,
                                          size_t *count) {
  *count = r->count;
  return r->pub;
}

void kl__replay_totals(const kl__replay_t *r, kl__replay_part_t *t) {
  memset(t, 0, sizeof(*t));
  t->partition = -1;
  t->history_from = -1;
  t->exact = r->opts.dry_run;
  t->status = KL__REPLAY_DONE;
  for (size_t i = 0; i < r->count; i++) {
    const kl__replay_part_t *p = r->parts[i].p;
    t->read += p->read;
    t->applied += p->applied;
    t->skipped_applied += p->skipped_applied;
    t->skipped_duplicate += p->skipped_duplicate;
    t->failed += p->failed;
    t->skipped_dead_letter += p->skipped_dead_letter;
    t->batches += p->batches;
    if (p->status > t->status)
      t->status = p->status;
    if (r->opts.dry_run && p->batches && !p->exact)
      t->exact = 0;
  }
}

void kl__replay_set_progress(kl__replay_t *r,
                             void (*on_progress)(void *opaque,
                                                 const kl__replay_t *replay),
                             void *opaque) {
  r->opts.on_progress = on_progress;
  r->opts.progress_opaque = opaque;
}

const kl__replay_opts_t *kl__replay_opts(const kl__replay_t *r) {
  return &r->opts;
}

static void scratch_remove(kl__replay_t *r) {
  kl_store_destroy(r->scratch.store);
  if (!r->scratch_dir[0])
    return;
  static const char *const files[] = {"data.mdb", "lock.mdb"};
  char path[128];
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", r->scratch_dir, files[i]);
    unlink(path);
  }
  if (rmdir(r->scratch_dir) != 0)
    KL_LOG_W(KL_COMP, "could not remove the dry run's scratch store %s",
             r->scratch_dir);
}

void kl__replay_destroy(kl__replay_t *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->count; i++) {
    drop_msgs(&r->parts[i]);
    free(r->parts[i].msgs);
  }
  free(r->parts);
  free(r->pub);
  free(r->beats);
  if (r->rk)
    rd_kafka_destroy(r->rk);
  scratch_remove(r);
  kl__letters_clear(&r->letters);
  kl_decoder_destroy(r->applier.decoder);
  free(r);
}
