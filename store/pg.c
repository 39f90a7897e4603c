/*
 * The PostgreSQL store: the same contract as the LMDB store, on tables in
 * one database that every worker of a fleet reaches (see pg.h for
 * the tables, pg_txn.c for batches and the fence).
 *
 * Connections: a kl_store_t holds a small bounded pool, at most
 * store.pg.pool (default 4) connections, made on demand. A batch holds one
 * from kl_store_begin() to its commit or abort; every other call borrows
 * one for its statement. A caller finding every connection busy waits up to
 * KL__PG_POOL_WAIT_MS, then fails with KL_ESTORE_BUSY: so a thread that
 * holds a txn must not call the store while the pool is exhausted (with one
 * connection, a kl_store_partition() inside a batch would wait for itself).
 * A connection whose link broke is closed when it is given back and the
 * next take connects anew: a lost server costs the batches in flight, which
 * fail with KL_ESTORE_BUSY and are re-run, and nothing else.
 */
#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-events.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/sqlstate.h"
#include "store/location.h"
#include "store/store_internal.h"
#include "store/pg.h"

#define KL_PG_POOL_DEFAULT 4
#define KL_COMP "store"

/* ---- errors and statements ------------------------------------------- */

/* libpq's messages end with a newline; a detail reads better without. */
static int pg_trimmed(const char *msg) {
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
    n--;
  return (int)n;
}

kl_err_t kl__pg_err(PGconn *pg, const PGresult *res, const char *what) {
  const char *msg = res ? PQresultErrorMessage(res) : "";
  if (!*msg)
    msg = PQerrorMessage(pg);
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  int lost = PQstatus(pg) != CONNECTION_OK;
  kl_err_t err =
      lost || kl__sqlstate_transient(state) ? KL_ESTORE_BUSY : KL_ESTORE;
  return kl__err(err, "postgresql: %s: %.*s%s", what, pg_trimmed(msg), msg,
                 lost ? " (connection lost: it is made anew on the next call; "
                        "an open batch applied nothing and may be re-run)"
                      : "");
}

int kl__pg_ok(const PGresult *res) {
  ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
}

kl_err_t kl__pg_u64(PGconn *pg, PGresult *res, const char *what,
                    uint64_t *out) {
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res) || PQntuples(res) != 1)
    err = kl__pg_err(pg, res, what);
  else
    *out = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  return err;
}

kl_err_t kl__pg_exec(PGconn *pg, const char *sql, const char *what) {
  PGresult *res = PQexec(pg, sql);
  kl_err_t err = kl__pg_ok(res) ? KL_OK : kl__pg_err(pg, res, what);
  PQclear(res);
  return err;
}

/* The batch's statements. $n::type casts fix the parameter types, so binary
 * parameters need no type OIDs. Arrays carry a whole batch in one
 * statement. */
static const struct {
  const char *name, *sql, *what;
  int custom; /* planned for each call's values, never prepared: see below */
} kl_pg_stmts[KL__PG_STMT_COUNT] = {
    [KL__PG_GET] = {"kl_get",
                    "SELECT value FROM keylane_kv WHERE key = "
                    "$1::bytea",
                    "read a handler key"},
    [KL__PG_SEEN] = {"kl_seen",
                     "SELECT mark FROM keylane_ids WHERE topic = $2::text "
                     "AND id = $1::bytea",
                     "look up an idempotency key"},
    /* One primary-key probe per id (the LIMIT keeps the planner from
     * turning the loop into a join): "id = ANY(array)" over 1000 ids was
     * planned as a sequential scan of a 70k-key table (11 ms against
     * 2.7 ms). Not prepared: a connection's generic plan, made while
     * keylane_ids was small, would stay a sequential scan as it grows
     * (measured: 100 ms and rising per batch). */
    [KL__PG_SEEN_MANY] = {"kl_seen_many",
                          "SELECT a.id, i.mark FROM unnest($1::bytea[]) AS "
                          "a(id) CROSS JOIN LATERAL (SELECT mark FROM "
                          "keylane_ids WHERE topic = $2::text AND id = a.id "
                          "LIMIT 1) i",
                          "look up a batch's idempotency keys", 1},
    /* Sent in one pipeline with the writes and the COMMIT, the fence must
     * stop them itself: matching no row (a newer epoch), it fails with
     * division_by_zero (KL__PG_FENCED_STATE, pg.h), which aborts the rest
     * of the pipeline and the transaction. */
    [KL__PG_FENCE] =
        {"kl_fence",
         "WITH f AS (UPDATE keylane_partitions SET watermark = "
         "GREATEST(watermark, $3::int8), applied = applied + $4::int8, "
         "duplicates = duplicates + $5::int8, dead_letters = dead_letters + "
         "$6::int8, last_ident = CASE WHEN $8::text = '' OR watermark > "
         "$3::int8 THEN last_ident ELSE decode($8::text, 'hex') END, "
         "last_ident_wm = CASE WHEN $8::text = '' OR watermark > $3::int8 "
         "THEN last_ident_wm ELSE $3::int8 END WHERE topic = $1::text AND "
         "partition = $2::int4 AND epoch = $7::int8 RETURNING epoch) SELECT "
         "1 / count(*) FROM f",
         "check the epoch and move the watermark"},
    /* An UPDATE, half the upsert's work (no conflict check, no row lock
     * of its own: one WAL record per key, 1.2 against 2.1 ms per 631
     * keys), for the keys the owner cache knows are stored, each on the
     * condition that its row still holds the value the cache knows ($3).
     * Should one be gone or changed (a writer outside the partition's
     * fence: another topic's owner writing the same key, say), the
     * statement fails (KL__PG_KEY_GONE_STATE) rather than write a value
     * computed from a stale one over the other writer's. */
    [KL__PG_UPDATE] = {"kl_update",
                       "WITH u AS (UPDATE keylane_kv SET value = t.v FROM "
                       "unnest($1::bytea[], $2::bytea[], $3::bytea[]) AS "
                       "t(k, v, o) WHERE key = t.k AND value = t.o "
                       "RETURNING 1) SELECT 1 / (count(*) = $4::int8)::int "
                       "FROM u",
                       "write the batch's handler keys"},
    [KL__PG_INSERT] = {"kl_insert",
                       "INSERT INTO keylane_kv (key, value) SELECT * FROM "
                       "unnest($1::bytea[], $2::bytea[])",
                       "write the batch's handler keys"},
    [KL__PG_UPSERT] = {"kl_upsert",
                       "INSERT INTO keylane_kv (key, value) SELECT * FROM "
                       "unnest($1::bytea[], $2::bytea[]) ON CONFLICT (key) DO "
                       "UPDATE SET value = EXCLUDED.value",
                       "write the batch's handler keys"},
    [KL__PG_DELETE] = {"kl_delete",
                       "DELETE FROM keylane_kv WHERE key = ANY($1::bytea[])",
                       "delete the batch's handler keys"},
    /* The insert time is taken once per statement (an InitPlan), not per
     * row: per row it cost 1.6 us of numeric arithmetic in 1000. */
    [KL__PG_IDS] =
        {"kl_ids",
         "INSERT INTO keylane_ids (topic, id, mark, inserted_ms) "
         "SELECT $4::text, i, m, (SELECT " KL__PG_NOW_MS(
             3) ") FROM unnest($1::bytea[], $2::int2[]) AS t(i, m) ON "
                "CONFLICT (topic, id) DO UPDATE SET mark = EXCLUDED.mark, "
                "inserted_ms = EXCLUDED.inserted_ms WHERE keylane_ids.mark <> "
                "1 AND keylane_ids.mark <> EXCLUDED.mark",
         "record the batch's idempotency keys"},
    /* The ids the batch's prefetch found absent: a plain INSERT, half the
     * cost of the upsert's speculative insertion (an arbiter probe, a
     * speculative token and its confirmation record per row). Nobody else
     * records them meanwhile but an owner of another partition reusing an
     * id (the fence keeps this partition's other owners out): then it
     * fails with KL__PG_ID_TAKEN_STATE, as the upsert fails with a
     * serialization error, and the re-run finds the id a duplicate. */
    [KL__PG_IDS_NEW] =
        {"kl_ids_new",
         "INSERT INTO keylane_ids (topic, id, mark, inserted_ms) "
         "SELECT $4::text, i, m, (SELECT " KL__PG_NOW_MS(
             3) ") FROM unnest($1::bytea[], $2::int2[]) AS t(i, m)",
         "record the batch's new idempotency keys"},
    [KL__PG_APPLIED] = {"kl_applied",
                        "SELECT count(*) FROM keylane_ids WHERE topic = "
                        "$2::text AND id = ANY($1::bytea[]) AND mark <> 3",
                        "count the dead letters already marked"},
    [KL__PG_EPOCH] = {"kl_epoch",
                      "SELECT epoch FROM keylane_partitions WHERE topic = "
                      "$1::text AND partition = $2::int4",
                      "read the current epoch"},
};

