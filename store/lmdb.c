/*
 * The LMDB store: one environment directory shared by every worker process
 * on a host (LMDB's own multi-process locking), opened with MDB_NOTLS so a
 * batch's read snapshot may be ended on any thread.
 *
 * Write transactions are kept to the commit itself. LMDB has ONE writer
 * lock per environment, shared by every process on the host: a process
 * paused (SIGSTOP, a debugger, a stalled VM) inside a write transaction
 * stalls every writer on the host until it resumes. So handlers run against
 * a read snapshot plus an in-memory buffer, and the write transaction only
 * checks the epoch and applies what the batch buffered.
 *
 * Durability (store.durability), with what each mode can lose. A process
 * crash loses nothing committed in any mode: the pages are in the OS cache.
 *   full  fsync of data and meta on every commit: an OS crash or power
 *         loss loses nothing committed.
 *   meta  MDB_NOMETASYNC: data is fsynced, the meta page is not, so an OS
 *         crash may undo the LAST commit (the store stays consistent).
 *   none  MDB_NOSYNC: nothing is fsynced, so an OS crash may undo recent
 *         commits, and on a file system that reorders writes may corrupt
 *         the store.
 * An undone commit undoes its handler writes, idempotency keys and
 * watermark together, so the events are re-applied once from Kafka; only
 * effects on outside systems are repeated. kl_store_acquire() always
 * fsyncs, whatever the mode: an epoch handed out must never be handed out
 * again, or two owners would hold the same fencing token.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/log.h"
#include "store/store_internal.h"
#include "store/lmdb.h"

#define KL_COMP "store"
/* Read slots for the host: one per open batch or scan of every process. */
#define KL_LMDB_READERS 1022
/* How long a remap waits for this process's open transactions to end
 * before giving up with KL_ESTORE_BUSY (the caller retries the batch). */
#define KL_LMDB_REMAP_WAIT_MS 2000
/* Bound on grow-and-retry rounds of one write; 1M doubling to 64G is 16. */
#define KL_LMDB_TRIES 64
/* A write's EIO with less free space than this is a full file system. */
#define KL_LMDB_FULL_BYTES (1u << 20)
/* What a full file system under the store tells the user. */
#define KL_LMDB_FULL_FIX                                                       \
  ": the file system holding the store is full; free space there"

/* ---- errors ---------------------------------------------------------- */

static kl_err_t lmdb_code(int rc, const char **fix) {
  *fix = "";
  switch (rc) {
  case EACCES:
  case EROFS:
  case EPERM:
    *fix = ": the store directory and its files must be writable by this "
           "user (LMDB writes its lock file even to read)";
    return KL_ESTORE_READONLY;
  case ENOSPC:
#ifdef EDQUOT
  case EDQUOT:
#endif
    *fix = KL_LMDB_FULL_FIX;
    return KL_ESTORE_FULL;
  case MDB_TXN_FULL:
    *fix = ": the batch is too large for one transaction; lower "
           "worker.batch.max";
    return KL_ESTORE_FULL;
  case ENOMEM:
    return KL_ENOMEM;
  case EIO:
    return KL_EIO;
  case EAGAIN:
  case EBUSY:
    return KL_ESTORE_BUSY;
  case MDB_READERS_FULL:
    *fix = ": every read slot of this host's store is taken by open batches "
           "and scans; end some (slots of crashed processes are freed at the "
           "next sweep or open)";
    return KL_ESTORE_BUSY;
  case MDB_VERSION_MISMATCH:
    *fix = ": the store was created by an incompatible LMDB library";
    return KL_ESTORE_VERSION;
  case MDB_INVALID:
    *fix = ": this is not an LMDB store; point the store at another directory";
    return KL_ESTORE;
  case MDB_PANIC:
    *fix = ": the environment failed fatally; close and reopen the store";
    return KL_ESTORE;
  default:
    return KL_ESTORE;
  }
}

kl_err_t kl__lmdb_err(int rc, const char *what) {
  const char *fix;
  kl_err_t code = lmdb_code(rc, &fix);
  return kl__err(code, "lmdb: %s: %s%s", what, mdb_strerror(rc), fix);
}

kl_err_t kl__lmdb_write_err(int rc, const char *what, const char *dir,
                            uint64_t avail) {
  if (rc != EIO || avail >= KL_LMDB_FULL_BYTES)
    return kl__lmdb_err(rc, what);
  return kl__err(KL_ESTORE_FULL,
                 "lmdb: %s: %s (a write cut short, %" PRIu64 " bytes left "
                 "under store %s)" KL_LMDB_FULL_FIX,
                 what, mdb_strerror(rc), avail, dir);
}

/* The error of a failed write transaction, with the space left to this
 * user on the store's file system when LMDB reports EIO. */
static kl_err_t lmdb_write_failed(kl__lmdb_t *lmdb, int rc, const char *what) {
  struct statvfs vfs;
  uint64_t avail = UINT64_MAX;
  if (rc == EIO && statvfs(lmdb->dir, &vfs) == 0)
    avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  return kl__lmdb_write_err(rc, what, lmdb->dir, avail);
}

/* ---- the remap gate -------------------------------------------------- */

/* Counts a transaction of this process in; returns the map size it runs
 * with, which a failed transaction hands to lmdb_remap(). */
static size_t gate_enter(kl__lmdb_t *lmdb) {
  pthread_mutex_lock(&lmdb->mu);
  while (lmdb->resizing)
    pthread_cond_wait(&lmdb->cv, &lmdb->mu);
  lmdb->active++;
  size_t map_size = lmdb->map_size;
  pthread_mutex_unlock(&lmdb->mu);
  return map_size;
}

static void gate_leave(kl__lmdb_t *lmdb) {
  pthread_mutex_lock(&lmdb->mu);
  if (--lmdb->active == 0 && lmdb->resizing)
    pthread_cond_broadcast(&lmdb->cv);
  pthread_mutex_unlock(&lmdb->mu);
}

