#include "cli/ledger_gen.h"

#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka_pos.h"
#include "common/strbuf.h"
#include "store/outbox_rec.h"
#include "handlers/ledger.h"
#include "worker/dlq.h"

typedef struct kl_gen_event {
  uint32_t key;
  int64_t seq, amount; /* amount < 0: a debit; seq 0: none (a credit) */
  int64_t to;          /* a transfer's destination key; -1 otherwise */
  int64_t not_before;  /* a delayed event's time; 0 otherwise */
  int64_t at;          /* a scheduled transfer's settle time; 0 otherwise */
  char id[37];
} kl_gen_event_t;

/* A delayed event of a key (a settle too) and when it is due. */
typedef struct kl_gen_due {
  uint32_t key;
  int64_t due;
} kl_gen_due_t;

struct kl__ledger_gen {
  int keys;
  int32_t partitions;
  uint64_t rnd;
  kl_gen_event_t *log;
  size_t count, cap;
  int64_t *balance, *last_seq;
  unsigned char *touched; /* a key that an event changed */
  int64_t *end;
  uint64_t republished, acked, failed, transfers, scheduled;
  /* kl__ledger_gen_read_follow_ups(): follow-up records in the applied
   * part of the log, and how many distinct ids they carry; the same of
   * the firing records of timers */
  uint64_t follow_ups, follow_up_ids, firings, firing_ids, firing_max;
  /* delayed events (settles included) by key, and each with its time */
  int64_t *delayed;
  kl_gen_due_t *dues;
  size_t ndues, dues_cap;
  /* kl__ledger_gen_check_due()'s looks, and the keys they found with
   * more delayed events applied than had come due */
  uint64_t due_checks, early;
};

static uint64_t gen_rand(kl__ledger_gen_t *gen) {
  uint64_t x = gen->rnd; /* xorshift64 */
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return gen->rnd = x;
}

kl__ledger_gen_t *kl__ledger_gen_new(int keys, int32_t partitions,
                                     uint64_t seed) {
  kl__ledger_gen_t *gen = calloc(1, sizeof(*gen));
  if (!gen)
    return NULL;
  gen->keys = keys;
  gen->partitions = partitions;
  gen->rnd = seed ? seed : 0x2545F4914F6CDD1DULL;
  gen->balance = calloc((size_t)keys, sizeof(int64_t));
  gen->last_seq = calloc((size_t)keys, sizeof(int64_t));
  gen->end = calloc((size_t)partitions, sizeof(int64_t));
  gen->touched = calloc((size_t)keys, 1);
  gen->delayed = calloc((size_t)keys, sizeof(int64_t));
  if (!gen->balance || !gen->last_seq || !gen->end || !gen->touched ||
      !gen->delayed) {
    kl__ledger_gen_destroy(gen);
    return NULL;
  }
  return gen;
}

void kl__ledger_gen_destroy(kl__ledger_gen_t *gen) {
  if (!gen)
    return;
  free(gen->log);
  free(gen->balance);
  free(gen->last_seq);
  free(gen->touched);
  free(gen->delayed);
  free(gen->dues);
  free(gen->end);
  free(gen);
}

static int gen_key(char *buf, size_t size, uint32_t key) {
  return snprintf(buf, size, "acct-%04" PRIu32, key);
}

/* Publishes the event @p type of @p key with the payload @p a, delayed
 * until @p not_before (0: not). */
static kl_err_t ledger_publish(kl_producer_t *producer, const char *topic,
                               const char *key, size_t key_len, const char *id,
                               const char *type, const kl_ledger_args_t *a,
                               int64_t not_before, void *opaque) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, a);
  kl_event_t ev = {.key = key,
                   .key_len = key_len,
                   .id = id,
                   .id_len = id ? strlen(id) : 0,
                   .type = type,
                   .type_len = strlen(type),
                   .payload = sb.data,
                   .payload_len = sb.size,
                   .not_before = not_before};
  kl_err_t err = kl_publish(producer, topic, &ev, opaque);
  msgpack_sbuffer_destroy(&sb);
  return err;
}

kl_err_t kl__ledger_gen_send(kl_producer_t *producer, const char *topic,
                             const char *key, size_t key_len, const char *id,
                             const char *type, int64_t amount, int64_t seq,
                             void *opaque) {
  kl_ledger_args_t a = {.amount = amount, .seq = seq, .has_seq = 1};
  return ledger_publish(producer, topic, key, key_len, id, type, &a, 0, opaque);
}

