/* Firing timers: worker/fire.h. */
#include "worker/fire.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "store/store_internal.h"
#include "store/timers.h"

#define KL_COMP "fire"

typedef struct kl_fire_part {
  int owned;
  uint64_t gen;    /* moves on own and drop: a tick's read of an old one
                      changes nothing */
  int64_t next_ms; /* read the due index then (the store's clock) */
  uint64_t soon;   /* kl__fire_soon() calls */
  int cursor;      /* records were written up to (cursor_due, cursor_h) */
  int64_t cursor_due, cursor_ms; /* ... since cursor_ms */
  uint64_t cursor_h;
  int64_t held_ns; /* KL__FIRE_AHEAD in flight: read again then (monotonic:
                      the store's clock may stand still, in tests) */
  int64_t pending; /* timers: counted at take, then kl__fire_count() */
  uint64_t taken;  /* kl__fire_count() calls that took timers */
} kl_fire_part_t;

struct kl__fire {
  const char *topic;
  kl_store_t *store;
  kl__dlq_t *dlq;
  pthread_mutex_t mu;
  kl_fire_part_t *parts;
  int32_t count;
  _Atomic uint64_t sent;
};

kl_err_t kl__fire_new(const char *topic, kl_store_t *store, kl__dlq_t *dlq,
                      kl__fire_t **out) {
  kl__fire_t *f = calloc(1, sizeof(*f));
  if (!f)
    return kl__err(KL_ENOMEM, "timers: out of memory");
  f->topic = topic;
  f->store = store;
  f->dlq = dlq;
  pthread_mutex_init(&f->mu, NULL);
  *out = f;
  return KL_OK;
}

void kl__fire_destroy(kl__fire_t *fire) {
  if (!fire)
    return;
  pthread_mutex_destroy(&fire->mu);
  free(fire->parts);
  free(fire);
}

static kl_fire_part_t *fire_part(kl__fire_t *f, int32_t partition) {
  if (partition < 0)
    return NULL;
  if (partition >= f->count) {
    kl_fire_part_t *v = kl__grow_zeroed(f->parts, (size_t)f->count,
                                        (size_t)partition + 1, sizeof(*v));
    if (!v)
      kl__oom(KL_COMP);
    f->parts = v;
    f->count = partition + 1;
  }
  return &f->parts[partition];
}

static void fire_set(kl__fire_t *f, int32_t partition, int owned,
                     int64_t pending) {
  pthread_mutex_lock(&f->mu);
  kl_fire_part_t *p = fire_part(f, partition);
  if (p) {
    uint64_t gen = p->gen + 1;
    *p = (kl_fire_part_t){.owned = owned, .gen = gen, .pending = pending};
  }
  pthread_mutex_unlock(&f->mu);
}

void kl__fire_own(kl__fire_t *fire, int32_t partition) {
  uint64_t n = 0;
  if (kl__timers_count(fire->store, fire->topic, partition, &n))
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": its pending timers could not be "
             "counted, the gauge counts from 0: %s",
             partition, kl_err_detail());
  fire_set(fire, partition, 1, (int64_t)n);
}

void kl__fire_drop(kl__fire_t *fire, int32_t partition) {
  fire_set(fire, partition, 0, 0);
}

void kl__fire_count(kl__fire_t *fire, int32_t partition, int64_t delta) {
  if (!fire)
    return;
  pthread_mutex_lock(&fire->mu);
  kl_fire_part_t *p = partition >= 0 && partition < fire->count
                          ? &fire->parts[partition]
                          : NULL;
  if (p && p->owned) {
    p->pending += delta;
    if (delta < 0) /* it took some: a held partition writes more */
      p->taken++, p->held_ns = 0;
  }
  pthread_mutex_unlock(&fire->mu);
}

uint64_t kl__fire_pending(kl__fire_t *fire) {
  int64_t n = 0;
  if (!fire)
    return 0;
  pthread_mutex_lock(&fire->mu);
  for (int32_t p = 0; p < fire->count; p++)
    if (fire->parts[p].owned && fire->parts[p].pending > 0)
      n += fire->parts[p].pending;
  pthread_mutex_unlock(&fire->mu);
  return (uint64_t)n;
}

void kl__fire_soon(kl__fire_t *fire, int32_t partition, int64_t due_ms) {
  if (!fire)
    return;
  pthread_mutex_lock(&fire->mu);
  if (partition >= 0 && partition < fire->count) {
    kl_fire_part_t *p = &fire->parts[partition];
    p->next_ms = 0;
    p->soon++;
    if (p->cursor && due_ms <= p->cursor_due)
      p->cursor = 0; /* below what was written: the next read writes it */
  }
  pthread_mutex_unlock(&fire->mu);
}

