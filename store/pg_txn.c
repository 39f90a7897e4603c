/*
 * A batch on the PostgreSQL store: one database transaction on one pooled
 * connection, from kl_store_begin() (BEGIN) to kl_store_commit() (COMMIT)
 * or kl_store_abort() (ROLLBACK). Handlers read through kl_txn_get() (the
 * owner cache first, cache.h) and may run their own statements on
 * kl_txn_pg_conn(); kl_txn_prefetch() looks a batch's idempotency keys up
 * in one statement; kl_txn_put/del/mark are buffered and written by the
 * commit, in one statement each, after the epoch check, all sent in ONE
 * libpq pipeline with the COMMIT (one network round trip):
 *
 *   WITH f AS (UPDATE keylane_partitions SET watermark = GREATEST(...),
 *     counters += ... WHERE topic = $t AND partition = $p AND epoch = $mine
 *     RETURNING epoch) SELECT 1 / count(*) FROM f
 *                       -- 0 rows: division_by_zero, the pipeline aborts
 *   INSERT INTO keylane_kv ... ON CONFLICT (key) DO UPDATE   -- the puts
 *   DELETE FROM keylane_kv WHERE key = ANY(...)              -- the dels
 *   INSERT INTO keylane_ids ... ON CONFLICT (topic, id) DO UPDATE -- marks
 *     ... WHERE the stored mark is not applied and not the new one
 *   INSERT INTO keylane_ids ...   -- the marks of ids the prefetch found
 *                                    absent: no conflict to resolve
 *   COMMIT
 *
 * A statement that fails in a pipeline makes the server skip the rest up
 * to the sync, COMMIT included, and leaves the transaction aborted: a
 * fenced batch writes nothing, as when the statements went one by one.
 *
 * Where the fence takes its lock. The conditional UPDATE is the check and
 * the row lock at once, taken at commit, not at begin:
 * - Correctness does not need it earlier. Everything the batch did, its
 *   handler's own SQL included, is in this one transaction, which commits
 *   only if the UPDATE matched the batch's epoch; otherwise it is rolled
 *   back and none of it was ever visible. The check and the COMMIT cannot be
 *   split by a new owner: kl_store_acquire()'s increment of the same row
 *   waits for our row lock, so either it committed first (our UPDATE then
 *   re-reads the row, finds the new epoch and matches nothing) or it runs
 *   after our COMMIT and the new owner reads our watermark.
 * - Liveness needs it late. Locking the row at begin would hold it for
 *   the whole batch, handlers included: a paused owner (SIGSTOP, a GC
 *   pause, a host cut off) would block the new owner's acquire for as long
 *   as it stays paused, i.e. the fence would wait for the zombie instead of
 *   rejecting it. Taken at commit, the lock lasts a few statements.
 * What a paused owner can still hold is the row locks of its handler's own
 * writes (the inventory example's UPDATE of a stock row): the new owner's
 * handler waits on them until the zombie's transaction ends. The server
 * ends it after store.pg.idle.timeout of idleness
 * (idle_in_transaction_session_timeout); the zombie's commit then fails
 * with KL_ESTORE_BUSY, its re-run is fenced, and nothing of it applied.
 *
 * Any isolation level keeps the fence: under REPEATABLE READ or
 * SERIALIZABLE the UPDATE of a row a new owner changed fails with a
 * serialization error (KL_ESTORE_BUSY), and the re-run is fenced.
 *
 * A lost connection fails the call with KL_ESTORE_BUSY and the connection
 * is dropped; the next begin connects anew. Before COMMIT nothing is
 * applied. When the link breaks during COMMIT the outcome is unknown to
 * us; re-running the batch is still safe, because a commit that did land
 * recorded the batch's idempotency keys (so its events are skipped as
 * duplicates) and the watermark never moves back.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "store/store_internal.h"
#include "store/pg.h"
#include "store/txn_buffer.h"

/* Tags of the data buffer: a put, a delete, and a put of a key the owner
 * cache knew was stored when it was made (the commit updates those). */
enum { KL_PG_PUT = 1, KL_PG_DEL = 2, KL_PG_PUT_STORED = 3, KL_PG_PUT_NEW = 4 };

#define KL_PG_OID_BYTEA 17u
#define KL_PG_OID_INT2 21u

typedef struct kl_pg_txn {
  kl_txn_t base;
  kl__pg_conn_t *conn;
  int32_t partition;
  uint64_t epoch;
  kl__buf_t data;        /* handler keys, tagged KL_PG_PUT/DEL/PUT_STORED/
                            PUT_NEW (known absent: inserted) */
  kl__buf_t olds;        /* of each PUT_STORED key, the value the owner
                            cache knew: its UPDATE holds only if the row
                            still has it (no other writer changed it) */
  kl__buf_t ids;         /* idempotency keys: tag = kl_mark_t */
  uint64_t duplicates;   /* kl_txn_count_duplicate() */
  PGresult *last;        /* holds the value the last kl_txn_get() lent */
  kl__buf_t known;       /* kl_txn_prefetch()'s answers: tag = kl_mark_t */
  kl__cache_seg_t *seg;  /* the partition's owner cache; NULL: none */
  uint64_t ticket;       /* kl__cache_ticket() before the snapshot */
  int lent;              /* kl_txn_pg_conn() was asked: no cache */
  int broken;            /* a pipeline failed: drop the connection */
  int pending;           /* begun ahead: pend's results not read yet */
  int64_t pend_ns;       /* when they were sent (kl__mono_ns()) */
  kl_err_t pend_err;     /* reading answers failed (begun ahead, a prefetch):
                            every later call fails */
  kl__pg_call_t pend[3]; /* BEGIN, the epoch, the ids (kl__store_begin_ahead) */
  unsigned char *vbuf;   /* the value the last cache hit lent */
  size_t vcap;
  unsigned char *obuf; /* kl__pg_put()'s copy of a cached value */
  size_t ocap;
  char topic[KL__TOPIC_MAX + 1];
} kl_pg_txn_t;

static kl__cache_t *pg_cache(const kl_pg_txn_t *txn) {
  return ((kl__pg_t *)txn->base.store)->cache;
}

/* ---- binary arrays, one parameter for a whole batch ------------------ */

/* PostgreSQL's binary array format: ndim, has-nulls, element type, then
 * per dimension its size and lower bound, then each element as a length
 * and its bytes, all big-endian. */
typedef struct kl_pg_arr {
  unsigned char *p;
  size_t len, cap;
  uint32_t n;
  int oom;
} kl_pg_arr_t;

static void pg_arr_bytes(kl_pg_arr_t *a, const void *b, size_t len) {
  if (a->oom)
    return;
  unsigned char *p = kl__reserve(a->p, &a->cap, a->len + len, 1, 1024);
  if (!p) {
    a->oom = 1;
    return;
  }
  a->p = p;
  if (len)
    memcpy(a->p + a->len, b, len);
  a->len += len;
}

