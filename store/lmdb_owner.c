/*
 * The LMDB store's record of each topic's owner (store_internal.h,
 * kl__store_owner_t): the "owners" database, topic -> cluster id NUL group,
 * written by a worker's first acquire of the topic (in the acquire's
 * write transaction, lmdb.c) and by kl__store_bind().
 */
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "store/lmdb.h"
#include "store/store_internal.h"

int kl__lmdb_owner_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                       kl__store_owner_t *owner) {
  MDB_val key = {strlen(topic), (void *)topic}, val;
  memset(owner, 0, sizeof(*owner));
  int rc = mdb_get(mtxn, lmdb->owners, &key, &val);
  if (rc)
    return rc;
  const char *v = val.mv_data;
  const char *nul = memchr(v, '\0', val.mv_size);
  size_t clen = nul ? (size_t)(nul - v) : 0;
  size_t glen = nul ? val.mv_size - clen - 1 : 0;
  if (!nul || clen > KL__OWNER_CLUSTER_MAX || glen > KL__OWNER_GROUP_MAX)
    return MDB_CORRUPTED;
  memcpy(owner->cluster, v, clen);
  memcpy(owner->group, nul + 1, glen);
  return 0;
}

int kl__lmdb_owner_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                       const kl__store_owner_t *owner) {
  char buf[sizeof(owner->cluster) + sizeof(owner->group)];
  size_t clen = strlen(owner->cluster), glen = strlen(owner->group);
  memcpy(buf, owner->cluster, clen + 1);
  memcpy(buf + clen + 1, owner->group, glen);
  MDB_val key = {strlen(topic), (void *)topic}, val = {clen + 1 + glen, buf};
  return mdb_put(mtxn, lmdb->owners, &key, &val, 0);
}

kl_err_t kl__lmdb_owner(kl_store_t *store, const char *topic,
                        kl__store_owner_t *owner) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = kl__lmdb_owner_get(lmdb, snap, topic, owner);
  kl__lmdb_read_end(lmdb, snap);
  if (rc == MDB_NOTFOUND)
    return kl__err(KL_ENOTFOUND,
                   "the store records no owner of topic %s: no worker of "
                   "this version took it yet",
                   topic);
  return rc ? kl__lmdb_err(rc, "read the topic's owner") : KL_OK;
}

typedef struct kl_bind_ctx {
  const char *topic;
  const kl__store_owner_t *owner;
} kl_bind_ctx_t;

static int bind_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                   kl_err_t *stop) {
  kl_bind_ctx_t *ctx = opaque;
  (void)stop;
  return kl__lmdb_owner_put(lmdb, mtxn, ctx->topic, ctx->owner);
}

kl_err_t kl__lmdb_bind(kl_store_t *store, const char *topic,
                       const kl__store_owner_t *owner) {
  kl_bind_ctx_t ctx = {topic, owner};
  return kl__lmdb_write((kl__lmdb_t *)store, "record the topic's owner",
                        bind_fn, &ctx);
}
