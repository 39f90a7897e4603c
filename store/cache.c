/*
 * The owner cache (cache.h says when it is safe and when it is
 * dropped). One hash table of entries keyed by the handler key, since the
 * store's key space is one; each entry belongs to the segment of the
 * partition that read or wrote it, and sits on that segment's list (to
 * drop it) and on one LRU list (to bound the bytes).
 */
#include "store/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/hmap.h"
#include "common/mutant.h"
#include "common/strbuf.h"

typedef struct kl_entry {
  kl__hnode_t node; /* in the cache's map */
  struct kl_entry *lru_prev, *lru_next;
  struct kl_entry *seg_prev, *seg_next;
  kl__cache_seg_t *seg;
  size_t key_len, val_len;
  int present;           /* 0: the key is known not to exist */
  unsigned char bytes[]; /* the key, then the value */
} kl_entry_t;

struct kl__cache_seg {
  kl__cache_seg_t *next;
  char *topic;
  int32_t partition;
  uint64_t epoch;    /* the owner's whose reads and writes it holds; 0: none */
  uint64_t events;   /* bumped by each commit's start and end and each drop */
  uint64_t inflight; /* commits started and not ended */
  kl_entry_t *entries;
};

struct kl__cache {
  pthread_mutex_t mu;
  size_t max_bytes, bytes;
  kl__hmap_t map;                  /* of kl_entry_t */
  kl_entry_t *lru_head, *lru_tail; /* most recently used first */
  kl__cache_seg_t *segs;
  uint64_t hits, misses, drops, evictions;
};

#define KL_CACHE_BUCKETS_MIN 1024u

static size_t entry_size(const kl_entry_t *e) {
  return sizeof(*e) + e->key_len + e->val_len;
}

kl__cache_t *kl__cache_new(size_t max_bytes) {
  if (!max_bytes)
    return NULL;
  kl__cache_t *cache = calloc(1, sizeof(*cache));
  if (!cache)
    return NULL;
  if (kl__hmap_reserve(&cache->map, KL_CACHE_BUCKETS_MIN)) {
    free(cache);
    return NULL;
  }
  cache->max_bytes = max_bytes;
  pthread_mutex_init(&cache->mu, NULL);
  return cache;
}

void kl__cache_destroy(kl__cache_t *cache) {
  if (!cache)
    return;
  for (kl_entry_t *e = cache->lru_head, *next; e; e = next) {
    next = e->lru_next;
    free(e);
  }
  for (kl__cache_seg_t *s = cache->segs, *next; s; s = next) {
    next = s->next;
    free(s->topic);
    free(s);
  }
  pthread_mutex_destroy(&cache->mu);
  kl__hmap_free(&cache->map);
  free(cache);
}

/* ---- entries (under mu) ---------------------------------------------- */

static kl_entry_t *cache_find(kl__cache_t *cache, const void *key, size_t len,
                              uint64_t hash) {
  for (kl__hnode_t *n = kl__hmap_first(&cache->map, hash); n;
       n = kl__hmap_next(n, hash)) {
    kl_entry_t *e = KL__HMAP_ENTRY(n, kl_entry_t, node);
    if (e->key_len == len && !memcmp(e->bytes, key, len))
      return e;
  }
  return NULL;
}

static void lru_unlink(kl__cache_t *cache, kl_entry_t *e) {
  *(e->lru_prev ? &e->lru_prev->lru_next : &cache->lru_head) = e->lru_next;
  *(e->lru_next ? &e->lru_next->lru_prev : &cache->lru_tail) = e->lru_prev;
}

static void lru_front(kl__cache_t *cache, kl_entry_t *e) {
  e->lru_prev = NULL;
  e->lru_next = cache->lru_head;
  *(cache->lru_head ? &cache->lru_head->lru_prev : &cache->lru_tail) = e;
  cache->lru_head = e;
}

static void cache_remove(kl__cache_t *cache, kl_entry_t *e) {
  kl__hmap_unlink(&cache->map, &e->node);
  lru_unlink(cache, e);
  *(e->seg_prev ? &e->seg_prev->seg_next : &e->seg->entries) = e->seg_next;
  if (e->seg_next)
    e->seg_next->seg_prev = e->seg_prev;
  cache->bytes -= entry_size(e);
  free(e);
}

/* Puts @p key's value (@p val NULL: absent) into @p seg, replacing what
 * any segment held for it, then evicts down to the bound. */
