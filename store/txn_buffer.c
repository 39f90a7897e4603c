/*
 * The batch write buffer: linear probing over a power-of-two table kept at
 * most half full, so a miss ends after a couple of probes. Entries are
 * never removed one by one (a delete of a handler key is an entry tagged
 * "deleted", which must shadow the snapshot), so no tombstones are needed,
 * and they are carved from an arena of chunks that goes as a whole.
 */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "store/txn_buffer.h"

struct kl__buf_chunk {
  kl__buf_chunk_t *next;
  size_t used, cap;
  unsigned char data[]; /* 8-byte aligned: it follows three 8-byte fields */
};

#define KL_BUF_CHUNK_MIN 4096
#define KL_BUF_CHUNK_MAX (1024 * 1024)

void kl__buf_init(kl__buf_t *buf) {
  memset(buf, 0, sizeof(*buf));
}

static void arena_free(kl__buf_chunk_t *chunk) {
  while (chunk) {
    kl__buf_chunk_t *next = chunk->next;
    free(chunk);
    chunk = next;
  }
}

void kl__buf_clear(kl__buf_t *buf) {
  arena_free(buf->arena);
  free(buf->slots);
  free(buf->used);
  kl__buf_init(buf);
}

void kl__buf_reset(kl__buf_t *buf) {
  for (size_t i = 0; i < buf->count; i++)
    buf->slots[buf->used[i]] = NULL;
  buf->count = 0;
  if (buf->arena) { /* keep the newest chunk, the largest */
    arena_free(buf->arena->next);
    buf->arena->next = NULL;
    buf->arena->used = 0;
  }
}

/* @returns @p size bytes from the arena, 8-byte aligned, or NULL. */
static void *arena_alloc(kl__buf_t *buf, size_t size) {
  size = (size + 7) & ~(size_t)7;
  kl__buf_chunk_t *c = buf->arena;
  if (!c || c->cap - c->used < size) {
    size_t cap = c ? c->cap * 2 : KL_BUF_CHUNK_MIN;
    if (cap > KL_BUF_CHUNK_MAX)
      cap = KL_BUF_CHUNK_MAX;
    if (cap < size)
      cap = size;
    if (!(c = malloc(sizeof(*c) + cap)))
      return NULL;
    c->next = buf->arena;
    c->used = 0;
    c->cap = cap;
    buf->arena = c;
  }
  void *p = c->data + c->used;
  c->used += size;
  return p;
}

static int buf_match(const kl__buf_entry_t *entry, uint64_t hash,
                     const void *key, size_t key_len) {
  return entry->hash == hash && entry->key_len == key_len &&
         memcmp(entry->bytes, key, key_len) == 0;
}

/* The slot holding @p key, or the free slot where it would go. */
static size_t buf_slot(kl__buf_entry_t **slots, size_t cap, uint64_t hash,
                       const void *key, size_t key_len) {
  size_t i = (size_t)hash & (cap - 1);
  while (slots[i] && !buf_match(slots[i], hash, key, key_len))
    i = (i + 1) & (cap - 1);
  return i;
}

/* Doubles the table, keeping the insertion order. */
static kl_err_t buf_grow(kl__buf_t *buf) {
  size_t cap = buf->cap ? buf->cap * 2 : 16;
  kl__buf_entry_t **slots = calloc(cap, sizeof(*slots));
  size_t *used = malloc(cap / 2 * sizeof(*used)); /* at most half full */
  if (!slots || !used) {
    free(slots);
    free(used);
    return KL_ENOMEM;
  }
  for (size_t i = 0; i < buf->count; i++) {
    kl__buf_entry_t *entry = buf->slots[buf->used[i]];
    used[i] = buf_slot(slots, cap, entry->hash, entry->bytes, entry->key_len);
    slots[used[i]] = entry;
  }
  free(buf->slots);
  free(buf->used);
  buf->slots = slots;
  buf->used = used;
  buf->cap = cap;
  return KL_OK;
}

kl_err_t kl__buf_set(kl__buf_t *buf, const void *key, size_t key_len,
                     const void *val, size_t val_len, int tag) {
  if ((buf->count + 1) * 2 > buf->cap && buf_grow(buf))
    return KL_ENOMEM;
  uint64_t hash = kl__fnv1a(key, key_len);
  size_t i = buf_slot(buf->slots, buf->cap, hash, key, key_len);
  kl__buf_entry_t *entry = buf->slots[i];
  if (entry && entry->val_len >= val_len) { /* rewrite in place */
    if (val_len)
      memmove(entry->bytes + key_len, val, val_len);
    entry->val_len = val_len;
    entry->tag = tag;
    return KL_OK;
  }
  /* A replaced entry stays in the arena, so @p val may point into it. */
  kl__buf_entry_t *fresh = arena_alloc(buf, sizeof(*fresh) + key_len + val_len);
  if (!fresh)
    return KL_ENOMEM;
  fresh->hash = hash;
  fresh->key_len = key_len;
  fresh->val_len = val_len;
  fresh->tag = tag;
  memcpy(fresh->bytes, key, key_len);
  if (val_len)
    memcpy(fresh->bytes + key_len, val, val_len);
  if (!entry)
    buf->used[buf->count++] = i;
  buf->slots[i] = fresh;
  return KL_OK;
}

const kl__buf_entry_t *kl__buf_get(const kl__buf_t *buf, const void *key,
                                   size_t key_len) {
  if (!buf->count)
    return NULL;
  uint64_t hash = kl__fnv1a(key, key_len);
  return buf->slots[buf_slot(buf->slots, buf->cap, hash, key, key_len)];
}

static int buf_cmp(const void *a, const void *b) {
  const kl__buf_entry_t *x = *(const kl__buf_entry_t *const *)a;
  const kl__buf_entry_t *y = *(const kl__buf_entry_t *const *)b;
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->bytes, y->bytes, n);
  if (c)
    return c;
  return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

kl_err_t kl__buf_sorted(const kl__buf_t *buf, const kl__buf_entry_t ***out) {
  *out = NULL;
  if (!buf->count)
    return KL_OK;
  const kl__buf_entry_t **list = malloc(buf->count * sizeof(*list));
  if (!list)
    return KL_ENOMEM;
  for (size_t i = 0; i < buf->count; i++)
    list[i] = kl__buf_at(buf, i);
  qsort(list, buf->count, sizeof(*list), buf_cmp);
  *out = list;
  return KL_OK;
}