/* Waits, with mu held, until no transaction of this process is open. */
static int gate_drain(kl__lmdb_t *lmdb) {
  int64_t deadline_ns = kl__mono_ns() + KL_LMDB_REMAP_WAIT_MS * 1000000LL;
  while (lmdb->active > 0)
    if (kl__mono_cond_wait(&lmdb->cv, &lmdb->mu, deadline_ns) == ETIMEDOUT)
      return lmdb->active > 0 ? -1 : 0;
  return 0;
}

static size_t lmdb_current_map(kl__lmdb_t *lmdb) {
  MDB_envinfo info;
  mdb_env_info(lmdb->env, &info);
  return info.me_mapsize;
}

/* With the gate drained: adopts the size another process recorded, and
 * when @p grow and that is no larger than @p seen, doubles it up to
 * store.map.max. */
static kl_err_t lmdb_resize(kl__lmdb_t *lmdb, size_t seen, int grow) {
  int rc = mdb_env_set_mapsize(lmdb->env, 0);
  if (rc)
    return kl__lmdb_err(rc, "adopt the map size");
  size_t now = lmdb_current_map(lmdb);
  if (now > seen || !grow)
    return KL_OK;
  if (seen >= lmdb->map_max)
    return kl__err(KL_ESTORE_FULL,
                   "lmdb: store %s is full at its map size of %zu bytes "
                   "(store.map.max=%zu): raise store.map.max, or lower "
                   "store.dedup.retention so that sweeps free room",
                   lmdb->dir, seen, lmdb->map_max);
  size_t want = seen > lmdb->map_max / 2 ? lmdb->map_max : seen * 2;
  rc = mdb_env_set_mapsize(lmdb->env, want);
  if (rc)
    return kl__lmdb_err(rc, "grow the map");
  KL_LOG_I(KL_COMP, "store %s: map grown from %zu to %zu bytes", lmdb->dir,
           seen, want);
  return KL_OK;
}

/*
 * Changes the map size after a transaction that ran with @p seen failed
 * with MDB_MAP_FULL (@p grow) or MDB_MAP_RESIZED. The caller holds no
 * transaction. If another thread already changed the size, there is
 * nothing to do but retry. The wait for open snapshots is bounded: a
 * thread holding a snapshot while it waits here (or a paused handler)
 * would otherwise deadlock the process.
 */
static kl_err_t lmdb_remap(kl__lmdb_t *lmdb, size_t seen, int grow) {
  pthread_mutex_lock(&lmdb->mu);
  while (lmdb->resizing)
    pthread_cond_wait(&lmdb->cv, &lmdb->mu);
  kl_err_t err = KL_OK;
  if (lmdb->map_size == seen) {
    lmdb->resizing = 1;
    if (gate_drain(lmdb) != 0)
      err = kl__err(KL_ESTORE_BUSY,
                    "lmdb: store %s must grow its map beyond %zu bytes, but "
                    "%zu transactions of this process stayed open for %d ms "
                    "(a batch held across a pause?); retry",
                    lmdb->dir, seen, lmdb->active, KL_LMDB_REMAP_WAIT_MS);
    else
      err = lmdb_resize(lmdb, seen, grow);
    lmdb->map_size = lmdb_current_map(lmdb);
    lmdb->resizing = 0;
    pthread_cond_broadcast(&lmdb->cv);
  }
  pthread_mutex_unlock(&lmdb->mu);
  return err;
}

/* ---- transactions ---------------------------------------------------- */

kl_err_t kl__lmdb_read_begin(kl__lmdb_t *lmdb, MDB_txn **snap) {
  for (int tries = 0;; tries++) {
    size_t seen = gate_enter(lmdb);
    int rc = mdb_txn_begin(lmdb->env, NULL, MDB_RDONLY, snap);
    if (rc == 0)
      return KL_OK;
    gate_leave(lmdb);
    if (rc != MDB_MAP_RESIZED || tries >= KL_LMDB_TRIES)
      return kl__lmdb_err(rc, "begin a read snapshot");
    kl_err_t err = lmdb_remap(lmdb, seen, 0);
    if (err)
      return err;
  }
}

void kl__lmdb_read_end(kl__lmdb_t *lmdb, MDB_txn *snap) {
  if (!snap)
    return;
  mdb_txn_abort(snap);
  gate_leave(lmdb);
}

/* One attempt: begin, run fn, commit or abort. */
static int lmdb_write_once(kl__lmdb_t *lmdb, kl__lmdb_write_fn *fn, void *ctx,
                           kl_err_t *stop) {
  MDB_txn *mtxn;
  int rc = mdb_txn_begin(lmdb->env, NULL, 0, &mtxn);
  if (rc)
    return rc;
  rc = fn(lmdb, mtxn, ctx, stop);
  if (rc)
    mdb_txn_abort(mtxn);
  else
    rc = mdb_txn_commit(mtxn); /* frees mtxn, also when it fails */
  return rc;
}

kl_err_t kl__lmdb_write(kl__lmdb_t *lmdb, const char *what,
                        kl__lmdb_write_fn *fn, void *ctx) {
  for (int tries = 0;; tries++) {
    kl_err_t stop = KL_OK;
    size_t seen = gate_enter(lmdb);
    int rc = lmdb_write_once(lmdb, fn, ctx, &stop);
    gate_leave(lmdb);
    if (rc == 0)
      return KL_OK;
    if (rc == KL__LMDB_STOP)
      return stop;
    int remap = rc == MDB_MAP_FULL || rc == MDB_MAP_RESIZED;
    if (!remap || tries >= KL_LMDB_TRIES)
      return lmdb_write_failed(lmdb, rc, what);
    kl_err_t err = lmdb_remap(lmdb, seen, rc == MDB_MAP_FULL);
    if (err)
      return err;
  }
}

/* ---- partitions ------------------------------------------------------ */

#define KL_PART_KEY_MAX (249 + 1 + 4)
#define KL_PART_VAL_LEN (5 * 8)

