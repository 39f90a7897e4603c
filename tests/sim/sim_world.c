/*
 * The world of one schedule: its stores, keys, log and events, and the
 * model (sim_view_t) whose invariants every commit and every step are
 * checked against (sim.c lists them and says where each is checked).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/hash.h"
#include "common/strbuf.h"
#include "handlers/ledger.h"
#include "keylane/conf.h"
#include "sim/sim.h"
#include "store/timers.h"

sim_world_t *W;

void sim_fail(const char *code, const char *fmt, ...) {
  if (W->failed)
    return;
  W->failed = 1;
  W->fail_step = W->step;
  snprintf(W->fail_code, sizeof(W->fail_code), "%s", code);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(W->fail_msg, sizeof(W->fail_msg), fmt, ap);
  va_end(ap);
}

void sim_say(const char *fmt, ...) {
  if (!W->verbose)
    return;
  va_list ap;
  va_start(ap, fmt);
  printf("  step %5zu t=%6" PRId64 "ms  ", W->step + 1, W->now_ms);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

/* ---- stores -------------------------------------------------------------- */

kl_store_t *sim_store_open(const char *where) {
  kl_store_t *store = NULL;
  kl_err_t err = kl_store_open(where, W->conf, &store);
  if (err) {
    sim_fail("store-error", "cannot open the store %s: %s: %s", where,
             kl_err_name(err), kl_err_detail());
    return NULL;
  }
  return store;
}

/* The process's LMDB environments on /dev/shm, kept open across
 * schedules (each schedule's topic and keys are its own): opening one
 * costs as much as a few hundred steps. */
#define ENV_REUSE 64 /* schedules, then they are made afresh */

static struct {
  char dir[160];
  kl_store_t *store;
} envs[SIM_ENVS];
static unsigned env_runs;

kl_store_t *sim_lmdb_env(int slot) {
  if (!envs[slot].store) {
    snprintf(envs[slot].dir, sizeof(envs[slot].dir),
             "/dev/shm/keylane-sim-%d-%d", (int)getpid(), slot);
    envs[slot].store = sim_store_open(envs[slot].dir);
  }
  return envs[slot].store;
}

void sim_lmdb_envs_close(void) {
  for (int i = 0; i < SIM_ENVS; i++) {
    if (!envs[i].store)
      continue;
    kl_store_destroy(envs[i].store);
    envs[i].store = NULL;
    char path[256];
    snprintf(path, sizeof(path), "%.200s/data.mdb", envs[i].dir);
    unlink(path);
    snprintf(path, sizeof(path), "%.200s/lock.mdb", envs[i].dir);
    unlink(path);
    rmdir(envs[i].dir);
  }
  env_runs = 0;
}

void sim_lmdb_envs_tick(void) {
  if (++env_runs > ENV_REUSE)
    sim_lmdb_envs_close();
}

/* ---- events and the log -------------------------------------------------- */

static uint64_t event_hash(uint8_t key, const char *id, size_t id_len) {
  return kl__fnv1a_more(KL__FNV_SEED ^ key, id, id_len);
}

uint32_t sim_event_find(uint8_t key, const char *id, size_t id_len) {
  if (!W->hash_cap)
    return SIM_NONE;
  uint32_t e = W->hash[event_hash(key, id, id_len) & (W->hash_cap - 1)];
  for (; e != SIM_NONE; e = W->events[e].next)
    if (W->events[e].key == key && W->events[e].id_len == id_len &&
        memcmp(W->events[e].id, id, id_len) == 0)
      return e;
  return SIM_NONE;
}

static void hash_grow(void) {
  free(W->hash);
  W->hash_cap = W->hash_cap ? W->hash_cap * 2 : 1024;
  W->hash = malloc(W->hash_cap * sizeof(*W->hash));
  memset(W->hash, 0xff, W->hash_cap * sizeof(*W->hash));
  for (uint32_t e = 0; e < W->nevents; e++) {
    sim_event_t *ev = &W->events[e];
    uint32_t *slot =
        &W->hash[event_hash(ev->key, ev->id, ev->id_len) & (W->hash_cap - 1)];
    ev->next = *slot;
    *slot = e;
  }
}

static void view_grow(sim_view_t *v, size_t n) {
  if (n <= v->cap)
    return;
  size_t had = v->cap;
  v->marks = kl__reserve(v->marks, &v->cap, n, sizeof(*v->marks), 1024);
  memset(v->marks + had, 0, (v->cap - had) * sizeof(*v->marks));
}

