/* The worker's outbox publisher (outbox.h). */
#include "worker/outbox.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/log.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "keylane/producer.h"
#include "worker/dlq.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"

#define KL_COMP "outbox"
/* A refused publish, or a failed store call, is tried again after this. */
#define KL_OB_RETRY_NS 1000000000LL
/* A follow-up kept in the store (Kafka refused it and its dead letter) is
 * published again after this, once the store says it is still there. */
#define KL_OB_KEPT_RETRY_NS 10000000000LL
#define KL_TOPIC_NAME_MAX 249

/* One record listed from the store: queued, then in flight until its
 * delivery report, then (acknowledged) its seq waits for removal. */
typedef struct kl_ob_item {
  struct kl_ob_item *next;
  int32_t partition;
  uint64_t gen; /* the ownership it was listed under */
  uint64_t seq;
  /* Set aside (Kafka refused it for good): why, and its letter's state;
   * kept: its letter was refused too, so it stays in the store until
   * kept_retry_ns; told: that was logged as an error once. */
  char *why;
  int aside_inflight, kept, told;
  int64_t kept_retry_ns;
  size_t len;
  unsigned char rec[];
} kl_ob_item_t;

typedef struct kl_ob_part {
  uint64_t gen;              /* 0: not owned */
  int dirty;                 /* the store may hold records not listed yet */
  uint64_t listed;           /* the highest seq listed */
  kl_ob_item_t *head, *tail; /* to publish, in seq order */
  size_t held;               /* listed and not removed, of this gen */
  uint64_t *acked;           /* seqs acknowledged, to remove */
  size_t nacked, acked_cap;
  int64_t retry_ns;    /* a publish was refused: not before then */
  kl_ob_item_t *aside; /* to set aside, or their letters in flight */
  int64_t aside_retry_ns;
  int64_t progress_ns; /* the last ack, or when it began to hold records */
} kl_ob_part_t;

struct kl__outbox {
  kl_conf_t *conf;
  char *topic;
  kl_store_t *store;
  kl_producer_t *producer; /* made on the first publish */
  kl__dlq_t *dlq;          /* where follow-ups are set aside */
  kl_ob_part_t *parts;
  int32_t nparts;
  size_t max; /* worker.outbox.max */
  /* A store call failed: none before then. During an outage each call
   * is a connection attempt (and a warning); made at every tick for every
   * partition, they flooded the log and the server coming back. */
  int64_t store_retry_ns;
  _Atomic uint64_t pending, published, aside, kept, stalled_ms;
};

kl_err_t kl__outbox_new(const kl_conf_t *conf, const char *topic,
                        kl_store_t *store, kl__dlq_t *dlq, kl__outbox_t **out) {
  kl__outbox_t *ob = calloc(1, sizeof(*ob));
  if (!ob || !(ob->conf = kl_conf_dup(conf)) || !(ob->topic = strdup(topic))) {
    if (ob)
      kl_conf_destroy(ob->conf);
    free(ob);
    return kl__err(KL_ENOMEM, "outbox: out of memory");
  }
  /* Its producer publishes the ids keylane derived: they begin with '~'. */
  if (kl_conf_set(ob->conf, "producer.follow_ups", "true")) {
    kl__outbox_destroy(ob, 0);
    return kl__err(KL_ENOMEM, "outbox: out of memory");
  }
  ob->store = store;
  ob->dlq = dlq;
  ob->max = (size_t)kl__conf_int(conf, "worker.outbox.max");
  *out = ob;
  return KL_OK;
}

static kl_ob_part_t *ob_part(kl__outbox_t *ob, int32_t partition) {
  if (partition < 0)
    return NULL;
  if (partition >= ob->nparts) {
    kl_ob_part_t *p = kl__grow_zeroed(ob->parts, (size_t)ob->nparts,
                                      (size_t)partition + 1, sizeof(*p));
    if (!p)
      kl__oom(KL_COMP);
    ob->parts = p;
    ob->nparts = partition + 1;
  }
  return &ob->parts[partition];
}

static void ob_item_free(kl_ob_item_t *it) {
  if (it)
    free(it->why);
  free(it);
}

static void ob_free_list(kl_ob_item_t *it) {
  for (kl_ob_item_t *next; it; it = next) {
    next = it->next;
    ob_item_free(it);
  }
}