static MDB_val part_key(unsigned char buf[KL_PART_KEY_MAX], const char *topic,
                        int32_t partition) {
  size_t len = strlen(topic); /* <= 249: checked by store.c */
  memcpy(buf, topic, len + 1);
  /* Big-endian, so that the partitions of a topic sort by number. */
  kl__put_be32(buf + len + 1, (uint32_t)partition);
  return (MDB_val){len + 5, buf};
}

static int part_decode(const MDB_val *val, kl_partition_state_t *state) {
  uint64_t v[5];
  if (val->mv_size != KL_PART_VAL_LEN)
    return MDB_CORRUPTED;
  memcpy(v, val->mv_data, sizeof(v));
  state->epoch = v[0];
  state->watermark = (int64_t)v[1];
  state->applied = v[2];
  state->duplicates = v[3];
  state->dead_letters = v[4];
  state->beats = 0; /* kept apart: beats_get() */
  return 0;
}

int kl__lmdb_part_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, kl_partition_state_t *state) {
  unsigned char buf[KL_PART_KEY_MAX];
  MDB_val key = part_key(buf, topic, partition), val;
  memset(state, 0, sizeof(*state));
  int rc = mdb_get(mtxn, lmdb->parts, &key, &val);
  if (rc == MDB_NOTFOUND)
    return 0;
  return rc ? rc : part_decode(&val, state);
}

/* Adds the partition's beats (kept apart: see lmdb.h) to @p state. */
static int beats_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, const MDB_val *key,
                     kl_partition_state_t *state) {
  MDB_val val;
  int rc = mdb_get(mtxn, lmdb->beats, (MDB_val *)key, &val);
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc == 0 && val.mv_size != sizeof(state->beats))
    rc = MDB_CORRUPTED;
  if (rc == 0)
    memcpy(&state->beats, val.mv_data, sizeof(state->beats));
  return rc;
}

int kl__lmdb_part_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, const kl_partition_state_t *state) {
  unsigned char buf[KL_PART_KEY_MAX];
  uint64_t v[5] = {state->epoch, (uint64_t)state->watermark, state->applied,
                   state->duplicates, state->dead_letters};
  MDB_val key = part_key(buf, topic, partition);
  MDB_val val = {sizeof(v), v};
  /* Every topic with a partition has a number, which scopes its ids. */
  uint32_t topic_no;
  int rc = kl__lmdb_topic_no(lmdb, mtxn, topic, 1, &topic_no);
  return rc ? rc : mdb_put(mtxn, lmdb->parts, &key, &val, 0);
}

typedef struct kl_acquire_ctx {
  const char *topic;
  int32_t partition;
  uint64_t floor;
  kl_partition_state_t *state;
  int reset; /* kl__store_reset(): watermark 0, and only a known partition */
  const kl__store_owner_t *owner; /* kl__store_acquire_owned(), or NULL */
  kl__store_owner_t *recorded;
  int *refused;
} kl_acquire_ctx_t;

/* The owner check of kl__store_acquire_owned(), in the acquire's write:
 * a topic without an owner gets ctx->owner; one with another is refused
 * (*ctx->refused, nothing written). */
static int owner_check(kl__lmdb_t *lmdb, MDB_txn *mtxn, kl_acquire_ctx_t *ctx) {
  int rc = kl__lmdb_owner_get(lmdb, mtxn, ctx->topic, ctx->recorded);
  if (rc == MDB_NOTFOUND)
    return kl__lmdb_owner_put(lmdb, mtxn, ctx->topic, ctx->owner);
  if (rc == 0 && !kl__store_owner_equal(ctx->recorded, ctx->owner))
    *ctx->refused = 1;
  return rc;
}

static int acquire_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                      kl_err_t *stop) {
  kl_acquire_ctx_t *ctx = opaque;
  int rc =
      kl__lmdb_part_get(lmdb, mtxn, ctx->topic, ctx->partition, ctx->state);
  if (rc || (ctx->reset && ctx->state->epoch == 0))
    return rc;
  if (ctx->owner && ((rc = owner_check(lmdb, mtxn, ctx)) || *ctx->refused))
    return rc;
  if (ctx->state->epoch < ctx->floor)
    ctx->state->epoch = ctx->floor;
  if (ctx->reset)
    ctx->state->watermark = 0;
  ctx->state->epoch++;
  return kl__lmdb_part_put(lmdb, mtxn, ctx->topic, ctx->partition, ctx->state);
}

static kl_err_t lmdb_take(kl_store_t *store, const char *topic,
                          int32_t partition, uint64_t floor,
                          kl_partition_state_t *state, int reset,
                          const kl__store_owner_t *owner,
                          kl__store_owner_t *recorded, int *refused) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  kl_acquire_ctx_t ctx = {topic, partition, floor,    state,
                          reset, owner,     recorded, refused};
  kl_err_t err =
      kl__lmdb_write(lmdb, reset ? "reset" : "acquire", acquire_fn, &ctx);
  if (err || (refused && *refused))
    return err; /* a refused take wrote nothing: nothing to sync */
  /* Without fsync, an OS crash could hand this epoch out again. */
  int rc = lmdb->durable ? 0 : mdb_env_sync(lmdb->env, 1);
  return rc ? kl__lmdb_err(rc, "sync the acquired epoch") : KL_OK;
}

static kl_err_t lmdb_acquire(kl_store_t *store, const char *topic,
                             int32_t partition, uint64_t floor,
                             const kl__store_owner_t *owner,
                             kl__store_owner_t *recorded, int *refused,
                             kl_partition_state_t *state) {
  return lmdb_take(store, topic, partition, floor, state, 0, owner, recorded,
                   refused);
}

static kl_err_t lmdb_reset(kl_store_t *store, const char *topic,
                           int32_t partition, kl_partition_state_t *state) {
  return lmdb_take(store, topic, partition, 0, state, 1, NULL, NULL, NULL);
}

typedef struct kl_beat_ctx {
  const char *topic;
  kl__beat_t *beats;
  size_t n;
} kl_beat_ctx_t;