uint32_t sim_event_add(uint8_t key, const char *id, size_t id_len) {
  W->events =
      kl__grow(W->events, &W->events_cap, W->nevents, sizeof(*W->events), 1024);
  uint32_t e = W->nevents++;
  sim_event_t *ev = &W->events[e];
  memset(ev, 0, sizeof(*ev));
  memcpy(ev->id, id, id_len);
  ev->id_len = (uint8_t)id_len;
  ev->key = key;
  ev->part = W->keys[key].part;
  ev->first = -1;
  ev->followup = SIM_NONE;
  ev->target = SIM_NONE;
  if (W->nevents * 2 > W->hash_cap)
    hash_grow();
  else {
    uint32_t *slot = &W->hash[event_hash(key, id, id_len) & (W->hash_cap - 1)];
    ev->next = *slot;
    *slot = e;
  }
  view_grow(&W->live, W->nevents);
  return e;
}

void sim_key_place(uint32_t e) {
  sim_event_t *ev = &W->events[e];
  sim_key_t *k = &W->keys[ev->key];
  if (ev->placed)
    return;
  k->events = kl__grow(k->events, &k->cap, k->n, sizeof(*k->events), 64);
  ev->key_pos = (uint32_t)k->n;
  k->events[k->n++] = e;
  ev->placed = 1;
}

int64_t sim_log_append_at(uint32_t e, void *bytes, size_t len, int64_t ts,
                          int64_t names) {
  sim_event_t *ev = &W->events[e];
  sim_key_t *k = &W->keys[ev->key];
  sim_log_t *log = &W->log[ev->part];
  log->v = kl__grow(log->v, &log->cap, log->n, sizeof(*log->v), 256);
  sim_rec_t *rec = calloc(1, sizeof(*rec));
  rec->event = e;
  rec->ts = ts;
  rec->names = names;
  if (names >= 0) { /* as worker/dlq.c writes it: the offset in decimal */
    char v[24];
    int n = snprintf(v, sizeof(v), "%" PRId64, names);
    rec->headers = rd_kafka_headers_new(1);
    rd_kafka_header_add(rec->headers, "keylane.timer", -1, v, n);
  }
  rec->msg.partition = sim_tpart(ev->part);
  rec->msg.offset = (int64_t)log->n;
  rec->msg.key = k->name;
  rec->msg.key_len = k->name_len;
  rec->msg.payload = bytes;
  rec->msg.len = len;
  rec->msg._private = sim_rec_private();
  log->v[log->n++] = rec;
  if (ev->first < 0) {
    ev->first = rec->msg.offset;
    if (!ev->not_before) /* a delayed one: at its first firing record */
      sim_key_place(e);
  }
  return rec->msg.offset;
}

int64_t sim_log_append(uint32_t e, void *bytes, size_t len) {
  return sim_log_append_at(e, bytes, len, sim_clock(), -1);
}

int sim_key_by_name(int topic, const void *name, size_t len) {
  for (int k = topic * W->cfg.keys; k < (topic + 1) * W->cfg.keys; k++)
    if (W->keys[k].name_len == len && memcmp(W->keys[k].name, name, len) == 0)
      return k;
  return -1;
}

/* ---- the model ----------------------------------------------------------- */

void sim_view_init(sim_view_t *v) {
  memset(v, 0, sizeof(*v));
  view_grow(v, W->nevents ? W->nevents : 1);
}

void sim_view_free(sim_view_t *v) {
  free(v->marks);
  memset(v, 0, sizeof(*v));
}

static const char *kind_name(int kind) {
  static const char *const names[] = {
      "credit",         "debit",  "transfer", "follow-up credit",
      "hostile credit", "cancel", "defer",    "delayed follow-up credit"};
  return names[kind];
}

/* "credit e12 of key k3 (partition 1, offset 40)" */
static const char *event_name(uint32_t e, char *buf, size_t size) {
  const sim_event_t *ev = &W->events[e];
  snprintf(buf, size,
           "%s %.*s of key %s (topic %s, partition %d, offset %" PRId64 "%s)",
           kind_name(ev->kind), (int)ev->id_len, ev->id, W->keys[ev->key].name,
           sim_topic(ev->part), (int)sim_tpart(ev->part), ev->first,
           ev->gone ? " of the log before" : "");
  return buf;
}

int sim_view_resolved(const sim_view_t *v, uint32_t e) {
  const sim_mark_t *m = &v->marks[e];
  return m->applied || m->dead || m->refused;
}

