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
  free(buf->sorted);
  free(buf->scratch);
  kl__buf_init(buf);
}

void kl__buf_reset(kl__buf_t *buf) {
  for (size_t i = 0; i < buf->count; i++)
    buf->slots[buf->used[i]] = NULL;
  buf->count = 0;
  if (buf->arena && buf->arena->next) { /* next time one chunk of them all */
    arena_free(buf->arena);
    buf->arena = NULL;
    buf->arena_next = buf->arena_bytes;
    buf->arena_bytes = 0;
  } else if (buf->arena) {
    buf->arena->used = 0;
  }
}

/* The memory the buffer holds, besides itself. */
static size_t buf_bytes(const kl__buf_t *buf) {
  return buf->arena_bytes + buf->arena_next +
         buf->cap * (sizeof(*buf->slots) + sizeof(*buf->used) / 2) +
         buf->sorted_cap * 2 * sizeof(*buf->sorted);
}

void kl__buf_recycle(kl__buf_t *buf) {
  if (buf_bytes(buf) > KL__BUF_KEEP_MAX)
    kl__buf_clear(buf);
  else
    kl__buf_reset(buf);
}

/* @returns @p size bytes from the arena, 8-byte aligned, or NULL. */
static void *arena_alloc(kl__buf_t *buf, size_t size) {
  size = (size + 7) & ~(size_t)7;
  kl__buf_chunk_t *c = buf->arena;
  if (!c || c->cap - c->used < size) {
    size_t cap = c ? c->cap * 2 : KL_BUF_CHUNK_MIN;
    if (cap > KL_BUF_CHUNK_MAX)
      cap = KL_BUF_CHUNK_MAX;
    if (!c && cap < buf->arena_next) /* as large as the last use needed */
      cap = buf->arena_next;
    if (cap < size)
      cap = size;
    if (!(c = malloc(sizeof(*c) + cap)))
      return NULL;
    c->next = buf->arena;
    c->used = 0;
    c->cap = cap;
    buf->arena = c;
    buf->arena_bytes += cap;
    buf->arena_next = 0;
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

/* Sets slot @p i, found for @p key (of @p hash), to a copy of @p val. */
static kl_err_t buf_put(kl__buf_t *buf, size_t i, uint64_t hash,
                        const void *key, size_t key_len, const void *val,
                        size_t val_len, int tag) {
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

kl_err_t kl__buf_set(kl__buf_t *buf, const void *key, size_t key_len,
                     const void *val, size_t val_len, int tag) {
  if ((buf->count + 1) * 2 > buf->cap && buf_grow(buf))
    return KL_ENOMEM;
  uint64_t hash = kl__hash(key, key_len);
  size_t i = buf_slot(buf->slots, buf->cap, hash, key, key_len);
  return buf_put(buf, i, hash, key, key_len, val, val_len, tag);
}

kl_err_t kl__buf_retag(kl__buf_t *buf, const void *key, size_t key_len,
                       int (*merge)(int have, int tag), int tag) {
  if ((buf->count + 1) * 2 > buf->cap && buf_grow(buf))
    return KL_ENOMEM;
  uint64_t hash = kl__hash(key, key_len);
  size_t i = buf_slot(buf->slots, buf->cap, hash, key, key_len);
  kl__buf_entry_t *entry = buf->slots[i];
  if (entry) {
    entry->tag = merge(entry->tag, tag);
    return KL_OK;
  }
  return buf_put(buf, i, hash, key, key_len, NULL, 0, merge(0, tag));
}

const kl__buf_entry_t *kl__buf_get(const kl__buf_t *buf, const void *key,
                                   size_t key_len) {
  if (!buf->count)
    return NULL;
  uint64_t hash = kl__hash(key, key_len);
  return buf->slots[buf_slot(buf->slots, buf->cap, hash, key, key_len)];
}

static int buf_cmp(const kl__buf_entry_t *x, const kl__buf_entry_t *y) {
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->bytes, y->bytes, n);
  if (c)
    return c;
  return x->key_len < y->key_len ? -1 : x->key_len > y->key_len;
}

/* Sorts @p a's @p n entries, with @p tmp as large: a bottom-up merge sort,
 * which needs no memory of its own (glibc's qsort() mallocs a copy of any
 * array over 1 KiB). @returns the array that holds them sorted. */
static const kl__buf_entry_t **
buf_msort(const kl__buf_entry_t **a, const kl__buf_entry_t **tmp, size_t n) {
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n;
      size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi)
        tmp[k++] = buf_cmp(a[j], a[i]) < 0 ? a[j++] : a[i++];
      while (i < mid)
        tmp[k++] = a[i++];
      while (j < hi)
        tmp[k++] = a[j++];
    }
    const kl__buf_entry_t **t = a;
    a = tmp;
    tmp = t;
  }
  return a;
}

kl_err_t kl__buf_sorted(kl__buf_t *buf, const kl__buf_entry_t *const **out) {
  *out = NULL;
  if (!buf->count)
    return KL_OK;
  if (buf->sorted_cap < buf->count) {
    size_t cap = buf->cap / 2; /* room for every entry the table can hold */
    const kl__buf_entry_t **sorted = malloc(cap * sizeof(*sorted));
    const kl__buf_entry_t **scratch = malloc(cap * sizeof(*scratch));
    if (!sorted || !scratch) {
      free(sorted);
      free(scratch);
      return KL_ENOMEM;
    }
    free(buf->sorted);
    free(buf->scratch);
    buf->sorted = sorted;
    buf->scratch = scratch;
    buf->sorted_cap = cap;
  }
  for (size_t i = 0; i < buf->count; i++)
    buf->sorted[i] = kl__buf_at(buf, i);
  *out = buf_msort(buf->sorted, buf->scratch, buf->count);
  return KL_OK;
}