kl_err_t kl__pg_prepare(kl__pg_conn_t *conn, kl__pg_stmt_t stmt) {
  if (conn->prepared & (1u << stmt))
    return KL_OK;
  PGresult *res = PQprepare(conn->pg, kl_pg_stmts[stmt].name,
                            kl_pg_stmts[stmt].sql, 0, NULL);
  kl_err_t err = kl__pg_ok(res)
                     ? KL_OK
                     : kl__pg_err(conn->pg, res, kl_pg_stmts[stmt].what);
  PQclear(res);
  if (!err)
    conn->prepared |= 1u << stmt;
  return err;
}

PGresult *kl__pg_run(kl__pg_conn_t *conn, kl__pg_stmt_t stmt, int nparams,
                     const char *const *values, const int *lengths,
                     const int *formats, int binary_result, kl_err_t *err) {
  PGresult *res;
  if (kl_pg_stmts[stmt].custom)
    res = PQexecParams(conn->pg, kl_pg_stmts[stmt].sql, nparams, NULL, values,
                       lengths, formats, binary_result);
  else if ((*err = kl__pg_prepare(conn, stmt)))
    return NULL;
  else
    res = PQexecPrepared(conn->pg, kl_pg_stmts[stmt].name, nparams, values,
                         lengths, formats, binary_result);
  if (kl__pg_ok(res))
    return res;
  *err = kl__pg_err(conn->pg, res, kl_pg_stmts[stmt].what);
  PQclear(res);
  return NULL;
}

const char *kl__pg_state(const PGresult *res) {
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  return state ? state : "";
}

static int pg_send(kl__pg_conn_t *conn, const kl__pg_call_t *c) {
  if (c->sql) /* parameters only as text: the outbox's insert */
    return PQsendQueryParams(conn->pg, c->sql, c->nparams, NULL, c->values,
                             NULL, NULL, 0);
  if (kl_pg_stmts[c->stmt].custom)
    return PQsendQueryParams(conn->pg, kl_pg_stmts[c->stmt].sql, c->nparams,
                             NULL, c->values, c->lengths, c->formats,
                             c->binary);
  return PQsendQueryPrepared(conn->pg, kl_pg_stmts[c->stmt].name, c->nparams,
                             c->values, c->lengths, c->formats, c->binary);
}

/* The first result of each statement (a statement's results end with a
 * NULL), then the sync's. @returns 0 when all arrived. */
static int pg_collect(PGconn *pg, kl__pg_call_t *calls, int n) {
  for (int i = 0; i < n; i++) {
    if (!(calls[i].res = PQgetResult(pg)))
      return -1;
    for (PGresult *more; (more = PQgetResult(pg));)
      PQclear(more);
  }
  PGresult *sync = PQgetResult(pg);
  int synced = sync && PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
  PQclear(sync);
  return synced ? 0 : -1;
}

kl_err_t kl__pg_pipeline_send(kl__pg_conn_t *conn, kl__pg_call_t *calls,
                              int n) {
  kl_err_t err = KL_OK;
  for (int i = 0; i < n; i++) {
    calls[i].res = NULL;
    if (!calls[i].sql && !calls[i].what)
      calls[i].what = kl_pg_stmts[calls[i].stmt].what;
    if (!calls[i].sql && !kl_pg_stmts[calls[i].stmt].custom &&
        (err = kl__pg_prepare(conn, calls[i].stmt)))
      return err;
  }
  if (!PQenterPipelineMode(conn->pg))
    return kl__pg_err(conn->pg, NULL, "enter pipeline mode");
  int sent = 0;
  while (sent < n && pg_send(conn, &calls[sent]))
    sent++;
  if (sent < n || !PQpipelineSync(conn->pg))
    return kl__pg_err(conn->pg, NULL, "send a batch's statements");
  return KL_OK;
}

kl_err_t kl__pg_pipeline_collect(kl__pg_conn_t *conn, kl__pg_call_t *calls,
                                 int n) {
  kl_err_t err = KL_OK;
  if (pg_collect(conn->pg, calls, n))
    err = kl__pg_err(conn->pg, NULL, "read a batch's results");
  if (!PQexitPipelineMode(conn->pg) && !err)
    err = kl__pg_err(conn->pg, NULL, "leave pipeline mode");
  return err;
}

kl_err_t kl__pg_pipeline(kl__pg_conn_t *conn, kl__pg_call_t *calls, int n) {
  kl_err_t err = kl__pg_pipeline_send(conn, calls, n);
  return err ? err : kl__pg_pipeline_collect(conn, calls, n);
}

/* ---- the pool --------------------------------------------------------- */

static void pg_conn_close(kl__pg_conn_t *conn) {
  if (conn) {
    PQfinish(conn->pg);
    free(conn);
  }
}

int kl__pg_connect_timeout_s(const kl_conf_t *conf) {
  int64_t ms = kl__conf_int(conf, "store.pg.connect.timeout");
  if (ms <= 0)
    return 0;
  int64_t s = (ms + 999) / 1000; /* at most 3600: the key's bound */
  return s < 2 ? 2 : (int)s;
}

/* Says which connect timeout libpq used for @p pg, ours or the URI's
 * (seconds), and how to change it. */
static const char *pg_timeout_said(PGconn *pg, int ours, char *buf,
                                   size_t size) {
  int used = 0;
  PQconninfoOption *opts = PQconninfo(pg);
  for (PQconninfoOption *o = opts; o && o->keyword; o++)
    if (strcmp(o->keyword, "connect_timeout") == 0 && o->val)
      used = atoi(o->val);
  PQconninfoFree(opts);
  if (used <= 0)
    snprintf(buf, size, "no connect timeout: set store.pg.connect.timeout");
  else
    snprintf(buf, size,
             "connect timeout: %d s, %s; raise it for a server slow to answer",
             used,
             used == ours ? "store.pg.connect.timeout"
                          : "the URI's connect_timeout");
  return buf;
}

