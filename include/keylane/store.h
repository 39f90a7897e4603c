/**
 * @file store.h
 * @brief The durable store: owner epochs, watermarks, idempotency keys and
 *        the handlers' own state, committed together.
 *
 * Per (topic, partition) the store keeps the owner epoch (a fencing token
 * that only grows) and the watermark (the next offset to apply: highest
 * applied offset + 1). An event's idempotency key is scoped by its topic
 * and its entity key (kl_txn_seen()): one id used by two keys, or two
 * topics sharing a store, names two events, each applied once. Ids are
 * kept, with their insert time, for at least "store.dedup.retention"
 * (default 7d) of the topic's own workers, then swept by them
 * (kl_store_sweep()).
 *
 * A batch is one transaction: kl_store_begin() opens a read snapshot and a
 * buffer; handlers read through kl_txn_get() (their own buffered writes
 * first) and write with kl_txn_put(); kl_store_commit() then opens ONE short
 * write transaction, checks the batch's epoch against the partition's
 * current epoch, applies the buffered writes, the idempotency keys and the
 * watermark, and commits. If the epoch moved, nothing is applied and it
 * returns KL_EFENCED.
 *
 * Backends: a directory path opens LMDB (several processes on one host may
 * share it); "postgresql://..." (or "postgres://...") and libpq's
 * keyword/value strings ("host=db dbname=kl ...") open PostgreSQL. No
 * error keylane makes quotes a location's password.
 *
 * PostgreSQL at speed. A batch costs a fixed number of network round trips,
 * not one per event:
 * - kl_txn_prefetch() looks up all of a batch's idempotency keys in one
 *   statement; kl_txn_seen() then answers them from memory.
 * - kl_store_commit() sends the epoch check, the puts and deletes (one
 *   array statement each), the idempotency keys (one array statement) and
 *   COMMIT in one libpq pipeline: one round trip plus the server's fsync
 *   (synchronous_commit stays as the server has it). The epoch check is
 *   the pipeline's first statement, in the commit's transaction, per
 *   batch: when it fails, the rest of the pipeline is not run. The
 *   worker's group commit of several partitions sends every batch's
 *   pipeline, each on its own connection and under its own fence, before
 *   it reads any. kl_store_begin() sends BEGIN and its epoch check in one
 *   round trip too; the worker begins the next partition's batch with its
 *   id lookup in the same pipeline, ahead, while a batch's handlers run
 *   (store/store_internal.h, kl__store_begin_ahead()).
 * - The owner cache (store.cache.max bytes, default 64M, LRU; 0 turns it
 *   off): while a process holds a partition's epoch it is the only writer
 *   of that partition's keys, so what kl_txn_get() read and what its
 *   commits wrote stays in memory between batches, and a later
 *   kl_txn_get() of the same partition needs no round trip. It is dropped
 *   for the partition on a fence (KL_EFENCED from kl_store_begin() or
 *   kl_store_commit()), on any other failed commit (whose outcome may be
 *   unknown), when a batch begins with another epoch, on kl_store_acquire()
 *   by this store, and when the worker gives the partition up (revoke).
 *   A key is cached for the partition whose batch read or wrote it: a
 *   handler that writes another partition's keys breaks the single-writer
 *   rule (docs/design.md) and would leave that partition's owner a stale value.
 *   Metrics: keylane_store_cache_bytes, keylane_store_cache_entries,
 *   keylane_store_cache_hits_total, keylane_store_cache_misses_total,
 *   keylane_store_cache_drops_total (hit ratio: hits / (hits + misses)). *   A
 * kl_txn_put() of a key the cache knows is stored is committed as an UPDATE
 * (half the upsert's cost) on the condition that the row still holds the value
 * the cache knows; if a writer breaking that rule changed or deleted it
 * meanwhile (the owner of another topic writing the same key: scope handler
 * keys by the fence's topic when topics share a store), kl_store_commit() fails
 * with KL_ESTORE_BUSY, applying nothing, and the cache is dropped, so the batch
 * run again reads the other writer's value.
 * - Handler SQL (kl_txn_pg_conn()) bypasses the cache: once a batch has
 *   lent its connection, its kl_txn_get() calls read the server (so they
 *   see the handler's own uncommitted SQL), fill nothing, and its commit
 *   drops the partition's cache instead of writing through, since the SQL
 *   may have changed keylane_kv; its puts are all upserts. The
 *   single-transaction guarantee holds:
 *   the handler's SQL, the idempotency keys and the fence commit together.
 *
 * PostgreSQL connections. A store holds at most "store.pg.pool" (default
 * 4) connections; an open batch holds one from kl_store_begin() to its
 * commit or abort, and a begin past the bound waits for one to end (10 s
 * at most, then KL_ESTORE_BUSY). A worker keeps at most store.pg.pool - 1
 * batches open at once (one connection stays for its single statements):
 * one owning more partitions commits, or rolls back when they hold nothing
 * final, the other partitions' open batches before it begins another, so
 * batches get smaller, and nothing waits. For full batches give a worker
 * a pool above its partition count (plus worker.concurrency when > 1).
 * A server restart (even `pg_ctl restart -m immediate`) breaks every
 * connection: the batches open on them apply nothing and fail with
 * KL_ESTORE_BUSY, the worker runs their events again (not counted as
 * attempts, so an outage never dead-letters an event) and the next calls
 * connect anew, with no operator action; idempotency keys, watermarks and
 * epochs are the server's committed rows, so dedup and the fence hold
 * across it, and the owner cache of a partition whose commit failed is
 * dropped. A kl_store_commit() whose link broke after its COMMIT was sent
 * asks the server (on another connection, up to 5 s while the server is
 * unreachable) and returns KL_OK when the batch did commit: the partition
 * still has its epoch and an idempotency key the batch recorded, absent
 * before it, is there.
 * Every connection is made with TCP keepalives (10 s idle, then a probe
 * every 5 s, 3 unanswered) and a TCP user timeout of 25 s (for data sent
 * and unacknowledged), so a dead link is noticed within 25 s, and with a
 * connect timeout of "store.pg.connect.timeout" (default 10s; whole
 * seconds, rounded up, at least 2), so a server that accepts TCP and never
 * answers, or a network that drops packets, fails a call instead of
 * holding its thread for the OS's minutes or hours. The URI's own
 * connect_timeout, keepalives_idle, ... override these.
 *
 * Caveats:
 * - A kl_store_t may be shared by threads; a kl_txn_t is used by one thread
 *   at a time.
 * - LMDB has one writer lock per environment: a process paused (SIGSTOP,
 *   a debugger) inside kl_store_commit() stalls every writer on the host.
 *   That is why the write transaction is kept to the commit itself.
 */
