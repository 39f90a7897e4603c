/* A log that went backwards or lost records stops its partition:
 * log_guard.h. */
#include "worker/log_guard.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "worker/apply.h"

#define KL_COMP "worker"
#define KL_QUERY_MS 5000       /* the watermark query's timeout */
#define KL_SEEK_MS 10000       /* a seek's timeout */
#define KL_RETRY_NS 1000000000 /* a check that failed, a stop: again in 1 s */
#define KL_WATCH_NS 5000000000 /* idle partitions' positions: every 5 s */

typedef enum kl_guard_state {
  KL_GUARD_NONE = 0,
  KL_GUARD_PENDING, /* halted: the log is to be checked */
  KL_GUARD_STOPPED, /* halted: the log went wrong; waits for a reset */
} kl_guard_state_t;

typedef struct kl_guarded {
  kl_guard_state_t state;
  int64_t due_ns;                /* next check: 1 s after the last one */
  uint64_t epoch;                /* STOPPED: the lane's epoch then */
  uint64_t redelivered;          /* PENDING: dropped below the watermark */
  kl__checks_log_result_t check; /* STOPPED: why */
  uint64_t gap_records;
  int refused;     /* STOPPED before it was taken: not one the worker owns */
  int64_t watched; /* the lane's position + 1 at the last watch; 0: none */
} kl_guarded_t;

struct kl__log_guard {
  const char *topic;
  rd_kafka_t *rk;
  kl_store_t *store;
  kl__lanes_t *lanes;
  int skip_gaps; /* worker.on.gap=skip */
  /* The poll thread alone writes parts and count, under mu, which
   * /metrics takes to read them; the poll thread reads without it. */
  pthread_mutex_t mu;
  kl_guarded_t *parts;
  int32_t count;
  int active;       /* partitions not NONE: the tick's fast path */
  int64_t watch_ns; /* the next guard_watch() */
};

kl_err_t kl__log_guard_new(const kl_conf_t *conf, const char *topic,
                           rd_kafka_t *rk, kl_store_t *store,
                           kl__lanes_t *lanes, kl__log_guard_t **out) {
  kl__log_guard_t *guard = calloc(1, sizeof(*guard));
  if (!guard)
    return KL_ENOMEM;
  *guard = (kl__log_guard_t){
      .topic = topic, .rk = rk, .store = store, .lanes = lanes};
  guard->skip_gaps = strcmp(kl_conf_get(conf, "worker.on.gap"), "skip") == 0;
  pthread_mutex_init(&guard->mu, NULL);
  *out = guard;
  return KL_OK;
}

void kl__log_guard_destroy(kl__log_guard_t *guard) {
  if (!guard)
    return;
  pthread_mutex_destroy(&guard->mu);
  free(guard->parts);
  free(guard);
}

/* @returns @p partition's entry, made when missing; NULL without memory.
 * mu held. */
static kl_guarded_t *guarded_of(kl__log_guard_t *guard, int32_t partition) {
  if (partition < 0)
    return NULL;
  if (partition >= guard->count) {
    kl_guarded_t *v = kl__grow_zeroed(guard->parts, (size_t)guard->count,
                                      (size_t)partition + 1, sizeof(*v));
    if (!v)
      return NULL;
    guard->parts = v;
    guard->count = partition + 1;
  }
  return &guard->parts[partition];
}

/* Sets what /metrics reads: @p g's state, and its check when stopped.
 * Takes mu unless @p locked. */
static void set_state(kl__log_guard_t *guard, kl_guarded_t *g,
                      kl_guard_state_t state,
                      const kl__checks_log_result_t *check, int locked) {
  if (!locked)
    pthread_mutex_lock(&guard->mu);
  guard->active += (state != KL_GUARD_NONE) - (g->state != KL_GUARD_NONE);
  g->state = state;
  if (check)
    g->check = *check;
  if (!locked)
    pthread_mutex_unlock(&guard->mu);
}

