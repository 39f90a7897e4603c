/*
 * LMDB batches: a read snapshot plus a write buffer while the handlers run,
 * then one short write transaction that checks the fence and applies it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/mutant.h"
#include "store/store_internal.h"
#include "store/lmdb.h"
#include "store/txn_buffer.h"

enum { KL_BUF_PUT = 1, KL_BUF_DEL = 2 };

typedef struct kl_lmdb_txn {
  kl_txn_t base;
  MDB_txn *snap;      /* NULL once the commit gave it up */
  MDB_cursor *id_cur; /* the ids' in snap, once a lookup opened it */
  int32_t partition;
  uint32_t topic_no; /* scopes the batch's idempotency keys */
  uint64_t epoch;
  uint64_t duplicates;
  kl__buf_t data; /* handler keys: KL_BUF_PUT with the value, or KL_BUF_DEL */
  kl__buf_t ids;  /* encoded idempotency keys, tagged with their mark */
  char topic[KL__TOPIC_MAX + 1];
  /* The sid last encoded and its key: an event's mark follows its lookup,
   * and encodes the same sid (a UUID's parse, 3.7 % of the worker's poll
   * thread in callgrind, 2026-12-07). */
  size_t enc_sid_len, enc_len; /* enc_len 0: none */
  char enc_sid[KL__SID_MAX];
  unsigned char enc[KL__IDKEY_MAX];
} kl_lmdb_txn_t;

static kl__lmdb_t *txn_lmdb(kl_lmdb_txn_t *ltxn) {
  return (kl__lmdb_t *)ltxn->base.store;
}

/* Frees a txn for good: kl__store_spare_give()'s drop. */
static void lmdb_txn_drop(kl_txn_t *txn) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  kl__buf_clear(&ltxn->data);
  kl__buf_clear(&ltxn->ids);
  kl__txn_emits_free(&ltxn->base);
  free(ltxn);
}

/* Gives up the snapshot, and its cursor first (a read-only txn's cursor
 * outlives it otherwise). */
static void ltxn_snap_end(kl_lmdb_txn_t *ltxn) {
  if (ltxn->id_cur)
    mdb_cursor_close(ltxn->id_cur);
  ltxn->id_cur = NULL;
  kl__lmdb_read_end(txn_lmdb(ltxn), ltxn->snap);
  ltxn->snap = NULL;
}

/* Ends the txn: its snapshot goes, its struct and buffers are kept for the
 * store's next begin (kl__store_spare_give()). */
static void lmdb_txn_free(kl_lmdb_txn_t *ltxn) {
  ltxn_snap_end(ltxn);
  kl__buf_recycle(&ltxn->data);
  kl__buf_recycle(&ltxn->ids);
  kl__txn_recycle(&ltxn->base);
  ltxn->duplicates = 0;
  kl__store_spare_give(ltxn->base.store, &ltxn->base, lmdb_txn_drop);
}

/* A spare txn of @p store, or a new one; NULL when memory is short. */
static kl_lmdb_txn_t *lmdb_txn_new(kl_store_t *store) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)kl__store_spare_take(store);
  if (ltxn || !(ltxn = calloc(1, sizeof(*ltxn))))
    return ltxn;
  ltxn->base.store = store;
  kl__buf_init(&ltxn->data);
  kl__buf_init(&ltxn->ids);
  return ltxn;
}

static kl_err_t ltxn_fenced(const char *topic, int32_t partition, uint64_t mine,
                            uint64_t current) {
  return kl__err(KL_EFENCED,
                 "fenced partition=%" PRId32 " my_epoch=%" PRIu64
                 " current_epoch=%" PRIu64 " topic=%s: a newer owner holds "
                 "the partition; nothing of this batch was applied",
                 partition, mine, current, topic);
}

