/*
 * The LMDB store's expiry of idempotency keys, one topic at a time.
 *
 * Expiry walks "topic_ids" itself, with no index by time (it would cost
 * another key per id on disk). A topic's keys are the ones that start with
 * its number (lmdb_ids.c), so a sweep of topic T walks that range alone:
 * the ids of another topic sharing the store are never visited, whatever
 * retention that topic's fleet keeps (issue 39: a worker started with a
 * 5 s retention emptied every topic's ids, and a 7d fleet swept a 30d
 * fleet's). Each sweep of T visits up to `max` of T's keys from where T's
 * last sweep stopped, a cursor kept in meta per topic ("sweep.cursor.N",
 * N the topic's number: every process on the host advances one position
 * per topic, across restarts), and removes those older than the
 * retention of the store it was called on. At the range's end the cursor
 * goes back to its start for the next call. A full cycle over T's N keys
 * thus takes about N/max sweeps, and a key lives at least the retention
 * and at most the retention plus one cycle; the id of a timer that waits
 * (KL__MARK_TIMER) stays until its firing or cancel re-marks it.
 *
 * A sweep first walks its keys in a read snapshot: when none has expired
 * it writes nothing (a worker sweeps every second, and a durable write
 * transaction is two fsyncs on its poll thread), and only this process
 * remembers where it stopped; the next sweep that removes something saves
 * the position in meta with its removals, and the retention it judged by
 * ("sweep.retention.N": int64 retention ms, int64 store ms; host order),
 * which `keylane doctor` reads back (kl__store_sweeps()).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/mutant.h"
#include "store/lmdb.h"
#include "store/store_internal.h"

#define KL_COMP "store"
#define KL_SWEEP_CURSOR "sweep.cursor."
#define KL_SWEEP_RETENTION "sweep.retention."

typedef struct kl_sweep_ctx {
  size_t max;
  int64_t now_ms;
  int64_t retention_ms;
  int dry;        /* count what has expired, remove nothing */
  size_t removed; /* removed, or (dry) expired */
  unsigned char prefix[KL__TOPIC_NO_LEN]; /* the topic's keys start so */
  size_t prefix_len;      /* KL__TOPIC_NO_LEN; 0 (every key) under the mutant */
  char cursor_key[32];    /* meta's "sweep.cursor.N" */
  char retention_key[32]; /* meta's "sweep.retention.N" */
  unsigned char from[KL__IDKEY_MAX]; /* start after it, when from_set; */
  size_t from_len;                   /* else after meta's cursor */
  int from_set;
  unsigned char last[KL__IDKEY_MAX]; /* where the walk stopped; the */
  size_t last_len;                   /* prefix alone at the range's end */
  int walked;
} kl_sweep_ctx_t;

static int in_range(const kl_sweep_ctx_t *ctx, const MDB_val *key) {
  return key->mv_size > ctx->prefix_len &&
         memcmp(key->mv_data, ctx->prefix, ctx->prefix_len) == 0;
}

/* Positions @p cur on the topic's first key: 0, or MDB_NOTFOUND when the
 * topic holds none. */
static int range_first(MDB_cursor *cur, const kl_sweep_ctx_t *ctx, MDB_val *key,
                       MDB_val *val) {
  if (ctx->prefix_len == 0)
    return mdb_cursor_get(cur, key, val, MDB_FIRST);
  *key = (MDB_val){ctx->prefix_len, (void *)ctx->prefix};
  int rc = mdb_cursor_get(cur, key, val, MDB_SET_RANGE);
  return rc == 0 && !in_range(ctx, key) ? MDB_NOTFOUND : rc;
}

/* Positions @p cur on the first key of the topic after the sweep's start
 * (the cursor this process remembers, else meta's), or on its first. */
static int sweep_start(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                       const kl_sweep_ctx_t *ctx, MDB_val *key, MDB_val *val) {
  MDB_val ck = {strlen(ctx->cursor_key), (void *)ctx->cursor_key}, saved;
  int rc = 0;
  if (ctx->from_set)
    saved = (MDB_val){ctx->from_len, (void *)ctx->from};
  else
    rc = mdb_get(mtxn, lmdb->meta, &ck, &saved);
  if (rc && rc != MDB_NOTFOUND)
    return rc;
  if (rc == MDB_NOTFOUND || saved.mv_size <= ctx->prefix_len ||
      saved.mv_size > KL__IDKEY_MAX)
    return range_first(cur, ctx, key, val);
  *key = saved;
  rc = mdb_cursor_get(cur, key, val, MDB_SET_RANGE);
  if (rc == 0 && key->mv_size == saved.mv_size &&
      memcmp(key->mv_data, saved.mv_data, saved.mv_size) == 0)
    rc = mdb_cursor_get(cur, key, val, MDB_NEXT);
  if (rc == MDB_NOTFOUND || (rc == 0 && !in_range(ctx, key)))
    return range_first(cur, ctx, key, val);
  return rc;
}

