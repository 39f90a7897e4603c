/*
 * The child transaction of child.h: a store backend with only the txn
 * operations, reading through a lane's overlay (ov.c) to its base txn.
 */
#include "store/child.h"

#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "store/outbox_rec.h"
#include "store/backend.h"
#include "store/store_internal.h"

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

static struct pg_conn *child_pg_conn(kl_txn_t *txn) {
  kl__child_t *c = (kl__child_t *)txn;
  if (!c->sql) {
    kl__err(KL_EINVAL,
            "kl_txn_pg_conn: the handler runs key-parallel "
            "(worker.concurrency > 1), beside other events of the same "
            "batch, so no SQL transaction is its own: use the kl_txn_* "
            "calls, or worker.concurrency=1 for a handler that runs SQL");
    return NULL;
  }
  /* If the savepoint fails, so do the handler's statements: it retries. */
  if (!c->pg && (c->pg = kl_txn_pg_conn(c->snap)) != NULL)
    c->savepoint = kl__store_savepoint(c->snap, KL__SAVEPOINT_SET) == KL_OK;
  return c->pg;
}

kl_err_t kl__child_end(kl__child_t *child, int ok) {
  if (!child->pg)
    return KL_OK;
  if (!child->savepoint)
    return kl__err(KL_ESTORE_BUSY, "%s: no savepoint for the event's SQL",
                   kl_store_backend(child->snap->store));
  child->savepoint = 0;
  return kl__store_savepoint(child->snap, ok ? KL__SAVEPOINT_RELEASE
                                             : KL__SAVEPOINT_ROLLBACK);
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

static kl_store_t kl_child_store = {.ops = &kl_child_ops};

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
  child->base.timers = 0;
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
                                kl__ov_writer_t *writer, int space) {
  for (size_t i = 0; i < buf->count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(buf, i);
    if (kl__ov_set(ov, writer, space, kl__buf_key(e), e->key_len,
                   kl__buf_val(e), e->val_len, e->tag))
      return KL_ENOMEM;
  }
  return KL_OK;
}

kl_err_t kl__child_merge(kl__child_t *child, kl__overlay_t *ov,
                         kl__ov_writer_t *writer) {
  kl_err_t err = child_merge_buf(&child->data, ov, writer, KL__OV_DATA);
  return err ? err : child_merge_buf(&child->ids, ov, writer, KL__OV_ID);
}

kl_err_t kl__child_apply(kl__child_t *child) {
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && i < child->data.count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(&child->data, i);
    err = e->tag == KL__OV_DEL
              ? kl__txn_kv_del(child->snap, kl__buf_key(e), e->key_len)
              : kl__txn_kv_put(child->snap, kl__buf_key(e), e->key_len,
                               kl__buf_val(e), e->val_len);
  }
  for (size_t i = 0; !err && i < child->ids.count; i++) {
    const kl__buf_entry_t *e = kl__buf_at(&child->ids, i);
    err = kl__txn_mark_sid(child->snap, kl__buf_key(e), e->key_len,
                           (kl_mark_t)e->tag);
  }
  return err;
}