kl_err_t kl__ledger_gen_send_transfer(kl_producer_t *producer,
                                      const char *topic, const char *from,
                                      const char *to, const char *id,
                                      int64_t amount, int64_t seq,
                                      void *opaque) {
  kl_ledger_args_t a = {.amount = amount,
                        .seq = seq,
                        .has_seq = 1,
                        .to = to,
                        .to_len = strlen(to)};
  return ledger_publish(producer, topic, from, strlen(from), id, "transfer", &a,
                        0, opaque);
}

static kl_err_t gen_send(kl_producer_t *producer, const char *topic,
                         const kl_gen_event_t *e) {
  char key[32], to[32];
  int klen = gen_key(key, sizeof(key), e->key);
  kl_ledger_args_t a = {.amount = e->amount < 0 ? -e->amount : e->amount,
                        .seq = e->seq,
                        .has_seq = e->seq > 0,
                        .at = e->at,
                        .has_at = e->at > 0};
  if (e->to >= 0) {
    a.to = to;
    a.to_len = (size_t)gen_key(to, sizeof(to), (uint32_t)e->to);
  }
  const char *type = e->to >= 0      ? "transfer"
                     : e->amount < 0 ? "debit"
                                     : "credit";
  return ledger_publish(producer, topic, key, (size_t)klen, e->id, type, &a,
                        e->not_before, NULL);
}

/* The log's next entry, for a new event of a random key. */
static kl_gen_event_t *gen_next(kl__ledger_gen_t *gen, uint64_t r) {
  kl_gen_event_t *log =
      kl__grow(gen->log, &gen->cap, gen->count, sizeof(*log), 1024);
  if (!log)
    return NULL;
  gen->log = log;
  kl_gen_event_t *e = &gen->log[gen->count];
  e->key = (uint32_t)(r % (uint64_t)gen->keys);
  e->seq = gen->last_seq[e->key] + 1;
  e->amount = (int64_t)((r >> 20) % 1000) + 1;
  e->to = -1;
  e->not_before = e->at = 0;
  kl_event_make_id(e->id);
  return e;
}

/* Books that a delayed event of @p key is due at @p due. */
static kl_err_t gen_due(kl__ledger_gen_t *gen, uint32_t key, int64_t due) {
  kl_gen_due_t *dues =
      kl__grow(gen->dues, &gen->dues_cap, gen->ndues, sizeof(*dues), 1024);
  if (!dues)
    return KL_ENOMEM;
  gen->dues = dues;
  dues[gen->ndues++] = (kl_gen_due_t){key, due};
  gen->delayed[key]++;
  return KL_OK;
}

/* Sends @p e and, once it is queued, books it. */
static kl_err_t gen_book(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, kl_gen_event_t *e) {
  /* room for its due first: once sent, it is booked whole */
  int64_t due = e->at ? e->at : e->not_before;
  kl_err_t err = due ? gen_due(gen, e->key, due) : KL_OK;
  if (!err && (err = gen_send(producer, topic, e)) && due)
    gen->ndues--, gen->delayed[e->key]--;
  if (err)
    return err;
  if (e->seq)
    gen->last_seq[e->key] = e->seq;
  gen->touched[e->key] = 1;
  if (e->to >= 0) {
    gen->balance[e->key] -= e->amount;
    gen->balance[e->to] += e->amount;
    gen->touched[e->to] = 1;
    gen->transfers++;
    gen->scheduled += e->at > 0;
  } else {
    gen->balance[e->key] += e->amount;
  }
  gen->count++;
  return KL_OK;
}

kl_err_t kl__ledger_gen_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                const char *topic) {
  uint64_t r = gen_rand(gen);
  kl_gen_event_t *e = gen_next(gen, r);
  if (!e)
    return KL_ENOMEM;
  if ((r >> 40) % 10 < 3)
    e->amount = -e->amount;
  return gen_book(gen, producer, topic, e);
}

/* A transfer from a random key to another, settled at @p at (0: now). */
static kl_err_t gen_transfer(kl__ledger_gen_t *gen, kl_producer_t *producer,
                             const char *topic, int64_t at) {
  if (gen->keys < 2)
    return KL_EINVAL;
  uint64_t r = gen_rand(gen);
  kl_gen_event_t *e = gen_next(gen, r);
  if (!e)
    return KL_ENOMEM;
  e->to = (int64_t)((e->key + 1 + (r >> 44) % (uint64_t)(gen->keys - 1)) %
                    (uint64_t)gen->keys);
  e->at = at;
  return gen_book(gen, producer, topic, e);
}

kl_err_t kl__ledger_gen_transfer(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                 const char *topic) {
  return gen_transfer(gen, producer, topic, 0);
}

