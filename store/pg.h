/*
 * The PostgreSQL store's internals, shared by pg.c (the connection
 * pool, partitions, scans), pg_sweep.c (expiry), pg_txn.c (batches) and
 * pg_migrations.c (the schema). Not installed.
 *
 * Tables (created by the versioned migrations of pg_migrations.c):
 *   keylane_schema_version  one row per migration applied
 *   keylane_partitions      (topic, partition) -> epoch, watermark, counters
 *   keylane_beats           (topic, partition) -> beats, kl__store_beat()'s
 *   keylane_ids             (topic, idempotency key) -> mark, insert time
 *                           (ms); scoped by topic since version 3
 *   keylane_outbox          follow-up events committed with their batch,
 *                           not yet published (pg_outbox.c)
 *   keylane_topic_sweeps    per topic: the page of keylane_ids where
 *                           the topic's next sweep starts, the retention
 *                           and time of its last sweep that removed ids
 *                           (pg_sweep.c; since version 10, which dropped
 *                           version 6's one store-wide keylane_sweep)
 *   keylane_kv              the handlers' keys and values (bytea)
 * The handlers' own tables (e.g. the inventory example's) live beside them
 * and are written through the batch's connection, kl_txn_pg_conn().
 */
#ifndef KEYLANE_STORE_PG_H
#define KEYLANE_STORE_PG_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdint.h>

#include "store/backend.h"
#include "store/cache.h"

/* The statements a batch runs, prepared once per connection. */
typedef enum kl__pg_stmt {
  KL__PG_GET,       /* a handler key's value */
  KL__PG_SEEN,      /* an idempotency key's mark */
  KL__PG_SEEN_MANY, /* the marks of a batch's idempotency keys */
  KL__PG_FENCE,     /* the commit's epoch check, watermark and counters */
  KL__PG_UPDATE,    /* the batch's puts of keys known to be stored */
  KL__PG_INSERT,    /* those of keys known absent */
  KL__PG_UPSERT,    /* the batch's other puts */
  KL__PG_DELETE,    /* the batch's deletes */
  KL__PG_IDS,       /* the batch's idempotency keys */
  KL__PG_IDS_NEW,   /* those the batch looked up and found absent */
  KL__PG_EPOCH,     /* the current epoch, for the fenced message */
  KL__PG_APPLIED,   /* how many of some ids are marked already */
  KL__PG_STMT_COUNT
} kl__pg_stmt_t;

/* One pooled connection and which statements it has prepared. */
typedef struct kl__pg_conn {
  PGconn *pg;
  unsigned prepared; /* bit i: statement i is prepared on pg */
  int spoiled; /* a result told that the session is unusable: replace it */
  char spoiled_state[6]; /* that result's SQLSTATE */
  int reused;            /* taken from the idle ones, not made for the take */
} kl__pg_conn_t;

typedef struct kl__pg {
  kl_store_t base;
  char *uri;
  int64_t retention_ms;    /* store.dedup.retention */
  int64_t idle_timeout_ms; /* store.pg.idle.timeout; 0: the server's */
  int connect_timeout_s;   /* kl__pg_connect_timeout_s() of the conf */
  int create;              /* store.create: make a missing schema */
  int migrate;             /* store.pg.migrate=auto: the same, or refuse */
  /* The pool: at most pool_max connections, `open` of them made, the idle
   * ones stacked in idle[]. A caller that finds none idle and the bound
   * reached waits on cv. Guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t pool_max;
  size_t open;
  size_t idle_count;
  kl__pg_conn_t **idle;
  kl__cache_t *cache;          /* store.cache.max; NULL: off */
  _Atomic uint64_t id_queries; /* kl__cache_stats_t's */
  _Atomic uint64_t id_prefetched;
  _Atomic uint64_t commits, commit_batches, commit_ns; /* the same */
} kl__pg_t;

/*
 * The store's clock in SQL: the server's (clock_timestamp(), in ms) unless
 * the statement's parameter $N holds a test clock's time (nonzero). Every
 * host of a fleet stamps and expires idempotency keys by this one clock:
 * one host whose clock jumps forward must not expire the fleet's keys.
 */