#ifndef KEYLANE_STORE_H
#define KEYLANE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_store kl_store_t;
typedef struct kl_txn kl_txn_t;

/** What the store knows of one partition. Counters are cumulative. */
typedef struct kl_partition_state {
  uint64_t epoch;        /**< current owner epoch; 0 = never owned */
  int64_t watermark;     /**< next offset to apply; 0 when none applied */
  uint64_t applied;      /**< events whose effects were committed */
  uint64_t duplicates;   /**< events skipped because their id was seen */
  uint64_t dead_letters; /**< events recorded as dead-lettered (not one
                              whose id was applied: kl_txn_mark()) */
  uint64_t beats;        /**< heartbeats of a fencer outside the group
                              (keylane replay, redrive) while it works: a
                              fenced worker takes the partition back only
                              once the whole state stops changing */
} kl_partition_state_t;

/** How an idempotency key was recorded. */
typedef enum kl_mark {
  KL_MARK_NONE = 0,        /**< not seen */
  KL_MARK_APPLIED = 1,     /**< its effects were committed */
  KL_MARK_DEAD_LETTER = 2, /**< sent to the dead-letter topic, not applied */
} kl_mark_t;

/**
 * Opens (creating when missing) the store at @p location.
 * Keys read from @p conf (borrowed): store.durability (full|meta|none),
 * store.map.size, store.map.max, store.dedup.retention.
 * An LMDB store of an older format is migrated in place here; an older
 * PostgreSQL schema is refused until `keylane store migrate` moved it.
 * @returns KL_OK, KL_ESTORE_VERSION for a store of another format, or
 *          KL_ESTORE with the cause in kl_err_detail().
 */