kl_err_t kl__lmdb_begin(kl_store_t *store, const char *topic, int32_t partition,
                        uint64_t epoch, kl_txn_t **txn) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)store;
  size_t tlen = strlen(topic);
  if (tlen > KL__TOPIC_MAX) /* kl_store_begin() checked it */
    return kl__err(KL_EINVAL,
                   "kl_store_begin: topic is %zu bytes, Kafka "
                   "allows %d",
                   tlen, KL__TOPIC_MAX);
  kl_lmdb_txn_t *ltxn = lmdb_txn_new(store);
  if (!ltxn)
    return kl__err(KL_ENOMEM, "kl_store_begin: out of memory");
  ltxn->partition = partition;
  ltxn->epoch = epoch;
  ltxn->topic_no = 0;
  ltxn->enc_len = 0;
  memcpy(ltxn->topic, topic, tlen + 1);
  kl_err_t err = kl__lmdb_read_begin(lmdb, &ltxn->snap);
  if (err) {
    ltxn->snap = NULL;
    lmdb_txn_free(ltxn);
    return err;
  }
  /* Fail fast: a batch that cannot commit need not run its handlers. */
  kl_partition_state_t state;
  int rc = kl__lmdb_part_get(lmdb, ltxn->snap, topic, partition, &state);
  /* An owned partition's topic has a number: its row was written with it. */
  if (!rc && state.epoch == epoch)
    rc = kl__lmdb_topic_no(lmdb, ltxn->snap, topic, 0, &ltxn->topic_no);
  if (rc)
    err = kl__lmdb_err(rc, "begin");
  else if (state.epoch != epoch)
    err = ltxn_fenced(topic, partition, epoch, state.epoch);
  if (err) {
    lmdb_txn_free(ltxn);
    return err;
  }
  *txn = &ltxn->base;
  return KL_OK;
}

void kl__lmdb_abort(kl_txn_t *txn) {
  lmdb_txn_free((kl_lmdb_txn_t *)txn);
}

kl_err_t kl__lmdb_get(kl_txn_t *txn, const void *key, size_t key_len,
                      const void **val, size_t *val_len) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  const kl__buf_entry_t *entry = kl__buf_get(&ltxn->data, key, key_len);
  if (entry && entry->tag == KL_BUF_DEL)
    return KL_ENOTFOUND;
  if (entry) {
    *val = kl__buf_val(entry);
    *val_len = entry->val_len;
    return KL_OK;
  }
  MDB_val k = {key_len, (void *)key}, v;
  int rc = mdb_get(ltxn->snap, txn_lmdb(ltxn)->data, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KL_ENOTFOUND;
  if (rc)
    return kl__lmdb_err(rc, "get");
  *val = v.mv_data; /* in the map: valid while the snapshot lives */
  *val_len = v.mv_size;
  return KL_OK;
}

kl_err_t kl__lmdb_put(kl_txn_t *txn, const void *key, size_t key_len,
                      const void *val, size_t val_len) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  if (kl__buf_set(&ltxn->data, key, key_len, val, val_len, KL_BUF_PUT))
    return kl__err(KL_ENOMEM, "kl_txn_put: out of memory");
  return KL_OK;
}

kl_err_t kl__lmdb_del(kl_txn_t *txn, const void *key, size_t key_len) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  if (kl__buf_set(&ltxn->data, key, key_len, NULL, 0, KL_BUF_DEL))
    return kl__err(KL_ENOMEM, "kl_txn_del: out of memory");
  return KL_OK;
}

/* The key of sid @p id in this txn's topic, encoded once for a lookup and
 * the mark after it. */
static const unsigned char *ltxn_id_key(kl_lmdb_txn_t *ltxn, const char *id,
                                        size_t id_len, size_t *len) {
  if (!ltxn->enc_len || ltxn->enc_sid_len != id_len ||
      memcmp(ltxn->enc_sid, id, id_len) != 0) {
    ltxn->enc_len = kl__lmdb_id_encode(ltxn->topic_no, id, id_len, ltxn->enc);
    memcpy(ltxn->enc_sid, id, id_len);
    ltxn->enc_sid_len = id_len;
  }
  *len = ltxn->enc_len;
  return ltxn->enc;
}

