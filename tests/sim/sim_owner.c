/*
 * The simulated owners: each holds partitions by epoch as a worker does,
 * runs batches through the worker's kl__apply_batch() with the ledger
 * handler, dead-letters, publishes its partitions' outbox, and can be
 * paused between its handlers and its commit (on a stack of its own) or
 * die at any step.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "keylane/worker.h"
#include "sim/sim.h"
#include "store/outbox_rec.h"

#define STACK_SIZE (512 * 1024)

static void hold_clear(sim_hold_t *h) {
  memset(h, 0, sizeof(*h));
  h->fail_off = -1;
}

void sim_owner_init(sim_owner_t *o, int no) {
  memset(o, 0, sizeof(*o));
  o->no = no;
  for (int p = 0; p < SIM_MAXP; p++)
    hold_clear(&o->hold[p]);
  o->stack = malloc(STACK_SIZE);
  o->store = W->backend == SIM_PG ? sim_store_open(W->pg_uri) : W->store;
}

void sim_owner_free(sim_owner_t *o) {
  if (o->paused)
    sim_owner_crash(o);
  if (W->backend == SIM_PG)
    kl_store_destroy(o->store);
  free(o->acks);
  free(o->stack);
  memset(o, 0, sizeof(*o));
}

void sim_owner_restart(sim_owner_t *o) {
  for (int p = 0; p < SIM_MAXP; p++)
    hold_clear(&o->hold[p]);
  o->nacks = 0;
  if (W->backend == SIM_PG) {
    kl_store_destroy(o->store);
    o->store = sim_store_open(W->pg_uri);
  }
}

/* ---- the handler and the seams ------------------------------------------ */

static kl_handler_result_t sim_handler(void *opaque, const kl_event_t *event,
                                       const kl_fence_t *fence, kl_txn_t *txn,
                                       char *errbuf, size_t errbuf_size) {
  sim_batch_t *b = opaque;
  const sim_rec_t *rec = W->log[b->part].v[fence->offset];
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
  if (b->inject && b->calls++ == b->inject_at) {
    snprintf(errbuf, errbuf_size, "sim: injected %s",
             b->inject == KL_HANDLER_RETRY ? "RETRY" : "FAIL");
    return (kl_handler_result_t)b->inject;
  }
  if (b->rebuild && W->live.marks[e].dead && !W->live.marks[e].applied) {
    snprintf(errbuf, errbuf_size, "sim: the fleet dead-lettered it");
    return KL_HANDLER_FAIL;
  }
  kl_handler_result_t r =
      kl_ledger_handler(NULL, event, fence, txn, errbuf, errbuf_size);
  if (!b->rebuild)
    r = sim_shared_count(txn, event, r, errbuf, errbuf_size);
  if ((r == KL_HANDLER_OK) != ev->valid)
    sim_fail("handler", "the ledger said %d to %.*s, which is %svalid: %s",
             (int)r, (int)ev->id_len, ev->id, ev->valid ? "" : "not ", errbuf);
  if (r == KL_HANDLER_OK && b->napps < SIM_BATCH) {
    b->apps[b->napps].event = e;
    b->apps[b->napps++].offset = fence->offset;
  }
  return r;
}

/* Between the handlers and the commit: a paused owner gives the stack
 * back to the scheduler, and gets it back when it is resumed. */
static void sim_hook(void *opaque, const char *topic, int32_t partition,
                     uint64_t epoch) {
  sim_batch_t *b = opaque;
  sim_owner_t *o = b->owner;
  if (!b->pause || !o || !o->running)
    return;
  o->paused = 1;
  W->stats.pauses++;
  swapcontext(&o->ctx, &W->sched);
  o->paused = 0;
}

static kl__commit_fate_t sim_fate(void *opaque, int32_t partition,
                                  uint64_t epoch) {
  return ((sim_batch_t *)opaque)->fate;
}

void sim_batch_apply(sim_batch_t *b) {
  /* One decoder per stack: a paused batch's events borrow from its own. */
  static kl_decoder_t *decoders[SIM_MAXO + 1];
  int slot = b->owner ? b->owner->no : SIM_MAXO;
  if (!decoders[slot])
    decoders[slot] = kl_decoder_new();
  kl__applier_t a = {.store = b->store,
                     .topic = sim_topic(b->part),
                     .handler = sim_handler,
                     .handler_opaque = b,
                     .decoder = decoders[slot],
                     .before_commit = sim_hook,
                     .hook_opaque = b,
                     .commit_fate = sim_fate,
                     .redrive = b->redrive,
                     .letter_key = b->letter_key,
                     .letter_key_len = b->letter_key_len,
                     .partitions = W->cfg.partitions};
  b->err = kl__apply_batch(&a, sim_tpart(b->part), b->epoch, b->from, b->msgs,
                           b->count, &b->res);
  W->stats.busy += b->err == KL_ESTORE_BUSY && b->fate == KL__COMMIT_GO;
  if (b->res.committed) {
    W->dirty = 1;
    W->stats.commits++;
    W->stats.applied += b->res.applied;
    W->stats.duplicates += b->res.duplicates;
    sim_view_commit(b);
  }
}