static void resolve(sim_view_t *v, int key) {
  const sim_key_t *k = &W->keys[key];
  while (v->resolved[key] < k->n) {
    /* a cancelled event's place holds no run: its firing records there
     * are duplicates */
    uint32_t e = k->events[v->resolved[key]];
    if (!sim_view_resolved(v, e) && !v->marks[e].cancelled)
      break;
    v->resolved[key]++;
  }
}

void sim_view_committed(sim_view_t *v, int32_t part, uint64_t epoch,
                        int64_t watermark) {
  if (epoch != v->epoch[part])
    sim_fail("stale-epoch",
             "a commit to partition %d with epoch %" PRIu64
             " succeeded while the store's epoch was %" PRIu64,
             (int)part, epoch, v->epoch[part]);
  if (watermark > v->watermark[part])
    v->watermark[part] = watermark;
}

static void apply_money(sim_view_t *v, const sim_event_t *ev) {
  int t = sim_key_topic(ev->key);
  v->shared[ev->key % W->cfg.keys]++;
  switch (ev->kind) {
  case SIM_CREDIT:
  case SIM_HOSTILE: /* money from outside, as a client's credit */
    v->credits[t] += ev->amount, v->balance[ev->key] += ev->amount;
    break;
  case SIM_DEBIT:
    v->debits[t] += ev->amount, v->balance[ev->key] -= ev->amount;
    break;
  case SIM_TRANSFER:
    v->transfers[t] += ev->amount, v->balance[ev->key] -= ev->amount;
    break;
  case SIM_CANCEL: /* no money: sim_timers.c */
  case SIM_DEFER:
    break;
  case SIM_DEFERRED: /* a client's credit, later */
    v->credits[t] += ev->amount, v->balance[ev->key] += ev->amount;
    break;
  default:
    v->followups[t] += ev->amount, v->balance[ev->key] += ev->amount;
  }
}

/* Nonzero when @p r is a firing record of the timer @p v holds for @p e. */
static int names_timer(const sim_view_t *v, uint32_t e, const sim_rec_t *r) {
  return v->marks[e].timer && r->names == v->marks[e].timer - 1;
}

/* The record at @p offset of @p part, a record of @p e, was dead-lettered
 * (its mark is set): its event is settled there. The dead letter of a
 * firing record of its waiting timer takes the timer in the same commit
 * (kl__apply_dead_letter()), in the live store and a rebuild alike, so
 * that the record read again (a replay, a batch run again) finds none;
 * before, it took the timer there, where a rebuild kept it. */
static void dead_one(sim_view_t *v, uint32_t e, int32_t part, int64_t offset) {
  if (names_timer(v, e, W->log[part].v[offset]))
    v->marks[e].timer = 0;
  resolve(v, W->events[e].key);
}

/* Delayed event @p e runs at @p offset (docs/design.md, "Timers"): only a
 * firing record of its timer runs it, stamped at or after its time, and
 * the run takes the timer; a redrive runs it whatever its time. */
static void timer_run(sim_view_t *v, uint32_t e, int64_t offset, int redrive) {
  const sim_event_t *ev = &W->events[e];
  const sim_rec_t *r = W->log[ev->part].v[offset];
  char a[256];
  if (!redrive && !names_timer(v, e, r))
    sim_fail("timer-run",
             "%s ran at offset %" PRId64 ", which is no firing record of its "
             "timer (%s)",
             event_name(e, a, sizeof(a)), offset,
             v->marks[e].timer ? "it names another offset" : "none waits");
  else if (!redrive && r->ts < ev->not_before)
    sim_fail("timer-early",
             "%s ran at offset %" PRId64 ", a firing record stamped %" PRId64
             " ms before its time",
             event_name(e, a, sizeof(a)), offset, ev->not_before - r->ts);
  v->marks[e].timer = 0;
  W->stats.timers_run += v == &W->live && !redrive;
}

/* Delayed event @p e's record at @p offset of @p part scheduled it: its
 * first reading, no firing record, nothing decided of it yet. */