static void pg_arr_u32(kl_pg_arr_t *a, uint32_t v) {
  unsigned char b[4];
  kl__put_be32(b, v);
  pg_arr_bytes(a, b, 4);
}

static void pg_arr_init(kl_pg_arr_t *a, uint32_t oid) {
  memset(a, 0, sizeof(*a));
  pg_arr_u32(a, 1);   /* ndim */
  pg_arr_u32(a, 0);   /* no NULLs */
  pg_arr_u32(a, oid); /* element type */
  pg_arr_u32(a, 0);   /* size: set by pg_arr_end() */
  pg_arr_u32(a, 1);   /* lower bound */
}

static void pg_arr_add(kl_pg_arr_t *a, const void *b, size_t len) {
  pg_arr_u32(a, (uint32_t)len);
  pg_arr_bytes(a, b, len);
  a->n++;
}

static void pg_arr_add_i16(kl_pg_arr_t *a, int v) {
  unsigned char b[2];
  kl__put_be(b, (unsigned)v, 2);
  pg_arr_add(a, b, 2);
}

/* Adds idempotency key @p sid in the form keylane_ids holds it
 * (kl__pg_id_out()). */
static void pg_arr_id(kl_pg_arr_t *a, const char *sid, size_t len) {
  char stored[KL__SID_MAX];
  pg_arr_add(a, stored, kl__pg_id_out(sid, len, stored));
}

/* @returns 0, or -1 when out of memory. */
static int pg_arr_end(kl_pg_arr_t *a) {
  if (a->oom)
    return -1;
  kl__put_be32(a->p + 12, a->n); /* the size */
  return 0;
}

/* ---- begin, abort ----------------------------------------------------- */

/* Frees a txn for good: kl__store_spare_give()'s drop. */
static void pg_txn_drop(kl_txn_t *base) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl__buf_clear(&txn->data);
  kl__buf_clear(&txn->olds);
  kl__buf_clear(&txn->ids);
  kl__buf_clear(&txn->known);
  free(txn->vbuf);
  free(txn->obuf);
  kl__txn_emits_free(&txn->base);
  free(txn);
}

/* Keeps the ended txn, its buffers emptied, for the store's next begin
 * (kl__store_spare_give()). */
static void pg_txn_free(kl_pg_txn_t *txn) {
  PQclear(txn->last);
  kl__buf_recycle(&txn->data);
  kl__buf_recycle(&txn->olds);
  kl__buf_recycle(&txn->ids);
  kl__buf_recycle(&txn->known);
  kl__txn_recycle(&txn->base);
  /* Everything but the buffers, vbuf and obuf starts over. */
  kl_pg_txn_t keep = {.base = txn->base,
                      .data = txn->data,
                      .olds = txn->olds,
                      .ids = txn->ids,
                      .known = txn->known,
                      .vbuf = txn->vbuf,
                      .vcap = txn->vcap,
                      .obuf = txn->obuf,
                      .ocap = txn->ocap};
  *txn = keep;
  kl__store_spare_give(txn->base.store, &txn->base, pg_txn_drop);
}

/* Ends the txn: rolls back what is open and gives the connection back
 * (dropping it when its link broke). */
static kl_err_t pg_settle(kl_pg_txn_t *txn);

/* A txn begun ahead reads its answers before anything else; once reading
 * answers failed (that, or a prefetch), every call on it fails the same
 * way. */
static kl_err_t pg_ready(kl_pg_txn_t *txn) {
  return txn->pending ? pg_settle(txn) : txn->pend_err;
}

static void pg_txn_end(kl_pg_txn_t *txn) {
  kl__pg_t *pgs = (kl__pg_t *)txn->base.store;
  if (txn->pending)
    (void)pg_settle(txn); /* reads what was sent; a failure breaks it */
  if (!txn->conn) {       /* dropped already (pg_landed()) */
    pg_txn_free(txn);
    return;
  }
  PGconn *pg = txn->conn->pg;
  PGTransactionStatusType st = PQtransactionStatus(pg);
  if (!txn->broken && PQstatus(pg) == CONNECTION_OK &&
      (st == PQTRANS_INTRANS || st == PQTRANS_INERROR))
    PQclear(PQexec(pg, "ROLLBACK"));
  kl__pg_conn_give(pgs, txn->conn,
                   txn->broken || PQstatus(pg) != CONNECTION_OK);
  pg_txn_free(txn);
}

/* The partition's current epoch as this txn sees it; 0 when unknown. */
static uint64_t pg_current_epoch(kl_pg_txn_t *txn) {
  char part[16];
  snprintf(part, sizeof(part), "%" PRId32, txn->partition);
  const char *values[2] = {txn->topic, part};
  kl_err_t err;
  PGresult *res =
      kl__pg_run(txn->conn, KL__PG_EPOCH, 2, values, NULL, NULL, 0, &err);
  uint64_t epoch = res && PQntuples(res) == 1
                       ? strtoull(PQgetvalue(res, 0, 0), NULL, 10)
                       : 0;
  PQclear(res);
  return epoch;
}

static kl_err_t pg_fenced(const kl_pg_txn_t *txn, uint64_t current) {
  return kl__err(KL_EFENCED,
                 "fenced partition=%" PRId32 " my_epoch=%" PRIu64
                 " current_epoch=%" PRIu64 " topic=%s: a newer owner holds "
                 "the partition; nothing of this batch was applied, its "
                 "handler's SQL included",
                 txn->partition, txn->epoch, current, txn->topic);
}

/* The two statements that start a batch: BEGIN and the partition's
 * current epoch (@p part receives the partition's number, which
 * calls[1] points to). */
static void pg_begin_calls(const kl_pg_txn_t *txn, char part[16],
                           kl__pg_call_t calls[2]) {
  snprintf(part, 16, "%" PRId32, txn->partition);
  memset(calls, 0, 2 * sizeof(*calls));
  calls[0].sql = "BEGIN ISOLATION LEVEL REPEATABLE READ";
  calls[0].what = "begin a batch";
  calls[1].stmt = KL__PG_EPOCH;
  calls[1].nparams = 2;
  calls[1].values[0] = txn->topic;
  calls[1].values[1] = part;
}

/* The @p n results of a pipeline that starts with pg_begin_calls():
 * @returns KL_OK with the current epoch in *@p current (0 when unknown),
 * or the first failure. */
static kl_err_t pg_begun(const kl_pg_txn_t *txn, const kl__pg_call_t *calls,
                         int n, uint64_t *current) {
  for (int i = 0; i < n; i++)
    if (!kl__pg_ok(calls[i].res))
      return kl__pg_err(txn->conn->pg, calls[i].res, calls[i].what);
  *current = PQntuples(calls[1].res) == 1
                 ? strtoull(PQgetvalue(calls[1].res, 0, 0), NULL, 10)
                 : 0;
  return KL_OK;
}

/* BEGIN and the partition's current epoch in one pipeline, one round
 * trip. @returns KL_OK or the first failure. */