/* A letter in flight for an item freed here finds nothing at its ack: the
 * record stays in the store, and its next owner sets it aside again. */
static void ob_unqueue(kl__outbox_t *ob, kl_ob_part_t *part) {
  ob_free_list(part->head);
  ob_free_list(part->aside);
  part->aside = NULL;
  part->head = part->tail = NULL;
  ob->pending -= part->held;
  part->held = 0;
}

void kl__outbox_own(kl__outbox_t *ob, int32_t partition, uint64_t gen) {
  kl_ob_part_t *part = ob_part(ob, partition);
  ob_unqueue(ob, part);
  part->gen = gen;
  part->dirty = 1;
  part->listed = 0;
  part->retry_ns = 0;
}

void kl__outbox_committed(kl__outbox_t *ob, int32_t partition, uint64_t gen) {
  kl_ob_part_t *part = ob ? ob_part(ob, partition) : NULL;
  if (part && part->gen == gen)
    part->dirty = 1;
}

void kl__outbox_drop(kl__outbox_t *ob, int32_t partition) {
  kl_ob_part_t *part = ob ? ob_part(ob, partition) : NULL;
  if (!part)
    return;
  ob_unqueue(ob, part);
  part->gen = 0;
  part->dirty = 0;
}

size_t kl__outbox_held(const kl__outbox_t *ob, int32_t partition) {
  if (!ob || partition < 0 || partition >= ob->nparts)
    return 0;
  return ob->parts[partition].held;
}

int kl__outbox_full(const kl__outbox_t *ob, int32_t partition, int half) {
  size_t held = kl__outbox_held(ob, partition);
  return half ? held > ob->max / 2 : held >= ob->max;
}

void kl__outbox_stats(const kl__outbox_t *ob, kl__outbox_stats_t *stats) {
  memset(stats, 0, sizeof(*stats));
  if (!ob)
    return;
  stats->pending = ob->pending;
  stats->published = ob->published;
  stats->aside = ob->aside;
  stats->kept = ob->kept;
  stats->stalled_ms = ob->stalled_ms;
}

/* ---- listing --------------------------------------------------------- */

static int ob_store_ready(const kl__outbox_t *ob, int64_t now) {
  return now >= ob->store_retry_ns;
}

/* After a failed store call: no other before KL_OB_RETRY_NS. What was
 * listed stays queued, what is to be removed stays to be removed. */
static void ob_store_failed(kl__outbox_t *ob, int64_t now) {
  ob->store_retry_ns = now + KL_OB_RETRY_NS;
}

typedef struct kl_ob_list {
  kl_ob_part_t *part;
  int32_t partition;
  size_t n;
} kl_ob_list_t;

static int ob_listed(void *opaque, uint64_t seq, const void *rec, size_t len) {
  kl_ob_list_t *l = opaque;
  kl_ob_item_t *it = malloc(sizeof(*it) + len);
  if (!it)
    kl__oom(KL_COMP);
  *it = (kl_ob_item_t){
      .partition = l->partition, .gen = l->part->gen, .seq = seq, .len = len};
  memcpy(it->rec, rec, len);
  if (l->part->tail)
    l->part->tail->next = it;
  else
    l->part->head = it;
  l->part->tail = it;
  l->part->listed = seq;
  l->n++;
  return 0;
}

/* Lists what the store holds beyond the last seq listed, as much as the
 * bound leaves room for; the partition stays dirty while more may be
 * there. */
static void ob_list(kl__outbox_t *ob, int32_t partition, int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  if (part->held >= ob->max)
    return;
  size_t room = ob->max - part->held;
  kl_ob_list_t l = {part, partition, 0};
  kl_err_t err = kl__store_outbox_list(ob->store, ob->topic, partition,
                                       part->listed, room, ob_listed, &l);
  if (err) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": reading the outbox failed; the outbox "
             "calls the store again in %lld s: %s",
             partition, KL_OB_RETRY_NS / 1000000000LL, kl_err_detail());
    ob_store_failed(ob, now);
    return;
  }
  if (!part->held && l.n)
    part->progress_ns = now;
  part->held += l.n;
  ob->pending += l.n;
  part->dirty = l.n == room;
}

/* ---- publishing ------------------------------------------------------ */

