/*
 * The overlay of ov.h: a chained map of the completed events' writes, each
 * entry also on its writer's list and, until a batch takes it, the dirty
 * list.
 */
#include "store/ov.h"

#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "store/store_internal.h"

/* The space byte, then the key: the keys are the lane's own. */
static uint64_t ov_hash(int space, const void *key, size_t len) {
  return kl__hash_more((uint64_t)space, key, len);
}

void kl__ov_init(kl__overlay_t *ov) {
  memset(ov, 0, sizeof(*ov));
  ov->gen = 1;
}

static kl__ov_entry_t *ov_find(const kl__overlay_t *ov, uint64_t hash,
                               int space, const void *key, size_t len) {
  for (kl__hnode_t *n = kl__hmap_first(&ov->map, hash); n;
       n = kl__hmap_next(n, hash)) {
    kl__ov_entry_t *e = KL__HMAP_ENTRY(n, kl__ov_entry_t, node);
    if (e->key_len == len + 1 && e->key[0] == space &&
        memcmp(e->key + 1, key, len) == 0)
      return e;
  }
  return NULL;
}

const kl__ov_entry_t *kl__ov_get(const kl__overlay_t *ov, int space,
                                 const void *key, size_t key_len) {
  if (!ov->map.count) /* inline mode: mostly empty, so skip the hash */
    return NULL;
  return ov_find(ov, ov_hash(space, key, key_len), space, key, key_len);
}

static void ov_link_writer(kl__ov_entry_t *e, kl__ov_writer_t *writer) {
  e->writer = writer;
  e->kprev = NULL;
  e->knext = writer->entries;
  if (writer->entries)
    writer->entries->kprev = e;
  writer->entries = e;
}

static void ov_unlink_writer(kl__ov_entry_t *e) {
  if (e->kprev)
    e->kprev->knext = e->knext;
  else
    e->writer->entries = e->knext;
  if (e->knext)
    e->knext->kprev = e->kprev;
  e->writer = NULL;
}

static kl_err_t ov_new_entry(kl__overlay_t *ov, uint64_t hash, int space,
                             const void *key, size_t key_len,
                             kl__ov_entry_t **out) {
  if (kl__hmap_reserve(&ov->map, 256))
    return KL_ENOMEM;
  kl__ov_entry_t *e = calloc(1, sizeof(*e) + key_len + 1);
  if (!e)
    return KL_ENOMEM;
  e->key_len = key_len + 1;
  e->key[0] = (unsigned char)space;
  memcpy(e->key + 1, key, key_len);
  kl__hmap_link(&ov->map, &e->node, hash);
  *out = e;
  return KL_OK;
}

kl_err_t kl__ov_set(kl__overlay_t *ov, kl__ov_writer_t *writer, int space,
                    const void *key, size_t key_len, const void *val,
                    size_t val_len, int tag) {
  uint64_t hash = ov_hash(space, key, key_len);
  kl__ov_entry_t *e = ov_find(ov, hash, space, key, key_len);
  if (!e && ov_new_entry(ov, hash, space, key, key_len, &e))
    return KL_ENOMEM;
  if (val_len || !e->val) {
    unsigned char *v = realloc(e->val, val_len ? val_len : 1);
    if (!v)
      return KL_ENOMEM;
    e->val = v;
  }
  if (val_len)
    memcpy(e->val, val, val_len);
  e->val_len = val_len;
  /* A new entry's tag is 0, KL_MARK_NONE. */
  e->tag = space == KL__OV_ID
               ? (int)kl__mark_merge((kl_mark_t)e->tag, (kl_mark_t)tag)
               : tag;
  e->gen = ov->gen;
  if (e->writer != writer) {
    if (e->writer)
      ov_unlink_writer(e);
    ov_link_writer(e, writer);
  }
  if (!e->dirty) {
    e->dirty = 1;
    e->dnext = ov->dirty;
    ov->dirty = e;
  }
  return KL_OK;
}

void kl__ov_free_entry(kl__overlay_t *ov, kl__ov_entry_t *entry) {
  kl__hmap_unlink(&ov->map, &entry->node);
  if (entry->writer)
    ov_unlink_writer(entry);
  free(entry->val);
  free(entry);
}

void kl__ov_release_key(kl__overlay_t *ov, kl__ov_writer_t *writer) {
  for (kl__ov_entry_t *e = writer->entries, *next; e; e = next) {
    next = e->knext;
    if (!e->dirty && e->gen <= ov->committed_gen)
      kl__ov_free_entry(ov, e);
  }
}

void kl__ov_clear(kl__overlay_t *ov) {
  kl__hmap_iter_t it = KL__HMAP_ITER(&ov->map);
  for (kl__hnode_t *n; (n = kl__hmap_iter_next(&it));) {
    kl__ov_entry_t *e = KL__HMAP_ENTRY(n, kl__ov_entry_t, node);
    if (e->writer)
      ov_unlink_writer(e);
    free(e->val);
    free(e);
  }
  kl__hmap_free(&ov->map);
  uint64_t gen = ov->gen;
  kl__ov_init(ov);
  ov->gen = gen + 1; /* nothing written before is trusted to be stored */
  ov->committed_gen = gen;
}

kl__ov_entry_t *kl__ov_take_dirty(kl__overlay_t *ov, size_t *count) {
  kl__ov_entry_t *list = ov->dirty;
  size_t n = 0;
  for (kl__ov_entry_t *e = list; e; e = e->dnext, n++)
    e->dirty = 0;
  ov->dirty = NULL;
  ov->gen++;
  *count = n;
  return list;
}