static kl_err_t pg_begin_epoch(kl_pg_txn_t *txn, uint64_t *current) {
  char part[16];
  kl__pg_call_t calls[2];
  pg_begin_calls(txn, part, calls);
  kl_err_t err = kl__pg_pipeline(txn->conn, calls, 2);
  if (!err)
    err = pg_begun(txn, calls, 2, current);
  for (int i = 0; i < 2; i++)
    PQclear(calls[i].res);
  return err;
}

/* The batch's transaction on a pooled connection; a connection that lost
 * its link while idle in the pool is replaced once, since nothing ran on
 * it yet. */
static kl_err_t pg_txn_open(kl__pg_t *pgs, kl_pg_txn_t *txn,
                            uint64_t *current) {
  kl_err_t err = KL_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    if ((err = kl__pg_conn_take(pgs, &txn->conn)))
      return err;
    if (!(err = pg_begin_epoch(txn, current)))
      return KL_OK;
    int lost = PQstatus(txn->conn->pg) != CONNECTION_OK;
    kl__pg_conn_give(pgs, txn->conn, 1);
    txn->conn = NULL;
    if (!lost)
      break;
  }
  return err;
}

/* A txn without a connection yet, its cache ticket taken (before the
 * snapshot): a spare one of the store's, or a new one; NULL when memory
 * is short. */
static kl_pg_txn_t *pg_txn_new(kl_store_t *store, const char *topic,
                               int32_t partition, uint64_t epoch) {
  size_t tlen = strlen(topic);
  if (tlen > KL__TOPIC_MAX) /* kl_store_begin() and _begin_ahead() check */
    return NULL;
  kl_pg_txn_t *txn = (kl_pg_txn_t *)kl__store_spare_take(store);
  if (!txn) {
    if (!(txn = calloc(1, sizeof(*txn))))
      return NULL;
    txn->base.store = store;
    kl__buf_init(&txn->data);
    kl__buf_init(&txn->olds);
    kl__buf_init(&txn->ids);
    kl__buf_init(&txn->known);
  }
  memcpy(txn->topic, topic, tlen + 1);
  txn->partition = partition;
  txn->epoch = epoch;
  kl__cache_t *cache = ((kl__pg_t *)store)->cache;
  txn->seg = kl__cache_seg(cache, topic, partition);
  txn->ticket = kl__cache_ticket(cache, txn->seg);
  return txn;
}

/* The begin's epoch check: KL_EFENCED (the cache dropped) when @p current
 * is not the txn's epoch; else the cache is the epoch's. */
static kl_err_t pg_check_epoch(kl_pg_txn_t *txn, uint64_t current) {
  kl__cache_t *cache = pg_cache(txn);
  if (current != txn->epoch) {
    kl__cache_drop(cache, txn->seg);
    return pg_fenced(txn, current);
  }
  kl__cache_own(cache, txn->seg, txn->epoch);
  return KL_OK;
}

kl_err_t kl__pg_begin(kl_store_t *store, const char *topic, int32_t partition,
                      uint64_t epoch, kl_txn_t **out) {
  kl_pg_txn_t *txn = pg_txn_new(store, topic, partition, epoch);
  if (!txn)
    return KL_ENOMEM;
  /* The first statement takes the snapshot; it also fails fast, as the
   * LMDB store does: a batch that cannot commit need not run handlers. */
  uint64_t current = 0;
  kl_err_t err = pg_txn_open((kl__pg_t *)store, txn, &current);
  if (!err)
    err = pg_check_epoch(txn, current);
  if (err && txn->conn) {
    pg_txn_end(txn);
    return err;
  }
  if (err) {
    pg_txn_free(txn);
    return err;
  }
  *out = &txn->base;
  return KL_OK;
}

void kl__pg_abort(kl_txn_t *base) {
  pg_txn_end((kl_pg_txn_t *)base);
}

/* The handler's SQL may read and write keylane_kv inside this transaction,
 * which the cache cannot see: from here on the batch bypasses it. */
PGconn *kl__pg_conn(kl_txn_t *base) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  (void)pg_ready(txn); /* a failure fails the commit (pend_err) */
  txn->lent = 1;
  return txn->conn->pg;
}

int kl__pg_lost(kl_txn_t *base) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  return txn->broken || PQstatus(txn->conn->pg) != CONNECTION_OK;
}

kl_err_t kl__pg_savepoint(kl_txn_t *base, kl__savepoint_t what) {
  static const char *const sql[] = {
      [KL__SAVEPOINT_SET] = "SAVEPOINT kl_event",
      [KL__SAVEPOINT_RELEASE] = "RELEASE SAVEPOINT kl_event",
      [KL__SAVEPOINT_ROLLBACK] = "ROLLBACK TO SAVEPOINT kl_event",
  };
  if ((unsigned)what > KL__SAVEPOINT_ROLLBACK)
    return kl__err(KL_EINVAL, "kl__store_savepoint: what is %d", (int)what);
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_err_t err = pg_ready(txn);
  return err ? err
             : kl__pg_exec(txn->conn->pg, sql[what], "an event's savepoint");
}

/* ---- reads and buffered writes --------------------------------------- */

/* @returns 1 when the owner cache answered: *@p err is KL_OK (a value) or
 * KL_ENOTFOUND (known absent); 0 when it does not know @p key. */
static int pg_cache_answer(kl_pg_txn_t *txn, const void *key, size_t key_len,
                           const void **val, size_t *val_len, kl_err_t *err) {
  switch (kl__cache_get(pg_cache(txn), txn->seg, txn->epoch, txn->ticket, key,
                        key_len, &txn->vbuf, &txn->vcap, val_len)) {
  case KL__CACHE_HIT:
    *val = txn->vbuf ? (const void *)txn->vbuf : "";
    *err = KL_OK;
    return 1;
  case KL__CACHE_ABSENT:
    *err = KL_ENOTFOUND;
    return 1;
  default:
    return 0;
  }
}

kl_err_t kl__pg_get(kl_txn_t *base, const void *key, size_t key_len,
                    const void **val, size_t *val_len) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_err_t ready = pg_ready(txn);
  if (ready)
    return ready;
  const kl__buf_entry_t *entry = kl__buf_get(&txn->data, key, key_len);
  if (entry) {
    if (entry->tag == KL_PG_DEL)
      return KL_ENOTFOUND;
    *val = kl__buf_val(entry);
    *val_len = entry->val_len;
    return KL_OK;
  }
  kl_err_t err;
  if (!txn->lent && pg_cache_answer(txn, key, key_len, val, val_len, &err))
    return err;
  PQclear(txn->last);
  txn->last = NULL;
  const char *values[1] = {key};
  int lengths[1] = {(int)key_len}, formats[1] = {1};
  PGresult *res =
      kl__pg_run(txn->conn, KL__PG_GET, 1, values, lengths, formats, 1, &err);
  if (!res)
    return err;
  int found = PQntuples(res) == 1;
  if (!txn->lent)
    kl__cache_fill(pg_cache(txn), txn->seg, txn->epoch, txn->ticket, key,
                   key_len, found ? PQgetvalue(res, 0, 0) : NULL,
                   found ? (size_t)PQgetlength(res, 0, 0) : 0);
  if (!found) {
    PQclear(res);
    return KL_ENOTFOUND;
  }
  txn->last = res;
  *val = PQgetvalue(res, 0, 0);
  *val_len = (size_t)PQgetlength(res, 0, 0);
  return KL_OK;
}