static int sweep_walk(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                      kl_sweep_ctx_t *ctx) {
  MDB_val key, val;
  int rc = sweep_start(lmdb, mtxn, cur, ctx, &key, &val);
  /* No wrap inside a call: no key is visited twice in one sweep. */
  for (size_t visited = 0; rc == 0 && visited < ctx->max; visited++) {
    int64_t t;
    kl_mark_t mark;
    if (key.mv_size > KL__IDKEY_MAX || kl__lmdb_idval_decode(&val, &t, &mark))
      return MDB_CORRUPTED;
    memcpy(ctx->last, key.mv_data, key.mv_size);
    ctx->last_len = key.mv_size;
    ctx->walked = 1;
    /* An id that waits as a timer stays while it waits (store_internal.h,
     * KL__MARK_TIMER), however long that is. */
    if (mark != KL__MARK_TIMER && ctx->now_ms - t > ctx->retention_ms) {
      if (!ctx->dry && (rc = mdb_cursor_del(cur, 0)) != 0)
        return rc;
      ctx->removed++;
    }
    /* After a delete the cursor already sits on the next key; MDB_NEXT
     * knows and returns that one. */
    rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
    if (rc == MDB_NOTFOUND || (rc == 0 && !in_range(ctx, &key))) {
      memcpy(ctx->last, ctx->prefix, ctx->prefix_len); /* start over */
      ctx->last_len = ctx->prefix_len;
      rc = MDB_NOTFOUND;
    }
  }
  return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Saves where the walk stopped and the retention it judged by. */
static int sweep_record(kl__lmdb_t *lmdb, MDB_txn *mtxn, kl_sweep_ctx_t *ctx) {
  MDB_val ck = {strlen(ctx->cursor_key), ctx->cursor_key};
  MDB_val cv = {ctx->last_len, ctx->last};
  int rc = mdb_put(mtxn, lmdb->meta, &ck, &cv, 0);
  if (rc || ctx->removed == 0)
    return rc;
  int64_t rec[2] = {ctx->retention_ms, ctx->now_ms};
  MDB_val rk = {strlen(ctx->retention_key), ctx->retention_key};
  MDB_val rv = {sizeof(rec), rec};
  return mdb_put(mtxn, lmdb->meta, &rk, &rv, 0);
}

static int sweep_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                    kl_err_t *stop) {
  (void)stop;
  kl_sweep_ctx_t *ctx = opaque;
  MDB_cursor *cur;
  ctx->removed = 0;
  ctx->walked = 0;
  int rc = mdb_cursor_open(mtxn, lmdb->ids, &cur);
  if (rc)
    return rc;
  rc = sweep_walk(lmdb, mtxn, cur, ctx);
  mdb_cursor_close(cur);
  if (rc || !ctx->walked || ctx->dry)
    return rc;
  return sweep_record(lmdb, mtxn, ctx);
}

/* Reads the topic's number into @p ctx; *@p known is 0 when the store
 * never numbered the topic (it holds no id of it). */
static kl_err_t sweep_topic(kl__lmdb_t *lmdb, const char *topic,
                            kl_sweep_ctx_t *ctx, int *known) {
  MDB_txn *snap;
  uint32_t no = 0;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = kl__lmdb_topic_no(lmdb, snap, topic, 0, &no);
  kl__lmdb_read_end(lmdb, snap);
  *known = rc == 0;
  if (rc)
    return rc == MDB_NOTFOUND ? KL_OK
                              : kl__lmdb_err(rc, "read a topic's number");
  kl__put_be32(ctx->prefix, no);
  /* Test only (common/mutant.h): KL__MUTANT_SWEEP walks every topic's
   * keys, as the store-wide sweep before issue 39 did. */
  ctx->prefix_len = KL__MUTANT(KL__MUTANT_SWEEP) ? 0 : KL__TOPIC_NO_LEN;
  snprintf(ctx->cursor_key, sizeof(ctx->cursor_key), KL_SWEEP_CURSOR "%" PRIu32,
           no);
  snprintf(ctx->retention_key, sizeof(ctx->retention_key),
           KL_SWEEP_RETENTION "%" PRIu32, no);
  return KL_OK;
}