/* One partition's beat in @p mtxn: nothing when a newer owner holds it. */
static int beat_one(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                    kl__beat_t *beat) {
  kl_partition_state_t state;
  unsigned char buf[KL_PART_KEY_MAX];
  MDB_val key = part_key(buf, topic, beat->partition);
  int rc = kl__lmdb_part_get(lmdb, mtxn, topic, beat->partition, &state);
  beat->err = !rc && state.epoch != beat->epoch ? KL_EFENCED : KL_OK;
  if (rc || beat->err || (rc = beats_get(lmdb, mtxn, &key, &state)))
    return rc;
  state.beats++;
  MDB_val val = {sizeof(state.beats), &state.beats};
  return mdb_put(mtxn, lmdb->beats, &key, &val, 0);
}

static int beat_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                   kl_err_t *stop) {
  (void)stop;
  kl_beat_ctx_t *ctx = opaque;
  int rc = 0;
  for (size_t i = 0; !rc && i < ctx->n; i++)
    rc = beat_one(lmdb, mtxn, ctx->topic, &ctx->beats[i]);
  return rc;
}

static kl_err_t lmdb_beat(kl_store_t *store, const char *topic,
                          kl__beat_t *beats, size_t n) {
  kl_beat_ctx_t ctx = {topic, beats, n};
  return kl__lmdb_write((kl__lmdb_t *)store, "beat", beat_fn, &ctx);
}

int kl__lmdb_last_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int32_t partition, int64_t watermark, const void *ident,
                      size_t len) {
  unsigned char buf[KL_PART_KEY_MAX], val[sizeof(int64_t) + KL__SID_MAX];
  MDB_val key = part_key(buf, topic, partition);
  memcpy(val, &watermark, sizeof(watermark));
  memcpy(val + sizeof(watermark), ident, len);
  MDB_val v = {sizeof(watermark) + len, val};
  return mdb_put(mtxn, lmdb->lasts, &key, &v, 0);
}

static kl_err_t lmdb_last(kl_store_t *store, const char *topic,
                          int32_t partition, int64_t *watermark, void *ident,
                          size_t *len) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  unsigned char buf[KL_PART_KEY_MAX];
  MDB_val key = part_key(buf, topic, partition), val;
  int rc = mdb_get(snap, lmdb->lasts, &key, &val);
  if (rc == 0 && (val.mv_size <= sizeof(*watermark) ||
                  val.mv_size - sizeof(*watermark) > KL__SID_MAX))
    rc = MDB_CORRUPTED;
  if (rc == 0) {
    memcpy(watermark, val.mv_data, sizeof(*watermark));
    *len = val.mv_size - sizeof(*watermark);
    memcpy(ident, (const unsigned char *)val.mv_data + sizeof(*watermark),
           *len);
  }
  kl__lmdb_read_end(lmdb, snap);
  return rc && rc != MDB_NOTFOUND ? kl__lmdb_err(rc, "read the last record")
                                  : KL_OK;
}

static kl_err_t lmdb_partition(kl_store_t *store, const char *topic,
                               int32_t partition, kl_partition_state_t *state) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  unsigned char buf[KL_PART_KEY_MAX];
  MDB_val key = part_key(buf, topic, partition);
  int rc = kl__lmdb_part_get(lmdb, snap, topic, partition, state);
  if (!rc)
    rc = beats_get(lmdb, snap, &key, state);
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, "read a partition") : KL_OK;
}

/* ---- scans ----------------------------------------------------------- */

static int scan_parts(kl__lmdb_t *lmdb, MDB_cursor *cur,
                      kl_store_partition_cb_t *cb, void *opaque) {
  MDB_val key, val;
  int rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const unsigned char *k = key.mv_data;
    kl_partition_state_t state;
    if (key.mv_size < 6 || k[key.mv_size - 5] != '\0' ||
        part_decode(&val, &state))
      return MDB_CORRUPTED;
    if ((rc = beats_get(lmdb, mdb_cursor_txn(cur), &key, &state)))
      return rc;
    size_t tlen = key.mv_size - 5;
    int32_t partition = (int32_t)kl__get_be32(k + tlen + 1);
    /* The key holds the topic's NUL, so it is a C string in place. */
    if (cb(opaque, (const char *)k, partition, &state))
      return 0;
  }
  return rc == MDB_NOTFOUND ? 0 : rc;
}

static int scan_data(MDB_cursor *cur, const void *prefix, size_t plen,
                     kl_store_scan_cb_t *cb, void *opaque) {
  MDB_val key = {plen, (void *)prefix}, val;
  int rc = mdb_cursor_get(cur, &key, &val, plen ? MDB_SET_RANGE : MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    if (plen && (key.mv_size < plen || memcmp(key.mv_data, prefix, plen)))
      return 0; /* sorted: past the prefix, nothing more matches */
    if (cb(opaque, key.mv_data, key.mv_size, val.mv_data, val.mv_size))
      return 0;
  }
  return rc == MDB_NOTFOUND ? 0 : rc;
}

typedef struct kl_scan_ctx {
  MDB_dbi dbi;
  const void *prefix;
  size_t prefix_len;
  kl_store_scan_cb_t *scan_cb;
  kl_store_partition_cb_t *part_cb;
  void *opaque;
} kl_scan_ctx_t;

/* Runs one scan from one read snapshot. */
static kl_err_t lmdb_cursor_scan(kl__lmdb_t *lmdb, const char *what,
                                 const kl_scan_ctx_t *ctx) {
  MDB_txn *snap;
  MDB_cursor *cur;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = mdb_cursor_open(snap, ctx->dbi, &cur);
  if (rc == 0) {
    rc = ctx->scan_cb ? scan_data(cur, ctx->prefix, ctx->prefix_len,
                                  ctx->scan_cb, ctx->opaque)
                      : scan_parts(lmdb, cur, ctx->part_cb, ctx->opaque);
    mdb_cursor_close(cur);
  }
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, what) : KL_OK;
}

static kl_err_t lmdb_scan(kl_store_t *store, const void *prefix,
                          size_t prefix_len, kl_store_scan_cb_t *cb,
                          void *opaque) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  kl_scan_ctx_t ctx = {lmdb->data, prefix, prefix_len, cb, NULL, opaque};
  return lmdb_cursor_scan(lmdb, "scan", &ctx);
}

