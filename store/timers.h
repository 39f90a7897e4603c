/*
 * Timers: the delayed events a partition's owner holds until their time
 * (docs/design.md, "Timers"), kept in the store's key space under keys
 * beginning with KL__STORE_OWN ('~'), which handlers may not write, so
 * that they commit, fence, rebuild and move with the partition like its
 * other writes, on every backend. Per topic and partition:
 *
 *   "~t" topic NUL partition (4, BE) h (8)          -> due (8, BE), offset
 *       (8, BE), key length (2, BE), key, id        (one per key and id)
 *   "~d" topic NUL partition (4, BE) due (8, BE) h  -> offset (8, BE), key
 *       length (2, BE), key, envelope               (the due index)
 *
 * h is the FNV-1a of the key's length, the key and the id; offset is the
 * scheduling record's, which its firing record names. Two events whose
 * (key, id) share h cannot both wait: the second is refused (KL_EINVAL),
 * not taken for the first.
 */
#ifndef KEYLANE_STORE_TIMERS_H
#define KEYLANE_STORE_TIMERS_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/store.h"

/* The longest "~d" key: its prefix, a topic of 249 bytes, due and h. */
#define KL__TIMER_KEY_MAX (2 + 249 + 1 + 4 + 8 + 8)

/** A pending timer of one key and id. */
typedef struct kl__timer {
  int64_t due_ms; /* ms since the Unix epoch */
  int64_t offset; /* of the record that scheduled it */
  uint64_t h;     /* kl__timers_scan(): its place among timers of one due */
} kl__timer_t;

/**
 * Looks up the timer of (@p key, @p id) of @p topic's @p partition in
 * @p txn (its own writes first). @returns KL_OK with *t, KL_ENOTFOUND, or
 * the store's failure.
 */
kl_err_t kl__timer_get(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, kl__timer_t *t);

/**
 * Writes the timer of (@p key, @p id), due at @p t->due_ms, holding the
 * envelope @p env, and marks the id KL__MARK_TIMER (store_internal.h), in
 * @p txn. @returns KL_OK, KL_EINVAL when another event's timer holds its
 * slot, or the store's failure.
 */
kl_err_t kl__timer_put(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, const kl__timer_t *t, const void *env,
                       size_t env_len);

/**
 * Looks up the timer a record of (@p key, @p id) may fire, and whether
 * the record is the event it holds: on the firing path (@p named >= 0, the
 * offset the record's firing header names; @p due_ms its envelope's
 * not_before) with ONE read of the due index, whose row holds the
 * envelope; otherwise, or when that row is not this record's, as
 * kl__timer_get(). @p env (@p env_len bytes) is the record's envelope.
 * @returns KL_OK with *@p t and *@p same (1: the timer of offset @p named,
 *          holding exactly @p env), KL_ENOTFOUND (*@p same 0), or the
 *          store's failure.
 */
kl_err_t kl__timer_find(kl_txn_t *txn, const char *topic, int32_t partition,
                        const void *key, size_t key_len, const char *id,
                        size_t id_len, int64_t named, int64_t due_ms,
                        const void *env, size_t env_len, kl__timer_t *t,
                        int *same);

/** Deletes the timer of (@p key, @p id), due at @p due_ms, which the
 *  caller found in @p txn. kl__timer_put() and this count what they did in
 *  the txn's timers (store/backend.h), for the owner's pending count. */
kl_err_t kl__timer_del(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, int64_t due_ms);

/** Called in due order; return nonzero to stop. The pointers are valid
 *  for the call only. */
typedef int(kl__timer_cb_t)(void *opaque, const kl__timer_t *t, const void *key,
                            size_t key_len, const void *env, size_t env_len);

/**
 * Walks the committed timers of @p topic's @p partition (every partition's
 * with @p partition -1), in due order, from one snapshot. A malformed
 * record is skipped and counted in *@p bad (may be NULL).
 */
kl_err_t kl__timers_scan(kl_store_t *store, const char *topic,
                         int32_t partition, kl__timer_cb_t *cb, void *opaque,
                         size_t *bad);

/**
 * Counts the committed timers of @p topic's @p partition into *@p n, from
 * one snapshot: a walk of its due index, so it costs what the timers
 * pending cost to read (the worker's count at take, worker/fire.h).
 */
kl_err_t kl__timers_count(kl_store_t *store, const char *topic,
                          int32_t partition, uint64_t *n);

#endif
