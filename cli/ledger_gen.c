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

typedef struct kl_gen_event {
  uint32_t key;
  int64_t seq, amount; /* amount < 0: a debit */
  int64_t to;          /* a transfer's destination key; -1 otherwise */
  char id[37];
} kl_gen_event_t;

struct kl__ledger_gen {
  int keys;
  int32_t partitions;
  uint64_t rnd;
  kl_gen_event_t *log;
  size_t count, cap;
  int64_t *balance, *last_seq;
  unsigned char *touched; /* a key that an event changed */
  int64_t *end;
  uint64_t republished, acked, failed, transfers;
  /* kl__ledger_gen_read_follow_ups(): follow-up records in the applied
   * part of the log, and how many distinct ids they carry */
  uint64_t follow_ups, follow_up_ids;
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
  if (!gen->balance || !gen->last_seq || !gen->end || !gen->touched) {
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
  free(gen->end);
  free(gen);
}

static int gen_key(char *buf, size_t size, uint32_t key) {
  return snprintf(buf, size, "acct-%04" PRIu32, key);
}

/* Publishes the event @p type of @p key with the payload @p a. */
static kl_err_t ledger_publish(kl_producer_t *producer, const char *topic,
                               const char *key, size_t key_len, const char *id,
                               const char *type, const kl_ledger_args_t *a,
                               void *opaque) {
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
                   .payload_len = sb.size};
  kl_err_t err = kl_publish(producer, topic, &ev, opaque);
  msgpack_sbuffer_destroy(&sb);
  return err;
}

kl_err_t kl__ledger_gen_send(kl_producer_t *producer, const char *topic,
                             const char *key, size_t key_len, const char *id,
                             const char *type, int64_t amount, int64_t seq,
                             void *opaque) {
  kl_ledger_args_t a = {.amount = amount, .seq = seq, .has_seq = 1};
  return ledger_publish(producer, topic, key, key_len, id, type, &a, opaque);
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
                        opaque);
}

static kl_err_t gen_send(kl_producer_t *producer, const char *topic,
                         const kl_gen_event_t *e) {
  char key[32];
  int klen = gen_key(key, sizeof(key), e->key);
  if (e->to >= 0) {
    char to[32];
    gen_key(to, sizeof(to), (uint32_t)e->to);
    return kl__ledger_gen_send_transfer(producer, topic, key, to, e->id,
                                        e->amount, e->seq, NULL);
  }
  return kl__ledger_gen_send(producer, topic, key, (size_t)klen, e->id,
                             e->amount < 0 ? "debit" : "credit",
                             e->amount < 0 ? -e->amount : e->amount, e->seq,
                             NULL);
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
  kl_event_make_id(e->id);
  return e;
}

/* Sends @p e and, once it is queued, books it. */
static kl_err_t gen_book(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, kl_gen_event_t *e) {
  kl_err_t err = gen_send(producer, topic, e);
  if (err)
    return err;
  gen->last_seq[e->key] = e->seq;
  gen->touched[e->key] = 1;
  if (e->to >= 0) {
    gen->balance[e->key] -= e->amount;
    gen->balance[e->to] += e->amount;
    gen->touched[e->to] = 1;
    gen->transfers++;
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

kl_err_t kl__ledger_gen_transfer(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                 const char *topic) {
  if (gen->keys < 2)
    return KL_EINVAL;
  uint64_t r = gen_rand(gen);
  kl_gen_event_t *e = gen_next(gen, r);
  if (!e)
    return KL_ENOMEM;
  e->to = (int64_t)((e->key + 1 + (r >> 44) % (uint64_t)(gen->keys - 1)) %
                    (uint64_t)gen->keys);
  return gen_book(gen, producer, topic, e);
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

static int gen_row(void *opaque, const void *key, size_t key_len,
                   const kl_ledger_entry_t *e) {
  kl_gen_walk_t *w = opaque;
  char text[40];
  unsigned k;
  snprintf(text, sizeof(text), "%.*s", (int)key_len, (const char *)key);
  if (sscanf(text, "acct-%u", &k) != 1 || k >= (unsigned)w->gen->keys) {
    w->v->keys_bad++;
    return 0;
  }
  w->v->violations += (uint64_t)e->violations;
  w->v->total += e->balance;
  if (e->balance == w->gen->balance[k] && e->last_seq == w->gen->last_seq[k])
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
  v->follow_up_copies = gen->follow_ups - gen->follow_up_ids;
  v->total_ok = !err && v->total == v->total_expected;
  /* A transfer applies twice: its debit, then its credit (a follow-up).
   * Duplicates are the re-published events and the outbox's copies. */
  v->ok = !err && v->keys_bad == 0 && v->keys_ok == v->keys && v->total_ok &&
          v->violations == 0 && v->applied == gen->count + gen->transfers &&
          v->duplicates == gen->republished + v->follow_up_copies &&
          gen->failed == 0 && v->caught_up == (uint64_t)gen->partitions &&
          (gen->follow_up_ids == gen->transfers || gen->follow_ups == 0);
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
                         v.applied >= gen->count + gen->transfers))
      return 0;
    kl__sleep_ms(100);
  }
  return -1;
}

/* ---- the outbox's follow-ups in the log -------------------------------- */

typedef struct kl_gen_ids {
  kl_decoder_t *decoder;
  char (*id)[KL_ID_MAX + 1];
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

/* Keeps the id of a follow-up. */
static int gen_take_id(void *opaque, rd_kafka_message_t *m) {
  kl_gen_ids_t *ids = opaque;
  kl_event_t ev;
  if (!kl__ledger_gen_decode_follow_up(ids->decoder, m, &ev))
    return 0;
  void *grown = kl__grow(ids->id, &ids->cap, ids->n, sizeof(*ids->id), 1024);
  if (!grown) {
    ids->err = KL_ENOMEM;
    return KL__READ_STOP;
  }
  ids->id = grown;
  snprintf(ids->id[ids->n++], sizeof(*ids->id), "%.*s", (int)ev.id_len, ev.id);
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
    gen->follow_ups = ids.n;
    gen->follow_up_ids = 0;
    for (size_t i = 0; i < ids.n; i++)
      gen->follow_up_ids += i == 0 || strcmp(ids.id[i - 1], ids.id[i]) != 0;
  }
  if (rk)
    rd_kafka_destroy(rk);
  kl_conf_destroy(conf);
  kl_decoder_destroy(ids.decoder);
  free(ids.id);
  free(ranges);
  return err;
}
