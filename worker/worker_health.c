/*
 * The worker's health and partition state, for `keylane worker`'s /healthz
 * (cli/metrics_server.c) and for any program that embeds a worker
 * (keylane/worker.h, kl_worker_health() and kl_worker_foreach_partition()).
 *
 * The checks run in a fixed order and the first that fails decides:
 * waiting for Kafka at start, the topic's partition count, a store read,
 * group commits failing, a fence with nothing committed since, the log
 * guard's stops, stalled partitions, the outbox stalled; then follow-ups
 * kept in the outbox make the verdict DEGRADED, which needs an operator
 * but no restart. The store probe is a read (store_read.h: on the
 * reader's thread, waited for 2 s at most), not a write: a write would
 * need an epoch; an unwritable store shows up as the worker's own commit
 * errors (commits failing).
 *
 * Everything here runs on the caller's thread and reads the worker
 * through its thread-safe accessors (worker_internal.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "worker/checks_log.h"
#include "worker/lanes_keys.h"
#include "worker/log_guard.h"
#include "worker/worker_health.h"
#include "worker/worker_internal.h"

#define KL_HEALTH_STOPS_MAX 256   /* partitions the log guard lists */
#define KL_HEALTH_STALLS_MAX 4096 /* owned partitions reported, at most */
/* Group commits failed in a row, none since, that make the worker FAILING:
 * one is a server restart's, or a deadlock's; three, retried with backoff
 * (worker.retry.initial.ms doubling), are a store that refuses them all. */
#define KL_HEALTH_COMMITS_FAILING 3

const char *kl__health_partition_status(const kl__stall_t *stall, int stopped,
                                        int64_t stall_ms) {
  if (stopped)
    return "ERR";
  if (stall->stalled)
    return "STALL";
  int slow =
      stall_ms > 0 && stall->records > 0 && stall->for_ms >= stall_ms / 2;
  return stall->waiting > 0 || slow ? "WARN" : "OK";
}

double kl__health_lag_seconds(const kl__stall_t *stall, int64_t now_ms) {
  if (!stall->oldest_ts_ms || now_ms <= stall->oldest_ts_ms)
    return 0;
  return (double)(now_ms - stall->oldest_ts_ms) / 1000.0;
}

/* ---- kl_worker_health() ---- */

/* The verdict being made: the caller's struct, or a full one when the
 * caller's is shorter (copied back up to its size). */
typedef struct health_run {
  kl_worker_t *worker;
  kl_worker_stats_t st;
  kl_worker_health_t *out;
} health_run_t;

static void health_set(health_run_t *run, kl_worker_health_status_t status,
                       kl_worker_health_cause_t cause, const char *fmt, ...)
    KL__PRINTF(4, 5);
static void health_set(health_run_t *run, kl_worker_health_status_t status,
                       kl_worker_health_cause_t cause, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(run->out->reason, sizeof(run->out->reason), fmt, ap);
  va_end(ap);
  run->out->status = status;
  run->out->cause = cause;
}

/* @returns how many partitions the log guard stopped; the first one's
 * reason into the verdict. */
static size_t health_stopped(health_run_t *run) {
  kl__log_guard_stop_t stops[KL_HEALTH_STOPS_MAX];
  size_t n = kl__log_guard_stops(kl__worker_log_guard(run->worker), stops,
                                 KL_HEALTH_STOPS_MAX);
  char *reason = run->out->reason;
  size_t size = sizeof(run->out->reason), stopped = 0;
  for (size_t i = 0; i < n; i++) {
    if (!stops[i].stopped || stopped++)
      continue;
    run->out->status = KL_WORKER_HEALTH_FAILING;
    run->out->cause = KL_WORKER_CAUSE_LOG_STOPPED;
    int len =
        snprintf(reason, size, "unhealthy: stopped partition %" PRId32 ": ",
                 stops[i].partition);
    if (len > 0 && (size_t)len + 1 < size) {
      kl__checks_log_describe(kl__worker_topic(run->worker), stops[i].partition,
                              &stops[i].check, reason + len,
                              size - (size_t)len - 1);
      strcat(reason, "\n");
    }
  }
  return stopped;
}

