/*
 * The built-in inventory handler: the article's decrement,
 *
 *   UPDATE stock SET qty = qty - 1 WHERE sku = $1 AND qty > 0
 *
 * run on the batch's own PostgreSQL connection, so it commits with the
 * event's idempotency key and under the owner's fence, or not at all. One
 * row updated: a unit was reserved; none: sold out (a SKU without a stock
 * row has no stock either). Either outcome is recorded, once per event, in
 * keylane_inventory_outcomes, keyed as the event's idempotency key is
 * scoped: (topic, SKU, id), so one id on two SKUs records two outcomes. No lock
 * is taken: the SKU is the event key, so one worker owns it, and the guard qty
 * > 0 keeps a redelivery that slipped past the idempotency store (it cannot)
 * from going negative.
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

#include "common/sqlstate.h"
#include "handlers/inventory.h"

/* A statement's failure as a handler verdict: the batch's transaction is
 * aborted either way; a lost link or a transient SQLSTATE (the store's own
 * list, common/sqlstate.h: a lock timeout, too many connections, a
 * conflict) may pass on a re-run, so it is RETRY, never a dead letter. */
static kl_handler_result_t inventory_fail(PGconn *pg, PGresult *res,
                                          const char *what, char *errbuf,
                                          size_t errbuf_size) {
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  const char *msg = PQresultErrorMessage(res);
  int missing = state && strcmp(state, "42P01") == 0;
  int retry = PQstatus(pg) != CONNECTION_OK || kl__sqlstate_transient(state);
  snprintf(errbuf, errbuf_size, "inventory: %s: %.*s%s", what,
           (int)strcspn(msg, "\n"), msg,
           missing
               ? "; stock is the application's table: " KL__INVENTORY_STOCK_DDL
                 "; keylane_inventory_outcomes "
                 "comes with keylane's schema (keylane store migrate)"
               : "");
  PQclear(res);
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
  const char *take[1] = {event->key};
  int take_len[1] = {(int)event->key_len}, take_fmt[1] = {1};
  PGresult *res = PQexecParams(pg,
                               "UPDATE stock SET qty = qty - 1 WHERE "
                               "sku = $1::text AND qty > 0",
                               1, NULL, take, take_len, take_fmt, 0);
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    return inventory_fail(pg, res, "take a unit", errbuf, errbuf_size);
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
  res = PQexecParams(pg,
                     "INSERT INTO keylane_inventory_outcomes (id, sku, "
                     "outcome, partition, epoch, event_offset, topic) VALUES "
                     "($1::bytea, $2::text, $3::text, $4::int4, $5::int8, "
                     "$6::int8, $7::text)",
                     7, NULL, rec, rec_len, rec_fmt, 0);
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    return inventory_fail(pg, res, "record the outcome", errbuf, errbuf_size);
  PQclear(res);
  return KL_HANDLER_OK;
}
