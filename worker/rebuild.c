/* A rebuilt store's outbox against the log (rebuild.h). */
#include "worker/rebuild.h"

#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/internal.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "event/emit_id.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"

/* One follow-up of the rebuilt outbox: its source place, destination and
 * content. */
typedef struct kl_rb_entry {
  int32_t partition;
  int64_t offset;
  unsigned index;
  uint64_t seq;
  size_t dest;   /* into topics */
  uint64_t what; /* rebuild_what() of its key, type and payload */
  int found;
} kl_rb_entry_t;

/* A follow-up's content: a record in the log with a follow-up's place is
 * that follow-up only if it carries the same key, type and payload.
 * Anyone may write a `~` id to the topic; one naming a place whose
 * follow-up it is not must not make the rebuild drop the real one. */
static uint64_t rebuild_what(const kl_event_t *e) {
  uint64_t h = kl__fnv1a(e->key, e->key_len);
  uint64_t lens[3] = {e->key_len, e->type_len, e->payload_len};
  h = kl__fnv1a_more(h, lens, sizeof(lens));
  h = kl__fnv1a_more(h, e->type, e->type_len);
  return kl__fnv1a_more(h, e->payload, e->payload_len);
}

struct kl__rebuild {
  kl_store_t *store;
  const char *topic;
  kl_rb_entry_t *v;
  size_t n, cap;
  char **topics;
  size_t ntopics, topics_cap;
  int oom;
};

static int rebuild_cmp(const void *a, const void *b) {
  const kl_rb_entry_t *x = a, *y = b;
  if (x->partition != y->partition)
    return x->partition < y->partition ? -1 : 1;
  if (x->offset != y->offset)
    return x->offset < y->offset ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* The number of destination @p name (len bytes), added when new. */
static size_t rebuild_dest(kl__rebuild_t *rb, const char *name, size_t len) {
  for (size_t i = 0; i < rb->ntopics; i++)
    if (strlen(rb->topics[i]) == len && memcmp(rb->topics[i], name, len) == 0)
      return i;
  char **t = kl__grow(rb->topics, &rb->topics_cap, rb->ntopics, sizeof(*t), 4);
  char *copy = t ? strndup(name, len) : NULL;
  if (!copy) {
    if (t)
      rb->topics = t;
    rb->oom = 1;
    return 0;
  }
  rb->topics = t;
  rb->topics[rb->ntopics] = copy;
  return rb->ntopics++;
}

typedef struct kl_rb_list {
  kl__rebuild_t *rb;
  int32_t partition;
  uint64_t last;
  size_t got;
} kl_rb_list_t;

static int rebuild_take(void *opaque, uint64_t seq, const void *bytes,
                        size_t len) {
  kl_rb_list_t *l = opaque;
  kl__rebuild_t *rb = l->rb;
  kl__outbox_rec_t rec;
  kl__emit_src_t src;
  l->last = seq;
  l->got++;
  if (kl__outbox_rec_decode(bytes, len, &rec) ||
      kl__emit_id_parse(rec.event.id, rec.event.id_len, &src))
    return 0; /* kept: nothing to match it by */
  kl_rb_entry_t *v = kl__grow(rb->v, &rb->cap, rb->n, sizeof(*v), 1024);
  if (!v) {
    rb->oom = 1;
    return 1;
  }
  rb->v = v;
  size_t dest = rec.topic_len ? rebuild_dest(rb, rec.topic, rec.topic_len)
                              : rebuild_dest(rb, rb->topic, strlen(rb->topic));
  rb->v[rb->n++] = (kl_rb_entry_t){l->partition,
                                   src.offset,
                                   src.index,
                                   seq,
                                   dest,
                                   rebuild_what(&rec.event),
                                   0};
  return rb->oom;
}

static kl_err_t rebuild_list(kl__rebuild_t *rb, int32_t partition) {
  kl_rb_list_t l = {rb, partition, 0, 0};
  do {
    l.got = 0;
    kl_err_t err = kl__store_outbox_list(rb->store, rb->topic, partition,
                                         l.last, 4096, rebuild_take, &l);
    if (err)
      return err;
    if (rb->oom)
      return kl__err(KL_ENOMEM, "out of memory listing the rebuilt outbox");
  } while (l.got == 4096);
  return KL_OK;
}

kl_err_t kl__rebuild_new(kl_store_t *store, const char *topic,
                         const int32_t *partitions, size_t count,
                         kl__rebuild_t **out) {
  kl__rebuild_t *rb = calloc(1, sizeof(*rb));
  if (!rb)
    return kl__err(KL_ENOMEM, "out of memory");
  rb->store = store;
  rb->topic = topic;
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && i < count; i++)
    err = rebuild_list(rb, partitions[i]);
  if (err) {
    kl__rebuild_destroy(rb);
    return err;
  }
  if (rb->n)
    qsort(rb->v, rb->n, sizeof(*rb->v), rebuild_cmp);
  *out = rb;
  return KL_OK;
}

const char *kl__rebuild_topic(const kl__rebuild_t *rb, size_t i) {
  return i < rb->ntopics ? rb->topics[i] : NULL;
}

void kl__rebuild_see(kl__rebuild_t *rb, const char *in,
                     const kl_event_t *event) {
  kl__emit_src_t src;
  if (!rb->n || kl__emit_id_parse(event->id, event->id_len, &src) ||
      src.topic_len != strlen(rb->topic) ||
      memcmp(src.topic, rb->topic, src.topic_len) != 0)
    return;
  kl_rb_entry_t key = {src.partition, src.offset, src.index, 0, 0, 0, 0};
  kl_rb_entry_t *e = bsearch(&key, rb->v, rb->n, sizeof(*rb->v), rebuild_cmp);
  if (e && strcmp(rb->topics[e->dest], in) == 0 &&
      (e->what == rebuild_what(event) || KL__MUTANT(KL__MUTANT_REBUILD)))
    e->found = 1;
}

kl_err_t kl__rebuild_prune(kl__rebuild_t *rb, uint64_t *dropped,
                           uint64_t *kept) {
  kl__outbox_ack_t *acks = malloc((rb->n ? rb->n : 1) * sizeof(*acks));
  if (!acks)
    return kl__err(KL_ENOMEM, "out of memory");
  size_t n = 0;
  for (size_t i = 0; i < rb->n; i++)
    if (rb->v[i].found)
      acks[n++] = (kl__outbox_ack_t){rb->v[i].partition, rb->v[i].seq};
  kl_err_t err = kl__store_outbox_del(rb->store, rb->topic, acks, n);
  free(acks);
  if (!err && dropped)
    *dropped = n;
  if (!err && kept)
    *kept = rb->n - n;
  return err;
}

void kl__rebuild_destroy(kl__rebuild_t *rb) {
  if (!rb)
    return;
  for (size_t i = 0; i < rb->ntopics; i++)
    free(rb->topics[i]);
  free(rb->topics);
  free(rb->v);
  free(rb);
}
