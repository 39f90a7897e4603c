/*
 * The built-in inventory handler: the article's decrement,
 *
 *   UPDATE stock SET qty = qty - 1 WHERE topic = $2 AND sku = $1 AND qty > 0
 *
 * run on the batch's own PostgreSQL connection, so it commits with the
 * event's idempotency key and under the owner's fence, or not at all. One
 * row updated: a unit was reserved; none: sold out (a SKU without a stock
 * row has no stock either). Either outcome is recorded, once per event, in
 * keylane_inventory_outcomes, keyed as the event's idempotency key is
 * scoped: (topic, SKU, id), so one id on two SKUs records two outcomes. No lock
 * is waited for: the SKU is the event key and its row is the topic's, so
 * one worker owns it (a row shared by two topics' owners was locked by a
 * paused one until the server ended its session), and the guard qty > 0
 * keeps a redelivery that slipped past the idempotency store (it cannot)
 * from going negative.
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "common/sqlstate.h"
#include "handlers/inventory.h"

/* The handler's two statements. kl__inventory_check() runs them as they
 * are, with a condition that matches no row appended. */
#define INVENTORY_TAKE                                                         \
  "UPDATE stock SET qty = qty - 1 WHERE topic = $2::text AND sku = $1::text "  \
  "AND qty > 0"
#define INVENTORY_RECORD                                                       \
  "INSERT INTO keylane_inventory_outcomes (id, sku, outcome, partition, "      \
  "epoch, event_offset, topic) SELECT $1::bytea, $2::text, $3::text, "         \
  "$4::int4, $5::int8, $6::int8, $7::text"

/* What the handler's statement @p record (0: the decrement, 1: the
 * outcome's record) failing with @p res needs from a person, as "; " and
 * the fix; "" when it is not the setup's. */
static void inventory_fix(const PGresult *res, int record, const char *topic,
                          char *buf, size_t size) {
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  buf[0] = '\0';
  if (!state)
    return;
  if (strcmp(state, "42501") == 0)
    snprintf(buf, size,
             "; the store's role may not %s: grant it (%s TO the role "
             "in --store)",
             record ? "add rows to keylane_inventory_outcomes"
                    : "read and update stock",
             record ? "GRANT INSERT ON keylane_inventory_outcomes"
                    : "GRANT SELECT, UPDATE ON stock");
  else if (strcmp(state, "25006") == 0)
    snprintf(buf, size,
             "; the store's session is read-only (default_transaction_"
             "read_only for its role or database, or a standby): point "
             "--store at a writable primary");
  else if (record && (strcmp(state, "42P01") == 0 || !strcmp(state, "42703")))
    snprintf(buf, size,
             "; keylane_inventory_outcomes comes with keylane's schema: run "
             "`keylane store migrate --store URI`");
  else if (strcmp(state, "42P01") == 0)
    snprintf(buf, size,
             "; stock is the application's table, which keylane's "
             "migrations do not create: " KL__INVENTORY_STOCK_DDL);
  else if (strcmp(state, "42703") == 0 &&
           strstr(PQresultErrorMessage(res), "\"topic\""))
    snprintf(buf, size,
             "; stock is keyed by SKU alone, as an older keylane made it, "
             "so two topics' owners would write one row: give its rows "
             "their topic with " KL__INVENTORY_STOCK_MIGRATE,
             topic);
  else if (strcmp(state, "42703") == 0)
    snprintf(buf, size,
             "; stock is the application's table: " KL__INVENTORY_STOCK_DDL);
}

/* A statement's failure as a handler verdict: the event's SQL is rolled
 * back either way. A lost link or a transient SQLSTATE (the store's own
 * list, common/sqlstate.h: a lock timeout, too many connections) may pass
 * on a re-run: RETRY. One of the setup (a revoked privilege, a dropped
 * table, a read-only session) is the operator's, not the event's, and
 * passes once a person fixed it: KL__HANDLER_STORE, which counts no
 * attempt and is never a dead letter (a store failure: the partition
 * waits, /healthz says why). */
static kl_handler_result_t inventory_fail(PGconn *pg, PGresult *res, int record,
                                          const char *topic, char *errbuf,
                                          size_t errbuf_size) {
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  const char *msg = PQresultErrorMessage(res);
  char fix[512];
  inventory_fix(res, record, topic, fix, sizeof(fix));
  int setup = PQstatus(pg) == CONNECTION_OK && kl__sqlstate_setup(state);
  int retry = PQstatus(pg) != CONNECTION_OK || kl__sqlstate_transient(state);
  snprintf(errbuf, errbuf_size, "inventory: %s: %.*s%s",
           record ? "record the outcome" : "take a unit",
           (int)strcspn(msg, "\n"), msg, fix);
  PQclear(res);
  if (setup)
    return (kl_handler_result_t)KL__HANDLER_STORE;
  return retry ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
}