/* ---- batches ------------------------------------------------------------- */

/* What the owner makes of its batch's outcome (what it was told). */
static void batch_done(sim_owner_t *o) {
  sim_batch_t *b = &o->batch;
  sim_hold_t *h = &o->hold[b->part];
  W->stats.lost += b->fate == KL__COMMIT_LOST;
  W->stats.aborted += b->fate == KL__COMMIT_ABORT;
  if (b->crash) {
    W->stats.crashes++;
    sim_owner_restart(o);
    return;
  }
  if (b->err == KL_EFENCED) {
    W->stats.fenced++;
    hold_clear(h);
    return;
  }
  if (b->err)
    return; /* a failed commit, as far as it knows: run again from h->wm */
  if (b->res.verdict == KL_HANDLER_OK) {
    h->wm = b->res.next;
    if (h->fail_off >= 0 && h->wm > h->fail_off)
      h->fail_off = -1, h->attempts = 0;
    return;
  }
  int64_t f = b->res.failed_offset;
  if (f != h->fail_off)
    h->attempts = 0;
  h->fail_off = f;
  h->fail_kind = KL_HANDLER_FAIL;
  if (b->res.verdict == KL_HANDLER_RETRY && ++h->attempts < SIM_ATTEMPTS) {
    h->fail_kind = KL_HANDLER_RETRY;
    h->retry_at = W->now_ms + (100 << h->attempts);
  }
}

static void coro_main(void) {
  sim_owner_t *o = W->coro;
  sim_batch_apply(&o->batch);
  o->running = 0;
  batch_done(o);
}

static kl__commit_fate_t fate_of(unsigned r, int *crash) {
  *crash = 0;
  if (W->calm)
    return KL__COMMIT_GO;
  if (r < 8)
    return KL__COMMIT_ABORT;
  if (r < 16)
    return KL__COMMIT_LOST;
  *crash = r < 26;
  return r < 21 ? KL__COMMIT_ABORT : r < 26 ? KL__COMMIT_LOST : KL__COMMIT_GO;
}

int sim_owner_can_work(const sim_owner_t *o, int32_t part) {
  const sim_hold_t *h = &o->hold[part];
  if (!h->epoch || o->paused)
    return 0;
  if (h->fail_off == h->wm)
    return h->fail_kind == KL_HANDLER_FAIL || W->now_ms >= h->retry_at;
  return (size_t)h->wm < W->log[part].n;
}

/* The record at the watermark failed for good: its letter is sent, then
 * its mark and the watermark past it are committed. */
static void owner_dead_letter(sim_owner_t *o, int32_t part, uint64_t w) {
  sim_hold_t *h = &o->hold[part];
  int64_t f = h->wm;
  W->letters = kl__grow(W->letters, &W->letters_cap, W->nletters,
                        sizeof(*W->letters), 64);
  uint32_t e = W->log[part].v[f]->event;
  W->letters[W->nletters++] = (sim_letter_t){part, f, e};
  W->stats.letters++;
  sim_say("owner %d dead-letters offset %" PRId64 " of partition %d", o->no, f,
          (int)part);
  if (!W->calm && ((w >> 24) & 0xff) < 20) {
    sim_say("owner %d dies between the letter and its mark", o->no);
    W->stats.crashes++;
    sim_owner_restart(o);
    return;
  }
  int crash;
  kl__commit_fate_t fate = fate_of((w >> 48) & 0xff, &crash);
  kl_err_t err = sim_dead_letter(o->store, &W->live, part, h->epoch, f, fate);
  if (crash) {
    W->stats.crashes++;
    sim_owner_restart(o);
  } else if (err == KL_EFENCED) {
    hold_clear(h);
  } else if (!err) {
    h->wm = f + 1;
    h->fail_off = -1, h->attempts = 0;
  }
}

