/*
 * The lanes: windows, keys, the ready heap, taking events and handing
 * results back, backoff, bounds and the periodic tick. The group commit,
 * fencing, rewinds, releases and dead letters are in lanes_commit.c.
 */
#include "worker/lanes.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "common/metrics.h"
#include "worker/lanes_internal.h"
#include "worker/fire.h"
#include "worker/outbox.h"
#include "store/child.h"
#include "store/outbox_rec.h"

#define KL_COMP "worker"
#define KL_REPORT_NS (10LL * 1000000000)
#define KL_OUTBOX_DRAIN_MS 5000 /* for follow-ups' acks at a release */

/* Out of memory mid-lane (kl__oom()): nothing half-applied can be
 * committed, so the process ends and a restarted worker resumes from the
 * store. */

/* ---- slot arrays and the ready heap ------------------------------------ */

kl_err_t kl__slots_push(kl__slots_t *s, kl__slot_t *slot) {
  kl__slot_t **v = kl__grow(s->v, &s->cap, s->n, sizeof(*v), 16);
  if (!v)
    kl__oom(KL_COMP);
  s->v = v;
  s->v[s->n++] = slot;
  return KL_OK;
}

void kl__slots_remove(kl__slots_t *s, kl__slot_t *slot) {
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i] == slot) {
      s->v[i] = s->v[--s->n];
      return;
    }
}

static void heap_swap(kl__slots_t *h, size_t a, size_t b) {
  kl__slot_t *t = h->v[a];
  h->v[a] = h->v[b];
  h->v[b] = t;
}

/* Lowest offset first: with one executor and no failures, events run in
 * offset order, as a partition's events always did. */
void kl__ready_push(kl__lane_t *lane, kl__slot_t *slot) {
  kl__slots_t *h = &lane->ready;
  kl__slots_push(h, slot);
  for (size_t i = h->n - 1; i > 0;) {
    size_t up = (i - 1) / 2;
    if (h->v[up]->offset <= h->v[i]->offset)
      break;
    heap_swap(h, up, i);
    i = up;
  }
}

static kl__slot_t *ready_pop(kl__lane_t *lane) {
  kl__slots_t *h = &lane->ready;
  kl__slot_t *top = h->v[0];
  h->v[0] = h->v[--h->n];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && h->v[l]->offset < h->v[m]->offset)
      m = l;
    if (r < h->n && h->v[r]->offset < h->v[m]->offset)
      m = r;
    if (m == i)
      break;
    heap_swap(h, i, m);
    i = m;
  }
  return top;
}

/* ---- keys -------------------------------------------------------------- */

/* The spare after @p k: spares are linked by their unused map node. */
static kl__lkey_t *spare_next(kl__lkey_t *k) {
  return k->node.next ? KL__HMAP_ENTRY(k->node.next, kl__lkey_t, node) : NULL;
}

/* Keeps @p k, unlinked, for reuse. */
static void key_keep(kl__lanes_t *lanes, kl__lkey_t *k) {
  k->node.next = lanes->spare_keys ? &lanes->spare_keys->node : NULL;
  lanes->spare_keys = k;
  lanes->nspare_keys++;
}

static kl__lkey_t *key_get(kl__lanes_t *lanes, kl__lane_t *lane,
                           const void *key, size_t len) {
  uint64_t h = kl__hash(key, len);
  for (kl__hnode_t *n = kl__hmap_first(&lane->keys, h); n;
       n = kl__hmap_next(n, h)) {
    kl__lkey_t *k = KL__HMAP_ENTRY(n, kl__lkey_t, node);
    if (k->len == len && memcmp(k->bytes, key, len) == 0)
      return k;
  }
  if (kl__hmap_reserve(&lane->keys, 1024))
    kl__oom(KL_COMP);
  kl__lkey_t *k = lanes->spare_keys;
  if (k && len <= KL__LKEY_SPARE_LEN) {
    lanes->spare_keys = spare_next(k);
    lanes->nspare_keys--;
    memset(k, 0, sizeof(*k));
  } else {
    size_t room = len <= KL__LKEY_SPARE_LEN ? KL__LKEY_SPARE_LEN : len;
    k = kl__xcalloc(1, sizeof(*k) + room, KL_COMP);
    lanes->nkeys += len <= KL__LKEY_SPARE_LEN;
  }
  k->len = len;
  if (len)
    memcpy(k->bytes, key, len);
  kl__hmap_link(&lane->keys, &k->node, h);
  if (len <= KL__LKEY_SPARE_LEN && ++lane->keys_live > lane->keys_peak) {
    lane->keys_peak++;
    lanes->keys_peaks++;
    while (lanes->nkeys < lanes->keys_peaks) {
      key_keep(lanes, kl__xcalloc(1, sizeof(*k) + KL__LKEY_SPARE_LEN, KL_COMP));
      lanes->nkeys++;
    }
  }
  return k;
}

/* Frees @p key once no slot of the window and no overlay entry needs it. */
void kl__key_maybe_free(kl__lanes_t *lanes, kl__lane_t *lane, kl__lkey_t *key) {
  if (key->refs || key->ov.entries)
    return;
  kl__hmap_unlink(&lane->keys, &key->node);
  if (key->len > KL__LKEY_SPARE_LEN) {
    free(key);
    return;
  }
  lane->keys_live--;
  if (lanes->nspare_keys >= lanes->window_max * lanes->nlanes) {
    free(key);
    lanes->nkeys--;
    return;
  }
  key_keep(lanes, key);
}

void kl__key_release(kl__lanes_t *lanes, kl__lane_t *lane, kl__lkey_t *key) {
  kl__ov_release_key(&lane->ov, &key->ov);
  kl__key_maybe_free(lanes, lane, key);
}

/* ---- the window -------------------------------------------------------- */

static void ring_push(kl__lane_t *lane, kl__slot_t *slot) {
  if (lane->ring_count == lane->ring_cap) {
    size_t old = lane->ring_cap;
    kl__slot_t **ring = kl__grow(lane->ring, &lane->ring_cap, lane->ring_count,
                                 sizeof(*ring), 256);
    if (!ring)
      kl__oom(KL_COMP);
    /* Full, it ran from ring_head to the end, then from 0: the part from 0
     * moves after the old end, so the slots run on from ring_head. */
    memcpy(ring + old, ring, lane->ring_head * sizeof(*ring));
    lane->ring = ring;
  }
  lane->ring[(lane->ring_head + lane->ring_count++) % lane->ring_cap] = slot;
}