KL_EXPORT kl_err_t kl_store_open(const char *location, const kl_conf_t *conf,
                                 kl_store_t **out);

/** Closes @p store; accepts NULL. Every txn must be ended first. */
KL_EXPORT void kl_store_destroy(kl_store_t *store);

/**
 * Takes ownership of a partition: atomically increments its epoch.
 * @param state  receives the partition's state with the new epoch.
 */
KL_EXPORT kl_err_t kl_store_acquire(kl_store_t *store, const char *topic,
                                    int32_t partition,
                                    kl_partition_state_t *state);

/** Reads a partition's state without changing it (zeroes when unknown). */
KL_EXPORT kl_err_t kl_store_partition(kl_store_t *store, const char *topic,
                                      int32_t partition,
                                      kl_partition_state_t *state);

/** Begins a batch for a partition owned with @p epoch. */
KL_EXPORT kl_err_t kl_store_begin(kl_store_t *store, const char *topic,
                                  int32_t partition, uint64_t epoch,
                                  kl_txn_t **txn);

/**
 * Commits the batch: watermark := @p watermark (it never moves back), plus
 * every put, del and mark, iff the partition's epoch is still the batch's.
 * @returns KL_OK; KL_EFENCED (nothing applied); KL_ESTORE_FULL or
 *          KL_ESTORE_READONLY (nothing applied; the batch may be re-run).
 *          KL_ESTORE_FULL also when the file system holding the store is
 *          full, including a write it cut short (which LMDB reports as an
 *          I/O error). The txn is freed in every case.
 */
KL_EXPORT kl_err_t kl_store_commit(kl_txn_t *txn, int64_t watermark);

/** @returns the backend of @p store: "lmdb" or "postgresql" (a static
 *  string). */
KL_EXPORT const char *kl_store_backend(const kl_store_t *store);

/** Discards the batch and frees @p txn; accepts NULL. */
KL_EXPORT void kl_store_abort(kl_txn_t *txn);

/**
 * Reads @p key: the batch's own write when there is one, else the snapshot.
 * @returns KL_OK, or KL_ENOTFOUND.
 * @remark *val is borrowed: valid until the next call on this txn.
 */
KL_EXPORT kl_err_t kl_txn_get(kl_txn_t *txn, const void *key, size_t key_len,
                              const void **val, size_t *val_len);

/** Buffers a write of @p key; the bytes are copied.
 *  @remark Keys are the handler's own: the store does not scope them by
 *  topic. Two topics sharing a store have one owner each of an entity
 *  key, so a handler whose key has no topic in it makes them two writers
 *  of one row: put the fence's topic in it (the ledger keeps
 *  "ledger:" TOPIC "/" KEY). */
KL_EXPORT kl_err_t kl_txn_put(kl_txn_t *txn, const void *key, size_t key_len,
                              const void *val, size_t val_len);

/** Buffers a delete of @p key. */
KL_EXPORT kl_err_t kl_txn_del(kl_txn_t *txn, const void *key, size_t key_len);

/**
 * Looks up how the idempotency key @p id of an event of entity @p key was
 * recorded, in the snapshot or by this batch: ids are scoped by entity
 * key (and by the batch's topic), so the same @p id on another key is
 * another event. This is the lookup the worker makes for every event.
 * @param key   the event's entity key, 1..KL_KEY_MAX bytes.
 * @param id    the event's id, 1..KL_ID_MAX bytes, no NUL byte.
 * @param mark  set to KL_MARK_NONE, KL_MARK_APPLIED or KL_MARK_DEAD_LETTER;
 *              KL_MARK_NONE also for the id of a delayed event that waits
 *              as a timer, or whose timer was cancelled: not applied.
 * @returns KL_OK (also for an id never seen), KL_EINVAL for a key or id of
 *          a bad length, or the store's failure.
 */