/* The walk in a read snapshot: @returns KL_OK with ctx->removed the keys
 * that have expired, and ctx->last where it stopped. */
static kl_err_t sweep_dry(kl__lmdb_t *lmdb, kl_sweep_ctx_t *ctx) {
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  ctx->dry = 1;
  int rc = sweep_fn(lmdb, snap, ctx, NULL);
  ctx->dry = 0;
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, "sweep expired idempotency keys") : KL_OK;
}

/* The position this process's last sweep stopped at, in or out: kept for
 * one topic, the last swept (a handle sweeping several topics in turn
 * reads the others' from meta). */
static void sweep_at(kl__lmdb_t *lmdb, kl_sweep_ctx_t *ctx, int save) {
  pthread_mutex_lock(&lmdb->mu);
  if (save) {
    memcpy(lmdb->sweep_at, ctx->last, ctx->last_len);
    lmdb->sweep_at_len = ctx->last_len;
    memcpy(lmdb->sweep_at_topic, ctx->prefix, KL__TOPIC_NO_LEN);
    lmdb->sweep_at_set = 1;
  } else if (lmdb->sweep_at_set &&
             memcmp(lmdb->sweep_at_topic, ctx->prefix, KL__TOPIC_NO_LEN) == 0) {
    memcpy(ctx->from, lmdb->sweep_at, lmdb->sweep_at_len);
    ctx->from_len = lmdb->sweep_at_len;
    ctx->from_set = 1;
  }
  pthread_mutex_unlock(&lmdb->mu);
}

kl_err_t kl__lmdb_sweep(kl_store_t *store, const char *topic, size_t max,
                        size_t *removed) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  *removed = 0;
  if (max == 0)
    return KL_OK;
  int dead = 0;
  mdb_reader_check(lmdb->env, &dead); /* frees slots of crashed processes */
  if (dead)
    KL_LOG_W(KL_COMP, "store %s: freed %d read slots of dead processes",
             lmdb->dir, dead);
  kl_sweep_ctx_t ctx = {.max = max,
                        .now_ms = kl__store_now_ms(),
                        .retention_ms = lmdb->retention_ms};
  int known;
  kl_err_t err = sweep_topic(lmdb, topic, &ctx, &known);
  if (err || !known)
    return err;
  sweep_at(lmdb, &ctx, 0);
  err = sweep_dry(lmdb, &ctx);
  if (!err && ctx.removed)
    err = kl__lmdb_write(lmdb, "sweep", sweep_fn, &ctx);
  if (err)
    return err;
  if (ctx.walked)
    sweep_at(lmdb, &ctx, 1);
  *removed = ctx.removed;
  return KL_OK;
}

/* ---- what each topic's sweeps judged by ------------------------------ */

static int sweeps_walk(kl__lmdb_t *lmdb, MDB_txn *snap,
                       kl__store_sweep_cb_t *cb, void *opaque) {
  MDB_cursor *cur;
  MDB_val key, val;
  int rc = mdb_cursor_open(snap, lmdb->topics, &cur);
  if (rc)
    return rc;
  for (rc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const char *topic = key.mv_data; /* NUL-terminated in the key */
    if (val.mv_size != 4 || key.mv_size < 2 || topic[key.mv_size - 1] != '\0') {
      rc = MDB_CORRUPTED;
      break;
    }
    char rk[32];
    int64_t rec[2];
    snprintf(rk, sizeof(rk), KL_SWEEP_RETENTION "%" PRIu32,
             kl__get_be32(val.mv_data));
    MDB_val k = {strlen(rk), rk}, v;
    int got = mdb_get(snap, lmdb->meta, &k, &v);
    if (got == MDB_NOTFOUND)
      continue;
    if (got == 0 && v.mv_size != sizeof(rec))
      got = MDB_CORRUPTED;
    if ((rc = got) != 0)
      break;
    memcpy(rec, v.mv_data, sizeof(rec));
    if (cb(opaque, topic, rec[0], rec[1]))
      break;
  }
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

kl_err_t kl__lmdb_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                         void *opaque) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  MDB_txn *snap;
  kl_err_t err = kl__lmdb_read_begin(lmdb, &snap);
  if (err)
    return err;
  int rc = sweeps_walk(lmdb, snap, cb, opaque);
  kl__lmdb_read_end(lmdb, snap);
  return rc ? kl__lmdb_err(rc, "read the sweeps' retentions") : KL_OK;
}