kl__slot_t *kl__lane_at(const kl__lane_t *lane, size_t i) {
  return lane->ring[(lane->ring_head + i) % lane->ring_cap];
}

kl__slot_t *kl__lane_find(const kl__lane_t *lane, int64_t offset) {
  size_t lo = 0, hi = lane->ring_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    kl__slot_t *s = kl__lane_at(lane, mid);
    if (s->offset == offset)
      return s;
    if (s->offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

/* A slot per record: kept for reuse (kl__lanes_t.spare) instead of a
 * calloc and a free per event. */
static void slot_keep(kl__lanes_t *lanes, kl__slot_t *slot) {
  slot->next = lanes->spare;
  lanes->spare = slot;
  lanes->nspare++;
}

static kl__slot_t *slot_new(kl__lanes_t *lanes) {
  kl__slot_t *slot = lanes->spare;
  if (!slot) {
    lanes->nslots++;
    return kl__xcalloc(1, sizeof(*slot), KL_COMP);
  }
  lanes->spare = slot->next;
  lanes->nspare--;
  memset(slot, 0, sizeof(*slot));
  return slot;
}

static void slot_free(kl__lanes_t *lanes, kl__slot_t *slot) {
  rd_kafka_message_destroy(slot->msg);
  free(slot->id);
  free(slot->why);
  kl__emits_free(slot->emits);
  if (lanes->nspare >= lanes->window_max * lanes->nlanes) {
    free(slot);
    lanes->nslots--;
    return;
  }
  slot_keep(lanes, slot);
}

/* @p lane's window holds more slots than ever: the lanes make the slots of
 * all their peaks (kl__lanes_t.spare). */
static void lane_peak(kl__lanes_t *lanes, kl__lane_t *lane) {
  lane->ring_peak++;
  lanes->slots_peaks++;
  while (lanes->nslots < lanes->slots_peaks) {
    slot_keep(lanes, kl__xcalloc(1, sizeof(kl__slot_t), KL_COMP));
    lanes->nslots++;
  }
}

/* Removes the window's first slot, which must be committed. */
void kl__lane_pop(kl__lanes_t *lanes, kl__lane_t *lane) {
  kl__slot_t *slot = kl__lane_at(lane, 0);
  lane->ring_head = (lane->ring_head + 1) % lane->ring_cap;
  lane->ring_count--;
  kl__lkey_t *key = slot->key;
  key->refs--;
  slot_free(lanes, slot);
  if (!key->head)
    kl__key_release(lanes, lane, key);
}

void kl__lane_drop(kl__lanes_t *lanes, kl__lane_t *lane) {
  if (lane->inflight) /* its outcome first, onto the window it was built of */
    kl__lanes_settle(lanes);
  for (size_t i = 0; i < lane->ring_count; i++)
    slot_free(lanes, kl__lane_at(lane, i));
  lane->ring_count = lane->ring_head = 0;
  kl__ov_clear(&lane->ov);
  kl__hmap_iter_t it = KL__HMAP_ITER(&lane->keys);
  for (kl__hnode_t *n; (n = kl__hmap_iter_next(&it));)
    free(KL__HMAP_ENTRY(n, kl__lkey_t, node));
  kl__hmap_empty(&lane->keys);
  lanes->waiting_keys -= lane->waiting.n;
  lane->ready.n = lane->final.n = lane->waiting.n = lane->dlq.n = 0;
  lane->next_due_ns = 0;
  lane->fence_seen = lane->rewind = 0;
  lane->store_held = 0;
  if (lane->batch) {
    kl_store_abort(lane->batch);
    lane->batch = NULL;
  }
}

/* ---- pause and resume --------------------------------------------------- */

static void lane_pause_kafka(kl__lanes_t *lanes, kl__lane_t *lane, int pause) {
  if (!lanes->rk)
    return;
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, lanes->topic, lane->partition);
  if (pause)
    rd_kafka_pause_partitions(lanes->rk, l);
  else
    rd_kafka_resume_partitions(lanes->rk, l);
  rd_kafka_topic_partition_list_destroy(l);
}

void kl__lane_pause(kl__lanes_t *lanes, kl__lane_t *lane, unsigned reason) {
  if (lane->paused & reason)
    return;
  if (!lane->paused)
    lane_pause_kafka(lanes, lane, 1);
  lane->paused |= reason;
  if (reason == KL__PAUSE_WINDOW || reason == KL__PAUSE_WAITING)
    KL_LOG_I(KL_COMP, "paused partition=%" PRId32 ": %s", lane->partition,
             reason == KL__PAUSE_WINDOW
                 ? "its window is full (worker.window.max); it resumes below "
                   "half"
                 : "too many keys wait in backoff (worker.waiting.max); it "
                   "resumes below half");
}

void kl__lane_resume(kl__lanes_t *lanes, kl__lane_t *lane, unsigned reason) {
  if (!(lane->paused & reason))
    return;
  lane->paused &= ~reason;
  if (!lane->paused) {
    lane_pause_kafka(lanes, lane, 0);
    KL_LOG_I(KL_COMP, "resumed partition=%" PRId32, lane->partition);
  }
}

void kl__lane_wait_idle(kl__lanes_t *lanes, kl__lane_t *lane) {
  if (lane->inflight)
    kl__lanes_settle(lanes);
  while (lane->running)
    pthread_cond_wait(&lanes->idle, &lanes->mu);
}

/* ---- backoff ----------------------------------------------------------- */

static uint64_t lanes_mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/*
 * Exponential with "equal jitter": half the delay is fixed, half random,
 * so keys that failed together spread out, yet none retries before half
 * its delay. The randomness is a hash of the worker's seed and the event,
 * so a run can be reproduced and no RNG state is shared by threads.
 */
int64_t kl__backoff_ms(const kl__lanes_t *lanes, const kl__slot_t *slot,
                       int attempt) {
  int64_t d = lanes->retry_initial_ms;
  for (int i = 1; i < attempt && d < lanes->retry_max_ms; i++)
    d *= 2;
  if (d > lanes->retry_max_ms)
    d = lanes->retry_max_ms;
  uint64_t h =
      lanes_mix(lanes->seed ^ lanes_mix((uint64_t)slot->offset) ^
                ((uint64_t)attempt << 48) ^ (uint64_t)slot->msg->partition);
  return d - d / 2 + (int64_t)(h % (uint64_t)(d / 2 + 1));
}

/* ---- results ----------------------------------------------------------- */

/* Unlinks @p slot from its key's FIFO. It is the head, except after a
 * rewind put completed events back in front of a dead letter in flight. */
static void fifo_unlink(kl__slot_t *slot) {
  kl__lkey_t *key = slot->key;
  kl__slot_t *prev = NULL;
  for (kl__slot_t *s = key->head; s && s != slot; s = s->next)
    prev = s;
  if (prev)
    prev->next = slot->next;
  else
    key->head = slot->next;
  if (key->tail == slot)
    key->tail = prev;
  slot->next = NULL;
}

void kl__lane_finish(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                     kl__slot_state_t state) {
  kl__lkey_t *key = slot->key;
  int was_head = key->head == slot;
  slot->state = state;
  fifo_unlink(slot);
  if (!lane->final.n)
    lane->first_final_ns = kl__mono_ns();
  kl__slots_push(&lane->final, slot);
  if (was_head && key->head && key->head->state == KL__SLOT_QUEUED) {
    kl__ready_push(lane, key->head);
    pthread_cond_signal(&lanes->work);
  } else if (!key->head) {
    kl__key_release(lanes, lane, key); /* idle: stored writes may go */
  }
}

static void slot_why(kl__slot_t *slot, const char *why) {
  free(slot->why);
  slot->why = strdup(why ? why : "");
}

static void lanes_slot_failed(kl__slot_t *slot, const kl__run_t *run) {
  int64_t now = kl__now_ms();
  if (!slot->first_failure_ms)
    slot->first_failure_ms = now;
  slot->last_failure_ms = now;
  slot_why(slot, run->why);
  if (run->id && !slot->id && (slot->id = malloc(run->id_len)) != NULL) {
    memcpy(slot->id, run->id, run->id_len);
    slot->id_len = run->id_len;
  }
}

static void slot_wait(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                      int64_t delay_ms, int64_t now) {
  slot->state = KL__SLOT_WAITING;
  slot->due_ns = now + delay_ms * 1000000;
  if (!slot->wait_since_ns)
    slot->wait_since_ns = now;
  kl__slots_push(&lane->waiting, slot);
  lanes->waiting_keys++;
  if (!lane->next_due_ns || slot->due_ns < lane->next_due_ns)
    lane->next_due_ns = slot->due_ns;
}

/* Inline mode: the event's writes join the group transaction it ran on;
 * events run one at a time there, so an id applied earlier in the batch
 * was already seen through it. Key-parallel mode: they join the overlay,
 * unless an event of another key, run at the same time, applied the id
 * first: then this one is a duplicate too. */
static void done_ok(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                    const kl__run_t *run) {
  int dup = run->outcome == KL__RUN_DUPLICATE, lost = 0;
  lanes->runs_failing.n = 0; /* the store answered this one */
  if (!dup)
    slot->attempts++;
  /* A duplicate's writes go too: it has none but, for a firing record
   * whose id was applied or dead-lettered meanwhile, its timer's deletion
   * (worker/apply.c), without which the timer fired again every
   * KL__FIRE_AGAIN_MS, forever. */
  int merged = 1; /* its writes go into the group commit */
  if (lanes->inline_mode)
    lost = kl__child_apply(run->child) != KL_OK;
  else if ((dup || !(dup = kl__child_seen_elsewhere(run->child, &lane->ov))) &&
           kl__child_merge(run->child, &lane->ov, &slot->key->ov))
    kl__oom(KL_COMP);
  else if (dup && run->outcome != KL__RUN_DUPLICATE)
    merged = 0; /* applied by another run meanwhile: its writes dropped */
  slot->duplicate = dup;
  slot->scheduled = dup ? 0 : run->scheduled;
  slot->timers = merged ? (int)run->child->base.timers : 0;
  slot->fired_due = dup ? 0 : run->due_ms;
  if (run->early)
    lanes->timers_early++;
  slot->ts_ms = run->ts_ms;
  if (!dup) /* its follow-ups go with its writes into the group commit */
    slot->emits = kl__txn_take_emits(&run->child->base);
  kl__lane_finish(lanes, lane, slot, KL__SLOT_DONE);
  if (lost) /* the group txn holds part of the event: run them all again */
    lane->rewind = 1;
}

static void done_retry(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                       const kl__run_t *run) {
  slot->attempts++;
  lanes_slot_failed(slot, run);
  if (slot->attempts >= lanes->max_attempts)
    kl__lane_dead_letter(lanes, lane, slot, KL__DLQ_MAX_ATTEMPTS, run->why);
  else
    slot_wait(lanes, lane, slot, kl__backoff_ms(lanes, slot, slot->attempts),
              kl__mono_ns());
}

/* The store failed, not the event. In inline mode the whole lane waits
 * (hold_until_ns) with the event back first in line, so that no later
 * event of the partition commits before it: were the partition to move
 * then, its next owner would find those later ids applied above the
 * watermark and count them as duplicates (nothing applies twice, but a
 * store outage would read as re-publishes). Events run one at a time
 * there, so the next ones would fail the same way anyway; a group txn
 * whose link is lost is rolled back with the events it holds. Key-parallel
 * mode: the event alone waits, and later events of other keys run, but the
 * lane commits none of them until it ran (store_held): that one rule in
 * both modes keeps a partition that moves meanwhile exact. */
static void done_store(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                       const kl__run_t *run) {
  slot->store_errors++;
  slot->store_wait = 1;
  lane->store_held++;
  int64_t delay = kl__backoff_ms(lanes, slot, slot->store_errors);
  int64_t now = kl__mono_ns();
  char text[KL__ESCAPED_SIZE(512)]; /* a store's error may quote a key */
  KL_LOG_W(KL_COMP,
           "partition=%" PRId32 " offset=%" PRId64 " runs again in "
           "%" PRId64 " ms: %s",
           lane->partition, slot->offset, delay,
           kl__escape(text, sizeof(text), run->why,
                      run->why ? strlen(run->why) : 0));
  kl__failing_note(&lanes->runs_failing, text);
  if (!lanes->inline_mode) {
    slot_wait(lanes, lane, slot, delay, now);
    return;
  }
  slot->state = KL__SLOT_QUEUED;
  kl__ready_push(lane, slot);
  if (now + delay * 1000000 > lane->hold_until_ns)
    lane->hold_until_ns = now + delay * 1000000;
  if (lane->batch && kl__txn_lost(lane->batch))
    lane->rewind = 1; /* it can never commit: a new one, after the hold */
}

void kl__lanes_done(kl__lanes_t *lanes, const kl__job_t *job,
                    const kl__run_t *run) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = job->lane;
  kl__slot_t *slot = job->slot;
  lane->running--;
  if (lane->gen != job->lane_gen || lane->state == KL__LANE_FENCED) {
    slot->state = KL__SLOT_QUEUED; /* rolled back with the lane */
  } else {
    if (slot->store_wait) /* it ran again: what it held may commit */
      slot->store_wait = 0, lane->store_held--;
    switch (run->outcome) {
    case KL__RUN_APPLIED:
    case KL__RUN_DUPLICATE:
      done_ok(lanes, lane, slot, run);
      break;
    case KL__RUN_RETRY:
      done_retry(lanes, lane, slot, run);
      break;
    case KL__RUN_FAIL:
      slot->attempts++;
      lanes_slot_failed(slot, run);
      kl__lane_dead_letter(lanes, lane, slot, KL__DLQ_HANDLER_FAIL, run->why);
      break;
    case KL__RUN_DECODE:
      lanes_slot_failed(slot, run);
      kl__lane_dead_letter(lanes, lane, slot, KL__DLQ_DECODE, run->why);
      break;
    case KL__RUN_RESERVED:
      lanes_slot_failed(slot, run);
      kl__lane_dead_letter(lanes, lane, slot, KL__DLQ_RESERVED_ID, run->why);
      break;
    case KL__RUN_MISROUTED:
      kl__lane_misrouted(lanes, lane, slot, run);
      break;
    case KL__RUN_STORE:
      done_store(lanes, lane, slot, run);
      break;
    case KL__RUN_FENCED:
      slot->state = KL__SLOT_QUEUED;
      kl__ready_push(lane, slot);
      lane->fence_seen = 1; /* the poll thread rolls the lane back */
      break;
    }
  }
  if (!lane->running)
    pthread_cond_broadcast(&lanes->idle);
  pthread_mutex_unlock(&lanes->mu);
}

