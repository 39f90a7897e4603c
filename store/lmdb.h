/*
 * The LMDB store's internals, shared by lmdb.c (the environment, its
 * map size, partitions, scans), lmdb_sweep.c (expiry) and lmdb_txn.c
 * (batches).
 *
 * Layout (format 6): one environment directory per host, shared by every
 * worker process, with six named databases:
 *   meta       "format" -> uint32 format version; per topic number N,
 *              "sweep.cursor.N" -> an ids key and "sweep.retention.N" ->
 *              2 x int64 (lmdb_sweep.c)
 *   parts      topic NUL partition(uint32 big-endian) -> 5 x uint64 (epoch,
 *              watermark, applied, duplicates, dead_letters), host order
 *   beats      the parts key -> uint64 beats, host order: kl__store_beat()'s
 *              counter, apart so that the parts records read the same to
 *              every build (it is added, not changed: no format step)
 *   topics     topic -> uint32 topic number (big-endian), given on the
 *              topic's first acquire, never reused
 *   ids_v6     topic number (4 bytes, big-endian) + encoded idempotency key,
 *              scoped by entity key since format 3 (lmdb_ids.c)
 *              -> 6 bytes: insert ms << 2 | mark; "topic_ids" before
 *              format 6
 *   data       the handlers' keys and values, as given
 *   outbox     follow-up events committed and not yet published
 *              (lmdb_outbox.c); added, not changed: no format step
 *   lasts      the parts key -> the watermark and the ident of the record
 *              at watermark - 1 (kl__store_last()); added likewise
 *   owners     topic -> Kafka cluster id NUL consumer group: the topic's
 *              owner (kl__store_owner_t, lmdb_owner.c), since format 5
 * ids and data are separate so that expiry walks only idempotency keys and
 * a prefix scan walks only handler state. A number rather than the topic's
 * name scopes an id: 4 bytes per key, whatever the name's length.
 *
 * Format 1 kept ids unscoped, in "ids" (the encoded key alone). Opening
 * such a store migrates it in place (lmdb_migrate.c): each old id is
 * copied to every topic the store knew, so it still suppresses its event
 * whichever topic that was. Formats 2 to 5 kept them in "topic_ids", a
 * UUID after its entity key; opening one moves them to "ids_v6", the UUID
 * first (lmdb_migrate.c).
 */
#ifndef KEYLANE_STORE_LMDB_H
#define KEYLANE_STORE_LMDB_H

#include <lmdb.h>
#include <pthread.h>
#include <sys/types.h>

#include "store/backend.h"

/* Idempotency keys (lmdb_ids.c): the topic's number (4 bytes), a
 * tag byte and the id, scoped by entity key or not; KL__IDKEY_MAX bounds
 * the key a batch buffers, of which LMDB's keys are made. */
#define KL__TOPIC_NO_LEN 4
#define KL__IDKEY_MAX (KL__TOPIC_NO_LEN + 1 + KL__SID_MAX)

typedef struct kl__lmdb {
  kl_store_t base;
  MDB_env *env;
  MDB_dbi meta, parts, beats, topics, ids, data; /* ids: "ids_v6" */
  MDB_dbi outbox;                                /* lmdb_outbox.c */
  MDB_dbi owners; /* "owners": topic -> cluster id NUL group (lmdb_owner.c) */
  MDB_dbi lasts;  /* "lasts": the parts key -> int64 watermark (host order)
                     + the ident of the record at watermark - 1
                     (kl__txn_set_last()); added, not changed: no format
                     step, and a build without it leaves it stale, which its
                     watermark tells */
  char *dir;
  int durable;          /* store.durability=full: every commit is fsynced */
  size_t map_max;       /* store.map.max, rounded to pages */
  int64_t retention_ms; /* store.dedup.retention */
  int create;           /* store.create: make a missing store */
  int not_store;        /* data.mdb is not LMDB, or not keylane's */
  dev_t dev;            /* the directory, for the one-open-per-process */
  ino_t ino;            /*   registry */
  int registered;
  /* The remap gate: LMDB may only change the map size while this process
   * has no transaction open, because unmapping would pull the pages out
   * from under every snapshot. Each txn counts itself in `active`; a remap
   * sets `resizing`, which holds back new txns, and waits for active == 0.
   * Guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t active;
  int resizing;
  size_t map_size; /* this process's current map size */
  /* Where this process's last sweep stopped (lmdb_sweep.c), and in
   * which topic's keys (their number): a sweep that removes nothing
   * leaves meta's cursor alone. Guarded by mu. */
  unsigned char sweep_at[KL__IDKEY_MAX];
  size_t sweep_at_len;
  unsigned char sweep_at_topic[KL__TOPIC_NO_LEN];
  int sweep_at_set;
} kl__lmdb_t;

