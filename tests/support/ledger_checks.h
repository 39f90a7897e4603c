/* cmocka steps over a ledger workload, shared by the worker tests. */
#ifndef KEYLANE_TESTS_LEDGER_CHECKS_H
#define KEYLANE_TESTS_LEDGER_CHECKS_H

#include "keylane/producer.h"
#include "keylane/store.h"
#include "worker/ledger_gen.h"

/* Publishes @p n events to @p topic, re-publishing an earlier one with its
 * idempotency key after every 10th, and waits until Kafka acked them all. */
void kl_t_ledger_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, int n);

/* Asserts that @p store holds exactly what @p gen published: every balance
 * and last seq, no order violation, each event applied once, each
 * re-published one suppressed. */
void kl_t_ledger_assert_verified(const kl__ledger_gen_t *gen,
                                 kl_store_t *store, const char *topic);

#endif