static void timer_schedule(sim_view_t *v, uint32_t e, int32_t part,
                           int64_t offset) {
  const sim_event_t *ev = &W->events[e];
  const sim_rec_t *r = W->log[part].v[offset];
  char a[256];
  if (!ev->not_before || r->names >= 0 || v->marks[e].timer ||
      sim_view_resolved(v, e))
    sim_fail("timer-scheduled",
             "%s was scheduled as a timer at offset %" PRId64 ", though %s",
             event_name(e, a, sizeof(a)), offset,
             !ev->not_before     ? "it has no time"
             : r->names >= 0     ? "that is a firing record"
             : v->marks[e].timer ? "its timer waits already"
                                 : "it was applied or dead-lettered");
  /* A cancel leaves the id its timer's mark: any record of the event
   * read after it, a copy or one from before the cancel read again
   * (above the watermark: the batch run again after a lost answer, or by
   * the next owner when the key's lane committed past another key's
   * wait), is a duplicate, as in a rebuild, which reads each record once. */
  if (v->marks[e].cancelled)
    sim_fail("cancel-undone",
             "%s: its record at offset %" PRId64 " scheduled it again after "
             "its cancel at offset %" PRId64,
             event_name(e, a, sizeof(a)), offset, v->marks[e].cancelled - 1);
  v->marks[e].timer = offset + 1;
  W->stats.scheduled += v == &W->live;
}

static void check_skipped(const sim_view_t *v, uint32_t e, int64_t offset);

/* Cancel @p c ran in @p v (sim_timers.c): its handler's kl_txn_cancel()
 * of its target's timer answered @p seen. It takes the timer when one
 * waits there, in @p v's order of the key's records (docs/design.md,
 * "Cancelling"); else KL_ENOTFOUND: its timer ran, was cancelled, or there
 * never was one. */
void sim_view_cancel(sim_view_t *v, uint32_t c, int64_t offset, int seen) {
  const sim_event_t *ev = &W->events[c];
  uint32_t t = ev->target;
  int waits = t != SIM_NONE && v->marks[t].timer;
  char a[256], b[256];
  if (seen != (waits ? KL_OK : KL_ENOTFOUND))
    sim_fail("cancel", "%s: kl_txn_cancel() of %s answered %s; the model: %s",
             event_name(c, a, sizeof(a)),
             t == SIM_NONE ? "an id no event has" : event_name(t, b, sizeof(b)),
             seen < 0 ? "nothing (no run seen)" : kl_err_name((kl_err_t)seen),
             waits ? "its timer waits: KL_OK" : "none waits: KL_ENOTFOUND");
  W->stats.cancels += v == &W->live;
  if (v == &W->live)
    sim_say("cancel %.*s %s", (int)ev->id_len, ev->id,
            waits ? "takes its timer" : "finds no timer");
  if (!waits)
    return;
  v->marks[t].cancelled = offset + 1;
  v->marks[t].timer = 0;
  W->stats.cancelled += v == &W->live;
  resolve(v, W->events[t].key);
}

/* A committed record of @p e at @p offset of @p part that ran nothing. A
 * firing record of a timer whose id was settled meanwhile takes it; one
 * of a timer still waiting must be early; a copy of a waiting event is a
 * duplicate. */
static void skip_one(sim_view_t *v, uint32_t e, int32_t part, int64_t offset) {
  const sim_event_t *ev = &W->events[e];
  const sim_rec_t *r = W->log[part].v[offset];
  char a[256];
  if (names_timer(v, e, r) && sim_view_resolved(v, e)) {
    /* its id was applied or dead-lettered by another record meanwhile
     * (a redrive): the timer goes. Its own firing record's dead letter
     * took it already (dead_one()), so that one read again finds none. */
    v->marks[e].timer = 0;
    return;
  }
  if (names_timer(v, e, r) && r->ts >= ev->not_before)
    sim_fail("timer-skipped",
             "%s: its firing record at offset %" PRId64 ", stamped %" PRId64
             " ms after its time, was skipped as a duplicate",
             event_name(e, a, sizeof(a)), offset, r->ts - ev->not_before);
  W->stats.early += v == &W->live && names_timer(v, e, r);
  check_skipped(v, e, offset);
}

void sim_view_skipped(sim_view_t *v, int32_t part, int64_t offset) {
  const sim_rec_t *r = W->log[part].v[offset];
  uint32_t e = r->event;
  /* a record of a cancelled event is a duplicate: its id keeps the
   * timer's mark */
  if (W->events[e].not_before && r->names < 0 && !v->marks[e].timer &&
      !v->marks[e].cancelled && !sim_view_resolved(v, e))
    timer_schedule(v, e, part, offset);
  else
    skip_one(v, e, part, offset);
}

