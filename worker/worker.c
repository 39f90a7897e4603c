/*
 * The worker: one consumer, one lane per owned partition (lanes.c), the
 * executors (lanes_pool.c) and the dead-letter producer (dlq.c).
 *
 * The thread that called kl_worker_run() is the poll thread: it consumes,
 * runs the rebalance callback, group-commits the lanes and produces dead
 * letters; in inline mode (worker.concurrency = 1) it runs the handlers
 * too. Because the rebalance callback runs inside rd_kafka_consumer_poll()
 * on this thread, a revoked lane is drained and committed inside the
 * callback, before the partition is given up.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "common/log.h"
#include "common/partitions.h"
#include "worker/apply.h"
#include "worker/checks.h"
#include "worker/dlq.h"
#include "common/kafka_features.h"
#include "common/strbuf.h"
#include "worker/lanes_stall.h"
#include "worker/lanes.h"
#include "worker/lanes_keys.h"
#include "worker/log_guard.h"
#include "worker/membership.h"
#include "worker/lanes_pool.h"
#include "store/store_internal.h"
#include "worker/worker_internal.h"

/* What a fenced lane last saw of its partition in the store, and since
 * when it has not changed (0: not watched); after a failed retake, the
 * backoff before the next try and when that try may come. */
typedef struct kl_quiet {
  uint64_t own_epoch; /* the epoch this worker took it with */
  kl_partition_state_t seen;
  int64_t since_ns;
  int64_t backoff_ns;
  int64_t next_try_ns;
} kl_quiet_t;

static kl_quiet_t *quiet_of(kl_worker_t *worker, int32_t partition);

struct kl_worker {
  kl_conf_t *conf;
  char *topic;
  kl_store_t *store;
  rd_kafka_t *rk;
  kl__applier_t applier; /* the poll thread's; the lanes copy it */
  kl__dlq_t *dlq;
  kl__lanes_t *lanes;
  kl__log_guard_t *log_guard;
  kl__lanes_pool_t *pool;
  int threads;       /* executors: 0 in inline mode */
  atomic_int stop;   /* lock-free: safe from a signal handler and threads */
  int assigned_once; /* a rebalance callback has assigned to this member */
  int cooperative;   /* the assignor's rebalance protocol is COOPERATIVE */
  _Atomic int32_t owned;
  int64_t retake_ns; /* worker.fenced.retake.ms; 0: never */
  int64_t retake_checked_ns;
  kl_quiet_t *quiet; /* by partition: its state as a fenced lane saw it */
  int32_t quiet_count;
  /* Set by kl_worker_run()'s thread, read by kl_worker_stats() on any. */
  atomic_int retention_override;  /* runs despite a failed retention check */
  atomic_int retention_unchecked; /* the cluster could not tell the retention */
  atomic_int waiting;      /* for Kafka, at start: kl__worker_waiting() */
  _Atomic int64_t loop_ns; /* the poll loop's last turn; 0: not running */
  pthread_mutex_t why_mu;  /* guards why, read by the metrics thread */
  char why[512];
  kl__partitions_expect_t expect;      /* the topic's count the fleet expects */
  _Atomic int32_t partitions_live;     /* as last read; 0: not yet */
  _Atomic int32_t partitions_expected; /* expect.count, for other threads */
  int64_t check_ns, checked_ns;        /* worker.partitions.check.ms */
  atomic_int topic_stopped; /* the count changed: it takes nothing more */
  kl__worker_seek_hook_fn *seek_hook; /* test hook; may be NULL */
  void *seek_hook_opaque;
  int64_t stall_ms;                      /* worker.stall.ms; 0: not watched */
  char instance_id[KL__INSTANCE_ID_MAX]; /* group.instance.id; "": dynamic */
  kl_err_t fatal; /* the consumer raised a fatal error (membership.h) */
  char fatal_why[1024];
  int64_t acquire_wait_ms; /* worker.acquire.wait */
  kl_err_t unowned; /* an assigned partition could not be taken: stopped */
  char unowned_why[1024];
  /* This worker's Kafka cluster and group (worker_owner()), which the
   * store records as the topic's owner or compares with the recorded
   * one; poll thread. owner_known: 0 until the cluster id was read. */
  kl__store_owner_t owner;
  int owner_known;
  /* kl_worker_health()'s memory of a fence, guarded by why_mu: the fenced
   * count it last saw grow, and the batch count then. */
  uint64_t health_fenced, health_batches;
  /* The last fences (kl_worker_foreach_fence()), a ring guarded by why_mu:
   * written by the poll thread, read by the metrics thread. */
  kl_worker_fence_t fences[KL_WORKER_FENCES_MAX];
  size_t nfences; /* ever seen */
};

#define KL_COMP "worker"

void kl__worker_set_before_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                  void *opaque) {
  kl__lanes_set_before_commit(worker->lanes, fn, opaque);
}

void kl__worker_set_after_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                 void *opaque) {
  kl__lanes_set_after_commit(worker->lanes, fn, opaque);
}

void kl__worker_set_run_fault(kl_worker_t *worker,
                              int (*fn)(void *opaque, int32_t partition,
                                        int64_t offset),
                              void *opaque) {
  kl__lanes_set_run_fault(worker->lanes, fn, opaque);
}

size_t kl__worker_misrouted(kl_worker_t *worker, uint64_t *by_partition,
                            size_t max) {
  return kl__lanes_misrouted(worker->lanes, by_partition, max);
}

/* ---- ownership ------------------------------------------------------- */

/* Acquires a new epoch, retrying with backoff (100 ms doubling to 5 s)
 * until @p deadline_ns while the store does not answer or refuses (a
 * read-only session, a revoked privilege, a schema being migrated): the
 * group gave us the partition, and nobody else will apply it meanwhile.
 * With @p owner (worker_owner()), the store records it as the topic's or
 * refuses a topic another owner recorded: KL_OK with the mismatch in
 * @p check (state untouched). Gives way to kl_worker_stop().
 * @returns the last try's result. */
static kl_err_t lane_acquire(kl_worker_t *worker, int32_t partition,
                             uint64_t floor, int64_t deadline_ns,
                             const kl__store_owner_t *owner,
                             kl__checks_log_result_t *check,
                             kl_partition_state_t *state) {
  int backoff_ms = 100;
  for (;;) {
    kl__store_owner_t recorded;
    int refused = 0;
    kl_err_t err =
        kl__store_acquire_owned(worker->store, worker->topic, partition, floor,
                                owner, &recorded, &refused, state);
    if (!err && refused) { /* another owner recorded since owner_refuses() */
      memset(check, 0, sizeof(*check));
      kl__checks_log_owner_differs(&recorded, owner, check);
      return KL_OK;
    }
    int64_t left_ms = (deadline_ns - kl__mono_ns()) / 1000000;
    if (!err || worker->stop || left_ms <= 0)
      return err;
    int ms = backoff_ms < left_ms ? backoff_ms : (int)left_ms;
    KL_LOG_W(KL_COMP,
             "acquire partition=%" PRId32 " retry in %d ms, giving up in "
             "%" PRId64 " ms (worker.acquire.wait): %s",
             partition, ms, left_ms, kl_err_detail());
    for (int slept = 0; slept < ms && !worker->stop; slept += 100)
      kl__sleep_ms(ms - slept < 100 ? ms - slept : 100);
    if (backoff_ms < 5000)
      backoff_ms *= 2;
  }
}

/* A partition the store would not let this worker take within
 * worker.acquire.wait: the worker stops, and kl_worker_run() fails with
 * the cause, so that a supervisor restarts it (or a person looks) instead
 * of the partition staying unapplied behind a worker that looks alive.
 * Stopped by kl_worker_stop() meanwhile, it is only a stop. */
static void acquire_failed(kl_worker_t *worker, int32_t partition,
                           kl_err_t err) {
  if (worker->stop && !worker->unowned) {
    KL_LOG_I(KL_COMP, "not taking partition=%" PRId32 ": stopping", partition);
    return;
  }
  if (worker->unowned)
    return; /* the first one said why */
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", kl_err_detail());
  worker->unowned = kl__err(
      err,
      "cannot take partition=%" PRId32 " of topic %s: tried for %" PRId64
      " ms (worker.acquire.wait), and the store answered: "
      "%s; check that the store's "
      "role may write keylane_partitions (INSERT, UPDATE), that neither "
      "the role nor the database is read-only "
      "(default_transaction_read_only), and `keylane doctor`",
      partition, worker->topic, worker->acquire_wait_ms, detail);
  snprintf(worker->unowned_why, sizeof(worker->unowned_why), "%s",
           kl_err_detail());
  KL_LOG_E(KL_COMP, "%s; stopping", worker->unowned_why);
  worker->stop = 1;
}

