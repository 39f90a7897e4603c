/*
 * The store contract: what every kl_store_t backend does alike (epochs,
 * batches and their fence, idempotency keys, counters, scans, expiry),
 * written once and run by each backend's test program against its own
 * store (tests/unit/test_store_lmdb.c, tests/pg/test_store_pg.c), and the
 * helpers those programs' own tests use too.
 *
 * A program's test state starts with a kl_t_store_fixture_t: its setup
 * fills in where the store lives, and it lists the contract in its
 * CMUnitTest array with KL_T_STORE_CONTRACT_TESTS(setup, teardown). A setup
 * that cannot make a store (no PostgreSQL server) leaves *state NULL, and
 * the contract tests skip, saying so. The teardown removes the store and
 * puts the store's clock back: kl__store_set_clock(NULL).
 *
 * Uses cmocka: the helpers fail the running test on an error. The
 * benchmark, which links support/ but is no cmocka program, must not use
 * this file.
 */
#ifndef KEYLANE_TESTS_SUPPORT_STORE_CONTRACT_H
#define KEYLANE_TESTS_SUPPORT_STORE_CONTRACT_H

#include <stdint.h>

#include "keylane/store.h"

/** The topic of every helper's partitions. */
#define KL_T_TOPIC "orders"

/** What the contract tests need of a program's state; first in it. */
typedef struct kl_t_store_fixture {
  /** What kl_store_open() takes: an LMDB directory or a postgresql:// URI. */
  char where[256];
} kl_t_store_fixture_t;

/**
 * The running test's fixture, from cmocka's @p state; skips the test,
 * saying so, when the program's setup left none.
 */
kl_t_store_fixture_t *kl_t_store_fixture(void **state);

/**
 * Opens the store at @p where with "key", "value", ..., NULL settings.
 * @returns what kl_store_open() returned, or KL_ECONF for a bad setting;
 *          *store is the caller's to kl_store_destroy() on KL_OK.
 * No cmocka: a forked child may call it.
 */
kl_err_t kl_t_store_try_open(const char *where, kl_store_t **store, ...);

/** The same, failing the test on an error. @returns the store. */
kl_store_t *kl_t_store_open(const char *where, ...);

/* Writes format version @p format into the LMDB store in @p where, as a
 * keylane of another format would have made it. */
void kl_t_lmdb_set_format(const char *where, uint32_t format);

/** Fails the test unless kl_err_detail() holds @p want. */
void kl_t_store_detail_has(const char *want);

/** Acquires @p partition of KL_T_TOPIC. @returns the new epoch. */
uint64_t kl_t_store_acquire(kl_store_t *store, int32_t partition);

/** The state of @p partition of KL_T_TOPIC. */
kl_partition_state_t kl_t_store_partition(kl_store_t *store, int32_t partition);

/** Begins a batch on @p partition of KL_T_TOPIC as owner @p epoch. */
kl_txn_t *kl_t_store_begin(kl_store_t *store, int32_t partition,
                           uint64_t epoch);

/** Commits @p txn, failing the test unless it is applied. */
void kl_t_store_commit(kl_txn_t *txn, int64_t watermark);

/** Puts the strings @p key and @p val. */
void kl_t_txn_put(kl_txn_t *txn, const char *key, const char *val);

/**
 * @returns the value of the string @p key, or NULL when absent.
 * @remark A static buffer: valid until the next call; copy it out.
 */
const char *kl_t_txn_get(kl_txn_t *txn, const char *key);

/**
 * The backends' id space as it is, below the public calls: @p id is
 * unscoped, as a store recorded ids before they were scoped by entity key
 * (store_internal.h, "sid"). A backend answers for it as for any scoped
 * id, so the contract tests of marks, fences and sweeps use these; an
 * upgrade's test reads with them what the old format recorded.
 * @returns the mark of the string @p id. */
kl_mark_t kl_t_txn_seen(kl_txn_t *txn, const char *id);

/** Marks the string @p id (unscoped, as kl_t_txn_seen()). */
void kl_t_txn_mark(kl_txn_t *txn, const char *id, kl_mark_t mark);

/** Prefetches the strings @p ids (unscoped, as kl_t_txn_seen()); at most
 *  16. */
void kl_t_txn_prefetch(kl_txn_t *txn, const char *const *ids, size_t n);