/* One cursor for the batch's lookups, opened at the first: an event's id
 * often falls on the page of the one before (kl__lmdb_id_put() says why that
 * helps). NULL if the open failed: kl__lmdb_id_get() then uses mdb_get(). */
static MDB_cursor *ltxn_id_cursor(kl_lmdb_txn_t *ltxn) {
  if (!ltxn->id_cur &&
      mdb_cursor_open(ltxn->snap, txn_lmdb(ltxn)->ids, &ltxn->id_cur) != 0)
    ltxn->id_cur = NULL;
  return ltxn->id_cur;
}

kl_err_t kl__lmdb_seen(kl_txn_t *txn, const char *id, size_t id_len,
                       kl_mark_t *mark) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  size_t len;
  const unsigned char *buf = ltxn_id_key(ltxn, id, id_len, &len);
  const kl__buf_entry_t *entry = kl__buf_get(&ltxn->ids, buf, len);
  if (entry) {
    *mark = (kl_mark_t)entry->tag;
    return KL_OK;
  }
  int64_t t;
  int rc = kl__lmdb_id_get(txn_lmdb(ltxn), ltxn->snap, ltxn_id_cursor(ltxn),
                           buf, len, &t, mark);
  if (rc == MDB_NOTFOUND)
    *mark = KL_MARK_NONE;
  return rc && rc != MDB_NOTFOUND ? kl__lmdb_err(rc, "seen") : KL_OK;
}

kl_err_t kl__lmdb_mark(kl_txn_t *txn, const char *id, size_t id_len,
                       kl_mark_t mark) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  size_t len;
  const unsigned char *buf = ltxn_id_key(ltxn, id, id_len, &len);
  return kl__store_buf_mark(&ltxn->ids, buf, len, mark);
}

void kl__lmdb_count_duplicate(kl_txn_t *txn) {
  ((kl_lmdb_txn_t *)txn)->duplicates++;
}

/* ---- commit ---------------------------------------------------------- */

typedef struct kl_commit_ctx {
  kl_lmdb_txn_t *ltxn;
  int64_t watermark;
  int64_t now_ms;
  const kl__buf_entry_t *const *data; /* both in key order, the buffers' */
  const kl__buf_entry_t *const *ids;
  uint64_t applied;
  kl_err_t err; /* its own outcome: a failed prepare, or KL_EFENCED */
  char why[512];
} kl_commit_ctx_t;

enum { KL_COMMIT_FEW = 8 };

typedef struct kl_commit_set {
  kl_commit_ctx_t *ctx;
  size_t n;
} kl_commit_set_t;

/* The writes, in key order through one cursor (kl__lmdb_id_put() says
 * why). */
static int commit_data(kl__lmdb_t *lmdb, MDB_txn *mtxn,
                       const kl_commit_ctx_t *ctx) {
  MDB_cursor *cur = NULL;
  int rc = ctx->ltxn->data.count ? mdb_cursor_open(mtxn, lmdb->data, &cur) : 0;
  for (size_t i = 0; !rc && i < ctx->ltxn->data.count; i++) {
    const kl__buf_entry_t *e = ctx->data[i];
    MDB_val k = {e->key_len, (void *)kl__buf_key(e)}, have;
    MDB_val v = {e->val_len, (void *)kl__buf_val(e)};
    if (e->tag == KL_BUF_PUT)
      rc = mdb_cursor_put(cur, &k, &v, 0);
    else if ((rc = mdb_cursor_get(cur, &k, &have, MDB_SET)) == 0)
      rc = mdb_cursor_del(cur, 0);
    rc = rc == MDB_NOTFOUND ? 0 : rc;
  }
  if (cur) /* NULL when there was nothing to write or the open failed */
    mdb_cursor_close(cur);
  return rc;
}