/*
 * Epochs survive the store: the highest epoch the fleet used for each
 * partition is in the group's committed offsets' metadata, and a new owner
 * takes an epoch above it, so that a new or rebuilt store does not hand
 * out epochs an external resource has seen. @returns the floors, one per
 * element of @p parts (zeroes when the coordinator did not answer: the
 * store's epochs alone then), to free(), and the committed offsets into
 * *@p committed (RD_KAFKA_OFFSET_INVALID: none), to free(); NULL when out
 * of memory.
 */
static uint64_t *
worker_fleet_epochs(kl_worker_t *worker,
                    const rd_kafka_topic_partition_list_t *parts,
                    int64_t **committed) {
  uint64_t *floors = calloc((size_t)parts->cnt + 1, sizeof(*floors));
  int32_t *ids = calloc((size_t)parts->cnt + 1, sizeof(*ids));
  *committed = calloc((size_t)parts->cnt + 1, sizeof(**committed));
  if (floors && ids && *committed) {
    for (int i = 0; i < parts->cnt; i++)
      ids[i] = parts->elems[i].partition;
    if (kl__kafka_committed_epochs(worker->rk, worker->topic, ids,
                                   (size_t)parts->cnt, floors, *committed,
                                   10000))
      KL_LOG_W(KL_COMP,
               "%s; the partitions start from the store's epochs, "
               "unchecked against the group's offsets",
               kl_err_detail());
  } else {
    free(floors);
    free(*committed);
    floors = NULL;
    *committed = NULL;
  }
  free(ids);
  return floors;
}

/* Records the epochs just acquired in the group's commit metadata before
 * any handler runs with them: a store lost from now on cannot make a later
 * owner reuse them. The offsets are the store's watermarks, as every
 * commit's. */
static void commit_epochs(kl_worker_t *worker,
                          rd_kafka_topic_partition_list_t *taken) {
  if (!taken->cnt)
    return;
  rd_kafka_resp_err_t kerr = rd_kafka_commit(worker->rk, taken, 0);
  if (kerr)
    KL_LOG_W(KL_COMP,
             "record the epochs of %d partitions in the group's "
             "offsets: %s; the next offset commit records them",
             taken->cnt, rd_kafka_err2str(kerr));
}

/* Adds @p partition, at the store's watermark with its new epoch, to the
 * list commit_epochs() commits. */
static void epoch_add(rd_kafka_topic_partition_list_t *taken, const char *topic,
                      int32_t partition, const kl_partition_state_t *state) {
  rd_kafka_topic_partition_t *tp =
      rd_kafka_topic_partition_list_add(taken, topic, partition);
  tp->offset = state->watermark;
  kl__kafka_epoch_set(tp, state->epoch);
}

/* A partition the worker must not take: the topic's count changed, or it
 * is one the expected count does not have (the topic grew, and the group
 * noticed before the timer did: check at once). Left paused, unowned. */
static int assign_refused(kl_worker_t *worker, int32_t partition) {
  if (partition >= worker->expect.count)
    worker->checked_ns = 0;
  if (!worker->topic_stopped && partition < worker->expect.count)
    return 0;
  KL_LOG_W(KL_COMP,
           "not taking partition=%" PRId32 ": topic %s was expected "
           "with %" PRId32 " partitions; see the partition-count error",
           partition, worker->topic, worker->expect.count);
  return 1;
}

/* When the store kept the record at the watermark - 1 (a replaced log is
 * told by it: log_guard.h), the partition resumes one record early, to
 * read that record and compare. */
static void verify_last(kl_worker_t *worker, rd_kafka_topic_partition_t *tp,
                        const kl_partition_state_t *state) {
  char ident[KL__SID_MAX];
  size_t len;
  int64_t wm;
  if (state->watermark <= 0 ||
      kl__store_last(worker->store, worker->topic, tp->partition, &wm, ident,
                     &len) != KL_OK ||
      !len || wm != state->watermark)
    return;
  kl__lanes_verify(worker->lanes, tp->partition, wm - 1, ident, len);
  tp->offset = wm - 1;
}

/* A consumer for the checks a new owner makes before it takes a partition
 * (kl__checks_log_owner()): it reads the log's offsets and the record at
 * the watermark - 1, outside the group, one fetch per partition, each
 * waiting up to fetch.wait.max.ms when the broker holds it (the embedded
 * cluster does): 100 ms, not librdkafka's 500, bounds what a rebalance
 * waits for them. NULL (logged) when it cannot be made: the partitions
 * are then taken unchecked, as before the check. */
static rd_kafka_t *owner_reader(kl_worker_t *worker) {
  rd_kafka_t *reader = NULL;
  kl_conf_t *conf = kl_conf_dup(worker->conf);
  kl_err_t err =
      conf ? kl_conf_set(conf, "kafka.fetch.wait.max.ms", "100") : KL_ENOMEM;
  if (!err)
    err =
        kl__kafka_reader_new(conf, "keylane-owner-check", "earliest", &reader);
  kl_conf_destroy(conf);
  if (err) {
    KL_LOG_W(KL_COMP,
             "%s; the partitions assigned are taken without checking their "
             "log first",
             kl_err_detail());
    return NULL;
  }
  return reader;
}

/* Checks @p partition before a new epoch is taken for it (which fences
 * its owner, on whatever cluster that owner reads): the store must know
 * the owner the group committed @p committed with (@p committed_epoch),
 * and the log must be the one the store applied. @returns 1 when it must
 * not be taken, with why in @p check; 0 to take it (a check that could
 * not be made is logged: the lane still compares the record at the
 * watermark - 1, after the epoch was taken). */
static int owner_refuses(kl_worker_t *worker, rd_kafka_t *reader,
                         int32_t partition, int64_t committed,
                         uint64_t committed_epoch,
                         const kl__store_owner_t *owner,
                         kl__checks_log_result_t *check) {
  if (!reader)
    return 0;
  if (kl__checks_log_owner(reader, worker->store, worker->topic, partition,
                           owner, committed, committed_epoch, 5000, check)) {
    KL_LOG_W(KL_COMP, "partition=%" PRId32 ": %s; taking it unchecked",
             partition, kl_err_detail());
    return 0;
  }
  return check->verdict != KL__CHECKS_LOG_OK &&
         !(check->verdict == KL__CHECKS_LOG_GAP &&
           strcmp(kl_conf_get(worker->conf, "worker.on.gap"), "skip") == 0);
}

/* The Kafka cluster and group this worker is of, for the store's record
 * of the topic's owner (kl__store_acquire_owned()): the cluster id is read
 * once (rd_kafka_clusterid(), known after the group's join). NULL, logged,
 * while it cannot be read: the partitions are then taken without the
 * owner check, as a check that could not be made is (owner_refuses()). */
static const kl__store_owner_t *worker_owner(kl_worker_t *worker) {
  if (worker->owner_known)
    return &worker->owner;
  if (kl__checks_kafka_owner(worker->rk,
                             kl_conf_get(worker->conf, "worker.group"), 5000,
                             &worker->owner)) {
    KL_LOG_W(KL_COMP,
             "cannot tell this worker's Kafka cluster (%s); the partitions "
             "assigned are taken without checking that the store's topic "
             "%s belongs to this cluster and group",
             kl_err_detail(), worker->topic);
    return NULL;
  }
  worker->owner_known = 1;
  return &worker->owner;
}

/* Whether @p verdict refuses a partition until the worker restarts with
 * another store, cluster or group (no reset ends it): the partitions that
 * make a worker that owns nothing else stop (refused_failed()). */
static int refused_for_good(kl__checks_log_verdict_t verdict) {
  return verdict == KL__CHECKS_LOG_STORE_UNKNOWN ||
         verdict == KL__CHECKS_LOG_CLUSTER_MISMATCH ||
         verdict == KL__CHECKS_LOG_GROUP_MISMATCH;
}

/* Partitions the store does not know, or that belong to another cluster
 * or group (refused_for_good()), and the worker owns none: like a
 * partition the store would not let it take (acquire_failed()), the
 * worker stops and kl_worker_run() fails, so that the group gives them
 * back to the fleet and a person hears of it. @p first describes the
 * first, of @p verdict. */
