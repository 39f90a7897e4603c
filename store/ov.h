/*
 * The overlay ("ov"): writes of events that completed and whose batch is
 * not yet committed, which the next events read before the store
 * (store/child.h reads through it). Entries live in one chained map
 * (common/hmap.h, for the removal that txn_buffer.h lacks), keyed by a
 * space byte (data or idempotency id) and the key. Each entry is on the
 * list of the writer that wrote it last, so that a writer's stored entries
 * can go together, and on the dirty list until a batch takes it.
 *
 * Generations: new writes get ov->gen; kl__ov_take_dirty() starts a new
 * one for the writes after it, and once a batch of generation g is stored
 * the owner sets committed_gen = g, so that entries of g or older that
 * nobody rewrote may go.
 *
 * Caveats: not thread-safe; the owner (worker/lanes_internal.h) guards
 * each overlay with its lanes' lock.
 */
#ifndef KEYLANE_STORE_OV_H
#define KEYLANE_STORE_OV_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"
#include "common/hmap.h"

enum { KL__OV_PUT = 1, KL__OV_DEL = 2 }; /* tags in the data space */
enum { KL__OV_DATA = 'd', KL__OV_ID = 'i' };

typedef struct kl__ov_entry kl__ov_entry_t;

/* Who wrote entries (a lane's event key): the list of those it wrote
 * last. Embedded in the writer; empty when zeroed. */
typedef struct kl__ov_writer {
  kl__ov_entry_t *entries;
} kl__ov_writer_t;

struct kl__ov_entry {
  kl__hnode_t node;                   /* in the overlay's map */
  struct kl__ov_entry *kprev, *knext; /* the writer's entries */
  struct kl__ov_entry *dnext;         /* the dirty list */
  kl__ov_writer_t *writer;
  uint64_t gen; /* the build generation of the last write */
  int tag;      /* KL__OV_PUT/DEL, or a kl_mark_t in the id space */
  int dirty;    /* on the dirty list: written since the last build */
  unsigned char *val;
  size_t val_len;
  size_t key_len; /* the space byte, then the key */
  unsigned char key[];
};

typedef struct kl__overlay {
  kl__hmap_t map;         /* of kl__ov_entry_t */
  kl__ov_entry_t *dirty;  /* entries written since the last build */
  uint64_t gen;           /* the generation new writes get */
  uint64_t committed_gen; /* every write of a generation <= this is stored */
} kl__overlay_t;

/** Makes @p ov empty, at generation 1. */
void kl__ov_init(kl__overlay_t *ov);

/** The entry of @p key in @p space, or NULL; borrowed until it is
 *  written or freed. */
const kl__ov_entry_t *kl__ov_get(const kl__overlay_t *ov, int space,
                                 const void *key, size_t key_len);

/**
 * Writes @p key in @p space (@p val copied; @p tag KL__OV_PUT/DEL, or in
 * the id space a kl_mark_t merged with the entry's by kl__mark_merge()),
 * by @p writer, at the current generation, and puts it on the dirty list.
 * @returns KL_OK or KL_ENOMEM (then the entry may be half written: the
 *          caller discards the overlay).
 */
kl_err_t kl__ov_set(kl__overlay_t *ov, kl__ov_writer_t *writer, int space,
                    const void *key, size_t key_len, const void *val,
                    size_t val_len, int tag);

/** Frees @p writer's entries that are stored (gen <= committed_gen). */
void kl__ov_release_key(kl__overlay_t *ov, kl__ov_writer_t *writer);

/** Frees every entry; nothing written before is trusted to be stored. */
void kl__ov_clear(kl__overlay_t *ov);

/** Detaches the dirty list and starts a new generation; @returns the list,
 *  whose entries are in generation ov->gen - 1 or older. */
kl__ov_entry_t *kl__ov_take_dirty(kl__overlay_t *ov, size_t *count);

/** Unlinks @p entry and frees it. */
void kl__ov_free_entry(kl__overlay_t *ov, kl__ov_entry_t *entry);

#endif
