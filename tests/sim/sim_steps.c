/*
 * One schedule: its choices decoded into steps (the client's publishes,
 * the owners' work, faults, the tools), the drain without faults that
 * follows them, and the checks at the end.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "event/envelope.h"
#include "handlers/ledger.h"
#include "keylane/conf.h"
#include "keylane/producer.h"
#include "sim/sim.h"
#include "store/store_internal.h"

#define CLOCK_BASE 1700000000000LL

const char *sim_pg_uri;
int sim_hostile;
int sim_recreate;
int sim_topics = SIM_TOPICS;

uint64_t sim_mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

sim_cfg_t sim_cfg_of(uint64_t seed) {
  uint64_t r = sim_mix(seed ^ 0x5eedc0f1ULL);
  sim_cfg_t cfg = {.partitions = 2 + (int)(r % 3),
                   .owners = 2 + (int)((r >> 8) % 3),
                   .keys = 4 + (int)((r >> 16) % 5),
                   .batch_max = 1 + (int)((r >> 24) % 8)};
  return cfg;
}

void sim_words(uint64_t seed, uint64_t *words, size_t n) {
  uint64_t s = sim_mix(seed);
  for (size_t i = 0; i < n; i++)
    words[i] = sim_mix(s + i * 0x9e3779b97f4a7c15ULL);
}

/* ---- the client ---------------------------------------------------------- */

static void republish(uint32_t e) {
  const sim_event_t *ev = &W->events[e];
  const rd_kafka_message_t *m = &W->log[ev->part].v[ev->first]->msg;
  void *copy = malloc(m->len);
  memcpy(copy, m->payload, m->len);
  int64_t off = sim_log_append(e, copy, m->len);
  sim_say("the client publishes %.*s of key %s again: offset %" PRId64,
          (int)ev->id_len, ev->id, W->keys[ev->key].name, off);
}

/* An id for a new event of key @p k: a fresh one, or sometimes one that
 * another key's event has (ids are scoped by key: two events). */
static size_t new_id(int k, uint64_t w, char *id, size_t size) {
  if (((w >> 48) & 0xff) < 25 && W->nevents) {
    const sim_event_t *o = &W->events[(w >> 56) % W->nevents];
    if (o->kind < SIM_FOLLOWUP && o->key != k &&
        sim_event_find((uint8_t)k, o->id, o->id_len) == SIM_NONE) {
      memcpy(id, o->id, o->id_len);
      return o->id_len;
    }
  }
  return (size_t)snprintf(id, size, "e%" PRIu64, W->next_id++);
}

/* The envelope of an event of @p type of key @p k with @p id and
 * @p payload, as a producer writes it, into *@p bytes (malloc()ed).
 * @returns 0, or -1 with the schedule failed. */
static int event_record(int k, const char *id, size_t id_len, const char *type,
                        const void *payload, size_t payload_len,
                        int64_t not_before, void **bytes, size_t *len) {
  kl_event_t ev = {.key = W->keys[k].name,
                   .key_len = W->keys[k].name_len,
                   .id = id,
                   .id_len = id_len,
                   .type = type,
                   .type_len = strlen(type),
                   .ts = sim_clock(),
                   .payload = payload,
                   .payload_len = payload_len,
                   .not_before = not_before};
  kl_err_t err = kl_event_encode(&ev, bytes, len);
  if (err)
    sim_fail("client", "%s %.*s does not encode: %s", type, (int)id_len, id,
             kl_err_detail());
  return err ? -1 : 0;
}

