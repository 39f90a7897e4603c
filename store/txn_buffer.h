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

typedef struct kl__buf {
  kl__buf_entry_t **slots; /* cap slots, NULL when free; cap a power of 2 */
  size_t cap;
  size_t count;
  size_t *used;           /* the count occupied slots, in insertion order */
  kl__buf_chunk_t *arena; /* the entries; the newest chunk first */
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
 * Empties the buffer but keeps its table and some of its arena for the
 * next use; kl__buf_clear() still frees it in the end.
 */
void kl__buf_reset(kl__buf_t *buf);

/**
 * Sets @p key to a copy of @p val with @p tag, replacing an earlier entry
 * (which invalidates pointers into it). @p val may point into the buffer.
 * @returns KL_OK or KL_ENOMEM (the buffer is unchanged then).
 */
kl_err_t kl__buf_set(kl__buf_t *buf, const void *key, size_t key_len,
                     const void *val, size_t val_len, int tag);

/** @returns the entry of @p key, or NULL; valid until @p key is set again. */
const kl__buf_entry_t *kl__buf_get(const kl__buf_t *buf, const void *key,
                                   size_t key_len);

/**
 * Lists the entries in LMDB's default key order (memcmp, then the shorter
 * first), so a commit writes neighbouring keys one after another.
 * @param out  receives a malloc'd array of buf->count entries (NULL when
 *             empty); the caller frees the array, not the entries.
 */
kl_err_t kl__buf_sorted(const kl__buf_t *buf, const kl__buf_entry_t ***out);

#endif
