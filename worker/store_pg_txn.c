/*
 * A batch on the PostgreSQL store: one database transaction on one pooled
 * connection, from kl_store_begin() (BEGIN) to kl_store_commit() (COMMIT)
 * or kl_store_abort() (ROLLBACK). Handlers read through kl_txn_get() and
 * may run their own statements on kl_txn_pg_conn(); kl_txn_put/del/mark
 * are buffered and written by the commit, in one statement each, after the
 * epoch check:
 *
 *   UPDATE keylane_partitions SET watermark = GREATEST(watermark, $new),
 *     counters += ... WHERE topic = $t AND partition = $p AND epoch = $mine
 *     RETURNING epoch                         -- 0 rows: fenced, ROLLBACK
 *   INSERT INTO keylane_kv ... ON CONFLICT (key) DO UPDATE   -- the puts
 *   DELETE FROM keylane_kv WHERE key = ANY(...)              -- the dels
 *   INSERT INTO keylane_ids ... ON CONFLICT (topic, id) DO UPDATE -- marks
 *     ... WHERE the stored mark is a dead letter and the new one applied
 *   COMMIT
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "worker/store_internal.h"
#include "worker/store_pg.h"
#include "worker/txn_buffer.h"

enum { KL_PG_PUT = 1, KL_PG_DEL = 2 }; /* tags of the data buffer */

#define KL_PG_OID_BYTEA 17u
#define KL_PG_OID_INT2 21u

typedef struct kl_pg_txn {
  kl_txn_t base;
  kl__pg_conn_t *conn;
  char *topic;
  int32_t partition;
  uint64_t epoch;
  kl__buf_t data;      /* handler keys: KL_PG_PUT or KL_PG_DEL */
  kl__buf_t ids;       /* idempotency keys: tag = kl_mark_t */
  uint64_t duplicates; /* kl_txn_count_duplicate() */
  PGresult *last;      /* holds the value the last kl_txn_get() lent */
} kl_pg_txn_t;

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

static void kl_pg_arr_bytes(kl_pg_arr_t *a, const void *b, size_t len) {
  if (a->oom)
    return;
  if (a->len + len > a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 1024;
    while (cap < a->len + len)
      cap *= 2;
    unsigned char *p = realloc(a->p, cap);
    if (!p) {
      a->oom = 1;
      return;
    }
    a->p = p;
    a->cap = cap;
  }
  if (len)
    memcpy(a->p + a->len, b, len);
  a->len += len;
}

static void kl_pg_arr_u32(kl_pg_arr_t *a, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 8), (unsigned char)v};
  kl_pg_arr_bytes(a, b, 4);
}

static void kl_pg_arr_init(kl_pg_arr_t *a, uint32_t oid) {
  memset(a, 0, sizeof(*a));
  kl_pg_arr_u32(a, 1);   /* ndim */
  kl_pg_arr_u32(a, 0);   /* no NULLs */
  kl_pg_arr_u32(a, oid); /* element type */
  kl_pg_arr_u32(a, 0);   /* size: set by kl_pg_arr_end() */
  kl_pg_arr_u32(a, 1);   /* lower bound */
}

static void kl_pg_arr_add(kl_pg_arr_t *a, const void *b, size_t len) {
  kl_pg_arr_u32(a, (uint32_t)len);
  kl_pg_arr_bytes(a, b, len);
  a->n++;
}

static void kl_pg_arr_add_i16(kl_pg_arr_t *a, int v) {
  unsigned char b[2] = {(unsigned char)((unsigned)v >> 8), (unsigned char)v};
  kl_pg_arr_add(a, b, 2);
}

/* @returns 0, or -1 when out of memory. */
static int kl_pg_arr_end(kl_pg_arr_t *a) {
  if (a->oom)
    return -1;
  uint32_t n = a->n;
  unsigned char *size = a->p + 12;
  size[0] = (unsigned char)(n >> 24);
  size[1] = (unsigned char)(n >> 16);
  size[2] = (unsigned char)(n >> 8);
  size[3] = (unsigned char)n;
  return 0;
}

/* ---- begin, abort ----------------------------------------------------- */

static void kl_pg_txn_free(kl_pg_txn_t *txn) {
  PQclear(txn->last);
  kl__buf_clear(&txn->data);
  kl__buf_clear(&txn->ids);
  free(txn->topic);
  free(txn);
}

/* Ends the txn: rolls back what is open and gives the connection back
 * (dropping it when its link broke). */