/* @p it is in Kafka (published, or set aside): its seq is to be removed. */
static void ob_acked(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl_ob_part_t *part = &ob->parts[it->partition];
  part->progress_ns = kl__mono_ns();
  uint64_t *v =
      kl__grow(part->acked, &part->acked_cap, part->nacked, sizeof(*v), 64);
  if (!v)
    kl__oom(KL_COMP);
  part->acked = v;
  /* Removed whoever owns it now: Kafka has it. It counts against the
   * bound until removed only while its ownership lasts. */
  part->acked[part->nacked++] =
      it->seq | (it->gen == part->gen ? 0 : 1ULL << 63);
}

/* A failed delivery goes back into its queue in seq order, so that it is
 * published again before the records committed after it, and failures
 * reported one after another keep their order. */
static void ob_requeue(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl_ob_part_t *part = &ob->parts[it->partition];
  if (it->gen != part->gen) { /* the new owner listed it again */
    ob_item_free(it);
    return;
  }
  kl_ob_item_t **at = &part->head; /* the queue stays in seq order */
  while (*at && (*at)->seq < it->seq)
    at = &(*at)->next;
  it->next = *at;
  *at = it;
  if (!it->next)
    part->tail = it;
}

/* Kafka refused @p it for good: its whole copy goes to the dead-letter
 * topic (ob_send_aside()), so that the follow-ups behind it go on; it is
 * removed from the store once that letter is acknowledged, never before. */
static void ob_set_aside(kl__outbox_t *ob, kl_ob_item_t *it, const char *why) {
  kl_ob_part_t *part = &ob->parts[it->partition];
  if (it->gen != part->gen) { /* the new owner listed it again */
    ob_item_free(it);
    return;
  }
  if (!it->told)
    KL_LOG_E(KL_COMP,
             "follow-up seq=%" PRIu64 " of partition=%" PRId32
             " is refused by Kafka for good, so it is set aside as a dead "
             "letter (reason outbox) and the follow-ups after it go on: %s",
             it->seq, it->partition, why);
  free(it->why);
  it->why = strdup(why);
  it->next = part->aside;
  part->aside = it;
}

static void ob_delivered(void *opaque, const kl_delivery_t *d) {
  kl__outbox_t *ob = opaque;
  kl_ob_item_t *it = d->opaque;
  if (d->err == KL_OK) {
    ob_acked(ob, it);
    ob->published++;
    ob_item_free(it);
    return;
  }
  const char *why = d->errmsg ? d->errmsg : kl_err_name(d->err);
  if (!kl_err_is_retriable(d->err)) {
    ob_set_aside(ob, it, why);
    return;
  }
  char id[KL__ESCAPED_SIZE(KL_ID_MAX)];
  KL_LOG_W(KL_COMP,
           "follow-up id=%s of partition=%" PRId32 " was not "
           "acknowledged (%s), it is published again",
           kl__escape(id, sizeof(id), d->id, d->id_len), it->partition, why);
  ob_requeue(ob, it);
}

static kl_err_t ob_producer(kl__outbox_t *ob) {
  if (ob->producer)
    return KL_OK;
  return kl_producer_new(ob->conf, ob_delivered, ob, &ob->producer);
}

/* Publishes @p it; @returns KL_OK once queued (it is the producer's then),
 * else it stays the caller's. */
static kl_err_t ob_send(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl__outbox_rec_t rec;
  if (kl__outbox_rec_decode(it->rec, it->len, &rec))
    return kl__err(KL_EDECODE_TRUNCATED,
                   "outbox record seq=%" PRIu64 " of "
                   "partition=%" PRId32 " is not a follow-up (%zu bytes): the "
                   "store is damaged",
                   it->seq, it->partition, it->len);
  if (KL__MUTANT(KL__MUTANT_TIMER_EMIT)) /* test only: common/mutant.h */
    rec.event.not_before = 0;
  char topic[KL_TOPIC_NAME_MAX + 1];
  const char *dest = ob->topic;
  if (rec.topic_len) {
    memcpy(topic, rec.topic, rec.topic_len);
    topic[rec.topic_len] = '\0';
    dest = topic;
  }
  kl_err_t err = ob_producer(ob);
  return err ? err : kl_publish(ob->producer, dest, &rec.event, it);
}