kl_err_t kl__pg_put(kl_txn_t *base, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  size_t old_len = 0;
  kl__cache_answer_t known =
      txn->lent
          ? KL__CACHE_MISS
          : kl__cache_stored(pg_cache(txn), txn->seg, txn->epoch, txn->ticket,
                             key, key_len, &txn->obuf, &txn->ocap, &old_len);
  if (known == KL__CACHE_HIT &&
      kl__buf_set(&txn->olds, key, key_len, txn->obuf, old_len, 0))
    known = KL__CACHE_MISS;
  return kl__buf_set(&txn->data, key, key_len, val, val_len,
                     known == KL__CACHE_HIT      ? KL_PG_PUT_STORED
                     : known == KL__CACHE_ABSENT ? KL_PG_PUT_NEW
                                                 : KL_PG_PUT);
}

kl_err_t kl__pg_del(kl_txn_t *base, const void *key, size_t key_len) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  return kl__buf_set(&txn->data, key, key_len, NULL, 0, KL_PG_DEL);
}

kl_err_t kl__pg_seen(kl_txn_t *base, const char *id, size_t id_len,
                     kl_mark_t *mark) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_err_t ready = pg_ready(txn);
  if (ready)
    return ready;
  const kl__buf_entry_t *entry = kl__buf_get(&txn->ids, id, id_len);
  if (!entry)
    entry = kl__buf_get(&txn->known, id, id_len);
  if (entry) {
    *mark = (kl_mark_t)entry->tag;
    return KL_OK;
  }
  atomic_fetch_add(&((kl__pg_t *)base->store)->id_queries, 1);
  char stored[KL__SID_MAX];
  const char *values[2] = {stored, txn->topic};
  int lengths[2] = {(int)kl__pg_id_out(id, id_len, stored), 0},
      formats[2] = {1, 0};
  kl_err_t err;
  PGresult *res =
      kl__pg_run(txn->conn, KL__PG_SEEN, 2, values, lengths, formats, 0, &err);
  if (!res)
    return err;
  *mark = PQntuples(res) == 1 ? (kl_mark_t)atoi(PQgetvalue(res, 0, 0))
                              : KL_MARK_NONE;
  PQclear(res);
  return KL_OK;
}

kl_err_t kl__pg_mark(kl_txn_t *base, const char *id, size_t id_len,
                     kl_mark_t mark) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  return kl__store_buf_mark(&txn->ids, id, id_len, mark);
}

void kl__pg_count_duplicate(kl_txn_t *base) {
  ((kl_pg_txn_t *)base)->duplicates++;
}

/* ---- a batch's idempotency keys at once ------------------------------ */

/* The ids of @p ids the txn has neither marked nor looked up, as a binary
 * array in *@p arr (arr->n of them); each is recorded unseen, which the
 * lookup's rows then correct (pg_found()). @returns KL_OK or KL_ENOMEM
 * (arr->p is to be freed either way). */
static kl_err_t pg_ask(kl_pg_txn_t *txn, const char *const *ids,
                       const size_t *id_lens, size_t n, kl_pg_arr_t *arr) {
  pg_arr_init(arr, KL_PG_OID_BYTEA);
  for (size_t i = 0; i < n; i++)
    if (!kl__buf_get(&txn->ids, ids[i], id_lens[i]) &&
        !kl__buf_get(&txn->known, ids[i], id_lens[i])) {
      pg_arr_id(arr, ids[i], id_lens[i]);
      if (kl__buf_set(&txn->known, ids[i], id_lens[i], NULL, 0, KL_MARK_NONE))
        return KL_ENOMEM;
    }
  if (arr->n && pg_arr_end(arr))
    return KL_ENOMEM;
  atomic_fetch_add(&((kl__pg_t *)txn->base.store)->id_prefetched, arr->n);
  return KL_OK;
}

/* Records the marks of the ids the lookup @p res found. */
static kl_err_t pg_found(kl_pg_txn_t *txn, const PGresult *res) {
  char sid[KL__SID_MAX];
  for (int row = 0; row < PQntuples(res); row++)
    if (kl__buf_set(&txn->known, sid,
                    kl__pg_id_in(PQgetvalue(res, row, 0),
                                 (size_t)PQgetlength(res, row, 0), sid),
                    NULL, 0, (int)kl__get_be(PQgetvalue(res, row, 1), 2)))
      return KL_ENOMEM;
  return KL_OK;
}

/* The lookup of @p arr: KL__PG_SEEN_MANY with binary results. */
static void pg_seen_many_call(kl_pg_txn_t *txn, const kl_pg_arr_t *arr,
                              kl__pg_call_t *c) {
  memset(c, 0, sizeof(*c));
  c->stmt = KL__PG_SEEN_MANY;
  c->nparams = 2;
  c->values[0] = (const char *)arr->p;
  c->lengths[0] = (int)arr->len;
  c->formats[0] = 1;
  c->values[1] = txn->topic;
  c->binary = 1;
}

kl_err_t kl__pg_prefetch(kl_txn_t *base, const char *const *ids,
                         const size_t *id_lens, size_t n) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_err_t err = pg_ready(txn);
  kl_pg_arr_t arr = {0};
  if (!err)
    err = pg_ask(txn, ids, id_lens, n, &arr);
  if (!err && arr.n) {
    kl__pg_call_t c;
    pg_seen_many_call(txn, &arr, &c);
    PGresult *res = kl__pg_run(txn->conn, c.stmt, c.nparams, c.values,
                               c.lengths, c.formats, c.binary, &err);
    if (res)
      err = pg_found(txn, res);
    PQclear(res);
  }
  free(arr.p);
  /* The asked ids are recorded unseen before the answer: the txn must not
   * answer from them after a failure (kl_txn_prefetch(): abort it). */
  if (err && !txn->pend_err)
    txn->pend_err = err;
  return err;
}

/* ---- begun ahead: BEGIN, the epoch and the ids in one pipeline -------- */

kl_err_t kl__pg_begin_ahead(kl_store_t *store, const char *topic,
                            int32_t partition, uint64_t epoch,
                            const char *const *ids, const size_t *id_lens,
                            size_t n, kl_txn_t **out) {
  kl_pg_txn_t *txn = pg_txn_new(store, topic, partition, epoch);
  if (!txn)
    return KL_ENOMEM;
  kl_err_t err = kl__pg_conn_take_idle((kl__pg_t *)store, &txn->conn);
  if (err) {
    pg_txn_free(txn);
    return err;
  }
  kl_pg_arr_t arr;
  char part[16];
  kl__pg_call_t *c = txn->pend;
  pg_begin_calls(txn, part, c);
  err = pg_ask(txn, ids, id_lens, n, &arr);
  pg_seen_many_call(txn, &arr, &c[2]);
  /* libpq copies the parameters as it sends them. */
  if (!err && (err = kl__pg_pipeline_send(txn->conn, c, arr.n ? 3 : 2)))
    txn->broken = 1;
  free(arr.p);
  txn->pending = arr.n ? 3 : 2;
  txn->pend_ns = kl__mono_ns();
  if (err) {
    txn->pending = 0;
    pg_txn_end(txn);
    return err;
  }
  *out = &txn->base;
  return KL_OK;
}

