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

/* A firing record in flight: its timer's place in the due index, and when
 * (the store's clock) it was written. */
typedef struct kl_fire_flight {
  int64_t due_ms;
  uint64_t h;
  int64_t at_ms;
} kl_fire_flight_t;

typedef struct kl_fire_part {
  int owned;
  uint64_t gen;    /* moves on own and drop: a tick's read of an old one
                      changes nothing */
  int64_t next_ms; /* read the due index then (the store's clock) */
  uint64_t soon;   /* kl__fire_soon() calls */
  kl_fire_flight_t *flight; /* the records in flight, in index order (at
                               most KL__FIRE_AHEAD); NULL while a read
                               holds them */
  size_t nflight;
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
  for (int32_t p = 0; p < fire->count; p++)
    free(fire->parts[p].flight);
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
  if (p) { /* a new owner's records are its own: none in flight */
    uint64_t gen = p->gen + 1;
    free(p->flight);
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
    (void)due_ms; /* read at once: the read writes it if it is due, and
                     only it, not the records in flight before it */
    p->next_ms = 0;
    p->soon++;
  }
  pthread_mutex_unlock(&fire->mu);
}

typedef struct kl_fire_scan {
  kl__fire_t *f;
  int32_t partition;
  kl_fire_part_t part; /* a copy, its flight the read's until it ends */
  int64_t now, next_due;
  size_t seen;           /* of part.flight: walked past */
  kl_fire_flight_t *out; /* in flight after this read, in index order */
  size_t nout, cap;
  size_t inflight; /* out's, and part.flight's not walked past yet */
  int written, full;
  int held;    /* KL__FIRE_AHEAD in flight: no more until some are taken */
  int stopped; /* before the end of the index */
} kl_fire_scan_t;

/* @p f against @p t in the due index's order (store/timers.c: the due's
 * bytes, then h's). */
static int fire_cmp(const kl_fire_flight_t *f, const kl__timer_t *t) {
  if (f->due_ms != t->due_ms)
    return (uint64_t)f->due_ms < (uint64_t)t->due_ms ? -1 : 1;
  return f->h < t->h ? -1 : f->h > t->h;
}

/* Appends @p f to what is in flight after the read: at most as many as
 * were, and the ones it writes (fire_one() keeps that to KL__FIRE_AHEAD). */
static void fire_keep(kl_fire_scan_t *s, kl_fire_flight_t f) {
  if (!s->out) {
    s->cap = s->part.nflight + KL__FIRE_WINDOW;
    if (s->cap > KL__FIRE_AHEAD)
      s->cap = KL__FIRE_AHEAD;
    s->out = kl__xcalloc(s->cap, sizeof(*s->out), KL_COMP);
  }
  s->out[s->nout++] = f;
}

/* Walks the due index: a timer in flight is passed over, until it was
 * written KL__FIRE_AGAIN_MS ago; any other due one is written. */
static int fire_one(void *opaque, const kl__timer_t *t, const void *key,
                    size_t key_len, const void *env, size_t env_len) {
  kl_fire_scan_t *s = opaque;
  const kl_fire_flight_t *v = s->part.flight, *f = NULL;
  /* those before it are out of the index: a commit took their timers */
  while (s->seen < s->part.nflight && fire_cmp(&v[s->seen], t) < 0)
    s->seen++, s->inflight--;
  if (t->due_ms > s->now) {
    s->next_due = t->due_ms;
    return s->stopped = 1;
  }
  if (s->seen < s->part.nflight && fire_cmp(&v[s->seen], t) == 0)
    f = &v[s->seen++];
  if (f && s->now - f->at_ms < KL__FIRE_AGAIN_MS) { /* not read back yet */
    kl_fire_flight_t g = *f;
    if (g.at_ms > s->now) /* the clock stepped back: its record, stamped
                             later, still runs the timer */
      g.at_ms = s->now;
    fire_keep(s, g);
    return 0;
  }
  if (!f && s->inflight >= KL__FIRE_AHEAD)
    return s->held = s->stopped = 1;
  if (kl__dlq_timer(s->f->dlq, s->f->topic, s->partition, key, key_len, env,
                    env_len, t->offset)) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the due timer of offset %" PRId64
             " is written again at the next tick: %s",
             s->partition, t->offset, kl_err_detail());
    if (f) /* as it was: written again once its time is up */
      fire_keep(s, *f);
    s->full = 1; /* the producer's queue: try again at the next tick */
    return s->stopped = 1;
  }
  fire_keep(s, (kl_fire_flight_t){t->due_ms, t->h, s->now});
  s->inflight += !f;
  s->full = ++s->written >= KL__FIRE_WINDOW;
  return s->stopped = s->full;
}