static void refused_failed(kl_worker_t *worker, int unknown,
                           kl__checks_log_verdict_t verdict,
                           const char *first) {
  const char *group = kl_conf_get(worker->conf, "worker.group");
  if (verdict == KL__CHECKS_LOG_STORE_UNKNOWN)
    worker->unowned = kl__err(
        KL_ESTORE,
        "the store does not know %d partition(s) group %s has committed "
        "offsets for, and this worker owns none: %s; then restart the worker",
        unknown, group, first);
  else
    worker->unowned = kl__err(
        KL_ESTORE,
        "the store records another Kafka cluster or group as the owner of "
        "%d partition(s) of topic %s (%s), and this worker owns none: %s; "
        "then restart the worker",
        unknown, worker->topic, kl__checks_log_verdict_name(verdict), first);
  snprintf(worker->unowned_why, sizeof(worker->unowned_why), "%s",
           kl_err_detail());
  KL_LOG_E(KL_COMP, "%s; stopping", worker->unowned_why);
  worker->stop = 1;
}

/* A worker told to stop takes nothing more: a new epoch would fence the
 * partition's live owner for a worker about to leave, and each one is a
 * store commit (and the first a request to the coordinator). The stop
 * flag is read again before each partition. A partition whose check
 * fails (owner_refuses()) is left untaken, added to @p held to be paused. */
/* What on_assign() gathers of the partitions it refused for good. */
typedef struct kl_refusals {
  int n;
  kl__checks_log_verdict_t verdict; /* the first's */
  char first[1536];                 /* the first, described */
} kl_refusals_t;

/* Leaves @p tp untaken and paused (added to @p held), stopped for
 * @p check's reason (kl__log_guard_refuse()). */
static void assign_refuse(kl_worker_t *worker, rd_kafka_topic_partition_t *tp,
                          const kl__checks_log_result_t *check,
                          rd_kafka_topic_partition_list_t *held,
                          kl_refusals_t *refusals) {
  kl__log_guard_refuse(worker->log_guard, tp->partition, check);
  rd_kafka_topic_partition_list_add(held, worker->topic, tp->partition);
  tp->offset = RD_KAFKA_OFFSET_BEGINNING; /* paused: never fetched */
  if (refused_for_good(check->verdict) && !refusals->n++) {
    refusals->verdict = check->verdict;
    kl__checks_log_describe(worker->topic, tp->partition, check,
                            refusals->first, sizeof(refusals->first));
  }
}

static void on_assign(kl_worker_t *worker,
                      rd_kafka_topic_partition_list_t *parts,
                      rd_kafka_topic_partition_list_t *held) {
  int64_t *committed = NULL;
  uint64_t *floors =
      worker->stop ? NULL : worker_fleet_epochs(worker, parts, &committed);
  rd_kafka_t *reader =
      worker->stop || !parts->cnt ? NULL : owner_reader(worker);
  const kl__store_owner_t *owner =
      worker->stop || !parts->cnt ? NULL : worker_owner(worker);
  rd_kafka_topic_partition_list_t *taken =
      rd_kafka_topic_partition_list_new(parts->cnt);
  int64_t deadline_ns = kl__mono_ns() + worker->acquire_wait_ms * 1000000;
  kl_refusals_t refusals = {0, KL__CHECKS_LOG_OK, ""};
  for (int i = 0; i < parts->cnt && !worker->stop; i++) {
    rd_kafka_topic_partition_t *tp = &parts->elems[i];
    if (assign_refused(worker, tp->partition))
      continue;
    kl__checks_log_result_t check;
    if (owner_refuses(worker, reader, tp->partition,
                      committed ? committed[i] : RD_KAFKA_OFFSET_INVALID,
                      floors ? floors[i] : 0, owner, &check)) {
      assign_refuse(worker, tp, &check, held, &refusals);
      continue;
    }
    kl_partition_state_t state;
    check.verdict = KL__CHECKS_LOG_OK;
    kl_err_t err = lane_acquire(worker, tp->partition, floors ? floors[i] : 0,
                                deadline_ns, owner, &check, &state);
    if (err) {
      acquire_failed(worker, tp->partition, err);
      continue;
    }
    if (check.verdict != KL__CHECKS_LOG_OK) {
      assign_refuse(worker, tp, &check, held, &refusals);
      continue;
    }
    kl__lanes_own(worker->lanes, tp->partition, state.epoch, state.watermark);
    kl__log_guard_forget(worker->log_guard, tp->partition);
    kl_quiet_t *quiet = quiet_of(worker, tp->partition);
    if (quiet) {
      quiet->since_ns = 0;
      quiet->own_epoch = state.epoch; /* what a fence refuses */
    }
    tp->offset =
        state.watermark > 0 ? state.watermark : RD_KAFKA_OFFSET_BEGINNING;
    verify_last(worker, tp, &state);
    epoch_add(taken, worker->topic, tp->partition, &state);
    worker->owned++;
    KL_LOG_I(KL_COMP,
             "assigned partition=%" PRId32 " epoch=%" PRIu64
             " resume_offset=%" PRId64,
             tp->partition, state.epoch, state.watermark);
  }
  commit_epochs(worker, taken);
  rd_kafka_topic_partition_list_destroy(taken);
  if (reader)
    rd_kafka_destroy(reader);
  free(floors);
  free(committed);
  if (refusals.n && !worker->owned && !worker->stop)
    refused_failed(worker, refusals.n, refusals.verdict, refusals.first);
}

/* A revoked lane stops taking events, lets its running ones finish and
 * commits what completed, inside the rebalance callback, before the
 * partition is given up. A lost one commits nothing: a newer owner may
 * exist already. */
static void on_revoke(kl_worker_t *worker,
                      rd_kafka_topic_partition_list_t *parts, int lost) {
  for (int i = 0; i < parts->cnt; i++) {
    int32_t p = parts->elems[i].partition;
    uint64_t epoch = 0;
    int64_t watermark = kl__lanes_release(worker->lanes, p, !lost, &epoch);
    kl__log_guard_forget(worker->log_guard, p);
    kl__store_forget(worker->store, worker->topic, p); /* its owner cache */
    if (watermark < 0)
      continue;
    KL_LOG_I(KL_COMP,
             "%s partition=%" PRId32 " epoch=%" PRIu64 " watermark=%" PRId64,
             lost ? "lost" : "revoked", p, epoch, watermark);
    worker->owned--;
  }
}

/* After the assign, which would fetch them: the partitions on_assign()
 * refused or @p held stay paused; a worker stopping takes none. */
static void pause_refused(kl_worker_t *worker,
                          rd_kafka_topic_partition_list_t *parts,
                          rd_kafka_topic_partition_list_t *held) {
  for (int i = 0; i < parts->cnt; i++)
    if (worker->topic_stopped || worker->stop ||
        parts->elems[i].partition >= worker->expect.count)
      rd_kafka_topic_partition_list_add(held, worker->topic,
                                        parts->elems[i].partition);
  if (held->cnt)
    rd_kafka_pause_partitions(worker->rk, held);
}

/* Offset commits (the lanes' and this file's) report here, on the poll
 * thread; a failed one is sent again (kl__lanes_kafka_committed()). */
static void offset_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *offsets,
                             void *opaque) {
  (void)rk;
  kl_worker_t *worker = opaque;
  if (err)
    KL_LOG_D(KL_COMP, "offset commit: %s; sent again", rd_kafka_err2str(err));
  if (worker->lanes)
    kl__lanes_kafka_committed(worker->lanes, offsets, err);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
  kl_worker_t *worker = opaque;
  int cooperative = worker->cooperative;
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker->assigned_once = 1;
    rd_kafka_topic_partition_list_t *held =
        rd_kafka_topic_partition_list_new(parts->cnt);
    on_assign(worker, parts, held);
    /* A partition this worker paused (fenced, or over a bound) must not
     * stay paused when the group hands it back. Resumed before the
     * assign: a resume bumps the partition's fetch version, and one after
     * it voids the offset lookup the assign started, which librdkafka
     * retries only 500 ms later. A copy, since resuming marks partitions
     * it does not know yet with an error. */
    rd_kafka_topic_partition_list_t *resume =
        rd_kafka_topic_partition_list_copy(parts);
    rd_kafka_resume_partitions(rk, resume);
    rd_kafka_topic_partition_list_destroy(resume);
    if (cooperative)
      rd_kafka_error_destroy(rd_kafka_incremental_assign(rk, parts));
    else
      rd_kafka_assign(rk, parts);
    pause_refused(worker, parts, held);
    rd_kafka_topic_partition_list_destroy(held);
  } else {
    on_revoke(worker, parts, rd_kafka_assignment_lost(rk));
    if (cooperative)
      rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, parts));
    else
      rd_kafka_assign(rk, NULL);
  }
}

/* ---- taking a partition back from a fencer that went quiet ------------ */

