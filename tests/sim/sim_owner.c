/*
 * The simulated owners: each runs the worker's own engine, as the poll
 * thread of a worker in inline mode does (worker.c's loop): a
 * kl__lanes_t with its pool, its group commits, its dead letters and its
 * outbox publisher, fed records of the simulated log, with the ledger
 * handler. What the engine reaches outside the store (Kafka, the clock)
 * goes through the seams of sim_seams.c. An owner holds partitions by
 * epoch, can be paused between its handlers and its commit (on a stack
 * of its own) and can die at any step.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "keylane/handlers.h"
#include "keylane/worker.h"
#include "sim/sim.h"
#include "worker/lanes_internal.h"
#include "worker/lanes_pool.h"

#define STACK_SIZE (512 * 1024)

/* ---- the handler and the seams ------------------------------------------ */

static kl_handler_result_t sim_handler(void *opaque, const kl_event_t *event,
                                       const kl_fence_t *fence, kl_txn_t *txn,
                                       char *errbuf, size_t errbuf_size) {
  sim_batch_t *b = opaque;
  /* A tool's batch is of one partition; an owner's engine is of a topic */
  int32_t part = b->owner ? sim_mpart(fence->topic, fence->partition) : b->part;
  const sim_rec_t *rec = W->log[part].v[fence->offset];
  uint32_t e = rec->event;
  const sim_event_t *ev = &W->events[e];
  if (event->id_len != ev->id_len || memcmp(event->id, ev->id, ev->id_len)) {
    sim_fail("handler",
             "the handler of offset %" PRId64 " got id %.*s, the "
             "log holds %.*s there",
             fence->offset, (int)event->id_len, event->id, (int)ev->id_len,
             ev->id);
    return KL_HANDLER_FAIL;
  }
  /* A cancel is never dead-lettered: its redrive would cancel later than
   * its place in the log, where a rebuild cancels (sim_timers.c). */
  if (b->inject && ev->kind != SIM_CANCEL && b->calls++ == b->inject_at) {
    snprintf(errbuf, errbuf_size, "sim: injected %s",
             b->inject == KL_HANDLER_RETRY ? "RETRY" : "FAIL");
    return (kl_handler_result_t)b->inject;
  }
  if (b->rebuild && W->live.marks[e].dead && !W->live.marks[e].applied) {
    snprintf(errbuf, errbuf_size, "sim: the fleet dead-lettered it");
    return KL_HANDLER_FAIL;
  }
  int seen = -1;
  kl_handler_result_t r =
      ev->kind == SIM_CANCEL || ev->kind == SIM_DEFER
          ? sim_timers_handle(b, e, part, fence->offset, event, txn, &seen,
                              errbuf, errbuf_size)
          : kl_ledger_handler(NULL, event, fence, txn, errbuf, errbuf_size);
  if (!b->rebuild)
    r = sim_shared_count(txn, event, r, errbuf, errbuf_size);
  if ((r == KL_HANDLER_OK) != ev->valid)
    sim_fail("handler", "the ledger said %d to %.*s, which is %svalid: %s",
             (int)r, (int)ev->id_len, ev->id, ev->valid ? "" : "not ", errbuf);
  if (r == KL_HANDLER_OK && b->napps < SIM_BATCH) {
    b->apps[b->napps].event = e;
    b->apps[b->napps].cancel = seen;
    b->apps[b->napps++].offset = fence->offset;
  }
  return r;
}

/* What the group commit of @p part about to be made holds, for the model
 * (sim_seams.c applies it once the commit truly succeeded). */