static void apply_one(sim_view_t *v, uint32_t e, int64_t offset, int redrive,
                      int cancel) {
  sim_event_t *ev = &W->events[e];
  sim_mark_t *m = &v->marks[e];
  char a[256], b[256];
  if (m->applied)
    sim_fail("twice", "%s was applied twice: again at offset %" PRId64 "%s",
             event_name(e, a, sizeof(a)), offset,
             redrive ? " by a redrive" : "");
  if (redrive && !m->dead)
    sim_fail("redrive", "a redrive applied %s, which is no dead letter",
             event_name(e, a, sizeof(a)));
  if (!redrive && (m->dead || m->refused))
    sim_fail("dead-applied",
             "%s was applied after it was recorded a dead letter, and not "
             "by a redrive",
             event_name(e, a, sizeof(a)));
  if (ev->not_before)
    timer_run(v, e, offset, redrive);
  if (!redrive && ev->placed && v->resolved[ev->key] < ev->key_pos)
    sim_fail("order",
             "%s was applied before %s, which is earlier in the log and "
             "was neither applied nor dead-lettered",
             event_name(e, a, sizeof(a)),
             event_name(W->keys[ev->key].events[v->resolved[ev->key]], b,
                        sizeof(b)));
  m->applied++;
  m->redriven |= (uint8_t)redrive;
  apply_money(v, ev);
  resolve(v, ev->key);
  if (ev->kind == SIM_CANCEL)
    sim_view_cancel(v, e, offset, cancel);
  W->stats.deferred += v == &W->live && ev->kind == SIM_DEFERRED && !redrive;
}

/* A record of a committed batch that its handler did not apply was
 * skipped: its id was seen. Only its own event's decision may make it so;
 * an event neither applied nor dead-lettered was suppressed by another
 * record with its id (a hostile one, say): lost. A redrive's record is a
 * duplicate of its letter's own record. */
static void check_skipped(const sim_view_t *v, uint32_t e, int64_t offset) {
  const sim_event_t *ev = &W->events[e];
  if (sim_view_resolved(v, e) || v->marks[e].timer) /* or it waits */
    return;
  /* any record of a cancelled event: its id keeps the timer's mark */
  if (v->marks[e].cancelled)
    return;
  uint32_t by = SIM_NONE;
  for (uint32_t o = 0; o < W->nevents && by == SIM_NONE; o++)
    if (o != e && W->events[o].key == ev->key &&
        W->events[o].id_len == ev->id_len &&
        memcmp(W->events[o].id, ev->id, ev->id_len) == 0 && v->marks[o].applied)
      by = o;
  char a[256], b[256];
  if (by == SIM_NONE)
    snprintf(b, sizeof(b), "no other event has its id");
  else
    event_name(by, b, sizeof(b));
  sim_fail("suppressed",
           "%s was skipped at offset %" PRId64
           " as a duplicate, though it was never applied or dead-lettered; "
           "applied with its id: %s",
           event_name(e, a, sizeof(a)), offset, b);
}

void sim_view_commit(sim_batch_t *b) {
  sim_view_committed(b->view, b->part, b->epoch, b->res.next);
  b->view->applied[b->part] += b->napps;
  b->view->duplicates[b->part] += b->res.duplicates;
  size_t a = 0;
  for (size_t i = 0; i < b->count; i++) {
    const rd_kafka_message_t *m = b->msgs[i];
    if (m->offset < b->from || m->offset >= b->res.next)
      continue;
    if (a < b->napps && b->apps[a].offset == m->offset) {
      apply_one(b->view, b->apps[a].event, m->offset, b->redrive,
                b->apps[a].cancel);
      a++;
    } else if (!b->redrive) {
      sim_view_skipped(b->view, b->part, m->offset);
    } else { /* a redrive takes the timer of its record's id */
      b->view->marks[W->log[b->part].v[m->offset]->event].timer = 0;
    }
  }
  for (; a < b->napps; a++) /* none: apps are the batch's, in its order */
    apply_one(b->view, b->apps[a].event, b->apps[a].offset, b->redrive,
              b->apps[a].cancel);
}

