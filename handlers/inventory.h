/* The built-in inventory handler (`--handler inventory`), PostgreSQL only. */
#ifndef KEYLANE_HANDLERS_INVENTORY_H
#define KEYLANE_HANDLERS_INVENTORY_H

#include "keylane/conf.h"
#include "keylane/store.h"
#include "keylane/worker.h"

/* The table the handler decrements: the application's, not keylane's, so
 * keylane's migrations do not create it. A SKU's units are counted per
 * topic, so that the owners of two topics sharing the store are never two
 * writers of one row (docs/design.md, "One writer per row"). */
#define KL__INVENTORY_STOCK_DDL                                                \
  "CREATE TABLE stock (topic text NOT NULL, sku text NOT NULL, qty integer "   \
  "NOT NULL CHECK (qty >= 0), PRIMARY KEY (topic, sku))"

/* A stock table of an older keylane, keyed by SKU alone, moved to the
 * key above: its rows go to the topic named by the one %s. A topic's
 * name holds no quote (Kafka's names are [a-zA-Z0-9._-]). */
#define KL__INVENTORY_STOCK_MIGRATE                                            \
  "ALTER TABLE stock ADD COLUMN topic text NOT NULL DEFAULT '%s', DROP "       \
  "CONSTRAINT stock_pkey, ADD PRIMARY KEY (topic, sku); ALTER TABLE stock "    \
  "ALTER COLUMN topic DROP DEFAULT"

/**
 * Applies a "reserve" event whose key is a SKU: takes one unit of the
 * event's topic's stock of it if there is one, on the batch's connection,
 * and records the outcome ("reserved" or "sold_out") in
 * keylane_inventory_outcomes, in the same transaction as the event's
 * idempotency key and the owner's fence.
 */
kl_handler_result_t kl__inventory_handler(void *opaque, const kl_event_t *event,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size);

/**
 * Checks, before a worker of @p topic starts, what would make the handler
 * fail every event: worker.concurrency above 1 in @p conf (NULL: none
 * set), a stock table that is missing or keyed by SKU alone, no
 * keylane_inventory_outcomes, a role that may not write them, a read-only
 * session. The handler's own statements run on @p txn's connection, a
 * batch of the topic the caller begun for the check and aborts, matching
 * no row: what they need is what is checked, and nothing is written or
 * locked.
 * @returns KL_OK, or KL_ECONF with the problem and its fix in
 *          kl_err_detail().
 */
kl_err_t kl__inventory_check(kl_txn_t *txn, const char *topic,
                             const kl_conf_t *conf);

#endif