/* A write fn returns 0 to commit, an LMDB or errno code to abort and fail,
 * or KL__LMDB_STOP to abort and fail with the kl_err_t it put in *stop
 * (with its detail set). errno codes are positive and LMDB's below -30000. */
#define KL__LMDB_STOP (-1)
typedef int(kl__lmdb_write_fn)(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *ctx,
                               kl_err_t *stop);

/** Maps an LMDB or errno code: "lmdb: <what>: <mdb_strerror>[: the fix]". */
kl_err_t kl__lmdb_err(int rc, const char *what);

/**
 * The error of a failed write transaction: kl__lmdb_err(), except that an
 * EIO while fewer than 1 MiB are left to this user (@p avail bytes) on the
 * file system of store @p dir is KL_ESTORE_FULL, named as a full disk.
 * LMDB reports a write that the full file system cut short as EIO, not
 * ENOSPC (mdb_page_flush: "short write, filesystem full?"), and a disk
 * that fills up usually meets a write larger than what is left.
 */
kl_err_t kl__lmdb_write_err(int rc, const char *what, const char *dir,
                            uint64_t avail);

/**
 * Opens a read snapshot, counted in the remap gate, adopting a map that
 * another process grew. End it with kl__lmdb_read_end(), on any thread.
 */
kl_err_t kl__lmdb_read_begin(kl__lmdb_t *lmdb, MDB_txn **snap);
void kl__lmdb_read_end(kl__lmdb_t *lmdb, MDB_txn *snap);

/**
 * Runs @p fn in one write transaction and commits it. When the map is full
 * it grows the map (doubling up to store.map.max) and runs @p fn again in a
 * new transaction, so @p fn must apply everything it applies each time.
 * Blocks while another process or thread holds the writer lock.
 */
kl_err_t kl__lmdb_write(kl__lmdb_t *lmdb, const char *what,
                        kl__lmdb_write_fn *fn, void *ctx);

/** Reads a partition's state in @p mtxn (zeroes when unknown): an LMDB rc. */
int kl__lmdb_part_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, kl_partition_state_t *state);
int kl__lmdb_part_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, const kl_partition_state_t *state);

/* The key a batch buffers the mark of @p sid under (lmdb_ids.c). */
/* The key of format 6 for a key @p key of KL__LMDB_IDS_V5_DB in @p out:
 * a tag-3 key (entity key, then UUID) becomes tag 5 (UUID, then entity
 * key), any other is copied. @returns its length, or 0 for a key that is
 * no id's. */
size_t kl__lmdb_id_upgrade(const MDB_val *key,
                           unsigned char out[KL__IDKEY_MAX]);
size_t kl__lmdb_id_encode(uint32_t topic_no, const char *sid, size_t sid_len,
                          unsigned char out[KL__IDKEY_MAX]);
#define KL__IDVAL_LEN 6
void kl__lmdb_idval_encode(int64_t now_ms, kl_mark_t mark,
                           unsigned char out[KL__IDVAL_LEN]);
