/*
 * A handler's child transaction, a store backend of its own whose txn
 * operations layer a lane's writes over a base txn. The handler sees a
 * plain kl_txn_t; behind it, reads go
 *
 *   the child's own writes -> the lane's overlay (ov.h) -> the base
 *
 * and writes (puts, deletes, idempotency marks) stay in the child. The
 * overlay holds what completed events of the lane wrote and the store does
 * not have yet (or, for a while, has: see worker/lanes_internal.h). When
 * the event completes with OK, the child is merged into the overlay under
 * the lane lock; on RETRY or FAIL it is discarded, so an event that is run
 * again starts from clean state.
 *
 * The base is a snapshot the executor opened for this one event with
 * kl_store_begin() (key-parallel mode), or the lane's open group
 * transaction (inline mode, one executor: the poll thread). In inline
 * mode a completed event's writes go straight into that transaction
 * (kl__child_apply()), and the overlay holds only dead letters' marks.
 *
 * kl_txn_pg_conn(): in key-parallel mode NULL (kl_err_detail() says why),
 * since a handler's SQL cannot run on a transaction that other events
 * share concurrently. In inline mode the group transaction's connection,
 * inside a savepoint (kl__store_savepoint()) taken at the first call, so
 * that RETRY and FAIL roll the event's SQL back as they discard its kv
 * writes (kl__child_end()).
 *
 * Caveats: a child is used by one thread, one event after another; the
 * overlay only under @p mu.
 */
#ifndef KEYLANE_STORE_CHILD_H
#define KEYLANE_STORE_CHILD_H

#include <pthread.h>

#include "keylane/store.h"
#include "store/backend.h"
#include "store/ov.h"
#include "store/txn_buffer.h"

typedef struct kl__child {
  kl_txn_t base; /* what the handler gets */
  kl_txn_t *snap;
  pthread_mutex_t *mu;
  const kl__overlay_t *ov;
  kl__buf_t data; /* KL__OV_PUT / KL__OV_DEL */
  kl__buf_t ids;  /* tag: kl_mark_t */
  uint64_t duplicates;
  unsigned char *rbuf; /* a copy of the last value read from the overlay */
  size_t rcap;
  int sql;            /* inline mode: lend snap's SQL connection */
  struct pg_conn *pg; /* the PGconn lent, once asked for */
  int savepoint;      /* kl__store_savepoint() taken on snap */
} kl__child_t;

/** Makes an empty child, once per executor; kl__child_destroy() frees it. */
void kl__child_init(kl__child_t *child);

/**
 * Starts an event's child over @p snap (borrowed) and the overlay @p ov,
 * dropping what the last event left (its memory is kept for this one).
 * @param mu  the lock of @p ov; NULL in inline mode, where the calling
 *            (poll) thread is the only one that touches the lanes.
 */
void kl__child_begin(kl__child_t *child, kl_txn_t *snap, pthread_mutex_t *mu,
                     const kl__overlay_t *ov);

/**
 * Ends the event's SQL, if it ran any: RELEASE its savepoint when @p ok,
 * else ROLLBACK TO it. @returns KL_OK, or a store error when that failed
 * (KL_ESTORE_BUSY when no savepoint was taken; the group transaction is
 * then unusable: its commit fails).
 */
kl_err_t kl__child_end(kl__child_t *child, int ok);

/** Discards the child's writes and frees what it holds. */
void kl__child_destroy(kl__child_t *child);

/**
 * @returns nonzero when an id the child marked applied is in @p ov already:
 *          an event with the same id, of another key, completed first.
 * @remark mu held.
 */
int kl__child_seen_elsewhere(const kl__child_t *child, const kl__overlay_t *ov);

/**
 * Moves the child's writes into @p ov, written by @p writer.
 * @returns KL_OK or KL_ENOMEM (then the overlay holds part of them: the
 *          caller rewinds the lane). @remark mu held.
 */
kl_err_t kl__child_merge(kl__child_t *child, kl__overlay_t *ov,
                         kl__ov_writer_t *writer);

/**
 * Inline mode: moves the child's writes into its base, the lane's group
 * transaction, instead of the overlay. Events there run one at a time on
 * the poll thread, so the next one reads them through that transaction.
 * @returns KL_OK or a store error (then the transaction holds part of
 *          them: the caller rewinds the lane).
 */
kl_err_t kl__child_apply(kl__child_t *child);

#endif