static kl_err_t lmdb_foreach_partition(kl_store_t *store,
                                       kl_store_partition_cb_t *cb,
                                       void *opaque) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  kl_scan_ctx_t ctx = {lmdb->parts, NULL, 0, NULL, cb, opaque};
  return lmdb_cursor_scan(lmdb, "list partitions", &ctx);
}

static kl_err_t lmdb_stat(kl__lmdb_t *lmdb, MDB_dbi dbi, MDB_stat *st) {
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = mdb_stat(snap, dbi, st);
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, "stat") : KL_OK;
}

static kl_err_t lmdb_id_count(kl_store_t *store, uint64_t *count) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_stat st;
  kl_err_t err = lmdb_stat(lmdb, lmdb->ids, &st);
  *count = err ? 0 : st.ms_entries;
  return err;
}

static uint64_t stat_pages(const MDB_stat *st) {
  return st->ms_branch_pages + st->ms_leaf_pages + st->ms_overflow_pages;
}

kl_err_t kl__store_lmdb_usage(kl_store_t *store, kl__store_usage_t *usage) {
  if (!store || strcmp(store->ops->name, "lmdb") != 0)
    return kl__err(KL_EINVAL, "kl__store_lmdb_usage: not an LMDB store");
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_stat ids, data, env;
  MDB_envinfo info;
  kl_err_t err = lmdb_stat(lmdb, lmdb->ids, &ids);
  if (!err)
    err = lmdb_stat(lmdb, lmdb->data, &data);
  if (err)
    return err;
  mdb_env_stat(lmdb->env, &env);
  mdb_env_info(lmdb->env, &info);
  usage->map_size = info.me_mapsize;
  usage->file_pages = info.me_last_pgno + 1;
  usage->page_size = env.ms_psize;
  usage->ids = ids.ms_entries;
  usage->ids_pages = stat_pages(&ids);
  usage->data_pages = stat_pages(&data);
  usage->txns = (uint64_t)info.me_last_txnid;
  return KL_OK;
}

/* ---- idempotency keys: lmdb_ids.c ------------------------------ */

/* The topics' names by number, for a walk: names[no - 1], borrowed from
 * the snapshot. Numbers are given 1, 2, ... and never reused. */
typedef struct kl_topic_names {
  const char **names;
  size_t count;
} kl_topic_names_t;

static int topic_names_load(kl__lmdb_t *lmdb, MDB_txn *snap,
                            kl_topic_names_t *t) {
  MDB_stat st;
  MDB_cursor *cur;
  MDB_val key, val;
  int rc = mdb_stat(snap, lmdb->topics, &st);
  if (rc || (rc = mdb_cursor_open(snap, lmdb->topics, &cur)))
    return rc;
  t->count = st.ms_entries;
  t->names = calloc(t->count ? t->count : 1, sizeof(*t->names));
  rc = t->names ? mdb_cursor_get(cur, &key, &val, MDB_FIRST) : ENOMEM;
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    uint32_t no = val.mv_size == 4 ? kl__get_be32(val.mv_data) : 0;
    const char *name = key.mv_data; /* stored with its NUL */
    if (no == 0 || no > t->count || name[key.mv_size - 1] != '\0') {
      rc = MDB_CORRUPTED;
      break;
    }
    t->names[no - 1] = name;
  }
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

static int ids_walk_cursor(MDB_cursor *cur, const kl_topic_names_t *t,
                           kl__store_sid_cb_t *cb, void *opaque) {
  MDB_val key, val;
  int rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    char sid[KL__SID_MAX];
    size_t len;
    uint32_t no;
    int64_t t_ms;
    kl_mark_t mark;
    if (kl__lmdb_id_decode(&key, &val, &no, sid, &len) ||
        kl__lmdb_idval_decode(&val, &t_ms, &mark) || no == 0 || no > t->count ||
        !t->names[no - 1])
      return MDB_CORRUPTED;
    if (cb(opaque, t->names[no - 1], sid, len, t_ms, mark))
      return 0;
  }
  return rc == MDB_NOTFOUND ? 0 : rc;
}

static kl_err_t lmdb_ids_walk(kl_store_t *store, kl__store_sid_cb_t *cb,
                              void *opaque) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  MDB_cursor *cur;
  kl_topic_names_t names = {NULL, 0};
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = topic_names_load(lmdb, snap, &names);
  if (rc == 0 && (rc = mdb_cursor_open(snap, lmdb->ids, &cur)) == 0) {
    rc = ids_walk_cursor(cur, &names, cb, opaque);
    mdb_cursor_close(cur);
  }
  free(names.names);
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, "list idempotency keys") : KL_OK;
}

/* ---- topics ---------------------------------------------------------- */

int kl__lmdb_topic_no(kl__lmdb_t *lmdb, MDB_txn *mtxn, const char *topic,
                      int create, uint32_t *topic_no) {
  MDB_val key = {strlen(topic) + 1, (void *)topic}, val;
  int rc = mdb_get(mtxn, lmdb->topics, &key, &val);
  if (rc == 0) {
    if (val.mv_size != 4)
      return MDB_CORRUPTED;
    *topic_no = kl__get_be32(val.mv_data);
    return 0;
  }
  if (rc != MDB_NOTFOUND || !create)
    return rc;
  MDB_stat st;
  if ((rc = mdb_stat(mtxn, lmdb->topics, &st)))
    return rc;
  uint32_t no = (uint32_t)st.ms_entries + 1;
  unsigned char be[4];
  kl__put_be32(be, no);
  val = (MDB_val){sizeof(be), be};
  if ((rc = mdb_put(mtxn, lmdb->topics, &key, &val, MDB_NOOVERWRITE)))
    return rc;
  *topic_no = no;
  return 0;
}

/* ---- open and close -------------------------------------------------- */

/* LMDB forbids opening one environment twice in a process (closing either
 * drops the other's file locks), so opens are registered by directory. A
 * forked child has its own pid and may open the store for itself. */