#define KL__PG_NOW_MS(n)                                                       \
  "coalesce(nullif($" #n "::int8, 0), "                                        \
  "(extract(epoch FROM clock_timestamp()) * 1000)::int8)"

/**
 * How keylane_ids holds an idempotency key (schema 12): a sid
 * (store_internal.h, key first) as "the id, a NUL, the entity key", id
 * first, so that a batch's new ids, time-ordered, land at the tail of the
 * primary key (migration 12 says why); an unscoped id, which holds no NUL,
 * as it is. An id never holds a NUL, so the first NUL splits the two.
 * kl__pg_id_out() writes the stored form of @p sid, kl__pg_id_in() the sid
 * of a stored id, into @p out (KL__SID_MAX bytes; a sid that does not
 * decode, or a stored id too long for it, is copied as it is, cut to
 * KL__SID_MAX). @returns the length written.
 */
size_t kl__pg_id_out(const char *sid, size_t len, char *out);
size_t kl__pg_id_in(const char *stored, size_t len, char *out);

/** Writes the parameter KL__PG_NOW_MS() takes into @p buf (24 bytes). */
void kl__pg_clock_param(char *buf, size_t size);

/**
 * "{a,b,...}": the @p n values at(ctx, 0..n-1) as a PostgreSQL array
 * literal, for a text parameter. @returns a malloc()ed string, or NULL.
 */
char *kl__pg_array_literal(size_t n, uint64_t (*at)(const void *ctx, size_t i),
                           const void *ctx);

/**
 * store.pg.connect.timeout of @p conf (NULL: the default) as libpq takes
 * it: whole seconds, rounded up, at least 2 (libpq reads 1 as 2); 0: no
 * bound but the OS's.
 */
int kl__pg_connect_timeout_s(const kl_conf_t *conf);

/**
 * The one way keylane connects to PostgreSQL: @p uri (a postgresql:// URI
 * or a key=value string) with keylane's defaults under it: TCP keepalives
 * and tcp_user_timeout that notice a dead link within 25 s, and
 * @p connect_timeout_s (0: none); the URI overrides each one it sets
 * (keepalives_idle=.., connect_timeout=..).
 * @param fail  the code of a failed connection (KL_ESTORE, KL_ESTORE_BUSY)
 * @returns KL_OK and the connection in @p *out (the caller PQfinish()es
 *          it), or @p fail with a message naming the URI's problem and the
 *          connect timeout in use.
 */
kl_err_t kl__pg_connect(const char *uri, int connect_timeout_s, kl_err_t fail,
                        PGconn **out);

/** How long a caller waits for a pooled connection before KL_ESTORE_BUSY. */
#define KL__PG_POOL_WAIT_MS 10000

/**
 * Takes a connection from the pool, connecting when none is idle and the
 * bound allows; waits up to KL__PG_POOL_WAIT_MS otherwise.
 * @returns KL_OK, or KL_ESTORE_BUSY (server unreachable, pool exhausted).
 */
kl_err_t kl__pg_conn_take(kl__pg_t *pgs, kl__pg_conn_t **conn);

/** An idle pooled connection, without connecting or waiting: KL_OK, or
 *  KL_ESTORE_BUSY when none is idle. */
kl_err_t kl__pg_conn_take_idle(kl__pg_t *pgs, kl__pg_conn_t **conn);

/**
 * Returns @p conn to the pool, or closes it when @p broken, when the link is
 * down, when a transaction is still open on it, or when a result on it told
 * that its session is unusable (read-only, ended by the server: see
 * pg.c's pg_state_spoils_session()); the next take reconnects.
 */
void kl__pg_conn_give(kl__pg_t *pgs, kl__pg_conn_t *conn, int broken);

/**
 * Maps a failed libpq call: "postgresql: <what>: <server message>".
 * A lost link and a transient SQLSTATE (kl__sqlstate_transient(), the one
 * list the handlers use too) are KL_ESTORE_BUSY (the batch may be re-run);
 * the rest KL_ESTORE.
 * @param res  the failed result, or NULL when there is none.
 */