/* @returns 1 with the stalled partitions in the verdict, or 0. */
static int health_stalled(health_run_t *run) {
  kl__stall_t *stalls = malloc(KL_HEALTH_STALLS_MAX * sizeof(*stalls));
  size_t n =
      stalls ? kl__worker_stalls(run->worker, stalls, KL_HEALTH_STALLS_MAX) : 0;
  kl__strbuf_t sb = KL__STRBUF_INIT;
  size_t stalled = 0;
  for (size_t i = 0; i < n && i < KL_HEALTH_STALLS_MAX; i++) {
    const kl__stall_t *st = &stalls[i];
    if (st->stalled && stalled++ < 8)
      kl__strbuf_printf(&sb,
                        "; partition %" PRId32 " holds %zu records, "
                        "watermark %" PRId64 " unmoved for %" PRId64 " ms",
                        st->partition, st->records, st->watermark, st->for_ms);
  }
  free(stalls);
  if (stalled)
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_STALLED,
               "unhealthy: %zu stalled partitions (no progress "
               "for worker.stall.ms while holding records)%s; the worker's "
               "log says what keeps failing\n",
               stalled, sb.len && !sb.failed ? sb.data : "");
  kl__strbuf_free(&sb);
  return stalled > 0;
}

/* @returns 1 with the verdict when no group commit can succeed: the last
 * KL_HEALTH_COMMITS_FAILING or more failed, and none committed since. Not
 * worker.stall.ms: a store that refuses every commit (read-only, a
 * revoked privilege) is known at once, not after minutes. */
static int health_commits_failing(health_run_t *run) {
  int64_t for_ms;
  char why[512];
  uint64_t n =
      kl__worker_commits_failing(run->worker, 0, &for_ms, why, sizeof(why));
  if (n >= KL_HEALTH_COMMITS_FAILING) {
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_COMMITS_FAILING,
               "unhealthy: the last %" PRIu64 " group commits failed, over "
               "%" PRId64 " ms, and none committed since: %.300s; the worker "
               "retries them\n",
               n, for_ms, why);
    return 1;
  }
  /* Runs that failed in the store (a handler's SQL refused for a revoked
   * privilege): they count no attempt and wait, so a person must know. */
  n = kl__worker_commits_failing(run->worker, 1, &for_ms, why, sizeof(why));
  if (n < KL_HEALTH_COMMITS_FAILING)
    return 0;
  health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_STORE,
             "unhealthy: the last %" PRIu64 " event runs failed in the "
             "store, over %" PRId64 " ms, and none applied since: %.300s; "
             "the worker runs them again (no attempt counted) until the "
             "store lets them\n",
             n, for_ms, why);
  return 1;
}

/* The checks before the partitions': @returns 1 once one failed. */
static int health_worker(health_run_t *run) {
  const kl_worker_stats_t *st = &run->st;
  const char *topic = kl__worker_topic(run->worker);
  char why[512];
  if (kl__worker_waiting(run->worker, why, sizeof(why))) {
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_KAFKA_WAIT,
               "unhealthy: %s\n", why);
    return 1;
  }
  if (st->partitions_live && st->partitions_live != st->partitions_expected) {
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_PARTITION_COUNT,
               "unhealthy: topic %s has %" PRId32 " partitions, "
               "the fleet expects %" PRId32 ": keys moved between owners and "
               "this worker stopped taking the topic; restart the fleet with "
               "--partitions %" PRId32 " once its partitions are drained\n",
               topic, st->partitions_live, st->partitions_expected,
               st->partitions_live);
    return 1;
  }
  size_t n;
  kl_err_t err = kl__store_read(kl__worker_reader(run->worker), NULL, 0, &n);
  if (err) {
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_STORE,
               err == KL_ETIMEOUT ? "unhealthy: %s\n"
                                  : "unhealthy: the store does not answer: "
                                    "%s\n",
               kl_err_detail());
    return 1;
  }
  if (health_commits_failing(run))
    return 1;
  /* stats.owned drops only when Kafka revokes a partition, not when a
   * commit is fenced: a fenced worker that commits nothing afterwards has
   * lost what it owned, though the count still says otherwise. A worker
   * fenced on some partitions that keeps committing others is healthy. */
  uint64_t at = kl__worker_fence_batches(run->worker, st->fenced, st->batches);
  if (st->fenced > 0 && (st->owned == 0 || st->batches == at)) {
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_FENCED,
               "unhealthy: fenced: %" PRIu64 " commits rejected "
               "by a newer owner's epoch and none committed since (owns "
               "%" PRId32 " partitions by Kafka's assignment); the group's "
               "next rebalance gives the partitions to their new owner\n",
               st->fenced, st->owned);
    return 1;
  }
  return 0;
}