typedef struct kl_open_entry {
  dev_t dev;
  ino_t ino;
  pid_t pid;
  struct kl_open_entry *next;
} kl_open_entry_t;

static pthread_mutex_t kl_open_mu = PTHREAD_MUTEX_INITIALIZER;
static kl_open_entry_t *kl_open_list;

static kl_open_entry_t **open_find(dev_t dev, ino_t ino, pid_t pid) {
  kl_open_entry_t **p = &kl_open_list;
  while (*p && !((*p)->dev == dev && (*p)->ino == ino && (*p)->pid == pid))
    p = &(*p)->next;
  return p;
}

static kl_err_t open_register(kl__lmdb_t *lmdb) {
  kl_err_t err = KL_OK;
  pthread_mutex_lock(&kl_open_mu);
  kl_open_entry_t **p = open_find(lmdb->dev, lmdb->ino, getpid());
  kl_open_entry_t *entry = *p ? NULL : malloc(sizeof(*entry));
  if (*p)
    err = kl__err(KL_EINVAL,
                  "store %s is already open in this process: "
                  "share that kl_store_t between threads",
                  lmdb->dir);
  else if (!entry)
    err = KL_ENOMEM;
  else {
    *entry = (kl_open_entry_t){lmdb->dev, lmdb->ino, getpid(), kl_open_list};
    kl_open_list = entry;
  }
  pthread_mutex_unlock(&kl_open_mu);
  return err;
}

static void open_unregister(kl__lmdb_t *lmdb) {
  pthread_mutex_lock(&kl_open_mu);
  kl_open_entry_t **p = open_find(lmdb->dev, lmdb->ino, getpid());
  if (*p) {
    kl_open_entry_t *entry = *p;
    *p = entry->next;
    free(entry);
  }
  pthread_mutex_unlock(&kl_open_mu);
}

static void lmdb_destroy(kl_store_t *store) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  if (lmdb->active)
    KL_LOG_E(KL_COMP,
             "store %s destroyed with %zu transactions open: their "
             "snapshots are invalid now",
             lmdb->dir, lmdb->active);
  if (lmdb->env)
    mdb_env_close(lmdb->env);
  if (lmdb->registered)
    open_unregister(lmdb);
  pthread_cond_destroy(&lmdb->cv);
  pthread_mutex_destroy(&lmdb->mu);
  free(lmdb->dir);
  free(lmdb);
}

static kl_err_t lmdb_version(kl_store_t *store, int *version, int *latest);

static const kl__store_ops_t kl_lmdb_ops = {
    .name = "lmdb",
    .destroy = lmdb_destroy,
    .acquire = lmdb_acquire,
    .owner_get = kl__lmdb_owner,
    .owner_set = kl__lmdb_bind,
    .partition = lmdb_partition,
    .reset = lmdb_reset,
    .beat = lmdb_beat,
    .begin = kl__lmdb_begin,
    .commit = kl__lmdb_commit,
    .commit_many = kl__lmdb_commit_many,
    .abort = kl__lmdb_abort,
    .get = kl__lmdb_get,
    .put = kl__lmdb_put,
    .del = kl__lmdb_del,
    .seen = kl__lmdb_seen,
    .mark = kl__lmdb_mark,
    .count_duplicate = kl__lmdb_count_duplicate,
    .sweep = kl__lmdb_sweep,
    .sweeps = kl__lmdb_sweeps,
    .scan = lmdb_scan,
    .foreach_partition = lmdb_foreach_partition,
    .id_count = lmdb_id_count,
    .ids_walk = lmdb_ids_walk,
    .version = lmdb_version,
    .layout = "format",
    .outbox_list = kl__lmdb_outbox_list,
    .outbox_del = kl__lmdb_outbox_del,
    .last = lmdb_last,
    /* Left NULL, each answered as backend.h says: a handler has no SQL
     * connection here (pg_conn, savepoint), a read costs no round trip
     * (prefetch, begin_ahead, settle, pending), the keys are stamped with
     * this host's clock (server_clock), and the format number describes
     * the whole layout (missing). */
};

/* The databases of this format, created when missing. */
static int open_dbs(kl__lmdb_t *lmdb, MDB_txn *mtxn) {
  int rc;
  if ((rc = mdb_dbi_open(mtxn, "parts", MDB_CREATE, &lmdb->parts)) ||
      (rc = mdb_dbi_open(mtxn, "beats", MDB_CREATE, &lmdb->beats)) ||
      (rc = mdb_dbi_open(mtxn, "topics", MDB_CREATE, &lmdb->topics)) ||
      (rc = mdb_dbi_open(mtxn, KL__LMDB_IDS_DB, MDB_CREATE, &lmdb->ids)))
    return rc;
  if ((rc = mdb_dbi_open(mtxn, "outbox", MDB_CREATE, &lmdb->outbox)) ||
      (rc = mdb_dbi_open(mtxn, "lasts", MDB_CREATE, &lmdb->lasts)) ||
      (rc = mdb_dbi_open(mtxn, "owners", MDB_CREATE, &lmdb->owners)))
    return rc;
  return mdb_dbi_open(mtxn, "data", MDB_CREATE, &lmdb->data);
}

/* Numbers every topic of "parts": the topics a format-1 store's ids may
 * belong to. */
static int number_topics(kl__lmdb_t *lmdb, MDB_txn *mtxn) {
  MDB_cursor *cur;
  MDB_val key, val;
  uint32_t no;
  int rc = mdb_cursor_open(mtxn, lmdb->parts, &cur);
  if (rc)
    return rc;
  rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST);
  for (; rc == 0; rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const char *topic = key.mv_data; /* NUL-terminated in the key */
    if (key.mv_size < 6 || topic[key.mv_size - 5] != '\0') {
      rc = MDB_CORRUPTED;
      break;
    }
    if ((rc = kl__lmdb_topic_no(lmdb, mtxn, topic, 1, &no)))
      break;
  }
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