/* The ids; @p dead_letters counts the dead-letter marks written, not those
 * an applied mark kept out. */
static int commit_ids(kl__lmdb_t *lmdb, MDB_txn *mtxn,
                      const kl_commit_ctx_t *ctx, uint64_t *dead_letters) {
  *dead_letters = 0;
  MDB_cursor *cur = NULL;
  int rc = ctx->ltxn->ids.count ? mdb_cursor_open(mtxn, lmdb->ids, &cur) : 0;
  for (size_t i = 0; !rc && i < ctx->ltxn->ids.count; i++) {
    const kl__buf_entry_t *e = ctx->ids[i];
    int written;
    rc = kl__lmdb_id_put(lmdb, mtxn, cur, kl__buf_key(e), e->key_len,
                         ctx->now_ms, (kl_mark_t)e->tag, &written);
    *dead_letters += !rc && written && e->tag == KL_MARK_DEAD_LETTER;
  }
  if (cur)
    mdb_cursor_close(cur);
  return rc;
}

/* One batch in the write transaction: the fence check first, then
 * everything; a fenced batch writes nothing. */
static int commit_one(kl__lmdb_t *lmdb, MDB_txn *mtxn, kl_commit_ctx_t *ctx) {
  kl_lmdb_txn_t *ltxn = ctx->ltxn;
  kl_partition_state_t state;
  int rc = kl__lmdb_part_get(lmdb, mtxn, ltxn->topic, ltxn->partition, &state);
  if (rc)
    return rc;
  /* Test only (common/mutant.h): KL__MUTANT_EPOCH skips the check, and
   * KL__MUTANT_OUTBOX writes a fenced batch's follow-ups all the same. */
  if (state.epoch != ltxn->epoch && !KL__MUTANT(KL__MUTANT_EPOCH)) {
    if (KL__MUTANT(KL__MUTANT_OUTBOX) && ltxn->base.emits &&
        (rc = kl__lmdb_outbox_write(lmdb, mtxn, ltxn->topic, ltxn->partition,
                                    ltxn->base.emits)))
      return rc;
    ctx->err =
        ltxn_fenced(ltxn->topic, ltxn->partition, ltxn->epoch, state.epoch);
    snprintf(ctx->why, sizeof(ctx->why), "%s", kl_err_detail());
    return 0;
  }
  uint64_t dead_letters;
  if ((rc = commit_data(lmdb, mtxn, ctx)) ||
      (rc = commit_ids(lmdb, mtxn, ctx, &dead_letters)) ||
      (ltxn->base.emits &&
       (rc = kl__lmdb_outbox_write(lmdb, mtxn, ltxn->topic, ltxn->partition,
                                   ltxn->base.emits))))
    return rc;
  if (ctx->watermark > state.watermark)
    state.watermark = ctx->watermark;
  if (ltxn->base.last_len && state.watermark == ctx->watermark &&
      (rc = kl__lmdb_last_put(lmdb, mtxn, ltxn->topic, ltxn->partition,
                              ctx->watermark, ltxn->base.last,
                              ltxn->base.last_len)))
    return rc;
  state.applied += ctx->applied;
  state.dead_letters += dead_letters;
  state.duplicates += ltxn->duplicates;
  return kl__lmdb_part_put(lmdb, mtxn, ltxn->topic, ltxn->partition, &state);
}

/* The write transaction; run again from the start after a map growth. */
static int commit_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *opaque,
                     kl_err_t *stop) {
  kl_commit_set_t *set = opaque;
  (void)stop;
  for (size_t i = 0; i < set->n; i++) {
    if (set->ctx[i].err == KL_ENOMEM)
      continue; /* its prepare failed: not in the write */
    set->ctx[i].err = KL_OK;
    int rc = commit_one(lmdb, mtxn, &set->ctx[i]);
    if (rc)
      return rc;
  }
  return 0;
}

