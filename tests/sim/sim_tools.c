/*
 * Owners outside the group, as the CLI runs them, through the same
 * kl__apply_batch(): replay beside a live owner, redrive of a dead letter,
 * and `store rebuild` from the whole log into a fresh store. Each takes
 * its partition with a new epoch, so a live owner it fenced finds out at
 * its next commit. And the dead-letter commit that owners and tools share.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"
#include "worker/letters.h"
#include "worker/rebuild.h"

static sim_batch_t tool; /* the batch of the tool at work */

static void tool_batch(kl_store_t *store, sim_view_t *v, int32_t part,
                       uint64_t epoch, int64_t from, size_t count) {
  memset(&tool, 0, sizeof(tool));
  tool.view = v;
  tool.store = store;
  tool.part = part;
  tool.epoch = epoch;
  tool.from = from;
  tool.count = count;
  for (size_t i = 0; i < count; i++)
    tool.msgs[i] = &W->log[part].v[from + (int64_t)i]->msg;
}

kl_err_t sim_dead_letter(kl_store_t *store, sim_view_t *v, int32_t part,
                         uint64_t epoch, int64_t offset, sim_fate_t fate) {
  kl_txn_t *txn;
  kl_err_t err =
      kl_store_begin(store, sim_topic(part), sim_tpart(part), epoch, &txn);
  if (err)
    return err;
  uint32_t e = W->log[part].v[offset]->event;
  const sim_event_t *ev = &W->events[e];
  const sim_key_t *k = &W->keys[ev->key];
  kl_mark_t mark = KL_MARK_NONE;
  err = kl_txn_seen(txn, k->name, k->name_len, ev->id, ev->id_len, &mark);
  if (!err && mark == KL_MARK_NONE)
    err = kl_txn_mark(txn, k->name, k->name_len, ev->id, ev->id_len,
                      KL_MARK_DEAD_LETTER);
  static kl_decoder_t *decoder;
  if (!decoder)
    decoder = kl_decoder_new();
  kl__applier_t a = {.topic = sim_topic(part), .decoder = decoder};
  if (!err) /* as replay's: a firing record's dead letter takes its timer */
    err = kl__apply_dead_letter(&a, sim_tpart(part), txn,
                                &W->log[part].v[offset]->msg, NULL);
  if (err) {
    kl_store_abort(txn);
    return err;
  }
  sim_view_check_mark(v, e, mark, "the dead letter's lookup");
  if (fate == SIM_COMMIT_ABORT) {
    kl_store_abort(txn);
    return KL_ESTORE_BUSY;
  }
  err = kl_store_commit(txn, offset + 1);
  if (!err) {
    W->dirty = 1;
    W->stats.commits++;
    if (mark == KL_MARK_NONE)
      sim_view_dead(v, e, part, epoch, offset + 1);
    else
      sim_view_committed(v, part, epoch, offset + 1);
  }
  return fate == SIM_COMMIT_LOST ? KL_ESTORE_BUSY : err;
}

/* Applies [from, log end) of @p part as an owner of @p epoch, in batches;
 * at a record that fails: the records before it, then, when
 * @p letter_ok says the fleet dead-lettered it, its dead letter; else it
 * stops there. @returns the offset it reached. */
static int64_t apply_range(kl_store_t *store, sim_view_t *v, int32_t part,
                           uint64_t epoch, int64_t from, int rebuild,
                           int (*letter_ok)(int32_t, int64_t)) {
  int64_t end = (int64_t)W->log[part].n, stop = -1;
  while (from < end && !W->failed) {
    if (from == stop) {
      if (sim_dead_letter(store, v, part, epoch, from, SIM_COMMIT_GO))
        return from;
      stop = -1;
      from++;
      continue;
    }
    int64_t count = end - from < SIM_BATCH ? end - from : SIM_BATCH;
    if (stop > from && stop - from < count)
      count = stop - from;
    tool_batch(store, v, part, epoch, from, (size_t)count);
    tool.rebuild = rebuild;
    sim_batch_apply(&tool);
    if (tool.err)
      return from;
    if (tool.res.verdict == KL_HANDLER_OK) {
      from = tool.res.next;
      continue;
    }
    if (tool.res.verdict != KL_HANDLER_FAIL ||
        !letter_ok(part, tool.res.failed_offset))
      return from;
    stop = tool.res.failed_offset;
  }
  return from;
}