/* Halts @p partition and has its log checked at the next tick. */
static void guard_halt(kl__log_guard_t *guard, int32_t partition) {
  pthread_mutex_lock(&guard->mu);
  kl_guarded_t *g = guarded_of(guard, partition);
  if (g && g->state == KL_GUARD_NONE) {
    kl__lanes_halt(guard->lanes, partition);
    set_state(guard, g, KL_GUARD_PENDING, NULL, 1);
    g->redelivered = 0; /* due_ns stays: one check a second at most */
  }
  pthread_mutex_unlock(&guard->mu);
}

void kl__log_guard_out_of_range(kl__log_guard_t *guard, int32_t partition,
                                int64_t offset) {
  KL_LOG_W(KL_COMP,
           "partition=%" PRId32 ": offset %" PRId64 " is out of the "
           "log; checking the log against the store's watermark",
           partition, offset);
  guard_halt(guard, partition);
}

void kl__log_guard_forget(kl__log_guard_t *guard, int32_t partition) {
  pthread_mutex_lock(&guard->mu);
  if (partition < guard->count) {
    set_state(guard, &guard->parts[partition], KL_GUARD_NONE, NULL, 1);
    guard->parts[partition].refused = 0;
    guard->parts[partition].watched = 0;
  }
  pthread_mutex_unlock(&guard->mu);
}

void kl__log_guard_refuse(kl__log_guard_t *guard, int32_t partition,
                          const kl__checks_log_result_t *check) {
  char why[1536];
  kl__checks_log_describe(guard->topic, partition, check, why, sizeof(why));
  KL_LOG_E(KL_COMP,
           "stopped partition=%" PRId32 " reason=%s before taking it (its "
           "epoch stays %" PRIu64 ": no owner is fenced): %s",
           partition, kl__checks_log_verdict_name(check->verdict),
           check->store_epoch, why);
  pthread_mutex_lock(&guard->mu);
  kl_guarded_t *g = guarded_of(guard, partition);
  if (g) {
    g->epoch = check->store_epoch;
    g->refused = 1;
    set_state(guard, g, KL_GUARD_STOPPED, check, 1);
  }
  pthread_mutex_unlock(&guard->mu);
}

/* Assigns the partition of @p l again, from its offset: librdkafka (2.0)
 * leaves a partition whose position was out of range unfetched, and
 * refuses to seek it (RD_KAFKA_RESP_ERR__STATE) until it is assigned
 * anew. Only the cooperative protocol (the worker's default) lets one
 * partition be reassigned. */
static rd_kafka_resp_err_t guard_reassign(kl__log_guard_t *guard,
                                          rd_kafka_topic_partition_list_t *l) {
  if (strcmp(rd_kafka_rebalance_protocol(guard->rk), "COOPERATIVE") != 0)
    return RD_KAFKA_RESP_ERR__STATE;
  rd_kafka_error_t *error = rd_kafka_incremental_unassign(guard->rk, l);
  if (!error)
    error = rd_kafka_incremental_assign(guard->rk, l);
  rd_kafka_resp_err_t kerr = error ? rd_kafka_error_code(error) : 0;
  rd_kafka_error_destroy(error);
  return kerr;
}

/* Moves the consumer of @p partition to @p offset (a logical one too).
 * @returns 0, or -1 (logged) to try again at the next check. */
static int guard_seek(kl__log_guard_t *guard, int32_t partition,
                      int64_t offset) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, guard->topic, partition)->offset =
      offset;
  rd_kafka_error_t *error = rd_kafka_seek_partitions(guard->rk, l, KL_SEEK_MS);
  rd_kafka_resp_err_t kerr =
      error ? rd_kafka_error_code(error) : l->elems[0].err;
  rd_kafka_error_destroy(error);
  if (kerr == RD_KAFKA_RESP_ERR__STATE) {
    l->elems[0].err = 0;
    kerr = guard_reassign(guard, l);
  }
  rd_kafka_topic_partition_list_destroy(l);
  if (kerr)
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": cannot move the consumer to "
             "offset %" PRId64 ": %s; trying again%s",
             partition, offset, rd_kafka_err2str(kerr),
             kerr == RD_KAFKA_RESP_ERR__STATE
                 ? " (an eager partition.assignment.strategy cannot "
                   "reassign one partition: restart the worker)"
                 : "");
  return kerr ? -1 : 0;
}