/* ---- taking records and events ----------------------------------------- */

/* A record below the lane's position was either applied already, or the
 * log went backwards under it (a recreated topic, a reset consumer): only
 * the log can tell, so it is noted for log_guard.c, never counted yet. */
static void lane_below(kl__lanes_t *lanes, kl__lane_t *lane, int64_t offset) {
  lanes->below_seen = 1;
  if (lane->below < 0 || offset < lane->below)
    lane->below = offset;
  if (offset < lane->watermark)
    lane->below_applied++;
}

static void lane_verify(kl__lanes_t *lanes, kl__lane_t *lane,
                        const rd_kafka_message_t *m);

void kl__lanes_push(kl__lanes_t *lanes, rd_kafka_message_t *m,
                    int64_t taken_ns) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane =
      m->partition < lanes->count ? lanes->lanes[m->partition] : NULL;
  if (lane && lane->verify_offset >= 0 && lane->state == KL__LANE_OWNED &&
      !(lane->paused & KL__PAUSE_LOG) && m->offset <= lane->verify_offset) {
    /* The record before the watermark, read to compare; or none (the log
     * no longer holds it: nothing to compare, and what comes next is
     * checked as any record is). */
    if (m->offset == lane->verify_offset)
      lane_verify(lanes, lane, m);
    pthread_mutex_unlock(&lanes->mu);
    rd_kafka_message_destroy(m);
    return;
  }
  if (lane && m->offset > lane->verify_offset)
    lane->verify_offset = -1;
  if (!lane || lane->state != KL__LANE_OWNED ||
      (lane->paused & KL__PAUSE_LOG) || m->offset < lane->next_offset) {
    if (lane && lane->state == KL__LANE_OWNED &&
        !(lane->paused & KL__PAUSE_LOG))
      lane_below(lanes, lane, m->offset);
    pthread_mutex_unlock(&lanes->mu);
    rd_kafka_message_destroy(m); /* fenced, not ours, halted, or below */
    return;
  }
  kl__slot_t *slot = slot_new(lanes);
  slot->msg = m;
  slot->offset = m->offset;
  slot->taken_ns = taken_ns;
  slot->key = key_get(lanes, lane, m->key, m->key ? m->key_len : 0);
  slot->key->refs++;
  ring_push(lane, slot);
  if (lane->ring_count > lane->ring_peak)
    lane_peak(lanes, lane);
  if (slot->key->tail)
    slot->key->tail->next = slot;
  else
    slot->key->head = slot;
  slot->key->tail = slot;
  if (slot->key->head == slot) {
    kl__ready_push(lane, slot);
    pthread_cond_signal(&lanes->work);
  }
  lane->next_offset = m->offset + 1;
  if (lane->ring_count >= lanes->window_max)
    kl__lane_pause(lanes, lane, KL__PAUSE_WINDOW);
  pthread_mutex_unlock(&lanes->mu);
}