static void pend_read(sim_owner_t *o, int32_t tpart, uint64_t epoch) {
  if (o->npend[o->tno] >= SIM_TOPIC_P) {
    sim_fail("seam", "owner %d's hook ran %zu times before a commit", o->no,
             o->npend[o->tno] + 1);
    return;
  }
  sim_pend_t *pd = &o->pend[o->tno][o->npend[o->tno]++];
  pd->part = o->tno * W->cfg.partitions + tpart;
  pd->epoch = epoch;
  pd->n = 0;
  kl__lane_t *lane = o->lanes[o->tno]->lanes[tpart];
  for (size_t i = 0; i < lane->ring_count; i++) {
    const kl__slot_t *s = kl__lane_at(lane, i);
    if (!s->building)
      continue;
    pd->v = kl__grow(pd->v, &pd->cap, pd->n, sizeof(*pd->v), 64);
    pd->v[pd->n++] = (sim_done_t){s->offset,
                                  s->state == KL__SLOT_DLQ_DONE ? SIM_DONE_DEAD
                                  : s->duplicate                ? SIM_DONE_DUP
                                  : s->scheduled ? SIM_DONE_SCHEDULED
                                                 : SIM_DONE_APPLIED,
                                  sim_timers_seen(o, pd->part, s->offset)};
  }
}

/* Between the handlers and the commit. An owner's commit is read for the
 * model; a paused owner gives the stack back to the scheduler, and gets
 * it back when it is resumed. */
static void sim_hook(void *opaque, const char *topic, int32_t partition,
                     uint64_t epoch) {
  sim_batch_t *b = opaque;
  sim_owner_t *o = b->owner;
  if (!o)
    return;
  o->tno = (int)(sim_mpart(topic, 0) / W->cfg.partitions);
  pend_read(o, partition, epoch);
  if (!b->pause || !o->running)
    return;
  b->pause = 0;
  o->paused = 1;
  W->stats.pauses++;
  W->acting = NULL;
  swapcontext(&o->ctx, &W->sched);
  W->acting = o;
  o->paused = 0;
  o->resumed = 1;
}

void sim_batch_apply(sim_batch_t *b) {
  static kl_decoder_t *decoder;
  if (!decoder)
    decoder = kl_decoder_new();
  kl__applier_t a = {.store = b->store,
                     .topic = sim_topic(b->part),
                     .handler = sim_handler,
                     .handler_opaque = b,
                     .decoder = decoder,
                     .before_commit = sim_hook,
                     .hook_opaque = b,
                     .redrive = b->redrive,
                     .letter_key = b->letter_key,
                     .letter_key_len = b->letter_key_len,
                     .partitions = W->cfg.partitions};
  b->err = kl__apply_batch(&a, sim_tpart(b->part), b->epoch, b->from, b->msgs,
                           b->count, &b->res);
  W->stats.busy += b->err == KL_ESTORE_BUSY;
  if (b->res.committed) {
    W->dirty = 1;
    W->stats.commits++;
    W->stats.applied += b->res.applied;
    W->stats.duplicates += b->res.duplicates;
    sim_view_commit(b);
  }
}

/* ---- an owner's engine ----------------------------------------------------
 */

static void owner_start(sim_owner_t *o) {
  o->dead = 0;
  o->batch.owner = o;
  o->decoder = kl_decoder_new();
  sim_owner_t *was = W->acting;
  W->acting = o;
  kl_err_t err = KL_OK;
  for (int t = 0; !err && t < W->ntopics; t++) {
    o->tno = t;
    o->fake[t] = sim_fake_new(o, t);
    kl__applier_t a = {.store = o->store,
                       .topic = W->topics[t],
                       .handler = sim_handler,
                       .handler_opaque = &o->batch,
                       .decoder = o->decoder,
                       .before_commit = sim_hook,
                       .hook_opaque = &o->batch};
    err =
        kl__lanes_new(W->conf, &a, NULL, (kl__dlq_t *)o->fake[t], &o->lanes[t]);
    if (!err) {
      kl__lanes_reserve(o->lanes[t], W->cfg.partitions);
      kl__lanes_route(o->lanes[t], W->cfg.partitions, "dlq");
      err = kl__lanes_pool_new(o->lanes[t], 0, &o->pool[t]);
    }
  }
  W->acting = was;
  if (err) {
    fprintf(stderr, "keylane-sim: owner %d's lanes: %s\n", o->no,
            kl_err_detail());
    abort();
  }
}

/* The owner's process is gone: its engines are torn down as dead ones,
 * which reach nothing (sim_seams.c). */