KL_EXPORT kl_err_t kl_txn_seen(kl_txn_t *txn, const void *key, size_t key_len,
                               const char *id, size_t id_len, kl_mark_t *mark);

/**
 * Buffers the record of the id @p id of entity @p key as @p mark (applied
 * or dead-lettered), committed with the batch.
 * @returns KL_OK; KL_EINVAL for a key or id of a bad length, or a mark
 *          that is neither KL_MARK_APPLIED nor KL_MARK_DEAD_LETTER.
 * @remark An applied mark is never replaced by a dead-letter one, in this
 *         batch or in the store. When one id is reused by two events of
 *         one entity key, the one later in the log is a duplicate:
 *         suppressed, counted in `duplicates`, its handler never run; also
 *         when the first was dead-lettered before it ran (a redrive of that
 *         letter then applies the id once). Events of one key run in log
 *         order, so which one is first never depends on timing. A
 *         dead-letter mark does become applied (a redrive).
 */
KL_EXPORT kl_err_t kl_txn_mark(kl_txn_t *txn, const void *key, size_t key_len,
                               const char *id, size_t id_len, kl_mark_t mark);

/**
 * Looks up @p n idempotency keys at once (the i-th is ids[i] of entity
 * keys[i]), so that kl_txn_seen() of any of them answers from memory: on
 * PostgreSQL one round trip for a batch instead of one per event; on LMDB,
 * whose lookups are local, nothing. Call it after kl_store_begin() and
 * before the batch's handlers run; marks the batch makes afterwards are
 * still seen (kl_txn_mark() wins).
 * @param keys, key_lens, ids, id_lens  borrowed for the call; each key
 *        1..KL_KEY_MAX bytes, each id 1..KL_ID_MAX bytes.
 * @returns KL_OK, KL_EINVAL (a key or id of a bad length), or a store
 *          error (the batch is then to be aborted or re-run).
 */
KL_EXPORT kl_err_t kl_txn_prefetch(kl_txn_t *txn, const void *const *keys,
                                   const size_t *key_lens,
                                   const char *const *ids,
                                   const size_t *id_lens, size_t n);

/* libpq's connection: libpq-fe.h's `typedef struct pg_conn PGconn`, so
 * that `PGconn *pg = kl_txn_pg_conn(txn);` needs no cast, and this header
 * needs no libpq. */
struct pg_conn;

/**
 * The batch's PostgreSQL connection, for a handler's own SQL in the same
 * transaction as the batch's idempotency keys and its fence.
 * @returns the PGconn (libpq) of a PostgreSQL store's batch; else NULL,
 *          with kl_err_detail() saying why and what to do:
 *          - a store that is not PostgreSQL (LMDB) has no SQL connection;
 *          - a handler of a worker with worker.concurrency > 1 runs
 *            key-parallel, beside other events of the same batch: no SQL
 *            transaction is its own (use the kl_txn_* calls, or
 *            concurrency 1, where its SQL runs in the group transaction
 *            inside a savepoint per event that RETRY and FAIL roll back);
 *          - @p txn is NULL.
 * @remark Statements only: no COMMIT or ROLLBACK (kl_store_commit() and
 *         kl_store_abort() end the transaction). Borrowed: valid until the
 *         txn ends; do not PQfinish() it. A failed statement aborts the
 *         whole batch.
 * @remark Asking for it takes the batch off the owner cache (see the top
 *         of this file): its reads go to the server and its commit drops
 *         the partition's cached keys.
 * @remark 0.1.0 returned `void *`: the pointer is the same, so callers
 *         need no change (a C++ cast to PGconn * still compiles).
 */
KL_EXPORT struct pg_conn *kl_txn_pg_conn(kl_txn_t *txn);