/* The log still holds the lane's position, or worker.on.gap=skip lets it
 * go on from the log's start: the consumer goes there, the lane on. */
static int go_on(kl__log_guard_t *guard, int32_t partition, kl_guarded_t *g,
                 const kl__lane_pos_t *pos,
                 const kl__checks_log_result_t *check) {
  int64_t from =
      check->verdict == KL__CHECKS_LOG_GAP ? check->low : pos->next_offset;
  if (guard_seek(guard, partition, from))
    return -1;
  if (check->verdict == KL__CHECKS_LOG_GAP) {
    pthread_mutex_lock(&guard->mu);
    g->gap_records += (uint64_t)check->lost;
    pthread_mutex_unlock(&guard->mu);
    KL_LOG_W(
        KL_COMP,
        "partition=%" PRId32 ": skipped %" PRId64 " records, "
        "offsets %" PRId64 "..%" PRId64 ", that retention deleted before "
        "they were applied (worker.on.gap=skip); going on from offset %" PRId64,
        partition, check->lost, check->watermark, check->low - 1, check->low);
  } else {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": its log [%" PRId64 ", %" PRId64
             ") still holds its position %" PRId64 "; the consumer was moved "
             "back there (records below it were redeliveries)",
             partition, check->low, check->high, pos->next_offset);
  }
  kl__lanes_go_on(guard->lanes, partition, from, g->redelivered);
  set_state(guard, g, KL_GUARD_NONE, NULL, 0);
  return 0;
}

/* Compares the log of halted @p partition with the lane's position, and
 * goes on or stops. */
static void guard_check(kl__log_guard_t *guard, int32_t partition,
                        kl_guarded_t *g) {
  kl__lane_pos_t pos;
  if (kl__lanes_pos(guard->lanes, partition, &pos)) {
    set_state(guard, g, KL_GUARD_NONE, NULL, 0); /* no longer ours */
    return;
  }
  g->redelivered += pos.below_applied;
  int64_t low, high;
  rd_kafka_resp_err_t kerr = rd_kafka_query_watermark_offsets(
      guard->rk, guard->topic, partition, &low, &high, KL_QUERY_MS);
  if (kerr) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": cannot read the log's offsets "
             "to check it: %s; the partition waits, trying again",
             partition, rd_kafka_err2str(kerr));
    return;
  }
  kl__checks_log_result_t check;
  kl__checks_log_verdict_t v =
      kl__checks_log_classify(low, high, pos.next_offset, &check);
  if (v == KL__CHECKS_LOG_OK || (v == KL__CHECKS_LOG_GAP && guard->skip_gaps)) {
    go_on(guard, partition, g, &pos, &check);
    return;
  }
  char why[1024];
  kl__checks_log_describe(guard->topic, partition, &check, why, sizeof(why));
  KL_LOG_E(KL_COMP,
           "stopped partition=%" PRId32 " (the store's watermark %" PRId64
           ", the lane's position %" PRId64 "): %s",
           partition, pos.watermark, pos.next_offset, why);
  g->epoch = pos.epoch;
  set_state(guard, g, KL_GUARD_STOPPED, &check, 0);
}

/* Records @p state's epoch in the group's commit metadata, as a worker
 * that takes a partition does (worker.c), before any handler runs with
 * it: a store lost later cannot hand it out again. */
static void record_epoch(kl__log_guard_t *guard, int32_t partition,
                         const kl_partition_state_t *state) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_t *tp =
      rd_kafka_topic_partition_list_add(l, guard->topic, partition);
  tp->offset = state->watermark;
  kl__kafka_epoch_set(tp, state->epoch);
  rd_kafka_resp_err_t kerr = rd_kafka_commit(guard->rk, l, 0);
  if (kerr)
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": record epoch %" PRIu64 " in "
             "the group's offsets: %s; the next offset commit records it",
             partition, state->epoch, rd_kafka_err2str(kerr));
  rd_kafka_topic_partition_list_destroy(l);
}

