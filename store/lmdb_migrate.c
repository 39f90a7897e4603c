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
 * The open writes format 6 first, so an older keylane refuses the store
 * from then on; then the ids move in chunks of one write transaction each,
 * so that a large store neither needs one huge transaction nor holds the
 * writer lock for long. Every opener runs the chunks until the old
 * database is gone before it returns the store, so no caller ever sees an
 * id that has not moved yet; a crash in between leaves a consistent store
 * whose next open goes on. An older keylane that opened the store before
 * and still runs writes into the old database, whose ids this open moves
 * too, until it is dropped: from then on its writes fail (its handle finds
 * no database), so it can apply nothing a lookup here would not see.
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
#define KL_MIGRATE_SAY 500000          /* a progress line per this many moved */
#define KL_SWEEP_CURSOR "sweep.cursor" /* holds a format-1 key: dropped */

typedef struct kl_migrate {
  const char *from; /* the old database: KL__LMDB_IDS_V1_DB or _V5_DB */
  size_t moved;     /* old ids moved by this chunk */
  size_t topics;    /* format 1's: each copied to this many topics */
  size_t left;      /* old ids still there after this chunk */
  int done;         /* the old database is gone */
} kl_migrate_t;

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

/* Moves a format-2-to-5 id: a UUID after its entity key goes before it.
 * An id already in the new database (none should be: an opener moves all
 * before it writes) keeps the mark that wins (kl__mark_merge()). */
static int migrate_v5(kl__lmdb_t *lmdb, MDB_txn *mtxn, const MDB_val *key,
                      MDB_val *val) {
  unsigned char buf[KL__IDKEY_MAX];
  MDB_val k = {kl__lmdb_id_upgrade(key, buf), buf}, have = *val;
  int64_t t;
  kl_mark_t old, mark;
  if (k.mv_size == 0 || kl__lmdb_idval_decode(val, &t, &mark))
    return MDB_CORRUPTED;
  int rc = mdb_put(mtxn, lmdb->ids, &k, &have, MDB_NOOVERWRITE);
  if (rc != MDB_KEYEXIST)
    return rc;
  if (kl__lmdb_idval_decode(&have, &t, &old))
    return MDB_CORRUPTED;
  return kl__mark_merge(old, mark) == old
             ? 0
             : mdb_put(mtxn, lmdb->ids, &k, val, 0);
}

/* The last chunk: the old database goes, and format 1's sweep position.
 * "topic_ids" comes back at once, empty, as a database of sorted
 * duplicates (KL_TOMBSTONE_FLAGS): a process of format 5 that still has
 * the store open then fails every read and write of its ids with
 * MDB_INCOMPATIBLE (LMDB checks the flags of a named database again in
 * each transaction), and so commits nothing. Dropped alone, its handle
 * would find no database: LMDB's put then went on with an empty cursor
 * and crashed the process (seen in test_format5_writer_fails_after_the_move).
 */
#define KL_TOMBSTONE_FLAGS (MDB_CREATE | MDB_DUPSORT)

static int migrate_finish(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *from,
                          MDB_dbi old) {
  MDB_val ck = {sizeof(KL_SWEEP_CURSOR) - 1, KL_SWEEP_CURSOR};
  int rc = mdb_drop(mtxn, old, 1);
  if (rc == 0 && strcmp(from, KL__LMDB_IDS_V1_DB) == 0) {
    rc = mdb_del(mtxn, lmdb->meta, &ck, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
  }
  return rc ? rc : mdb_dbi_open(mtxn, from, KL_TOMBSTONE_FLAGS, &old);
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
  int v1 = strcmp(m->from, KL__LMDB_IDS_V1_DB) == 0;
  MDB_dbi old;
  MDB_stat st;
  MDB_cursor *cur;
  MDB_val key, val;
  (void)stop;
  m->moved = 0; /* run again from the start after a map growth */
  int rc = old_open(mtxn, m->from, &old);
  if (rc == MDB_NOTFOUND) {
    m->done = 1;
    return 0;
  }
  MDB_stat ost;
  if (rc || (rc = mdb_stat(mtxn, old, &ost)) ||
      (rc = mdb_stat(mtxn, lmdb->topics, &st)) ||
      (rc = mdb_cursor_open(mtxn, old, &cur)))
    return rc;
  m->topics = st.ms_entries;
  while (m->moved < KL_MIGRATE_CHUNK &&
         (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST)) == 0) {
    if ((rc = v1 ? migrate_v1(lmdb, mtxn, &key, &val, m->topics)
                 : migrate_v5(lmdb, mtxn, &key, &val)) ||
        (rc = mdb_cursor_del(cur, 0)))
      break;
    m->moved++;
  }
  mdb_cursor_close(cur);
  if (rc != MDB_NOTFOUND && rc != 0)
    return rc;
  m->left = ost.ms_entries - m->moved;
  m->done = rc == MDB_NOTFOUND;
  return m->done ? migrate_finish(lmdb, mtxn, m->from, old) : 0;
}

/* Moves the ids of database @p from until it is gone; m->moved then says
 * how many this process moved. */
static kl_err_t migrate_from(kl__lmdb_t *lmdb, const char *from,
                             const char *what, kl_migrate_t *m) {
  size_t total = 0;
  *m = (kl_migrate_t){from, 0, 0, 0, 0};
  while (!m->done) {
    kl_err_t err = kl__lmdb_write(lmdb, what, migrate_chunk, m);
    if (err)
      return err;
    /* A large store takes seconds: say so at the start and every
     * KL_MIGRATE_SAY ids. */
    if (m->left && (total == 0 || (total + m->moved) / KL_MIGRATE_SAY !=
                                      total / KL_MIGRATE_SAY))
      KL_LOG_I(KL_COMP, "store %s: %s: %zu idempotency keys moved, %zu to go",
               lmdb->dir, what, total + m->moved, m->left);
    total += m->moved;
  }
  m->moved = total;
  return KL_OK;
}

kl_err_t kl__lmdb_migrate_ids(kl__lmdb_t *lmdb) {
  kl_migrate_t m;
  kl_err_t err =
      migrate_from(lmdb, KL__LMDB_IDS_V1_DB, "migrate format 1 to 2", &m);
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
  err = migrate_from(lmdb, KL__LMDB_IDS_V5_DB, "migrate format 5 to 6", &m);
  if (!err && m.moved)
    KL_LOG_I(KL_COMP,
             "store %s: format %u: this process moved %zu idempotency "
             "keys to \"%s\", UUIDs before their entity key",
             lmdb->dir, KL__LMDB_FORMAT, m.moved, KL__LMDB_IDS_DB);
  return err;
}