/*
 * A lane is fenced when something took its partition's epoch. A member the
 * group gave the partition to does that, and the group then revokes the
 * partition from this one within a session timeout, which ends the lane.
 * When the group does not, the fencer is outside it: keylane replay or
 * redrive. Those beat (kl__store_beat()) at least every third of
 * worker.fenced.retake.ms while they work, even inside a long batch or on
 * letters that keep failing. Once the partition's state (epoch, watermark,
 * the applied, duplicate and dead-letter counters, which a redrive moves
 * below the watermark, and the beats) has not changed for that period, the
 * fencer is done, paused or dead: the lane moves the consumer back to the
 * watermark, acquires a new epoch and applies from there. A fencer that
 * wakes up later is fenced in turn: its next beat or commit is refused.
 *
 * The seek comes before the acquire, so that a seek that fails costs no
 * epoch: a new epoch fences whoever holds the partition, and a retake that
 * failed after taking one would fence the holder again at every try.
 * Failed tries back off, from one check period up to the retake period.
 * kl_worker_new() requires the period to exceed the session timeout, so
 * that a member the group has already replaced learns it before it could
 * retake.
 */

void kl__worker_set_seek_hook(kl_worker_t *worker, kl__worker_seek_hook_fn *fn,
                              void *opaque) {
  worker->seek_hook = fn;
  worker->seek_hook_opaque = opaque;
}

static kl_quiet_t *quiet_of(kl_worker_t *worker, int32_t partition) {
  if (partition >= worker->quiet_count) {
    kl_quiet_t *q = kl__grow_zeroed(worker->quiet, (size_t)worker->quiet_count,
                                    (size_t)partition + 1, sizeof(*q));
    if (!q)
      return NULL;
    worker->quiet = q;
    worker->quiet_count = partition + 1;
  }
  return &worker->quiet[partition];
}

/* Moves the consumer of @p l's partition to its offset. @returns 0 or the
 * error (logged). */
static rd_kafka_resp_err_t retake_seek(kl_worker_t *worker,
                                       rd_kafka_topic_partition_list_t *l) {
  rd_kafka_topic_partition_t *tp = &l->elems[0];
  rd_kafka_resp_err_t kerr =
      worker->seek_hook
          ? worker->seek_hook(worker->seek_hook_opaque, tp->partition)
          : RD_KAFKA_RESP_ERR_NO_ERROR;
  if (!kerr) {
    rd_kafka_error_t *error = rd_kafka_seek_partitions(worker->rk, l, 10000);
    kerr = error ? rd_kafka_error_code(error) : tp->err;
    if (error)
      rd_kafka_error_destroy(error);
  }
  if (kerr)
    KL_LOG_W(KL_COMP,
             "retake partition=%" PRId32 ": cannot seek to %" PRId64
             ": %s; no epoch taken, trying again later",
             tp->partition, tp->offset, rd_kafka_err2str(kerr));
  return kerr;
}

/* Takes @p partition back from the fencer whose state @p seen has been
 * quiet for @p quiet_ns: the consumer moved back to its watermark (while
 * the lane still drops what it is given), a new epoch, then the lane owned
 * from the watermark that epoch came with (>= the seek's: what lies
 * between is skipped as applied) and the partition resumed. @returns 0, or
 * -1 to try again later (one attempt each: the poll thread must not block
 * on a store that is down). */
static int worker_retake(kl_worker_t *worker, int32_t partition,
                         const kl_partition_state_t *seen, int64_t quiet_ns) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, worker->topic, partition)->offset =
      seen->watermark > 0 ? seen->watermark : RD_KAFKA_OFFSET_BEGINNING;
  kl_partition_state_t state;
  kl__store_owner_t recorded;
  int refused = 0;
  kl_err_t err = KL_OK;
  if (retake_seek(worker, l)) {
    err = KL_EKAFKA_TRANSIENT;
  } else if ((err = kl__store_acquire_owned(worker->store, worker->topic,
                                            partition, 0, worker_owner(worker),
                                            &recorded, &refused, &state))) {
    KL_LOG_W(KL_COMP, "retake partition=%" PRId32 ": %s; trying again later",
             partition, kl_err_detail());
  } else if (refused) { /* the fleet moved: `keylane store bind` */
    err = KL_ECONF;
    KL_LOG_W(KL_COMP,
             "retake partition=%" PRId32 ": the store now records Kafka "
             "cluster %s and group %s as the owner of topic %s: this worker "
             "takes it back no more; stop it",
             partition, recorded.cluster, recorded.group, worker->topic);
  } else {
    rd_kafka_topic_partition_list_t *taken =
        rd_kafka_topic_partition_list_new(1);
    epoch_add(taken, worker->topic, partition, &state);
    commit_epochs(worker, taken);
    rd_kafka_topic_partition_list_destroy(taken);
    kl__lanes_own(worker->lanes, partition, state.epoch, state.watermark);
    quiet_of(worker, partition)->own_epoch = state.epoch; /* the caller's */
    rd_kafka_resume_partitions(worker->rk, l);
    KL_LOG_I(KL_COMP,
             "retook partition=%" PRId32 " epoch=%" PRIu64
             " resume_offset=%" PRId64
             ": its fencer had been quiet for %" PRId64 " ms",
             partition, state.epoch, state.watermark, quiet_ns / 1000000);
  }
  rd_kafka_topic_partition_list_destroy(l);
  return err ? -1 : 0;
}

static int state_same(const kl_partition_state_t *a,
                      const kl_partition_state_t *b) {
  return a->epoch == b->epoch && a->watermark == b->watermark &&
         a->applied == b->applied && a->duplicates == b->duplicates &&
         a->dead_letters == b->dead_letters && a->beats == b->beats;
}

/* A lane of @p partition newly fenced: remembered for
 * kl_worker_foreach_fence(). */
static void fence_seen(kl_worker_t *worker, int32_t partition, uint64_t epoch,
                       uint64_t current) {
  pthread_mutex_lock(&worker->why_mu);
  worker->fences[worker->nfences++ % KL_WORKER_FENCES_MAX] =
      (kl_worker_fence_t){sizeof(kl_worker_fence_t), partition, epoch, current,
                          kl__now_ms()};
  pthread_mutex_unlock(&worker->why_mu);
}

kl_err_t kl_worker_foreach_fence(kl_worker_t *worker, kl_worker_fence_cb_t *cb,
                                 void *opaque) {
  if (!worker || !cb)
    return kl__err(KL_EINVAL, "kl_worker_foreach_fence: a NULL %s",
                   worker ? "callback" : "worker");
  pthread_mutex_lock(&worker->why_mu);
  size_t n = worker->nfences < KL_WORKER_FENCES_MAX ? worker->nfences
                                                    : KL_WORKER_FENCES_MAX;
  for (size_t i = 0; i < n; i++)
    if (cb(opaque,
           &worker->fences[(worker->nfences - 1 - i) % KL_WORKER_FENCES_MAX]))
      break;
  pthread_mutex_unlock(&worker->why_mu);
  return KL_OK;
}

/* One fenced partition at a check: watch its state, or take it back once
 * it has been quiet for the period and no failed try asks to wait. */
static void retake_check(kl_worker_t *worker, int32_t partition, int64_t now,
                         int64_t every) {
  kl_partition_state_t st;
  kl_quiet_t *q = quiet_of(worker, partition);
  if (!q || kl_store_partition(worker->store, worker->topic, partition, &st))
    return;
  if (!q->since_ns)
    fence_seen(worker, partition, q->own_epoch, st.epoch);
  if (!q->since_ns || !state_same(&st, &q->seen)) {
    *q = (kl_quiet_t){q->own_epoch, st, now, 0, 0};
  } else if (now - q->since_ns >= worker->retake_ns && now >= q->next_try_ns) {
    if (worker_retake(worker, partition, &st, now - q->since_ns) == 0) {
      q->since_ns = 0;
      return;
    }
    q->backoff_ns = !q->backoff_ns                          ? every
                    : q->backoff_ns * 2 < worker->retake_ns ? q->backoff_ns * 2
                                                            : worker->retake_ns;
    /* From after the failed try, not from the check's clock read before
     * the store read and the seek: tries are a backoff apart at least. */
    q->next_try_ns = kl__mono_ns() + q->backoff_ns;
  }
}

static void retake_quiet(kl_worker_t *worker) {
  int64_t now = kl__mono_ns();
  int64_t every =
      worker->retake_ns / 4 < 1000000000 ? worker->retake_ns / 4 : 1000000000;
  if (!worker->retake_ns || now - worker->retake_checked_ns < every ||
      worker->topic_stopped)
    return;
  int32_t fenced[64];
  size_t n = kl__lanes_fenced(worker->lanes, fenced, 64);
  for (size_t i = 0; i < n && !worker->stop; i++)
    retake_check(worker, fenced[i], now, every);
  /* The next check is a period after this one ended, so that a try that
   * failed in it (its backoff counted from after it) is due by then. */
  worker->retake_checked_ns = kl__mono_ns();
}