/* A stopped partition starts again once `keylane store reset` took a new
 * epoch and moved its watermark back: from there, owned anew. One the
 * store does not know, or one of another cluster or group, waits for the
 * worker's restart (on the fleet's store, a rebuilt one, after `keylane
 * store bind`): a reset does not make the store the fleet's.
 * @returns 1 when it took a partition it had refused before taking. */
static int restart_if_reset(kl__log_guard_t *guard, int32_t partition,
                            kl_guarded_t *g) {
  kl_partition_state_t st;
  if (g->check.verdict == KL__CHECKS_LOG_STORE_UNKNOWN ||
      g->check.verdict == KL__CHECKS_LOG_CLUSTER_MISMATCH ||
      g->check.verdict == KL__CHECKS_LOG_GROUP_MISMATCH ||
      kl_store_partition(guard->store, guard->topic, partition, &st) ||
      st.epoch == g->epoch || st.watermark >= g->check.watermark)
    return 0;
  if (kl_store_acquire(guard->store, guard->topic, partition, &st)) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": cannot take it again after its "
             "reset: %s; trying again",
             partition, kl_err_detail());
    return 0;
  }
  if (guard_seek(guard, partition,
                 st.watermark > 0 ? st.watermark : RD_KAFKA_OFFSET_BEGINNING))
    return 0;
  record_epoch(guard, partition, &st);
  kl__lanes_own(guard->lanes, partition, st.epoch, st.watermark);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, guard->topic, partition);
  rd_kafka_resume_partitions(guard->rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  set_state(guard, g, KL_GUARD_NONE, NULL, 0);
  KL_LOG_I(KL_COMP,
           "partition=%" PRId32 " starts again at offset %" PRId64
           " with epoch %" PRIu64 ": its store state was reset",
           partition, st.watermark, st.epoch);
  int taken = g->refused;
  g->refused = 0;
  return taken;
}

/* A lane found another record at its watermark - 1 than the store
 * applied there: stopped as a log that went backwards is, until
 * `keylane store reset`. */
static void stop_replaced(kl__log_guard_t *guard,
                          const kl__lane_replaced_t *r) {
  kl_partition_state_t st;
  int64_t watermark = r->offset + 1;
  if (kl_store_partition(guard->store, guard->topic, r->partition, &st) ==
      KL_OK)
    watermark = st.watermark;
  kl__checks_log_result_t check = {.verdict = KL__CHECKS_LOG_REPLACED,
                                   .low = -1,
                                   .high = -1,
                                   .watermark = watermark,
                                   .store_epoch = r->epoch};
  kl__apply_ident_text(r->found, r->found_len, check.found,
                       sizeof(check.found));
  kl__apply_ident_text(r->expected, r->expected_len, check.applied,
                       sizeof(check.applied));
  char why[1024];
  kl__checks_log_describe(guard->topic, r->partition, &check, why, sizeof(why));
  KL_LOG_E(KL_COMP, "stopped partition=%" PRId32 " reason=log_replaced: %s",
           r->partition, why);
  pthread_mutex_lock(&guard->mu);
  kl_guarded_t *g = guarded_of(guard, r->partition);
  if (g) {
    g->epoch = r->epoch;
    set_state(guard, g, KL_GUARD_STOPPED, &check, 1);
  }
  pthread_mutex_unlock(&guard->mu);
}

/* One owned partition for guard_watch(): 1 when it is not paused, took
 * no record since the last watch, and its position is out of the log. */
static int watch_one(kl__log_guard_t *guard, int32_t partition,
                     kl__checks_log_result_t *check) {
  kl__lane_pos_t pos;
  pthread_mutex_lock(&guard->mu);
  kl_guarded_t *g = guarded_of(guard, partition);
  int64_t last = g ? g->watched : -1;
  pthread_mutex_unlock(&guard->mu);
  if (!g || g->state != KL_GUARD_NONE ||
      kl__lanes_pos(guard->lanes, partition, &pos) || pos.paused) {
    if (g)
      g->watched = 0;
    return 0;
  }
  g->watched = pos.next_offset + 1;
  int64_t low, high;
  /* The fetcher's last answer said the log ends here: nothing to take. */
  if (last != pos.next_offset + 1 ||
      (!rd_kafka_get_watermark_offsets(guard->rk, guard->topic, partition, &low,
                                       &high) &&
       high == pos.next_offset) ||
      rd_kafka_query_watermark_offsets(guard->rk, guard->topic, partition, &low,
                                       &high, KL_QUERY_MS))
    return 0;
  return kl__checks_log_classify(low, high, pos.next_offset, check) !=
         KL__CHECKS_LOG_OK;
}