static void owner_stop(sim_owner_t *o) {
  sim_owner_t *was = W->acting;
  o->dead = 1;
  W->acting = o;
  for (int t = 0; t < SIM_TOPICS; t++) {
    o->tno = t;
    kl__lanes_pool_destroy(o->pool[t]);
    kl__lanes_destroy(o->lanes[t]);
    sim_fake_free(o->fake[t]);
    o->pool[t] = NULL;
    o->lanes[t] = NULL;
    o->fake[t] = NULL;
  }
  W->acting = was;
  kl_decoder_destroy(o->decoder);
  o->decoder = NULL;
  memset(o->npend, 0, sizeof(o->npend));
  sim_timers_forget(o);
  memset(o->held, 0, sizeof(o->held));
}

void sim_owner_init(sim_owner_t *o, int no) {
  memset(o, 0, sizeof(*o));
  o->no = no;
  o->stack = malloc(STACK_SIZE);
  o->store = W->backend == SIM_PG ? sim_store_open(W->pg_uri) : W->store;
  owner_start(o);
}

void sim_owner_free(sim_owner_t *o) {
  if (o->paused)
    sim_owner_crash(o);
  owner_stop(o);
  if (W->backend == SIM_PG)
    kl_store_destroy(o->store);
  for (int t = 0; t < SIM_TOPICS; t++)
    for (int i = 0; i < SIM_TOPIC_P; i++)
      free(o->pend[t][i].v);
  free(o->seen);
  free(o->stack);
  memset(o, 0, sizeof(*o));
}

void sim_owner_restart(sim_owner_t *o) {
  owner_stop(o);
  if (W->backend == SIM_PG) {
    kl_store_destroy(o->store);
    o->store = sim_store_open(W->pg_uri);
  }
  owner_start(o);
}

/* The lane of the model's partition @p part. */
static kl__lane_t *owner_lane(const sim_owner_t *o, int32_t part) {
  const kl__lanes_t *lanes = o->lanes[sim_topic_no(part)];
  int32_t p = sim_tpart(part);
  return lanes && p < lanes->count ? lanes->lanes[p] : NULL;
}

/* One turn of the worker's poll loop (worker.c): the events ready run,
 * the dead-letter acks are served, the lanes tick (retries, commits,
 * letters, the outbox). A lane the store fenced is given up, as the
 * group's rebalance would take it. */
static void owner_turn(sim_owner_t *o) {
  W->acting = o;
  for (int t = 0; t < W->ntopics; t++) {
    o->tno = t;
    /* The commit a tick left in flight lands before or after the events
     * of the other lanes run (the worker's committer thread), or later. */
    if (o->batch.flight & 1)
      kl__lanes_flight_run(o->lanes[t]);
    kl__lanes_pool_run_inline(o->pool[t], 20);
    if (o->batch.flight & 2)
      kl__lanes_flight_run(o->lanes[t]);
    kl__dlq_poll((kl__dlq_t *)o->fake[t], 0);
    kl__lanes_tick(o->lanes[t]);
    if (o->resumed || (o->batch.flight & 4))
      kl__lanes_flight_run(o->lanes[t]);
    o->resumed = 0;
    int32_t fenced[SIM_TOPIC_P];
    size_t n = kl__lanes_fenced(o->lanes[t], fenced, SIM_TOPIC_P);
    for (size_t i = 0; i < n && !o->dead; i++) {
      uint64_t epoch;
      o->tno = t;
      kl__lanes_release(o->lanes[t], fenced[i], 0, &epoch);
      o->held[t * W->cfg.partitions + fenced[i]] = 0;
      W->stats.fenced++;
      sim_say("owner %d was fenced on partition %d of %s: it gives it up",
              o->no, (int)fenced[i], W->topics[t]);
    }
  }
  W->acting = NULL;
}

/* After the owner's turn, in the scheduler: a dead one restarts. */
static void turn_done(sim_owner_t *o) {
  if (o->running || !o->dead)
    return;
  W->stats.crashes++;
  sim_say("owner %d died: it starts again", o->no);
  sim_owner_restart(o);
}

static void coro_main(void) {
  sim_owner_t *o = W->coro;
  owner_turn(o);
  o->running = 0;
}