static void health_decide(health_run_t *run) {
  const kl_worker_stats_t *st = &run->st;
  int64_t outbox_stall_ms =
      kl__conf_int(kl__worker_conf(run->worker), "worker.outbox.stall.ms");
  if (health_worker(run) || health_stopped(run) || health_stalled(run))
    return;
  if (outbox_stall_ms > 0 && st->outbox_stalled_ms > (uint64_t)outbox_stall_ms)
    health_set(run, KL_WORKER_HEALTH_FAILING, KL_WORKER_CAUSE_OUTBOX_STALLED,
               "unhealthy: the outbox has held follow-ups for %" PRIu64
               " ms without one acknowledged by Kafka (worker.outbox.stall.ms "
               "is %" PRId64 "); the worker's log says what keeps failing "
               "(keylane store outbox lists them)\n",
               st->outbox_stalled_ms, outbox_stall_ms);
  else if (st->outbox_kept)
    health_set(run, KL_WORKER_HEALTH_DEGRADED, KL_WORKER_CAUSE_OUTBOX_KEPT,
               KL__HEALTH_DEGRADED
               "owns %" PRId32 " partitions; %" PRIu64
               " follow-ups are refused by Kafka, and their dead letters too, "
               "so they are kept in the store's outbox (keylane store outbox "
               "lists them); raise the topics' max.message.bytes and "
               "kafka.message.max.bytes, or drop them with keylane store "
               "outbox --drop; the worker's log says why\n",
               st->owned, st->outbox_kept);
  else
    health_set(run, KL_WORKER_HEALTH_OK, KL_WORKER_CAUSE_NONE,
               "ok: owns %" PRId32 " partitions\n", st->owned);
}

kl_err_t kl_worker_health(kl_worker_t *worker, kl_worker_health_t *health) {
  if (!worker || !health)
    return kl__err(KL_EINVAL, "kl_worker_health: a NULL %s",
                   worker ? "health" : "worker");
  size_t size = health->size;
  if (size < offsetof(kl_worker_health_t, reason) + 1)
    return kl__err(KL_EINVAL,
                   "kl_worker_health: health->size is %zu: set it to "
                   "sizeof(kl_worker_health_t) before the call",
                   size);
  kl_worker_health_t full = {.size = sizeof(full)};
  health_run_t run = {.worker = worker, .out = &full};
  kl_worker_stats(worker, &run.st, sizeof(run.st));
  full.owned = run.st.owned;
  health_decide(&run);
  if (size > sizeof(full))
    size = sizeof(full);
  memcpy(health, &full, size);
  health->size = size;
  if (size < sizeof(full)) /* a shorter reason: keep it a string */
    ((char *)health)[size - 1] = '\0';
  return KL_OK;
}

/* ---- kl_worker_foreach_partition() ---- */

/* The store's epochs of the worker's topic, by partition. */
typedef struct part_epochs {
  uint64_t *epoch;
  size_t n;
} part_epochs_t;

/* The epochs are the store's; a store that does not answer leaves them
 * 0 (kl_worker_health() says it does not answer). */
static void part_epochs(kl_worker_t *worker, kl__store_part_t *parts,
                        part_epochs_t *e) {
  size_t n = 0;
  kl__store_read(kl__worker_reader(worker), parts, KL__STORE_READ_PARTS_MAX,
                 &n);
  for (size_t i = 0; i < n; i++)
    if (parts[i].partition >= 0 && (size_t)parts[i].partition < e->n)
      e->epoch[parts[i].partition] = parts[i].state.epoch;
}