static kl_err_t format_refused(kl__lmdb_t *lmdb, uint32_t found) {
  return kl__err(
      KL_ESTORE_VERSION,
      "store %s has format version %" PRIu32 ", this build "
      "supports version %u (and migrates versions 1 to 5 when it "
      "opens them): open it with the keylane release that wrote it, or "
      "start a new store in another directory",
      lmdb->dir, found, KL__LMDB_FORMAT);
}

/* Formats 1 and 2 kept ids unscoped by entity key. An upgraded store
 * records when (store clock) in meta, so that lookups also ask for an id
 * unscoped until those ids have expired (kl__store_legacy_ids()). */
static int mark_legacy_ids(kl__lmdb_t *lmdb, MDB_txn *mtxn, uint32_t found) {
  MDB_stat st = {0};
  MDB_dbi v5;
  int rc = found == 2 ? mdb_dbi_open(mtxn, KL__LMDB_IDS_V5_DB, 0, &v5) : 0;
  if (found == 2 && rc == 0)
    rc = mdb_stat(mtxn, v5, &st);
  if (rc == MDB_NOTFOUND)
    rc = 0;
  if (rc || (found == 2 && st.ms_entries == 0))
    return rc;
  int64_t now = kl__store_now_ms();
  MDB_val key = {sizeof(KL__LMDB_LEGACY_IDS_KEY) - 1, KL__LMDB_LEGACY_IDS_KEY};
  MDB_val val = {sizeof(now), &now};
  return mdb_put(mtxn, lmdb->meta, &key, &val, 0);
}

/* Format 3's one store-wide sweep position (format 4 keeps one per
 * topic, lmdb_sweep.c): gone, when there. */
static int drop_store_sweep(kl__lmdb_t *lmdb, MDB_txn *mtxn) {
  MDB_val key = {sizeof("sweep.cursor") - 1, "sweep.cursor"};
  int rc = mdb_del(mtxn, lmdb->meta, &key, NULL);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Checks the format record, writing this build's in a new store. Format
 * 5 gets it as it is: its ids then move to KL__LMDB_IDS_DB
 * (kl__lmdb_migrate_ids()), and an older keylane refuses the store from
 * now on. Format 4 gets it too: its "owners" is created empty by
 * open_dbs(), and each topic's owner is recorded by its next worker's
 * acquire, which an older keylane would not check. Formats 1 to 3 get it too
 * (format 3's ids stay as they are, its sweep position goes:
 * drop_store_sweep()); formats 1 and 2 get it too: format 1's topics are
 * numbered (its ids then move by kl__lmdb_migrate_ids()), the ids both kept are
 * marked as unscoped (mark_legacy_ids()), and an older keylane refuses the
 * store from now on. */
static int format_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, kl_err_t *stop) {
  MDB_val key = {sizeof(KL__LMDB_FORMAT_KEY) - 1, KL__LMDB_FORMAT_KEY}, val;
  uint32_t format = KL__LMDB_FORMAT, found = 0;
  int rc = mdb_get(mtxn, lmdb->meta, &key, &val);
  if (rc && rc != MDB_NOTFOUND)
    return rc;
  if (rc == 0 && val.mv_size == sizeof(found))
    memcpy(&found, val.mv_data, sizeof(found));
  if (rc == 0 && found == KL__LMDB_FORMAT)
    return 0;
  if (rc == 0 && (found < 1 || found > 5)) {
    *stop = format_refused(lmdb, found);
    return KL__LMDB_STOP;
  }
  if (rc == 0 && found == 1 && (rc = number_topics(lmdb, mtxn)))
    return rc;
  if (rc == 0 && found < 3 && (rc = mark_legacy_ids(lmdb, mtxn, found)))
    return rc;
  if (rc == 0 && (rc = drop_store_sweep(lmdb, mtxn)))
    return rc;
  val = (MDB_val){sizeof(format), &format};
  return mdb_put(mtxn, lmdb->meta, &key, &val, 0);
}

/* Sets the store's legacy window from meta (mark_legacy_ids()). */
static int legacy_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn) {
  MDB_val key = {sizeof(KL__LMDB_LEGACY_IDS_KEY) - 1, KL__LMDB_LEGACY_IDS_KEY};
  MDB_val val;
  int64_t at;
  int rc = mdb_get(mtxn, lmdb->meta, &key, &val);
  if (rc == MDB_NOTFOUND)
    return 0;
  if (rc == 0 && val.mv_size != sizeof(at))
    return MDB_CORRUPTED;
  if (rc == 0) {
    memcpy(&at, val.mv_data, sizeof(at));
    lmdb->base.legacy_ids_until_ms = at + lmdb->retention_ms;
  }
  return rc;
}

/* Checks the format, creating the databases of a new store. */
static int init_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                   kl_err_t *stop) {
  MDB_dbi main;
  MDB_stat st;
  (void)opaque;
  int rc = mdb_dbi_open(mtxn, KL__LMDB_META_DB, 0, &lmdb->meta);
  if (rc == MDB_NOTFOUND) {
    /* No meta: a new store, unless another program's data is there. */
    if ((rc = mdb_dbi_open(mtxn, NULL, 0, &main)) ||
        (rc = mdb_stat(mtxn, main, &st)))
      return rc;
    if (st.ms_entries > 0) {
      lmdb->not_store = 1;
      *stop = kl__err(KL_ESTORE_VERSION,
                      "store %s holds an LMDB database "
                      "that keylane did not write: point "
                      "the store at another directory",
                      lmdb->dir);
      return KL__LMDB_STOP;
    }
    rc = mdb_dbi_open(mtxn, KL__LMDB_META_DB, MDB_CREATE, &lmdb->meta);
  }
  if (rc || (rc = open_dbs(lmdb, mtxn)) || (rc = format_fn(lmdb, mtxn, stop)))
    return rc;
  return legacy_fn(lmdb, mtxn);
}

static kl_err_t lmdb_version(kl_store_t *store, int *version, int *latest) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_val key = {sizeof(KL__LMDB_FORMAT_KEY) - 1, KL__LMDB_FORMAT_KEY}, val;
  MDB_txn *snap;
  uint32_t found = 0;
  *latest = (int)KL__LMDB_FORMAT;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = mdb_get(snap, lmdb->meta, &key, &val);
  if (rc == 0 && val.mv_size == sizeof(found))
    memcpy(&found, val.mv_data, sizeof(found));
  kl__lmdb_read_end(lmdb, snap);
  *version = (int)found;
  return rc ? kl__lmdb_err(rc, "read the format version") : KL_OK;
}