/* The clock is read only for a lane held after a failed commit. */
int kl__lane_schedulable(const kl__lane_t *lane) {
  /* Test only (common/mutant.h): KL__MUTANT_FLIGHT runs a lane in flight. */
  return lane && lane->state == KL__LANE_OWNED && lane->ready.n &&
         !lane->fence_seen && !lane->rewind &&
         (!lane->inflight || KL__MUTANT(KL__MUTANT_FLIGHT)) &&
         (!lane->hold_until_ns || kl__mono_ns() >= lane->hold_until_ns);
}

static int take_one(kl__lanes_t *lanes, kl__job_t *job) {
  for (int32_t i = 0; i < lanes->count; i++) {
    int32_t p = (lanes->rr + i) % lanes->count;
    kl__lane_t *lane = lanes->lanes[p];
    if (!kl__lane_schedulable(lane))
      continue;
    kl__slot_t *slot = ready_pop(lane);
    slot->state = KL__SLOT_RUNNING;
    lane->running++;
    *job = (kl__job_t){lane,        slot,     lane->gen, lane->partition,
                       lane->epoch, slot->msg};
    /* Stay on a lane for up to a batch of events before the next lane's
     * turn: its group commit then holds a batch, not a sliver of one, and
     * a worker with many partitions does not fsync per handful. */
    lanes->turn = p == lanes->rr ? lanes->turn + 1 : 1;
    lanes->rr = p;
    if (lanes->turn >= lanes->batch_max) {
      lanes->rr = (p + 1) % lanes->count;
      lanes->turn = 0;
    }
    return 1;
  }
  return 0;
}

int kl__lanes_take(kl__lanes_t *lanes, kl__job_t *job, int wait) {
  pthread_mutex_lock(&lanes->mu);
  int got = 0;
  while (!lanes->stopping && !(got = take_one(lanes, job)) && wait)
    pthread_cond_wait(&lanes->work, &lanes->mu);
  pthread_mutex_unlock(&lanes->mu);
  return got;
}

