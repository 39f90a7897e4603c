/**
 * @file handlers.h
 * @brief The handlers keylane ships, ready to pass to kl_worker_new(): the
 *        ledger of `keylane demo` and the tests.
 *
 * Each is a kl_handler_fn_t (worker.h) and an example of its contract:
 * reads and writes go through the batch's txn, and a follow-up to another
 * key is emitted (kl_txn_emit()) rather than written.
 *
 * Caveats:
 * - The ledger keeps no state outside the store: it may run on any number
 *   of executor threads (worker.concurrency).
 */
#ifndef KEYLANE_HANDLERS_H
#define KEYLANE_HANDLERS_H

#include "keylane/worker.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The ledger: a balance per entity key. Events of type "credit" and
 * "debit" carry the msgpack map {"amount": int, "seq": int}; a "transfer"
 * {"to": key, "amount": int, "seq": int} debits its key and emits a
 * "credit" to "to", committed with the debit. The entry of a key is kept
 * under "ledger:" TOPIC "/" KEY (balance, last seq and order violations):
 * an event whose seq is not the last one + 1 is applied and counted as a
 * violation, which one writer per key applying in log order never makes.
 * An amount that is not positive, a balance that would pass INT64_MAX, an
 * unknown type or a malformed payload is KL_HANDLER_FAIL, with the reason
 * in @p errbuf (the event is dead-lettered, the balance stays). See the
 * README for the demo that runs it.
 * @param opaque  unused: pass NULL.
 */
KL_EXPORT kl_handler_result_t kl_ledger_handler(void *opaque,
                                                const kl_event_t *event,
                                                const kl_fence_t *fence,
                                                kl_txn_t *txn, char *errbuf,
                                                size_t errbuf_size);

#ifdef __cplusplus
}
#endif
#endif