static void ob_publish(kl__outbox_t *ob, int32_t partition, int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  if (now < part->retry_ns)
    return;
  while (part->head) {
    kl_ob_item_t *it = part->head;
    part->head = it->next;
    if (!part->head)
      part->tail = NULL;
    it->next = NULL;
    kl_err_t err = ob_send(ob, it);
    if (err == KL_OK)
      continue;
    if (!kl_err_is_retriable(err) && err != KL_ENOMEM &&
        err != KL_EPARTITIONS) {
      ob_set_aside(ob, it, kl_err_detail());
      continue;
    }
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": publishing follow-up seq=%" PRIu64
             " failed, tried again in 1 s: %s",
             partition, it->seq, kl_err_detail());
    ob_requeue(ob, it);
    part->retry_ns = now + KL_OB_RETRY_NS;
    return;
  }
}

/* ---- setting aside --------------------------------------------------- */

/* The dead letter of @p it, whose record is @p rec: the follow-up's key and
 * envelope, from the place of the event that emitted it (its id says
 * which; an id of another form is the outbox's own partition). */
static kl_err_t ob_letter(kl__outbox_t *ob, const kl_ob_item_t *it,
                          const kl__outbox_rec_t *rec) {
  char dest[KL_TOPIC_NAME_MAX + 1], src_topic[KL_TOPIC_NAME_MAX + 1];
  snprintf(dest, sizeof(dest), "%.*s",
           rec->topic_len ? (int)rec->topic_len : (int)strlen(ob->topic),
           rec->topic_len ? rec->topic : ob->topic);
  kl__emit_src_t src = {.topic = ob->topic,
                        .topic_len = strlen(ob->topic),
                        .partition = it->partition};
  kl__emit_id_parse(rec->event.id, rec->event.id_len, &src);
  snprintf(src_topic, sizeof(src_topic), "%.*s", (int)src.topic_len, src.topic);
  void *value = NULL;
  size_t len = 0;
  kl_err_t err = kl_event_encode(&rec->event, &value, &len);
  if (err)
    return err;
  rd_kafka_message_t m = {.key = (void *)rec->event.key,
                          .key_len = rec->event.key_len,
                          .payload = value,
                          .len = len,
                          .partition = src.partition,
                          .offset = src.offset};
  int64_t now_ms = kl__now_ms();
  kl__dlq_letter_t letter = {
      &m, KL__DLQ_OUTBOX, it->why, 0, now_ms, now_ms, -1, 0, dest};
  kl__dlq_ref_t ref = {it->partition, (int64_t)it->seq, KL__DLQ_OUTBOX_GEN};
  err = kl__dlq_send(ob->dlq, src_topic, &letter, &ref);
  free(value);
  return err;
}

/* Kafka refused @p it's dead letter too (@p why): a copy cut short would
 * lose it, so it stays in the store, listed by `keylane store outbox`,
 * counted by keylane_worker_outbox_kept, /healthz "degraded", until an
 * operator drops it or the limits let it through (ob_retry_kept()). */
static void ob_keep(kl_ob_item_t *it, const char *why, int64_t now) {
  if (!it->told) {
    char id[KL__ESCAPED_SIZE(KL_ID_MAX)] = "?";
    kl__outbox_rec_t rec;
    if (!kl__outbox_rec_decode(it->rec, it->len, &rec))
      kl__escape(id, sizeof(id), rec.event.id, rec.event.id_len);
    KL_LOG_E(KL_COMP,
             "follow-up seq=%" PRIu64 " id=%s of partition=%" PRId32
             " (%zu bytes) is refused by Kafka, and so is its dead letter "
             "(%s): it stays in the store's outbox and is published again "
             "every %lld s. Raise the destination's and the dead-letter "
             "topic's max.message.bytes and the worker's "
             "kafka.message.max.bytes, or drop it: keylane store outbox "
             "--drop %" PRId32 ":%" PRIu64,
             it->seq, id, it->partition, it->len, why,
             KL_OB_KEPT_RETRY_NS / 1000000000LL, it->partition, it->seq);
    it->told = 1;
  }
  it->kept = 1;
  it->kept_retry_ns = now + KL_OB_KEPT_RETRY_NS;
}