/* libpq's message on one line (it spans lines: "...refused\n\tIs the
 * server running..."), with @p uri's password scrubbed (libpq may quote
 * the connection string), into @p out. */
static const char *pg_message(const char *uri, const char *msg, char *out,
                              size_t size) {
  char line[KL__LOCATION_MAX];
  size_t n = 0;
  for (const char *c = msg; *c && n < sizeof(line) - 1; c++)
    if (!strchr("\n\t", *c))
      line[n++] = *c;
    else if (n && line[n - 1] != ' ')
      line[n++] = ' ';
  line[n] = '\0';
  line[pg_trimmed(line)] = '\0';
  return kl__location_scrub(uri, line, out, size);
}

/* The error of a connection that failed: libpq's message, what to check,
 * and the connect timeout in use. */
static kl_err_t pg_connect_failed(const char *uri, PGconn *pg,
                                  int connect_timeout_s, kl_err_t fail) {
  char msg[KL__LOCATION_MAX], said[128];
  pg_message(uri, PQerrorMessage(pg), msg, sizeof(msg));
  return kl__err(fail,
                 "postgresql: cannot connect: %s; check the URI, that the "
                 "server runs and that the network reaches it (%s)",
                 msg,
                 pg_timeout_said(pg, connect_timeout_s, said, sizeof(said)));
}

/* A location libpq cannot read (a URI's syntax, an unknown keyword) fails
 * before any connection: say so, without a connect timeout that played no
 * part. @returns KL_OK when it reads. */
static kl_err_t pg_parse(const char *uri, kl_err_t fail) {
  char *why = NULL;
  PQconninfoOption *opts = PQconninfoParse(uri, &why);
  PQconninfoFree(opts);
  if (opts)
    return KL_OK;
  char msg[KL__LOCATION_MAX];
  pg_message(uri, why ? why : "out of memory", msg, sizeof(msg));
  PQfreemem(why);
  return kl__err(fail,
                 "postgresql: cannot read the store location: %s; write it "
                 "as postgresql://USER:PASSWORD@HOST:PORT/DATABASE or as "
                 "keyword=value pairs (host=HOST dbname=DATABASE ...)",
                 msg);
}

kl_err_t kl__pg_location_check(const char *uri) {
  return pg_parse(uri, KL_ECONF);
}

/* The server's notices and warnings (a RAISE NOTICE in a handler's SQL, a
 * deprecation) through the log, instead of libpq's default: raw lines on
 * stderr, outside the log's format. */
static void pg_notice(void *opaque, const PGresult *res) {
  (void)opaque;
  const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
  const char *msg = PQresultErrorMessage(res);
  int warn = severity && strcmp(severity, "WARNING") == 0;
  kl__log(warn ? KL_LOG_WARN : KL_LOG_INFO, KL_COMP, "postgresql says: %.*s",
          pg_trimmed(msg), msg);
}

/* fallback_application_name: what pg_stat_activity shows for keylane's
 * sessions unless the URI sets application_name. */
static char kl_pg_application[64] = "keylane";

void kl__pg_set_application(const char *role, const char *instance) {
  char host[64] = "";
  if (!instance || !*instance) {
    gethostname(host, sizeof(host) - 1);
    size_t n = strlen(host);
    snprintf(host + n, sizeof(host) - n, "-%ld", (long)getpid());
    instance = host;
  }
  /* The server keeps 63 bytes (NAMEDATALEN - 1). */
  char name[256];
  snprintf(name, sizeof(name), "keylane-%s-%s", role, instance);
  snprintf(kl_pg_application, sizeof(kl_pg_application), "%.63s", name);
}

/*
 * keylane's connection defaults, placed before the "dbname" entry that
 * holds the URI: libpq processes the entries in order and the last value
 * of a keyword wins, so whatever the URI sets overrides them.
 *
 * Keepalives: libpq turns them on but leaves their timing to the OS (2 h
 * of silence on Linux), so a link that dies while a worker waits for a
 * result would hold its poll thread for hours. 10 s of silence, then a
 * probe every 5 s, 3 unanswered: a dead link is noticed within 25 s. A
 * server busy with a long statement still answers probes (the kernel
 * does), so no slow statement is cut off; the cost is one small packet
 * per idle connection every 10 s.
 *
 * Keepalives run only while nothing sent is unacknowledged: a statement
 * sent into a link that just died is retransmitted for the OS's ~15 min
 * instead. tcp_user_timeout (25 s, the keepalives' bound) ends that. The
 * server's kernel acknowledges data however busy the server is, and
 * (Linux 5.10 and later) window probes to a server that reads slowly, so
 * a slow statement is not cut off by it either.
 */
kl_err_t kl__pg_connect(const char *uri, int connect_timeout_s, kl_err_t fail,
                        PGconn **out) {
  kl_err_t err = pg_parse(uri, fail);
  if (err)
    return err;
  char timeout[16];
  snprintf(timeout, sizeof(timeout), "%d", connect_timeout_s);
  const struct {
    const char *key, *value;
  } params[] = {
      {"keepalives", "1"},
      {"keepalives_idle", "10"},
      {"keepalives_interval", "5"},
      {"keepalives_count", "3"},
      {"tcp_user_timeout", "25000"},
      {"connect_timeout", connect_timeout_s > 0 ? timeout : NULL},
      {"fallback_application_name", kl_pg_application},
      {"dbname", uri}, /* last: what it sets wins */
  };
  enum { KL_NPARAMS = sizeof(params) / sizeof(params[0]) };
  const char *keys[KL_NPARAMS + 1] = {NULL}, *values[KL_NPARAMS + 1] = {NULL};
  for (int i = 0; i < KL_NPARAMS; i++) {
    keys[i] = params[i].key;
    values[i] = params[i].value;
  }
  PGconn *pg = PQconnectdbParams(keys, values, 1);
  if (!pg)
    return kl__err(KL_ENOMEM, "postgresql: out of memory for a connection");
  if (PQstatus(pg) == CONNECTION_OK) {
    PQsetNoticeReceiver(pg, pg_notice, NULL);
    *out = pg;
    return KL_OK;
  }
  err = pg_connect_failed(uri, pg, connect_timeout_s, fail);
  PQfinish(pg);
  return err;
}

/*
 * SQLSTATEs that tell of the session rather than of the statement: a
 * session made while the role or database was read-only stays read-only
 * (25006) after the setting is reverted, and one the server is ending
 * (57P0x) or whose link failed (class 08) serves nothing more. Such a
 * connection is replaced, never given to the next caller: run again on
 * it, every batch would fail the same way until its backend was killed by
 * hand.
 */
static int pg_state_spoils_session(const char *state) {
  return state &&
         (strncmp(state, "08", 2) == 0 || strncmp(state, "57P0", 4) == 0 ||
          strcmp(state, "25006") == 0);
}

/* libpq calls this for each result its connection makes, whichever code
 * reads it (the store's statements, a handler's own SQL on the batch's
 * connection): a result that spoils the session marks the connection. */
static int pg_event(PGEventId id, void *info, void *opaque) {
  if (id == PGEVT_RESULTCREATE) {
    kl__pg_conn_t *conn = opaque;
    const PGEventResultCreate *made = info;
    const char *state = PQresultErrorField(made->result, PG_DIAG_SQLSTATE);
    if (!conn->spoiled && pg_state_spoils_session(state)) {
      conn->spoiled = 1;
      snprintf(conn->spoiled_state, sizeof(conn->spoiled_state), "%s", state);
    }
  }
  return 1;
}