static void kl_pg_txn_end(kl_pg_txn_t *txn) {
  kl__pg_t *pgs = (kl__pg_t *)txn->base.store;
  PGconn *pg = txn->conn->pg;
  PGTransactionStatusType st = PQtransactionStatus(pg);
  if (PQstatus(pg) == CONNECTION_OK &&
      (st == PQTRANS_INTRANS || st == PQTRANS_INERROR))
    PQclear(PQexec(pg, "ROLLBACK"));
  kl__pg_conn_give(pgs, txn->conn, PQstatus(pg) != CONNECTION_OK);
  kl_pg_txn_free(txn);
}

/* The partition's current epoch as this txn sees it; 0 when unknown. */
static uint64_t kl_pg_current_epoch(kl_pg_txn_t *txn) {
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

static kl_err_t kl_pg_fenced(const kl_pg_txn_t *txn, uint64_t current) {
  return kl__err(KL_EFENCED,
                 "fenced partition=%" PRId32 " my_epoch=%" PRIu64
                 " current_epoch=%" PRIu64 " topic=%s: a newer owner holds "
                 "the partition; nothing of this batch was applied, its "
                 "handler's SQL included",
                 txn->partition, txn->epoch, current, txn->topic);
}

/* BEGIN on a pooled connection; a connection that lost its link while
 * idle in the pool is replaced once, since nothing ran on it yet. */
static kl_err_t kl_pg_txn_open(kl__pg_t *pgs, kl_pg_txn_t *txn) {
  kl_err_t err = KL_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    if ((err = kl__pg_conn_take(pgs, &txn->conn)))
      return err;
    if (!(err = kl__pg_exec(txn->conn->pg,
                            "BEGIN ISOLATION LEVEL REPEATABLE READ",
                            "begin a batch")))
      return KL_OK;
    int lost = PQstatus(txn->conn->pg) != CONNECTION_OK;
    kl__pg_conn_give(pgs, txn->conn, 1);
    txn->conn = NULL;
    if (!lost)
      break;
  }
  return err;
}

kl_err_t kl__pg_begin(kl_store_t *store, const char *topic, int32_t partition,
                      uint64_t epoch, kl_txn_t **out) {
  kl_pg_txn_t *txn = calloc(1, sizeof(*txn));
  if (!txn || !(txn->topic = strdup(topic))) {
    free(txn);
    return KL_ENOMEM;
  }
  txn->base.store = store;
  txn->partition = partition;
  txn->epoch = epoch;
  kl__buf_init(&txn->data);
  kl__buf_init(&txn->ids);
  /* The first statement takes the snapshot; it also fails fast, as the
   * LMDB store does: a batch that cannot commit need not run handlers. */
  kl_err_t err = kl_pg_txn_open((kl__pg_t *)store, txn);
  uint64_t current = err ? 0 : kl_pg_current_epoch(txn);
  if (!err && current != epoch)
    err = PQtransactionStatus(txn->conn->pg) == PQTRANS_INTRANS
              ? kl_pg_fenced(txn, current)
              : kl__pg_err(txn->conn->pg, NULL, "begin a batch");
  if (err && txn->conn) {
    kl_pg_txn_end(txn);
    return err;
  }
  if (err) {
    kl_pg_txn_free(txn);
    return err;
  }
  *out = &txn->base;
  return KL_OK;
}

void kl__pg_abort(kl_txn_t *base) {
  kl_pg_txn_end((kl_pg_txn_t *)base);
}

void *kl__pg_conn(kl_txn_t *base) {
  return ((kl_pg_txn_t *)base)->conn->pg;
}

kl_err_t kl__store_savepoint(kl_txn_t *base, kl__savepoint_t what) {
  static const char *const sql[] = {
      [KL__SAVEPOINT_SET] = "SAVEPOINT kl_event",
      [KL__SAVEPOINT_RELEASE] = "RELEASE SAVEPOINT kl_event",
      [KL__SAVEPOINT_ROLLBACK] = "ROLLBACK TO SAVEPOINT kl_event",
  };
  if (!base || base->store->ops != &kl__pg_ops)
    return KL_OK;
  if ((unsigned)what > KL__SAVEPOINT_ROLLBACK)
    return kl__err(KL_EINVAL, "kl__store_savepoint: what is %d", (int)what);
  return kl__pg_exec(((kl_pg_txn_t *)base)->conn->pg, sql[what],
                     "an event's savepoint");
}

/* ---- reads and buffered writes --------------------------------------- */

kl_err_t kl__pg_get(kl_txn_t *base, const void *key, size_t key_len,
                    const void **val, size_t *val_len) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  const kl__buf_entry_t *entry = kl__buf_get(&txn->data, key, key_len);
  if (entry) {
    if (entry->tag == KL_PG_DEL)
      return KL_ENOTFOUND;
    *val = kl__buf_val(entry);
    *val_len = entry->val_len;
    return KL_OK;
  }
  PQclear(txn->last);
  txn->last = NULL;
  const char *values[1] = {key};
  int lengths[1] = {(int)key_len}, formats[1] = {1};
  kl_err_t err;
  PGresult *res =
      kl__pg_run(txn->conn, KL__PG_GET, 1, values, lengths, formats, 1, &err);
  if (!res)
    return err;
  if (PQntuples(res) != 1) {
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
  return kl__buf_set(&txn->data, key, key_len, val, val_len, KL_PG_PUT);
}

