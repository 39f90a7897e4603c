/*
 * The lanes' executors: take a ready event, run the per-event step of
 * apply.c on a child transaction, hand the outcome back to its lane.
 */
#include "worker/lanes_pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/log.h"
#include "worker/lanes_internal.h"
#include "store/child.h"

#define KL_COMP "worker"

typedef struct kl_exec {
  kl__lanes_pool_t *pool;
  kl__applier_t applier; /* the lanes' one, with this executor's decoder */
  kl__child_t child;     /* reused event after event */
  char slow_why[512];    /* exec_slow()'s reason */
  pthread_t thread;
  int started;
} kl_exec_t;

struct kl__lanes_pool {
  kl__lanes_t *lanes;
  int count;
  kl_exec_t inline_exec;
  kl_exec_t execs[];
};

static kl__outcome_t pool_outcome(kl_handler_result_t r,
                                  const kl__apply_result_t *res) {
  if (r == KL_HANDLER_OK)
    return res->duplicates ? KL__RUN_DUPLICATE : KL__RUN_APPLIED;
  if (r == KL_HANDLER_RETRY)
    return res->store_err ? KL__RUN_STORE : KL__RUN_RETRY;
  if (res->misrouted)
    return KL__RUN_MISROUTED;
  if (res->reserved_id)
    return KL__RUN_RESERVED;
  return res->failed_err ? KL__RUN_DECODE : KL__RUN_FAIL;
}

/*
 * A handler step of @p ran_ms, at least the store's idle bound, left the
 * session of @p base idle that long (a handler that runs no SQL on it), and
 * the server ended it. In inline mode @p base is the group txn, which can
 * no longer commit; in key-parallel mode a snapshot, whose reads after
 * the pause failed. Either way the event, run again, ends the next session
 * the same way, forever when that counts as the store's failure, which
 * counts no attempt. So the step is the event's RETRY: it counts toward
 * worker.max.attempts, backs off, and is dead-lettered past them, with
 * this reason. An inline step that succeeded without SQL on the session
 * (@p unseen: whether the server ended it is not known, and it was idle
 * that long) is such a RETRY as well; one whose SQL was released, like a
 * key-parallel one (committed in the group txn, not on @p base), stands.
 * @returns the run's outcome.
 */
static kl__outcome_t exec_slow(kl_exec_t *x, const kl__job_t *job,
                               int64_t ran_ms, kl__outcome_t outcome,
                               int unseen) {
  const kl__lanes_t *lanes = x->pool->lanes;
  if (outcome != KL__RUN_STORE && (outcome != KL__RUN_APPLIED || !unseen))
    return outcome; /* a RETRY counts already, a FAIL is final */
  snprintf(x->slow_why, sizeof(x->slow_why),
           "the handler ran %" PRId64 " ms, not less than "
           "store.pg.idle.timeout (%" PRId64 " ms): the server ends the "
           "batch's session idle that long, so the batch cannot commit; the "
           "event runs again and counts an attempt toward "
           "worker.max.attempts. Make the handler faster, or raise "
           "store.pg.idle.timeout above its longest call",
           ran_ms, lanes->idle_ms);
  KL_LOG_W(KL_COMP, "partition=%" PRId32 " offset=%" PRId64 ": %s",
           job->partition, job->msg->offset, x->slow_why);
  return KL__RUN_RETRY;
}

/* Runs one event on @p base (a snapshot, or in inline mode the lane's
 * group txn, whose PostgreSQL connection the handler may then use).
 * @returns the clock read when its handler returned, for the inline
 * loop's budget (kl__lanes_pool_run_inline()). */
static int64_t exec_step(kl_exec_t *x, const kl__job_t *job, kl_txn_t *base) {
  kl__lanes_t *lanes = x->pool->lanes;
  if (lanes->applier.run_fault &&
      lanes->applier.run_fault(lanes->applier.fault_opaque, job->partition,
                               job->msg->offset)) {
    kl__run_t run = {KL__RUN_STORE,
                     "the store failed (test seam)",
                     NULL,
                     0,
                     NULL,
                     -1,
                     0,
                     0,
                     0,
                     0};
    kl__lanes_done(lanes, job, &run);
    return kl__mono_ns();
  }
  kl__child_t *child = &x->child;
  kl__child_begin(child, base, lanes->inline_mode ? NULL : &lanes->mu,
                  &job->lane->ov);
  child->sql = lanes->inline_mode;
  kl__apply_result_t res;
  memset(&res, 0, sizeof(res));
  kl_event_t event;
  int64_t start_ns = kl__mono_ns();
  kl_handler_result_t r =
      kl__apply_event(&x->applier, job->partition, job->epoch, &child->base,
                      job->msg, &event, &res);
  int64_t end_ns = kl__mono_ns();
  int64_t ran_ms = (end_ns - start_ns) / 1000000;
  int slow = lanes->idle_ms && ran_ms >= lanes->idle_ms; /* exec_slow() */
  if (lanes->inline_mode && ran_ms > lanes->step_max_ms)
    lanes->step_max_ms = ran_ms; /* lane_batch_old(), on this thread too */
  kl__run_t run = {pool_outcome(r, &res),
                   res.why,
                   NULL,
                   0,
                   child,
                   res.expected_partition,
                   0,
                   res.scheduled_due,
                   res.timers_early > 0,
                   0};
  char sid[KL__SID_MAX];
  if (!res.failed_err && !res.misrouted) {
    run.id = sid;
    run.id_len =
        kl__sid_encode(event.key, event.key_len, event.id, event.id_len, sid);
    run.ts_ms = event.ts;
    /* Every delayed event is kept as a timer first: one that ran is a
     * fired timer's run (kl__apply_event()). */
    if (res.applied && event.not_before > 0)
      run.due_ms = event.not_before;
  }
  /* The event's SQL ends with its verdict. If that fails the group
   * transaction is lost anyway: its commit fails and the lane rewinds. */
  /* A slow step whose SQL ran on the session learns here whether the
   * server ended it: its RELEASE fails then (a store failure, below). One
   * that ran none is taken for ended (exec_slow()). */
  int unseen = slow && lanes->inline_mode && !child->pg;
  if (kl__child_end(child, r == KL_HANDLER_OK && !unseen)) {
    run.outcome = KL__RUN_STORE;
    run.why = kl_err_detail();
  }
  /* A handler that failed because the store's link broke under it (a
   * read on a server that restarted) did not fail for its event: the
   * event runs again, and no attempt of it is counted, so that a store
   * outage never dead-letters what it interrupted. */
  if ((run.outcome == KL__RUN_RETRY || run.outcome == KL__RUN_FAIL) &&
      kl__txn_lost(base))
    run.outcome = KL__RUN_STORE;
  kl__outcome_t was = run.outcome;
  if (slow && (run.outcome = exec_slow(x, job, ran_ms, was, unseen)) != was)
    run.why = x->slow_why;
  kl__lanes_done(lanes, job, &run); /* its log lines carry the trace too */
  kl__log_trace_set(NULL);
  return end_ns;
}

