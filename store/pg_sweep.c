/*
 * The PostgreSQL store's expiry of idempotency keys, one topic at a time.
 *
 * A sweep of topic T removes T's expired ids alone, judged by the
 * retention of the store it was called on: another topic sharing the
 * store is never touched, whatever retention its fleet keeps (issue 39: a
 * worker started with a 5 s retention emptied every topic's ids, and a 7d
 * fleet swept a 30d fleet's). keylane_topic_sweeps holds, per topic, the
 * page of keylane_ids where T's next sweep starts, and the retention and
 * time of T's last sweep that removed ids (kl__store_sweeps(), for
 * `keylane doctor`). Each topic walks every page with its own position,
 * so two fleets' sweeps neither fight over one row nor skip each other's
 * ids.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/mutant.h"
#include "store/pg.h"
#include "store/store_internal.h"

typedef struct kl_pg_sweep {
  const char *topic;
  int64_t retention_ms;
  size_t max;
  size_t removed;
  int has_row; /* the topic's row was there (and not being swept) */
} kl_pg_sweep_t;

/* A sweep of @p max keys visits this many pages of keylane_ids: an 8 KiB
 * page holds about 100 keys of 36-byte ids (97 in keylane-bench store). */
#define KL_PG_SWEEP_KEYS_PER_PAGE 100

/* One statement, so one short transaction. It takes the topic's position
 * ($5's row of keylane_topic_sweeps; SKIP LOCKED: while another worker
 * sweeps the topic, this call does nothing), removes at most max expired
 * keys of the topic on the next pages (a TID range scan: no index on
 * insert times for every commit to write), and moves the position past
 * them, back to page 0 after the table's end. A call that removed max
 * keys stays on its pages, so no expired key is left behind for a whole
 * walk. Keys a commit holds (re-marking them) are skipped too, for the
 * next walk: the sweep never waits for a commit or deadlocks with one.
 * The cutoff is the server's time, as the keys' insert times are. The id
 * of a timer that waits (mark 3, KL__MARK_TIMER) is never expired: it stays
 * until its firing or cancel re-marks it (store_internal.h).
 * @p MINE picks the ids it may remove: the topic's. */
#define KL_PG_EXPIRED                                                          \
  "mark <> 3 AND inserted_ms < " KL__PG_NOW_MS(1) " - $2::int8"
#define KL_PG_SWEEP_SQL(MINE)                                                  \
  "WITH s AS (SELECT CASE WHEN next_page < pg_relation_size('keylane_ids') "   \
  "/ current_setting('block_size')::int8 THEN next_page ELSE 0 END AS page "   \
  "FROM keylane_topic_sweeps WHERE topic = $5 FOR UPDATE SKIP LOCKED), "       \
  "d AS (DELETE FROM keylane_ids WHERE ctid = ANY(ARRAY(SELECT ctid FROM "     \
  "keylane_ids WHERE ctid >= (SELECT format('(%s,0)', page)::tid FROM s) "     \
  "AND ctid < (SELECT format('(%s,0)', page + $4::int8)::tid FROM s) "         \
  "AND " MINE " AND " KL_PG_EXPIRED " LIMIT $3::int8 FOR UPDATE SKIP "         \
  "LOCKED)) AND " MINE " AND " KL_PG_EXPIRED " RETURNING 1), "                 \
  "n AS (SELECT count(*) AS removed FROM d), "                                 \
  "u AS (UPDATE keylane_topic_sweeps t SET next_page = s.page + CASE WHEN "    \
  "n.removed < $3::int8 THEN $4::int8 ELSE 0 END, retention_ms = CASE WHEN "   \
  "n.removed > 0 THEN $2::int8 ELSE t.retention_ms END, swept_ms = CASE "      \
  "WHEN n.removed > 0 THEN " KL__PG_NOW_MS(                                    \
      1) " ELSE t.swept_ms END "                                               \
         "FROM s, n WHERE t.topic = $5) "                                      \
         "SELECT removed, (SELECT count(*) FROM s) FROM n"

_Static_assert(KL__MARK_TIMER == 3, "KL_PG_EXPIRED spells the timer's mark");

static const char kl_pg_sweep_sql[] = KL_PG_SWEEP_SQL("topic = $5");
#ifdef KL_SIM_MUTANTS
/* Test only (common/mutant.h): KL__MUTANT_SWEEP removes every topic's
 * expired ids, as the store-wide sweep before issue 39 did. */