kl_err_t kl__ledger_gen_delayed(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                const char *topic, int64_t delay_ms) {
  kl_gen_event_t *e = gen_next(gen, gen_rand(gen));
  if (!e)
    return KL_ENOMEM;
  e->seq = 0; /* its time decides its place among the key's events */
  e->not_before = kl__now_ms() + delay_ms;
  return gen_book(gen, producer, topic, e);
}

kl_err_t kl__ledger_gen_scheduled(kl__ledger_gen_t *gen,
                                  kl_producer_t *producer, const char *topic,
                                  int64_t delay_ms) {
  return gen_transfer(gen, producer, topic, kl__now_ms() + delay_ms);
}

kl_err_t kl__ledger_gen_republish(kl__ledger_gen_t *gen,
                                  kl_producer_t *producer, const char *topic) {
  if (gen->count == 0)
    return KL_OK;
  const kl_gen_event_t *e = &gen->log[gen_rand(gen) % gen->count];
  kl_err_t err = gen_send(producer, topic, e);
  if (!err)
    gen->republished++;
  return err;
}

void kl__ledger_gen_on_delivery(void *opaque, const kl_delivery_t *d) {
  kl__ledger_gen_t *gen = opaque;
  if (d->err) {
    gen->failed++;
    fprintf(stderr, "ledger workload: event %s not delivered: %s\n", d->id,
            d->errmsg ? d->errmsg : kl_strerror(d->err));
    return;
  }
  gen->acked++;
  if (d->partition >= 0 && d->partition < gen->partitions &&
      d->offset + 1 > gen->end[d->partition])
    gen->end[d->partition] = d->offset + 1;
}

uint64_t kl__ledger_gen_published(const kl__ledger_gen_t *gen) {
  return gen->count;
}
uint64_t kl__ledger_gen_transfers(const kl__ledger_gen_t *gen) {
  return gen->transfers;
}

uint64_t kl__ledger_gen_republished(const kl__ledger_gen_t *gen) {
  return gen->republished;
}
uint64_t kl__ledger_gen_acked(const kl__ledger_gen_t *gen) {
  return gen->acked;
}
uint64_t kl__ledger_gen_failed(const kl__ledger_gen_t *gen) {
  return gen->failed;
}
int64_t kl__ledger_gen_end(const kl__ledger_gen_t *gen, int32_t partition) {
  return partition >= 0 && partition < gen->partitions ? gen->end[partition]
                                                       : 0;
}

typedef struct kl_gen_walk {
  const kl__ledger_gen_t *gen;
  const char *topic;
  kl__ledger_verdict_t *v;
  int32_t owned;
} kl_gen_walk_t;

static int gen_part(void *opaque, const char *topic, int32_t partition,
                    const kl_partition_state_t *state) {
  kl_gen_walk_t *w = opaque;
  if (strcmp(topic, w->topic) != 0 || partition >= w->gen->partitions)
    return 0;
  w->v->applied += state->applied;
  w->v->duplicates += state->duplicates;
  w->v->caught_up += state->watermark >= w->gen->end[partition];
  w->owned += state->epoch > 0;
  return 0;
}

/* The index of the workload's key @p key; -1 for one it has not. */
static int gen_key_index(const kl__ledger_gen_t *gen, const void *key,
                         size_t key_len) {
  char text[40];
  unsigned k;
  snprintf(text, sizeof(text), "%.*s", (int)key_len, (const char *)key);
  return sscanf(text, "acct-%u", &k) == 1 && k < (unsigned)gen->keys ? (int)k
                                                                     : -1;
}

static int gen_row(void *opaque, const void *key, size_t key_len,
                   const kl_ledger_entry_t *e) {
  kl_gen_walk_t *w = opaque;
  int k = gen_key_index(w->gen, key, key_len);
  if (k < 0) {
    w->v->keys_bad++;
    return 0;
  }
  w->v->violations += (uint64_t)e->violations;
  /* money is what the keys have and what they hold for a settle */
  w->v->total += e->balance + e->held;
  w->v->held += e->held;
  w->v->delayed_applied += (uint64_t)e->delayed;
  if (e->balance == w->gen->balance[k] && e->last_seq == w->gen->last_seq[k] &&
      e->held == 0 && e->delayed == w->gen->delayed[k])
    w->v->keys_ok++;
  else
    w->v->keys_bad++;
  return 0;
}

static kl_err_t gen_walk_parts(const kl__ledger_gen_t *gen, kl_store_t *store,
                               const char *topic, kl__ledger_verdict_t *v,
                               int32_t *owned) {
  memset(v, 0, sizeof(*v));
  kl_gen_walk_t w = {gen, topic, v, 0};
  kl_err_t err = kl_store_foreach_partition(store, gen_part, &w);
  *owned = w.owned;
  return err;
}