static kl_err_t pg_connect(kl__pg_t *pgs, kl_err_t fail, kl__pg_conn_t **out) {
  kl__pg_conn_t *conn = calloc(1, sizeof(*conn));
  if (!conn)
    return KL_ENOMEM;
  kl_err_t err =
      kl__pg_connect(pgs->uri, pgs->connect_timeout_s, fail, &conn->pg);
  if (err) {
    free(conn);
    return err;
  }
  if (!PQregisterEventProc(conn->pg, pg_event, "keylane", conn)) {
    pg_conn_close(conn);
    return kl__err(fail, "postgresql: cannot watch a new connection's "
                         "results (out of memory)");
  }
  if (pgs->idle_timeout_ms > 0) {
    char sql[96];
    snprintf(sql, sizeof(sql),
             "SET idle_in_transaction_session_timeout = %" PRId64,
             pgs->idle_timeout_ms);
    if ((err = kl__pg_exec(conn->pg, sql, "set up the session"))) {
      pg_conn_close(conn);
      return err;
    }
  }
  *out = conn;
  return KL_OK;
}

static void pg_deadline(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

kl_err_t kl__pg_conn_take(kl__pg_t *pgs, kl__pg_conn_t **out) {
  struct timespec deadline;
  pg_deadline(&deadline, KL__PG_POOL_WAIT_MS);
  pthread_mutex_lock(&pgs->mu);
  while (!pgs->idle_count && pgs->open >= pgs->pool_max)
    if (pthread_cond_timedwait(&pgs->cv, &pgs->mu, &deadline) == ETIMEDOUT &&
        !pgs->idle_count && pgs->open >= pgs->pool_max) {
      pthread_mutex_unlock(&pgs->mu);
      return kl__err(KL_ESTORE_BUSY,
                     "postgresql: all %zu connections of the pool stayed in "
                     "use for %d ms: raise store.pg.pool, or end the txn "
                     "before calling the store again from its thread",
                     pgs->pool_max, KL__PG_POOL_WAIT_MS);
    }
  if (pgs->idle_count) {
    *out = pgs->idle[--pgs->idle_count];
    (*out)->reused = 1;
    pthread_mutex_unlock(&pgs->mu);
    return KL_OK;
  }
  pgs->open++;
  pthread_mutex_unlock(&pgs->mu);
  kl_err_t err = pg_connect(pgs, KL_ESTORE_BUSY, out);
  if (err) {
    pthread_mutex_lock(&pgs->mu);
    pgs->open--;
    pthread_cond_signal(&pgs->cv);
    pthread_mutex_unlock(&pgs->mu);
  }
  return err;
}

kl_err_t kl__pg_conn_take_idle(kl__pg_t *pgs, kl__pg_conn_t **out) {
  pthread_mutex_lock(&pgs->mu);
  kl__pg_conn_t *conn = pgs->idle_count ? pgs->idle[--pgs->idle_count] : NULL;
  pthread_mutex_unlock(&pgs->mu);
  *out = conn;
  return conn ? KL_OK
              : kl__err(KL_ESTORE_BUSY, "postgresql: no idle connection");
}

void kl__pg_conn_give(kl__pg_t *pgs, kl__pg_conn_t *conn, int broken) {
  if (conn->spoiled)
    KL_LOG_W(KL_COMP,
             "postgresql: replacing a pooled connection whose session "
             "failed with SQLSTATE %s (%s): the next call connects anew",
             conn->spoiled_state,
             strcmp(conn->spoiled_state, "25006") == 0
                 ? "read-only: it began while the role or database was"
                 : "the server ended it, or its link failed");
  if (!broken && (conn->spoiled || PQstatus(conn->pg) != CONNECTION_OK ||
                  PQtransactionStatus(conn->pg) != PQTRANS_IDLE))
    broken = 1;
  pthread_mutex_lock(&pgs->mu);
  if (broken)
    pgs->open--;
  else
    pgs->idle[pgs->idle_count++] = conn;
  pthread_cond_signal(&pgs->cv);
  pthread_mutex_unlock(&pgs->mu);
  if (broken)
    pg_conn_close(conn);
}

/*
 * Runs @p fn on a pooled connection. An idle connection may have lost its
 * link unnoticed (a server restart, a terminated backend), or hold a
 * session that spoiled (pg_state_spoils_session()): when @p fn fails on
 * such a connection, it runs again on another (at most once per pooled
 * connection, and once on a new one). Every fn here is a
 * single autocommit statement that may run twice (an acquire that ran
 * twice only skips an epoch number; epochs need to grow, not to be dense),
 * or a read that sets *@p once when it has called back its caller (a scan
 * must not hand out its rows twice).
 */
typedef kl_err_t(kl_pg_fn)(kl__pg_conn_t *conn, void *ctx);

static kl_err_t pg_call_once(kl__pg_t *pgs, kl_pg_fn *fn, void *ctx,
                             const int *once) {
  kl_err_t err = KL_OK;
  /* Every idle connection may be as dead as the first (a server restart
   * ends them all): up to one try each, and one on a new connection. */
  for (size_t attempt = 0; attempt <= pgs->pool_max; attempt++) {
    kl__pg_conn_t *conn;
    if ((err = kl__pg_conn_take(pgs, &conn)))
      return err;
    err = fn(conn, ctx);
    int lost = PQstatus(conn->pg) != CONNECTION_OK || conn->spoiled;
    int reused = conn->reused;
    kl__pg_conn_give(pgs, conn, lost);
    if (!err || !lost || !reused || (once && *once))
      break; /* a new connection that failed so: the server's state */
  }
  return err;
}

static kl_err_t pg_call(kl__pg_t *pgs, kl_pg_fn *fn, void *ctx) {
  return pg_call_once(pgs, fn, ctx, NULL);
}

kl_err_t kl__pg_call(kl__pg_t *pgs, kl_err_t (*fn)(kl__pg_conn_t *, void *),
                     void *ctx) {
  return pg_call(pgs, fn, ctx);
}

/* ---- partitions ------------------------------------------------------- */

typedef struct kl_pg_tp {
  const char *topic;
  int32_t partition;
  kl_partition_state_t *state;
  uint64_t floor; /* acquire: the new epoch is above it */
} kl_pg_tp_t;

static void pg_state_row(const PGresult *res, int row, int col,
                         kl_partition_state_t *state) {
  state->epoch = strtoull(PQgetvalue(res, row, col), NULL, 10);
  state->watermark = strtoll(PQgetvalue(res, row, col + 1), NULL, 10);
  state->applied = strtoull(PQgetvalue(res, row, col + 2), NULL, 10);
  state->duplicates = strtoull(PQgetvalue(res, row, col + 3), NULL, 10);
  state->dead_letters = strtoull(PQgetvalue(res, row, col + 4), NULL, 10);
  state->beats = strtoull(PQgetvalue(res, row, col + 5), NULL, 10);
}

/* Runs @p sql with $1 the topic, $2 the partition and, when @p nparams
 * is 3, $3 the floor. */
static kl_err_t pg_tp_query(kl__pg_conn_t *conn, const kl_pg_tp_t *tp,
                            int nparams, const char *sql, const char *what) {
  char part[16], floor[24];
  snprintf(part, sizeof(part), "%" PRId32, tp->partition);
  snprintf(floor, sizeof(floor), "%" PRIu64, tp->floor);
  const char *values[3] = {tp->topic, part, floor};
  PGresult *res =
      PQexecParams(conn->pg, sql, nparams, NULL, values, NULL, NULL, 0);
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(conn->pg, res, what);
    PQclear(res);
    return err;
  }
  memset(tp->state, 0, sizeof(*tp->state));
  if (PQntuples(res) == 1)
    pg_state_row(res, 0, 0, tp->state);
  PQclear(res);
  return KL_OK;
}