static int fleet_letter(int32_t part, int64_t offset) {
  for (size_t i = 0; i < W->nletters; i++)
    if (W->letters[i].part == part && W->letters[i].offset == offset &&
        i >= W->letters_gone)
      return 1;
  return 0;
}

static int any_letter(int32_t part, int64_t offset) {
  return 1;
}

static int tool_acquire(kl_store_t *store, sim_view_t *v, int32_t part,
                        kl_partition_state_t *st, int adopt) {
  kl_err_t err =
      kl__store_acquire_above(store, sim_topic(part), sim_tpart(part),
                              v == &W->live ? 0 : W->max_epoch[part], st);
  if (err) {
    sim_fail("store-error",
             "a tool cannot acquire partition %d of topic %s: %s",
             (int)sim_tpart(part), sim_topic(part), kl_err_detail());
    return -1;
  }
  sim_view_acquired(v, part, st, adopt);
  W->dirty = 1;
  return 0;
}

void sim_replay(int32_t part) {
  kl_partition_state_t st;
  if (tool_acquire(W->store, &W->live, part, &st, 1))
    return;
  W->stats.replays++;
  int64_t to = apply_range(W->store, &W->live, part, st.epoch, st.watermark, 0,
                           fleet_letter);
  sim_say("a replay of partition %d with epoch %" PRIu64
          " applies offsets %" PRId64 "..%" PRId64,
          (int)part, st.epoch, st.watermark, to - 1);
}

int sim_redrive(size_t i) {
  sim_letter_t l = W->letters[i];
  if (i < W->letters_gone)
    return 0;
  if (l.part < 0) { /* a follow-up set aside: published to its topic */
    void *copy = malloc(l.len);
    memcpy(copy, l.bytes, l.len);
    int64_t off = sim_log_append(l.event, copy, l.len);
    W->stats.redriven++;
    sim_say("a redrive of letter %zu publishes follow-up %.*s: partition %d, "
            "offset %" PRId64,
            i, (int)W->events[l.event].id_len, W->events[l.event].id,
            (int)W->events[l.event].part, off);
    return 1;
  }
  kl_partition_state_t st;
  if (kl_store_partition(W->store, sim_topic(l.part), sim_tpart(l.part), &st) ||
      st.watermark <= l.offset) {
    sim_say("a redrive of letter %zu is pending", i);
    return 0;
  }
  if (tool_acquire(W->store, &W->live, l.part, &st, 1))
    return 1;
  kl__letter_t letter;
  memset(&letter, 0, sizeof(letter));
  letter.dlq_offset = (int64_t)i;
  char key[KL__LETTER_KEY_MAX];
  /* An operator runs again a redrive that a busy store failed (the row
   * both topics write, W->shared, may have changed behind the tool's
   * owner cache: the failed commit dropped it). */
  for (int run = 0; run < (W->calm ? 3 : 1); run++) {
    tool_batch(W->store, &W->live, l.part, st.epoch, l.offset, 1);
    tool.redrive = 1;
    tool.letter_key = key;
    tool.letter_key_len =
        kl__letter_key(W->dlqs[sim_topic_no(l.part)], &letter, key);
    sim_batch_apply(&tool);
    if (tool.err != KL_ESTORE_BUSY)
      break;
  }
  W->stats.redriven += tool.res.applied;
  sim_say("a redrive of letter %zu (partition %d, offset %" PRId64
          ") with epoch %" PRIu64 ": %s",
          i, (int)l.part, l.offset, st.epoch,
          tool.err                            ? kl_err_name(tool.err)
          : tool.res.applied                  ? "applied"
          : tool.res.verdict != KL_HANDLER_OK ? "failed again"
                                              : "a duplicate");
  return 1;
}