/* Reads what kl__store_begin_ahead() sent: the txn is then as
 * kl_store_begin() and kl_txn_prefetch() would have left it, or failed as
 * they would have (KL_EFENCED, a kl__pg_err()). */
static kl_err_t pg_settle(kl_pg_txn_t *txn) {
  int n = txn->pending;
  txn->pending = 0;
  kl__pg_call_t *c = txn->pend;
  uint64_t current = 0;
  kl_err_t err = kl__pg_pipeline_collect(txn->conn, c, n);
  if (err)
    txn->broken = 1;
  if (!err)
    err = pg_begun(txn, c, n, &current);
  if (!err)
    err = pg_check_epoch(txn, current);
  if (!err && n == 3)
    err = pg_found(txn, c[2].res);
  for (int i = 0; i < n; i++) {
    PQclear(c[i].res);
    c[i].res = NULL;
  }
  return txn->pend_err = err;
}

/* How long a txn begun ahead may wait for its turn: its session sits idle
 * in a transaction meanwhile, which the server ends after
 * store.pg.idle.timeout. */
static int64_t pg_ahead_max_ns(const kl_pg_txn_t *txn) {
  int64_t idle_ms = ((kl__pg_t *)txn->base.store)->idle_timeout_ms;
  int64_t ms = idle_ms > 0 && idle_ms / 2 < KL__STORE_AHEAD_MAX_MS
                   ? idle_ms / 2
                   : KL__STORE_AHEAD_MAX_MS;
  return ms * 1000000;
}

static int pg_stale(const kl_pg_txn_t *txn) {
  return kl__mono_ns() - txn->pend_ns > pg_ahead_max_ns(txn);
}

kl_err_t kl__pg_settle(kl_txn_t *base) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  if (txn->pending && pg_stale(txn))
    return kl__err(KL_ESTORE_BUSY,
                   "postgresql: a batch begun ahead waited %" PRId64
                   " ms for its turn, more than %" PRId64 " ms",
                   (kl__mono_ns() - txn->pend_ns) / 1000000,
                   pg_ahead_max_ns(txn) / 1000000);
  return pg_ready(txn);
}

int kl__pg_pending(kl_txn_t *base) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  return txn->pending && !pg_stale(txn);
}

/* ---- commit: one pipeline -------------------------------------------- */

/* What the commit sends: the statements and the bytes they point to. */
typedef struct kl_pg_commit {
  kl__pg_call_t calls[9]; /* fence, update, insert, upsert, delete, ids
                             (known, new), outbox, COMMIT */
  int n;
  char *outbox; /* the outbox insert's parameters (pg_outbox.c) */
  kl_pg_arr_t keys, vals, stored_keys, stored_vals, stored_olds, new_keys,
      new_vals, dels, ids, marks, new_ids, new_marks;
  char part[16], wm[24], app[24], dup[24], dl[24], epoch[24], now[24],
      stored[24];
  char last[2 * KL__SID_MAX + 1]; /* hex of txn->last, or "" */
  char probe[KL__SID_MAX]; /* the first id known absent before the batch, */
  size_t probe_len;        /* stored (kl__pg_id_out()): pg_landed()'s proof;
                              0: none */
} kl_pg_commit_t;

static void pg_commit_free(kl_pg_commit_t *c) {
  for (int i = 0; i < c->n; i++)
    PQclear(c->calls[i].res);
  free(c->keys.p);
  free(c->vals.p);
  free(c->stored_keys.p);
  free(c->stored_vals.p);
  free(c->stored_olds.p);
  free(c->new_keys.p);
  free(c->new_vals.p);
  free(c->dels.p);
  free(c->ids.p);
  free(c->marks.p);
  free(c->new_ids.p);
  free(c->new_marks.p);
  free(c->outbox);
}

/* Adds prepared statement @p stmt with binary arrays @p arrs (up to three,
 * the first NULL ends them), then the text parameters @p text
 * (NULL-terminated). */
static int pg_add(kl_pg_commit_t *c, kl__pg_stmt_t stmt,
                  kl_pg_arr_t *const arrs[3], const char *const *text) {
  for (int i = 0; i < 3 && arrs[i]; i++)
    if (pg_arr_end(arrs[i]))
      return -1;
  kl__pg_call_t *call = &c->calls[c->n++];
  memset(call, 0, sizeof(*call));
  call->stmt = stmt;
  for (int i = 0; i < 3 && arrs[i]; i++) {
    call->values[call->nparams] = (const char *)arrs[i]->p;
    call->lengths[call->nparams] = (int)arrs[i]->len;
    call->formats[call->nparams++] = 1;
  }
  for (int i = 0; text && text[i]; i++)
    call->values[call->nparams++] = text[i];
  return 0;
}

/* Of the batch's @p dead dead-letter marks, takes away from @p *dead those
 * whose id is marked already: applied (the ids statement keeps them out),
 * or dead-lettered by a commit whose answer was lost and that ran again
 * (the rare path that reads before it writes, as LMDB's). */
static kl_err_t pg_dead_written(kl_pg_txn_t *txn, uint64_t *dead) {
  kl_pg_arr_t ids;
  pg_arr_init(&ids, KL_PG_OID_BYTEA);
  for (size_t i = 0; i < txn->ids.cap; i++) {
    const kl__buf_entry_t *e = txn->ids.slots ? txn->ids.slots[i] : NULL;
    if (e && e->tag == KL_MARK_DEAD_LETTER)
      pg_arr_id(&ids, kl__buf_key(e), e->key_len);
  }
  if (pg_arr_end(&ids)) {
    free(ids.p);
    return KL_ENOMEM;
  }
  const char *values[2] = {(char *)ids.p, txn->topic};
  int lengths[2] = {(int)ids.len, 0}, formats[2] = {1, 0};
  kl_err_t err;
  PGresult *res = kl__pg_run(txn->conn, KL__PG_APPLIED, 2, values, lengths,
                             formats, 0, &err);
  free(ids.p);
  if (!res)
    return err;
  uint64_t kept = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  *dead -= kept < *dead ? kept : *dead;
  return KL_OK;
}

/* The fence: the epoch check, the watermark and the counters in one
 * conditional UPDATE, which also takes the partition's row lock. */