kl_err_t kl__pg_err(PGconn *pg, const PGresult *res, const char *what);

/** @returns nonzero when @p res of a statement is a success. */
int kl__pg_ok(const PGresult *res);

/**
 * Reads the one number a one-row result holds (a count, a version) into
 * *@p out and PQclear()s @p res, a failure's too.
 * @returns KL_OK, or a kl__pg_err() naming @p what.
 */
kl_err_t kl__pg_u64(PGconn *pg, PGresult *res, const char *what, uint64_t *out);

/** Runs an SQL text without parameters: KL_OK or a kl__pg_err(). */
kl_err_t kl__pg_exec(PGconn *pg, const char *sql, const char *what);

/**
 * Runs prepared statement @p stmt on @p conn, preparing it first when this
 * connection has not. Parameters are binary when @p formats says so.
 * @returns the result (the caller PQclear()s it), or NULL with the error
 *          mapped by kl__pg_err() into *err.
 */
PGresult *kl__pg_run(kl__pg_conn_t *conn, kl__pg_stmt_t stmt, int nparams,
                     const char *const *values, const int *lengths,
                     const int *formats, int binary_result, kl_err_t *err);

/** Prepares @p stmt on @p conn unless it is: KL_OK or a kl__pg_err(). */
kl_err_t kl__pg_prepare(kl__pg_conn_t *conn, kl__pg_stmt_t stmt);

/** One statement of kl__pg_pipeline(): a prepared one, or @p sql. */
typedef struct kl__pg_call {
  kl__pg_stmt_t stmt; /* used when sql is NULL */
  const char *sql;    /* a statement without parameters (COMMIT) */
  int nparams;
  const char *values[8];
  int lengths[8];
  int formats[8];
  int binary;       /* results in binary format */
  const char *what; /* for messages; set for prepared ones when NULL */
  PGresult *res;    /* set by kl__pg_pipeline(); the caller PQclear()s it */
} kl__pg_call_t;

/**
 * Sends @p n statements in libpq's pipeline mode and one sync, so that
 * they cost one network round trip, then collects each one's result into
 * calls[i].res (PGRES_PIPELINE_ABORTED for those after a failed one; NULL
 * when the link broke first). Statements are prepared first when needed.
 * @returns KL_OK when every result arrived; a kl__pg_err() otherwise (the
 *          connection is then to be dropped).
 */
kl_err_t kl__pg_pipeline(kl__pg_conn_t *conn, kl__pg_call_t *calls, int n);

/**
 * kl__pg_pipeline() in two halves, so that the pipelines of several
 * connections are in flight at once: send (the statements and the sync),
 * then, when the send went well, collect. After a failed half the
 * connection is to be dropped.
 */
kl_err_t kl__pg_pipeline_send(kl__pg_conn_t *conn, kl__pg_call_t *calls, int n);
kl_err_t kl__pg_pipeline_collect(kl__pg_conn_t *conn, kl__pg_call_t *calls,
                                 int n);

/* What the fence statement fails with when the epoch moved (it divides by
 * the count of rows it matched): division_by_zero. */
#define KL__PG_FENCED_STATE "22012"

/* What KL__PG_UPDATE fails with when a key known stored was not, or held
 * another value than the one known (it divides by whether it updated them
 * all): division_by_zero too. */
#define KL__PG_KEY_GONE_STATE "22012"

/* What KL__PG_INSERT fails with when a key known absent was written since
 * by another writer: unique_violation. */
#define KL__PG_KEY_TAKEN_STATE "23505"

/* What KL__PG_IDS_NEW fails with when one of its ids was recorded since
 * the batch looked it up: unique_violation. */
#define KL__PG_ID_TAKEN_STATE "23505"

/** The SQLSTATE of a failed result, or "". */
const char *kl__pg_state(const PGresult *res);

/* Schema versions (pg_migrations.c). */
#define KL__PG_SCHEMA_VERSION 12

/* The advisory lock (a bigint key) held while the schema is created or
 * migrated; every keylane version takes this one key. */
#define KL__PG_SCHEMA_LOCK "7021781985775709797"