/* The rebuild's outbox of topic @p t against its log, as `keylane store
 * rebuild` ends (worker/rebuild.h): follow-ups the log holds are not
 * kept, nor those the dead-letter topic holds (set aside by the outbox). */
static void rebuild_outbox(kl_store_t *store, int t) {
  int32_t parts[SIM_TOPIC_P], first = t * W->cfg.partitions;
  for (int32_t p = 0; p < W->cfg.partitions; p++)
    parts[p] = p;
  kl__rebuild_t *rb = NULL;
  kl_decoder_t *decoder = kl_decoder_new();
  kl_err_t err = kl__rebuild_new(store, W->topics[t], parts,
                                 (size_t)W->cfg.partitions, &rb);
  for (int32_t p = first; !err && p < first + W->cfg.partitions; p++)
    for (size_t i = 0; i < W->log[p].n; i++) {
      const rd_kafka_message_t *m = &W->log[p].v[i]->msg;
      kl_event_t ev;
      if (kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len,
                          &ev) == KL_OK)
        kl__rebuild_see(rb, W->topics[t], &ev);
    }
  for (size_t i = W->letters_gone; !err && i < W->nletters; i++) {
    const sim_letter_t *l = &W->letters[i];
    kl_event_t ev;
    int key = W->events[l->event].key;
    const sim_key_t *k =
        l->part < 0 && sim_key_topic(key) == t ? &W->keys[key] : NULL;
    if (k && kl_event_decode(decoder, k->name, k->name_len, l->bytes, l->len,
                             &ev) == KL_OK)
      kl__rebuild_see(rb, W->topics[t], &ev);
  }
  if (!err)
    err = kl__rebuild_prune(rb, NULL, NULL);
  if (err)
    sim_fail("rebuild", "the rebuild's outbox of topic %s cannot be pruned: %s",
             W->topics[t], kl_err_detail());
  kl__rebuild_destroy(rb);
  kl_decoder_destroy(decoder);
}

void sim_rebuild(kl_store_t *store, sim_view_t *v, int adopt) {
  sim_view_init(v);
  if (!store)
    return;
  for (int32_t p = 0; p < W->nparts && !W->failed; p++) {
    kl_partition_state_t st;
    if (tool_acquire(store, v, p, &st, adopt))
      break;
    int64_t to = apply_range(store, v, p, st.epoch, 0, 1, any_letter);
    if (to != (int64_t)W->log[p].n)
      sim_fail("rebuild",
               "the rebuild of partition %d of topic %s stopped at offset "
               "%" PRId64 " of %zu: %s",
               (int)sim_tpart(p), sim_topic(p), to, W->log[p].n,
               tool.err ? kl_err_detail() : tool.res.why);
  }
  for (int t = 0; t < W->ntopics && !W->failed; t++)
    rebuild_outbox(store, t);
}

void sim_rebuild_switch(void) {
  sim_say("the fleet stops, and the store is rebuilt from the log");
  for (int o = 0; o < W->cfg.owners; o++)
    sim_owner_crash(&W->owners[o]);
  sim_view_t v;
  kl_store_t *store = sim_lmdb_env(1);
  sim_rebuild(store, &v, 1);
  if (W->failed) {
    sim_view_free(&v);
    return;
  }
  W->env = 1;
  W->store = store;
  memset(W->fleet_took, 0, sizeof(W->fleet_took)); /* a new store */
  for (int o = 0; o < W->cfg.owners; o++) { /* they start on the new one */
    W->owners[o].store = store;
    sim_owner_restart(&W->owners[o]);
  }
  sim_view_free(&W->live);
  W->live = v;
  /* A follow-up the old store kept, never published nor set aside, went
   * with it: the rebuild derived it again, under a new id. */
  for (uint32_t e = 0; e < W->nevents; e++) {
    sim_event_t *ev = &W->events[e];
    if (sim_emits(ev->kind) && ev->followup != SIM_NONE &&
        W->events[ev->followup].first < 0 && !W->events[ev->followup].aside) {
      W->events[ev->followup].gone = 1;
      ev->followup = SIM_NONE;
    }
  }
  W->gen++;
  W->stats.rebuilds++;
}