uint64_t kl__ledger_gen_applies(const kl__ledger_gen_t *gen) {
  return gen->count + gen->transfers + gen->scheduled;
}

typedef struct kl_gen_due_walk {
  const kl__ledger_gen_t *gen;
  int64_t *applied; /* per key: delayed events applied */
} kl_gen_due_walk_t;

static int gen_due_row(void *opaque, const void *key, size_t key_len,
                       const kl_ledger_entry_t *e) {
  kl_gen_due_walk_t *w = opaque;
  int k = gen_key_index(w->gen, key, key_len);
  if (k >= 0)
    w->applied[k] = e->delayed;
  return 0;
}

kl_err_t kl__ledger_gen_check_due(kl__ledger_gen_t *gen, kl_store_t *store,
                                  const char *topic) {
  int64_t *applied = calloc((size_t)gen->keys, sizeof(int64_t));
  int64_t *due = calloc((size_t)gen->keys, sizeof(int64_t));
  kl_gen_due_walk_t w = {gen, applied};
  kl_err_t err = applied && due ? kl__ledger_walk(store, topic, gen_due_row, &w)
                                : KL_ENOMEM;
  /* Read after the snapshot: whatever it shows was applied before now,
   * so an event not applied early was due by now. */
  int64_t now = kl__now_ms();
  for (size_t i = 0; !err && i < gen->ndues; i++)
    due[gen->dues[i].key] += gen->dues[i].due <= now;
  for (int k = 0; !err && k < gen->keys; k++)
    if (applied[k] > due[k]) {
      if (gen->early++ < 10)
        fprintf(stderr,
                "ledger workload: acct-%04d applied %" PRId64
                " delayed events when only %" PRId64 " were due at %" PRId64
                "\n",
                k, applied[k], due[k], now);
    }
  gen->due_checks += !err;
  free(applied);
  free(due);
  return err;
}

kl_err_t kl__ledger_gen_verify(const kl__ledger_gen_t *gen, kl_store_t *store,
                               const char *topic, kl__ledger_verdict_t *v) {
  int32_t owned;
  kl_err_t err = gen_walk_parts(gen, store, topic, v, &owned);
  kl_gen_walk_t w = {gen, topic, v, 0};
  if (!err)
    err = kl__ledger_walk(store, topic, gen_row, &w);
  for (int k = 0; k < gen->keys; k++) {
    v->keys += gen->touched[k];
    v->total_expected += gen->balance[k];
  }
  v->transfers = gen->transfers;
  v->scheduled = gen->scheduled;
  v->delayed = gen->ndues;
  v->due_checks = gen->due_checks;
  v->early = gen->early;
  v->follow_up_copies = gen->follow_ups - gen->follow_up_ids;
  v->firing_copies = gen->firings - gen->firing_ids;
  v->firing_max = gen->firing_max;
  v->total_ok = !err && v->total == v->total_expected;
  /* A transfer applies twice: its debit, then its credit (a follow-up); a
   * scheduled one three times: its debit, its settle, its credit.
   * Duplicates are the re-published events, the outbox's copies and the
   * timers' firing records beyond the one that ran each. */
  v->ok = !err && v->keys_bad == 0 && v->keys_ok == v->keys && v->total_ok &&
          v->violations == 0 && v->held == 0 &&
          v->delayed_applied == v->delayed && v->early == 0 &&
          v->applied == kl__ledger_gen_applies(gen) &&
          v->duplicates ==
              gen->republished + v->follow_up_copies + v->firing_copies &&
          gen->failed == 0 && v->caught_up == (uint64_t)gen->partitions &&
          (gen->follow_up_ids == gen->transfers + gen->scheduled ||
           gen->follow_ups == 0);
  return err;
}

int kl__ledger_gen_wait(const kl__ledger_gen_t *gen, kl_store_t *store,
                        const char *topic, int any_owner, int ms) {
  for (int t = 0; t < ms; t += 100) {
    kl__ledger_verdict_t v;
    int32_t owned;
    /* Caught up with what it published, and with the transfers' credits,
     * which their owners published after it. */
    if (gen_walk_parts(gen, store, topic, &v, &owned) == KL_OK &&
        (any_owner ? owned == gen->partitions
                   : (int32_t)v.caught_up == gen->partitions &&
                         v.applied >= kl__ledger_gen_applies(gen)))
      return 0;
    kl__sleep_ms(100);
  }
  return -1;
}

/* ---- the outbox's follow-ups in the log -------------------------------- */