static void exec_begin_failed(kl__lanes_t *lanes, const kl__job_t *job,
                              kl_err_t err) {
  kl__run_t run = {err == KL_EFENCED ? KL__RUN_FENCED : KL__RUN_STORE,
                   kl_err_detail(),
                   NULL,
                   0,
                   NULL,
                   -1,
                   0,
                   0,
                   0,
                   0};
  kl__lanes_done(lanes, job, &run);
}

/* Key-parallel mode: every event reads its own snapshot, begun after any
 * commit that holds an earlier event of its key, or with that event's
 * writes still in the overlay. */
static void *exec_main(void *opaque) {
  kl_exec_t *x = opaque;
  kl__lanes_t *lanes = x->pool->lanes;
  kl__job_t job;
  while (kl__lanes_take(lanes, &job, 1)) {
    kl_txn_t *snap;
    kl_err_t err = kl_store_begin(lanes->store, lanes->topic, job.partition,
                                  job.epoch, &snap);
    if (err) {
      exec_begin_failed(lanes, &job, err);
      continue;
    }
    exec_step(x, &job, snap);
    kl_store_abort(snap);
  }
  return NULL;
}

int kl__lanes_pool_run_inline(kl__lanes_pool_t *pool, int budget_ms) {
  kl_exec_t *x = &pool->inline_exec;
  int64_t now = kl__mono_ns();
  int64_t end = now + (int64_t)budget_ms * 1000000;
  int n = 0;
  kl__job_t job;
  /* The budget is checked before every event, though a fast event takes
   * about a microsecond: a handler may take up to
   * worker.handler.timeout.ms, so one more event past the budget may
   * already keep the poll thread away for that long, and kl_worker_new()
   * sizes max.poll.interval.ms for one such event, not 16. The clock read
   * is the one the last event's step made when its handler returned
   * (exec_step()): what runs after it (the verdict, the lanes' bookkeeping)
   * takes microseconds, and a read of its own per event was 3 % of the
   * poll thread (issue 37). */
  while (now < end && kl__lanes_take(pool->lanes, &job, 0)) {
    kl_txn_t *batch;
    kl_err_t err = kl__lanes_batch(pool->lanes, &job, &batch);
    if (err) {
      exec_begin_failed(pool->lanes, &job, err);
      now = kl__mono_ns();
    } else {
      now = exec_step(x, &job, batch);
    }
    n++;
  }
  return n;
}

static kl_err_t exec_init(kl_exec_t *x, kl__lanes_pool_t *pool) {
  x->pool = pool;
  x->applier = pool->lanes->applier;
  kl__child_init(&x->child);
  x->applier.decoder = kl_decoder_new();
  return x->applier.decoder ? KL_OK : KL_ENOMEM;
}

kl_err_t kl__lanes_pool_new(kl__lanes_t *lanes, int threads,
                            kl__lanes_pool_t **out) {
  kl__lanes_pool_t *pool =
      calloc(1, sizeof(*pool) + (size_t)threads * sizeof(kl_exec_t));
  if (!pool)
    return KL_ENOMEM;
  pool->lanes = lanes;
  kl_err_t err = exec_init(&pool->inline_exec, pool);
  for (int i = 0; !err && i < threads; i++) {
    kl_exec_t *x = &pool->execs[i];
    pool->count++;
    if ((err = exec_init(x, pool)))
      break;
    if (pthread_create(&x->thread, NULL, exec_main, x))
      err = kl__err(KL_ENOMEM, "cannot start executor thread %d of %d", i + 1,
                    threads);
    else
      x->started = 1;
  }
  if (err) {
    kl__lanes_pool_destroy(pool);
    return err;
  }
  *out = pool;
  return KL_OK;
}

void kl__lanes_pool_destroy(kl__lanes_pool_t *pool) {
  if (!pool)
    return;
  /* The committer goes with the executors, while the consumer it wakes
   * still exists. */
  kl__lanes_flight_stop(pool->lanes);
  kl__lanes_stop(pool->lanes);
  for (int i = 0; i < pool->count; i++) {
    if (pool->execs[i].started)
      pthread_join(pool->execs[i].thread, NULL);
    kl_decoder_destroy(pool->execs[i].applier.decoder);
    kl__child_destroy(&pool->execs[i].child);
  }
  kl_decoder_destroy(pool->inline_exec.applier.decoder);
  kl__child_destroy(&pool->inline_exec.child);
  free(pool);
}