/* What acquire and reset return of a partition (pg_state_row()). */
#define KL_PG_STATE_ROW                                                        \
  " RETURNING epoch, watermark, applied, duplicates, dead_letters, "           \
  "coalesce((SELECT beats FROM keylane_beats b WHERE b.topic = p.topic AND "   \
  "b.partition = p.partition), 0)"

/* An atomic increment: concurrent acquirers queue on the row lock and each
 * gets its own epoch, read from the row as it is after the one before. */
static kl_err_t pg_acquire_fn(kl__pg_conn_t *conn, void *ctx) {
  return pg_tp_query(
      conn, ctx, 3,
      "INSERT INTO keylane_partitions AS p (topic, partition, epoch) VALUES "
      "($1::text, $2::int4, $3::int8 + 1) ON CONFLICT (topic, partition) DO "
      "UPDATE SET epoch = GREATEST(p.epoch, $3::int8) + 1" KL_PG_STATE_ROW,
      "take the partition (increment its epoch)");
}

/* kl__store_acquire_owned() in one statement, so in one transaction: the
 * topic's owner row is inserted when missing, or locked and read (the
 * no-op update), and the epoch moves only when it names @p owner. One row:
 * the recorded owner, then the state (NULL when refused). */
typedef struct kl_pg_owned {
  kl_pg_tp_t tp;
  const kl__store_owner_t *owner;
  kl__store_owner_t *recorded;
  int *refused;
} kl_pg_owned_t;

static kl_err_t pg_acquire_owned_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_owned_t *o = ctx;
  char part[16], floor[24];
  snprintf(part, sizeof(part), "%" PRId32, o->tp.partition);
  snprintf(floor, sizeof(floor), "%" PRIu64, o->tp.floor);
  const char *values[5] = {o->tp.topic, part, floor, o->owner->cluster,
                           o->owner->group};
  PGresult *res = PQexecParams(
      conn->pg,
      "WITH o AS (INSERT INTO keylane_topic_owners AS o (topic, cluster_id, "
      "group_id) VALUES ($1::text, $4::text, $5::text) ON CONFLICT (topic) "
      "DO UPDATE SET cluster_id = o.cluster_id RETURNING cluster_id, "
      "group_id), t AS (INSERT INTO keylane_partitions AS p (topic, "
      "partition, epoch) SELECT $1::text, $2::int4, $3::int8 + 1 FROM o "
      "WHERE o.cluster_id = $4::text AND o.group_id = $5::text ON CONFLICT "
      "(topic, partition) DO UPDATE SET epoch = GREATEST(p.epoch, $3::int8) "
      "+ 1" KL_PG_STATE_ROW ") SELECT * FROM o LEFT JOIN t ON true",
      5, NULL, values, NULL, NULL, 0);
  if (!kl__pg_ok(res) || PQntuples(res) != 1) {
    kl_err_t err = kl__pg_err(conn->pg, res,
                              "take the partition (record the topic's owner, "
                              "increment its epoch)");
    PQclear(res);
    return err;
  }
  snprintf(o->recorded->cluster, sizeof(o->recorded->cluster), "%s",
           PQgetvalue(res, 0, 0));
  snprintf(o->recorded->group, sizeof(o->recorded->group), "%s",
           PQgetvalue(res, 0, 1));
  memset(o->tp.state, 0, sizeof(*o->tp.state));
  *o->refused = PQgetisnull(res, 0, 2);
  if (!*o->refused)
    pg_state_row(res, 0, 2, o->tp.state);
  PQclear(res);
  return KL_OK;
}

/* A new epoch: what this store's cache holds of the partition was an
 * older owner's (cache.h). */
static kl_err_t pg_acquire(kl_store_t *store, const char *topic,
                           int32_t partition, uint64_t floor,
                           const kl__store_owner_t *owner,
                           kl__store_owner_t *recorded, int *refused,
                           kl_partition_state_t *state) {
  kl_pg_owned_t o = {
      {topic, partition, state, floor}, owner, recorded, refused};
  kl__pg_t *pgs = (kl__pg_t *)store;
  kl__cache_drop_partition(pgs->cache, topic, partition);
  return owner ? pg_call(pgs, pg_acquire_owned_fn, &o)
               : pg_call(pgs, pg_acquire_fn, &o.tp);
}

/* Only a known partition: no row, no state (kl__store_reset() says so). */
static kl_err_t pg_reset_fn(kl__pg_conn_t *conn, void *ctx) {
  return pg_tp_query(
      conn, ctx, 2,
      "UPDATE keylane_partitions AS p SET epoch = epoch + 1, watermark = 0 "
      "WHERE topic = $1::text AND partition = $2::int4" KL_PG_STATE_ROW,
      "reset the partition (new epoch, watermark 0)");
}

static kl_err_t pg_reset(kl_store_t *store, const char *topic,
                         int32_t partition, kl_partition_state_t *state) {
  kl_pg_tp_t tp = {topic, partition, state, 0};
  kl__cache_drop_partition(((kl__pg_t *)store)->cache, topic, partition);
  return pg_call((kl__pg_t *)store, pg_reset_fn, &tp);
}

static kl_err_t pg_partition_fn(kl__pg_conn_t *conn, void *ctx) {
  return pg_tp_query(conn, ctx, 2,
                     "SELECT epoch, watermark, applied, duplicates, "
                     "dead_letters, coalesce(beats, 0) FROM "
                     "keylane_partitions LEFT JOIN keylane_beats USING "
                     "(topic, partition) WHERE topic = $1::text AND "
                     "partition = $2::int4",
                     "read a partition");
}

static kl_err_t pg_partition(kl_store_t *store, const char *topic,
                             int32_t partition, kl_partition_state_t *state) {
  kl_pg_tp_t tp = {topic, partition, state, 0};
  return pg_call((kl__pg_t *)store, pg_partition_fn, &tp);
}

typedef struct kl_pg_beat {
  const char *topic;
  kl__beat_t *beats;
  size_t n;
} kl_pg_beat_t;

char *kl__pg_array_literal(size_t n, uint64_t (*at)(const void *ctx, size_t i),
                           const void *ctx) {
  size_t size = 3 + n * 21, len = 1;
  char *text = malloc(size);
  if (!text)
    return NULL;
  text[0] = '{';
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(text + len, size - len, "%s%" PRIu64, i ? "," : "",
                            at(ctx, i));
  snprintf(text + len, size - len, "}");
  return text;
}

static uint64_t beat_partition(const void *ctx, size_t i) {
  return (uint64_t)((const kl_pg_beat_t *)ctx)->beats[i].partition;
}

static uint64_t beat_epoch(const void *ctx, size_t i) {
  return ((const kl_pg_beat_t *)ctx)->beats[i].epoch;
}