/* ---- setup --------------------------------------------------------------- */

/* Which librdkafka features this worker uses, once at start: what a user
 * of a newer distribution gains is then visible. */
static void rdk_log(const kl__rdk_features_t *features, int consumer_protocol) {
  char built[32], loaded[32];
  kl__rdk_version_str(features->built, built, sizeof(built));
  kl__rdk_version_str(features->loaded, loaded, sizeof(loaded));
  KL_LOG_I(KL_COMP, "librdkafka %s (built against %s): %s, group.protocol=%s%s",
           loaded, built,
           features->fetch_queue_backoff
               ? "fetch.queue.backoff.ms=10"
               : "queued.min.messages=1000000 (fetch.queue.backoff.ms needs "
                 "2.2)",
           consumer_protocol ? "consumer" : "classic",
           features->consumer_protocol ? ""
                                       : " (consumer needs librdkafka 2.12)");
}

/* The embedded cluster holds a fetch that finds no record for all of
 * fetch.wait.max.ms, records that arrive meanwhile included
 * (keylane/embedded.h): a worker of one in this process fetches with a
 * short one. Appends it to @p defaults (room for KL__RDK_DEFAULTS_MAX). */
static void embedded_fetch(const kl_conf_t *conf, const char **defaults) {
  if (!kl__embedded_local(kl_conf_get(conf, "kafka.bootstrap.servers")))
    return;
  size_t n = 0;
  while (defaults[n])
    n += 2;
  if (n + 2 < KL__RDK_DEFAULTS_MAX) {
    defaults[n] = "fetch.wait.max.ms";
    defaults[n + 1] = KL_EMBEDDED_FETCH_WAIT_MS;
    defaults[n + 2] = NULL;
  }
}

/* worker.group.protocol=consumer: KIP-848's. */
static int worker_consumer_protocol(const kl_conf_t *conf) {
  return strcmp(kl_conf_get(conf, "worker.group.protocol"), "consumer") == 0;
}

kl_err_t kl__worker_kafka_conf(const kl_conf_t *conf, rd_kafka_conf_t **out) {
  char session[32], heartbeat[32];
  int64_t session_ms = kl__conf_int(conf, "worker.session.timeout.ms");
  snprintf(session, sizeof(session), "%" PRId64, session_ms);
  /* A third of the session, as Kafka advises, and at most 1 s so that a
   * rebalance is noticed quickly. */
  snprintf(heartbeat, sizeof(heartbeat), "%" PRId64,
           session_ms / 3 < 1000 ? session_ms / 3 : 1000);
  const char *defaults[KL__RDK_DEFAULTS_MAX];
  kl__rdk_features_t features = kl__rdk_features_here();
  int consumer_protocol = worker_consumer_protocol(conf);
  kl_err_t err = kl__rdk_consumer_defaults(&features, consumer_protocol,
                                           kl_conf_get(conf, "worker.group"),
                                           session, heartbeat, defaults);
  if (err)
    return err;
  rdk_log(&features, consumer_protocol);
  embedded_fetch(conf, defaults);
  kl__membership_defaults(conf, defaults);
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  err = kl__kafka_conf_apply(kconf, conf, defaults);
  if (err) {
    rd_kafka_conf_destroy(kconf);
    return err;
  }
  *out = kconf;
  return KL_OK;
}

static kl_err_t consumer_new(kl_worker_t *worker) {
  rd_kafka_conf_t *kconf;
  kl_err_t err = kl__worker_kafka_conf(worker->conf, &kconf);
  if (err)
    return err;
  /* The rebalance protocol, from the configured assignors (librdkafka
   * requires them all to have the same one; cooperative-sticky is its only
   * cooperative assignor), not from rd_kafka_rebalance_protocol() in the
   * rebalance callback: in the callbacks rd_kafka_consumer_close() serves
   * for a member the group dropped (past max.poll.interval.ms), librdkafka
   * 2.0.2 answers NULL there, or never answers at all. */
  char strategy[256] = "";
  size_t size = sizeof(strategy);
  rd_kafka_conf_get(kconf, "partition.assignment.strategy", strategy, &size);
  /* KIP-848's protocol is incremental, like cooperative-sticky. */
  worker->cooperative = worker_consumer_protocol(worker->conf) ||
                        strstr(strategy, "cooperative") != NULL;
  kl__membership_instance(kconf, worker->instance_id,
                          sizeof(worker->instance_id));
  if (kl__membership_id_check("kafka.group.instance.id", worker->instance_id)) {
    rd_kafka_conf_destroy(kconf);
    return KL_ECONF;
  }
  rd_kafka_conf_set_opaque(kconf, worker);
  rd_kafka_conf_set_rebalance_cb(kconf, rebalance_cb);
  rd_kafka_conf_set_offset_commit_cb(kconf, offset_commit_cb);
  char errstr[512];
  worker->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr));
  if (!worker->rk) {
    rd_kafka_conf_destroy(kconf);
    return kl__err(KL_EKAFKA, "cannot create the consumer: %s", errstr);
  }
  rd_kafka_poll_set_consumer(worker->rk);
  return KL_OK;
}

/* The consumer, the dead-letter producer, the lanes and (unless inline)
 * the executor threads' pool, which starts in kl_worker_run(). */
static kl_err_t worker_parts_new(kl_worker_t *worker) {
  kl_err_t err = consumer_new(worker);
  if (!err)
    err = kl__dlq_new(worker->conf, worker->topic, kl__lanes_dlq_ack, NULL,
                      &worker->dlq);
  if (!err)
    err = kl__lanes_new(worker->conf, &worker->applier, worker->rk, worker->dlq,
                        &worker->lanes);
  if (!err)
    kl__dlq_set_opaque(worker->dlq, worker->lanes);
  if (!err)
    err = kl__log_guard_new(worker->conf, worker->topic, worker->rk,
                            worker->store, worker->lanes, &worker->log_guard);
  return err;
}

kl__log_guard_t *kl__worker_log_guard(kl_worker_t *worker) {
  return worker->log_guard;
}

/* The store's watermark is trusted only while the log holds it, so the
 * consumer must say when a position is out of the log (log_guard.h),
 * never move it silently: earliest would take a recreated topic's records
 * for applied ones, latest and earliest alike would skip a retention gap. */
static kl_err_t check_offset_reset(const kl_conf_t *conf) {
  const char *reset = kl_conf_get(conf, "kafka.auto.offset.reset");
  if (!reset || strcmp(reset, "error") == 0)
    return KL_OK;
  return kl__err(KL_ECONF,
                 "kafka.auto.offset.reset=%s: the worker resumes from the "
                 "store's watermark and needs librdkafka to report a position "
                 "outside the log (a recreated topic, a retention gap) instead "
                 "of moving it; remove the setting (see worker.on.gap and "
                 "`keylane store reset`)",
                 reset);
}

/* librdkafka's default max.poll.interval.ms. */
#define KL_MAX_POLL_DEFAULT_MS 300000

/*
 * The poll thread must poll within kafka.max.poll.interval.ms, or the
 * group evicts a member that is working. Between two polls it runs events
 * for at most the inline budget plus ONE handler call (lanes_pool.c checks the
 * budget before each event; at worker.concurrency > 1 it runs none, but a
 * revoke waits for the running ones), then commits and maybe seeks. So one
 * handler call may take at most half the interval, the other half being
 * for the rest. Only a declared bound can be checked: an in-process
 * handler that sets none (0) must keep to the interval by itself.
 */
/* A timer's event is deduplicated against its id's mark once it ran: a
 * wait longer than the mark is kept outlasts the copies' dedup. */
static kl_err_t check_timer_max(const kl_conf_t *conf) {
  int64_t max_ms = kl__conf_int(conf, "timer.max.delay");
  int64_t dedup_ms = kl__conf_int(conf, "store.dedup.retention");
  if (max_ms <= dedup_ms)
    return KL_OK;
  char max[32], dedup[32];
  kl__duration_format(max_ms, max, sizeof(max));
  kl__duration_format(dedup_ms, dedup, sizeof(dedup));
  return kl__err(KL_ECONF,
                 "timer.max.delay (%s) is longer than store.dedup.retention "
                 "(%s): lower timer.max.delay, or raise "
                 "store.dedup.retention (and keep the topic's retention.ms "
                 "at least timer.max.delay, so that a rebuild finds every "
                 "pending timer's record)",
                 max, dedup);
}