static kl_err_t pg_add_fence(kl_pg_txn_t *txn, kl_pg_commit_t *c,
                             int64_t watermark) {
  uint64_t applied = 0, dead = 0;
  for (size_t i = 0; i < txn->ids.count; i++) {
    int tag = kl__buf_at(&txn->ids, i)->tag;
    applied += tag == KL_MARK_APPLIED;
    dead += tag == KL_MARK_DEAD_LETTER;
  }
  kl_err_t err = dead ? pg_dead_written(txn, &dead) : KL_OK;
  if (err)
    return err;
  snprintf(c->part, sizeof(c->part), "%" PRId32, txn->partition);
  snprintf(c->wm, sizeof(c->wm), "%" PRId64, watermark);
  snprintf(c->app, sizeof(c->app), "%" PRIu64, applied);
  snprintf(c->dup, sizeof(c->dup), "%" PRIu64, txn->duplicates);
  snprintf(c->dl, sizeof(c->dl), "%" PRIu64, dead);
  snprintf(c->epoch, sizeof(c->epoch), "%" PRIu64, txn->epoch);
  kl__hex_encode(txn->base.last, txn->base.last_len, c->last);
  c->last[2 * txn->base.last_len] = '\0';
  const char *text[] = {txn->topic, c->part,  c->wm,   c->app, c->dup,
                        c->dl,      c->epoch, c->last, NULL};
  pg_add(c, KL__PG_FENCE, (kl_pg_arr_t *const[3]){NULL}, text);
  return KL_OK;
}

/* The puts of keys known stored in one UPDATE, of keys known absent in one
 * INSERT (each fails when another writer changed the row since this owner
 * knew it), the other puts in one upsert and the deletes in one DELETE,
 * each in key order so that two commits touching the same keys lock them
 * in the same order. Once the handler's own SQL ran (txn->lent), which may
 * have written a row, every put is upserted. */
static kl_err_t pg_add_data(kl_pg_txn_t *txn, kl_pg_commit_t *c) {
  const kl__buf_entry_t *const *list;
  if (kl__buf_sorted(&txn->data, &list))
    return KL_ENOMEM;
  pg_arr_init(&c->keys, KL_PG_OID_BYTEA);
  pg_arr_init(&c->vals, KL_PG_OID_BYTEA);
  pg_arr_init(&c->stored_keys, KL_PG_OID_BYTEA);
  pg_arr_init(&c->stored_vals, KL_PG_OID_BYTEA);
  pg_arr_init(&c->stored_olds, KL_PG_OID_BYTEA);
  pg_arr_init(&c->new_keys, KL_PG_OID_BYTEA);
  pg_arr_init(&c->new_vals, KL_PG_OID_BYTEA);
  pg_arr_init(&c->dels, KL_PG_OID_BYTEA);
  for (size_t i = 0; i < txn->data.count; i++) {
    const kl__buf_entry_t *e = list[i];
    if (e->tag == KL_PG_DEL) {
      pg_arr_add(&c->dels, kl__buf_key(e), e->key_len);
      continue;
    }
    /* KL__MUTANT_UPDATE (test only): no condition, as before issue 39 */
    int checked = !txn->lent && !KL__MUTANT(KL__MUTANT_UPDATE);
    if (e->tag == KL_PG_PUT_NEW && checked) {
      pg_arr_add(&c->new_keys, kl__buf_key(e), e->key_len);
      pg_arr_add(&c->new_vals, kl__buf_val(e), e->val_len);
      continue;
    }
    const kl__buf_entry_t *old =
        e->tag == KL_PG_PUT_STORED && checked
            ? kl__buf_get(&txn->olds, kl__buf_key(e), e->key_len)
            : NULL;
    pg_arr_add(old ? &c->stored_keys : &c->keys, kl__buf_key(e), e->key_len);
    pg_arr_add(old ? &c->stored_vals : &c->vals, kl__buf_val(e), e->val_len);
    if (old)
      pg_arr_add(&c->stored_olds, kl__buf_val(old), old->val_len);
  }
  snprintf(c->stored, sizeof(c->stored), "%" PRIu32, c->stored_keys.n);
  const char *count[] = {c->stored, NULL};
  if ((c->stored_keys.n &&
       pg_add(c, KL__PG_UPDATE,
              (kl_pg_arr_t *const[3]){&c->stored_keys, &c->stored_vals,
                                      &c->stored_olds},
              count)) ||
      (c->new_keys.n &&
       pg_add(c, KL__PG_INSERT,
              (kl_pg_arr_t *const[3]){&c->new_keys, &c->new_vals, NULL},
              NULL)) ||
      (c->keys.n &&
       pg_add(c, KL__PG_UPSERT,
              (kl_pg_arr_t *const[3]){&c->keys, &c->vals, NULL}, NULL)) ||
      (c->dels.n &&
       pg_add(c, KL__PG_DELETE, (kl_pg_arr_t *const[3]){&c->dels, NULL, NULL},
              NULL)))
    return KL_ENOMEM;
  return KL_OK;
}

/* Whether @p id is one the batch's prefetch found absent, so that a plain
 * INSERT records it (KL__PG_IDS_NEW). Not once the handler's SQL ran: it
 * might have written keylane_ids itself. */
static int pg_id_new(const kl_pg_txn_t *txn, const kl__buf_entry_t *id) {
  if (txn->lent)
    return 0;
  const kl__buf_entry_t *known =
      kl__buf_get(&txn->known, kl__buf_key(id), id->key_len);
  return known && known->tag == KL_MARK_NONE;
}

/* The ids in key order, split: those known absent in one plain INSERT,
 * the rest in the upsert that keeps an applied mark. */
static kl_err_t pg_add_ids(kl_pg_txn_t *txn, kl_pg_commit_t *c) {
  const kl__buf_entry_t *const *list;
  if (kl__buf_sorted(&txn->ids, &list))
    return KL_ENOMEM;
  pg_arr_init(&c->ids, KL_PG_OID_BYTEA);
  pg_arr_init(&c->marks, KL_PG_OID_INT2);
  pg_arr_init(&c->new_ids, KL_PG_OID_BYTEA);
  pg_arr_init(&c->new_marks, KL_PG_OID_INT2);
  for (size_t i = 0; i < txn->ids.count; i++) {
    int fresh = pg_id_new(txn, list[i]);
    if (fresh && !c->probe_len)
      c->probe_len =
          kl__pg_id_out(kl__buf_key(list[i]), list[i]->key_len, c->probe);
    pg_arr_id(fresh ? &c->new_ids : &c->ids, kl__buf_key(list[i]),
              list[i]->key_len);
    pg_arr_add_i16(fresh ? &c->new_marks : &c->marks, list[i]->tag);
  }
  kl__pg_clock_param(c->now, sizeof(c->now));
  const char *text[] = {c->now, txn->topic, NULL};
  if ((c->ids.n &&
       pg_add(c, KL__PG_IDS, (kl_pg_arr_t *const[3]){&c->ids, &c->marks, NULL},
              text)) ||
      (c->new_ids.n &&
       pg_add(c, KL__PG_IDS_NEW,
              (kl_pg_arr_t *const[3]){&c->new_ids, &c->new_marks, NULL}, text)))
    return KL_ENOMEM;
  return KL_OK;
}

