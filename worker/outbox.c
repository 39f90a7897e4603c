/* The worker's outbox publisher (outbox.h). */
#include "worker/outbox.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "common/log.h"
#include "keylane/producer.h"
#include "worker/outbox_rec.h"
#include "worker/store_internal.h"

#define KL_COMP "outbox"
/* A refused publish, or a failed store call, is tried again after this. */
#define KL_OB_RETRY_NS 1000000000LL
#define KL_TOPIC_NAME_MAX 249

/* Out of memory for the bookkeeping: what is committed stays in the
 * store, and a restarted worker publishes it (the lanes do the same). */
static void kl_oom(void) {
  KL_LOG_E(KL_COMP, "out of memory in the outbox: exiting; a restarted "
                    "worker publishes what the store holds");
  abort();
}

/* One record listed from the store: queued, then in flight until its
 * delivery report, then (acknowledged) its seq waits for removal. */
typedef struct kl_ob_item {
  struct kl_ob_item *next;
  int32_t partition;
  uint64_t gen; /* the ownership it was listed under */
  uint64_t seq;
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
  int64_t retry_ns; /* a publish was refused: not before then */
} kl_ob_part_t;

struct kl__outbox {
  kl_conf_t *conf;
  char *topic;
  kl_store_t *store;
  kl_producer_t *producer; /* made on the first publish */
  kl_ob_part_t *parts;
  int32_t nparts;
  size_t max; /* worker.outbox.max */
  /* A store call failed: none before then. During an outage each call
   * is a connection attempt (and a warning); made at every tick for every
   * partition, they flooded the log and the server coming back. */
  int64_t store_retry_ns;
  _Atomic uint64_t pending, published;
};

kl_err_t kl__outbox_new(const kl_conf_t *conf, const char *topic,
                        kl_store_t *store, kl__outbox_t **out) {
  kl__outbox_t *ob = calloc(1, sizeof(*ob));
  if (!ob || !(ob->conf = kl_conf_dup(conf)) || !(ob->topic = strdup(topic))) {
    if (ob)
      kl_conf_destroy(ob->conf);
    free(ob);
    return kl__err(KL_ENOMEM, "outbox: out of memory");
  }
  ob->store = store;
  ob->max = (size_t)kl__conf_int(conf, "worker.outbox.max");
  *out = ob;
  return KL_OK;
}

static kl_ob_part_t *kl_ob_part(kl__outbox_t *ob, int32_t partition) {
  if (partition < 0)
    return NULL;
  if (partition >= ob->nparts) {
    int32_t n = partition + 1;
    kl_ob_part_t *p = realloc(ob->parts, (size_t)n * sizeof(*p));
    if (!p)
      kl_oom();
    memset(p + ob->nparts, 0, (size_t)(n - ob->nparts) * sizeof(*p));
    ob->parts = p;
    ob->nparts = n;
  }
  return &ob->parts[partition];
}

static void kl_ob_unqueue(kl__outbox_t *ob, kl_ob_part_t *part) {
  for (kl_ob_item_t *it = part->head, *next; it; it = next) {
    next = it->next;
    free(it);
  }
  part->head = part->tail = NULL;
  ob->pending -= part->held;
  part->held = 0;
}

void kl__outbox_own(kl__outbox_t *ob, int32_t partition, uint64_t gen) {
  kl_ob_part_t *part = kl_ob_part(ob, partition);
  kl_ob_unqueue(ob, part);
  part->gen = gen;
  part->dirty = 1;
  part->listed = 0;
  part->retry_ns = 0;
}

void kl__outbox_committed(kl__outbox_t *ob, int32_t partition, uint64_t gen) {
  kl_ob_part_t *part = ob ? kl_ob_part(ob, partition) : NULL;
  if (part && part->gen == gen)
    part->dirty = 1;
}

void kl__outbox_drop(kl__outbox_t *ob, int32_t partition) {
  kl_ob_part_t *part = ob ? kl_ob_part(ob, partition) : NULL;
  if (!part)
    return;
  kl_ob_unqueue(ob, part);
  part->gen = 0;
  part->dirty = 0;
}