/** kl_txn_seen() and kl_txn_mark() of @p id on entity @p key: what the
 *  worker calls. */
kl_mark_t kl_t_txn_seen_key(kl_txn_t *txn, const char *key, const char *id);
void kl_t_txn_mark_key(kl_txn_t *txn, const char *key, const char *id,
                       kl_mark_t mark);

/** Acquires partition 0 of @p topic. @returns the new epoch. */
uint64_t kl_t_topic_acquire(kl_store_t *store, const char *topic);

/** Marks event "credit-1" of entity "acct-1" applied on partition 0 of
 *  @p topic as owner @p epoch, in a batch committing @p watermark. */
void kl_t_topic_mark(kl_store_t *store, const char *topic, uint64_t epoch,
                     int64_t watermark);

/** The mark of that event on partition 0 of @p topic, as owner @p epoch. */
kl_mark_t kl_t_topic_seen(kl_store_t *store, const char *topic, uint64_t epoch);

/** Makes the store's clock read @p now_ms, until kl__store_set_clock(NULL). */
void kl_t_store_clock_set(int64_t now_ms);

/** Moves that clock @p ms forward. */
void kl_t_store_clock_add(int64_t ms);

/* The contract, as X(name, setup, teardown): the test function
 * kl_t_contract_<name>, run under the name test_<name>. */
#define KL_T_STORE_CONTRACT(X, setup, teardown)                                \
  X(acquire_increments_and_persists, setup, teardown)                          \
  X(acquire_above_a_floor, setup, teardown)                                    \
  X(batch_visibility, setup, teardown)                                         \
  X(a_batch_starts_empty, setup, teardown)                                     \
  X(batches_on_threads_at_once, setup, teardown)                               \
  X(seen_and_mark, setup, teardown)                                            \
  X(prefetch_answers_seen, setup, teardown)                                    \
  X(dead_letter_never_replaces_applied, setup, teardown)                       \
  X(timer_mark, setup, teardown)                                               \
  X(ids_scoped_by_topic, setup, teardown)                                      \
  X(ids_scoped_by_key, setup, teardown)                                        \
  X(long_keys_and_ids, setup, teardown)                                        \
  X(last_record_kept_with_its_watermark, setup, teardown)                      \
  X(fenced_commit_applies_nothing, setup, teardown)                            \
  X(watermark_never_goes_back, setup, teardown)                                \
  X(reset_rewinds_and_fences, setup, teardown)                                 \
  X(owner_recorded_with_the_first_epoch, setup, teardown)                      \
  X(counters, setup, teardown)                                                 \
  X(beats_need_the_current_epoch, setup, teardown)                             \
  X(scan_order_and_prefix, setup, teardown)                                    \
  X(foreach_partition_order, setup, teardown)                                  \
  X(sweep_bounded_and_keeps_young, setup, teardown)                            \
  X(sweep_keeps_a_key_for_the_retention, setup, teardown)                      \
  X(sweep_keeps_waiting_timer_ids, setup, teardown)                            \
  X(sweep_keeps_other_topics_ids, setup, teardown)                             \
  X(sweep_needs_an_owned_topic, setup, teardown)                               \
  X(ledger_topics_keep_their_credits, setup, teardown)                         \
  X(ledger_keeps_unscoped_balances, setup, teardown)                           \
  X(backend_ops_answer, setup, teardown)                                       \
  X(child_lends_sql_only_inline, setup, teardown)                              \
  X(cancel_deletes_a_pending_timer, setup, teardown)                           \
  X(cancel_from_a_child_txn, setup, teardown)                                  \
  X(timer_find_reads_a_firing_once, setup, teardown)

#define KL_T__CONTRACT_DECLARE(name, setup, teardown)                          \
  void kl_t_contract_##name(void **state);
KL_T_STORE_CONTRACT(KL_T__CONTRACT_DECLARE, , )

#define KL_T__CONTRACT_ENTRY(name, setup, teardown)                            \
  {"test_" #name, kl_t_contract_##name, setup, teardown, NULL},

/** The contract's CMUnitTest entries, each run with @p setup and
 * @p teardown, and each followed by a comma: for a CMUnitTest array. */
#define KL_T_STORE_CONTRACT_TESTS(setup, teardown)                             \
  KL_T_STORE_CONTRACT(KL_T__CONTRACT_ENTRY, setup, teardown)

#endif
