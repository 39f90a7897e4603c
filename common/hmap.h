/*
 * One intrusive chained hash map: an entry embeds a kl__hnode_t and the
 * map links the nodes. The map never allocates or frees an entry, so a
 * key costs no allocation beyond the caller's own; it allocates only its
 * buckets, a power of two doubled when the entries reach their number, so
 * that a chain stays about one node long.
 *
 * The caller hashes (common/hash.h) and compares its keys:
 *
 *   for (kl__hnode_t *n = kl__hmap_first(&map, h); n;
 *        n = kl__hmap_next(n, h)) {
 *     entry_t *e = KL__HMAP_ENTRY(n, entry_t, node);
 *     if (e->len == len && memcmp(e->key, key, len) == 0)
 *       return e;
 *   }
 *
 * and inserts with kl__hmap_reserve() then kl__hmap_link().
 *
 * Ownership: the entries stay the caller's; kl__hmap_free() releases the
 * buckets only.
 *
 * Caveats:
 * - Not thread safe: the caller serializes every call on one map.
 * - Not for keys an adversary picks (FNV-1a collides easily): a chain
 *   would grow without bound.
 */
#ifndef KEYLANE_COMMON_HMAP_H
#define KEYLANE_COMMON_HMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kl__hnode {
  struct kl__hnode *next; /* the bucket's next node */
  uint64_t hash;
} kl__hnode_t;

typedef struct kl__hmap {
  kl__hnode_t **buckets; /* cap of them, a power of two; NULL while cap 0 */
  size_t cap, count;
} kl__hmap_t;

#define KL__HMAP_INIT                                                          \
  { NULL, 0, 0 }

/** The entry of @p type whose member @p member is the node @p node. */
#define KL__HMAP_ENTRY(node, type, member)                                     \
  ((type *)(void *)((char *)(node)-offsetof(type, member)))

/** kl__hmap_reserve()'s slow path: the entries have reached the buckets. */
int kl__hmap_grow(kl__hmap_t *map, size_t first);

/**
 * Makes room for one more entry: when the entries reach the buckets'
 * number, doubles the buckets (@p first of them, a power of two, when
 * there are none yet) and moves every node to its new bucket.
 * @returns 0, or -1 when out of memory: then the map is unchanged and
 *          still usable when it has buckets (its chains only grow longer).
 */
static inline int kl__hmap_reserve(kl__hmap_t *map, size_t first) {
  return map->count < map->cap ? 0 : kl__hmap_grow(map, first);
}

/**
 * Links @p node, an entry not in the map, under @p hash. The map must
 * have buckets (a kl__hmap_reserve() succeeded once).
 */
static inline void kl__hmap_link(kl__hmap_t *map, kl__hnode_t *node,
                                 uint64_t hash) {
  kl__hnode_t **b = &map->buckets[hash & (map->cap - 1)];
  node->hash = hash;
  node->next = *b;
  *b = node;
  map->count++;
}

/** Unlinks @p node, which is in the map; the entry stays the caller's. */
static inline void kl__hmap_unlink(kl__hmap_t *map, kl__hnode_t *node) {
  kl__hnode_t **p = &map->buckets[node->hash & (map->cap - 1)];
  while (*p != node)
    p = &(*p)->next;
  *p = node->next;
  map->count--;
}

/** @returns the next node after @p node with @p hash, or NULL. */
static inline kl__hnode_t *kl__hmap_next(const kl__hnode_t *node,
                                         uint64_t hash) {
  kl__hnode_t *n = node->next;
  while (n && n->hash != hash)
    n = n->next;
  return n;
}

/**
 * @returns the first node with @p hash, or NULL; the caller compares its
 *          key and goes on with kl__hmap_next().
 */
static inline kl__hnode_t *kl__hmap_first(const kl__hmap_t *map,
                                          uint64_t hash) {
  if (!map->cap)
    return NULL;
  kl__hnode_t *n = map->buckets[hash & (map->cap - 1)];
  while (n && n->hash != hash)
    n = n->next;
  return n;
}

/**
 * A walk over every node, in no order. The node returned may be
 * unlinked and freed before the next call; no other may.
 */
typedef struct kl__hmap_iter {
  const kl__hmap_t *map;
  size_t bucket;
  kl__hnode_t *next;
} kl__hmap_iter_t;

#define KL__HMAP_ITER(map)                                                     \
  { (map), 0, NULL }

/** @returns the walk's next node, or NULL at the end. */
kl__hnode_t *kl__hmap_iter_next(kl__hmap_iter_t *it);

/** Forgets every node (the caller has freed them); keeps the buckets. */
void kl__hmap_empty(kl__hmap_t *map);

/** Frees the buckets (not the entries) and makes @p map KL__HMAP_INIT. */
void kl__hmap_free(kl__hmap_t *map);

#endif