static void cache_put(kl__cache_t *cache, kl__cache_seg_t *seg, const void *key,
                      size_t key_len, const void *val, size_t val_len) {
  uint64_t hash = kl__hash(key, key_len);
  kl_entry_t *old = cache_find(cache, key, key_len, hash);
  if (old)
    cache_remove(cache, old);
  size_t size = sizeof(kl_entry_t) + key_len + (val ? val_len : 0);
  kl_entry_t *e = size <= cache->max_bytes ? malloc(size) : NULL;
  if (!e)
    return;
  *e = (kl_entry_t){.seg = seg,
                    .key_len = key_len,
                    .val_len = val ? val_len : 0,
                    .present = val != NULL};
  memcpy(e->bytes, key, key_len);
  if (val && val_len)
    memcpy(e->bytes + key_len, val, val_len);
  kl__hmap_link(&cache->map, &e->node, hash);
  lru_front(cache, e);
  e->seg_next = seg->entries;
  if (seg->entries)
    seg->entries->seg_prev = e;
  seg->entries = e;
  cache->bytes += size;
  while (cache->bytes > cache->max_bytes && cache->lru_tail) {
    cache_remove(cache, cache->lru_tail);
    cache->evictions++;
  }
  /* Doubles the buckets when the entries reach them; on no memory the
   * chains only grow longer. */
  (void)kl__hmap_reserve(&cache->map, KL_CACHE_BUCKETS_MIN);
}

static void forget_key(kl__cache_t *cache, const void *key, size_t len) {
  kl_entry_t *e = cache_find(cache, key, len, kl__hash(key, len));
  if (e)
    cache_remove(cache, e);
}

static void cache_drop(kl__cache_t *cache, kl__cache_seg_t *seg) {
  if (KL__MUTANT(KL__MUTANT_CACHE))
    return; /* test only: common/mutant.h */
  while (seg->entries)
    cache_remove(cache, seg->entries);
  seg->epoch = 0;
  seg->events++;
  cache->drops++;
}

/* ---- the batch's calls ----------------------------------------------- */

static kl__cache_seg_t *seg_find(kl__cache_t *cache, const char *topic,
                                 int32_t partition) {
  for (kl__cache_seg_t *s = cache->segs; s; s = s->next)
    if (s->partition == partition && strcmp(s->topic, topic) == 0)
      return s;
  return NULL;
}

kl__cache_seg_t *kl__cache_seg(kl__cache_t *cache, const char *topic,
                               int32_t partition) {
  if (!cache)
    return NULL;
  pthread_mutex_lock(&cache->mu);
  kl__cache_seg_t *seg = seg_find(cache, topic, partition);
  if (!seg && (seg = calloc(1, sizeof(*seg)))) {
    if ((seg->topic = strdup(topic))) {
      seg->partition = partition;
      seg->events = 1;
      seg->next = cache->segs;
      cache->segs = seg;
    } else {
      free(seg);
      seg = NULL;
    }
  }
  pthread_mutex_unlock(&cache->mu);
  return seg;
}

uint64_t kl__cache_ticket(kl__cache_t *cache, kl__cache_seg_t *seg) {
  if (!cache || !seg)
    return 0;
  pthread_mutex_lock(&cache->mu);
  uint64_t ticket = seg->inflight ? 0 : seg->events;
  pthread_mutex_unlock(&cache->mu);
  return ticket;
}

void kl__cache_own(kl__cache_t *cache, kl__cache_seg_t *seg, uint64_t epoch) {
  if (!cache || !seg)
    return;
  pthread_mutex_lock(&cache->mu);
  if (seg->epoch != epoch) {
    if (seg->epoch || seg->entries)
      cache_drop(cache, seg);
    seg->epoch = epoch;
  }
  pthread_mutex_unlock(&cache->mu);
}

/* Whether the segment is what a batch of @p epoch with @p ticket sees:
 * its owner's, and no commit started, ended or was in flight since the
 * ticket, so that every entry equals the batch's snapshot. */
static int cache_current(const kl__cache_seg_t *seg, uint64_t epoch,
                         uint64_t ticket) {
  return seg->epoch == epoch && ticket && seg->events == ticket;
}

static int copy_out(const kl_entry_t *e, unsigned char **buf, size_t *cap,
                    size_t *len) {
  unsigned char *p = kl__reserve(*buf, cap, e->val_len, 1, e->val_len);
  if (!p)
    return -1;
  *buf = p;
  if (e->val_len)
    memcpy(*buf, e->bytes + e->key_len, e->val_len);
  *len = e->val_len;
  return 0;
}

/* @p key's entry, when it is what a batch of @p epoch with @p ticket sees;
 * under the mutex. */
static kl_entry_t *cache_known(kl__cache_t *cache, kl__cache_seg_t *seg,
                               uint64_t epoch, uint64_t ticket, const void *key,
                               size_t key_len) {
  kl_entry_t *e = cache_find(cache, key, key_len, kl__hash(key, key_len));
  return e && e->seg == seg && cache_current(seg, epoch, ticket) ? e : NULL;
}

