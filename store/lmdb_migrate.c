/*
 * LMDB format 1 -> 2: idempotency keys scoped by topic.
 *
 * Format 1 kept every id in "ids", unscoped: an id marked for one topic
 * suppressed the same id on every other topic of the store. Format 2 keys
 * them by topic number in "topic_ids". Which topic an old id belonged to
 * was never recorded, so each is copied to every topic the store knew
 * (numbered by the open, from "parts"): it still suppresses its own
 * event's duplicates, and, as before, the same id on the other topics,
 * until the retention sweeps it. New ids are scoped.
 *
 * The open writes format 2 first (with the topics' numbers), so an older
 * keylane refuses the store from then on; then the ids move in chunks of
 * one write transaction each, so that a large store neither needs one
 * huge transaction nor holds the writer lock for long. Every opener runs
 * the chunks until "ids" is gone before it returns the store, so no
 * caller ever sees an id that has not moved yet; a crash in between
 * leaves a consistent store whose next open goes on.
 */
#include <inttypes.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/log.h"
#include "store/store_internal.h"
#include "store/lmdb.h"

#define KL_COMP "store"
/* Old ids per write transaction (each written once per topic). */
#define KL_MIGRATE_CHUNK 10000
#define KL_SWEEP_CURSOR "sweep.cursor" /* holds a format-1 key: dropped */

typedef struct kl_migrate {
  size_t moved;  /* old ids moved by this chunk */
  size_t topics; /* each copied to this many topics */
  int done;      /* "ids" is gone */
} kl_migrate_t;

/* Copies one old id to every topic: numbers 1..topics, as they are given
 * (consecutively, never reused). */
static int migrate_one(kl__lmdb_t *lmdb, MDB_txn *mtxn, const MDB_val *key,
                       MDB_val *val, size_t topics) {
  unsigned char buf[KL__IDKEY_MAX];
  if (key->mv_size > KL__IDKEY_MAX - KL__TOPIC_NO_LEN)
    return MDB_CORRUPTED;
  memcpy(buf + KL__TOPIC_NO_LEN, key->mv_data, key->mv_size);
  for (uint32_t no = 1; no <= topics; no++) {
    kl__put_be32(buf, no);
    MDB_val k = {KL__TOPIC_NO_LEN + key->mv_size, buf};
    int rc = mdb_put(mtxn, lmdb->ids, &k, val, 0);
    if (rc)
      return rc;
  }
  return 0;
}

/* The last chunk: "ids" and the sweep's old position go. */
static int migrate_finish(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_dbi old) {
  MDB_val ck = {sizeof(KL_SWEEP_CURSOR) - 1, KL_SWEEP_CURSOR};
  int rc = mdb_drop(mtxn, old, 1);
  if (rc == 0)
    rc = mdb_del(mtxn, lmdb->meta, &ck, NULL);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Whether "ids" is still there, asked of the main database: a handle this
 * process opened earlier would outlive another process's drop of it. */
static int v1_exists(MDB_txn *mtxn) {
  MDB_dbi main;
  MDB_val name = {sizeof(KL__LMDB_IDS_V1_DB) - 1, KL__LMDB_IDS_V1_DB}, val;
  int rc = mdb_dbi_open(mtxn, NULL, 0, &main);
  return rc ? rc : mdb_get(mtxn, main, &name, &val);
}

static int migrate_chunk(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                         kl_err_t *stop) {
  kl_migrate_t *m = opaque;
  MDB_dbi old;
  MDB_stat st;
  MDB_cursor *cur;
  MDB_val key, val;
  (void)stop;
  m->moved = 0; /* run again from the start after a map growth */
  int rc = v1_exists(mtxn);
  if (rc == MDB_NOTFOUND) {
    m->done = 1;
    return 0;
  }
  if (rc || (rc = mdb_dbi_open(mtxn, KL__LMDB_IDS_V1_DB, 0, &old)) ||
      (rc = mdb_stat(mtxn, lmdb->topics, &st)) ||
      (rc = mdb_cursor_open(mtxn, old, &cur)))
    return rc;
  m->topics = st.ms_entries;
  while (m->moved < KL_MIGRATE_CHUNK &&
         (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST)) == 0) {
    if ((rc = migrate_one(lmdb, mtxn, &key, &val, m->topics)) ||
        (rc = mdb_cursor_del(cur, 0)))
      break;
    m->moved++;
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND && rc != 0)
    return rc;
  m->done = rc == MDB_NOTFOUND;
  return m->done ? migrate_finish(lmdb, mtxn, old) : 0;
}

kl_err_t kl__lmdb_migrate_ids(kl__lmdb_t *lmdb) {
  kl_migrate_t m = {0, 0, 0};
  size_t total = 0;
  while (!m.done) {
    kl_err_t err =
        kl__lmdb_write(lmdb, "migrate format 1 to 2", migrate_chunk, &m);
    if (err)
      return err;
    total += m.moved;
  }
  if (total && m.topics)
    KL_LOG_I(KL_COMP,
             "store %s: format 1 -> %u: this process scoped %zu "
             "idempotency keys to each of the store's %zu topics",
             lmdb->dir, KL__LMDB_FORMAT, total, m.topics);
  else if (total)
    KL_LOG_W(KL_COMP,
             "store %s: format 1 -> %u: dropped %zu idempotency "
             "keys: the store knew no topic they could belong to",
             lmdb->dir, KL__LMDB_FORMAT, total);
  return KL_OK;
}