typedef struct kl_fire_scan {
  kl__fire_t *f;
  int32_t partition;
  kl_fire_part_t part; /* a copy, updated as records are written */
  int64_t now, next_due;
  int written, full;
  int ahead; /* records in flight: written, their timers still there */
  int held;  /* KL__FIRE_AHEAD of them: no more until they are taken */
} kl_fire_scan_t;

static int fire_after_cursor(const kl_fire_part_t *p, const kl__timer_t *t) {
  return !p->cursor || t->due_ms > p->cursor_due ||
         (t->due_ms == p->cursor_due && t->h > p->cursor_h);
}

static int fire_one(void *opaque, const kl__timer_t *t, const void *key,
                    size_t key_len, const void *env, size_t env_len) {
  kl_fire_scan_t *s = opaque;
  if (t->due_ms > s->now) {
    s->next_due = t->due_ms;
    return 1;
  }
  if (!fire_after_cursor(&s->part, t))
    return (s->held = ++s->ahead >= KL__FIRE_AHEAD); /* not read back yet */
  if (kl__dlq_timer(s->f->dlq, s->f->topic, s->partition, key, key_len, env,
                    env_len, t->offset)) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the due timer of offset %" PRId64
             " is written again at the next tick: %s",
             s->partition, t->offset, kl_err_detail());
    s->full = 1; /* the producer's queue: try again at the next tick */
    return 1;
  }
  if (!s->part.cursor)
    s->part.cursor_ms = s->now;
  s->part.cursor = 1;
  s->part.cursor_due = t->due_ms;
  s->part.cursor_h = t->h;
  s->full = ++s->written >= KL__FIRE_WINDOW;
  s->held = ++s->ahead >= KL__FIRE_AHEAD;
  return s->full || s->held;
}

static void fire_partition(kl__fire_t *f, int32_t partition, int64_t now) {
  pthread_mutex_lock(&f->mu);
  kl_fire_scan_t s = {f, partition, f->parts[partition], now, INT64_MAX, 0, 0,
                      0, 0};
  pthread_mutex_unlock(&f->mu);
  if (!s.part.owned || now < s.part.next_ms ||
      (s.part.held_ns && kl__mono_ns() < s.part.held_ns))
    return;
  s.part.held_ns = 0;
  if (s.part.cursor &&
      (now - s.part.cursor_ms >= KL__FIRE_AGAIN_MS || now < s.part.cursor_ms))
    s.part.cursor = 0; /* not read back, or the clock stepped back */
  size_t bad = 0;
  kl_err_t err =
      kl__timers_scan(f->store, f->topic, partition, fire_one, &s, &bad);
  if (err)
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": its due timers are read again in %d "
             "ms: %s",
             partition, KL__FIRE_POLL_MS, kl_err_detail());
  if (bad)
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": %zu timer records of the store are "
             "malformed and were skipped",
             partition, bad);
  int64_t next = s.next_due; /* INT64_MAX: none waits; a commit says so */
  if (err)
    next = now + KL__FIRE_POLL_MS;
  else if (s.held)
    next = now, s.part.held_ns = kl__mono_ns() + KL__FIRE_HELD_MS * 1000000;
  else if (s.full)
    next = now;
  else if (s.part.cursor && s.part.cursor_ms + KL__FIRE_AGAIN_MS < next)
    next = s.part.cursor_ms + KL__FIRE_AGAIN_MS; /* written again then */
  s.part.next_ms = next;
  pthread_mutex_lock(&f->mu);
  kl_fire_part_t *p = &f->parts[partition];
  if (p->gen == s.part.gen) {
    if (p->soon != s.part.soon) /* a commit wrote one meanwhile */
      s.part.next_ms = 0, s.part.soon = p->soon, s.part.cursor &= p->cursor;
    if (p->taken != s.part.taken) /* a commit took some meanwhile */
      s.part.held_ns = 0, s.part.taken = p->taken;
    s.part.pending = p->pending; /* kept by the commits, not the read */
    *p = s.part;
  }
  pthread_mutex_unlock(&f->mu);
}

void kl__fire_tick(kl__fire_t *fire) {
  if (!fire)
    return;
  int64_t now = kl__store_now_ms();
  pthread_mutex_lock(&fire->mu);
  int32_t count = fire->count;
  pthread_mutex_unlock(&fire->mu);
  for (int32_t p = 0; p < count; p++)
    fire_partition(fire, p, now);
}

void kl__fire_acked(kl__fire_t *fire, const kl__dlq_ref_t *ref, kl_err_t err) {
  if (!err)
    fire->sent++;
  else /* written again: the timer is still there once the cursor resets */
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the firing record of offset %" PRId64
             " was not acknowledged; it is written again",
             ref->partition, ref->offset);
}

uint64_t kl__fire_sent(const kl__fire_t *fire) {
  return fire ? fire->sent : 0;
}
