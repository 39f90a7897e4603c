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
#include <inttypes.h>
#include <stdio.h>

#include "common/internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "worker/worker_state.h"

#define KL_COMP "worker"

void kl__worker_set_seek_hook(kl_worker_t *worker, kl__worker_seek_hook_fn *fn,
                              void *opaque) {
  worker->seek_hook = fn;
  worker->seek_hook_opaque = opaque;
}

kl_quiet_t *kl__worker_quiet_of(kl_worker_t *worker, int32_t partition) {
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
  } else if ((err = kl__store_acquire_owned(
                  worker->store, worker->topic, partition, 0,
                  kl__worker_owner(worker), &recorded, &refused, &state))) {
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
    kl__worker_epoch_add(taken, worker->topic, partition, &state);
    kl__worker_commit_epochs(worker, taken);
    rd_kafka_topic_partition_list_destroy(taken);
    kl__lanes_own(worker->lanes, partition, state.epoch, state.watermark);
    kl__worker_quiet_of(worker, partition)->own_epoch =
        state.epoch; /* the caller's */
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
  kl_quiet_t *q = kl__worker_quiet_of(worker, partition);
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

void kl__worker_retake_quiet(kl_worker_t *worker) {
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