/* The same for ledger event @p a. */
static int ledger_record(int k, const char *id, size_t id_len, const char *type,
                         const kl_ledger_args_t *a, int64_t not_before,
                         void **bytes, size_t *len) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, a);
  int rc = event_record(k, id, id_len, type, sb.data, sb.size, not_before,
                        bytes, len);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* A delayed event's time, for one valid event in six (its choice @p w):
 * most a little ahead of the clock, some already past, some far (they wait
 * until the end's jump, final_checks()); else 0. */
#define FAR_MS (3600 * 1000LL)
static int64_t delay_at(uint64_t d);
static int64_t delay_of(uint64_t w) {
  uint64_t d = sim_mix(w ^ 0xde1a7edULL);
  return (d & 0xff) < 43 ? delay_at(d) : 0;
}

/* A time from @p d's bits 8 to 31, as delay_of() says. */
static int64_t delay_at(uint64_t d) {
  int64_t r = (int64_t)((d >> 16) % 3000);
  switch ((d >> 8) % 8) {
  case 4:
  case 5:
    return sim_clock() - 1 - r; /* past: fires at the next reading */
  case 6:
    return sim_clock() + FAR_MS + r;
  case 7:
    return sim_clock() + 5000 + r * 5;
  default:
    return sim_clock() + 1 + r;
  }
}

static int client_timers(uint64_t w);

static void client_publish(uint64_t w) {
  if (((w >> 16) & 0xff) < 38 && W->nevents) {
    uint32_t e = (uint32_t)((w >> 24) % W->nevents);
    int kind = W->events[e].kind;
    if ((kind < SIM_FOLLOWUP || kind == SIM_CANCEL || kind == SIM_DEFER) &&
        !W->events[e].gone) {
      republish(e);
      return;
    }
  }
  if (client_timers(w))
    return;
  int k = (int)((w >> 24) % (uint64_t)W->nkeys);
  unsigned r = (w >> 32) & 0xff;
  kl_ledger_args_t a = {.amount = 1 + (int64_t)((w >> 40) % 100)};
  int kind = r < 90 ? SIM_CREDIT : r < 165 ? SIM_DEBIT : SIM_TRANSFER;
  /* to a key of its own topic: money moves within a topic */
  int first = sim_key_topic(k) * W->cfg.keys;
  int to =
      first + (k - first + 1 + (int)((w >> 56) % (uint64_t)(W->cfg.keys - 1))) %
                  W->cfg.keys;
  int valid = r < 245;
  if (!valid && (r & 1)) /* the ledger refuses these: dead letters */
    kind = SIM_CREDIT, a.amount = 0;
  else if (!valid)
    to = k; /* a transfer to itself */
  if (kind != SIM_CREDIT)
    a.has_seq = 1, a.seq = ++W->seq[k];
  if (kind == SIM_TRANSFER)
    a.to = W->keys[to].name, a.to_len = W->keys[to].name_len;
  char id[32];
  size_t id_len = new_id(k, w, id, sizeof(id));
  static const char *const types[] = {"credit", "debit", "transfer"};
  void *bytes;
  size_t len;
  int64_t not_before = valid ? delay_of(w) : 0;
  if (ledger_record(k, id, id_len, types[kind], &a, not_before, &bytes, &len))
    return;
  uint32_t e = sim_event_add((uint8_t)k, id, id_len);
  sim_event_t *sev = &W->events[e];
  sev->kind = (uint8_t)kind;
  sev->amount = a.amount;
  sev->to = (uint8_t)to;
  sev->valid = (uint8_t)valid;
  sev->not_before = not_before;
  W->stats.delayed += not_before != 0;
  int64_t off = sim_log_append(e, bytes, len);
  sim_say("the client publishes %s %.*s of %" PRId64 " on key %s%s%s: "
          "partition %d, offset %" PRId64 "%s%+" PRId64 "%s",
          types[kind], (int)id_len, id, a.amount, W->keys[k].name,
          kind == SIM_TRANSFER ? " to " : "",
          kind == SIM_TRANSFER ? W->keys[to].name : "", (int)sev->part, off,
          not_before ? ", not before " : "",
          not_before ? not_before - sim_clock() : 0, not_before ? " ms" : "");
}

/* ---- a hostile producer (--hostile) ------------------------------------ */

/* The id a producer that is not keylane writes: most often the follow-up
 * id (store/outbox_rec.h) that the credit of a transfer in the log will
 * get, or the id of a follow-up it read from the log (whatever its form),
 * or a guess at one of a record still to come; else a `~` id of no
 * follow-up's form, or a plain one of its own. */
static size_t hostile_id(uint64_t r, int *key, char *id, size_t size) {
  unsigned c = r & 0xff;
  const sim_event_t *t = &W->events[(r >> 8) % W->nevents];
  int32_t p = (int32_t)((r >> 32) % (uint64_t)W->nparts);
  int64_t off = (int64_t)W->log[p].n + (int64_t)((r >> 40) % 4);
  const char *topic = sim_topic(p);
  int32_t tp = sim_tpart(p);
  *key = (int)((r >> 24) % (uint64_t)W->nkeys);
  if (c < 128 && t->kind == SIM_TRANSFER && t->valid &&
      t->followup == SIM_NONE) {
    *key = t->to;
    return (size_t)snprintf(id, size, "~%s/%d/%" PRId64 "/0",
                            sim_topic(t->part), (int)sim_tpart(t->part),
                            t->first);
  }
  /* A copy of a published one (in the log: one Kafka refused is not, and
   * its copy would come before it): a duplicate. */
  if (c < 128 && t->kind == SIM_FOLLOWUP && t->first >= 0) {
    *key = t->key;
    memcpy(id, t->id, t->id_len);
    return t->id_len;
  }
  if (c < 160) /* a follow-up id a record still to come may get */
    return (size_t)snprintf(id, size, "~%s/%d/%" PRId64 "/0", topic, (int)tp,
                            off);
  switch (c % 5) {
  case 0:
    return (size_t)snprintf(id, size, "~");
  case 1:
    return (size_t)snprintf(id, size, "~%s", topic);
  case 2:
    return (size_t)snprintf(id, size, "~%s/%d/%" PRId64, topic, (int)tp, off);
  case 3:
    return (size_t)snprintf(id, size, "~%s/%d/%" PRId64 "/1", topic, (int)tp,
                            off);
  default:
    return (size_t)snprintf(id, size, "h%" PRIu64, W->next_id++);
  }
}

/* A credit a producer that is not keylane writes, with an id of any form
 * (hostile_id()): keylane's publish paths refuse reserved ids, but anyone
 * can write to the topic. It goes to its key's partition, as murmur2 says.
 * A record whose (key, id) an event has already is, to the store, that
 * event again; otherwise it is an event of its own, which the ledger
 * applies unless the worker refuses its reserved id as a dead letter. */
/* A delayed event of the model from the (@p r mod n)-th on: with
 * @p waiting, one whose timer the live store holds. @returns SIM_NONE when
 * none is. */
static uint32_t delayed_event(uint64_t r, int waiting) {
  for (uint32_t i = 0; W->nevents && i < W->nevents; i++) {
    uint32_t e = (uint32_t)((r + i) % W->nevents);
    const sim_event_t *ev = &W->events[e];
    if (ev->not_before && !ev->gone && ev->first >= 0 &&
        (!waiting || W->live.marks[e].timer))
      return e;
  }
  return SIM_NONE;
}

/* The envelope of record @p m without its `nb`, into *@p copy (malloc'd):
 * a retry that dropped the delay. @returns its length, 0 when it fails. */
static size_t copy_without_nb(const rd_kafka_message_t *m, void **copy) {
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t ev;
  size_t len = 0;
  if (decoder && kl_event_decode(decoder, m->key, m->key_len, m->payload,
                                 m->len, &ev) == KL_OK) {
    ev.not_before = 0;
    if (kl_event_encode(&ev, copy, &len))
      len = 0;
  }
  kl_decoder_destroy(decoder);
  return len;
}

/* Against timers, a hostile producer writes a record that names a
 * pending timer (its keylane.timer header, the offset that scheduled it)
 * stamped before its time, as one that is not keylane can: early, it
 * changes nothing; a copy of a delayed event; or a copy of a waiting one
 * without its `nb`: duplicates (the mutant `timer_copy` runs the last at
 * once). @returns 0 when the choice @p r finds nothing to write. */
static int hostile_timer(uint64_t r) {
  int early = ((r >> 56) & 0xff) < 40, bare = !early && (r >> 4) % 3 == 0;
  uint32_t e = delayed_event(r >> 8, early || bare);
  if (e == SIM_NONE)
    return 0;
  const sim_event_t *ev = &W->events[e];
  const rd_kafka_message_t *m = &W->log[ev->part].v[ev->first]->msg;
  void *copy = NULL;
  size_t len = bare ? copy_without_nb(m, &copy) : m->len;
  if (!len)
    sim_fail("client", "a copy of %.*s without nb does not encode: %s",
             (int)ev->id_len, ev->id, kl_err_detail());
  if (!bare && (copy = malloc(len)) != NULL)
    memcpy(copy, m->payload, len);
  int64_t ts =
      early ? ev->not_before - 1 - (int64_t)((r >> 24) % 2000) : sim_clock();
  int64_t off = sim_log_append_at(e, copy, len, ts,
                                  early ? W->live.marks[e].timer - 1 : -1);
  W->stats.hostile++;
  sim_say("a hostile producer writes %s of delayed %.*s of key %s: "
          "partition %d, offset %" PRId64,
          early  ? "a firing record stamped before the time"
          : bare ? "a copy without nb"
                 : "a copy",
          (int)ev->id_len, ev->id, W->keys[ev->key].name, (int)ev->part, off);
  return 1;
}

static void hostile_publish(uint64_t w) {
  uint64_t r = sim_mix(w ^ 0x4057113ULL);
  if (((r >> 56) & 0xff) < 64 && hostile_timer(r))
    return;
  int k;
  char id[160];
  size_t id_len = W->nevents ? hostile_id(r, &k, id, sizeof(id)) : 0;
  if (!id_len) {
    k = (int)((r >> 24) % (uint64_t)W->nkeys);
    id_len = (size_t)snprintf(id, sizeof(id), "h%" PRIu64, W->next_id++);
  }
  if (id_len >= sizeof(((sim_event_t *)0)->id))
    id_len = (size_t)snprintf(id, sizeof(id), "~");
  kl_ledger_args_t a = {.amount = 1 + (int64_t)((r >> 48) % 100)};
  void *bytes;
  size_t len;
  if (ledger_record(k, id, id_len, "credit", &a, 0, &bytes, &len))
    return;
  uint32_t e = sim_event_find((uint8_t)k, id, id_len);
  if (e == SIM_NONE) {
    e = sim_event_add((uint8_t)k, id, id_len);
    W->events[e].kind = SIM_HOSTILE;
    W->events[e].amount = a.amount;
    /* the worker's own rule: a `~` id that is no follow-up's is refused */
    W->events[e].valid = kl__id_check(id, id_len, 1) == KL_OK;
  }
  int64_t off = sim_log_append(e, bytes, len);
  W->stats.hostile++;
  sim_say("a hostile producer writes credit %.*s of %" PRId64
          " on key %s: partition %d, offset %" PRId64,
          (int)id_len, id, a.amount, W->keys[k].name, (int)W->events[e].part,
          off);
}

/* ---- cancels and delayed follow-ups (sim_timers.c) ---------------------- */

/* A cancel of a delayed event of its key, chosen by @p d: one whose timer
 * waits (it may run before the cancel is read), one of any state, or an
 * id no event has; its payload is the id. */
static void client_cancel(uint64_t w, uint64_t d) {
  unsigned c = (d >> 8) & 0xff;
  uint32_t t = c < 208 ? delayed_event(d >> 16, c < 144) : SIM_NONE;
  int k =
      t != SIM_NONE ? W->events[t].key : (int)((d >> 16) % (uint64_t)W->nkeys);
  int first = sim_key_topic(k) * W->cfg.keys;
  char id[32], target[sizeof(W->events[0].id) + 1];
  size_t id_len = (size_t)snprintf(id, sizeof(id), "c%" PRIu64, W->next_id++);
  size_t target_len =
      t != SIM_NONE
          ? (size_t)snprintf(target, sizeof(target), "%.*s",
                             (int)W->events[t].id_len, W->events[t].id)
          : (size_t)snprintf(target, sizeof(target), "x%s", id);
  int64_t not_before = delay_of(w);
  void *bytes;
  size_t len;
  if (event_record(k, id, id_len, "cancel", target, target_len, not_before,
                   &bytes, &len))
    return;
  uint32_t e = sim_event_add((uint8_t)k, id, id_len);
  sim_event_t *ev = &W->events[e];
  ev->kind = SIM_CANCEL;
  ev->valid = 1;
  ev->target = t;
  ev->to = (uint8_t)(first + (k - first + 1) % W->cfg.keys); /* not its key */
  ev->not_before = not_before;
  W->stats.delayed += not_before != 0;
  int64_t off = sim_log_append(e, bytes, len);
  sim_say("the client publishes cancel %s of %.*s on key %s: partition %d, "
          "offset %" PRId64,
          id, (int)target_len, target, W->keys[k].name, (int)ev->part, off);
}

/* A defer: its handler emits a credit with a time (kl_txn_emit_opts()) to
 * its own key or another of its topic. */
static void client_defer(uint64_t w, uint64_t d) {
  int k = (int)((d >> 16) % (uint64_t)W->nkeys);
  int first = sim_key_topic(k) * W->cfg.keys;
  int to = (d >> 24) & 1
               ? k
               : first + (k - first + 1 +
                          (int)((d >> 32) % (uint64_t)(W->cfg.keys - 1))) %
                             W->cfg.keys;
  kl_ledger_args_t a = {.amount = 1 + (int64_t)((d >> 40) % 100),
                        .to = W->keys[to].name,
                        .to_len = W->keys[to].name_len};
  char id[32];
  size_t id_len = new_id(k, w, id, sizeof(id));
  int64_t not_before = delay_of(w);
  void *bytes;
  size_t len;
  if (ledger_record(k, id, id_len, "defer", &a, not_before, &bytes, &len))
    return;
  uint32_t e = sim_event_add((uint8_t)k, id, id_len);
  sim_event_t *ev = &W->events[e];
  ev->kind = SIM_DEFER;
  ev->valid = 1;
  ev->amount = a.amount;
  ev->to = (uint8_t)to;
  ev->not_before = not_before;
  ev->emit_nb = delay_at(sim_mix(d));
  W->stats.delayed += not_before != 0;
  int64_t off = sim_log_append(e, bytes, len);
  sim_say("the client publishes defer %.*s of %" PRId64 " on key %s to %s, "
          "its credit not before %+" PRId64
          " ms: partition %d, offset %" PRId64,
          (int)id_len, id, a.amount, W->keys[k].name, W->keys[to].name,
          ev->emit_nb - sim_clock(), (int)ev->part, off);
}

/* One client event in about twenty is a cancel, one a defer. @returns 0
 * when the choice @p w says neither. */
static int client_timers(uint64_t w) {
  uint64_t d = sim_mix(w ^ 0xca9ce1ULL);
  if ((d & 0xff) >= 24)
    return 0;
  if ((d & 0xff) < 12)
    client_cancel(w, d);
  else
    client_defer(w, d);
  return 1;
}

/* ---- steps --------------------------------------------------------------- */

enum {
  ST_PUBLISH,
  ST_BATCH,
  ST_ACQUIRE,
  ST_OUTBOX,
  ST_ACK,
  ST_RESUME,
  ST_CRASH,
  ST_TICK,
  ST_REDRIVE,
  ST_REPLAY,
  ST_SWEEP,
  ST_FOREIGN,
  ST_REBUILD,
  ST_N
};
/* Out of 8900 (sim.c lists them); a rebuild in about one schedule of
 * four. */
static const unsigned weights[ST_N] = {2000, 3300, 500, 800, 500, 700, 250,
                                       500,  150,  97,  40,  60,  3};

/* A foreign fleet tries to take partition @p p, as a worker of it would
 * (worker.c, lane_acquire()): of another Kafka cluster with the same
 * topic name (a wrong -b), or of another group (a typo'd -g), as the
 * choice @p w says. The store records the fleet's owner with its first
 * take of the topic, so it must refuse: the epoch stays, the live owner is
 * not fenced (issue 39's second attack, HIGH-2 and LOW-7; the mutant
 * `owner` skips the check). @returns 0 when no owner of the fleet took a
 * partition of the topic in this store yet (none recorded the fleet). */
static int foreign_take(int32_t p, uint64_t w) {
  kl__store_owner_t foreign = W->fleet, recorded;
  kl_partition_state_t before, st;
  if (!W->fleet_took[sim_topic_no(p)] ||
      kl_store_partition(W->store, sim_topic(p), sim_tpart(p), &before))
    return 0;
  int cluster = (w >> 24) & 1;
  snprintf(cluster ? foreign.cluster : foreign.group,
           cluster ? sizeof(foreign.cluster) : sizeof(foreign.group), "%s",
           cluster ? "simcluster-dr" : "simflete");
  int refused = 0;
  kl_err_t err = kl__store_acquire_owned(W->store, sim_topic(p), sim_tpart(p),
                                         0, &foreign, &recorded, &refused, &st);
  if (err && !kl_err_is_retriable(err))
    sim_fail("store-error", "a foreign fleet's take: %s", kl_err_detail());
  else if (!err && !refused)
    sim_fail("foreign",
             "a fleet of cluster %s, group %s took partition %d of topic %s, "
             "which the fleet (cluster %s, group %s) took first: epoch "
             "%" PRIu64 " -> %" PRIu64 ", the live owner is fenced",
             foreign.cluster, foreign.group, (int)sim_tpart(p), sim_topic(p),
             W->fleet.cluster, W->fleet.group, before.epoch, st.epoch);
  W->stats.foreign += !err && refused;
  sim_say("a fleet of cluster %s, group %s tries to take partition %d: %s",
          foreign.cluster, foreign.group, (int)p,
          err       ? "the store is busy"
          : refused ? "refused"
                    : "taken");
  return 1;
}

/* A fleet of a third topic shares the store: it applies an event of its
 * own, then sweeps its own expired ids by the store's retention (1 s
 * here, sim_conf()), as a worker does with `--dedup-retention 1s`. Its
 * old ids go; the two topics' ids must all stay, however old (issue 39:
 * the sweep was store-wide and re-published events were applied again).
 * The mutant `sweep` makes it store-wide again. */
static void sweep_third_topic(void) {
  char topic[128], id[32];
  snprintf(topic, sizeof(topic), "sim%ssweeper", W->tag);
  kl_partition_state_t st;
  kl_txn_t *txn = NULL;
  /* its owner takes the partition each time: the store may be a new one
   * (a rebuild the fleet moved to, a reset) */
  kl_err_t err = kl__store_acquire_above(W->store, topic, 0, 0, &st);
  int n = snprintf(id, sizeof(id), "s%" PRIu64, W->sweeper_ids);
  if (!err && !(err = kl_store_begin(W->store, topic, 0, st.epoch, &txn)) &&
      !(err = kl_txn_mark(txn, "k", 1, id, (size_t)n, KL_MARK_APPLIED)))
    err = kl_store_commit(txn, st.watermark + 1);
  else if (txn)
    kl_store_abort(txn);
  W->sweeper_ids += !err;
  size_t removed = 0;
  if (!err)
    err = kl__store_sweep_topic(W->store, topic, 1000, &removed);
  if (err && !kl_err_is_retriable(err))
    sim_fail("store-error", "the fleet of topic %s: %s", topic,
             kl_err_detail());
  W->stats.swept++;
  W->stats.swept_ids += removed;
  sim_say("a fleet of topic %s applies an event and sweeps its ids older "
          "than 1 s: %zu removed",
          topic, removed);
}

static int step_kind(uint64_t w) {
  unsigned total = 0, r;
  for (int i = 0; i < ST_N; i++)
    total += weights[i];
  r = (unsigned)(w & 0xffff) % total;
  for (int i = 0; i < ST_N; i++) {
    if (r < weights[i])
      return i;
    r -= weights[i];
  }
  return ST_TICK;
}

static int can_publish(const sim_owner_t *o, int32_t p) {
  return o->held[p] && !o->paused;
}

/* The (@p sel mod n)-th pair of owner and partition that @p ok accepts. */
static sim_owner_t *pick_pair(uint64_t sel,
                              int (*ok)(const sim_owner_t *, int32_t),
                              int32_t *part) {
  int n = 0;
  for (int o = 0; o < W->cfg.owners; o++)
    for (int32_t p = 0; p < W->nparts; p++)
      n += ok(&W->owners[o], p) != 0;
  int want = n ? (int)(sel % (uint64_t)n) : -1;
  for (int o = 0; o < W->cfg.owners; o++)
    for (int32_t p = 0; p < W->nparts; p++)
      if (ok(&W->owners[o], p) && want-- == 0) {
        *part = p;
        return &W->owners[o];
      }
  return NULL;
}

/* The (@p sel mod n)-th owner with @p paused (and, for 1, acks to send). */
static sim_owner_t *pick_owner(uint64_t sel, int paused, int acks) {
  int n = 0, idx[SIM_MAXO];
  for (int o = 0; o < W->cfg.owners; o++)
    if (W->owners[o].paused == paused &&
        (!acks || sim_owner_inflight(&W->owners[o])))
      idx[n++] = o;
  return n ? &W->owners[idx[sel % (uint64_t)n]] : NULL;
}

static int step_run(uint64_t w) {
  uint64_t sel = w >> 56;
  int32_t p = (int32_t)(((w >> 16) & 0xff) % (uint64_t)W->nparts);
  sim_owner_t *o;
  switch (step_kind(w)) {
  case ST_PUBLISH:
    if (W->hostile && (sim_mix(w) & 0xff) < 48)
      hostile_publish(w);
    else
      client_publish(w);
    return 1;
  case ST_BATCH:
    if (!(o = pick_pair(sel, sim_owner_can_work, &p)))
      return 0;
    sim_owner_batch(o, p, w);
    return 1;
  case ST_ACQUIRE:
    if (!(o = pick_owner(sel, 0, 0)))
      return 0;
    sim_owner_acquire(o, p, w);
    return 1;
  case ST_OUTBOX:
    if (!(o = pick_pair(sel, can_publish, &p)))
      return 0;
    sim_owner_tick(o, w, 0);
    return 1;
  case ST_ACK:
    if (!(o = pick_owner(sel, 0, 1)))
      return 0;
    sim_owner_tick(o, w, 1 + (int)((w >> 20) & 1));
    return 1;
  case ST_RESUME:
    if (!(o = pick_owner(sel, 1, 0)))
      return 0;
    sim_owner_resume(o, w);
    return 1;
  case ST_CRASH:
    sim_owner_crash(&W->owners[sel % (uint64_t)W->cfg.owners]);
    return 1;
  case ST_TICK:
    W->now_ms += 1 + (int64_t)((w >> 16) % 1000);
    if (((w >> 32) & 3) == 0) { /* the wall clock jumps, either way */
      W->skew_ms += (int64_t)((w >> 34) % 8001) - 4000;
      W->stats.jumps++;
      sim_say("the wall clock jumps to %+" PRId64 " ms", W->skew_ms);
    }
    return 1;
  case ST_REDRIVE:
    return W->nletters && sim_redrive((size_t)((w >> 16) % W->nletters));
  case ST_REPLAY:
    sim_replay(p);
    return 1;
  case ST_SWEEP:
    sweep_third_topic();
    return 1;
  case ST_FOREIGN:
    return foreign_take(p, w);
  default: /* a rebuild after a recreated topic would lack the old log */
    if (W->backend != SIM_LMDB || W->gen > 0 || W->recreated)
      return 0;
    sim_rebuild_switch();
    return 1;
  }
}

static void drain(void);
static void final_checks(void);

/* The topic is deleted and created again, its logs start at offset 0,
 * and an operator runs `keylane store reset` on every partition, as the
 * docs say to: first the fleet settles (every record applied or
 * dead-lettered, every letter redriven, every follow-up applied, checked
 * as at the end), then the logs go, and the store keeps its ids, state
 * and counters, with a new epoch (the owners are fenced) and watermark 0.
 * A transfer of the new log emits a follow-up whose id an old one may
 * have had, but for the nonce in it (the mutant `nonce` leaves it out). */
static void topic_recreate(void) {
  sim_say("the topic is about to be created again: the fleet settles");
  drain();
  if (!W->failed)
    final_checks();
  if (W->failed)
    return;
  for (int32_t p = 0; p < W->nparts; p++) {
    for (size_t i = 0; i < W->log[p].n; i++) {
      W->gone.v =
          kl__grow(W->gone.v, &W->gone.cap, W->gone.n, sizeof(*W->gone.v), 256);
      W->gone.v[W->gone.n++] = W->log[p].v[i];
    }
    W->log[p].n = 0;
    kl_partition_state_t st;
    if (kl__store_reset(W->store, sim_topic(p), sim_tpart(p), &st)) {
      sim_fail("store-error", "store reset of partition %d of topic %s: %s",
               (int)sim_tpart(p), sim_topic(p), kl_err_detail());
      return;
    }
    sim_view_reset(&W->live, p, &st);
  }
  for (int o = 0; o < W->cfg.owners; o++) /* the group lost the topic */
    sim_owner_restart(&W->owners[o]);
  W->letters_gone = W->nletters; /* redriven; the dead-letter topic stays */
  for (uint32_t e = 0; e < W->nevents; e++)
    W->events[e].gone = 1;
  W->recreated = 1;
  W->calm = 0;
  W->dirty = 1;
  W->stats.recreated++;
  sim_say("the topic was created again, and the store reset: the logs "
          "start at offset 0");
}

/* A choice that finds nothing to do runs a batch instead, or when no
 * owner has work, a publish: every step does something. */
static void step(uint64_t w) {
  W->now_ms++;
  W->dirty = 0;
  if (W->recreate_at && W->step == W->recreate_at && !W->recreated)
    topic_recreate();
  if (!step_run(w)) {
    int32_t p;
    sim_owner_t *o = pick_pair(w >> 56, sim_owner_can_work, &p);
    W->stats.noops++;
    if (o)
      sim_owner_batch(o, p, w);
    else
      client_publish(w);
  }
  W->stats.steps++;
  if (W->dirty && !W->failed)
    sim_view_check_store(&W->live, W->store, 0);
}

/* ---- the drain and the checks at the end --------------------------------- */

static size_t log_total(void) {
  size_t n = 0;
  for (int32_t p = 0; p < W->nparts; p++)
    n += W->log[p].n;
  return n;
}

static int count_cb(void *opaque, uint64_t seq, const void *rec, size_t len) {
  ++*(size_t *)opaque;
  return 1;
}

static size_t outbox_count(int32_t p) {
  size_t n = 0;
  if (kl__store_outbox_list(W->store, sim_topic(p), sim_tpart(p), 0, 1,
                            count_cb, &n))
    sim_fail("store-error", "listing the outbox of partition %d: %s", (int)p,
             kl_err_detail());
  return n;
}

/* Whether the live store holds a timer due by the wall clock: its firing
 * is still to come (a delayed follow-up the drain published, say). */
static int timers_due(void) {
  for (uint32_t e = 0; e < W->nevents; e++)
    if (W->live.marks[e].timer && W->events[e].not_before <= sim_clock())
      return 1;
  return 0;
}

/* No more faults: the paused resume, then one owner takes every partition
 * and turns until every record is applied or dead-lettered, every
 * follow-up published and applied, and no report is in flight. */
static void drain(void) {
  W->calm = 1;
  sim_say("the drain: no more faults");
  for (int i = 0; i < W->cfg.owners; i++)
    sim_owner_resume(&W->owners[i], 0);
  sim_owner_t *o = &W->owners[0];
  sim_owner_restart(o);
  for (int32_t p = 0; p < W->nparts; p++)
    sim_owner_acquire(o, p, 0);
  for (int round = 0; round < 1000 && !W->failed; round++) {
    size_t before = log_total();
    W->now_ms += 1000;
    for (int32_t p = 0; p < W->nparts && !W->failed; p++) {
      sim_owner_batch(o, p, 0);
      W->stats.drain_batches++;
      if (!o->held[p])
        sim_fail("drain", "the drain's owner was fenced on partition %d",
                 (int)p);
    }
    int settled = log_total() == before && !timers_due();
    for (int32_t p = 0; p < W->nparts && settled && !W->failed; p++)
      settled = sim_owner_settled(o, p) && !outbox_count(p);
    if (settled)
      return;
  }
  if (!W->failed)
    sim_fail("drain", "the drain did not settle in 1000 rounds");
}

static void check_mark(kl_txn_t *txn, const sim_view_t *v, uint32_t e,
                       const char *who) {
  const sim_event_t *ev = &W->events[e];
  const sim_key_t *key = &W->keys[ev->key];
  kl_mark_t mark;
  if (kl_txn_seen(txn, key->name, key->name_len, ev->id, ev->id_len, &mark))
    sim_fail("store-error", "%s: %s", who, kl_err_detail());
  else
    sim_view_check_mark(v, e, mark, who);
}

/* Every event's mark in @p store, as @p v says it must be: those in their
 * keys' lists, and delayed ones that never fired (in none yet). */
static void check_marks(kl_store_t *store, const sim_view_t *v,
                        const char *who) {
  for (int32_t p = 0; p < W->nparts && !W->failed; p++) {
    kl_txn_t *txn;
    if (kl_store_begin(store, sim_topic(p), sim_tpart(p), v->epoch[p], &txn)) {
      sim_fail("store-error", "%s: begin on partition %d: %s", who, (int)p,
               kl_err_detail());
      return;
    }
    for (int k = 0; k < W->nkeys && !W->failed; k++) {
      const sim_key_t *key = &W->keys[k];
      for (size_t i = 0; key->part == p && i < key->n; i++)
        check_mark(txn, v, key->events[i], who);
    }
    for (uint32_t e = 0; e < W->nevents && !W->failed; e++) {
      const sim_event_t *ev = &W->events[e];
      if (ev->part == p && ev->not_before && !ev->placed && ev->first >= 0)
        check_mark(txn, v, e, who);
    }
    kl_store_abort(txn);
  }
}

static int dead_only(const sim_mark_t *m) {
  return (m->dead || m->refused) && !m->applied;
}

static void check_rebuild(void) {
  sim_view_t rv;
  kl_store_t *store = sim_lmdb_env(W->env == 0 ? 1 : 2);
  sim_rebuild(store, &rv, 0);
  const sim_view_t *v = &W->live;
  for (uint32_t e = 0; store && e < W->nevents && !W->failed; e++)
    /* a redrive runs its event later than its place in the log, where a
     * rebuild runs it: a cancel after that place finds no timer there */
    if (!rv.marks[e].cancelled != !v->marks[e].cancelled &&
        !v->marks[e].redriven)
      sim_fail("rebuild", "a cancel took the timer of %.*s only in the %s",
               (int)W->events[e].id_len, W->events[e].id,
               rv.marks[e].cancelled ? "rebuilt store" : "live store");
    else if (rv.marks[e].timer != v->marks[e].timer)
      sim_fail("rebuild",
               "the rebuilt store's timer of event %.*s of key %s is of "
               "offset %" PRId64 ", the fleet's of %" PRId64 " (-1: none)",
               (int)W->events[e].id_len, W->events[e].id,
               W->keys[W->events[e].key].name, rv.marks[e].timer - 1,
               v->marks[e].timer - 1);
    else if (rv.marks[e].applied != v->marks[e].applied ||
             dead_only(&rv.marks[e]) != dead_only(&v->marks[e]))
      sim_fail("rebuild",
               "the rebuilt store %s event %.*s of key %s, the "
               "fleet %s it",
               rv.marks[e].applied ? "applied" : "dead-lettered",
               (int)W->events[e].id_len, W->events[e].id,
               W->keys[W->events[e].key].name,
               v->marks[e].applied ? "applied" : "dead-lettered");
  int64_t rebuilt[SIM_MAXK], live[SIM_MAXK];
  if (store && !W->failed && !sim_balances(store, rebuilt) &&
      !sim_balances(W->store, live))
    for (int k = 0; k < W->nkeys; k++)
      if (rebuilt[k] != live[k])
        sim_fail("rebuild",
                 "key %s's balance on topic %s is %" PRId64 " in the rebuilt "
                 "store, %" PRId64 " in the live one",
                 W->keys[k].name, W->topics[sim_key_topic(k)], rebuilt[k],
                 live[k]);
  if (store && !W->failed) {
    sim_view_check_store(&rv, store, 0);
    check_marks(store, &rv, "the rebuilt store");
  }
  sim_view_free(&rv);
}

/* After a drain: nothing left to apply or publish, every event applied
 * or dead-lettered, the store as the model says. @p all: after the
 * letters were redriven too: every valid event applied once, every
 * transfer's credit applied, money conserved. */
static void settled_checks(int all) {
  const sim_view_t *v = &W->live;
  sim_view_check_store(v, W->store, all);
  for (int32_t p = 0; p < W->nparts && !W->failed; p++) {
    if (outbox_count(p))
      sim_fail("outbox-left",
               "partition %d of topic %s: its outbox is not empty after the "
               "drain",
               (int)sim_tpart(p), sim_topic(p));
    if (v->watermark[p] != (int64_t)W->log[p].n)
      sim_fail("watermark",
               "partition %d of topic %s: its watermark is %" PRId64
               " after the drain, its log holds %zu records",
               (int)sim_tpart(p), sim_topic(p), v->watermark[p], W->log[p].n);
  }
  for (uint32_t e = 0; e < W->nevents && !W->failed; e++) {
    const sim_event_t *ev = &W->events[e];
    const sim_mark_t *m = &v->marks[e];
    if (ev->gone && ev->first < 0) /* derived again by a rebuild */
      continue;
    if (all && m->timer)
      sim_fail("timer-left",
               "delayed event %.*s of key %s waits still, its time long "
               "past, after the last drain",
               (int)ev->id_len, ev->id, W->keys[ev->key].name);
    if (!m->applied && (!sim_view_resolved(v, e) || (all && ev->valid)) &&
        (all || !ev->aside)   /* set aside: its letter's redrive applies it */
        && (all || !m->timer) /* waits for its time */
        && !(m->cancelled && !m->timer)) /* cancelled, not published again */
      sim_fail("lost",
               "event %.*s of key %s (topic %s, partition %d, offset %" PRId64
               ") was %s",
               (int)ev->id_len, ev->id, W->keys[ev->key].name,
               sim_topic(ev->part), (int)sim_tpart(ev->part), ev->first,
               m->dead ? "dead-lettered, and not applied by its redrive"
                       : "neither applied nor dead-lettered");
    if (m->applied && sim_emits(ev->kind) &&
        (ev->followup == SIM_NONE || (all && !v->marks[ev->followup].applied &&
                                      !v->marks[ev->followup].cancelled)))
      sim_fail("lost-followup",
               "%s %.*s of key %s was applied, its "
               "credit %s",
               ev->kind == SIM_DEFER ? "defer" : "transfer", (int)ev->id_len,
               ev->id, W->keys[ev->key].name,
               ev->followup == SIM_NONE ? "never published" : "not applied");
  }
  if (!W->failed)
    check_marks(W->store, v, "the live store");
}

static void final_checks(void) {
  settled_checks(0);
  if (!W->failed && !W->recreated)
    check_rebuild();
  if (W->failed)
    return;
  sim_say("an operator redrives every dead letter");
  W->calm = 1;
  for (size_t i = 0; i < W->nletters && !W->failed; i++)
    sim_redrive(i);
  /* Past every delayed event's time, far ones included: each runs once. */
  W->skew_ms += 2 * FAR_MS;
  sim_say("the wall clock jumps past every timer's time");
  if (!W->failed)
    drain();
  if (!W->failed)
    settled_checks(1);
}

/* ---- a schedule ---------------------------------------------------------- */

int64_t sim_clock(void) {
  return CLOCK_BASE + W->now_ms + W->skew_ms;
}

/* Key names that route (murmur2) where the schedule's seed says, so that
 * a run on a shared PostgreSQL, whose names carry a tag, decides as the
 * same schedule on LMDB; the second topic's keys have the first's names. */
static void name_keys(uint64_t seed) {
  for (int k = 0; k < W->cfg.keys; k++) {
    sim_key_t *key = &W->keys[k];
    int32_t want = k < W->cfg.partitions
                       ? k
                       : (int32_t)(sim_mix(seed + (uint64_t)k) %
                                   (uint64_t)W->cfg.partitions);
    for (int n = 0;; n++) {
      key->name_len = (size_t)snprintf(key->name, sizeof(key->name), "%sk%d_%d",
                                       W->tag, k, n);
      if (kl_partition(key->name, key->name_len, W->cfg.partitions) == want)
        break;
    }
    key->part = want;
    for (int t = 1; t < W->ntopics; t++) {
      sim_key_t *same = &W->keys[t * W->cfg.keys + k];
      memcpy(same->name, key->name, key->name_len);
      same->name_len = key->name_len;
      same->part = t * W->cfg.partitions + want;
    }
  }
}

static kl_conf_t *sim_conf(void) {
  kl_conf_t *conf = kl_conf_new();
  static const char *const kv[][2] = {{"store.durability", "none"},
                                      {"store.map.size", "64M"},
                                      {"store.pg.pool", "2"},
                                      /* the owners' engines (sim_owner.c) */
                                      {"worker.concurrency", "1"},
                                      {"worker.window.max", "12"},
                                      {"worker.waiting.max", "2"},
                                      {"worker.outbox.max", "6"},
                                      {"worker.batch.wait.ms", "20"},
                                      {"worker.retry.initial.ms", "100"},
                                      {"worker.retry.max.ms", "400"},
                                      {"worker.max.attempts", "3"},
                                      /* the third topic's sweeps */
                                      {"store.dedup.retention", "1s"}};
  for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
    if (kl_conf_set(conf, kv[i][0], kv[i][1]))
      fprintf(stderr, "keylane-sim: %s\n", kl_err_detail());
  return conf;
}

static void rec_free(sim_rec_t *rec) {
  if (rec->headers)
    rd_kafka_headers_destroy(rec->headers);
  free(rec->msg.payload);
  free(rec);
}

static void world_free(void) {
  for (int o = 0; o < W->cfg.owners; o++)
    sim_owner_free(&W->owners[o]);
  if (W->backend == SIM_PG)
    kl_store_destroy(W->store);
  for (int p = 0; p < SIM_MAXP; p++) {
    for (size_t i = 0; i < W->log[p].n; i++)
      rec_free(W->log[p].v[i]);
    free(W->log[p].v);
  }
  for (size_t i = 0; i < W->gone.n; i++)
    rec_free(W->gone.v[i]);
  free(W->gone.v);
  for (int k = 0; k < SIM_MAXK; k++)
    free(W->keys[k].events);
  free(W->events);
  free(W->hash);
  for (size_t i = 0; i < W->nletters; i++)
    free(W->letters[i].bytes);
  free(W->letters);
  sim_view_free(&W->live);
  kl_conf_destroy(W->conf);
}

int sim_run(uint64_t seed, sim_backend_t backend, const uint64_t *words,
            size_t n, int verbose, sim_stats_t *stats, char *code,
            size_t code_size, char *msg, size_t msg_size) {
  static unsigned runs;
  sim_world_t world;
  memset(&world, 0, sizeof(world));
  W = &world;
  W->cfg = sim_cfg_of(seed);
  W->backend = backend;
  W->seed = seed;
  W->verbose = verbose;
  W->pg_uri = sim_pg_uri;
  W->hostile = sim_hostile;
  /* In the schedule's first half, so that a new log follows; with
   * --recreate every schedule, else one in eight on LMDB and one in three
   * of PostgreSQL's fewer ones (the default run resets the store too). */
  uint64_t r = sim_mix(seed ^ 0x7e5e7ULL);
  W->recreate_at =
      (sim_recreate || (r >> 40) % (backend == SIM_PG ? 3 : 8) == 0) && n >= 4
          ? 1 + (size_t)(r % (n / 2))
          : 0;
  W->conf = sim_conf();
  snprintf(W->tag, sizeof(W->tag), "r%u_", runs++);
  kl__store_owner_make(&W->fleet, "simcluster", "simfleet");
  W->ntopics = sim_topics;
  W->nparts = W->ntopics * W->cfg.partitions;
  W->nkeys = W->ntopics * W->cfg.keys;
  W->shared = W->ntopics > 1 && backend == SIM_PG;
  for (int t = 0; t < W->ntopics; t++) {
    snprintf(W->topics[t], sizeof(W->topics[t]), "sim%s%s", W->tag,
             t ? "b" : "");
    snprintf(W->dlqs[t], sizeof(W->dlqs[t]), "sim%s%s.dlq", W->tag,
             t ? "b" : "");
  }
  name_keys(seed);
  kl__store_set_clock(sim_clock);
  kl__set_now_ms(sim_clock);
  sim_view_init(&W->live);
  sim_lmdb_envs_tick();
  W->store = backend == SIM_LMDB ? sim_lmdb_env(0) : sim_store_open(W->pg_uri);
  for (int o = 0; o < W->cfg.owners && !W->failed; o++)
    sim_owner_init(&W->owners[o], o);
  if (verbose)
    printf("schedule %" PRIu64 " on %s: %d topics of %d partitions and %d "
           "keys, %d owners, batches of at most %d\n",
           seed, backend == SIM_PG ? "postgresql" : "lmdb", W->ntopics,
           W->cfg.partitions, W->cfg.keys, W->cfg.owners, W->cfg.batch_max);
  for (size_t i = 0; i < n && !W->failed; i++) {
    W->step = i;
    step(words[i]);
  }
  W->step = n;
  if (!W->failed)
    drain();
  if (!W->failed)
    final_checks();
  W->stats.schedules = 1;
  int failed = W->failed;
  snprintf(code, code_size, "%s", W->fail_code);
  snprintf(msg, msg_size, "%s", W->fail_msg);
  if (failed && verbose)
    printf("  FAILED at step %zu: %s: %s\n", W->fail_step + 1, W->fail_code,
           W->fail_msg);
  world_free();
  kl__store_set_clock(NULL);
  kl__set_now_ms(NULL);
  if (stats) {
    uint64_t *to = (uint64_t *)stats, *from = (uint64_t *)&W->stats;
    for (size_t i = 0; i < sizeof(*stats) / sizeof(uint64_t); i++)
      to[i] += from[i];
  }
  W = NULL;
  return failed ? -1 : 0;
}