int kl__outbox_full(const kl__outbox_t *ob, int32_t partition, int half) {
  if (!ob || partition < 0 || partition >= ob->nparts)
    return 0;
  const kl_ob_part_t *part = &ob->parts[partition];
  return half ? part->held > ob->max / 2 : part->held >= ob->max;
}

void kl__outbox_stats(const kl__outbox_t *ob, uint64_t *pending,
                      uint64_t *published) {
  *pending = ob ? ob->pending : 0;
  *published = ob ? ob->published : 0;
}

/* ---- listing --------------------------------------------------------- */

static int kl_ob_store_ready(const kl__outbox_t *ob, int64_t now) {
  return now >= ob->store_retry_ns;
}

/* After a failed store call: no other before KL_OB_RETRY_NS. What was
 * listed stays queued, what is to be removed stays to be removed. */
static void kl_ob_store_failed(kl__outbox_t *ob, int64_t now) {
  ob->store_retry_ns = now + KL_OB_RETRY_NS;
}

typedef struct kl_ob_list {
  kl_ob_part_t *part;
  int32_t partition;
  size_t n;
} kl_ob_list_t;

static int kl_ob_listed(void *opaque, uint64_t seq, const void *rec,
                        size_t len) {
  kl_ob_list_t *l = opaque;
  kl_ob_item_t *it = malloc(sizeof(*it) + len);
  if (!it)
    kl_oom();
  *it = (kl_ob_item_t){NULL, l->partition, l->part->gen, seq, len};
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
static void kl_ob_list(kl__outbox_t *ob, int32_t partition, int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  if (part->held >= ob->max)
    return;
  size_t room = ob->max - part->held;
  kl_ob_list_t l = {part, partition, 0};
  kl_err_t err = kl__store_outbox_list(ob->store, ob->topic, partition,
                                       part->listed, room, kl_ob_listed, &l);
  if (err) {
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": reading the outbox failed; the outbox "
             "calls the store again in %lld s: %s",
             partition, KL_OB_RETRY_NS / 1000000000LL, kl_err_detail());
    kl_ob_store_failed(ob, now);
    return;
  }
  part->held += l.n;
  ob->pending += l.n;
  part->dirty = l.n == room;
}

/* ---- publishing ------------------------------------------------------ */

static void kl_ob_acked(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl_ob_part_t *part = &ob->parts[it->partition];
  if (part->nacked == part->acked_cap) {
    size_t cap = part->acked_cap ? part->acked_cap * 2 : 64;
    uint64_t *v = realloc(part->acked, cap * sizeof(*v));
    if (!v)
      kl_oom();
    part->acked = v;
    part->acked_cap = cap;
  }
  /* Removed whoever owns it now: Kafka has it. It counts against the
   * bound until removed only while its ownership lasts. */
  part->acked[part->nacked++] =
      it->seq | (it->gen == part->gen ? 0 : 1ULL << 63);
  ob->published++;
}

/* A failed delivery goes back into its queue in seq order, so that it is
 * published again before the records committed after it, and failures
 * reported one after another keep their order. */
