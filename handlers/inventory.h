/* The built-in inventory handler (`--handler inventory`), PostgreSQL only. */
#ifndef KEYLANE_HANDLERS_INVENTORY_H
#define KEYLANE_HANDLERS_INVENTORY_H

#include "keylane/worker.h"

/* The table the handler decrements: the application's, not keylane's, so
 * keylane's migrations do not create it. */
#define KL__INVENTORY_STOCK_DDL                                                \
  "CREATE TABLE stock (sku text PRIMARY KEY, qty integer NOT NULL CHECK "      \
  "(qty >= 0))"

/**
 * Applies a "reserve" event whose key is a SKU: takes one unit of stock if
 * there is one, on the batch's connection, and records the outcome
 * ("reserved" or "sold_out") in keylane_inventory_outcomes, in the same
 * transaction as the event's idempotency key and the owner's fence.
 */
kl_handler_result_t kl__inventory_handler(void *opaque, const kl_event_t *event,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size);

#endif