static kl_err_t check_poll_interval(const kl_conf_t *conf) {
  int64_t handler_ms = kl__conf_int(conf, "worker.handler.timeout.ms");
  const char *set = kl_conf_get(conf, "kafka.max.poll.interval.ms");
  char *end = NULL;
  int64_t poll_ms = set ? strtoll(set, &end, 10) : KL_MAX_POLL_DEFAULT_MS;
  if (set && (end == set || *end || poll_ms <= 0))
    return kl__err(KL_ECONF,
                   "kafka.max.poll.interval.ms=%s is not a "
                   "positive number of ms: set it like "
                   "-X kafka.max.poll.interval.ms=300000",
                   set);
  if (handler_ms <= poll_ms / 2) /* 0: a bound the worker cannot know */
    return KL_OK;
  return kl__err(KL_ECONF,
                 "worker.handler.timeout.ms (%" PRId64 ") is more than half "
                 "of kafka.max.poll.interval.ms (%" PRId64 "): a handler call "
                 "that long keeps the worker from polling, and the group "
                 "evicts a member that is working; raise "
                 "kafka.max.poll.interval.ms to at least %" PRId64 " (-X "
                 "kafka.max.poll.interval.ms=%" PRId64 "), or lower the "
                 "handler timeout (--handler-timeout-ms) to at most %" PRId64,
                 handler_ms, poll_ms, handler_ms * 2, handler_ms * 2,
                 poll_ms / 2);
}

/*
 * The batch's PostgreSQL session sits idle in its transaction while a
 * handler that runs no SQL on it works, and the server ends a session
 * idle for store.pg.idle.timeout (pg.c): a handler call allowed that long
 * can end the batch's session before its commit, and the event runs again
 * as often, taking as long (kl__lanes_done() bounds that with
 * worker.max.attempts). So a declared handler bound must be below it.
 */
static kl_err_t check_idle_timeout(const kl_conf_t *conf, kl_store_t *store) {
  int64_t handler_ms = kl__conf_int(conf, "worker.handler.timeout.ms");
  int64_t idle_ms = kl__store_idle_ms(store);
  if (!handler_ms || !idle_ms || handler_ms < idle_ms) /* 0: no bound */
    return KL_OK;
  return kl__err(KL_ECONF,
                 "worker.handler.timeout.ms (%" PRId64 ") is not below "
                 "store.pg.idle.timeout (%" PRId64 " ms): the batch's "
                 "session is idle while a handler works, and the server "
                 "ends it after that long, so a handler call that takes its "
                 "time can never commit; lower the handler timeout "
                 "(--handler-timeout-ms) below %" PRId64 ", or raise "
                 "store.pg.idle.timeout above it (-X "
                 "store.pg.idle.timeout=%" PRId64 "ms)",
                 handler_ms, idle_ms, idle_ms, handler_ms * 2);
}

kl_err_t kl_worker_new(const kl_conf_t *conf, const char *topic,
                       kl_store_t *store, kl_handler_fn_t *handler,
                       void *handler_opaque, kl_worker_t **out) {
  kl__err_clear();
  if (!conf || !topic || !*topic || !store || !handler || !out)
    return kl__err(KL_EINVAL, "kl_worker_new: conf, topic, store and handler "
                              "are required");
  if (!kl_conf_get(conf, "kafka.bootstrap.servers"))
    return kl__err(KL_ECONF, "no bootstrap servers: set "
                             "kafka.bootstrap.servers (-b HOST:PORT)");
  kl_err_t cerr = check_offset_reset(conf);
  if (cerr)
    return cerr;
  int64_t retake_ms = kl__conf_int(conf, "worker.fenced.retake.ms");
  int64_t session_ms = kl__conf_int(conf, "worker.session.timeout.ms");
  if (retake_ms && retake_ms <= session_ms)
    return kl__err(KL_ECONF,
                   "worker.fenced.retake.ms (%" PRId64 ") must exceed "
                   "worker.session.timeout.ms (%" PRId64 "), so that a member "
                   "the group replaced learns it before it takes a partition "
                   "back; raise it, or set 0 to never take one back",
                   retake_ms, session_ms);
  kl_err_t checked = check_poll_interval(conf);
  if (!checked)
    checked = check_timer_max(conf);
  if (!checked)
    checked = check_idle_timeout(conf, store);
  if (!checked)
    checked = kl__membership_check(conf);
  if (checked)
    return checked;
  kl_worker_t *worker = calloc(1, sizeof(*worker));
  if (worker)
    pthread_mutex_init(&worker->why_mu, NULL);
  if (!worker)
    return KL_ENOMEM;
  worker->conf = kl_conf_dup(conf);
  worker->topic = strdup(topic);
  worker->store = store;
  worker->applier = (kl__applier_t){
      .store = store,
      .topic = worker->topic,
      .handler = handler,
      .handler_opaque = handler_opaque,
      .decoder = kl_decoder_new(),
      .timer_max_ms = kl__conf_int(conf, "timer.max.delay"),
      .timer_past_ms = kl__conf_int(conf, "store.dedup.retention")};
  int64_t n = kl__conf_int(conf, "worker.concurrency");
  worker->threads = n > 1 ? (int)n : 0;
  worker->retake_ns = retake_ms * 1000000;
  worker->check_ns = kl__conf_int(conf, "worker.partitions.check.ms") * 1000000;
  worker->stall_ms = kl__conf_int(conf, "worker.stall.ms");
  worker->acquire_wait_ms = kl__conf_int(conf, "worker.acquire.wait");
  kl_err_t err = KL_ENOMEM;
  if (worker->conf && worker->topic && worker->applier.decoder)
    err = worker_parts_new(worker);
  if (err) {
    kl_worker_destroy(worker);
    return err;
  }
  *out = worker;
  return KL_OK;
}

/* Refuses to run on a topic that is missing or whose partition count is not
 * the one the fleet expects: keys would move between owners. Without
 * worker.expect.partitions the count seen now is the expected one. Then
 * every record's routing is checked against that count. */
static kl_err_t check_topic(kl_worker_t *worker, int timeout_ms) {
  int32_t have = 0;
  kl_err_t err = kl__kafka_partition_count_new(worker->rk, worker->topic,
                                               timeout_ms, &have);
  if (err == KL_ENOTFOUND)
    return kl__err(KL_ENOTFOUND, "topic %s does not exist: create it first",
                   worker->topic);
  if (err)
    return err;
  int64_t want = kl__conf_int(worker->conf, "worker.expect.partitions");
  worker->expect =
      (kl__partitions_expect_t){want ? (int32_t)want : have, want != 0,
                                "worker", "worker.expect.partitions"};
  worker->partitions_expected = worker->expect.count;
  worker->partitions_live = have;
  if ((err = kl__partitions_check(worker->topic, have, &worker->expect)))
    return err;
  kl__lanes_reserve(worker->lanes, have);
  kl__lanes_route(worker->lanes, have,
                  kl_conf_get(worker->conf, "worker.misrouted"));
  worker->checked_ns = kl__mono_ns();
  return KL_OK;
}

/* The topic's count changed while running: keys moved between owners, and
 * this worker stops taking the topic (every partition paused, nothing
 * acquired) until it is restarted; /healthz says so. */
static void stop_taking(kl_worker_t *worker) {
  KL_LOG_E(KL_COMP,
           "%s; this worker stopped taking topic %s (its partitions "
           "are paused; events already taken in are applied)",
           kl_err_detail(), worker->topic);
  worker->topic_stopped = 1;
  kl__lanes_stop_taking(worker->lanes);
  rd_kafka_topic_partition_list_t *assigned = NULL;
  if (!rd_kafka_assignment(worker->rk, &assigned) && assigned) {
    rd_kafka_pause_partitions(worker->rk, assigned);
    rd_kafka_topic_partition_list_destroy(assigned);
  }
}

/* Reads the topic's partition count every worker.partitions.check.ms, on
 * the poll thread between batches (one metadata request, bounded). */
static void watch_partitions(kl_worker_t *worker) {
  int64_t now = kl__mono_ns();
  if (worker->topic_stopped || now - worker->checked_ns < worker->check_ns)
    return;
  worker->checked_ns = now;
  int32_t live = 0;
  if (kl__kafka_partition_count(worker->rk, worker->topic, 2000, &live)) {
    KL_LOG_D(KL_COMP, "partition count: %s", kl_err_detail());
    return;
  }
  worker->partitions_live = live;
  if (kl__partitions_check(worker->topic, live, &worker->expect))
    stop_taking(worker);
}

/* Refuses to run when an idempotency key may be swept while a copy of its
 * event (the record, its dead letter) still exists, unless
 * worker.retention.check=warn says to run anyway (checks.h). */