static void kl_ob_requeue(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl_ob_part_t *part = &ob->parts[it->partition];
  if (it->gen != part->gen) { /* the new owner listed it again */
    free(it);
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

static void kl_ob_delivered(void *opaque, const kl_delivery_t *d) {
  kl__outbox_t *ob = opaque;
  kl_ob_item_t *it = d->opaque;
  if (d->err == KL_OK) {
    kl_ob_acked(ob, it);
    free(it);
    return;
  }
  KL_LOG_W(KL_COMP,
           "follow-up id=%.*s of partition=%" PRId32 " was not "
           "acknowledged (%s), it is published again",
           (int)d->id_len, d->id, it->partition,
           d->errmsg ? d->errmsg : kl_err_name(d->err));
  kl_ob_requeue(ob, it);
}

static kl_err_t kl_ob_producer(kl__outbox_t *ob) {
  if (ob->producer)
    return KL_OK;
  return kl_producer_new(ob->conf, kl_ob_delivered, ob, &ob->producer);
}

/* Publishes @p it; @returns KL_OK once queued (it is the producer's then),
 * else it stays the caller's. */
static kl_err_t kl_ob_send(kl__outbox_t *ob, kl_ob_item_t *it) {
  kl__outbox_rec_t rec;
  if (kl__outbox_rec_decode(it->rec, it->len, &rec))
    return kl__err(KL_EDECODE_TRUNCATED,
                   "outbox record seq=%" PRIu64 " of "
                   "partition=%" PRId32 " is not a follow-up (%zu bytes): the "
                   "store is damaged",
                   it->seq, it->partition, it->len);
  char topic[KL_TOPIC_NAME_MAX + 1];
  const char *dest = ob->topic;
  if (rec.topic_len) {
    memcpy(topic, rec.topic, rec.topic_len);
    topic[rec.topic_len] = '\0';
    dest = topic;
  }
  kl_err_t err = kl_ob_producer(ob);
  return err ? err : kl_publish(ob->producer, dest, &rec.event, it);
}

static void kl_ob_publish(kl__outbox_t *ob, int32_t partition, int64_t now) {
  kl_ob_part_t *part = &ob->parts[partition];
  if (now < part->retry_ns)
    return;
  while (part->head) {
    kl_ob_item_t *it = part->head;
    part->head = it->next;
    if (!part->head)
      part->tail = NULL;
    it->next = NULL;
    kl_err_t err = kl_ob_send(ob, it);
    if (err == KL_OK)
      continue;
    KL_LOG_W(KL_COMP,
             "partition=%" PRId32 ": publishing follow-up seq=%" PRIu64
             " failed, tried again in 1 s: %s",
             partition, it->seq, kl_err_detail());
    kl_ob_requeue(ob, it);
    part->retry_ns = now + KL_OB_RETRY_NS;
    return;
  }
}

/* Removes the acknowledged records of every partition in ONE write (one
 * fsync however many partitions publish); the top bit of an acked seq
 * marks one listed under an earlier ownership, which the bound no longer
 * counts. */
static void kl_ob_remove(kl__outbox_t *ob, int64_t now) {
  size_t n = 0;
  for (int32_t p = 0; p < ob->nparts; p++)
    n += ob->parts[p].nacked;
  if (!n)
    return;
  kl__outbox_ack_t *acks = malloc(n * sizeof(*acks));
  if (!acks)
    kl_oom();
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
    kl_ob_store_failed(ob, now);
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
  for (int32_t p = 0; p < ob->nparts; p++) {
    kl_ob_part_t *part = &ob->parts[p];
    if (part->gen && part->dirty && kl_ob_store_ready(ob, now))
      kl_ob_list(ob, p, now);
    if (part->gen && part->head)
      kl_ob_publish(ob, p, now);
  }
  if (ob->producer)
    kl_producer_poll(ob->producer, 0);
  if (kl_ob_store_ready(ob, now))
    kl_ob_remove(ob, now);
}

void kl__outbox_drain(kl__outbox_t *ob, int32_t partition, int wait_ms) {
  kl_ob_part_t *part = ob ? kl_ob_part(ob, partition) : NULL;
  if (!part || !part->gen)
    return;
  int64_t end = kl__mono_ns() + (int64_t)wait_ms * 1000000;
  kl__outbox_tick(ob);
  while ((part->held || part->dirty) && kl__mono_ns() < end) {
    if (ob->producer) {
      kl_producer_poll(ob->producer, 20);
    } else { /* nothing to poll: ticks in the store's backoff would spin */
      struct timespec ts = {0, 20000000L};
      nanosleep(&ts, NULL);
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
    kl_ob_remove(ob, kl__mono_ns());   /* the last chance, backoff or not */
    kl_producer_destroy(ob->producer); /* reports what is left as failed */
  }
  for (int32_t p = 0; p < ob->nparts; p++) {
    ob->parts[p].gen = 0;
    kl_ob_unqueue(ob, &ob->parts[p]);
    free(ob->parts[p].acked);
  }
  free(ob->parts);
  kl_conf_destroy(ob->conf);
  free(ob->topic);
  free(ob);
}