/*
 * The fence's UPDATE failed with a retriable error: under REPEATABLE READ
 * that is what an acquire committed since our snapshot looks like (a
 * serialization failure). Rolled back, the epoch is read afresh: moved, the
 * batch is fenced; unmoved, the error stands and the batch may be re-run.
 */
static kl_err_t pg_refence(kl_pg_txn_t *txn, kl_err_t err) {
  PGconn *pg = txn->conn->pg;
  if (PQstatus(pg) != CONNECTION_OK)
    return err;
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", kl_err_detail());
  PQclear(PQexec(pg, "ROLLBACK"));
  uint64_t current = pg_current_epoch(txn);
  if (current && current != txn->epoch)
    return pg_fenced(txn, current);
  return kl__err(err, "%s", detail);
}

/* A handler that ended the batch's transaction itself, or a statement that
 * failed and aborted it, leaves nothing to commit under the fence. */
static kl_err_t pg_check_open(kl_pg_txn_t *txn) {
  kl_err_t err = pg_ready(txn);
  if (err)
    return err;
  PGconn *pg = txn->conn->pg;
  switch (PQtransactionStatus(pg)) {
  case PQTRANS_INTRANS:
    return KL_OK;
  case PQTRANS_INERROR:
    return kl__err(KL_ESTORE,
                   "postgresql: the batch's transaction was aborted by a "
                   "failed statement (a handler's SQL, or a store call whose "
                   "error was ignored): nothing of it was applied");
  case PQTRANS_IDLE:
    return kl__err(KL_ESTORE,
                   "postgresql: the batch's transaction was ended before the "
                   "commit (a COMMIT or ROLLBACK on kl_txn_pg_conn()): what "
                   "the handler wrote before it escaped the fence; handlers "
                   "must run statements only");
  default:
    return kl__pg_err(pg, NULL, "commit a batch");
  }
}

/* An id the batch found absent was recorded since (KL__PG_IDS_NEW): as
 * retriable as the upsert's serialization failure in that case. */
static kl_err_t pg_id_taken(const kl_pg_txn_t *txn, const PGresult *res) {
  const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
  return kl__err(KL_ESTORE_BUSY,
                 "postgresql: record the batch's new idempotency keys of "
                 "topic %s, partition %" PRId32 ": %s: another transaction "
                 "recorded it since the batch looked it up (an id reused "
                 "by an event of another partition's key); nothing of the "
                 "batch was applied, and run again it finds the id a "
                 "duplicate",
                 txn->topic, txn->partition, detail ? detail : "an id");
}

/* A key the owner cache knew was stored had gone, or holds another value,
 * or one it knew absent was written, by the commit: only a writer outside
 * the partition's fence changes it.
 * The owner cache trusts that it is the only writer of its keys; this is
 * where it finds out that it was not, before its stale value is written
 * over the other writer's. The failed commit drops the cache, so the
 * batch, run again, reads the key afresh. */
static kl_err_t pg_key_gone(const kl_pg_txn_t *txn) {
  return kl__err(KL_ESTORE_BUSY,
                 "postgresql: write the batch's handler keys of topic %s, "
                 "partition %" PRId32 ": a key this owner had read or "
                 "written was changed, deleted or written since by another "
                 "writer (a "
                 "handler of another partition or topic, or SQL outside "
                 "keylane, writing this partition's keys); nothing of the "
                 "batch was applied, and run again it reads the key afresh",
                 txn->topic, txn->partition);
}

/* The outcome of the pipeline's results: the first failure, read as a
 * fence when it is the fence's; a COMMIT the server turned into a
 * rollback is a failure too. */
static kl_err_t pg_outcome(kl_pg_txn_t *txn, kl_pg_commit_t *c) {
  for (int i = 0; i < c->n; i++) {
    const PGresult *res = c->calls[i].res;
    if (kl__pg_ok(res))
      continue;
    if (PQresultStatus(res) == PGRES_PIPELINE_ABORTED)
      continue; /* skipped after the failure that explains it */
    if (i == 0 && strcmp(kl__pg_state(res), KL__PG_FENCED_STATE) == 0) {
      PQclear(PQexec(txn->conn->pg, "ROLLBACK"));
      return pg_fenced(txn, pg_current_epoch(txn));
    }
    if (!c->calls[i].sql && c->calls[i].stmt == KL__PG_IDS_NEW &&
        strcmp(kl__pg_state(res), KL__PG_ID_TAKEN_STATE) == 0)
      return pg_id_taken(txn, res);
    if (!c->calls[i].sql &&
        ((c->calls[i].stmt == KL__PG_UPDATE &&
          strcmp(kl__pg_state(res), KL__PG_KEY_GONE_STATE) == 0) ||
         (c->calls[i].stmt == KL__PG_INSERT &&
          strcmp(kl__pg_state(res), KL__PG_KEY_TAKEN_STATE) == 0)))
      return pg_key_gone(txn);
    kl_err_t err = kl__pg_err(txn->conn->pg, res, c->calls[i].what);
    return i == 0 && err == KL_ESTORE_BUSY ? pg_refence(txn, err) : err;
  }
  const char *status = PQcmdStatus(c->calls[c->n - 1].res);
  if (strcmp(status, "COMMIT") != 0)
    return kl__err(KL_ESTORE,
                   "postgresql: commit a batch: the server rolled it back "
                   "(%s)",
                   status);
  return KL_OK;
}

/* Builds the batch's statements and COMMIT into @p c and sends them in
 * one pipeline. */
static kl_err_t pg_commit_send(kl_pg_txn_t *txn, int64_t watermark,
                               kl_pg_commit_t *c) {
  kl_err_t err = pg_check_open(txn);
  if (!err)
    err = pg_add_fence(txn, c, watermark);
  if (!err && txn->data.count)
    err = pg_add_data(txn, c);
  if (!err && txn->ids.count)
    err = pg_add_ids(txn, c);
  if (!err && txn->base.emits) /* after the fence: pg_outbox.c */
    err = kl__pg_outbox_add(&c->calls[c->n++], &c->outbox, txn->topic,
                            txn->partition, txn->base.emits);
  if (!err) {
    kl__pg_call_t *commit = &c->calls[c->n++];
    memset(commit, 0, sizeof(*commit));
    commit->sql = "COMMIT";
    commit->what = "commit a batch";
    if ((err = kl__pg_pipeline_send(txn->conn, c->calls, c->n)))
      txn->broken = 1;
  }
  return err;
}

/* How long a commit whose answer was lost asks the server for its outcome
 * (pg_landed()): a restarted server's recovery, with room. One group
 * commit's lanes share it, so that an outage blocks it once, not per lane. */
#define KL_PG_LANDED_MS 5000

static int64_t pg_landed_end(void) {
  return kl__mono_ns() + KL_PG_LANDED_MS * 1000000LL;
}