kl_handler_result_t kl__inventory_handler(void *opaque, const kl_event_t *event,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size) {
  (void)opaque;
  PGconn *pg = kl_txn_pg_conn(txn);
  if (!pg) {
    snprintf(errbuf, errbuf_size,
             "inventory: this handler runs SQL on the batch's PostgreSQL "
             "connection and kl_txn_pg_conn() gave none: the store is not "
             "PostgreSQL (use --store postgresql://...), or the worker runs "
             "the handler where no batch transaction is its own (key-"
             "parallel, worker.concurrency > 1)");
    return KL_HANDLER_FAIL;
  }
  if (event->type_len != 7 || memcmp(event->type, "reserve", 7) != 0) {
    snprintf(errbuf, errbuf_size,
             "inventory: event type \"%.*s\" is not "
             "reserve",
             (int)event->type_len, event->type);
    return KL_HANDLER_FAIL;
  }
  /* Binary text parameters: the key's bytes as they are, no NUL needed. */
  const char *take[2] = {event->key, fence->topic};
  int take_len[2] = {(int)event->key_len, 0}, take_fmt[2] = {1, 0};
  PGresult *res =
      PQexecParams(pg, INVENTORY_TAKE, 2, NULL, take, take_len, take_fmt, 0);
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    return inventory_fail(pg, res, 0, fence->topic, errbuf, errbuf_size);
  const char *outcome =
      strcmp(PQcmdTuples(res), "1") == 0 ? "reserved" : "sold_out";
  PQclear(res);

  char part[16], epoch[24], offset[24];
  snprintf(part, sizeof(part), "%" PRId32, fence->partition);
  snprintf(epoch, sizeof(epoch), "%" PRIu64, fence->epoch);
  snprintf(offset, sizeof(offset), "%" PRId64, fence->offset);
  const char *rec[7] = {event->id, event->key, outcome,     part,
                        epoch,     offset,     fence->topic};
  int rec_len[7] = {(int)event->id_len, (int)event->key_len, 0, 0, 0, 0, 0};
  int rec_fmt[7] = {1, 1, 0, 0, 0, 0, 0};
  res = PQexecParams(pg, INVENTORY_RECORD, 7, NULL, rec, rec_len, rec_fmt, 0);
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    return inventory_fail(pg, res, 1, fence->topic, errbuf, errbuf_size);
  PQclear(res);
  return KL_HANDLER_OK;
}

/* Runs the handler's statements on @p pg so that they match no row: what
 * they need (tables, columns, privileges, a writable session) is checked,
 * nothing is written or locked. */
static kl_err_t inventory_probe(PGconn *pg, const char *topic) {
  const char *take[2] = {"", topic};
  const char *rec[7] = {"", "", "reserved", "0", "0", "0", topic};
  PGresult *res = PQexecParams(pg, INVENTORY_TAKE " AND false", 2, NULL, take,
                               NULL, NULL, 0);
  int record = 0;
  if (PQresultStatus(res) == PGRES_COMMAND_OK) {
    PQclear(res);
    record = 1;
    res = PQexecParams(pg, INVENTORY_RECORD " WHERE false", 7, NULL, rec, NULL,
                       NULL, 0);
    if (PQresultStatus(res) == PGRES_COMMAND_OK) {
      PQclear(res);
      return KL_OK;
    }
  }
  const char *msg = PQresultErrorMessage(res);
  char fix[512];
  inventory_fix(res, record, topic, fix, sizeof(fix));
  kl_err_t err =
      kl__err(KL_ECONF, "--handler inventory cannot %s on the store: %.*s%s",
              record ? "record an outcome" : "take a unit of stock",
              (int)strcspn(msg, "\n"), msg, fix);
  PQclear(res);
  return err;
}

kl_err_t kl__inventory_check(kl_txn_t *txn, const char *topic,
                             const kl_conf_t *conf) {
  int64_t threads = conf ? kl__conf_int(conf, "worker.concurrency") : 1;
  if (threads > 1)
    return kl__err(
        KL_ECONF,
        "--handler inventory with worker.concurrency=%" PRId64 ": the "
        "handler runs its SQL in the batch's transaction, and key-parallel "
        "executors have none of their own (each event reads a snapshot; "
        "the batch commits later, on another connection), so every event "
        "would be dead-lettered; run it with --concurrency 1, and spread "
        "the load over more partitions and workers",
        threads);
  PGconn *pg = kl_txn_pg_conn(txn);
  if (!pg)
    return kl__err(KL_ECONF,
                   "--handler inventory runs its SQL on the "
                   "batch's PostgreSQL connection, and the store "
                   "lends none (%s); use --store postgresql://...",
                   kl_err_detail());
  return inventory_probe(pg, topic);
}