typedef struct kl_gen_ids {
  kl_decoder_t *decoder;
  char (*id)[KL_ID_MAX + 2]; /* 'o' for a follow-up, 'f' for a firing */
  size_t n, cap;
  kl_err_t err;
} kl_gen_ids_t;

int kl__ledger_gen_decode_follow_up(kl_decoder_t *decoder,
                                    const rd_kafka_message_t *m,
                                    kl_event_t *ev) {
  kl__emit_src_t src;
  return kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, ev) ==
             KL_OK &&
         kl__emit_id_parse(ev->id, ev->id_len, &src) == 0;
}

/* 1 for the firing record of a timer (worker/fire.c): it carries the
 * delayed event's envelope, its id too. */
static int gen_is_firing(rd_kafka_message_t *m) {
  rd_kafka_headers_t *h = NULL;
  const void *v;
  size_t n;
  return rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR && h &&
         rd_kafka_header_get_last(h, KL__TIMER_HEADER, &v, &n) ==
             RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Keeps the id of a follow-up, and of a timer's firing record. */
static int gen_take_id(void *opaque, rd_kafka_message_t *m) {
  kl_gen_ids_t *ids = opaque;
  kl_event_t ev;
  int firing = gen_is_firing(m);
  if (firing ? kl_event_decode(ids->decoder, m->key, m->key_len, m->payload,
                               m->len, &ev) != KL_OK
             : !kl__ledger_gen_decode_follow_up(ids->decoder, m, &ev))
    return 0;
  void *grown = kl__grow(ids->id, &ids->cap, ids->n, sizeof(*ids->id), 1024);
  if (!grown) {
    ids->err = KL_ENOMEM;
    return KL__READ_STOP;
  }
  ids->id = grown;
  snprintf(ids->id[ids->n++], sizeof(*ids->id), "%c%.*s", firing ? 'f' : 'o',
           (int)ev.id_len, ev.id);
  return 0;
}

static int gen_id_cmp(const void *a, const void *b) {
  return strcmp(a, b);
}

typedef struct kl_gen_applied {
  const char *topic;
  int32_t partitions;
  kl__tp_range_t *ranges;
} kl_gen_applied_t;

/* The range a partition's owners applied: [0, watermark). */
static int gen_applied(void *opaque, const char *topic, int32_t partition,
                       const kl_partition_state_t *state) {
  kl_gen_applied_t *a = opaque;
  if (strcmp(topic, a->topic) == 0 && partition < a->partitions)
    a->ranges[partition].end = state->watermark;
  return 0;
}

kl_err_t kl__ledger_gen_read_follow_ups(kl__ledger_gen_t *gen,
                                        kl_store_t *store,
                                        const char *bootstrap,
                                        const char *topic) {
  kl__tp_range_t *ranges = calloc((size_t)gen->partitions, sizeof(*ranges));
  kl_gen_ids_t ids = {kl_decoder_new(), NULL, 0, 0, KL_OK};
  kl_conf_t *conf = kl_conf_new();
  rd_kafka_t *rk = NULL;
  kl_err_t err = ranges && ids.decoder && conf ? KL_OK : KL_ENOMEM;
  kl_gen_applied_t applied = {topic, gen->partitions, ranges};
  for (int32_t p = 0; ranges && p < gen->partitions; p++)
    ranges[p].partition = p;
  if (!err)
    err = kl_store_foreach_partition(store, gen_applied, &applied);
  if (!err)
    err = kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap);
  if (!err)
    err = kl__kafka_reader_new(conf, "keylane-ledger-verify", "earliest", &rk);
  if (!err)
    err = kl__kafka_read(rk, topic, ranges, (size_t)gen->partitions,
                         gen_take_id, &ids, NULL);
  err = err ? err : ids.err;
  if (!err) {
    qsort(ids.id, ids.n, sizeof(*ids.id), gen_id_cmp);
    gen->follow_ups = gen->follow_up_ids = gen->firings = gen->firing_ids = 0;
    gen->firing_max = 0;
    for (size_t i = 0, run = 0; i < ids.n; i++) {
      int firing = ids.id[i][0] == 'f';
      int new_id = i == 0 || strcmp(ids.id[i - 1], ids.id[i]) != 0;
      *(firing ? &gen->firings : &gen->follow_ups) += 1;
      *(firing ? &gen->firing_ids : &gen->follow_up_ids) += new_id;
      run = new_id ? 1 : run + 1;
      if (firing && run > gen->firing_max)
        gen->firing_max = run;
    }
  }
  if (rk)
    rd_kafka_destroy(rk);
  kl_conf_destroy(conf);
  kl_decoder_destroy(ids.decoder);
  free(ids.id);
  free(ranges);
  return err;
}