/* One statement for every partition; those it returns beat, the others
 * have a newer owner. It only reads keylane_partitions: see migration 3. */
static kl_err_t pg_beat_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_beat_t *b = ctx;
  char *parts = kl__pg_array_literal(b->n, beat_partition, b);
  char *epochs = kl__pg_array_literal(b->n, beat_epoch, b);
  const char *values[3] = {b->topic, parts, epochs};
  PGresult *res =
      parts && epochs
          ? PQexecParams(conn->pg,
                         "INSERT INTO keylane_beats AS k (topic, partition, "
                         "beats) SELECT p.topic, p.partition, 1 FROM "
                         "keylane_partitions p JOIN unnest($2::int4[], "
                         "$3::int8[]) AS b(pt, e) ON p.partition = b.pt AND "
                         "p.epoch = b.e WHERE p.topic = $1::text ON "
                         "CONFLICT (topic, partition) DO UPDATE SET beats = "
                         "k.beats + 1 RETURNING partition",
                         3, NULL, values, NULL, NULL, 0)
          : NULL;
  free(parts);
  free(epochs);
  if (!res)
    return KL_ENOMEM;
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res))
    err = kl__pg_err(conn->pg, res, "record the heartbeats");
  for (size_t i = 0; !err && i < b->n; i++) {
    b->beats[i].err = KL_EFENCED;
    for (int row = 0; row < PQntuples(res); row++)
      if (strtol(PQgetvalue(res, row, 0), NULL, 10) == b->beats[i].partition)
        b->beats[i].err = KL_OK;
  }
  PQclear(res);
  return err;
}

static kl_err_t pg_beat(kl_store_t *store, const char *topic, kl__beat_t *beats,
                        size_t n) {
  kl_pg_beat_t b = {topic, beats, n};
  return pg_call((kl__pg_t *)store, pg_beat_fn, &b);
}

typedef struct kl_pg_each {
  kl_store_partition_cb_t *cb;
  void *opaque;
} kl_pg_each_t;

static kl_err_t pg_foreach_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_each_t *each = ctx;
  PGresult *res =
      PQexec(conn->pg, "SELECT topic, partition, epoch, watermark, applied, "
                       "duplicates, dead_letters, coalesce(beats, 0) FROM "
                       "keylane_partitions LEFT JOIN keylane_beats USING "
                       "(topic, partition) ORDER BY topic, partition");
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(conn->pg, res, "list the partitions");
    PQclear(res);
    return err;
  }
  for (int i = 0; i < PQntuples(res); i++) {
    kl_partition_state_t state;
    pg_state_row(res, i, 2, &state);
    if (each->cb(each->opaque, PQgetvalue(res, i, 0),
                 (int32_t)strtol(PQgetvalue(res, i, 1), NULL, 10), &state))
      break;
  }
  PQclear(res);
  return KL_OK;
}

static kl_err_t pg_foreach_partition(kl_store_t *store,
                                     kl_store_partition_cb_t *cb,
                                     void *opaque) {
  kl_pg_each_t each = {cb, opaque};
  return pg_call((kl__pg_t *)store, pg_foreach_fn, &each);
}

/* ---- idempotency keys ------------------------------------------------- */

static size_t pg_id_as_is(const char *in, size_t len, char *out) {
  len = len < KL__SID_MAX ? len : KL__SID_MAX;
  memcpy(out, in, len);
  return len;
}

size_t kl__pg_id_out(const char *sid, size_t len, char *out) {
  const void *key;
  const char *id;
  size_t key_len, id_len;
  if (kl__sid_decode(sid, len, &key, &key_len, &id, &id_len) || !key)
    return pg_id_as_is(sid, len, out);
  memcpy(out, id, id_len);
  out[id_len] = 0;
  memcpy(out + id_len + 1, key, key_len);
  return id_len + 1 + key_len;
}

size_t kl__pg_id_in(const char *stored, size_t len, char *out) {
  const char *nul = memchr(stored, 0, len);
  size_t id_len = nul ? (size_t)(nul - stored) : 0;
  size_t key_len = nul ? len - id_len - 1 : 0;
  if (!nul || !id_len || id_len > KL_ID_MAX || !key_len || key_len > KL_KEY_MAX)
    return pg_id_as_is(stored, len, out);
  return kl__sid_encode(nul + 1, key_len, stored, id_len, out);
}

void kl__pg_clock_param(char *buf, size_t size) {
  snprintf(buf, size, "%" PRId64, kl__store_test_clock_ms());
}

static kl_err_t pg_id_count_fn(kl__pg_conn_t *conn, void *ctx) {
  return kl__pg_u64(conn->pg,
                    PQexec(conn->pg, "SELECT count(*) FROM keylane_ids"),
                    "count the idempotency keys", ctx);
}

static kl_err_t pg_id_count(kl_store_t *store, uint64_t *count) {
  return pg_call((kl__pg_t *)store, pg_id_count_fn, count);
}

static kl_err_t pg_version_fn(kl__pg_conn_t *conn, void *ctx) {
  return kl__pg_schema_version(conn->pg, ctx);
}

static kl_err_t pg_version(kl_store_t *store, int *version, int *latest) {
  *latest = KL__PG_SCHEMA_VERSION;
  return pg_call((kl__pg_t *)store, pg_version_fn, version);
}

/* ---- scans ------------------------------------------------------------ */

/* A walk over the rows of one query, through a cursor in one REPEATABLE
 * READ transaction: one snapshot, read in chunks, so a walk over a large
 * store neither holds it all in memory nor sees half a commit. */
typedef int(kl_pg_row_fn)(void *ctx, const PGresult *res, int row);

typedef struct kl_pg_walk {
  const char *declare; /* DECLARE kl_walk ... CURSOR FOR ... */
  const char *what;
  int nparams;
  const char *values[2];
  int lengths[2];
  kl_pg_row_fn *row;
  void *ctx;
  int called; /* rows were handed out: no retry on another connection */
} kl_pg_walk_t;

#define KL_PG_FETCH 512 /* rows per FETCH; the same number as below */

static kl_err_t pg_walk_rows(kl__pg_conn_t *conn, kl_pg_walk_t *walk,
                             int *stop) {
  PGresult *res = PQexecParams(conn->pg, "FETCH 512 FROM kl_walk", 0, NULL,
                               NULL, NULL, NULL, 1);
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(conn->pg, res, walk->what);
    PQclear(res);
    return err;
  }
  int n = PQntuples(res);
  walk->called |= n > 0;
  for (int i = 0; i < n && !*stop; i++)
    *stop = walk->row(walk->ctx, res, i);
  if (n < KL_PG_FETCH)
    *stop = 1;
  PQclear(res);
  return KL_OK;
}

static kl_err_t pg_walk_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_walk_t *walk = ctx;
  const int formats[2] = {1, 1};
  kl_err_t err = kl__pg_exec(
      conn->pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", walk->what);
  if (err)
    return err;
  PGresult *res = PQexecParams(conn->pg, walk->declare, walk->nparams, NULL,
                               walk->values, walk->lengths, formats, 1);
  err = kl__pg_ok(res) ? KL_OK : kl__pg_err(conn->pg, res, walk->what);
  PQclear(res);
  for (int stop = 0; !err && !stop;)
    err = pg_walk_rows(conn, walk, &stop);
  kl_err_t end_err = kl__pg_exec(conn->pg, "COMMIT", walk->what);
  return err ? err : end_err;
}