/* Produces the dead letters of @p part's follow-ups set aside. */
static void ob_send_aside(kl__outbox_t *ob, int32_t partition, int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  if (now < part->aside_retry_ns)
    return;
  for (kl_ob_item_t *it = part->aside; it; it = it->next) {
    kl__outbox_rec_t rec;
    if (it->aside_inflight || it->kept ||
        kl__outbox_rec_decode(it->rec, it->len, &rec))
      continue;
    kl_err_t err = ob_letter(ob, it, &rec);
    if (err == KL_EKAFKA) {
      ob_keep(it, kl_err_detail(), now);
    } else if (err) {
      KL_LOG_W(KL_COMP,
               "setting follow-up seq=%" PRIu64 " of partition=%" PRId32
               " aside failed, tried again in 1 s: %s",
               it->seq, partition, kl_err_detail());
      part->aside_retry_ns = now + KL_OB_RETRY_NS;
      return;
    } else {
      it->aside_inflight = 1;
    }
  }
}

void kl__outbox_aside_acked(kl__outbox_t *ob, const kl__dlq_ref_t *ref,
                            kl_err_t err, const char *errstr) {
  kl_ob_part_t *part =
      ob && ref->partition < ob->nparts ? &ob->parts[ref->partition] : NULL;
  kl_ob_item_t **at = part ? &part->aside : NULL;
  while (at && *at && (*at)->seq != (uint64_t)ref->offset)
    at = &(*at)->next;
  if (!at || !*at)
    return; /* given up meanwhile: its next owner sets it aside again */
  kl_ob_item_t *it = *at;
  it->aside_inflight = 0;
  if (err == KL_EKAFKA && KL__MUTANT(KL__MUTANT_ASIDE))
    err = KL_OK; /* test only (common/mutant.h) */
  if (err == KL_EKAFKA) {
    ob_keep(it, errstr, kl__mono_ns());
    return;
  }
  if (err) {
    KL_LOG_W(KL_COMP,
             "the dead letter of follow-up seq=%" PRIu64
             " of partition=%" PRId32
             " was not acknowledged, it is produced again: %s",
             it->seq, ref->partition, errstr);
    return;
  }
  *at = it->next;
  ob_acked(ob, it);
  ob->aside++;
  ob_item_free(it);
}

typedef struct kl_ob_probe {
  uint64_t seq;
  int found;
} kl_ob_probe_t;

static int ob_probed(void *opaque, uint64_t seq, const void *rec, size_t len) {
  (void)rec, (void)len;
  kl_ob_probe_t *probe = opaque;
  probe->found = seq == probe->seq;
  return 0;
}

/* Every KL_OB_KEPT_RETRY_NS, a kept follow-up that an operator dropped
 * from the store meanwhile is forgotten; one still there is published
 * again (a topic's limit may have been raised). @returns how many
 * partition @p partition keeps still. */
static uint64_t ob_retry_kept(kl__outbox_t *ob, int32_t partition,
                              int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  uint64_t kept = 0;
  for (kl_ob_item_t **at = &part->aside; *at;) {
    kl_ob_item_t *it = *at;
    if (!it->kept || now < it->kept_retry_ns || !ob_store_ready(ob, now)) {
      kept += (uint64_t)it->kept;
      at = &it->next;
      continue;
    }
    kl_ob_probe_t probe = {it->seq, 0};
    if (kl__store_outbox_list(ob->store, ob->topic, partition, it->seq - 1, 1,
                              ob_probed, &probe)) {
      KL_LOG_W(KL_COMP,
               "partition=%" PRId32 ": reading the outbox failed; the outbox "
               "calls the store again in %lld s: %s",
               partition, KL_OB_RETRY_NS / 1000000000LL, kl_err_detail());
      ob_store_failed(ob, now);
      continue; /* ob_store_ready() is false now: the rest are counted */
    }
    *at = it->next;
    it->next = NULL;
    if (probe.found) {
      it->kept = 0;
      ob_requeue(ob, it);
      continue;
    }
    KL_LOG_I(KL_COMP,
             "follow-up seq=%" PRIu64 " of partition=%" PRId32
             " is no longer in the store's outbox (dropped): forgotten",
             it->seq, partition);
    part->held -= part->held ? 1 : 0;
    ob->pending -= ob->pending ? 1 : 0;
    ob_item_free(it);
  }
  return kept;
}

/* Removes the acknowledged records of every partition in ONE write (one
 * fsync however many partitions publish); the top bit of an acked seq
 * marks one listed under an earlier ownership, which the bound no longer
 * counts. */