int kl__lanes_has_ready(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  int any = 0;
  for (int32_t p = 0; p < lanes->count && !any; p++)
    any = kl__lane_schedulable(lanes->lanes[p]);
  pthread_mutex_unlock(&lanes->mu);
  return any;
}

void kl__lanes_stop(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  lanes->stopping = 1;
  pthread_cond_broadcast(&lanes->work);
  pthread_mutex_unlock(&lanes->mu);
}

/* ---- the tick ----------------------------------------------------------- */

/* Moves WAITING slots that are due back to the ready heap. */
static int lane_wake(kl__lanes_t *lanes, kl__lane_t *lane, int64_t now) {
  if (!lane->next_due_ns || now < lane->next_due_ns)
    return 0;
  int woke = 0;
  lane->next_due_ns = 0;
  for (size_t i = 0; i < lane->waiting.n;) {
    kl__slot_t *s = lane->waiting.v[i];
    if (s->due_ns <= now) {
      lane->waiting.v[i] = lane->waiting.v[--lane->waiting.n];
      lanes->waiting_keys--;
      s->state = KL__SLOT_QUEUED;
      if (s->key->head == s) { /* else it runs when its turn comes */
        kl__ready_push(lane, s);
        woke = 1;
      }
      continue;
    }
    if (!lane->next_due_ns || s->due_ns < lane->next_due_ns)
      lane->next_due_ns = s->due_ns;
    i++;
  }
  return woke;
}

int kl__lane_may_commit(const kl__lane_t *lane, int64_t now_ns) {
  return lane->final.n && now_ns >= lane->hold_until_ns && !lane->store_held &&
         !lane->inflight;
}

/* Inline mode: the group txn's session sits idle in its transaction
 * while handlers that run no SQL on it work, and the server ends it after
 * store.pg.idle.timeout (idle_ms) of that: however short each call, a
 * batch that gathers enough of them could never commit. So a batch ends
 * once its age plus the longest step seen reaches half of idle_ms; the
 * other half is the margin for a step longer than any seen yet (each one
 * is below idle_ms: kl_worker_new() refuses a handler timeout that is
 * not), the inline budget, and the commit's round trip. docs/design.md,
 * "A batch on PostgreSQL", says why this and not a later BEGIN. */
static int lane_batch_old(const kl__lanes_t *lanes, const kl__lane_t *lane,
                          int64_t now) {
  return lanes->idle_ms && lane->batch &&
         (now - lane->batch_ns) / 1000000 + lanes->step_max_ms >=
             lanes->idle_ms / 2;
}

static int lane_commit_due(const kl__lanes_t *lanes, const kl__lane_t *lane,
                           int64_t now) {
  return kl__lane_may_commit(lane, now) &&
         (lane->final.n >= lanes->batch_max ||
          now - lane->first_final_ns >= lanes->batch_wait_ns ||
          lane_batch_old(lanes, lane, now));
}

/* Before the group commit: fencing, rewinds, retries and holds that are
 * due. @returns nonzero when it made an event ready. */
static int lane_tick(kl__lanes_t *lanes, kl__lane_t *lane, int64_t now) {
  if (lane->fence_seen) {
    kl__lane_fenced(lanes, lane);
    return 0;
  }
  if (lane->rewind)
    kl__lane_rewind(lanes, lane);
  int woke = lane_wake(lanes, lane, now);
  if (lane->hold_until_ns && now >= lane->hold_until_ns) {
    lane->hold_until_ns = 0;
    woke = 1;
  }
  return woke;
}

/* After the group commit: the snapshot and the window bound. */
static void lane_settle(kl__lanes_t *lanes, kl__lane_t *lane) {
  /* A batch begun ahead (lanes_commit.c) is kept for the events it is for. */
  if (lane->batch && !lane->final.n && !lane->running &&
      !(kl__store_pending(lane->batch) && kl__lane_schedulable(lane))) {
    kl_store_abort(lane->batch); /* nothing to commit: let the snapshot go */
    lane->batch = NULL;
  }
  if (lane->ring_count < lanes->window_max / 2 + 1)
    kl__lane_resume(lanes, lane, KL__PAUSE_WINDOW);
}

/* Nothing can run until more records come: a batch waiting to fill would
 * only hold its events back, so it commits now. Under load some event is
 * always ready or running, and batches fill to worker.batch.max or wait
 * worker.batch.wait.ms, as before. */
static int lanes_idle(const kl__lanes_t *lanes) {
  for (int32_t p = 0; p < lanes->count; p++) {
    const kl__lane_t *lane = lanes->lanes[p];
    if (lane && (kl__lane_schedulable(lane) || lane->running))
      return 0;
  }
  return 1;
}

/* Every lane whose commit is due goes into one store commit: with many
 * partitions, one fsync for all of them instead of one each. */
static void lanes_commit_due(kl__lanes_t *lanes, int64_t now) {
  size_t n = 0;
  int all = lanes->commit_all, idle = all || lanes_idle(lanes);
  lanes->commit_all = 0;
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (lane && lane->state == KL__LANE_OWNED &&
        (idle ? kl__lane_may_commit(lane, now)
              : lane_commit_due(lanes, lane, now)))
      lanes->due[n++] = lane;
  }
  /* After a commit the store refused as busy (its map must grow, and
   * this thread's snapshots held it), commits are this thread's until one
   * succeeds: while the committer waited for the map, this thread would
   * open new snapshots. */
  if (n && lanes->inline_mode && !all && !lanes->commit_sync)
    kl__lanes_commit_async(lanes, lanes->due, n);
  else if (n)
    kl__lanes_commit(lanes, lanes->due, n);
}

static void lanes_bound_waiting(kl__lanes_t *lanes) {
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || lane->state != KL__LANE_OWNED)
      continue;
    if (lanes->waiting_keys >= lanes->waiting_max && lane->waiting.n)
      kl__lane_pause(lanes, lane, KL__PAUSE_WAITING);
    else if (lanes->waiting_keys < lanes->waiting_max / 2 + 1)
      kl__lane_resume(lanes, lane, KL__PAUSE_WAITING);
  }
}

static void lanes_gauges(kl__lanes_t *lanes, int64_t now) {
  uint64_t window = 0, paused = 0;
  int64_t oldest = 0;
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || lane->state != KL__LANE_OWNED)
      continue;
    window += lane->ring_count;
    paused += (lane->paused &
               (KL__PAUSE_WINDOW | KL__PAUSE_WAITING | KL__PAUSE_OUTBOX)) != 0;
    for (size_t i = 0; i < lane->waiting.n; i++)
      if (now - lane->waiting.v[i]->wait_since_ns > oldest)
        oldest = now - lane->waiting.v[i]->wait_since_ns;
  }
  lanes->window_events = window;
  lanes->paused_now = paused;
  lanes->waiting_now = lanes->waiting_keys;
  lanes->oldest_wait_ms = (uint64_t)(oldest / 1000000);
}