static kl_err_t pg_walk(kl__pg_t *pgs, kl_pg_walk_t *walk) {
  return pg_call_once(pgs, pg_walk_fn, walk, &walk->called);
}

typedef struct kl_pg_scan {
  kl_store_scan_cb_t *cb;
  void *opaque;
} kl_pg_scan_t;

static int pg_scan_row(void *ctx, const PGresult *res, int row) {
  kl_pg_scan_t *scan = ctx;
  return scan->cb(scan->opaque, PQgetvalue(res, row, 0),
                  (size_t)PQgetlength(res, row, 0), PQgetvalue(res, row, 1),
                  (size_t)PQgetlength(res, row, 1));
}

/* The smallest key above every key starting with the prefix: the prefix
 * with its last byte below 0xff incremented and the rest dropped. Returns
 * its length, 0 when there is none (a prefix of 0xff bytes). */
static size_t pg_prefix_end(const unsigned char *prefix, size_t len,
                            unsigned char *end) {
  if (len)
    memcpy(end, prefix, len);
  while (len && end[len - 1] == 0xff)
    len--;
  if (len)
    end[len - 1]++;
  return len;
}

static kl_err_t pg_scan(kl_store_t *store, const void *prefix,
                        size_t prefix_len, kl_store_scan_cb_t *cb,
                        void *opaque) {
  unsigned char end[512];
  if (prefix_len > sizeof(end))
    return KL_OK; /* longer than any key: nothing starts with it */
  size_t end_len = pg_prefix_end(prefix, prefix_len, end);
  kl_pg_scan_t scan = {cb, opaque};
  kl_pg_walk_t walk = {
      end_len ? "DECLARE kl_walk NO SCROLL CURSOR FOR SELECT key, value FROM "
                "keylane_kv WHERE key >= $1::bytea AND key < $2::bytea ORDER "
                "BY key"
              : "DECLARE kl_walk NO SCROLL CURSOR FOR SELECT key, value FROM "
                "keylane_kv WHERE key >= $1::bytea ORDER BY key",
      "scan the handler keys",
      end_len ? 2 : 1,
      {prefix ? prefix : "", (const char *)end},
      {(int)prefix_len, (int)end_len},
      pg_scan_row,
      &scan,
      0};
  return pg_walk((kl__pg_t *)store, &walk);
}

typedef struct kl_pg_ids {
  kl__store_sid_cb_t *cb;
  void *opaque;
} kl_pg_ids_t;

/* Binary columns: id bytea, inserted_ms int8, mark int2, topic text (its
 * bytes, with no NUL: libpq adds one to every value it returns). */
static int pg_ids_row(void *ctx, const PGresult *res, int row) {
  kl_pg_ids_t *ids = ctx;
  int64_t time_ms = (int64_t)kl__get_be(PQgetvalue(res, row, 1), 8);
  kl_mark_t mark = (kl_mark_t)kl__get_be(PQgetvalue(res, row, 2), 2);
  char sid[KL__SID_MAX];
  size_t len = kl__pg_id_in(PQgetvalue(res, row, 0),
                            (size_t)PQgetlength(res, row, 0), sid);
  return ids->cb(ids->opaque, PQgetvalue(res, row, 3), sid, len, time_ms, mark);
}

static kl_err_t pg_ids_walk(kl_store_t *store, kl__store_sid_cb_t *cb,
                            void *opaque) {
  kl_pg_ids_t ids = {cb, opaque};
  kl_pg_walk_t walk = {"DECLARE kl_walk NO SCROLL CURSOR FOR SELECT id, "
                       "inserted_ms, mark, topic FROM keylane_ids ORDER BY "
                       "id, topic",
                       "list the idempotency keys",
                       0,
                       {NULL, NULL},
                       {0, 0},
                       pg_ids_row,
                       &ids,
                       0};
  return pg_walk((kl__pg_t *)store, &walk);
}

static kl_err_t pg_last(kl_store_t *store, const char *topic, int32_t partition,
                        int64_t *watermark, void *ident, size_t *len) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  kl__pg_conn_t *conn;
  kl_err_t err = kl__pg_conn_take(pgs, &conn);
  if (err)
    return err;
  char part[16];
  snprintf(part, sizeof(part), "%" PRId32, partition);
  const char *values[2] = {topic, part};
  PGresult *res = PQexecParams(
      conn->pg,
      "SELECT encode(last_ident, 'hex'), last_ident_wm FROM "
      "keylane_partitions WHERE topic = $1::text AND partition = $2::int4 "
      "AND last_ident IS NOT NULL",
      2, NULL, values, NULL, NULL, 0);
  if (!kl__pg_ok(res)) {
    err = kl__pg_err(conn->pg, res, "read the last record");
  } else if (PQntuples(res) == 1) {
    const char *hex = PQgetvalue(res, 0, 0);
    size_t n = strlen(hex) / 2;
    if (n > KL__SID_MAX)
      n = KL__SID_MAX;
    for (size_t i = 0; i < n; i++) {
      unsigned v;
      sscanf(hex + 2 * i, "%2x", &v);
      ((unsigned char *)ident)[i] = (unsigned char)v;
    }
    *len = n;
    *watermark = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
  }
  PQclear(res);
  kl__pg_conn_give(pgs, conn, err != KL_OK);
  return err;
}

/* ---- open and close --------------------------------------------------- */

static void pg_destroy(kl_store_t *store) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  for (size_t i = 0; i < pgs->idle_count; i++)
    pg_conn_close(pgs->idle[i]);
  pthread_mutex_destroy(&pgs->mu);
  pthread_cond_destroy(&pgs->cv);
  kl__cache_destroy(pgs->cache);
  free(pgs->idle);
  free(pgs->uri);
  free(pgs);
}

/* The store's legacy window (schema 7's keylane_meta). */
static kl_err_t pg_legacy_ids(kl__pg_t *pgs, PGconn *pg) {
  PGresult *res = PQexec(pg, "SELECT value FROM keylane_meta WHERE name = "
                             "'legacy_ids_newest_ms'");
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(pg, res, "read keylane_meta");
    PQclear(res);
    return err;
  }
  if (PQntuples(res) == 1)
    pgs->base.legacy_ids_until_ms =
        strtoll(PQgetvalue(res, 0, 0), NULL, 10) + pgs->retention_ms;
  PQclear(res);
  return KL_OK;
}

static void pg_forget(kl_store_t *store, const char *topic, int32_t partition) {
  kl__cache_drop_partition(((kl__pg_t *)store)->cache, topic, partition);
}

static void pg_cache_stats(kl_store_t *store, kl__cache_stats_t *stats) {
  kl__cache_stats(((kl__pg_t *)store)->cache, stats);
  stats->id_queries = atomic_load(&((kl__pg_t *)store)->id_queries);
  stats->id_prefetched = atomic_load(&((kl__pg_t *)store)->id_prefetched);
  stats->commits = atomic_load(&((kl__pg_t *)store)->commits);
  stats->commit_batches = atomic_load(&((kl__pg_t *)store)->commit_batches);
  stats->commit_ns = atomic_load(&((kl__pg_t *)store)->commit_ns);
}

static size_t pg_txn_max(kl_store_t *store) {
  return ((kl__pg_t *)store)->pool_max;
}