/**
 * Emits a follow-up event, committed with the batch: a transactional
 * outbox. The handler of one key changes another key (a transfer credits
 * an account that another partition's owner writes) without writing it:
 * the follow-up goes into the store's outbox in the SAME commit as the
 * handler's writes, its idempotency mark and the watermark, under the same
 * fence. It is rolled back with them (RETRY, FAIL, a fenced or failed
 * commit: a fenced owner's follow-ups are never published) and invisible
 * until the commit. After the commit the worker publishes it like
 * kl_publish() (acks=all, idempotent, murmur2 routing of @p key) and
 * removes it from the outbox once Kafka acknowledged it; a worker that
 * takes the partition publishes first what its predecessor left there, so
 * a crash between the commit and the publish loses nothing.
 *
 * Its id names the event the handler runs by its place in the log:
 * "~<topic>/<partition>/<offset>/<index>/<nonce>", the emit's index in
 * that run (0, 1, ...) and a nonce drawn for the run (docs/envelope.md,
 * "The idempotency key"). A follow-up published again (after a crash, by
 * the next owner) has the same id, so its consumer applies it once.
 *
 * @param topic  the destination topic; NULL (or "") for the event's own.
 * @param key    the destination entity's key (1..KL_KEY_MAX bytes).
 * @param type   the event type (NUL-terminated).
 * @param payload @p payload_len bytes; copied, like @p key and @p type.
 * @returns KL_OK; KL_EINVAL (at most 64 per event, from a handler only);
 *          KL_EDECODE_* for a key, type or payload past the event limits;
 *          KL_EDECODE_OVERSIZE for a follow-up larger, as a Kafka record,
 *          than the worker's producer (kafka.message.max.bytes) or its
 *          topic (max.message.bytes, when the cluster tells it) takes: one
 *          that could never be published fails its event here, whole,
 *          rather than wait in the outbox.
 * @remark Follow-ups of one source partition to one destination key are
 *         published in commit order. A store needs the outbox (LMDB and
 *         PostgreSQL, whose schema 5 holds it: `keylane store migrate`).
 */
KL_EXPORT kl_err_t kl_txn_emit(kl_txn_t *txn, const char *topic,
                               const void *key, size_t key_len,
                               const char *type, const void *payload,
                               size_t payload_len);

/**
 * Cancels the pending timer of the delayed event @p id of entity @p key
 * (docs/design.md, "Timers"): deletes it in this batch, so it commits,
 * fences and rolls back with the handler's other writes. The event is
 * then never applied by that timer; a firing record already written for
 * it is a duplicate when read. Its id is marked cancelled in this batch:
 * a copy of the event published again afterwards, with a not_before or
 * without, is a duplicate until the id expires, store.dedup.retention
 * after the cancel (kl_txn_seen() reads it as KL_MARK_NONE: not
 * applied); publish it with a new id to schedule it again.
 * @param key   the entity key of the event the handler runs: a handler
 *              changes its own key only (design.md), and the key's lane
 *              runs the cancel and the timer's firing in log order. To
 *              cancel another key's timer, emit a follow-up to that key
 *              (kl_txn_emit()) whose handler cancels it.
 * @param id    the delayed event's id, 1..KL_ID_MAX bytes.
 * @returns KL_OK; KL_ENOTFOUND when no timer of (@p key, @p id) waits
 *          (never scheduled, already run, cancelled, or applied or
 *          dead-lettered meanwhile); KL_EINVAL outside a handler, for a
 *          key that is not the running event's, or a key or id of a bad
 *          length; or the store's failure.
 */
KL_EXPORT kl_err_t kl_txn_cancel(kl_txn_t *txn, const void *key, size_t key_len,
                                 const char *id, size_t id_len);

/**
 * What kl_txn_emit_opts() takes beyond kl_txn_emit()'s arguments. Zero it,
 * set @c size to sizeof(kl_emit_opts_t), then the fields you need: fields
 * are only ever added at the end, and the library reads only the @c size
 * bytes the caller knows of (the rest count as zero), so a program built
 * against an older, smaller struct keeps working.
 */