typedef struct kl_pg_probe {
  const kl_pg_txn_t *txn;
  const kl_pg_commit_t *c;
  int committed;
} kl_pg_probe_t;

static kl_err_t pg_probe_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_probe_t *x = ctx;
  const char *values[4] = {x->txn->topic, x->c->part, x->c->epoch, x->c->probe};
  int lengths[4] = {0, 0, 0, (int)x->c->probe_len};
  int formats[4] = {0, 0, 0, 1};
  PGresult *res = PQexecParams(
      conn->pg,
      "SELECT coalesce((SELECT epoch FROM keylane_partitions WHERE topic = "
      "$1::text AND partition = $2::int4) = $3::int8 AND EXISTS (SELECT 1 "
      "FROM keylane_ids WHERE topic = $1::text AND id = $4::bytea), false)",
      4, NULL, values, lengths, formats, 0);
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res) || PQntuples(res) != 1)
    err = kl__pg_err(conn->pg, res, "read a batch's outcome");
  else
    x->committed = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
  PQclear(res);
  return err;
}

/*
 * The link broke after the batch's COMMIT was sent: the server may have
 * committed it and only the answer be lost (a restart, even an immediate
 * one, keeps a committed batch). Re-run, its events would then be
 * duplicates of themselves. The batch's own rows tell, read on another
 * connection, again while the server is unreachable (until @p end,
 * kl__mono_ns()): it committed when the partition still has its epoch (no
 * other owner wrote since) and an id it recorded, one that was absent
 * before it, is there. (Not the transaction's id and txid_status(): a
 * server that crashed hands out again the ids of transactions whose
 * records it had not flushed.) A batch with no such id is not asked
 * for: it is run again. The batch's connection, lost, is dropped first:
 * the question needs a connection of the pool, and with store.pg.pool=1
 * it held the only one. @returns KL_OK when the batch committed, else
 * @p err with its message.
 */
static kl_err_t pg_landed(kl_pg_txn_t *txn, const kl_pg_commit_t *c,
                          kl_err_t err, int64_t end) {
  kl__pg_t *pgs = (kl__pg_t *)txn->base.store;
  char detail[1024];
  snprintf(detail, sizeof(detail), "%s", kl_err_detail());
  kl__pg_conn_give(pgs, txn->conn, 1);
  txn->conn = NULL;
  kl_pg_probe_t x = {txn, c, 0};
  for (int64_t ms = 100; c->probe_len; ms *= 2) {
    kl_err_t asked = kl__pg_call(pgs, pg_probe_fn, &x);
    int64_t left = (end - kl__mono_ns()) / 1000000;
    if (asked != KL_ESTORE_BUSY || left <= 0)
      break;
    ms = ms < left ? ms : left; /* never past @p end */
    kl__sleep_ms(ms);
  }
  return x.committed ? KL_OK : kl__err(err, "%s", detail);
}

/* The outcome of what pg_commit_send() sent; a lost link's is asked
 * for (pg_landed()). */
static kl_err_t pg_commit_collect(kl_pg_txn_t *txn, kl_pg_commit_t *c,
                                  int64_t landed_end) {
  kl_err_t err = kl__pg_pipeline_collect(txn->conn, c->calls, c->n);
  if (err)
    txn->broken = 1;
  if (!err)
    err = pg_outcome(txn, c);
  if (err && err != KL_EFENCED && kl__pg_lost(&txn->base))
    err = pg_landed(txn, c, err, landed_end);
  return err;
}

/* The cache learns the outcome: written through when committed (unless
 * the handler's SQL ran, which the cache cannot follow), else dropped.
 * Then the txn ends: rolled back unless the COMMIT went through. */
static kl_err_t pg_commit_end(kl_pg_txn_t *txn, uint64_t start, kl_err_t err) {
  kl__cache_commit_end(pg_cache(txn), txn->seg, txn->epoch, start,
                       !err && !txn->lent, &txn->data, KL_PG_DEL);
  pg_txn_end(txn);
  return err;
}

/* Counts a commit of @p batches begun at @p t0 (kl__mono_ns()). */
static void pg_commit_counted(kl_store_t *store, size_t batches, int64_t t0) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  atomic_fetch_add(&pgs->commits, 1);
  atomic_fetch_add(&pgs->commit_batches, batches);
  atomic_fetch_add(&pgs->commit_ns, (uint64_t)(kl__mono_ns() - t0));
}

static kl_err_t pg_commit_one(kl_txn_t *base, int64_t watermark) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_pg_commit_t c;
  memset(&c, 0, sizeof(c));
  uint64_t start = kl__cache_commit_start(pg_cache(txn), txn->seg);
  kl_err_t err = pg_commit_send(txn, watermark, &c);
  if (!err)
    err = pg_commit_collect(txn, &c, pg_landed_end());
  pg_commit_free(&c);
  return pg_commit_end(txn, start, err);
}

kl_err_t kl__pg_commit(kl_txn_t *base, int64_t watermark) {
  kl_store_t *store = base->store;
  int64_t t0 = kl__mono_ns();
  kl_err_t err = pg_commit_one(base, watermark);
  pg_commit_counted(store, 1, t0);
  return err;
}

static void pg_commit_failed(kl__store_commit_t *commit, kl_err_t err) {
  commit->err = err;
  snprintf(commit->why, sizeof(commit->why), "%s", err ? kl_err_detail() : "");
}

/* Several lanes' batches, each on its own connection and under its own
 * fence: every pipeline is sent before any is read, so that together they
 * cost one round trip (and the server's fsyncs overlap). */
void kl__pg_commit_many(kl__store_commit_t *commits, size_t n) {
  kl_store_t *store = n ? commits[0].txn->store : NULL;
  int64_t t0 = kl__mono_ns();
  kl_pg_commit_t *c = calloc(n, sizeof(*c));
  uint64_t *start = calloc(n, sizeof(*start));
  for (size_t i = 0; (!c || !start) && i < n; i++) /* no memory: in turn */
    pg_commit_failed(&commits[i],
                     pg_commit_one(commits[i].txn, commits[i].watermark));
  for (size_t i = 0; c && start && i < n; i++) {
    kl_pg_txn_t *txn = (kl_pg_txn_t *)commits[i].txn;
    start[i] = kl__cache_commit_start(pg_cache(txn), txn->seg);
    pg_commit_failed(&commits[i],
                     pg_commit_send(txn, commits[i].watermark, &c[i]));
  }
  int64_t end = pg_landed_end();
  for (size_t i = 0; c && start && i < n; i++)
    if (!commits[i].err)
      pg_commit_failed(
          &commits[i],
          pg_commit_collect((kl_pg_txn_t *)commits[i].txn, &c[i], end));
  for (size_t i = 0; c && start && i < n; i++) {
    pg_commit_free(&c[i]);
    pg_commit_end((kl_pg_txn_t *)commits[i].txn, start[i], commits[i].err);
  }
  free(c);
  free(start);
  if (store)
    pg_commit_counted(store, n, t0);
}