static void lanes_report(kl__lanes_t *lanes, int64_t now) {
  if (now - lanes->last_report_ns < KL_REPORT_NS)
    return;
  lanes->last_report_ns = now;
  uint64_t dead = lanes->dead_letters;
  if (!lanes->waiting_keys && dead == lanes->reported_dead_letters)
    return;
  lanes->reported_dead_letters = dead;
  KL_LOG_I(KL_COMP,
           "lanes: waiting_keys=%zu oldest_wait_ms=%" PRIu64
           " dead_letters=%" PRIu64 " window_events=%" PRIu64
           " paused_partitions=%" PRIu64,
           lanes->waiting_keys, (uint64_t)lanes->oldest_wait_ms, dead,
           (uint64_t)lanes->window_events, (uint64_t)lanes->paused_now);
}

/* A partition whose follow-ups wait for Kafka stops taking events that
 * would emit more. */
static void lanes_bound_outbox(kl__lanes_t *lanes) {
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || lane->state != KL__LANE_OWNED)
      continue;
    lane->outbox_held = kl__outbox_held(lanes->outbox, p);
    if (kl__outbox_full(lanes->outbox, p, 0))
      kl__lane_pause(lanes, lane, KL__PAUSE_OUTBOX);
    else if (!kl__outbox_full(lanes->outbox, p, 1))
      kl__lane_resume(lanes, lane, KL__PAUSE_OUTBOX);
  }
}

void kl__lanes_tick(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  kl__lanes_reap(lanes);            /* the commit the committer finished: its */
  pthread_mutex_unlock(&lanes->mu); /* follow-ups go out in this tick */
  kl__outbox_tick(lanes->outbox);   /* store and Kafka calls: not under mu */
  kl__fire_tick(lanes->fire);
  pthread_mutex_lock(&lanes->mu);
  int64_t now = kl__mono_ns();
  int woke = 0;
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (lane && lane->state == KL__LANE_OWNED)
      woke |= lane_tick(lanes, lane, now);
  }
  lanes_commit_due(lanes, now);
  kl__lanes_commit_kafka(lanes, now, 0);
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (lane && lane->state == KL__LANE_OWNED)
      lane_settle(lanes, lane);
  }
  kl__lanes_send_dead_letters(lanes, now);
  lanes_bound_waiting(lanes);
  lanes_bound_outbox(lanes);
  lanes_gauges(lanes, now);
  lanes_report(lanes, now);
  if (woke)
    pthread_cond_broadcast(&lanes->work);
  pthread_mutex_unlock(&lanes->mu);
}

/* ---- ownership and setup ------------------------------------------------ */

void kl__lanes_reserve(kl__lanes_t *lanes, int32_t count) {
  if (count <= lanes->count)
    return;
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t **v = kl__grow_zeroed(lanes->lanes, (size_t)lanes->count,
                                   (size_t)count, sizeof(*v));
  if (!v)
    kl__oom(KL_COMP);
  lanes->lanes = v;
  if (!(v = kl__grow_zeroed(lanes->due, (size_t)lanes->count, (size_t)count,
                            sizeof(*v))))
    kl__oom(KL_COMP);
  lanes->due = v;
  lanes->count = count;
  pthread_mutex_unlock(&lanes->mu);
}

void kl__lanes_own(kl__lanes_t *lanes, int32_t partition, uint64_t epoch,
                   int64_t watermark) {
  kl__lanes_reserve(lanes, partition + 1);
  pthread_mutex_lock(&lanes->mu); /* a commit in flight lands first */
  if (lanes->lanes[partition] && lanes->lanes[partition]->inflight)
    kl__lanes_settle(lanes);
  pthread_mutex_unlock(&lanes->mu);
  /* Its timers are counted before a commit of it can land (fire.h); the
   * walk reads the store, so not under mu. */
  if (lanes->fire)
    kl__fire_own(lanes->fire, partition);
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = lanes->lanes[partition];
  if (!lane) {
    lane = lanes->lanes[partition] = kl__xcalloc(1, sizeof(*lane), KL_COMP);
    lanes->nlanes++;
    lane->partition = partition;
    kl__ov_init(&lane->ov);
  }
  kl__lane_drop(lanes, lane); /* a lane fenced earlier still holds state */
  lane->state = KL__LANE_OWNED;
  lane->lost = 0;
  lane->epoch = epoch;
  lane->gen++;
  lane->watermark = lane->next_offset = watermark;
  lane->kafka_watermark = watermark; /* the worker commits it with the epoch */
  lane->paused = 0;
  lane->hold_until_ns = 0;
  lane->commit_backoff_ms = 0;
  lane->below = -1;
  lane->below_applied = 0;
  lane->verify_offset = -1;
  lane->replaced = 0;
  kl__outbox_own(lanes->outbox, partition, lane->gen); /* leftovers first */
  pthread_mutex_unlock(&lanes->mu);
}

void kl__lanes_verify(kl__lanes_t *lanes, int32_t partition, int64_t offset,
                      const char *ident, size_t len) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = partition < lanes->count ? lanes->lanes[partition] : NULL;
  char *copy = lane ? malloc(len) : NULL;
  if (copy) { /* without memory: not compared, as with an older store */
    memcpy(copy, ident, len);
    free(lane->verify_ident);
    lane->verify_ident = copy;
    lane->verify_len = len;
    lane->verify_offset = offset;
  }
  pthread_mutex_unlock(&lanes->mu);
}

int kl__lanes_replaced(kl__lanes_t *lanes, kl__lane_replaced_t *out) {
  int found = 0;
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; !found && p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || !lane->replaced || lane->state != KL__LANE_OWNED)
      continue;
    lane->replaced = 0;
    *out = (kl__lane_replaced_t){.partition = p,
                                 .epoch = lane->epoch,
                                 .offset = lane->verify_offset,
                                 .expected_len = lane->verify_len,
                                 .found_len = lane->found_len};
    memcpy(out->expected, lane->verify_ident, lane->verify_len);
    memcpy(out->found, lane->found_ident, lane->found_len);
    lane->verify_offset = -1;
    found = 1;
  }
  pthread_mutex_unlock(&lanes->mu);
  return found;
}

/* The record at the lane's verify_offset: the one the store applied there,
 * or the log was replaced, and the lane halts. mu held. */
