/*
 * Ownership: a partition the group assigns is taken with a new epoch from
 * the store, and one it revokes is drained and committed, inside the
 * rebalance callback on the poll thread, before the group moves it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "common/log.h"
#include "worker/checks.h"
#include "worker/checks_log.h"
#include "worker/worker_state.h"

#define KL_COMP "worker"

/* Acquires a new epoch, retrying with backoff (100 ms doubling to 5 s)
 * until @p deadline_ns while the store does not answer or refuses (a
 * read-only session, a revoked privilege, a schema being migrated): the
 * group gave us the partition, and nobody else will apply it meanwhile.
 * With @p owner (kl__worker_owner()), the store records it as the topic's or
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
void kl__worker_commit_epochs(kl_worker_t *worker,
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
 * list kl__worker_commit_epochs() commits. */
void kl__worker_epoch_add(rd_kafka_topic_partition_list_t *taken,
                          const char *topic, int32_t partition,
                          const kl_partition_state_t *state) {
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
const kl__store_owner_t *kl__worker_owner(kl_worker_t *worker) {
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
      worker->stop || !parts->cnt ? NULL : kl__worker_owner(worker);
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
    kl_quiet_t *quiet = kl__worker_quiet_of(worker, tp->partition);
    if (quiet) {
      quiet->since_ns = 0;
      quiet->own_epoch = state.epoch; /* what a fence refuses */
    }
    tp->offset =
        state.watermark > 0 ? state.watermark : RD_KAFKA_OFFSET_BEGINNING;
    verify_last(worker, tp, &state);
    kl__worker_epoch_add(taken, worker->topic, tp->partition, &state);
    worker->owned++;
    KL_LOG_I(KL_COMP,
             "assigned partition=%" PRId32 " epoch=%" PRIu64
             " resume_offset=%" PRId64,
             tp->partition, state.epoch, state.watermark);
  }
  kl__worker_commit_epochs(worker, taken);
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
void kl__worker_on_revoke(kl_worker_t *worker,
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
void kl__worker_offset_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                 rd_kafka_topic_partition_list_t *offsets,
                                 void *opaque) {
  (void)rk;
  kl_worker_t *worker = opaque;
  if (err)
    KL_LOG_D(KL_COMP, "offset commit: %s; sent again", rd_kafka_err2str(err));
  if (worker->lanes)
    kl__lanes_kafka_committed(worker->lanes, offsets, err);
}

void kl__worker_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *parts,
                             void *opaque) {
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
    kl__worker_on_revoke(worker, parts, rd_kafka_assignment_lost(rk));
    if (cooperative)
      rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, parts));
    else
      rd_kafka_assign(rk, NULL);
  }
}