/* kl__pg_schema_missing() on a pooled connection. */
static kl_err_t pg_missing(kl_store_t *store, char *missing, size_t size) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  kl__pg_conn_t *conn;
  kl_err_t err = kl__pg_conn_take(pgs, &conn);
  if (err)
    return err;
  err = kl__pg_schema_missing(conn->pg, missing, size);
  kl__pg_conn_give(pgs, conn, err != KL_OK);
  return err;
}

/* The server's clock_timestamp() in ms, read between *@p before and
 * *@p after on this host's store clock. */
static kl_err_t pg_server_clock(kl_store_t *store, int64_t *server,
                                int64_t *before, int64_t *after) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  kl__pg_conn_t *conn;
  kl_err_t err = kl__pg_conn_take(pgs, &conn);
  if (err)
    return err;
  *before = kl__store_now_ms();
  PGresult *res = PQexec(conn->pg, "SELECT (extract(epoch FROM "
                                   "clock_timestamp()) * 1000)::int8");
  *after = kl__store_now_ms();
  if (kl__pg_ok(res))
    *server = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
  else
    err = kl__pg_err(conn->pg, res, "read the server's clock");
  PQclear(res);
  kl__pg_conn_give(pgs, conn, err != KL_OK);
  return err;
}

/* Every PostgreSQL need of the engine is an entry here (backend.h). */
static int64_t pg_idle_ms(const kl_store_t *store) {
  return ((const kl__pg_t *)store)->idle_timeout_ms;
}

static const kl__store_ops_t pg_ops = {
    .name = "postgresql",
    .destroy = pg_destroy,
    .acquire = pg_acquire,
    .owner_get = kl__pg_owner,
    .owner_set = kl__pg_bind,
    .partition = pg_partition,
    .reset = pg_reset,
    .beat = pg_beat,
    .begin = kl__pg_begin,
    .commit = kl__pg_commit,
    .commit_many = kl__pg_commit_many,
    .abort = kl__pg_abort,
    .get = kl__pg_get,
    .put = kl__pg_put,
    .del = kl__pg_del,
    .seen = kl__pg_seen,
    .mark = kl__pg_mark,
    .count_duplicate = kl__pg_count_duplicate,
    .sweep = kl__pg_sweep,
    .sweeps = kl__pg_sweeps,
    .scan = pg_scan,
    .foreach_partition = pg_foreach_partition,
    .id_count = pg_id_count,
    .ids_walk = pg_ids_walk,
    .last = pg_last,
    .version = pg_version,
    .pg_conn = kl__pg_conn,
    .savepoint = kl__pg_savepoint,
    .begin_ahead = kl__pg_begin_ahead,
    .settle = kl__pg_settle,
    .pending = kl__pg_pending,
    .layout = "schema",
    .missing = pg_missing,
    .server_clock = pg_server_clock,
    .prefetch = kl__pg_prefetch,
    .lost = kl__pg_lost,
    .txn_max = pg_txn_max,
    .forget = pg_forget,
    .cache_stats = pg_cache_stats,
    .outbox_list = kl__pg_outbox_list,
    .outbox_del = kl__pg_outbox_del,
    .idle_ms = pg_idle_ms,
};

/* store.pg.idle.timeout=0 leaves the server's setting (a role's or a
 * database's idle_in_transaction_session_timeout): read from @p pg, the
 * session's, so that the batches and the handler timeout keep under it
 * as they keep under a configured one. */
static kl_err_t pg_server_idle(kl__pg_t *pgs, PGconn *pg) {
  PGresult *res = PQexec(pg, "SELECT setting::bigint FROM pg_settings WHERE "
                             "name = 'idle_in_transaction_session_timeout'");
  kl_err_t err = KL_OK;
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
    err = kl__err(KL_ESTORE,
                  "postgresql: cannot read the server's "
                  "idle_in_transaction_session_timeout (store.pg.idle.timeout "
                  "is 0, the server's setting): %s",
                  PQresultErrorMessage(res));
  else
    pgs->idle_timeout_ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  return err;
}

static kl_err_t pg_new(const char *uri, const kl_conf_t *conf, kl__pg_t **out) {
  kl__pg_t *pgs = calloc(1, sizeof(*pgs));
  if (!pgs)
    return KL_ENOMEM;
  pgs->base.ops = &pg_ops;
  pgs->retention_ms = kl__conf_int(conf, "store.dedup.retention");
  pgs->idle_timeout_ms = kl__conf_int(conf, "store.pg.idle.timeout");
  pgs->connect_timeout_s = kl__pg_connect_timeout_s(conf);
  pgs->create = strcmp(kl_conf_get(conf, "store.create"), "no") != 0;
  pgs->migrate = strcmp(kl_conf_get(conf, "store.pg.migrate"), "never") != 0;
  int64_t pool = kl__conf_int(conf, "store.pg.pool");
  pgs->pool_max = pool > 0 ? (size_t)pool : KL_PG_POOL_DEFAULT;
  pgs->uri = strdup(uri);
  pgs->idle = calloc(pgs->pool_max, sizeof(*pgs->idle));
  int64_t cache_max = kl__conf_int(conf, "store.cache.max");
  pgs->cache = kl__cache_new(cache_max > 0 ? (size_t)cache_max : 0);
  pthread_mutex_init(&pgs->mu, NULL);
  pthread_cond_init(&pgs->cv, NULL);
  if (!pgs->uri || !pgs->idle) {
    pg_destroy(&pgs->base);
    return KL_ENOMEM;
  }
  *out = pgs;
  return KL_OK;
}

/* store.pg.migrate=never (a worker's role creates nothing, docs/
 * production.md): a database without keylane's schema is refused, naming
 * the command that creates it, as KL_ENOTFOUND, which keylane worker
 * waits out for worker.store.wait (a fleet started beside its migration
 * job); one with it opens as with store.create=no (an older one is
 * refused there, a newer one too). */
static kl_err_t pg_schema_open(kl__pg_t *pgs, PGconn *pg) {
  int version = 0;
  kl_err_t err;
  if (pgs->migrate || !pgs->create)
    return kl__pg_schema_open(pg, pgs->create);
  if ((err = kl__pg_schema_version(pg, &version)))
    return err;
  if (version == 0) /* not KL_ESTORE_VERSION: a worker waits for it */
    return kl__err(KL_ENOTFOUND,
                   "postgresql: database %s has no keylane schema, and "
                   "store.pg.migrate=never (keylane worker's default: its "
                   "role creates nothing): create it first with `keylane "
                   "store migrate --store URI` as the schema's owner, or "
                   "let this process create it with -X store.pg.migrate=auto",
                   PQdb(pg));
  return kl__pg_schema_open(pg, 0);
}

kl_err_t kl__store_pg_open(const char *uri, const kl_conf_t *conf,
                           kl_store_t **out) {
  kl__pg_t *pgs;
  kl_err_t err = pg_new(uri, conf, &pgs);
  if (err)
    return err;
  kl__pg_conn_t *conn;
  err = pg_connect(pgs, KL_ESTORE, &conn);
  if (!err) {
    err = pg_schema_open(pgs, conn->pg);
    if (!err)
      err = pg_legacy_ids(pgs, conn->pg);
    if (!err && pgs->idle_timeout_ms == 0)
      err = pg_server_idle(pgs, conn->pg);
    pgs->open = 1;
    kl__pg_conn_give(pgs, conn, err != KL_OK);
  }
  if (err) {
    pg_destroy(&pgs->base);
    return err;
  }
  *out = &pgs->base;
  return KL_OK;
}