void sim_view_commit_lane(sim_view_t *v, const sim_pend_t *pd,
                          int64_t watermark) {
  int32_t part = pd->part;
  int64_t below = v->watermark[part];
  sim_view_committed(v, part, pd->epoch, watermark);
  for (size_t i = 0; i < pd->n; i++) {
    const sim_done_t *d = &pd->v[i];
    uint32_t e = W->log[part].v[d->offset]->event;
    if (d->what == SIM_DONE_APPLIED) {
      apply_one(v, e, d->offset, 0, d->cancel);
      v->applied[part]++;
      W->stats.applied++;
    } else if (d->what == SIM_DONE_SCHEDULED) {
      timer_schedule(v, e, part, d->offset);
    } else if (d->what == SIM_DONE_DUP) {
      skip_one(v, e, part, d->offset);
      v->duplicates[part]++;
      W->stats.duplicates++;
    } else if (!sim_view_resolved(v, e)) {
      /* The worker marks a dead letter's id, unless it refused the id
       * (a reserved one that is no follow-up's): then it marks nothing. */
      int marks = W->events[e].kind != SIM_HOSTILE || W->events[e].valid;
      v->dead[part] += (uint64_t)marks;
      v->marks[e].dead = (uint8_t)marks;
      v->marks[e].refused = (uint8_t)!marks;
      dead_one(v, e, part, d->offset);
    }
  }
  /* Nothing below the watermark waits: every record there was applied or
   * dead-lettered, or is a duplicate of one that was. */
  char a[256];
  for (int64_t off = below; off < watermark && !W->failed; off++) {
    uint32_t e = W->log[part].v[off]->event;
    if (!sim_view_resolved(v, e) && !v->marks[e].timer &&
        !v->marks[e].cancelled)
      sim_fail("watermark-past",
               "a commit of partition %d moved its watermark to %" PRId64
               ", past offset %" PRId64 " (%s), neither applied nor "
               "dead-lettered",
               (int)part, watermark, off, event_name(e, a, sizeof(a)));
  }
}

void sim_view_dead(sim_view_t *v, uint32_t e, int32_t part, uint64_t epoch,
                   int64_t watermark) {
  sim_view_committed(v, part, epoch, watermark);
  v->dead[part]++;
  v->marks[e].dead = 1;
  dead_one(v, e, part, watermark - 1);
}

void sim_view_check_mark(const sim_view_t *v, uint32_t e, kl_mark_t mark,
                         const char *who) {
  const sim_mark_t *m = &v->marks[e];
  kl_mark_t want = m->applied ? KL_MARK_APPLIED
                   : m->dead  ? KL_MARK_DEAD_LETTER
                              : KL_MARK_NONE;
  char a[256];
  if (mark != want)
    sim_fail("mark", "%s: the store's mark of %s is %d, the model's %d", who,
             event_name(e, a, sizeof(a)), (int)mark, (int)want);
}

void sim_view_acquired(sim_view_t *v, int32_t part,
                       const kl_partition_state_t *st, int adopt) {
  if (st->epoch <= W->max_epoch[part])
    sim_fail("epoch-back",
             "an acquire of partition %d gave epoch %" PRIu64
             ", not above %" PRIu64 ", the highest taken before",
             (int)part, st->epoch, W->max_epoch[part]);
  if (st->watermark != v->watermark[part])
    sim_fail("watermark",
             "partition %d's watermark is %" PRId64 ", the model's %" PRId64,
             (int)part, st->watermark, v->watermark[part]);
  v->epoch[part] = st->epoch;
  if (adopt)
    W->max_epoch[part] = st->epoch;
}

void sim_view_reset(sim_view_t *v, int32_t part,
                    const kl_partition_state_t *st) {
  if (st->epoch <= W->max_epoch[part] || st->watermark != 0)
    sim_fail("reset",
             "a store reset of partition %d gave epoch %" PRIu64
             " and watermark %" PRId64 ", not an epoch above %" PRIu64
             " and watermark 0",
             (int)part, st->epoch, st->watermark, W->max_epoch[part]);
  v->epoch[part] = W->max_epoch[part] = st->epoch;
  v->watermark[part] = 0;
}

typedef struct scan_ctx {
  int64_t *out;
  int topic;
  size_t prefix_len;
  int bad;
} scan_ctx_t;

static int scan_cb(void *opaque, const void *key, size_t key_len,
                   const void *val, size_t val_len) {
  scan_ctx_t *c = opaque;
  kl_ledger_entry_t entry;
  int k = sim_key_by_name(c->topic, (const char *)key + c->prefix_len,
                          key_len - c->prefix_len);
  if (k < 0 || kl__ledger_decode(val, val_len, &entry)) {
    c->bad = 1;
    return 1;
  }
  c->out[k] = entry.balance;
  return 0;
}

int sim_balances(kl_store_t *store, int64_t out[SIM_MAXK]) {
  memset(out, 0, SIM_MAXK * sizeof(*out));
  for (int t = 0; t < W->ntopics; t++) {
    char prefix[256];
    int n = snprintf(prefix, sizeof(prefix), KL_LEDGER_PREFIX "%s/%s",
                     W->topics[t], W->tag); /* the topic's entries */
    scan_ctx_t c = {out, t, sizeof(KL_LEDGER_PREFIX) + strlen(W->topics[t]), 0};
    kl_err_t err = kl_store_scan(store, prefix, (size_t)n, scan_cb, &c);
    if (err || c.bad) {
      sim_fail("store-error", "reading the balances of topic %s: %s",
               W->topics[t],
               err ? kl_err_detail() : "a ledger entry of no known key");
      return -1;
    }
  }
  return 0;
}