void sim_owner_batch(sim_owner_t *o, int32_t part, uint64_t w) {
  sim_hold_t *h = &o->hold[part];
  if (h->fail_off == h->wm && h->fail_kind == KL_HANDLER_FAIL) {
    owner_dead_letter(o, part, w);
    return;
  }
  size_t count =
      W->calm ? SIM_BATCH : 1 + ((w >> 16) & 0xff) % W->cfg.batch_max;
  size_t left = W->log[part].n - (size_t)h->wm;
  if (h->fail_off > h->wm) /* the records before the one that failed */
    left = (size_t)(h->fail_off - h->wm);
  if (count > left)
    count = left;
  sim_batch_t *b = &o->batch;
  memset(b, 0, offsetof(sim_batch_t, apps));
  b->napps = 0;
  b->owner = o;
  b->view = &W->live;
  b->store = o->store;
  b->part = part;
  b->epoch = h->epoch;
  b->from = h->wm;
  b->count = count;
  for (size_t i = 0; i < count; i++)
    b->msgs[i] = &W->log[part].v[b->from + (int64_t)i]->msg;
  if (!W->calm) {
    unsigned r = (w >> 24) & 0xff;
    b->inject = r < 10 ? KL_HANDLER_RETRY : r < 16 ? KL_HANDLER_FAIL : 0;
    b->inject_at = (int)(((w >> 32) & 0xff) % count);
    b->pause = ((w >> 40) & 0xff) < 30;
  }
  b->fate = b->pause ? KL__COMMIT_GO : fate_of((w >> 48) & 0xff, &b->crash);
  sim_say("owner %d runs offsets %" PRId64 "..%" PRId64
          " of partition %d with epoch %" PRIu64 "%s%s%s",
          o->no, b->from, b->from + (int64_t)count - 1, (int)part, b->epoch,
          b->inject == KL_HANDLER_RETRY ? ", one handler says RETRY"
          : b->inject                   ? ", one handler says FAIL"
                                        : "",
          b->pause                      ? ", pauses before its commit"
          : b->fate == KL__COMMIT_ABORT ? ", its commit fails"
          : b->fate == KL__COMMIT_LOST  ? ", its commit's answer is lost"
                                        : "",
          b->crash ? " and it dies" : "");
  if (!b->pause) {
    sim_batch_apply(b);
    batch_done(o);
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
}

void sim_owner_resume(sim_owner_t *o, uint64_t w) {
  if (!o->paused)
    return;
  o->batch.fate = fate_of((w >> 48) & 0xff, &o->batch.crash);
  sim_say("owner %d resumes and commits%s%s", o->no,
          o->batch.fate == KL__COMMIT_ABORT  ? ", and the commit fails"
          : o->batch.fate == KL__COMMIT_LOST ? ", and the answer is lost"
                                             : "",
          o->batch.crash ? ", and it dies" : "");
  swapcontext(&W->sched, &o->ctx);
}

void sim_owner_crash(sim_owner_t *o) {
  sim_say("owner %d dies%s", o->no, o->paused ? " while paused" : "");
  if (o->paused) { /* its open txn goes with it */
    o->batch.fate = KL__COMMIT_ABORT;
    o->batch.crash = 1;
    swapcontext(&W->sched, &o->ctx);
    return;
  }
  W->stats.crashes++;
  sim_owner_restart(o);
}

void sim_owner_acquire(sim_owner_t *o, int32_t part) {
  kl_partition_state_t st;
  kl_err_t err =
      kl_store_acquire(o->store, sim_topic(part), sim_tpart(part), &st);
  if (err) {
    sim_fail("store-error", "owner %d cannot acquire partition %d: %s", o->no,
             (int)part, kl_err_detail());
    return;
  }
  sim_say("owner %d acquires partition %d: epoch %" PRIu64
          ", watermark %" PRId64,
          o->no, (int)part, st.epoch, st.watermark);
  sim_view_acquired(&W->live, part, &st, 1);
  sim_hold_t *h = &o->hold[part];
  hold_clear(h);
  h->epoch = st.epoch;
  h->wm = st.watermark;
  W->dirty = 1;
}

/* ---- the outbox publisher ------------------------------------------------ */

typedef struct publish_ctx {
  sim_owner_t *o;
  int32_t part;
  size_t n;
} publish_ctx_t;

/* The follow-up's source must be an event of the topic of @p part whose
 * batch committed. */
static uint32_t followup_source(const kl__outbox_rec_t *rec, int32_t part) {
  kl__emit_src_t src;
  const kl_event_t *fe = &rec->event;
  const char *topic = sim_topic(part);
  int32_t first = part - sim_tpart(part);
  if (kl__emit_id_parse(fe->id, fe->id_len, &src) ||
      src.topic_len != strlen(topic) ||
      memcmp(src.topic, topic, src.topic_len) || src.index != 0 ||
      src.partition >= W->cfg.partitions ||
      (size_t)src.offset >= W->log[first + src.partition].n) {
    sim_fail("followup",
             "the outbox holds a follow-up of id %.*s, which "
             "names no record of the log",
             (int)fe->id_len, fe->id);
    return SIM_NONE;
  }
  uint32_t s = W->log[first + src.partition].v[src.offset]->event;
  if (!W->live.marks[s].applied) {
    sim_fail("orphan-followup",
             "the outbox of partition %d holds follow-up %.*s, whose source "
             "event %.*s was never committed",
             (int)src.partition, (int)fe->id_len, fe->id,
             (int)W->events[s].id_len, W->events[s].id);
    return SIM_NONE;
  }
  return s;
}

static int publish_cb(void *opaque, uint64_t seq, const void *bytes,
                      size_t len) {
  publish_ctx_t *c = opaque;
  kl__outbox_rec_t rec;
  if (kl__outbox_rec_decode(bytes, len, &rec)) {
    sim_fail("followup", "an outbox record does not decode");
    return 1;
  }
  uint32_t s = followup_source(&rec, c->part);
  int k =
      sim_key_by_name(sim_topic_no(c->part), rec.event.key, rec.event.key_len);
  if (s == SIM_NONE)
    return 1;
  if (W->events[s].kind != SIM_TRANSFER || k != W->events[s].to) {
    sim_fail("followup",
             "follow-up %.*s is not the credit of its source "
             "transfer",
             (int)rec.event.id_len, rec.event.id);
    return 1;
  }
  /* Its source's: another event may have its id (a hostile record, an
   * earlier log's follow-up), which makes it no less this one. */
  uint32_t e = W->events[s].followup;
  if (e != SIM_NONE &&
      (W->events[e].id_len != rec.event.id_len ||
       memcmp(W->events[e].id, rec.event.id, W->events[e].id_len))) {
    sim_fail("followup",
             "transfer %.*s emitted follow-up %.*s, and earlier %.*s",
             (int)W->events[s].id_len, W->events[s].id, (int)rec.event.id_len,
             rec.event.id, (int)W->events[e].id_len, W->events[e].id);
    return 1;
  }
  if (e == SIM_NONE) {
    e = sim_event_add((uint8_t)k, rec.event.id, rec.event.id_len);
    W->events[e].kind = SIM_FOLLOWUP;
    W->events[e].amount = W->events[s].amount;
    W->events[e].valid = 1;
    W->events[s].followup = e;
  }
  void *out;
  size_t out_len;
  if (kl_event_encode(&rec.event, &out, &out_len)) {
    sim_fail("followup", "follow-up %.*s does not encode: %s",
             (int)rec.event.id_len, rec.event.id, kl_err_detail());
    return 1;
  }
  int64_t off = sim_log_append(e, out, out_len);
  sim_say("owner %d publishes follow-up %.*s to partition %d, offset %" PRId64,
          c->o->no, (int)rec.event.id_len, rec.event.id, (int)W->events[e].part,
          off);
  sim_owner_t *o = c->o;
  o->acks = kl__grow(o->acks, &o->acks_cap, o->nacks, sizeof(*o->acks), 64);
  o->acks[o->nacks++] = (kl__outbox_ack_t){c->part, seq};
  o->hold[c->part].after = seq;
  W->stats.published++;
  c->n++;
  return 0;
}

void sim_owner_publish(sim_owner_t *o, int32_t part, size_t max) {
  publish_ctx_t c = {o, part, 0};
  kl_err_t err =
      kl__store_outbox_list(o->store, sim_topic(part), sim_tpart(part),
                            o->hold[part].after, max, publish_cb, &c);
  if (err)
    sim_fail("store-error", "listing the outbox of partition %d: %s", (int)part,
             kl_err_detail());
}

void sim_owner_ack(sim_owner_t *o) {
  if (!o->nacks)
    return;
  sim_say("owner %d removes %zu acknowledged follow-ups", o->no, o->nacks);
  /* acks name the model's partitions: each topic's, with its own */
  kl__outbox_ack_t *mine = malloc(o->nacks * sizeof(*mine));
  for (int t = 0; mine && t < W->ntopics; t++) {
    size_t n = 0;
    for (size_t i = 0; i < o->nacks; i++)
      if (sim_topic_no(o->acks[i].partition) == t) {
        mine[n] = o->acks[i];
        mine[n++].partition = sim_tpart(o->acks[i].partition);
      }
    kl_err_t err =
        n ? kl__store_outbox_del(o->store, W->topics[t], mine, n) : KL_OK;
    if (err)
      sim_fail("store-error", "removing follow-ups of topic %s: %s",
               W->topics[t], kl_err_detail());
  }
  free(mine);
  o->nacks = 0;
}
