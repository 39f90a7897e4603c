/*
 * The batch write buffer: linear probing over a power-of-two table kept at
 * most half full, so a miss ends after a couple of probes. Entries are
 * never removed one by one (a delete of a handler key is an entry tagged
 * "deleted", which must shadow the snapshot), so no tombstones are needed.
 */
#include <stdlib.h>
#include <string.h>

#include "worker/txn_buffer.h"

/* FNV-1a, 64 bit: short keys, no adversary worth a keyed hash (the keys
 * are the batch's own and the table only lives for one batch). */
static uint64_t kl_buf_hash(const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

void kl__buf_init(kl__buf_t *buf) {
  memset(buf, 0, sizeof(*buf));
}

void kl__buf_clear(kl__buf_t *buf) {
  for (size_t i = 0; i < buf->cap; i++)
    free(buf->slots[i]);
  free(buf->slots);
  kl__buf_init(buf);
}

static int kl_buf_match(const kl__buf_entry_t *entry, uint64_t hash,
                        const void *key, size_t key_len) {
  return entry->hash == hash && entry->key_len == key_len &&
         memcmp(entry->bytes, key, key_len) == 0;
}

/* The slot holding @p key, or the free slot where it would go. */
static size_t kl_buf_slot(kl__buf_entry_t **slots, size_t cap, uint64_t hash,
                          const void *key, size_t key_len) {
  size_t i = (size_t)hash & (cap - 1);
  while (slots[i] && !kl_buf_match(slots[i], hash, key, key_len))
    i = (i + 1) & (cap - 1);
  return i;
}

static kl_err_t kl_buf_grow(kl__buf_t *buf) {
  size_t cap = buf->cap ? buf->cap * 2 : 64;
  kl__buf_entry_t **slots = calloc(cap, sizeof(*slots));
  if (!slots)
    return KL_ENOMEM;
  for (size_t i = 0; i < buf->cap; i++) {
    kl__buf_entry_t *entry = buf->slots[i];
    if (entry)
      slots[kl_buf_slot(slots, cap, entry->hash, entry->bytes,
                        entry->key_len)] = entry;
  }
  free(buf->slots);
  buf->slots = slots;
  buf->cap = cap;
  return KL_OK;
}

kl_err_t kl__buf_set(kl__buf_t *buf, const void *key, size_t key_len,
                     const void *val, size_t val_len, int tag) {
  if ((buf->count + 1) * 2 > buf->cap && kl_buf_grow(buf))
    return KL_ENOMEM;
  kl__buf_entry_t *entry = malloc(sizeof(*entry) + key_len + val_len);
  if (!entry)
    return KL_ENOMEM;
  entry->hash = kl_buf_hash(key, key_len);
  entry->key_len = key_len;
  entry->val_len = val_len;
  entry->tag = tag;
  memcpy(entry->bytes, key, key_len);
  if (val_len)
    memcpy(entry->bytes + key_len, val, val_len);
  size_t i = kl_buf_slot(buf->slots, buf->cap, entry->hash, key, key_len);
  if (buf->slots[i])
    free(buf->slots[i]);
  else
    buf->count++;
  buf->slots[i] = entry;
  return KL_OK;
}

const kl__buf_entry_t *kl__buf_get(const kl__buf_t *buf, const void *key,
                                   size_t key_len) {
  if (!buf->count)
    return NULL;
  uint64_t hash = kl_buf_hash(key, key_len);
  return buf->slots[kl_buf_slot(buf->slots, buf->cap, hash, key, key_len)];
}

static int kl_buf_cmp(const void *a, const void *b) {
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
  size_t n = 0;
  for (size_t i = 0; i < buf->cap; i++)
    if (buf->slots[i])
      list[n++] = buf->slots[i];
  qsort(list, n, sizeof(*list), kl_buf_cmp);
  *out = list;
  return KL_OK;
}
