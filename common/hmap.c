/* The intrusive chained hash map; see hmap.h. */
#include "common/hmap.h"

#include <stdlib.h>
#include <string.h>

int kl__hmap_grow(kl__hmap_t *map, size_t first) {
  size_t cap = map->cap ? map->cap * 2 : first;
  if (cap <= map->cap) /* doubling wrapped */
    return -1;
  kl__hnode_t **b = calloc(cap, sizeof(*b));
  if (!b)
    return -1;
  for (size_t i = 0; i < map->cap; i++)
    for (kl__hnode_t *n = map->buckets[i], *next; n; n = next) {
      next = n->next;
      n->next = b[n->hash & (cap - 1)];
      b[n->hash & (cap - 1)] = n;
    }
  free(map->buckets);
  map->buckets = b;
  map->cap = cap;
  return 0;
}

kl__hnode_t *kl__hmap_iter_next(kl__hmap_iter_t *it) {
  kl__hnode_t *n = it->next;
  while (!n && it->bucket < it->map->cap)
    n = it->map->buckets[it->bucket++];
  if (n)
    it->next = n->next;
  return n;
}

void kl__hmap_empty(kl__hmap_t *map) {
  if (map->buckets) /* memset(NULL, 0, 0) is undefined behaviour */
    memset(map->buckets, 0, map->cap * sizeof(*map->buckets));
  map->count = 0;
}

void kl__hmap_free(kl__hmap_t *map) {
  free(map->buckets);
  *map = (kl__hmap_t)KL__HMAP_INIT;
}