kl_err_t kl__pg_del(kl_txn_t *base, const void *key, size_t key_len) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  return kl__buf_set(&txn->data, key, key_len, NULL, 0, KL_PG_DEL);
}

kl_err_t kl__pg_seen(kl_txn_t *base, const char *id, size_t id_len,
                     kl_mark_t *mark) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  const kl__buf_entry_t *entry = kl__buf_get(&txn->ids, id, id_len);
  if (entry) {
    *mark = (kl_mark_t)entry->tag;
    return KL_OK;
  }
  const char *values[2] = {id, txn->topic};
  int lengths[2] = {(int)id_len, 0}, formats[2] = {1, 0};
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

/* ---- commit ----------------------------------------------------------- */

/* The statement of @p stmt with one or two binary array parameters, then
 * up to two text ones (@p extra, @p extra2). */
static kl_err_t kl_pg_run_arrays(kl_pg_txn_t *txn, kl__pg_stmt_t stmt,
                                 kl_pg_arr_t *a, kl_pg_arr_t *b,
                                 const char *extra, const char *extra2) {
  if (kl_pg_arr_end(a) || (b && kl_pg_arr_end(b)))
    return KL_ENOMEM;
  const char *values[4] = {(char *)a->p, b ? (char *)b->p : NULL, extra,
                           extra2};
  int lengths[4] = {(int)a->len, b ? (int)b->len : 0, 0, 0};
  int formats[4] = {1, 1, 0, 0};
  int n = !b ? 1 : !extra ? 2 : !extra2 ? 3 : 4;
  kl_err_t err;
  PGresult *res =
      kl__pg_run(txn->conn, stmt, n, values, lengths, formats, 0, &err);
  PQclear(res);
  return res ? KL_OK : err;
}

/* The puts in one upsert and the deletes in one DELETE, in key order so
 * that two commits touching the same keys lock them in the same order. */
static kl_err_t kl_pg_write_data(kl_pg_txn_t *txn) {
  const kl__buf_entry_t **list;
  if (kl__buf_sorted(&txn->data, &list))
    return KL_ENOMEM;
  kl_pg_arr_t keys, vals, dels;
  kl_pg_arr_init(&keys, KL_PG_OID_BYTEA);
  kl_pg_arr_init(&vals, KL_PG_OID_BYTEA);
  kl_pg_arr_init(&dels, KL_PG_OID_BYTEA);
  for (size_t i = 0; i < txn->data.count; i++) {
    const kl__buf_entry_t *e = list[i];
    if (e->tag == KL_PG_DEL) {
      kl_pg_arr_add(&dels, kl__buf_key(e), e->key_len);
    } else {
      kl_pg_arr_add(&keys, kl__buf_key(e), e->key_len);
      kl_pg_arr_add(&vals, kl__buf_val(e), e->val_len);
    }
  }
  free(list);
  kl_err_t err = KL_OK;
  if (keys.n)
    err = kl_pg_run_arrays(txn, KL__PG_UPSERT, &keys, &vals, NULL, NULL);
  if (!err && dels.n)
    err = kl_pg_run_arrays(txn, KL__PG_DELETE, &dels, NULL, NULL, NULL);
  free(keys.p);
  free(vals.p);
  free(dels.p);
  return err;
}

static kl_err_t kl_pg_write_ids(kl_pg_txn_t *txn) {
  const kl__buf_entry_t **list;
  if (kl__buf_sorted(&txn->ids, &list))
    return KL_ENOMEM;
  kl_pg_arr_t ids, marks;
  kl_pg_arr_init(&ids, KL_PG_OID_BYTEA);
  kl_pg_arr_init(&marks, KL_PG_OID_INT2);
  for (size_t i = 0; i < txn->ids.count; i++) {
    kl_pg_arr_add(&ids, kl__buf_key(list[i]), list[i]->key_len);
    kl_pg_arr_add_i16(&marks, list[i]->tag);
  }
  free(list);
  char now[24];
  kl__pg_clock_param(now, sizeof(now));
  kl_err_t err = kl_pg_run_arrays(txn, KL__PG_IDS, &ids, &marks, now,
                                  txn->topic);
  free(ids.p);
  free(marks.p);
  return err;
}

