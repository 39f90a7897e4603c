/*
 * The PostgreSQL store's outbox (store_internal.h), schema 5:
 *
 *   keylane_outbox (topic, partition, seq, rec), seq from the sequence
 *   keylane_outbox_seq
 *
 * A commit inserts its follow-ups after its fence, whose UPDATE holds the
 * partition's row lock until COMMIT: two batches of one partition take
 * their seqs one after the other, so a partition's seqs grow in commit
 * order (a sequence may leave gaps, which nothing minds).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "store/outbox_rec.h"
#include "store/pg.h"

static void pg_int_param(char *buf, size_t size, int64_t v) {
  snprintf(buf, size, "%" PRId64, v);
}

/* "{"\\x0a0b...",...}": the records of @p emits as a bytea array literal
 * (text), in emit order, with 16 bytes to spare after its NUL.
 * @returns a malloc()ed string, or NULL. */
static char *pg_recs_array(const kl__emits_t *emits) {
  size_t size = 3 + emits->len * 2 + emits->count * 6 + 16, len = 0;
  char *text = malloc(size);
  if (!text)
    return NULL;
  text[len++] = '{';
  size_t off = 0, n;
  const void *rec;
  while (kl__emits_next(emits, &off, &rec, &n)) {
    if (len > 1)
      text[len++] = ',';
    memcpy(text + len, "\"\\\\x", 4);
    len += 4;
    kl__hex_encode(rec, n, text + len);
    len += 2 * n;
    text[len++] = '"';
  }
  text[len++] = '}';
  text[len] = '\0';
  return text;
}

kl_err_t kl__pg_outbox_add(kl__pg_call_t *call, char **params,
                           const char *topic, int32_t partition,
                           const kl__emits_t *emits) {
  char *recs = pg_recs_array(emits); /* room for the partition after */
  if (!recs)
    return kl__err(KL_ENOMEM, "postgresql: out of memory for follow-ups");
  size_t rlen = strlen(recs);
  snprintf(recs + rlen + 1, 16, "%" PRId32, partition);
  memset(call, 0, sizeof(*call));
  call->sql = "INSERT INTO keylane_outbox (topic, partition, seq, rec) "
              "SELECT $1::text, $2::int4, nextval('keylane_outbox_seq'), r "
              "FROM unnest($3::bytea[]) WITH ORDINALITY AS u(r, n) ORDER BY n";
  call->what = "write follow-ups";
  call->nparams = 3;
  call->values[0] = topic;
  call->values[1] = recs + rlen + 1;
  call->values[2] = recs;
  *params = recs;
  return KL_OK;
}

static const char kl_list_sql[] =
    "SELECT seq::text AS s, rec FROM keylane_outbox WHERE topic = $1::text "
    "AND partition = $2::int4 AND seq > $3::int8 ORDER BY seq LIMIT $4::int8";

static const char kl_del_sql[] =
    "DELETE FROM keylane_outbox o USING unnest($2::int4[], $3::int8[]) AS "
    "a(partition, seq) WHERE o.topic = $1::text AND o.partition = "
    "a.partition AND o.seq = a.seq";

/* Runs @p sql with its @p n text parameters on @p conn, with a binary
 * result when @p binary. @returns the result (the caller PQclear()s it)
 * and *err KL_OK, or NULL and *err a kl__pg_err() that names @p what. */
static PGresult *outbox_query(kl__pg_conn_t *conn, const char *sql, int n,
                              const char *const *values, int binary,
                              const char *what, kl_err_t *err) {
  PGresult *res =
      PQexecParams(conn->pg, sql, n, NULL, values, NULL, NULL, binary);
  *err = KL_OK;
  if (kl__pg_ok(res))
    return res;
  *err = kl__pg_err(conn->pg, res, what);
  PQclear(res);
  return NULL;
}

typedef struct kl_pg_list {
  const char *topic;
  int32_t partition;
  uint64_t after;
  size_t max;
  kl__outbox_cb_t *cb;
  void *opaque;
} kl_pg_list_t;

static kl_err_t pg_list_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_list_t *l = ctx;
  char part[16], after[24], max[24];
  pg_int_param(part, sizeof(part), l->partition);
  pg_int_param(after, sizeof(after), (int64_t)l->after);
  pg_int_param(max, sizeof(max),
               l->max > INT64_MAX ? INT64_MAX : (int64_t)l->max);
  const char *values[4] = {l->topic, part, after, max};
  kl_err_t err;
  PGresult *res =
      outbox_query(conn, kl_list_sql, 4, values, 1, "list the outbox", &err);
  if (!res)
    return err;
  for (int i = 0; i < PQntuples(res); i++) {
    uint64_t seq = strtoull(PQgetvalue(res, i, 0), NULL, 10);
    if (l->cb(l->opaque, seq, PQgetvalue(res, i, 1),
              (size_t)PQgetlength(res, i, 1)))
      break;
  }
  PQclear(res);
  return KL_OK;
}

typedef struct kl_pg_del {
  const char *topic;
  const kl__outbox_ack_t *acks;
  size_t n;
} kl_pg_del_t;

static uint64_t del_partition(const void *ctx, size_t i) {
  return (uint64_t)((const kl_pg_del_t *)ctx)->acks[i].partition;
}

static uint64_t del_seq(const void *ctx, size_t i) {
  return ((const kl_pg_del_t *)ctx)->acks[i].seq;
}

static kl_err_t pg_del_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_del_t *d = ctx;
  char *parts = kl__pg_array_literal(d->n, del_partition, d);
  char *seqs = kl__pg_array_literal(d->n, del_seq, d);
  kl_err_t err = KL_OK;
  if (!parts || !seqs) {
    err = kl__err(KL_ENOMEM, "postgresql: out of memory");
  } else {
    const char *values[3] = {d->topic, parts, seqs};
    PQclear(outbox_query(conn, kl_del_sql, 3, values, 0,
                         "remove published follow-ups", &err));
  }
  free(parts);
  free(seqs);
  return err;
}

kl_err_t kl__pg_outbox_list(kl_store_t *store, const char *topic,
                            int32_t partition, uint64_t after, size_t max,
                            kl__outbox_cb_t *cb, void *opaque) {
  kl_pg_list_t l = {topic, partition, after, max, cb, opaque};
  return kl__pg_call((kl__pg_t *)store, pg_list_fn, &l);
}

kl_err_t kl__pg_outbox_del(kl_store_t *store, const char *topic,
                           const kl__outbox_ack_t *acks, size_t n) {
  kl_pg_del_t d = {topic, acks, n};
  return kl__pg_call((kl__pg_t *)store, pg_del_fn, &d);
}
