/*
 * The owner cache: handler keys and values kept in memory between batches
 * by the worker that owns their partition.
 *
 * Why it is safe. While a worker holds a partition's epoch it is the only
 * writer of that partition's keys: any other writer had to take a newer
 * epoch first, and then this owner's next commit is fenced. So what the
 * owner read and committed stays true until the epoch moves, and the
 * cache is dropped whenever that may have happened or the outcome of a
 * write is unknown:
 * - an epoch change: a batch begun with another epoch than the one the
 *   cache holds (kl__cache_own()), or an acquire or reset by this store;
 * - a fence (a begin or commit that returned KL_EFENCED);
 * - a failed commit (it may have landed or not);
 * - a revoke (kl__store_forget()), which also frees the memory.
 *
 * Concurrent batches of one partition (key-parallel snapshots beside the
 * group commit) must neither put an older value over a newer one nor read
 * a value their snapshot does not hold:
 * - a batch uses the cache (hits and fills) only while no commit of the
 *   partition started, ended or was in flight since its ticket, taken
 *   before its snapshot: then every entry equals what the snapshot holds;
 * - a commit writes its values through only when no other commit of the
 *   partition started or ended while it ran; otherwise it removes its keys,
 *   and the next read fetches them.
 *
 * Bounded: at most max_bytes of entries (key, value and bookkeeping),
 * least recently used first out. A partition's segment (its epoch and
 * counters, ~100 bytes) stays until the cache is destroyed: one per
 * partition the store has begun a batch on.
 *
 * Thread safe: one mutex; values are copied out under it.
 */
#ifndef KEYLANE_STORE_CACHE_H
#define KEYLANE_STORE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "store/txn_buffer.h"

typedef struct kl__cache kl__cache_t;
typedef struct kl__cache_seg kl__cache_seg_t;

/** What the cache holds and has done; counters are cumulative. */
typedef struct kl__cache_stats {
  uint64_t max_bytes; /**< store.cache.max; 0: the cache is off */
  uint64_t bytes;     /**< held now */
  uint64_t entries;   /**< held now */
  uint64_t hits;      /**< kl_txn_get() answered from memory */
  uint64_t misses;    /**< kl_txn_get() that asked the server */
  uint64_t drops;     /**< partitions dropped (fence, failure, epoch, revoke) */
  uint64_t evictions; /**< entries pushed out by the bound */
  /** Not the cache's, reported with it: kl_txn_seen() calls that asked the
   *  server one id at a time (not prefetched with kl_txn_prefetch()). */
  uint64_t id_queries;
  /** Ids kl_txn_prefetch() asked the server about, in all. */
  uint64_t id_prefetched;
  /** Commits (kl_store_commit(), kl__store_commit_many()): how many, the
   *  partition batches they held, and the ns their callers waited for
   *  the server's answer: what a batch's commit costs the worker. */
  uint64_t commits, commit_batches, commit_ns;
} kl__cache_stats_t;

/** How kl__cache_get() answered. */
typedef enum kl__cache_answer {
  KL__CACHE_MISS = 0,   /**< unknown: ask the server */
  KL__CACHE_HIT = 1,    /**< the value, copied out */
  KL__CACHE_ABSENT = 2, /**< the key is known not to exist */
} kl__cache_answer_t;

/**
 * @returns a cache of at most @p max_bytes, or NULL when @p max_bytes is 0
 *          (every function below accepts a NULL cache and does nothing) or
 *          memory is short.
 */
kl__cache_t *kl__cache_new(size_t max_bytes);

/** Frees @p cache and every entry; accepts NULL. */
void kl__cache_destroy(kl__cache_t *cache);

/**
 * The segment of @p partition of @p topic, made when missing; valid until
 * kl__cache_destroy(). @returns NULL when @p cache is NULL or memory is
 * short (the batch then runs without the cache).
 */
kl__cache_seg_t *kl__cache_seg(kl__cache_t *cache, const char *topic,
                               int32_t partition);

/** The batch's ticket, taken BEFORE its snapshot: 0 (no cache for this
 *  batch) when a commit of the partition is in flight. */
uint64_t kl__cache_ticket(kl__cache_t *cache, kl__cache_seg_t *seg);

/** After a batch's epoch check passed: drops the segment when it holds
 *  another epoch, then marks it as @p epoch's. */
void kl__cache_own(kl__cache_t *cache, kl__cache_seg_t *seg, uint64_t epoch);

/**
 * Looks @p key up for a batch of @p epoch and @p ticket. On KL__CACHE_HIT
 * the value is
 * copied into *@p buf (grown with realloc, *@p cap its size) and its length
 * set in *@p len; memory short counts as a miss.
 */
kl__cache_answer_t kl__cache_get(kl__cache_t *cache, kl__cache_seg_t *seg,
                                 uint64_t epoch, uint64_t ticket,
                                 const void *key, size_t key_len,
                                 unsigned char **buf, size_t *cap, size_t *len);

/**
 * What is known, for a batch of @p epoch and @p ticket, of @p key in the
 * store, for a put's commit: KL__CACHE_HIT when it exists, the value this
 * owner knows copied into *@p buf (as kl__cache_get() does); the commit
 * then updates the row on the condition that it still holds that value.
 * KL__CACHE_ABSENT when it is known not to exist: the commit inserts it,
 * which fails when another writer did meanwhile. KL__CACHE_MISS when
 * nothing is known (or memory is short): the commit upserts it. Counts
 * neither a hit nor a miss.
 */
kl__cache_answer_t kl__cache_stored(kl__cache_t *cache, kl__cache_seg_t *seg,
                                    uint64_t epoch, uint64_t ticket,
                                    const void *key, size_t key_len,
                                    unsigned char **buf, size_t *cap,
                                    size_t *len);

/**
 * Records what a batch of @p epoch read from its snapshot: @p val (NULL:
 * the key does not exist). Ignored unless the batch may use the cache
 * (see above).
 */
void kl__cache_fill(kl__cache_t *cache, kl__cache_seg_t *seg, uint64_t epoch,
                    uint64_t ticket, const void *key, size_t key_len,
                    const void *val, size_t val_len);

/** Before a commit's statements are sent. @returns what to pass to
 *  kl__cache_commit_end(). */
uint64_t kl__cache_commit_start(kl__cache_t *cache, kl__cache_seg_t *seg);

/**
 * After the commit's outcome is known. @p committed: the writes of
 * @p data (tag @p del_tag: a delete; others: a put) are written through,
 * or only removed when another commit of the segment overlapped this one
 * or the segment no longer holds @p epoch. Not committed (fenced, failed,
 * unknown): the whole segment is dropped.
 */
void kl__cache_commit_end(kl__cache_t *cache, kl__cache_seg_t *seg,
                          uint64_t epoch, uint64_t start, int committed,
                          const kl__buf_t *data, int del_tag);

/** Drops every entry of the segment and forgets its epoch. */
void kl__cache_drop(kl__cache_t *cache, kl__cache_seg_t *seg);

/** kl__cache_drop() of @p partition of @p topic, when it has a segment. */
void kl__cache_drop_partition(kl__cache_t *cache, const char *topic,
                              int32_t partition);

/** Fills @p stats (zeroes for a NULL cache). */
void kl__cache_stats(kl__cache_t *cache, kl__cache_stats_t *stats);

#endif
