/* cmocka steps over a ledger workload, shared by the worker tests. */
#ifndef KEYLANE_TESTS_SUPPORT_LEDGER_CHECKS_H
#define KEYLANE_TESTS_SUPPORT_LEDGER_CHECKS_H

#include <stdint.h>

#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/support.h"
#include "cli/ledger_gen.h"
#include "handlers/ledger.h"

/* A ledger workload on a test cluster (support/cluster.h: embedded unless
 * KEYLANE_TEST_BOOTSTRAP names one), a producer for it, and a store. */
typedef struct kl_t_ledger_fx {
  char dir[64];    /* the LMDB directory, when the fixture made one */
  char where[256]; /* the store's location: that directory, or a URI */
  kl_t_cluster_t *cluster;
  const char *boot, *topic; /* the cluster's; topic is unique on a real one */
  int partitions;
  kl_store_t *store;
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
} kl_t_ledger_fx_t;

/* Starts @p topic with @p partitions on a one-broker cluster, @p keys
 * ledger accounts generated from @p seed, and a store: the one at
 * @p store_uri, or a fresh LMDB directory when it is NULL. */
void kl_t_ledger_fx_up(kl_t_ledger_fx_t *fx, const char *topic, int partitions,
                       int keys, uint64_t seed, const char *store_uri);

/* Stops and removes what kl_t_ledger_fx_up() started. */
void kl_t_ledger_fx_down(kl_t_ledger_fx_t *fx);

/* kl_t_ledger_publish() and kl_t_ledger_assert_verified() on the fixture's
 * generator, producer, topic and store. */
void kl_t_ledger_fx_publish(kl_t_ledger_fx_t *fx, int n);
void kl_t_ledger_fx_assert_verified(kl_t_ledger_fx_t *fx);

/* Waits up to @p ms for @p w, the fixture's one worker, to apply what
 * was published, and asserts it applied each event once: @p events
 * applied, @p duplicates re-published ones skipped, no batch fenced. */
void kl_t_ledger_fx_assert_applied_once(kl_t_ledger_fx_t *fx, kl_t_worker_t *w,
                                        uint64_t events, uint64_t duplicates,
                                        int ms);

/* Publishes @p n events to @p topic, re-publishing an earlier one with its
 * idempotency key after every 10th, and waits until Kafka acked them all. */
void kl_t_ledger_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, int n);

/* Asserts that @p store holds exactly what @p gen published: every balance
 * and last seq, no order violation, each event applied once, each
 * re-published one suppressed. */
void kl_t_ledger_assert_verified(const kl__ledger_gen_t *gen, kl_store_t *store,
                                 const char *topic);

/* The follow-ups (kl_txn_emit()) the outbox of @p store holds for @p topic
 * over its @p partitions: 0 once all of them are published. */
/* Runs `keylane store rebuild` of the fixture's topic with the ledger
 * handler into @p where (an LMDB directory or a PostgreSQL URI), for the
 * fleet of consumer group @p group (NULL: "keylane"), which the rebuilt
 * store records as the topic's owner, and asserts it exits 0, its stderr
 * holding @p says (may be NULL).
 * @returns the rebuilt store, opened (the caller destroys it). */
kl_store_t *kl_t_ledger_fx_rebuild(kl_t_ledger_fx_t *fx, const char *where,
                                   const char *group, const char *says);

size_t kl_t_outbox_held(kl_store_t *store, const char *topic, int partitions);

/* @p key's ledger entry in @p store: on @p topic, or summed over the
 * topics (NULL), as kl__ledger_walk() reads it. @returns 1 with *@p e set
 * when the store holds one, 0 when not (*@p e zeroed). */
int kl_t_ledger_find(kl_store_t *store, const char *topic, const char *key,
                     kl_ledger_entry_t *e);

/* @p key's balance in @p store, summed over the topics, or INT64_MIN when
 * the store holds no entry of it. */
int64_t kl_t_ledger_balance(kl_store_t *store, const char *key);

#endif