/* Gives up the snapshot and lists the buffers in key order. */
static kl_err_t commit_prepare(kl_commit_ctx_t *ctx, kl_txn_t *txn,
                               int64_t watermark, int64_t now_ms) {
  kl_lmdb_txn_t *ltxn = (kl_lmdb_txn_t *)txn;
  /* The snapshot goes first: the write reads current state itself, and a
   * map growth during the write must not wait for our own snapshot. */
  ltxn_snap_end(ltxn);
  *ctx =
      (kl_commit_ctx_t){.ltxn = ltxn, .watermark = watermark, .now_ms = now_ms};
  if (kl__buf_sorted(&ltxn->data, &ctx->data) ||
      kl__buf_sorted(&ltxn->ids, &ctx->ids)) {
    ctx->err = kl__err(KL_ENOMEM, "kl_store_commit: out of memory");
    snprintf(ctx->why, sizeof(ctx->why), "%s", kl_err_detail());
    return ctx->err;
  }
  for (size_t i = 0; i < ltxn->ids.count; i++)
    ctx->applied += ctx->ids[i]->tag == KL_MARK_APPLIED;
  return KL_OK;
}

static void commit_free(kl_commit_ctx_t *ctx) {
  lmdb_txn_free(ctx->ltxn);
}

/* The shared write; when it fails for another reason than a fence, each
 * batch again in a write of its own, so that one batch fails only itself. */
static void commit_write(kl__lmdb_t *lmdb, kl_commit_set_t *set) {
  kl_err_t err = kl__lmdb_write(lmdb, "commit", commit_fn, set);
  if (err && set->n > 1) {
    for (size_t i = 0; i < set->n; i++) {
      kl_commit_set_t alone = {&set->ctx[i], 1};
      if (set->ctx[i].err != KL_ENOMEM)
        commit_write(lmdb, &alone);
    }
  } else if (err) {
    set->ctx[0].err = err;
    snprintf(set->ctx[0].why, sizeof(set->ctx[0].why), "%s", kl_err_detail());
  }
}

void kl__lmdb_commit_many(kl__store_commit_t *commits, size_t n) {
  kl__lmdb_t *lmdb = (kl__lmdb_t *)commits[0].txn->store;
  /* A worker commits up to a few lanes at once: their contexts on the
   * stack, more on the heap. */
  kl_commit_ctx_t few[KL_COMMIT_FEW];
  kl_commit_set_t set = {n <= KL_COMMIT_FEW ? few : calloc(n, sizeof(*set.ctx)),
                         n};
  if (!set.ctx) {
    for (size_t i = 0; i < n; i++) {
      commits[i].err = kl__err(KL_ENOMEM, "kl_store_commit: out of memory");
      snprintf(commits[i].why, sizeof(commits[i].why), "%s", kl_err_detail());
      kl__lmdb_abort(commits[i].txn);
    }
    return;
  }
  int64_t now_ms = kl__store_now_ms();
  size_t ready = 0;
  for (size_t i = 0; i < n; i++)
    ready += commit_prepare(&set.ctx[i], commits[i].txn, commits[i].watermark,
                            now_ms) == KL_OK;
  if (ready)
    commit_write(lmdb, &set);
  for (size_t i = 0; i < n; i++) {
    commits[i].err = set.ctx[i].err;
    snprintf(commits[i].why, sizeof(commits[i].why), "%s",
             set.ctx[i].err ? set.ctx[i].why : "");
    commit_free(&set.ctx[i]);
  }
  if (set.ctx != few)
    free(set.ctx);
}

kl_err_t kl__lmdb_commit(kl_txn_t *txn, int64_t watermark) {
  kl__store_commit_t commit = {txn, watermark, KL_OK, ""};
  kl__lmdb_commit_many(&commit, 1);
  if (commit.err) /* the detail of the caller's thread, as before */
    kl__err(commit.err, "%s", commit.why);
  return commit.err;
}