static kl_err_t check_retention(kl_worker_t *worker) {
  int warn =
      strcmp(kl_conf_get(worker->conf, "worker.retention.check"), "warn") == 0;
  int64_t dedup_ms = kl__conf_int(worker->conf, "store.dedup.retention");
  const char *const topics[2][2] = {
      {"topic", worker->topic},
      {"dead-letter topic", kl__dlq_topic(worker->dlq)}};
  for (int i = 0; i < 2; i++) {
    kl__check_t check;
    kl__check_retention(worker->rk, topics[i][0], topics[i][1], dedup_ms, 10000,
                        &check);
    if (check.status == KL__CHECK_FAIL && !warn)
      return kl__err(KL_ECONF, "%s", check.msg);
    if (check.status == KL__CHECK_WARN)
      worker->retention_unchecked = 1;
    else if (check.status == KL__CHECK_FAIL)
      worker->retention_override = 1;
    if (check.status == KL__CHECK_OK)
      KL_LOG_I(KL_COMP, "%s", check.msg);
    else
      KL_LOG_W(KL_COMP, "%s%s", check.msg,
               check.status == KL__CHECK_FAIL
                   ? " (worker.retention.check=warn: running anyway)"
                   : "");
  }
  return KL_OK;
}

/* The largest record a follow-up may be, so that kl_txn_emit() refuses
 * one that could never be published: the outbox producer's
 * message.max.bytes (the worker's kafka.message.max.bytes, else keylane's
 * default), or the topic's max.message.bytes when the cluster tells it and
 * it is lower. */
static void set_message_max(kl_worker_t *worker) {
  const char *conf = kl_conf_get(worker->conf, "kafka.message.max.bytes");
  long long max = conf ? strtoll(conf, NULL, 10) : 0;
  char source[128];
  snprintf(source, sizeof(source), "%s",
           max > 0 ? "the worker's kafka.message.max.bytes"
                   : "keylane's producer default message.max.bytes");
  if (max <= 0)
    max = KL_MESSAGE_MAX;
  int64_t topic_max = kl__check_message_max(worker->rk, worker->topic, 10000);
  if (topic_max > 0 && topic_max < max) {
    max = topic_max;
    snprintf(source, sizeof(source), "topic %s's max.message.bytes",
             worker->topic);
  }
  kl__lanes_set_message_max(worker->lanes, (size_t)max, source);
  KL_LOG_I(KL_COMP,
           "a handler's follow-up over %lld bytes as a Kafka record is "
           "refused when emitted (%s)",
           max, source);
}

static void on_consume_error(kl_worker_t *worker, rd_kafka_message_t *m) {
  if (m->err == RD_KAFKA_RESP_ERR__FATAL && !worker->fatal) {
    worker->fatal = kl__membership_fatal(
        worker->rk, kl_conf_get(worker->conf, "worker.group"),
        worker->instance_id);
    snprintf(worker->fatal_why, sizeof(worker->fatal_why), "%s",
             kl_err_detail());
    worker->stop = 1;
  } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt &&
             strcmp(rd_kafka_topic_name(m->rkt), worker->topic) == 0) {
    /* Stopping, a partition may be one it never took (no position). */
    if (!worker->stop)
      kl__log_guard_out_of_range(worker->log_guard, m->partition, m->offset);
  } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
    KL_LOG_W(KL_COMP, "consume: %s", rd_kafka_message_errstr(m));
  rd_kafka_message_destroy(m);
}

/*
 * librdkafka before 2.3.0 asserts when a cooperative-sticky consumer that
 * never received an assignment is destroyed (librdkafka issue #4312, fixed
 * by PR #4381; Debian 12 ships 2.0.2). A member stopped while its first
 * join is under way therefore waits for that join, within the session
 * timeout, before closing (on the embedded cluster a new group's first
 * join takes 3 s, one that had members up to the session timeout).
 * Messages consumed meanwhile are not applied, and the assignment it gets
 * takes no epoch (on_assign()).
 */
static void await_first_assignment(kl_worker_t *worker) {
  /* Only the cooperative assignor's state is destroyed unset, and 2.3.0
   * fixed it: others close at once. */
  if (!worker->cooperative || rd_kafka_version() >= 0x020300ff)
    return;
  int64_t deadline =
      kl__mono_ns() +
      kl__conf_int(worker->conf, "worker.session.timeout.ms") * 2000000;
  while (!worker->assigned_once && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk, 100);
    if (m)
      rd_kafka_message_destroy(m);
  }
}

/*
 * Leaves the group before rd_kafka_consumer_close(), serving the
 * revocations on this thread while the group still answers. A member the
 * group dropped (past max.poll.interval.ms) can have rebalance events
 * queued that the group no longer waits for; served inside close, their
 * callbacks race with the end of the group, and librdkafka 2.0.2 answers
 * the unassign they make with nothing, or never: the request is purged
 * with the group's queue, and the worker would hang in it. Unsubscribed,
 * the member gets its last revocation now, and close has nothing left to
 * serve. Bounded by the session timeout; messages consumed meanwhile are
 * not applied (the lanes stop taking them as they are revoked).
 */
static void leave_group(kl_worker_t *worker) {
  rd_kafka_resp_err_t kerr = rd_kafka_unsubscribe(worker->rk);
  if (kerr)
    KL_LOG_W(KL_COMP, "unsubscribe from %s: %s; closing anyway", worker->topic,
             rd_kafka_err2str(kerr));
  int64_t deadline =
      kl__mono_ns() +
      kl__conf_int(worker->conf, "worker.session.timeout.ms") * 1000000;
  int quiet = 0;
  while (!(worker->owned == 0 && quiet) && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk, 100);
    quiet = m == NULL;
    if (m)
      rd_kafka_message_destroy(m);
  }
}

/*
 * A static member does not leave the group (KIP-345): librdkafka sends no
 * LeaveGroup when it closes, and Kafka keeps the member's partitions for
 * it for the session timeout, for the same instance to take back without
 * a rebalance. So no unsubscribe: each lane stops taking records, lets
 * its running ones finish and commits them, with the final offsets,
 * before the close; the revocation the close then serves finds nothing
 * left to commit.
 */
static void stay_in_group(kl_worker_t *worker) {
  rd_kafka_topic_partition_list_t *assigned = NULL;
  if (!rd_kafka_assignment(worker->rk, &assigned) && assigned) {
    on_revoke(worker, assigned, 0);
    rd_kafka_topic_partition_list_destroy(assigned);
  }
  KL_LOG_I(KL_COMP,
           "staying in group %s as static member %s: a worker started with "
           "worker.instance.id=%s within worker.session.timeout.ms "
           "(%" PRId64 " ms) takes its partitions back without a rebalance",
           kl_conf_get(worker->conf, "worker.group"), worker->instance_id,
           worker->instance_id,
           kl__conf_int(worker->conf, "worker.session.timeout.ms"));
}

/* Takes what the consumer has, up to @p max records, waiting at most
 * @p timeout_ms for the first. */
static void worker_consume(kl_worker_t *worker, int timeout_ms, int max) {
  for (int i = 0; i < max; i++) {
    rd_kafka_message_t *m =
        rd_kafka_consumer_poll(worker->rk, i ? 0 : timeout_ms);
    if (!m)
      return;
    if (m->err)
      on_consume_error(worker, m);
    else
      kl__lanes_push(worker->lanes, m);
  }
}

/* The poll thread: consume, run events (inline mode), serve dead-letter
 * acks, then the lanes' tick (retries, commits, bounds). */
static void worker_loop(kl_worker_t *worker) {
  int64_t last_sweep = 0, last_stall_check = 0;
  while (!worker->stop) {
    atomic_store(&worker->loop_ns, kl__mono_ns());
    int busy = worker->threads == 0 && kl__lanes_has_ready(worker->lanes);
    worker_consume(worker, busy ? 0 : 5, 10000);
    worker->owned += kl__log_guard_tick(worker->log_guard);
    if (worker->threads == 0)
      kl__lanes_pool_run_inline(worker->pool, 20);
    kl__dlq_poll(worker->dlq, 0);
    kl__lanes_tick(worker->lanes);
    retake_quiet(worker);
    watch_partitions(worker);
    int64_t now = kl__mono_ns();
    if (worker->stall_ms && now - last_stall_check > 100000000) {
      kl__lanes_watch_stalls(worker->lanes, now, worker->stall_ms);
      last_stall_check = now;
    }
    if (now - last_sweep > 1000000000) {
      size_t removed = 0;
      if (kl_store_sweep(worker->store, 1000, &removed))
        KL_LOG_D(KL_COMP, "sweep: %s", kl_err_detail());
      last_sweep = now;
    }
  }
}

int kl__worker_waiting(kl_worker_t *worker, char *why, size_t size) {
  if (!atomic_load(&worker->waiting))
    return 0;
  pthread_mutex_lock(&worker->why_mu);
  snprintf(why, size, "%s", worker->why);
  pthread_mutex_unlock(&worker->why_mu);
  return 1;
}