static const char kl_pg_sweep_all_sql[] =
    KL_PG_SWEEP_SQL("$5::text IS NOT NULL");
#define KL_PG_SWEEP_TEXT                                                       \
  (KL__MUTANT(KL__MUTANT_SWEEP) ? kl_pg_sweep_all_sql : kl_pg_sweep_sql)
#else
#define KL_PG_SWEEP_TEXT kl_pg_sweep_sql
#endif

static kl_err_t pg_sweep_run(kl__pg_conn_t *conn, kl_pg_sweep_t *sw) {
  char now[24], retention[24], max[24], pages[24];
  kl__pg_clock_param(now, sizeof(now));
  snprintf(retention, sizeof(retention), "%" PRId64, sw->retention_ms);
  snprintf(max, sizeof(max), "%zu", sw->max);
  snprintf(pages, sizeof(pages), "%zu",
           (sw->max + KL_PG_SWEEP_KEYS_PER_PAGE - 1) /
               KL_PG_SWEEP_KEYS_PER_PAGE);
  const char *values[5] = {now, retention, max, pages, sw->topic};
  PGresult *res =
      PQexecParams(conn->pg, KL_PG_SWEEP_TEXT, 5, NULL, values, NULL, NULL, 0);
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res) || PQntuples(res) != 1 || PQnfields(res) != 2)
    err = kl__pg_err(conn->pg, res, "sweep expired idempotency keys");
  else {
    sw->removed = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
    sw->has_row = strcmp(PQgetvalue(res, 0, 1), "0") != 0;
  }
  PQclear(res);
  return err;
}

/* The topic's first sweep makes its row, then sweeps; a row that is
 * there but was skipped is another worker's sweep of the topic. */
static kl_err_t pg_sweep_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_sweep_t *sw = ctx;
  kl_err_t err = pg_sweep_run(conn, sw);
  if (err || sw->has_row)
    return err;
  const char *values[1] = {sw->topic};
  PGresult *res = PQexecParams(conn->pg,
                               "INSERT INTO keylane_topic_sweeps (topic) "
                               "VALUES ($1) ON CONFLICT DO NOTHING",
                               1, NULL, values, NULL, NULL, 0);
  int made = kl__pg_ok(res) && strcmp(PQcmdTuples(res), "1") == 0;
  if (!kl__pg_ok(res))
    err = kl__pg_err(conn->pg, res, "record a topic's sweep");
  PQclear(res);
  return err || !made ? err : pg_sweep_run(conn, sw);
}

kl_err_t kl__pg_sweep(kl_store_t *store, const char *topic, size_t max,
                      size_t *removed) {
  kl__pg_t *pgs = (kl__pg_t *)store;
  *removed = 0;
  if (max == 0)
    return KL_OK;
  kl_pg_sweep_t sw = {topic, pgs->retention_ms, max, 0, 0};
  kl_err_t err = kl__pg_call(pgs, pg_sweep_fn, &sw);
  *removed = err ? 0 : sw.removed;
  return err;
}

typedef struct kl_pg_sweeps {
  kl__store_sweep_cb_t *cb;
  void *opaque;
} kl_pg_sweeps_t;

static kl_err_t pg_sweeps_fn(kl__pg_conn_t *conn, void *ctx) {
  kl_pg_sweeps_t *each = ctx;
  PGresult *res = PQexec(conn->pg, "SELECT topic, retention_ms, swept_ms "
                                   "FROM keylane_topic_sweeps WHERE "
                                   "retention_ms IS NOT NULL ORDER BY topic");
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(conn->pg, res, "read the sweeps' retentions");
    PQclear(res);
    return err;
  }
  for (int i = 0; i < PQntuples(res); i++)
    if (each->cb(each->opaque, PQgetvalue(res, i, 0),
                 strtoll(PQgetvalue(res, i, 1), NULL, 10),
                 strtoll(PQgetvalue(res, i, 2), NULL, 10)))
      break;
  PQclear(res);
  return KL_OK;
}

kl_err_t kl__pg_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                       void *opaque) {
  kl_pg_sweeps_t each = {cb, opaque};
  return kl__pg_call((kl__pg_t *)store, pg_sweeps_fn, &each);
}