static const kl__log_guard_stop_t *part_stop(const kl__log_guard_stop_t *stops,
                                             size_t n, int32_t partition) {
  for (size_t i = 0; i < n; i++)
    if (stops[i].stopped && stops[i].partition == partition)
      return &stops[i];
  return NULL;
}

static void part_fill(kl_worker_t *worker, const kl__stall_t *stall,
                      int stopped, unsigned resized, kl_worker_partition_t *p,
                      int64_t now_ms) {
  static const kl_worker_partition_status_t by_name[] = {
      ['O'] = KL_WORKER_PARTITION_OK,
      ['W'] = KL_WORKER_PARTITION_WARN,
      ['S'] = KL_WORKER_PARTITION_STALL,
      ['E'] = KL_WORKER_PARTITION_ERR};
  int64_t stall_ms = kl__conf_int(kl__worker_conf(worker), "worker.stall.ms");
  const char *status = kl__health_partition_status(stall, stopped, stall_ms);
  p->partition = stall->partition;
  p->status = by_name[(unsigned char)status[0]];
  p->flags = KL_WORKER_PARTITION_OWNED | resized |
             (stopped ? KL_WORKER_PARTITION_STOPPED : 0) |
             (stall->stalled ? KL_WORKER_PARTITION_STALLED : 0) |
             (stall->waiting ? KL_WORKER_PARTITION_RETRYING : 0);
  p->watermark = stall->watermark;
  p->lag_seconds = kl__health_lag_seconds(stall, now_ms);
  p->oldest_ts_ms = stall->oldest_ts_ms;
  p->records = stall->records;
  p->waiting = stall->waiting;
  p->unmoved_ms = stall->records ? stall->for_ms : 0;
  p->committed = stall->committed;
  p->running = stall->running;
  p->outbox = stall->outbox;
  p->last_commit_ms = stall->last_commit_ms;
  int64_t low = -1, high = -1;
  /* What the consumer's last fetch said: no request to Kafka. */
  if (rd_kafka_get_watermark_offsets(kl__worker_consumer(worker),
                                     kl__worker_topic(worker), p->partition,
                                     &low, &high) == 0 &&
      high >= 0) {
    p->high = high;
    p->lag = high > p->watermark ? high - p->watermark : 0;
  }
}

/* Why the log guard stopped @p p, into its stop_reason and stop_detail
 * (in @p detail); nothing when @p stop is NULL. */
static void part_why(kl_worker_t *worker, const kl__log_guard_stop_t *stop,
                     kl_worker_partition_t *p, char *detail, size_t size) {
  if (!stop)
    return;
  p->stop_reason = kl__checks_log_verdict_name(stop->check.verdict);
  p->stop_detail = kl__checks_log_describe(
      kl__worker_topic(worker), stop->partition, &stop->check, detail, size);
}

/* The owned partitions, then the stopped ones not owned. */
static int part_each(kl_worker_t *worker, const kl__stall_t *stalls,
                     size_t nstalls, const kl__log_guard_stop_t *stops,
                     size_t nstops, const part_epochs_t *e,
                     kl_worker_partition_cb_t *cb, void *opaque) {
  kl_worker_stats_t st;
  kl_worker_stats(worker, &st, sizeof(st));
  unsigned resized =
      st.partitions_live && st.partitions_live != st.partitions_expected
          ? KL_WORKER_PARTITION_RESIZED
          : 0;
  int64_t now_ms = kl__now_ms();
  char detail[1024];
  for (size_t i = 0; i < nstalls; i++) {
    kl_worker_partition_t p = {.size = sizeof(p), .high = -1, .lag = -1};
    const kl__log_guard_stop_t *stop =
        part_stop(stops, nstops, stalls[i].partition);
    part_fill(worker, &stalls[i], stop != NULL, resized, &p, now_ms);
    part_why(worker, stop, &p, detail, sizeof(detail));
    if ((size_t)p.partition < e->n)
      p.epoch = e->epoch[p.partition];
    /* A store read from before this worker took it (the metrics server's
     * are up to a second old) has an older epoch: epochs only grow. */
    if (stalls[i].epoch > p.epoch)
      p.epoch = stalls[i].epoch;
    if (cb(opaque, &p))
      return 1;
  }
  for (size_t i = 0; i < nstops; i++) {
    int owned = 0;
    for (size_t j = 0; j < nstalls && !owned; j++)
      owned = stalls[j].partition == stops[i].partition;
    if (!stops[i].stopped || owned)
      continue;
    kl_worker_partition_t p = {.size = sizeof(p),
                               .partition = stops[i].partition,
                               .status = KL_WORKER_PARTITION_ERR,
                               .flags = KL_WORKER_PARTITION_STOPPED | resized,
                               .watermark = stops[i].check.watermark,
                               .high = stops[i].check.high,
                               .lag = -1,
                               .committed = -1};
    part_why(worker, &stops[i], &p, detail, sizeof(detail));
    if ((size_t)p.partition < e->n)
      p.epoch = e->epoch[p.partition];
    if (cb(opaque, &p))
      return 1;
  }
  return 0;
}