static sim_fate_t fate_of(unsigned r, int *crash) {
  *crash = 0;
  if (W->calm)
    return SIM_COMMIT_GO;
  if (r < 8)
    return SIM_COMMIT_ABORT;
  if (r < 16)
    return SIM_COMMIT_LOST;
  *crash = r < 26;
  return r < 21 ? SIM_COMMIT_ABORT : r < 26 ? SIM_COMMIT_LOST : SIM_COMMIT_GO;
}

int sim_owner_can_work(const sim_owner_t *o, int32_t part) {
  const kl__lane_t *lane = owner_lane(o, part);
  if (!o->held[part] || o->paused || !lane)
    return 0;
  return (size_t)lane->next_offset < W->log[part].n || lane->ring_count;
}

/* The records of @p part the consumer hands over: up to @p count from
 * where the lane is, unless it is paused (its window or its outbox full,
 * or fenced). */
static size_t owner_feed(sim_owner_t *o, int32_t part, size_t count) {
  kl__lane_t *lane = owner_lane(o, part);
  if (!lane || lane->state != KL__LANE_OWNED || lane->paused)
    return 0;
  size_t n = 0;
  W->acting = o;
  for (int64_t off = lane->next_offset;
       n < count && (size_t)off < W->log[part].n; off++, n++)
    kl__lanes_push(o->lanes[sim_topic_no(part)], &W->log[part].v[off]->msg,
                   kl__mono_ns());
  W->acting = NULL;
  return n;
}

/* The step's faults from its choice @p w. */
static void step_faults(sim_owner_t *o, uint64_t w, int acks) {
  sim_batch_t *b = &o->batch;
  b->inject = 0;
  b->calls = 0;
  b->napps = 0;
  b->pause = 0;
  b->crash = 0;
  b->fate = SIM_COMMIT_GO;
  b->acks = W->calm ? 1 : acks;
  b->flight = W->calm ? 3 : (int)((w >> 59) & 7);
  if (W->calm)
    return;
  unsigned r = (w >> 24) & 0xff;
  b->inject = r < 10 ? KL_HANDLER_RETRY : r < 16 ? KL_HANDLER_FAIL : 0;
  b->inject_at = (int)((w >> 32) & 0x7);
  b->pause = ((w >> 40) & 0xff) < 30;
  b->fate = fate_of((w >> 48) & 0xff, &b->crash);
  if (b->pause)
    b->fate = SIM_COMMIT_GO, b->crash = 0;
}

/* One turn of @p o, on a stack of its own when it may pause. */
static void owner_run(sim_owner_t *o) {
  if (!o->batch.pause) {
    owner_turn(o);
    turn_done(o);
    return;
  }
  getcontext(&o->ctx);
  o->ctx.uc_stack.ss_sp = o->stack;
  o->ctx.uc_stack.ss_size = STACK_SIZE;
  o->ctx.uc_link = &W->sched;
  makecontext(&o->ctx, coro_main, 0);
  o->running = 1;
  W->coro = o;
  swapcontext(&W->sched, &o->ctx);
  turn_done(o);
}

void sim_owner_batch(sim_owner_t *o, int32_t part, uint64_t w) {
  step_faults(o, w, ((w >> 56) & 3) != 0 ? 1 + ((w >> 58) & 1) : 0);
  size_t count =
      W->calm ? SIZE_MAX : 1 + ((w >> 16) & 0xff) % (size_t)W->cfg.batch_max;
  kl__lane_t *lane = owner_lane(o, part);
  int64_t from = lane ? lane->next_offset : 0;
  size_t fed = owner_feed(o, part, count);
  sim_batch_t *b = &o->batch;
  sim_say("owner %d takes %zu records of partition %d from offset %" PRId64
          " and turns%s%s%s%s",
          o->no, fed, (int)part, from,
          b->inject == KL_HANDLER_RETRY ? ", a handler says RETRY"
          : b->inject                   ? ", a handler says FAIL"
                                        : "",
          b->pause                      ? ", pauses before its commit"
          : b->fate == SIM_COMMIT_ABORT ? ", its commit fails"
          : b->fate == SIM_COMMIT_LOST  ? ", its commit's answer is lost"
                                        : "",
          b->crash ? " and it dies" : "",
          b->acks == 0 ? ", no report comes back" : "");
  owner_run(o);
}