/*
 * librdkafka (2.0.2, the oldest keylane supports) stops fetching a
 * partition whose position is out of its log and queues the error for
 * the application (with auto.offset.reset=error, logging it at debug
 * level only). A pause of the partition before the application read the
 * error purges it with the partition's records (it is older than the
 * pause's version barrier), and a resume does not restart a stopped
 * fetcher ("Not resuming stopped"): the partition is never fetched again,
 * and nothing says so. The lanes pause and resume on their own (a full
 * window, the outbox, keys in backoff), so a worker that fell off the log
 * under load could lose the error. So every KL_WATCH_NS the guard looks
 * at the partitions it owns: one that is not paused, took no record
 * since the last look and whose position the log no longer holds is
 * checked as the error would have had it (an ERROR naming the lost
 * offsets and the fix, /healthz, keylane_worker_partition_stopped).
 */
static void guard_watch(kl__log_guard_t *guard) {
  int64_t now = kl__mono_ns();
  if (now < guard->watch_ns)
    return;
  guard->watch_ns = now + KL_WATCH_NS;
  rd_kafka_topic_partition_list_t *assigned = NULL;
  if (rd_kafka_assignment(guard->rk, &assigned) || !assigned)
    return;
  for (int i = 0; i < assigned->cnt; i++) {
    const rd_kafka_topic_partition_t *tp = &assigned->elems[i];
    kl__checks_log_result_t check;
    if (strcmp(tp->topic, guard->topic) != 0 ||
        !watch_one(guard, tp->partition, &check))
      continue;
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the consumer took nothing for %d s or "
             "more though the partition is not paused, and its position "
             "%" PRId64 " is out of the log [%" PRId64 ", %" PRId64
             "): librdkafka "
             "stopped fetching it and its out-of-range error was lost; "
             "checking the log against the store's watermark",
             tp->partition, (int)(KL_WATCH_NS / 1000000000), check.watermark,
             check.low, check.high);
    guard_halt(guard, tp->partition);
  }
  rd_kafka_topic_partition_list_destroy(assigned);
}

int kl__log_guard_tick(kl__log_guard_t *guard) {
  kl__lane_replaced_t replaced;
  while (kl__lanes_replaced(guard->lanes, &replaced))
    stop_replaced(guard, &replaced);
  int32_t below[64];
  size_t n = kl__lanes_below(guard->lanes, below, 64);
  for (size_t i = 0; i < n; i++) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the consumer delivered records "
             "below the lane's position; checking the log against the "
             "store's watermark",
             below[i]);
    guard_halt(guard, below[i]);
  }
  guard_watch(guard);
  if (!guard->active)
    return 0;
  int64_t now = kl__mono_ns();
  int taken = 0;
  for (int32_t p = 0; p < guard->count; p++) {
    kl_guarded_t *g = &guard->parts[p];
    if (g->state == KL_GUARD_NONE || now < g->due_ns)
      continue;
    g->due_ns = now + KL_RETRY_NS;
    if (g->state == KL_GUARD_PENDING)
      guard_check(guard, p, g);
    else
      taken += restart_if_reset(guard, p, g);
  }
  return taken;
}

size_t kl__log_guard_stops(kl__log_guard_t *guard, kl__log_guard_stop_t *out,
                           size_t max) {
  size_t n = 0;
  pthread_mutex_lock(&guard->mu);
  for (int32_t p = 0; p < guard->count && n < max; p++) {
    const kl_guarded_t *g = &guard->parts[p];
    int stopped = g->state == KL_GUARD_STOPPED;
    if (stopped || g->gap_records)
      out[n++] = (kl__log_guard_stop_t){p, stopped, g->check, g->gap_records};
  }
  pthread_mutex_unlock(&guard->mu);
  return n;
}