static void lane_verify(kl__lanes_t *lanes, kl__lane_t *lane,
                        const rd_kafka_message_t *m) {
  char ident[KL__SID_MAX];
  size_t len = kl__apply_ident(lanes->applier.decoder, m, ident);
  if (len == lane->verify_len && memcmp(ident, lane->verify_ident, len) == 0) {
    lane->verify_offset = -1; /* the log the store applied */
    return;
  }
  char *copy = malloc(len);
  if (copy)
    memcpy(copy, ident, len);
  free(lane->found_ident);
  lane->found_ident = copy;
  lane->found_len = copy ? len : 0;
  lane->replaced = 1;
  kl__lane_pause(lanes, lane, KL__PAUSE_LOG);
}

/* ---- the log checks' part (log_guard.c) ------------------------------ */

static kl__lane_t *lane_owned(kl__lanes_t *lanes, int32_t partition) {
  kl__lane_t *lane = partition >= 0 && partition < lanes->count
                         ? lanes->lanes[partition]
                         : NULL;
  return lane && lane->state == KL__LANE_OWNED ? lane : NULL;
}

int kl__lanes_pos(kl__lanes_t *lanes, int32_t partition, kl__lane_pos_t *pos) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = lane_owned(lanes, partition);
  if (lane && lane->inflight) /* its watermark as committed */
    kl__lanes_settle(lanes);
  if (lane) {
    *pos =
        (kl__lane_pos_t){lane->epoch, lane->watermark,     lane->next_offset,
                         lane->below, lane->below_applied, lane->paused != 0};
    lane->below = -1;
    lane->below_applied = 0;
  }
  pthread_mutex_unlock(&lanes->mu);
  return lane ? 0 : -1;
}

size_t kl__lanes_below(kl__lanes_t *lanes, int32_t *out, size_t max) {
  size_t n = 0;
  if (!lanes->below_seen) /* the poll loop's common case: no lock */
    return 0;
  pthread_mutex_lock(&lanes->mu);
  lanes->below_seen = 0;
  for (int32_t p = 0; p < lanes->count; p++) {
    if (!lane_owned(lanes, p) || lanes->lanes[p]->below < 0)
      continue;
    if (n == max) {
      lanes->below_seen = 1; /* the rest at the next call */
      break;
    }
    out[n++] = p;
  }
  pthread_mutex_unlock(&lanes->mu);
  return n;
}

void kl__lanes_halt(kl__lanes_t *lanes, int32_t partition) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = lane_owned(lanes, partition);
  if (lane)
    kl__lane_pause(lanes, lane, KL__PAUSE_LOG);
  pthread_mutex_unlock(&lanes->mu);
}

void kl__lanes_go_on(kl__lanes_t *lanes, int32_t partition, int64_t from,
                     uint64_t redelivered) {
  pthread_mutex_lock(&lanes->mu);
  kl__lane_t *lane = lane_owned(lanes, partition);
  if (lane) {
    if (from > lane->next_offset)
      lane->next_offset = from;
    lane->below = -1;
    lane->below_applied = 0;
    lanes->redelivered += redelivered;
    kl__lane_resume(lanes, lane, KL__PAUSE_LOG);
  }
  pthread_mutex_unlock(&lanes->mu);
}

size_t kl__lanes_fenced(kl__lanes_t *lanes, int32_t *out, size_t max) {
  size_t n = 0;
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; p < lanes->count && n < max; p++)
    if (lanes->lanes[p] && lanes->lanes[p]->state == KL__LANE_FENCED)
      out[n++] = p;
  pthread_mutex_unlock(&lanes->mu);
  return n;
}

void kl__lanes_set_run_fault(kl__lanes_t *lanes, kl__run_fault_fn *fn,
                             void *opaque) {
  lanes->applier.run_fault = fn;
  lanes->applier.fault_opaque = opaque;
}

void kl__lanes_set_message_max(kl__lanes_t *lanes, size_t message_max,
                               const char *source) {
  lanes->applier.message_max = message_max;
  snprintf(lanes->applier.message_max_src,
           sizeof(lanes->applier.message_max_src), "%s", source);
}

void kl__lanes_set_before_commit(kl__lanes_t *lanes, kl__worker_hook_fn *fn,
                                 void *opaque) {
  lanes->applier.before_commit = fn;
  lanes->applier.hook_opaque = opaque;
}

/* Seconds, finer than kl__metrics_latency_buckets between 1 ms and 1 s,
 * where a p99 is read, and up to a minute for a worker catching up. */
const double kl__lanes_latency_buckets[] = {
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02,
    0.03,  0.05,  0.075, 0.1,   0.15,   0.2,  0.3,   0.5,
    0.75,  1,     2.5,   5,     10,     30,   60};
const size_t kl__lanes_latency_buckets_count =
    sizeof(kl__lanes_latency_buckets) / sizeof(kl__lanes_latency_buckets[0]);

/* A store commit: from a tenth of a millisecond (an fsync of a fast disk)
 * to the seconds a stalled disk can take. */
static const double kl_commit_buckets[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015,
    0.02,   0.03,    0.05,   0.075, 0.1,   0.2,   0.5,   1,      2.5,  10};
#define KL_COMMIT_BUCKETS                                                      \
  (sizeof(kl_commit_buckets) / sizeof(kl_commit_buckets[0]))

/* The latency histograms: registered once, observed at every commit. */
static kl_err_t lanes_metrics_new(kl__lanes_t *lanes) {
  const char *topic[] = {lanes->topic};
  if (!(lanes->metrics = kl__metrics_new()))
    return KL_ENOMEM;
  lanes->latency = kl__metric_series(
      kl__metrics_histogram(
          lanes->metrics, "keylane_worker_event_latency_seconds",
          "From the event's envelope ts (its producer's clock) to the store "
          "commit that applied it: publish to applied.",
          "topic", kl__lanes_latency_buckets, kl__lanes_latency_buckets_count),
      topic);
  lanes->commit_latency = kl__metric_series(
      kl__metrics_histogram(
          lanes->metrics, "keylane_worker_event_commit_latency_seconds",
          "From the worker taking the event from its Kafka consumer to the "
          "store commit that applied it: the time spent in keylane. Records "
          "taken in one go share one clock read per 256 (`worker/worker.c`), "
          "so an event's start may be a fraction of a millisecond early.",
          "topic", kl__lanes_latency_buckets, kl__lanes_latency_buckets_count),
      topic);
  lanes->store_commit = kl__metric_series(
      kl__metrics_histogram(
          lanes->metrics, "keylane_worker_store_commit_seconds",
          "How long each group commit's store write took (its fsyncs, "
          "per store.durability): the poll thread takes no record meanwhile.",
          "topic", kl_commit_buckets, KL_COMMIT_BUCKETS),
      topic);
  lanes->lateness = kl__metric_series(
      kl__metrics_histogram(
          lanes->metrics, "keylane_worker_timer_lateness_seconds",
          "From a fired timer's time (its event's not_before) to the store "
          "commit that ran it, by the store's clock.",
          "topic", kl__lanes_latency_buckets, kl__lanes_latency_buckets_count),
      topic);
  return lanes->latency && lanes->commit_latency && lanes->store_commit &&
                 lanes->lateness
             ? KL_OK
             : KL_ENOMEM;
}

