/*
 * A batch's write buffer: an open-addressing hash map from byte-string keys
 * to an owned copy of a value plus a small tag. Store backends keep two per
 * batch: handler keys (tag: put or delete) and idempotency keys (tag: the
 * mark). Handlers read their own writes through it before the snapshot, and
 * the commit walks it in key order.
 *
 * Entries live in an arena that the buffer frees (or, reset, reuses) as a
 * whole, and the buffer lists the slots it used in insertion order: an
 * event's child buffer holds a handful of keys, and emptying it must not
 * cost a walk of its whole table or a free() per entry.
 *
 * A finished batch's buffers are kept for the next batch (reset, not
 * freed: kl__buf_recycle()), so that a worker's steady path does not
 * allocate them again per batch; a buffer that grew past KL__BUF_KEEP_MAX
 * is freed instead, so that one huge batch does not pin its memory.
 *
 * Not thread safe: it belongs to one kl_txn_t, used by one thread at a time.
 */
#ifndef KEYLANE_STORE_TXN_BUFFER_H
#define KEYLANE_STORE_TXN_BUFFER_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"

typedef struct kl__buf_entry {
  uint64_t hash;
  size_t key_len;
  size_t val_len;
  int tag;
  unsigned char bytes[]; /* key_len bytes of key, then val_len of value */
} kl__buf_entry_t;

typedef struct kl__buf_chunk kl__buf_chunk_t;

/**
 * The most memory (table, arena, sorted lists) a buffer keeps for its next
 * use when kl__buf_recycle()d: about 6,000 entries of a 100-byte key and
 * value. A larger one is freed.
 */
#define KL__BUF_KEEP_MAX (1024 * 1024)

typedef struct kl__buf {
  kl__buf_entry_t **slots; /* cap slots, NULL when free; cap a power of 2 */
  size_t cap;
  size_t count;
  size_t *used;           /* the count occupied slots, in insertion order */
  kl__buf_chunk_t *arena; /* the entries; the newest chunk first */
  size_t arena_bytes;     /* the chunks' capacity, in all */
  size_t arena_next;      /* the size of the next first chunk; 0: the least */
  const kl__buf_entry_t **sorted, **scratch; /* kl__buf_sorted()'s lists */
  size_t sorted_cap;
} kl__buf_t;

static inline const void *kl__buf_key(const kl__buf_entry_t *entry) {
  return entry->bytes;
}

static inline const void *kl__buf_val(const kl__buf_entry_t *entry) {
  return entry->bytes + entry->key_len;
}

/** @returns the @p i-th entry in insertion order, i < buf->count. */
static inline const kl__buf_entry_t *kl__buf_at(const kl__buf_t *buf,
                                                size_t i) {
  return buf->slots[buf->used[i]];
}

/** Makes an empty buffer; it allocates on the first set. */
void kl__buf_init(kl__buf_t *buf);

/** Frees every entry; the buffer is empty (and reusable) afterwards. */
void kl__buf_clear(kl__buf_t *buf);

/**
 * Empties the buffer but keeps its table and arena for the next use (an
 * arena of several chunks is freed and comes back as one chunk of their
 * size at the next set); kl__buf_clear() still frees it in the end.
 */
void kl__buf_reset(kl__buf_t *buf);

/**
 * Empties a finished batch's buffer for the next batch: kl__buf_reset(),
 * or kl__buf_clear() when it holds more than KL__BUF_KEEP_MAX bytes.
 */
void kl__buf_recycle(kl__buf_t *buf);

/**
 * Sets @p key to a copy of @p val with @p tag, replacing an earlier entry
 * (which invalidates pointers into it). @p val may point into the buffer.
 * @returns KL_OK or KL_ENOMEM (the buffer is unchanged then).
 */
kl_err_t kl__buf_set(kl__buf_t *buf, const void *key, size_t key_len,
                     const void *val, size_t val_len, int tag);

/**
 * Sets @p key's tag to @p merge(its tag, @p tag), 0 for a key not there
 * (which gets no value): an idempotency mark over an earlier one
 * (kl__mark_merge()), with one hash and one probe where a get and a set
 * took two of each (issue 37). @returns KL_OK or KL_ENOMEM (unchanged).
 */
kl_err_t kl__buf_retag(kl__buf_t *buf, const void *key, size_t key_len,
                       int (*merge)(int have, int tag), int tag);

/** @returns the entry of @p key, or NULL; valid until @p key is set again. */
const kl__buf_entry_t *kl__buf_get(const kl__buf_t *buf, const void *key,
                                   size_t key_len);

/**
 * Lists the entries in LMDB's default key order (memcmp, then the shorter
 * first), so a commit writes neighbouring keys one after another.
 * @param out  receives an array of buf->count entries (NULL when empty),
 *             the buffer's: valid until the buffer is set, reset or
 *             cleared. The buffer keeps it for the next call.
 * @returns KL_OK or KL_ENOMEM.
 */
kl_err_t kl__buf_sorted(kl__buf_t *buf, const kl__buf_entry_t *const **out);

#endif