static size_t round_pages(int64_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint64_t b = (uint64_t)bytes;
  if (b > SIZE_MAX - page)
    b = (SIZE_MAX - page) / 2;
  return ((size_t)b + page - 1) / page * page;
}

static kl_err_t lmdb_settings(kl__lmdb_t *lmdb, const kl_conf_t *conf,
                              size_t *map_size, unsigned *flags) {
  const char *durability = kl_conf_get(conf, "store.durability");
  *flags = MDB_NOTLS;
  if (strcmp(durability, "meta") == 0)
    *flags |= MDB_NOMETASYNC;
  else if (strcmp(durability, "none") == 0)
    *flags |= MDB_NOSYNC;
  lmdb->durable = strcmp(durability, "full") == 0;
  *map_size = round_pages(kl__conf_int(conf, "store.map.size"));
  lmdb->map_max = round_pages(kl__conf_int(conf, "store.map.max"));
  lmdb->retention_ms = kl__conf_int(conf, "store.dedup.retention");
  lmdb->create = strcmp(kl_conf_get(conf, "store.create"), "no") != 0;
  if (lmdb->map_max < *map_size)
    return kl__err(KL_ECONF,
                   "store.map.max=%s is below store.map.size=%s: "
                   "raise store.map.max",
                   kl_conf_get(conf, "store.map.max"),
                   kl_conf_get(conf, "store.map.size"));
  return KL_OK;
}

/* Creates the directory when missing (unless store.create=no: then a
 * directory without an environment is no store) and records which one it
 * is. */
static kl_err_t lmdb_dir(kl__lmdb_t *lmdb) {
  char what[64 + 4096];
  struct stat st;
  snprintf(what, sizeof(what), "%s/data.mdb", lmdb->dir);
  if (!lmdb->create && stat(what, &st) != 0)
    return kl__err(KL_ENOTFOUND,
                   "no keylane store at %s (%s does not exist): this "
                   "command creates none; `keylane worker` creates one, or "
                   "check the path",
                   lmdb->dir, what);
  snprintf(what, sizeof(what), "store directory %s", lmdb->dir);
  if (mkdir(lmdb->dir, 0775) != 0 && errno != EEXIST)
    return kl__lmdb_err(errno, what);
  if (stat(lmdb->dir, &st) != 0)
    return kl__lmdb_err(errno, what);
  if (!S_ISDIR(st.st_mode))
    return kl__err(KL_EINVAL,
                   "store %s is not a directory: the LMDB store "
                   "is a directory path",
                   lmdb->dir);
  lmdb->dev = st.st_dev;
  lmdb->ino = st.st_ino;
  return KL_OK;
}

/* mdb_env_open plus the map size: ours, or larger when another process
 * already grew the store beyond it. */
static kl_err_t lmdb_env(kl__lmdb_t *lmdb, size_t map_size, unsigned flags) {
  int rc = mdb_env_create(&lmdb->env);
  if (!rc)
    rc = mdb_env_set_maxdbs(lmdb->env, 12); /* 9 named: room to grow */
  if (!rc)
    rc = mdb_env_set_maxreaders(lmdb->env, KL_LMDB_READERS);
  if (!rc)
    rc = mdb_env_set_mapsize(lmdb->env, map_size);
  if (!rc)
    rc = mdb_env_open(lmdb->env, lmdb->dir, flags, 0664);
  if (!rc)
    rc = mdb_env_set_mapsize(lmdb->env, 0);
  if (!rc && lmdb_current_map(lmdb) < map_size)
    rc = mdb_env_set_mapsize(lmdb->env, map_size);
  if (rc) {
    char what[64 + 4096];
    snprintf(what, sizeof(what), "open %s", lmdb->dir);
    lmdb->not_store = rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH;
    return kl__lmdb_err(rc, what);
  }
  lmdb->map_size = lmdb_current_map(lmdb);
  int dead = 0;
  mdb_reader_check(lmdb->env, &dead);
  return KL_OK;
}

kl_err_t kl__store_lmdb_open(const char *dir, const kl_conf_t *conf,
                             kl_store_t **out) {
  kl__lmdb_t *lmdb = calloc(1, sizeof(*lmdb));
  if (!lmdb || !(lmdb->dir = strdup(dir))) {
    free(lmdb);
    return kl__err(KL_ENOMEM, "kl_store_open: out of memory");
  }
  lmdb->base.ops = &kl_lmdb_ops;
  kl__mono_cond_init(&lmdb->cv);
  pthread_mutex_init(&lmdb->mu, NULL);
  size_t map_size;
  unsigned flags;
  kl_err_t err = lmdb_settings(lmdb, conf, &map_size, &flags);
  if (!err)
    err = lmdb_dir(lmdb);
  /* LMDB makes lock.mdb before it reads data.mdb: a command that opens an
   * existing store and finds none there removes the one it made, so that
   * it leaves the directory as it found it. While any process has an
   * environment open its lock.mdb exists, so a missing one is nobody's. */
  char lock[4096 + 16];
  snprintf(lock, sizeof(lock), "%s/lock.mdb", dir);
  int lock_ours = !err && !lmdb->create && access(lock, F_OK) != 0;
  if (!err && (err = open_register(lmdb)) == KL_OK)
    lmdb->registered = 1;
  if (!err)
    err = lmdb_env(lmdb, map_size, flags);
  if (!err)
    err = kl__lmdb_write(lmdb, "initialise", init_fn, NULL);
  if (!err)
    err = kl__lmdb_migrate_ids(lmdb);
  if (err) {
    int unlock = lock_ours && lmdb->not_store;
    lmdb_destroy(&lmdb->base);
    if (unlock)
      unlink(lock);
    return err;
  }
  *out = &lmdb->base;
  return KL_OK;
}