struct kl__metrics *kl__lanes_metrics(kl__lanes_t *lanes) {
  return lanes->metrics;
}

uint64_t kl__lanes_kafka_commits(kl__lanes_t *lanes) {
  return lanes->kafka_commits;
}

uint64_t kl__lanes_ahead(kl__lanes_t *lanes) {
  return lanes->ahead;
}

void kl__lanes_set_after_commit(kl__lanes_t *lanes, kl__worker_hook_fn *fn,
                                void *opaque) {
  lanes->applier.after_commit = fn;
  lanes->applier.after_opaque = opaque;
}

kl_err_t kl__lanes_new(const kl_conf_t *conf, const kl__applier_t *applier,
                       rd_kafka_t *rk, kl__dlq_t *dlq, kl__lanes_t **out) {
  kl__lanes_t *lanes = calloc(1, sizeof(*lanes));
  if (!lanes)
    return KL_ENOMEM;
  pthread_mutex_init(&lanes->mu, NULL);
  pthread_cond_init(&lanes->work, NULL);
  pthread_cond_init(&lanes->idle, NULL);
  pthread_cond_init(&lanes->flight_cv, NULL);
  lanes->applier = *applier;
  lanes->store = applier->store;
  lanes->topic = applier->topic;
  lanes->rk = rk;
  lanes->dlq = dlq;
  lanes->inline_mode = kl__conf_int(conf, "worker.concurrency") <= 1;
  lanes->window_max = (size_t)kl__conf_int(conf, "worker.window.max");
  lanes->waiting_max = (size_t)kl__conf_int(conf, "worker.waiting.max");
  lanes->batch_max = (size_t)kl__conf_int(conf, "worker.batch.max");
  lanes->batch_wait_ns = kl__conf_int(conf, "worker.batch.wait.ms") * 1000000;
  lanes->retry_initial_ms = kl__conf_int(conf, "worker.retry.initial.ms");
  lanes->retry_max_ms = kl__conf_int(conf, "worker.retry.max.ms");
  if (lanes->retry_max_ms < lanes->retry_initial_ms)
    lanes->retry_max_ms = lanes->retry_initial_ms;
  lanes->max_attempts = (int)kl__conf_int(conf, "worker.max.attempts");
  lanes->idle_ms = kl__store_idle_ms(lanes->store);
  size_t txn_max = kl__store_txn_max(lanes->store);
  lanes->txn_max = txn_max > 2 ? txn_max - 1 : txn_max ? 1 : 0;
  lanes->seed = kl__fnv1a(applier->topic, strlen(applier->topic));
  lanes->last_report_ns = kl__mono_ns();
  if (lanes_metrics_new(lanes)) {
    kl__lanes_destroy(lanes);
    return KL_ENOMEM;
  }
  kl_err_t err =
      kl__outbox_new(conf, applier->topic, applier->store, dlq, &lanes->outbox);
  if (!err && dlq)
    err = kl__fire_new(lanes->applier.topic, applier->store, dlq, &lanes->fire);
  if (err) {
    kl__lanes_destroy(lanes);
    return err;
  }
  *out = lanes;
  return KL_OK;
}

void kl__lanes_destroy(kl__lanes_t *lanes) {
  if (!lanes)
    return;
  kl__lanes_flight_stop(lanes); /* its outcome applied: no lane in flight */
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane)
      continue;
    kl__lane_drop(lanes, lane);
    free(lane->ring);
    kl__hmap_free(&lane->keys);
    free(lane->verify_ident);
    free(lane->found_ident);
    free(lane->ready.v);
    free(lane->final.v);
    free(lane->waiting.v);
    free(lane->dlq.v);
    free(lane);
  }
  while (lanes->spare_keys) {
    kl__lkey_t *k = lanes->spare_keys;
    lanes->spare_keys = spare_next(k);
    free(k);
  }
  free(lanes->lanes);
  free(lanes->due);
  kl__outbox_destroy(lanes->outbox, KL_OUTBOX_DRAIN_MS);
  kl__fire_destroy(lanes->fire);
  while (lanes->spare) {
    kl__slot_t *next = lanes->spare->next;
    free(lanes->spare);
    lanes->spare = next;
  }
  kl__metrics_destroy(lanes->metrics);
  pthread_mutex_destroy(&lanes->mu);
  pthread_cond_destroy(&lanes->work);
  pthread_cond_destroy(&lanes->idle);
  pthread_cond_destroy(&lanes->flight_cv);
  free(lanes);
}

void kl__lanes_stats(const kl__lanes_t *lanes, kl_worker_stats_t *stats) {
  stats->applied = lanes->applied;
  stats->duplicates = lanes->duplicates;
  stats->redelivered = lanes->redelivered;
  stats->batches = lanes->batches;
  stats->fenced = lanes->fenced;
  stats->failed = lanes->failed;
  stats->dead_letters = lanes->dead_letters;
  stats->misrouted = lanes->misrouted_total;
  stats->forwarded = lanes->forwarded;
  stats->waiting_keys = lanes->waiting_now;
  stats->oldest_wait_ms = lanes->oldest_wait_ms;
  stats->window_events = lanes->window_events;
  stats->paused = (int32_t)lanes->paused_now;
  kl__outbox_stats_t ob;
  kl__outbox_stats(lanes->outbox, &ob);
  stats->outbox_pending = ob.pending;
  stats->outbox_published = ob.published;
  stats->outbox_aside = ob.aside;
  stats->outbox_kept = ob.kept;
  stats->outbox_stalled_ms = ob.stalled_ms;
  stats->timers_scheduled = lanes->timers_scheduled;
  stats->timers_fired = kl__fire_sent(lanes->fire);
  stats->timers_early = lanes->timers_early;
  stats->timers_pending = kl__fire_pending(lanes->fire);
  stats->timers_late = lanes->timers_late;
}