void sim_owner_tick(sim_owner_t *o, uint64_t w, int acks) {
  step_faults(o, w, acks);
  sim_say("owner %d turns without new records%s", o->no,
          acks ? ", reports come back" : "");
  owner_run(o);
}

void sim_owner_resume(sim_owner_t *o, uint64_t w) {
  if (!o->paused)
    return;
  sim_batch_t *b = &o->batch;
  b->fate = fate_of((w >> 48) & 0xff, &b->crash);
  sim_say("owner %d resumes and commits%s%s", o->no,
          b->fate == SIM_COMMIT_ABORT  ? ", and the commit fails"
          : b->fate == SIM_COMMIT_LOST ? ", and the answer is lost"
                                       : "",
          b->crash ? ", and it dies" : "");
  swapcontext(&W->sched, &o->ctx);
  turn_done(o);
}

void sim_owner_crash(sim_owner_t *o) {
  sim_say("owner %d dies%s", o->no, o->paused ? " while paused" : "");
  if (o->paused) { /* its open txn goes with it: the turn ends as a ghost */
    o->dead = 1;
    swapcontext(&W->sched, &o->ctx);
    turn_done(o);
    return;
  }
  W->stats.crashes++;
  sim_owner_restart(o);
}

void sim_owner_acquire(sim_owner_t *o, int32_t part, uint64_t w) {
  if (o->held[part]) { /* the group takes it back first */
    int calm = W->calm;
    W->calm = 1; /* no faults of its own */
    step_faults(o, 0, 1);
    W->calm = calm;
    int commit = (w >> 40) & 1;
    sim_say("owner %d gives partition %d up%s", o->no, (int)part,
            commit ? ", committing what is final" : "");
    W->acting = o;
    uint64_t epoch;
    o->tno = sim_topic_no(part);
    kl__lanes_release(o->lanes[o->tno], sim_tpart(part), commit, &epoch);
    W->acting = NULL;
    o->held[part] = 0;
  }
  /* A commit left in flight holds its PostgreSQL connections, which the
   * worker's committer would have given back by now: it commits first. */
  W->acting = o;
  for (int t = 0; t < W->ntopics; t++) {
    o->tno = t;
    kl__lanes_flight_run(o->lanes[t]);
  }
  W->acting = NULL;
  /* as the worker takes it (worker.c, lane_acquire()): as the fleet's
   * cluster and group, which the first take of a topic records */
  kl_partition_state_t st;
  kl__store_owner_t recorded;
  int refused = 0;
  kl_err_t err =
      kl__store_acquire_owned(o->store, sim_topic(part), sim_tpart(part), 0,
                              &W->fleet, &recorded, &refused, &st);
  if (err) {
    sim_fail("store-error", "owner %d cannot acquire partition %d: %s", o->no,
             (int)part, kl_err_detail());
    return;
  }
  if (refused) {
    sim_fail("foreign",
             "owner %d of the fleet (cluster %s, group %s) was refused "
             "partition %d: the store records cluster %s, group %s",
             o->no, W->fleet.cluster, W->fleet.group, (int)part,
             recorded.cluster, recorded.group);
    return;
  }
  sim_say("owner %d acquires partition %d: epoch %" PRIu64
          ", watermark %" PRId64,
          o->no, (int)part, st.epoch, st.watermark);
  sim_view_acquired(&W->live, part, &st, 1);
  W->fleet_took[sim_topic_no(part)] = 1;
  o->held[part] = st.epoch;
  W->acting = o;
  o->tno = sim_topic_no(part);
  kl__lanes_own(o->lanes[o->tno], sim_tpart(part), st.epoch, st.watermark);
  W->acting = NULL;
  W->dirty = 1;
}

int sim_owner_settled(const sim_owner_t *o, int32_t part) {
  const kl__lane_t *lane = owner_lane(o, part);
  return lane && lane->state == KL__LANE_OWNED &&
         (size_t)lane->next_offset == W->log[part].n && !lane->ring_count &&
         !sim_fake_inflight(o->fake[sim_topic_no(part)]);
}

size_t sim_owner_inflight(const sim_owner_t *o) {
  size_t n = 0;
  for (int t = 0; t < W->ntopics; t++)
    n += sim_fake_inflight(o->fake[t]);
  return n;
}