typedef struct kl_emit_opts {
  size_t size; /**< in: sizeof(kl_emit_opts_t) as the caller knows it */
  /** ms since the Unix epoch before which the follow-up is not applied
   *  (kl_event_t.not_before): its consumer keeps it as a timer of its key
   *  (docs/design.md, "Timers"). 0: applied when read. At most
   *  timer.max.delay after, or before, the source event's record time (or
   *  now, if that is earlier). */
  int64_t not_before;
} kl_emit_opts_t;

/**
 * kl_txn_emit() with options (@p opts; NULL is none): a follow-up with a
 * delivery time, so that a handler schedules its own key's next step or
 * another key's ("release the reservation in 15 minutes"). It is committed
 * and published like any follow-up, at once; the worker that reads it
 * keeps it as a timer until its time, then applies it once, in its key's
 * order. Its envelope is version 2 (it carries "nb").
 * @returns what kl_txn_emit() returns, and KL_EINVAL for @p opts with a
 *          @c size of 0 or a @c not_before that is negative, or later or
 *          earlier than timer.max.delay allows (the outbox's publish and
 *          the worker's bound; the message says by how much): that
 *          follow-up could never be applied, so the event fails here,
 *          whole, rather than its follow-up later.
 */
KL_EXPORT kl_err_t kl_txn_emit_opts(kl_txn_t *txn, const char *topic,
                                    const void *key, size_t key_len,
                                    const char *type, const void *payload,
                                    size_t payload_len,
                                    const kl_emit_opts_t *opts);

/** Adds to the partition's duplicate counter in this batch's commit. */
KL_EXPORT void kl_txn_count_duplicate(kl_txn_t *txn);

/**
 * Removes up to @p max idempotency keys older than this store's
 * store.dedup.retention, of ONE topic, in one short write transaction:
 * the next, in turn, of the topics this handle took a partition of
 * (kl_store_acquire()). Another topic's keys are never removed, whatever
 * retention its own workers keep; a handle that took no partition
 * removes nothing. Call it often with a small @p max.
 * @remark @p max bounds the work of one call: both backends walk the
 *         topic's keys from where its last sweep stopped and remove the
 *         expired ones among those visited, so a call may remove fewer
 *         than @p max while expired keys remain, and a key lives at least
 *         the retention and at most the retention plus one walk over the
 *         topic's keys. LMDB visits at most @p max keys (the topic's
 *         cursor is kept in the store). PostgreSQL visits max/100 of
 *         keylane_ids' pages (about @p max keys of 36-byte ids) from a
 *         position the topic's workers share, and removes at most @p max
 *         keys.
 */
KL_EXPORT kl_err_t kl_store_sweep(kl_store_t *store, size_t max,
                                  size_t *removed);

/** Called for each key in a scan; return nonzero to stop. */
typedef int(kl_store_scan_cb_t)(void *opaque, const void *key, size_t key_len,
                                const void *val, size_t val_len);

/**
 * Calls @p cb, in key order, for every handler key starting with @p prefix,
 * from one consistent snapshot (safe while workers commit).
 */
KL_EXPORT kl_err_t kl_store_scan(kl_store_t *store, const void *prefix,
                                 size_t prefix_len, kl_store_scan_cb_t *cb,
                                 void *opaque);

/** Called for each partition the store knows; return nonzero to stop. */
typedef int(kl_store_partition_cb_t)(void *opaque, const char *topic,
                                     int32_t partition,
                                     const kl_partition_state_t *state);

/** Calls @p cb for every known partition, ordered by topic then partition. */
KL_EXPORT kl_err_t kl_store_foreach_partition(kl_store_t *store,
                                              kl_store_partition_cb_t *cb,
                                              void *opaque);

/** @returns in *count the number of idempotency keys held. */
KL_EXPORT kl_err_t kl_store_id_count(kl_store_t *store, uint64_t *count);

#ifdef __cplusplus
}
#endif
#endif
