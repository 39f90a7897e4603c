/*
 * The LMDB store's ids moved from an older format's database into
 * KL__LMDB_IDS_DB (format 6), at open.
 *
 * Format 1 -> 2: idempotency keys scoped by topic. Format 1 kept every id
 * in "ids", unscoped: an id marked for one topic suppressed the same id on
 * every other topic of the store. Later formats key them by topic number.
 * Which topic an old id belonged to was never recorded, so each is copied
 * to every topic the store knew (numbered by the open, from "parts"): it
 * still suppresses its own event's duplicates, and, as before, the same id
 * on the other topics, until the retention sweeps it. New ids are scoped.
 *
 * Formats 2 to 5 -> 6: formats 2 to 5 kept the ids in "topic_ids", a UUID
 * id after its entity key (lmdb_ids.c, tag 3); format 6 keeps them in
 * "ids_v6", the UUID first (tag 5), every other key as it was.
 *
 * The open writes format 6 first, so an older keylane refuses to open the
 * store from then on; then the ids move in chunks of one write
 * transaction each, so that a large store neither needs one huge
 * transaction nor holds the writer lock for long. Every opener runs the
 * chunks until the move has ended before it returns the store, so no
 * caller ever sees an id that has not moved yet; a crash in between
 * leaves a consistent store whose next open goes on.
 *
 * Format 1's ids are moved (copied, then deleted from "ids"). Formats 2 to
 * 5's are copied and "topic_ids" stays whole until the last transaction,
 * because an older keylane that opened the store before may still run
 * beside the move: it reads and writes "topic_ids", and must find every
 * id there, or it would apply a copy of an event whose id had already
 * moved. The chunks copy "topic_ids" in key order from a position kept in
 * meta (KL_V6_POS), which every opener shares; the last transaction reads
 * all of "topic_ids" again and writes what the older keylane wrote or
 * changed meanwhile, then replaces it with the tombstone (copy_last()), on
 * which that keylane fails every read and write of an id: from then on it
 * commits nothing, and this release's lookups miss nothing it wrote.
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
#define KL_MIGRATE_SAY 500000 /* a progress line per this many copied */
#define KL_SWEEP_CURSOR "sweep.cursor" /* holds a format-1 key: dropped */

typedef struct kl_migrate {
  size_t moved;  /* old ids moved by this chunk */
  size_t topics; /* format 1's: each copied to this many topics */
  int done;      /* the old database is gone */
} kl_migrate_t;

/* Formats 2 to 5's copy (copy_chunk()). */
typedef struct kl_copy {
  size_t copied; /* ids this chunk copied */
  size_t old;    /* "topic_ids"' entries at this chunk */
  size_t caught; /* the last pass: ids written or changed after their copy */
  int last;      /* this chunk was the last pass */
  int done;      /* the move has ended */
} kl_copy_t;

/* Copies one old id to every topic: numbers 1..topics, as they are given
 * (consecutively, never reused). */