/* @returns 0, or -1 for a value shorter than 6 bytes. */
int kl__lmdb_idval_decode(const MDB_val *val, int64_t *time_ms,
                          kl_mark_t *mark);
/* The topic's number and the sid of an ids record: an LMDB rc. */
int kl__lmdb_id_decode(const MDB_val *key, const MDB_val *val,
                       uint32_t *topic_no, char out[KL__SID_MAX], size_t *len);
/* Reads the record of a buffered key @p lkey: 0, MDB_NOTFOUND or an rc.
 * @p cur, a cursor of the ids in @p mtxn kept from one read to the next,
 * or NULL (kl__lmdb_id_put() says why). */
int kl__lmdb_id_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                    const unsigned char *lkey, size_t len, int64_t *time_ms,
                    kl_mark_t *mark);
/* Writes the record of @p lkey as @p mark at @p now_ms, unless it would put
 * a dead-letter mark over an applied one; *@p written says whether it
 * wrote a mark the id did not have (the same mark again is rewritten, and
 * not counted). @p cur is a cursor of the ids in @p mtxn, kept from one
 * put to the next: LMDB searches from the page a cursor is on when the
 * key falls there, from the root otherwise, and a commit puts its ids in
 * key order (lmdb_txn.c).
 * An LMDB rc. */
int kl__lmdb_id_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                    const unsigned char *lkey, size_t len, int64_t now_ms,
                    kl_mark_t mark, int *written);

/**
 * The number of @p topic in @p mtxn: given a new one when @p create (a
 * write txn) and the topic has none.
 * @returns 0, MDB_NOTFOUND (none and not @p create), or an LMDB rc.
 */
int kl__lmdb_topic_no(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int create, uint32_t *topic_no);

/**
 * Moves the ids of an older format into KL__LMDB_IDS_DB (see the layout
 * above): a format-1 store's unscoped ids, then formats 2 to 5's
 * "topic_ids"; called by the open, once the databases are open and the
 * format record says 6. Several processes may run it at once.
 */
kl_err_t kl__lmdb_migrate_ids(kl__lmdb_t *lmdb);
/* Test only: called between two chunks of formats 2 to 5's copy, outside
 * any transaction, so that a test can act as an older keylane mid-move. */
extern void (*kl__lmdb_migrate_between)(void);

/* The sweep of one topic's expired ids and the retentions the sweeps
 * recorded (lmdb_sweep.c): the ops sweep and sweeps. */
kl_err_t kl__lmdb_sweep(kl_store_t *store, const char *topic, size_t max,
                        size_t *removed);
kl_err_t kl__lmdb_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                         void *opaque);

/* The txn operations of lmdb_txn.c and the outbox's list and
 * remove of lmdb_outbox.c, for the ops table. */
KL__STORE_BACKEND_DECLARE(lmdb);

/* Keeps @p ident as the record at @p watermark - 1 of @p partition, in a
 * commit's write transaction ("lasts"): an LMDB rc. */
int kl__lmdb_last_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, int64_t watermark, const void *ident,
                      size_t len);

/* The outbox of lmdb_outbox.c: writes @p emits under the next seqs
 * in a commit's write transaction (an LMDB rc). */
int kl__lmdb_outbox_write(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                          int32_t partition, const kl__emits_t *emits);

/* Each topic's owner (lmdb_owner.c): read and written in @p mtxn (an
 * LMDB code; MDB_NOTFOUND: none recorded), and the ops owner_get and
 * owner_set. */
int kl__lmdb_owner_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                       kl__store_owner_t *owner);
int kl__lmdb_owner_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                       const kl__store_owner_t *owner);
kl_err_t kl__lmdb_owner(kl_store_t *store, const char *topic,
                        kl__store_owner_t *owner);
kl_err_t kl__lmdb_bind(kl_store_t *store, const char *topic,
                       const kl__store_owner_t *owner);

#endif
