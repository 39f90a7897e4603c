/*
 * The LMDB store's outbox (store_internal.h): its own named database,
 * "outbox", so that the other databases keep their layout (no format
 * step: a build without it ignores it).
 *
 *   topic NUL partition (uint32 BE) seq (uint64 BE) -> the record
 *                                                      (outbox_rec.h)
 *   NUL "next"                                       -> uint64 next seq
 *
 * A topic is never empty, so the counter's key sorts apart from every
 * record. Seqs come from that one counter, in the write transaction that
 * holds the writer lock, so they only grow, in commit order.
 */
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "store/outbox_rec.h"
#include "store/lmdb.h"

#define KL_OB_KEY_MAX (249 + 1 + 4 + 8)
static const char kl_ob_next_key[] = "\0next";

static size_t ob_key(unsigned char *buf, const char *topic, int32_t partition,
                     uint64_t seq) {
  size_t len = strlen(topic) + 1;
  memcpy(buf, topic, len);
  kl__put_be32(buf + len, (uint32_t)partition);
  kl__put_be32(buf + len + 4, (uint32_t)(seq >> 32));
  kl__put_be32(buf + len + 8, (uint32_t)seq);
  return len + 12;
}

int kl__lmdb_outbox_write(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                          int32_t partition, const kl__emits_t *emits) {
  MDB_val nk = {sizeof(kl_ob_next_key) - 1, (void *)kl_ob_next_key}, nv;
  uint64_t next = 1;
  int rc = mdb_get(mtxn, lmdb->outbox, &nk, &nv);
  if (rc && rc != MDB_NOTFOUND)
    return rc;
  if (!rc && nv.mv_size != sizeof(next))
    return MDB_CORRUPTED;
  if (!rc)
    memcpy(&next, nv.mv_data, sizeof(next));
  size_t off = 0, len;
  const void *rec;
  while (kl__emits_next(emits, &off, &rec, &len)) {
    unsigned char kb[KL_OB_KEY_MAX];
    MDB_val k = {ob_key(kb, topic, partition, next++), kb};
    MDB_val v = {len, (void *)rec};
    if ((rc = mdb_put(mtxn, lmdb->outbox, &k, &v, 0)))
      return rc;
  }
  nv = (MDB_val){sizeof(next), &next};
  return mdb_put(mtxn, lmdb->outbox, &nk, &nv, 0);
}

kl_err_t kl__lmdb_outbox_list(kl_store_t *store, const char *topic,
                              int32_t partition, uint64_t after, size_t max,
                              kl__outbox_cb_t *cb, void *opaque) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  MDB_cursor *cur = NULL;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  unsigned char kb[KL_OB_KEY_MAX];
  size_t plen = ob_key(kb, topic, partition, after + 1) - 8;
  MDB_val k = {plen + 8, kb}, v;
  int rc = mdb_cursor_open(snap, lmdb->outbox, &cur);
  if (!rc)
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
  for (size_t n = 0; !rc && n < max; n++) {
    if (k.mv_size != plen + 8 || memcmp(k.mv_data, kb, plen) != 0)
      break;
    if (cb(opaque, kl__get_be((const unsigned char *)k.mv_data + plen, 8),
           v.mv_data, v.mv_size))
      break;
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  if (cur)
    mdb_cursor_close(cur);
  kl__lmdb_read_end(lmdb, snap);
  return rc && rc != MDB_NOTFOUND ? kl__lmdb_err(rc, "list the outbox") : KL_OK;
}

typedef struct kl_ob_del {
  const char *topic;
  const kl__outbox_ack_t *acks;
  size_t n;
} kl_ob_del_t;

static int ob_del_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                     kl_err_t *stop) {
  kl_ob_del_t *d = opaque;
  (void)stop;
  for (size_t i = 0; i < d->n; i++) {
    unsigned char kb[KL_OB_KEY_MAX];
    MDB_val k = {ob_key(kb, d->topic, d->acks[i].partition, d->acks[i].seq),
                 kb};
    int rc = mdb_del(mtxn, lmdb->outbox, &k, NULL);
    if (rc && rc != MDB_NOTFOUND)
      return rc;
  }
  return 0;
}

kl_err_t kl__lmdb_outbox_del(kl_store_t *store, const char *topic,
                             const kl__outbox_ack_t *acks, size_t n) {
  kl_ob_del_t d = {topic, acks, n};
  return kl__lmdb_write((kl__lmdb_t *)store, "remove published follow-ups",
                        ob_del_fn, &d);
}
