/*
 * The overlay (common/hmap.h's chained map, for the removal that the batch
 * buffer of txn_buffer.c does not need and so lacks) and the child
 * transaction that reads through it.
 */
#include "worker/txn_child.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "store/outbox_rec.h"
#include "store/backend.h"
#include "store/store_internal.h"

/* ---- the overlay ----------------------------------------------------- */

/* FNV-1a over the space byte and the key: the keys are the lane's own. */
static uint64_t ov_hash(int space, const void *key, size_t len) {
  unsigned char s = (unsigned char)space;
  return kl__fnv1a_more(kl__fnv1a(&s, 1), key, len);
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

static void ov_link_writer(kl__ov_entry_t *e, kl__lkey_t *writer) {
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

kl_err_t kl__ov_set(kl__overlay_t *ov, kl__lkey_t *writer, int space,
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

void kl__ov_release_key(kl__overlay_t *ov, kl__lkey_t *writer) {
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

/* ---- the child transaction ------------------------------------------- */

/* No lock in inline mode: the poll thread is the only one there. */
static void child_lock(kl__child_t *c) {
  if (c->mu)
    pthread_mutex_lock(c->mu);
}

static void child_unlock(kl__child_t *c) {
  if (c->mu)
    pthread_mutex_unlock(c->mu);
}

static kl_err_t child_lent(kl__child_t *c, const kl__ov_entry_t *e,
                           const void **val, size_t *val_len) {
  unsigned char *p = kl__reserve(c->rbuf, &c->rcap, e->val_len, 1, e->val_len);
  if (!p)
    return kl__err(KL_ENOMEM, "kl_txn_get: out of memory");
  c->rbuf = p;
  if (e->val_len)
    memcpy(c->rbuf, e->val, e->val_len);
  *val = c->rbuf;
  *val_len = e->val_len;
  return KL_OK;
}

static kl_err_t child_get(kl_txn_t *txn, const void *key, size_t key_len,
                          const void **val, size_t *val_len) {
  kl__child_t *c = (kl__child_t *)txn;
  const kl__buf_entry_t *own = kl__buf_get(&c->data, key, key_len);
  if (own) {
    if (own->tag == KL__OV_DEL)
      return KL_ENOTFOUND;
    *val = kl__buf_val(own);
    *val_len = own->val_len;
    return KL_OK;
  }
  child_lock(c);
  const kl__ov_entry_t *e = kl__ov_get(c->ov, KL__OV_DATA, key, key_len);
  kl_err_t err = KL_ENOTFOUND;
  if (e && e->tag == KL__OV_PUT)
    err = child_lent(c, e, val, val_len);
  child_unlock(c);
  if (e)
    return err;
  return kl_txn_get(c->snap, key, key_len, val, val_len);
}

static kl_err_t child_put(kl_txn_t *txn, const void *key, size_t key_len,
                          const void *val, size_t val_len) {
  kl__child_t *c = (kl__child_t *)txn;
  if (kl__buf_set(&c->data, key, key_len, val, val_len, KL__OV_PUT))
    return kl__err(KL_ENOMEM, "kl_txn_put: out of memory");
  return KL_OK;
}

static kl_err_t child_del(kl_txn_t *txn, const void *key, size_t key_len) {
  kl__child_t *c = (kl__child_t *)txn;
  if (kl__buf_set(&c->data, key, key_len, NULL, 0, KL__OV_DEL))
    return kl__err(KL_ENOMEM, "kl_txn_del: out of memory");
  return KL_OK;
}

static kl_err_t child_seen(kl_txn_t *txn, const char *id, size_t id_len,
                           kl_mark_t *mark) {
  kl__child_t *c = (kl__child_t *)txn;
  const kl__buf_entry_t *own = kl__buf_get(&c->ids, id, id_len);
  if (own) {
    *mark = (kl_mark_t)own->tag;
    return KL_OK;
  }
  child_lock(c);
  const kl__ov_entry_t *e = kl__ov_get(c->ov, KL__OV_ID, id, id_len);
  if (e)
    *mark = (kl_mark_t)e->tag;
  child_unlock(c);
  return e ? KL_OK : kl__txn_seen_sid(c->snap, id, id_len, mark);
}

static kl_err_t child_mark(kl_txn_t *txn, const char *id, size_t id_len,
                           kl_mark_t mark) {
  kl__child_t *c = (kl__child_t *)txn;
  return kl__store_buf_mark(&c->ids, id, id_len, mark);
}

static void child_count_duplicate(kl_txn_t *txn) {
  ((kl__child_t *)txn)->duplicates++;
}

static void *child_pg_conn(kl_txn_t *txn) {
  kl__child_t *c = (kl__child_t *)txn;
  if (!c->sql)
    return NULL;
  if (!c->pg && (c->pg = kl_txn_pg_conn(c->snap)) != NULL) {
    PGresult *res = PQexec(c->pg, "SAVEPOINT keylane_event");
    c->savepoint = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res); /* if not, the handler's statements fail: it retries */
  }
  return c->pg;
}

kl_err_t kl__child_end(kl__child_t *child, int ok) {
  if (!child->pg)
    return KL_OK;
  if (!child->savepoint)
    return kl__err(KL_ESTORE_BUSY, "postgresql: no savepoint for the "
                                   "event's SQL");
  PGresult *res = PQexec(child->pg, ok ? "RELEASE SAVEPOINT keylane_event"
                                       : "ROLLBACK TO SAVEPOINT keylane_event");
  int done = PQresultStatus(res) == PGRES_COMMAND_OK;
  kl_err_t err = done ? KL_OK
                      : kl__err(KL_ESTORE_BUSY,
                                "postgresql: %s the event's "
                                "savepoint: %s",
                                ok ? "release" : "roll back to",
                                PQerrorMessage(child->pg));
  PQclear(res);
  child->savepoint = 0;
  return err;
}

/* Only the txn operations: a child is never begun, committed or scanned
 * through the store API. */
static const kl__store_ops_t kl_child_ops = {
    .name = "child",
    .get = child_get,
    .put = child_put,
    .del = child_del,
    .seen = child_seen,
    .mark = child_mark,
    .count_duplicate = child_count_duplicate,
    .pg_conn = child_pg_conn,
};

static kl_store_t kl_child_store = {&kl_child_ops, 0};

void kl__child_init(kl__child_t *child) {
  memset(child, 0, sizeof(*child));
  child->base.store = &kl_child_store;
  kl__buf_init(&child->data);
  kl__buf_init(&child->ids);
}

void kl__child_begin(kl__child_t *child, kl_txn_t *snap, pthread_mutex_t *mu,
                     const kl__overlay_t *ov) {
  kl__buf_reset(&child->data);
  kl__buf_reset(&child->ids);
  kl__emits_reset(child->base.emits); /* the last event's, when not kept */
  child->snap = snap;
  child->mu = mu;
  child->ov = ov;
  child->duplicates = 0;
  child->pg = NULL;
  child->savepoint = 0;
}

void kl__child_destroy(kl__child_t *child) {
  kl__buf_clear(&child->data);
  kl__buf_clear(&child->ids);
  kl__txn_emits_free(&child->base);
  free(child->rbuf);
  child->rbuf = NULL;
  child->rcap = 0;
}

int kl__child_seen_elsewhere(const kl__child_t *child,
                             const kl__overlay_t *ov) {
  for (size_t i = 0; i < child->ids.count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(&child->ids, i);
    if (e->tag == KL_MARK_APPLIED &&
        kl__ov_get(ov, KL__OV_ID, kl__buf_key(e), e->key_len))
      return 1;
  }
  return 0;
}

static kl_err_t child_merge_buf(const kl__buf_t *buf, kl__overlay_t *ov,
                                kl__lkey_t *writer, int space) {
  for (size_t i = 0; i < buf->count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(buf, i);
    if (kl__ov_set(ov, writer, space, kl__buf_key(e), e->key_len,
                   kl__buf_val(e), e->val_len, e->tag))
      return KL_ENOMEM;
  }
  return KL_OK;
}

kl_err_t kl__child_merge(kl__child_t *child, kl__overlay_t *ov,
                         kl__lkey_t *writer) {
  kl_err_t err = child_merge_buf(&child->data, ov, writer, KL__OV_DATA);
  return err ? err : child_merge_buf(&child->ids, ov, writer, KL__OV_ID);
}

kl_err_t kl__child_apply(kl__child_t *child) {
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && i < child->data.count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(&child->data, i);
    err = e->tag == KL__OV_DEL
              ? kl_txn_del(child->snap, kl__buf_key(e), e->key_len)
              : kl_txn_put(child->snap, kl__buf_key(e), e->key_len,
                           kl__buf_val(e), e->val_len);
  }
  for (size_t i = 0; !err && i < child->ids.count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(&child->ids, i);
    err = kl__txn_mark_sid(child->snap, kl__buf_key(e), e->key_len,
                           (kl_mark_t)e->tag);
  }
  return err;
}