static void set_why(kl_worker_t *worker, const char *fmt, ...) KL__PRINTF(2, 3);
static void set_why(kl_worker_t *worker, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&worker->why_mu);
  vsnprintf(worker->why, sizeof(worker->why), fmt, ap);
  pthread_mutex_unlock(&worker->why_mu);
  va_end(ap);
  atomic_store(&worker->waiting, 1);
}

/* A fleet restarting while its brokers restart must not crash-loop: the
 * topic check is retried with backoff (0.5 s doubling to 30 s) for
 * worker.kafka.wait, saying what it waits for in the log and in /healthz,
 * and giving way to kl_worker_stop(). @returns the check's result, or
 * KL_ESTOPPED when stopped while waiting. */
static kl_err_t wait_for_kafka(kl_worker_t *worker) {
  int64_t wait_ms = kl__conf_int(worker->conf, "worker.kafka.wait");
  int64_t deadline = kl__mono_ns() + wait_ms * 1000000;
  const char *boot = kl_conf_get(worker->conf, "kafka.bootstrap.servers");
  kl_err_t err;
  for (int backoff_ms = 500;;
       backoff_ms = backoff_ms < 15000 ? backoff_ms * 2 : 30000) {
    /* Short tries while waiting, so that a stop is not held for long. */
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    int try_ms = wait_ms == 0     ? 10000
                 : left_ms > 5000 ? 5000
                 : left_ms > 1000 ? (int)left_ms
                                  : 1000;
    err = check_topic(worker, try_ms);
    left_ms = (deadline - kl__mono_ns()) / 1000000;
    if (err != KL_EKAFKA_TRANSIENT || left_ms <= 0 ||
        atomic_load(&worker->stop))
      break;
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    set_why(worker,
            "waiting for Kafka (%s) to answer for topic %s: %s; "
            "next try in %d ms, giving up in %" PRId64 " s "
            "(worker.kafka.wait, --kafka-wait)",
            boot ? boot : "?", worker->topic, detail, backoff_ms,
            left_ms / 1000);
    KL_LOG_W(KL_COMP, "%s", worker->why);
    for (int slept = 0; slept < backoff_ms && !atomic_load(&worker->stop);
         slept += 100) {
      atomic_store(&worker->loop_ns, kl__mono_ns());
      kl__sleep_ms(100);
    }
  }
  atomic_store(&worker->waiting, 0);
  if (err == KL_EKAFKA_TRANSIENT && atomic_load(&worker->stop))
    return KL_ESTOPPED;
  if (err == KL_EKAFKA_TRANSIENT && wait_ms > 0) {
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    return kl__err(err,
                   "%s; gave up after waiting %" PRId64 " ms "
                   "(worker.kafka.wait, --kafka-wait)",
                   detail, wait_ms);
  }
  return err;
}

int64_t kl__worker_loop_age_ms(kl_worker_t *worker) {
  int64_t at = atomic_load(&worker->loop_ns);
  return at ? (kl__mono_ns() - at) / 1000000 : -1;
}

kl_err_t kl_worker_run(kl_worker_t *worker) {
  kl__err_clear();
  atomic_store(&worker->loop_ns, kl__mono_ns());
  kl_err_t err = wait_for_kafka(worker);
  if (err == KL_ESTOPPED)
    return KL_OK; /* stopped before it began: nothing to finish */
  if (!err)
    err = kl__dlq_check(worker->dlq, worker->topic);
  if (!err)
    err = check_retention(worker); /* a refusal is said, stopped or not */
  if (!err)
    kl__membership_check_cluster(worker->rk,
                                 kl_conf_get(worker->conf, "worker.group"),
                                 worker->instance_id);
  if (!err && worker->stop)
    return KL_OK; /* before it subscribed: no group to leave */
  if (!err)
    set_message_max(worker);
  if (!err)
    err = kl__lanes_pool_new(worker->lanes, worker->threads, &worker->pool);
  if (err)
    return err;
  rd_kafka_topic_partition_list_t *topics =
      rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, worker->topic,
                                    RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t kerr = rd_kafka_subscribe(worker->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (kerr)
    return kl__err(kl__kafka_err(kerr), "subscribe to %s: %s", worker->topic,
                   rd_kafka_err2str(kerr));
  worker_loop(worker);
  if (!worker->fatal)
    await_first_assignment(worker);
  if (worker->fatal)
    KL_LOG_W(KL_COMP, "closing the consumer: nothing more is committed");
  else if (*worker->instance_id)
    stay_in_group(worker);
  else
    leave_group(worker); /* revokes: lanes commit first */
  rd_kafka_consumer_close(worker->rk);
  kl__lanes_pool_destroy(worker->pool);
  worker->pool = NULL;
  if (worker->fatal)
    return kl__err(worker->fatal, "%s", worker->fatal_why);
  if (worker->unowned)
    return kl__err(worker->unowned, "%s", worker->unowned_why);
  return KL_OK;
}

rd_kafka_t *kl__worker_consumer(kl_worker_t *worker) {
  return worker->rk;
}

struct kl__metrics *kl__worker_metrics(kl_worker_t *worker) {
  return kl__lanes_metrics(worker->lanes);
}

uint64_t kl__worker_kafka_commits(kl_worker_t *worker) {
  return kl__lanes_kafka_commits(worker->lanes);
}

uint64_t kl__worker_ahead(kl_worker_t *worker) {
  return kl__lanes_ahead(worker->lanes);
}

size_t kl__worker_stalls(kl_worker_t *worker, kl__stall_t *out, size_t max) {
  return kl__lanes_stalls(worker->lanes, out, max);
}

kl_err_t kl__worker_keys(kl_worker_t *worker, const kl_worker_keys_query_t *q,
                         kl_worker_key_t *out, size_t *n, size_t *total) {
  return kl__lanes_keys(worker->lanes, q, out, n, total);
}

int kl__worker_unowned(const kl_worker_t *worker) {
  return worker->unowned != KL_OK;
}

const char *kl__worker_topic(const kl_worker_t *worker) {
  return worker->topic;
}

kl_store_t *kl__worker_store(const kl_worker_t *worker) {
  return worker->store;
}

const kl_conf_t *kl__worker_conf(const kl_worker_t *worker) {
  return worker->conf;
}

uint64_t kl__worker_fence_batches(kl_worker_t *worker, uint64_t fenced,
                                  uint64_t batches) {
  pthread_mutex_lock(&worker->why_mu);
  if (fenced > worker->health_fenced) {
    worker->health_fenced = fenced;
    worker->health_batches = batches;
  }
  uint64_t at = worker->health_batches;
  pthread_mutex_unlock(&worker->why_mu);
  return at;
}

uint64_t kl__worker_commits_failing(kl_worker_t *worker, int runs,
                                    int64_t *for_ms, char *why, size_t size) {
  return runs ? kl__lanes_store_failing(worker->lanes, for_ms, why, size)
              : kl__lanes_commits_failing(worker->lanes, for_ms, why, size);
}

void kl_worker_stop(kl_worker_t *worker) {
  worker->stop = 1;
}

kl_err_t kl_worker_stats(const kl_worker_t *worker, kl_worker_stats_t *stats,
                         size_t size) {
  kl__err_clear();
  if (!worker || !stats)
    return kl__err(KL_EINVAL, "kl_worker_stats: worker and stats are "
                              "required");
  /* Filled whole, then copied as far as the caller's struct goes: fields
   * are only appended (worker.h), so its size ends between two of ours. */
  kl_worker_stats_t all;
  memset(&all, 0, sizeof(all));
  kl__lanes_stats(worker->lanes, &all);
  all.owned = worker->owned;
  all.retention_override = worker->retention_override;
  all.retention_unchecked = worker->retention_unchecked;
  all.partitions_expected = worker->partitions_expected;
  all.partitions_live = worker->partitions_live;
  memcpy(stats, &all, size < sizeof(all) ? size : sizeof(all));
  return KL_OK;
}

void kl_worker_destroy(kl_worker_t *worker) {
  if (!worker)
    return;
  kl__lanes_pool_destroy(worker->pool);
  if (worker->rk)
    rd_kafka_destroy(worker->rk);
  kl__log_guard_destroy(worker->log_guard);
  kl__lanes_destroy(worker->lanes);
  kl__dlq_destroy(worker->dlq);
  kl_decoder_destroy(worker->applier.decoder);
  kl_conf_destroy(worker->conf);
  free(worker->quiet);
  free(worker->topic);
  pthread_mutex_destroy(&worker->why_mu);
  free(worker);
}