/* ---- a row both topics write --------------------------------------------
 *
 * The topics' handlers keep their state per topic (the ledger's entries
 * are `ledger:TOPIC/KEY`), so that no row has two writers. With W->shared
 * (two topics on PostgreSQL) each applied event also counts itself in one
 * row per key name, which both topics write: the state of a handler that
 * does not scope by topic, as the ledger's did before issue 39. The key's
 * two writers are owners of two topics, each with an owner cache of its
 * own, that trusts it is the row's only writer: the commit must find the
 * other writer (a put over a key the cache knows stored is an UPDATE on
 * the condition that the row still holds what it knows, one over a key it
 * knows absent an INSERT; the mutant `update` drops both), so that a broken
 * rule costs a retry and never a count: the row equals the model's shared[] at
 * every step. LMDB has no such check (a batch reads a snapshot and writes at
 * its commit), so the rule stays the handler's there, and the row is not
 * written. */

#define SHARED_PREFIX "simshared/"

static size_t shared_key(const void *name, size_t len, unsigned char *out) {
  memcpy(out, SHARED_PREFIX, sizeof(SHARED_PREFIX) - 1);
  memcpy(out + sizeof(SHARED_PREFIX) - 1, name, len);
  return sizeof(SHARED_PREFIX) - 1 + len;
}

kl_handler_result_t sim_shared_count(kl_txn_t *txn, const kl_event_t *event,
                                     kl_handler_result_t r, char *errbuf,
                                     size_t errbuf_size) {
  if (!W->shared || r != KL_HANDLER_OK)
    return r;
  unsigned char key[sizeof(SHARED_PREFIX) + sizeof(W->keys[0].name)];
  size_t klen = shared_key(event->key, event->key_len, key);
  const void *val;
  size_t len;
  uint64_t n = 0;
  kl_err_t err = kl_txn_get(txn, key, klen, &val, &len);
  if (!err)
    n = kl__get_be(val, len < 8 ? len : 8);
  if (!err || err == KL_ENOTFOUND) {
    unsigned char v[8];
    kl__put_be(v, n + 1, 8);
    err = kl_txn_put(txn, key, klen, v, sizeof(v));
  }
  if (!err)
    return r;
  snprintf(errbuf, errbuf_size, "sim: the shared count: %s", kl_err_detail());
  return KL_HANDLER_RETRY;
}

static int shared_cb(void *opaque, const void *key, size_t key_len,
                     const void *val, size_t val_len) {
  int64_t *out = opaque;
  size_t plen = sizeof(SHARED_PREFIX) - 1;
  int k = sim_key_by_name(0, (const char *)key + plen, key_len - plen);
  if (k < 0 || val_len != 8)
    return 1;
  out[k] = (int64_t)kl__get_be(val, 8);
  return 0;
}

static void check_shared(const sim_view_t *v, kl_store_t *store) {
  int64_t n[SIM_TOPIC_K] = {0};
  char prefix[96];
  int plen = snprintf(prefix, sizeof(prefix), SHARED_PREFIX "%s", W->tag);
  kl_err_t err = kl_store_scan(store, prefix, (size_t)plen, shared_cb, n);
  if (err)
    sim_fail("store-error", "reading the shared counts: %s", kl_err_detail());
  for (int k = 0; k < W->cfg.keys && !err; k++)
    if (n[k] != v->shared[k])
      sim_fail("shared",
               "key %s's count, a row both topics write, is %" PRId64
               " in the store, %" PRId64
               " by the events the model saw committed on either topic: an "
               "update of one topic's owner was lost",
               W->keys[k].name, n[k], v->shared[k]);
}

/* ---- timers ---------------------------------------------------------------
 */

typedef struct timers_ctx {
  const sim_view_t *v;
  int topic;
  kl_decoder_t *decoder;
  size_t n;
  const char *who;
} timers_ctx_t;