static void ob_remove(kl__outbox_t *ob, int64_t now) {
  size_t n = 0;
  for (int32_t p = 0; p < ob->nparts; p++)
    n += ob->parts[p].nacked;
  if (!n)
    return;
  kl__outbox_ack_t *acks = malloc(n * sizeof(*acks));
  if (!acks)
    kl__oom(KL_COMP);
  n = 0;
  for (int32_t p = 0; p < ob->nparts; p++)
    for (size_t i = 0; i < ob->parts[p].nacked; i++)
      acks[n++] = (kl__outbox_ack_t){p, ob->parts[p].acked[i] & ~(1ULL << 63)};
  kl_err_t err = kl__store_outbox_del(ob->store, ob->topic, acks, n);
  free(acks);
  if (err) {
    KL_LOG_W(KL_COMP,
             "removing %zu published follow-ups failed; the outbox calls the "
             "store again in %lld s, to remove them then: %s",
             n, KL_OB_RETRY_NS / 1000000000LL, kl_err_detail());
    ob_store_failed(ob, now);
    return;
  }
  for (int32_t p = 0; p < ob->nparts; p++) {
    kl_ob_part_t *part = &ob->parts[p];
    size_t mine = 0;
    for (size_t i = 0; i < part->nacked; i++)
      mine += !(part->acked[i] >> 63);
    part->nacked = 0;
    part->held -= mine < part->held ? mine : part->held;
    ob->pending -= mine;
  }
}

void kl__outbox_tick(kl__outbox_t *ob) {
  if (!ob)
    return;
  int64_t now = kl__mono_ns();
  uint64_t stalled_ms = 0, kept = 0;
  for (int32_t p = 0; p < ob->nparts; p++) {
    kl_ob_part_t *part = &ob->parts[p];
    if (part->gen && part->dirty && ob_store_ready(ob, now))
      ob_list(ob, p, now);
    if (part->gen && part->head)
      ob_publish(ob, p, now);
    if (part->gen && part->aside)
      ob_send_aside(ob, p, now);
    uint64_t kept_here =
        part->gen && part->aside ? ob_retry_kept(ob, p, now) : 0;
    kept += kept_here;
    /* What is kept waits for an operator: /healthz says so, not as a
     * stall. */
    if (part->gen && part->held > kept_here && now - part->progress_ns > 0 &&
        (uint64_t)(now - part->progress_ns) / 1000000 > stalled_ms)
      stalled_ms = (uint64_t)(now - part->progress_ns) / 1000000;
  }
  ob->stalled_ms = stalled_ms;
  ob->kept = kept;
  if (ob->producer)
    kl_producer_poll(ob->producer, 0);
  if (ob_store_ready(ob, now))
    ob_remove(ob, now);
}

static size_t ob_kept_count(const kl_ob_part_t *part) {
  size_t n = 0;
  for (const kl_ob_item_t *it = part->aside; it; it = it->next)
    n += (size_t)it->kept;
  return n;
}

void kl__outbox_drain(kl__outbox_t *ob, int32_t partition, int wait_ms) {
  kl_ob_part_t *part = ob ? ob_part(ob, partition) : NULL;
  if (!part || !part->gen)
    return;
  int64_t end = kl__mono_ns() + (int64_t)wait_ms * 1000000;
  kl__outbox_tick(ob);
  /* What is kept waits for an operator, not for this drain. */
  while ((part->held > ob_kept_count(part) || part->dirty) &&
         kl__mono_ns() < end) {
    if (ob->producer) {
      kl_producer_poll(ob->producer, 20);
    } else { /* nothing to poll: ticks in the store's backoff would spin */
      kl__sleep_ms(20);
    }
    kl__outbox_tick(ob);
    part = &ob->parts[partition]; /* the array may have moved */
  }
  kl__outbox_drop(ob, partition);
}

void kl__outbox_destroy(kl__outbox_t *ob, int wait_ms) {
  if (!ob)
    return;
  if (ob->producer) {
    kl_flush(ob->producer, wait_ms);
    ob_remove(ob, kl__mono_ns());      /* the last chance, backoff or not */
    kl_producer_destroy(ob->producer); /* reports what is left as failed */
  }
  for (int32_t p = 0; p < ob->nparts; p++) {
    ob->parts[p].gen = 0;
    ob_unqueue(ob, &ob->parts[p]);
    free(ob->parts[p].acked);
  }
  free(ob->parts);
  kl_conf_destroy(ob->conf);
  free(ob->topic);
  free(ob);
}