kl__cache_answer_t kl__cache_get(kl__cache_t *cache, kl__cache_seg_t *seg,
                                 uint64_t epoch, uint64_t ticket,
                                 const void *key, size_t key_len,
                                 unsigned char **buf, size_t *cap,
                                 size_t *len) {
  if (!cache || !seg)
    return KL__CACHE_MISS;
  kl__cache_answer_t answer = KL__CACHE_MISS;
  pthread_mutex_lock(&cache->mu);
  kl_entry_t *e = cache_known(cache, seg, epoch, ticket, key, key_len);
  if (e && (!e->present || !copy_out(e, buf, cap, len))) {
    answer = e->present ? KL__CACHE_HIT : KL__CACHE_ABSENT;
    lru_unlink(cache, e);
    lru_front(cache, e);
  }
  if (answer)
    cache->hits++;
  else
    cache->misses++;
  pthread_mutex_unlock(&cache->mu);
  return answer;
}

kl__cache_answer_t kl__cache_stored(kl__cache_t *cache, kl__cache_seg_t *seg,
                                    uint64_t epoch, uint64_t ticket,
                                    const void *key, size_t key_len,
                                    unsigned char **buf, size_t *cap,
                                    size_t *len) {
  if (!cache || !seg)
    return KL__CACHE_MISS;
  pthread_mutex_lock(&cache->mu);
  kl_entry_t *e = cache_known(cache, seg, epoch, ticket, key, key_len);
  kl__cache_answer_t answer = !e                           ? KL__CACHE_MISS
                              : !e->present                ? KL__CACHE_ABSENT
                              : copy_out(e, buf, cap, len) ? KL__CACHE_MISS
                                                           : KL__CACHE_HIT;
  pthread_mutex_unlock(&cache->mu);
  return answer;
}

void kl__cache_fill(kl__cache_t *cache, kl__cache_seg_t *seg, uint64_t epoch,
                    uint64_t ticket, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  if (!cache || !seg)
    return;
  pthread_mutex_lock(&cache->mu);
  if (cache_current(seg, epoch, ticket))
    cache_put(cache, seg, key, key_len, val, val_len);
  pthread_mutex_unlock(&cache->mu);
}

uint64_t kl__cache_commit_start(kl__cache_t *cache, kl__cache_seg_t *seg) {
  if (!cache || !seg)
    return 0;
  pthread_mutex_lock(&cache->mu);
  uint64_t start = ++seg->events;
  seg->inflight++;
  pthread_mutex_unlock(&cache->mu);
  return start;
}

static void write_through(kl__cache_t *cache, kl__cache_seg_t *seg, int alone,
                          const kl__buf_t *data, int del_tag) {
  for (size_t i = 0; i < data->count; i++) {
    const kl__buf_entry_t *w = kl__buf_at(data, i);
    if (!alone)
      forget_key(cache, kl__buf_key(w), w->key_len);
    else
      cache_put(cache, seg, kl__buf_key(w), w->key_len,
                w->tag == del_tag ? NULL : kl__buf_val(w), w->val_len);
  }
}

void kl__cache_commit_end(kl__cache_t *cache, kl__cache_seg_t *seg,
                          uint64_t epoch, uint64_t start, int committed,
                          const kl__buf_t *data, int del_tag) {
  if (!cache || !seg)
    return;
  pthread_mutex_lock(&cache->mu);
  if (!committed)
    cache_drop(cache, seg);
  else
    write_through(cache, seg, seg->events == start && seg->epoch == epoch, data,
                  del_tag);
  seg->events++;
  seg->inflight--;
  pthread_mutex_unlock(&cache->mu);
}

void kl__cache_drop(kl__cache_t *cache, kl__cache_seg_t *seg) {
  if (!cache || !seg)
    return;
  pthread_mutex_lock(&cache->mu);
  cache_drop(cache, seg);
  pthread_mutex_unlock(&cache->mu);
}

void kl__cache_drop_partition(kl__cache_t *cache, const char *topic,
                              int32_t partition) {
  if (!cache)
    return;
  pthread_mutex_lock(&cache->mu);
  kl__cache_seg_t *seg = seg_find(cache, topic, partition);
  if (seg)
    cache_drop(cache, seg);
  pthread_mutex_unlock(&cache->mu);
}

void kl__cache_stats(kl__cache_t *cache, kl__cache_stats_t *stats) {
  memset(stats, 0, sizeof(*stats));
  if (!cache)
    return;
  pthread_mutex_lock(&cache->mu);
  stats->max_bytes = cache->max_bytes;
  stats->bytes = cache->bytes;
  stats->entries = cache->map.count;
  stats->hits = cache->hits;
  stats->misses = cache->misses;
  stats->drops = cache->drops;
  stats->evictions = cache->evictions;
  pthread_mutex_unlock(&cache->mu);
}