static int timer_cb(void *opaque, const kl__timer_t *t, const void *key,
                    size_t key_len, const void *env, size_t env_len) {
  timers_ctx_t *c = opaque;
  kl_event_t ev;
  int k = sim_key_by_name(c->topic, key, key_len);
  uint32_t e =
      k >= 0 && !kl_event_decode(c->decoder, key, key_len, env, env_len, &ev)
          ? sim_event_find((uint8_t)k, ev.id, ev.id_len)
          : SIM_NONE;
  char a[256];
  c->n++;
  if (e == SIM_NONE)
    sim_fail("timers",
             "%s holds a timer of topic %s, offset %" PRId64
             ", of no event the model knows",
             c->who, W->topics[c->topic], t->offset);
  else if (c->v->marks[e].timer != t->offset + 1 ||
           t->due_ms != W->events[e].not_before)
    sim_fail("timers",
             "%s holds the timer of %s, scheduled at offset %" PRId64
             ", due %+" PRId64 " ms from its time; the model %s",
             c->who, event_name(e, a, sizeof(a)), t->offset,
             t->due_ms - W->events[e].not_before,
             c->v->marks[e].timer ? "another offset's"
                                  : "none (it ran or went)");
  return W->failed;
}

void sim_view_check_timers(const sim_view_t *v, kl_store_t *store,
                           const char *who) {
  size_t want[SIM_TOPICS] = {0};
  for (uint32_t e = 0; e < W->nevents; e++)
    want[sim_key_topic(W->events[e].key)] += v->marks[e].timer != 0;
  for (int t = 0; t < W->ntopics && !W->failed; t++) {
    timers_ctx_t c = {v, t, kl_decoder_new(), 0, who};
    size_t bad = 0;
    kl_err_t err = kl__timers_scan(store, W->topics[t], -1, timer_cb, &c, &bad);
    kl_decoder_destroy(c.decoder);
    if (err || bad)
      sim_fail("store-error", "%s: reading the timers of topic %s: %s", who,
               W->topics[t], err ? kl_err_detail() : "malformed records");
    else if (!W->failed && c.n != want[t])
      sim_fail("timers",
               "%s holds %zu pending timers of topic %s, the model %zu", who,
               c.n, W->topics[t], want[t]);
  }
}

/* ---- the store against the model ---------------------------------------- */

void sim_view_check_store(const sim_view_t *v, kl_store_t *store,
                          int conserved) {
  int64_t bal[SIM_MAXK], sum[SIM_TOPICS] = {0};
  if (sim_balances(store, bal))
    return;
  /* Each topic's keys against its own events: one topic's commits that
   * changed the other's entries would show here. */
  for (int k = 0; k < W->nkeys; k++) {
    sum[sim_key_topic(k)] += bal[k];
    if (bal[k] != v->balance[k])
      sim_fail(
          "balance",
          "key %s's balance on topic %s is %" PRId64 " in the store, %" PRId64
          " by the events the model saw committed",
          W->keys[k].name, W->topics[sim_key_topic(k)], bal[k], v->balance[k]);
  }
  /* Money moves only by transfers, within a topic, whose credits not yet
   * applied are in flight; once all are, it is conserved, per topic. */
  for (int t = 0; t < W->ntopics; t++) {
    int64_t flight = v->transfers[t] - v->followups[t];
    int64_t want = v->credits[t] - v->debits[t] - flight;
    if (sum[t] != want || (conserved && flight != 0))
      sim_fail("money",
               "topic %s's balances sum to %" PRId64
               "; applied client credits %" PRId64 " - debits %" PRId64
               " - transfers in flight %" PRId64 " make %" PRId64,
               W->topics[t], sum[t], v->credits[t], v->debits[t], flight, want);
  }
  for (int32_t p = 0; p < W->nparts; p++) {
    kl_partition_state_t st;
    kl_err_t err = kl_store_partition(store, sim_topic(p), sim_tpart(p), &st);
    if (err)
      sim_fail("store-error", "reading partition %d of topic %s: %s",
               (int)sim_tpart(p), sim_topic(p), kl_err_detail());
    else if (st.epoch != v->epoch[p] || st.watermark != v->watermark[p] ||
             st.applied != v->applied[p] || st.duplicates != v->duplicates[p] ||
             st.dead_letters != v->dead[p])
      sim_fail("partition",
               "partition %d of topic %s has epoch %" PRIu64
               ", watermark %" PRId64 ", %" PRIu64 " applied, %" PRIu64
               " duplicates, %" PRIu64 " dead letters in the store, %" PRIu64
               ", %" PRId64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
               " in the model",
               (int)sim_tpart(p), sim_topic(p), st.epoch, st.watermark,
               st.applied, st.duplicates, st.dead_letters, v->epoch[p],
               v->watermark[p], v->applied[p], v->duplicates[p], v->dead[p]);
  }
  if (W->shared && store == W->store)
    check_shared(v, store);
  if (!W->failed)
    sim_view_check_timers(
        v, store, v == &W->live ? "the live store" : "the rebuilt store");
}