/* Of the batch's @p dead dead-letter marks, takes away from @p *dead those
 * whose id is applied already: kl_pg_write_ids() keeps them out (the rare
 * path that reads before it writes, as LMDB's). */
static kl_err_t kl_pg_dead_written(kl_pg_txn_t *txn, uint64_t *dead) {
  kl_pg_arr_t ids;
  kl_pg_arr_init(&ids, KL_PG_OID_BYTEA);
  for (size_t i = 0; i < txn->ids.cap; i++) {
    const kl__buf_entry_t *e = txn->ids.slots ? txn->ids.slots[i] : NULL;
    if (e && e->tag == KL_MARK_DEAD_LETTER)
      kl_pg_arr_add(&ids, kl__buf_key(e), e->key_len);
  }
  if (kl_pg_arr_end(&ids)) {
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
static kl_err_t kl_pg_fence(kl_pg_txn_t *txn, int64_t watermark) {
  uint64_t applied = 0, dead = 0;
  for (size_t i = 0; i < txn->ids.cap; i++) {
    const kl__buf_entry_t *e = txn->ids.slots ? txn->ids.slots[i] : NULL;
    applied += e && e->tag == KL_MARK_APPLIED;
    dead += e && e->tag == KL_MARK_DEAD_LETTER;
  }
  kl_err_t derr = dead ? kl_pg_dead_written(txn, &dead) : KL_OK;
  if (derr)
    return derr;
  char part[16], wm[24], app[24], dup[24], dl[24], epoch[24];
  snprintf(part, sizeof(part), "%" PRId32, txn->partition);
  snprintf(wm, sizeof(wm), "%" PRId64, watermark);
  snprintf(app, sizeof(app), "%" PRIu64, applied);
  snprintf(dup, sizeof(dup), "%" PRIu64, txn->duplicates);
  snprintf(dl, sizeof(dl), "%" PRIu64, dead);
  snprintf(epoch, sizeof(epoch), "%" PRIu64, txn->epoch);
  const char *values[7] = {txn->topic, part, wm, app, dup, dl, epoch};
  kl_err_t err;
  PGresult *res =
      kl__pg_run(txn->conn, KL__PG_FENCE, 7, values, NULL, NULL, 0, &err);
  if (!res)
    return err;
  int matched = PQntuples(res) == 1;
  PQclear(res);
  return matched ? KL_OK : kl_pg_fenced(txn, kl_pg_current_epoch(txn));
}

/*
 * The fence's UPDATE failed with a retriable error: under REPEATABLE READ
 * that is what an acquire committed since our snapshot looks like (a
 * serialization failure). Rolled back, the epoch is read afresh: moved, the
 * batch is fenced; unmoved, the error stands and the batch may be re-run.
 */
static kl_err_t kl_pg_refence(kl_pg_txn_t *txn, kl_err_t err) {
  PGconn *pg = txn->conn->pg;
  if (PQstatus(pg) != CONNECTION_OK)
    return err;
  char detail[512];
  snprintf(detail, sizeof(detail), "%s", kl_err_detail());
  PQclear(PQexec(pg, "ROLLBACK"));
  uint64_t current = kl_pg_current_epoch(txn);
  if (current && current != txn->epoch)
    return kl_pg_fenced(txn, current);
  return kl__err(err, "%s", detail);
}

/* A handler that ended the batch's transaction itself, or a statement that
 * failed and aborted it, leaves nothing to commit under the fence. */
static kl_err_t kl_pg_check_open(kl_pg_txn_t *txn) {
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

static kl_err_t kl_pg_commit_end(kl_pg_txn_t *txn) {
  PGresult *res = PQexec(txn->conn->pg, "COMMIT");
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res))
    err = kl__pg_err(txn->conn->pg, res, "commit a batch");
  else if (strcmp(PQcmdStatus(res), "COMMIT") != 0)
    err = kl__err(KL_ESTORE,
                  "postgresql: commit a batch: the server rolled "
                  "it back (%s)",
                  PQcmdStatus(res));
  PQclear(res);
  return err;
}

kl_err_t kl__pg_commit(kl_txn_t *base, int64_t watermark) {
  kl_pg_txn_t *txn = (kl_pg_txn_t *)base;
  kl_err_t err = kl_pg_check_open(txn);
  if (!err && (err = kl_pg_fence(txn, watermark)) == KL_ESTORE_BUSY)
    err = kl_pg_refence(txn, err);
  if (!err && txn->data.count)
    err = kl_pg_write_data(txn);
  if (!err && txn->ids.count)
    err = kl_pg_write_ids(txn);
  if (!err)
    err = kl_pg_commit_end(txn);
  kl_pg_txn_end(txn); /* rolls back unless the COMMIT went through */
  return err;
}