static int migrate_v1(kl__lmdb_t *lmdb, MDB_txn *mtxn, const MDB_val *key,
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

/* The last chunk of format 1's move: "ids" goes, and its sweep position. */
static int migrate_finish(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_dbi old) {
  MDB_val ck = {sizeof(KL_SWEEP_CURSOR) - 1, KL_SWEEP_CURSOR};
  int rc = mdb_drop(mtxn, old, 1);
  if (rc == 0)
    rc = mdb_del(mtxn, lmdb->meta, &ck, NULL);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Whether database @p name still holds ids to move: 0 with *@p dbi open,
 * MDB_NOTFOUND when it is gone or is the tombstone, or an rc. The main
 * database is asked first: a handle this process opened earlier would
 * outlive another process's drop of it. */
static int old_open(MDB_txn *mtxn, const char *name, MDB_dbi *dbi) {
  MDB_dbi main;
  MDB_val key = {strlen(name), (void *)name}, val;
  unsigned flags = 0;
  int rc = mdb_dbi_open(mtxn, NULL, 0, &main);
  if (rc || (rc = mdb_get(mtxn, main, &key, &val)) ||
      (rc = mdb_dbi_open(mtxn, name, 0, dbi)) ||
      (rc = mdb_dbi_flags(mtxn, *dbi, &flags)))
    return rc == MDB_INCOMPATIBLE ? MDB_NOTFOUND : rc;
  return flags & MDB_DUPSORT ? MDB_NOTFOUND : 0;
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
  int rc = old_open(mtxn, KL__LMDB_IDS_V1_DB, &old);
  if (rc == MDB_NOTFOUND) {
    m->done = 1;
    return 0;
  }
  if (rc || (rc = mdb_stat(mtxn, lmdb->topics, &st)) ||
      (rc = mdb_cursor_open(mtxn, old, &cur)))
    return rc;
  m->topics = st.ms_entries;
  while (m->moved < KL_MIGRATE_CHUNK &&
         (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST)) == 0) {
    if ((rc = migrate_v1(lmdb, mtxn, &key, &val, m->topics)) ||
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

/* Moves format 1's ids until "ids" is gone; m->moved then says how many
 * this process moved. */
static kl_err_t migrate_v1_all(kl__lmdb_t *lmdb, kl_migrate_t *m) {
  size_t total = 0;
  *m = (kl_migrate_t){0, 0, 0};
  while (!m->done) {
    kl_err_t err =
        kl__lmdb_write(lmdb, "migrate format 1 to 2", migrate_chunk, m);
    if (err)
      return err;
    total += m->moved;
  }
  m->moved = total;
  return KL_OK;
}

/* ---- formats 2 to 5: "topic_ids" copied into KL__LMDB_IDS_DB ----------- */

#define KL_V6_POS "ids_v6.pos"    /* the last key copied; empty: all were */
#define KL_V6_DONE "ids_v6.moved" /* there once the move has ended */
/* The tombstone: "topic_ids" again, empty, a database of sorted duplicates.
 * A process of format 5 that still has the store open then fails every
 * read and write of its ids with MDB_INCOMPATIBLE (LMDB checks a named
 * database's flags again in each transaction), and so commits nothing.
 * Dropped alone, its handle would find no database: LMDB's put then went on
 * with an empty cursor and crashed the process (seen in
 * test_format5_writer_during_the_move). */
#define KL_TOMBSTONE_FLAGS (MDB_CREATE | MDB_DUPSORT)

void (*kl__lmdb_migrate_between)(void);

/* Copies one id of "topic_ids" as it is now, a UUID after its entity key
 * put before it; with @p changed only when the copy is missing or holds
 * another value. *@p wrote says whether it wrote. */
static int copy_one(kl__lmdb_t *lmdb, MDB_txn *mtxn, const MDB_val *key,
                    MDB_val *val, int changed, int *wrote) {
  unsigned char buf[KL__IDKEY_MAX];
  MDB_val k = {kl__lmdb_id_upgrade(key, buf), buf}, have;
  if (k.mv_size == 0)
    return MDB_CORRUPTED;
  int rc = changed ? mdb_get(mtxn, lmdb->ids, &k, &have) : MDB_NOTFOUND;
  *wrote = rc != 0 || have.mv_size != val->mv_size ||
           memcmp(have.mv_data, val->mv_data, val->mv_size) != 0;
  if (rc && rc != MDB_NOTFOUND)
    return rc;
  return *wrote ? mdb_put(mtxn, lmdb->ids, &k, val, 0) : 0;
}

static int meta_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *name,
                    const void *data, size_t len) {
  MDB_val k = {strlen(name), (void *)name}, v = {len, (void *)data};
  return mdb_put(mtxn, lmdb->meta, &k, &v, 0);
}

/* The last pass: whatever the older keylane wrote or changed since its
 * copy is written again, then "topic_ids" becomes the tombstone and the
 * move has ended, in one transaction. Ids it swept after their copy stay
 * in the copy until this release's sweep takes them. */
static int copy_last(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_dbi old,
                     MDB_cursor *cur, kl_copy_t *c) {
  MDB_val key, val, pk = {sizeof(KL_V6_POS) - 1, KL_V6_POS};
  int rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST), wrote;
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    if ((rc = copy_one(lmdb, mtxn, &key, &val, 1, &wrote)))
      break;
    c->caught += (size_t)wrote;
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND || (rc = mdb_drop(mtxn, old, 1)) ||
      (rc = mdb_dbi_open(mtxn, KL__LMDB_IDS_V5_DB, KL_TOMBSTONE_FLAGS, &old)) ||
      (rc = mdb_del(mtxn, lmdb->meta, &pk, NULL)) ||
      (rc = meta_put(lmdb, mtxn, KL_V6_DONE, "", 0)))
    return rc;
  c->last = c->done = 1;
  return 0;
}

static int copy_chunk(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                      kl_err_t *stop) {
  kl_copy_t *c = opaque;
  MDB_val key = {sizeof(KL_V6_DONE) - 1, KL_V6_DONE}, val;
  MDB_dbi old;
  MDB_stat st;
  MDB_cursor *cur;
  unsigned char at[KL__IDKEY_MAX];
  size_t at_len = 0;
  (void)stop;
  c->copied = c->caught = 0; /* run again from the start after a map growth */
  int rc = mdb_get(mtxn, lmdb->meta, &key, &val);
  if (rc != MDB_NOTFOUND) { /* ended, by this process or another */
    c->done = rc == 0;
    return rc;
  }
  if ((rc = old_open(mtxn, KL__LMDB_IDS_V5_DB, &old)) == MDB_NOTFOUND) {
    c->done = 1; /* a store begun at format 6 */
    return 0;
  }
  key = (MDB_val){sizeof(KL_V6_POS) - 1, KL_V6_POS};
  if (rc || (rc = mdb_stat(mtxn, old, &st)) ||
      ((rc = mdb_get(mtxn, lmdb->meta, &key, &val)) && rc != MDB_NOTFOUND))
    return rc;
  c->old = st.ms_entries;
  int begun = rc == 0;
  if (begun && val.mv_size > sizeof(at))
    return MDB_CORRUPTED;
  if (begun)
    memcpy(at, val.mv_data, at_len = val.mv_size);
  if ((rc = mdb_cursor_open(mtxn, old, &cur)))
    return rc;
  if (begun && at_len == 0)
    return copy_last(lmdb, mtxn, old, cur, c);
  key = (MDB_val){at_len, at};
  rc = mdb_cursor_get(cur, &key, &val, begun ? MDB_SET_RANGE : MDB_FIRST);
  if (rc == 0 && begun && key.mv_size == at_len &&
      memcmp(key.mv_data, at, at_len) == 0) /* copied by the last chunk */
    rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
  for (int wrote; rc == 0 && c->copied < KL_MIGRATE_CHUNK;
       rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    if (key.mv_size > sizeof(at))
      rc = MDB_CORRUPTED;
    if (rc || (rc = copy_one(lmdb, mtxn, &key, &val, 0, &wrote)))
      break;
    memcpy(at, key.mv_data, at_len = key.mv_size);
    c->copied++;
  }
  mdb_cursor_close(cur);
  if (rc && rc != MDB_NOTFOUND)
    return rc;
  return meta_put(lmdb, mtxn, KL_V6_POS, at, rc == MDB_NOTFOUND ? 0 : at_len);
}

/* Copies formats 2 to 5's ids until the move has ended. */
static kl_err_t copy_all(kl__lmdb_t *lmdb) {
  kl_copy_t c = {0, 0, 0, 0, 0};
  size_t total = 0;
  int64_t t0 = kl__mono_ns();
  while (!c.done) {
    if (total && kl__lmdb_migrate_between)
      kl__lmdb_migrate_between();
    kl_err_t err =
        kl__lmdb_write(lmdb, "migrate format 5 to 6", copy_chunk, &c);
    if (err)
      return err;
    /* A large store takes seconds: say so after the first chunk and every
     * KL_MIGRATE_SAY ids. */
    if (c.copied && (total == 0 || (total + c.copied) / KL_MIGRATE_SAY !=
                                       total / KL_MIGRATE_SAY))
      KL_LOG_I(KL_COMP,
               "store %s: format 5 -> %u: %zu idempotency keys of about %zu "
               "copied",
               lmdb->dir, KL__LMDB_FORMAT, total + c.copied, c.old);
    total += c.copied;
  }
  if (c.last)
    KL_LOG_I(KL_COMP,
             "store %s: format 5 -> %u: the ids are in \"%s\", UUIDs before "
             "their entity key (%zu copied by this process, %zu written "
             "again by the last pass), in %" PRId64 " ms",
             lmdb->dir, KL__LMDB_FORMAT, KL__LMDB_IDS_DB, total, c.caught,
             (kl__mono_ns() - t0) / 1000000);
  return KL_OK;
}

kl_err_t kl__lmdb_migrate_ids(kl__lmdb_t *lmdb) {
  kl_migrate_t m;
  kl_err_t err = migrate_v1_all(lmdb, &m);
  if (err)
    return err;
  if (m.moved && m.topics)
    KL_LOG_I(KL_COMP,
             "store %s: format 1 -> %u: this process scoped %zu "
             "idempotency keys to each of the store's %zu topics",
             lmdb->dir, KL__LMDB_FORMAT, m.moved, m.topics);
  else if (m.moved)
    KL_LOG_W(KL_COMP,
             "store %s: format 1 -> %u: dropped %zu idempotency "
             "keys: the store knew no topic they could belong to",
             lmdb->dir, KL__LMDB_FORMAT, m.moved);
  return copy_all(lmdb);
}