kl_err_t kl_worker_foreach_partition(kl_worker_t *worker,
                                     kl_worker_partition_cb_t *cb,
                                     void *opaque) {
  if (!worker || !cb)
    return kl__err(KL_EINVAL, "kl_worker_foreach_partition: a NULL %s",
                   worker ? "callback" : "worker");
  kl__stall_t *stalls = malloc(KL_HEALTH_STALLS_MAX * sizeof(*stalls));
  kl__log_guard_stop_t *stops = malloc(KL_HEALTH_STOPS_MAX * sizeof(*stops));
  part_epochs_t e = {calloc(KL_HEALTH_STALLS_MAX, sizeof(uint64_t)),
                     KL_HEALTH_STALLS_MAX};
  kl__store_part_t *parts =
      malloc(KL__STORE_READ_PARTS_MAX * sizeof(kl__store_part_t));
  if (!stalls || !stops || !e.epoch || !parts) {
    free(stalls);
    free(stops);
    free(e.epoch);
    free(parts);
    return kl__err(KL_ENOMEM, "kl_worker_foreach_partition: out of memory");
  }
  size_t nstalls = kl__worker_stalls(worker, stalls, KL_HEALTH_STALLS_MAX);
  if (nstalls > KL_HEALTH_STALLS_MAX)
    nstalls = KL_HEALTH_STALLS_MAX;
  size_t nstops = kl__log_guard_stops(kl__worker_log_guard(worker), stops,
                                      KL_HEALTH_STOPS_MAX);
  part_epochs(worker, parts, &e);
  free(parts);
  part_each(worker, stalls, nstalls, stops, nstops, &e, cb, opaque);
  free(stalls);
  free(stops);
  free(e.epoch);
  return KL_OK;
}

/* ---- kl_worker_foreach_key() ---- */

kl_err_t kl_worker_foreach_key(kl_worker_t *worker,
                               const kl_worker_keys_query_t *query,
                               kl_worker_key_cb_t *cb, void *opaque,
                               size_t *total) {
  kl__err_clear();
  if (!worker || !query || !cb)
    return kl__err(KL_EINVAL, "kl_worker_foreach_key: a NULL %s",
                   !worker  ? "worker"
                   : !query ? "query"
                            : "callback");
  kl_worker_keys_query_t q = {0};
  if (!query->size || query->limit > KL_WORKER_KEYS_MAX)
    return kl__err(KL_EINVAL,
                   "kl_worker_foreach_key: set query->size to "
                   "sizeof(kl_worker_keys_query_t), and query->limit to "
                   "at most %d (it is %zu)",
                   KL_WORKER_KEYS_MAX, query->limit);
  memcpy(&q, query, query->size < sizeof(q) ? query->size : sizeof(q));
  q.size = sizeof(q);
  size_t limit = q.limit ? q.limit : KL_WORKER_KEYS_MAX, n = 0, all = 0;
  kl_worker_key_t *keys = malloc(limit * sizeof(*keys));
  if (!keys)
    return kl__err(KL_ENOMEM, "kl_worker_foreach_key: out of memory");
  kl_err_t err = kl__worker_keys(worker, &q, keys, &n, &all);
  for (size_t i = 0; !err && i < n && !cb(opaque, &keys[i]); i++)
    ;
  kl__lanes_keys_free(keys, n);
  free(keys);
  if (total)
    *total = err ? 0 : all;
  return err;
}