/* Takes @p partition's records in flight for a read, when its read is due:
 * @returns 0 when it is not. */
static int fire_begin(kl__fire_t *f, kl_fire_scan_t *s) {
  pthread_mutex_lock(&f->mu);
  kl_fire_part_t *p = &f->parts[s->partition];
  int go = p->owned && s->now >= p->next_ms &&
           (!p->held_ns || kl__mono_ns() >= p->held_ns);
  if (go) {
    s->part = *p;
    s->inflight = p->nflight;
    p->flight = NULL, p->nflight = 0;
  }
  pthread_mutex_unlock(&f->mu);
  return go;
}

/* After a read: what is still in flight, and when to read again. */
static void fire_end(kl__fire_t *f, kl_fire_scan_t *s, kl_err_t err) {
  if (!err && !s->stopped) /* the whole index read: the rest were taken */
    s->seen = s->part.nflight;
  for (; s->seen < s->part.nflight; s->seen++)
    fire_keep(s, s->part.flight[s->seen]);
  free(s->part.flight);
  s->part.flight = s->out, s->part.nflight = s->nout;
  int64_t next = s->next_due; /* INT64_MAX: none waits; a commit says so */
  s->part.held_ns = 0;
  if (err)
    next = s->now + KL__FIRE_POLL_MS;
  else if (s->held)
    next = s->now, s->part.held_ns = kl__mono_ns() + KL__FIRE_HELD_MS * 1000000;
  else if (s->full)
    next = s->now;
  else
    for (size_t i = 0; i < s->nout; i++) /* written again then */
      if (s->out[i].at_ms + KL__FIRE_AGAIN_MS < next)
        next = s->out[i].at_ms + KL__FIRE_AGAIN_MS;
  s->part.next_ms = next;
  pthread_mutex_lock(&f->mu);
  kl_fire_part_t *p = &f->parts[s->partition];
  if (p->gen == s->part.gen) {
    if (p->soon != s->part.soon) /* a commit wrote one meanwhile */
      s->part.next_ms = 0, s->part.soon = p->soon;
    if (p->taken != s->part.taken) /* a commit took some meanwhile */
      s->part.held_ns = 0, s->part.taken = p->taken;
    s->part.pending = p->pending; /* kept by the commits, not the read */
    *p = s->part;
  } else { /* dropped or taken again meanwhile: its records are not ours */
    free(s->part.flight);
  }
  pthread_mutex_unlock(&f->mu);
}

static void fire_partition(kl__fire_t *f, int32_t partition, int64_t now) {
  kl_fire_scan_t s = {
      .f = f, .partition = partition, .now = now, .next_due = INT64_MAX};
  if (!fire_begin(f, &s))
    return;
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
  fire_end(f, &s, err);
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
  else /* written again: its timer is still there KL__FIRE_AGAIN_MS later */
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": the firing record of offset %" PRId64
             " was not acknowledged; it is written again",
             ref->partition, ref->offset);
}

uint64_t kl__fire_sent(const kl__fire_t *fire) {
  return fire ? fire->sent : 0;
}