/* How long an opener or `keylane store migrate` waits for that lock before
 * KL_ESTORE_BUSY, naming the session that holds it. */
#define KL__PG_SCHEMA_WAIT_MS 60000

/** Tests: the wait for the schema lock, in ms (0: KL__PG_SCHEMA_WAIT_MS). */
void kl__pg_set_schema_wait_ms(int ms);

/**
 * The columns keylane's statements need that the schema lacks (dropped or
 * renamed by hand), "table.column, ..." into @p missing; "" when none.
 * @returns KL_OK, or a kl__pg_err().
 */
kl_err_t kl__pg_schema_missing(PGconn *pg, char *missing, size_t size);
/** Reads the schema version: 0 when keylane has created nothing yet. */
kl_err_t kl__pg_schema_version(PGconn *pg, int *version);

/**
 * kl_store_open()'s schema check: creates the schema in a database where
 * keylane has created nothing yet (unless @p create is 0), refuses an older
 * one (that is `keylane store migrate`'s) and a newer one. A schema not at
 * this build's version is looked at again under the schema lock, so an
 * opener waits for a creation or a migration in progress.
 * @returns KL_OK; KL_ENOTFOUND (none, and not @p create);
 *          KL_ESTORE_VERSION (older or newer); KL_ESTORE_BUSY when the lock
 *          was held longer than KL__PG_SCHEMA_WAIT_MS. The lock is not held
 *          on return, unless this fails: then close @p pg.
 */
kl_err_t kl__pg_schema_open(PGconn *pg, int create);

/**
 * Applies every migration above the database's version, each in its own
 * transaction, all under the schema lock, so that concurrent callers apply
 * each once. @p from and @p to receive the versions before and after.
 * @returns KL_OK, KL_ESTORE_VERSION for a schema newer than this build, or
 *          KL_ESTORE_BUSY as kl__pg_schema_open(); on failure close @p pg.
 */
kl_err_t kl__pg_migrate(PGconn *pg, int *from, int *to);

/* The txn operations of pg_txn.c and the outbox's list and remove
 * of pg_outbox.c, for the ops table. */
KL__STORE_BACKEND_DECLARE(pg);
PGconn *kl__pg_conn(kl_txn_t *txn);
int kl__pg_lost(kl_txn_t *txn);
kl_err_t kl__pg_prefetch(kl_txn_t *txn, const char *const *ids,
                         const size_t *id_lens, size_t n);
kl_err_t kl__pg_savepoint(kl_txn_t *txn, kl__savepoint_t what);
kl_err_t kl__pg_begin_ahead(kl_store_t *store, const char *topic,
                            int32_t partition, uint64_t epoch,
                            const char *const *ids, const size_t *id_lens,
                            size_t n, kl_txn_t **txn);
kl_err_t kl__pg_settle(kl_txn_t *txn);
int kl__pg_pending(kl_txn_t *txn);

/** Runs @p fn on a pooled connection, once more on a fresh one when the
 *  link was lost: for statements that may run twice. */
kl_err_t kl__pg_call(kl__pg_t *pgs, kl_err_t (*fn)(kl__pg_conn_t *, void *),
                     void *ctx);

/* The sweep of one topic's expired ids and the retentions the sweeps
 * recorded (pg_sweep.c): the ops sweep and sweeps. */
kl_err_t kl__pg_sweep(kl_store_t *store, const char *topic, size_t max,
                      size_t *removed);
kl_err_t kl__pg_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                       void *opaque);

/* The outbox of pg_outbox.c: fills @p call, a statement of a
 * commit's pipeline after its fence, with the insert of @p emits (its
 * parameters in *params, which the caller frees after the pipeline). */
kl_err_t kl__pg_outbox_add(kl__pg_call_t *call, char **params,
                           const char *topic, int32_t partition,
                           const kl__emits_t *emits);

/* Each topic's owner (pg_owner.c): the ops owner_get and owner_set. */
kl_err_t kl__pg_owner(kl_store_t *store, const char *topic,
                      kl__store_owner_t *owner);
kl_err_t kl__pg_bind(kl_store_t *store, const char *topic,
                     const kl__store_owner_t *owner);

#endif
