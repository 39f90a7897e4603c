/*
 * Internal store interfaces for tests, benchmarks and `keylane store`: the
 * clock the store stamps idempotency keys with, and the LMDB layout facts a
 * test needs to build a store of another format. Not installed.
 */
#ifndef KEYLANE_STORE_INTERNAL_H
#define KEYLANE_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/event.h"
#include "keylane/store.h"

/**
 * Replaces the store's clock (ms since the Unix epoch), which stamps
 * idempotency keys and decides their expiry; NULL restores the real one.
 * The real clock is LMDB's host's, and PostgreSQL's server's
 * (clock_timestamp()), so that one host whose clock jumps cannot expire
 * the fleet's keys; a test clock replaces either. Process wide; for
 * tests, which move time instead of sleeping.
 */
void kl__store_set_clock(int64_t (*now_ms)(void));

/** The store's current time in ms as this host reads it: the test clock
 *  when one is set, else the host's. */
int64_t kl__store_now_ms(void);

/** The test clock's time in ms, or 0 when none is set. */
int64_t kl__store_test_clock_ms(void);

/** The first byte of the handler keys that are keylane's own (its timers,
 *  store/timers.h): kl_txn_put() and kl_txn_del() refuse them. */
#define KL__STORE_OWN '~'

/** kl_txn_put() and kl_txn_del() without that rule: for keylane's own keys,
 *  and for the lanes' writing of what handlers wrote, checked then. */
kl_err_t kl__txn_kv_put(kl_txn_t *txn, const void *key, size_t key_len,
                        const void *val, size_t val_len);
kl_err_t kl__txn_kv_del(kl_txn_t *txn, const void *key, size_t key_len);

/**
 * kl_store_acquire(), with the new epoch above @p floor too: the highest
 * epoch the fleet used that this store may not know (a rebuilt store, a
 * new store for an existing topic), so that an external resource which
 * kept that epoch accepts the new owner.
 */
kl_err_t kl__store_acquire_above(kl_store_t *store, const char *topic,
                                 int32_t partition, uint64_t floor,
                                 kl_partition_state_t *state);

/* ---- who owns a topic ------------------------------------------------- */

/* A Kafka cluster id (rd_kafka_clusterid(): a base64 UUID, or the
 * embedded cluster's "mockCluster..." name) and a consumer group id, as
 * long as Kafka allows them. */
#define KL__OWNER_CLUSTER_MAX 128
#define KL__OWNER_GROUP_MAX 255

/**
 * What a store records of a topic's owner (docs/design.md, "A store
 * belongs to one cluster and one group"): the Kafka cluster its log is on
 * and the consumer group of the fleet that applies it, recorded with the
 * first epoch a worker takes for the topic. A worker of another cluster
 * (a wrong -b with the same topic name) or another group (a typo'd -g)
 * would fence the fleet and apply a foreign log: it is refused instead.
 */
typedef struct kl__store_owner {
  char cluster[KL__OWNER_CLUSTER_MAX + 1];
  char group[KL__OWNER_GROUP_MAX + 1];
} kl__store_owner_t;

/**
 * Fills @p owner with @p cluster and @p group, both non-empty.
 * @returns KL_OK, or KL_EINVAL naming the value that is empty or too long.
 */
kl_err_t kl__store_owner_make(kl__store_owner_t *owner, const char *cluster,
                              const char *group);

/** @returns nonzero when @p a and @p b name the same cluster and group. */
int kl__store_owner_equal(const kl__store_owner_t *a,
                          const kl__store_owner_t *b);

/**
 * Reads the owner @p store recorded for @p topic into @p owner.
 * @returns KL_OK; KL_ENOTFOUND when none is recorded (a topic no worker
 *          took yet, or one a store of an older version took); a store
 *          error.
 */
kl_err_t kl__store_owner(kl_store_t *store, const char *topic,
                         kl__store_owner_t *owner);

/**
 * Records @p owner as @p topic's, replacing what was recorded: `keylane
 * store bind` (an operator who moved the fleet on purpose), `store
 * rebuild` and `store reset`. No epoch moves.
 */
kl_err_t kl__store_bind(kl_store_t *store, const char *topic,
                        const kl__store_owner_t *owner);

/**
 * kl__store_acquire_above() by a worker of @p owner (NULL: unchecked, as
 * kl__store_acquire_above()): in the same write as the new epoch, a topic
 * without a recorded owner gets @p owner; a topic whose recorded owner
 * differs is not taken: *@p refused = 1, the recorded owner in
 * @p recorded, nothing written (no epoch moves, no owner is fenced).
 * @returns KL_OK (then see *@p refused), or the store's error.
 */
kl_err_t kl__store_acquire_owned(kl_store_t *store, const char *topic,
                                 int32_t partition, uint64_t floor,
                                 const kl__store_owner_t *owner,
                                 kl__store_owner_t *recorded, int *refused,
                                 kl_partition_state_t *state);

/*
 * The mark of an id that waits as a timer (store/timers.h), beside the
 * public ones (keylane/store.h): kl__timer_put() writes it with the timer,
 * in the same commit, so that any other record of that key and id is a
 * duplicate while it waits, also one without `nb` (docs/design.md,
 * "Timers"); only the timer's firing record runs the event, and its
 * applied or dead-letter mark replaces this one, timed by the firing's
 * commit. The sweeps never remove it (lmdb_sweep.c, pg_sweep.c): a timer
 * may wait longer than store.dedup.retention (scheduled under a longer
 * one, or by a redrive), and an id swept while it waits would let a copy
 * run early and the timer run it again. Public calls never see it:
 * kl_txn_seen() reads it as KL_MARK_NONE (not applied), kl_txn_mark()
 * refuses it.
 */
#define KL__MARK_TIMER ((kl_mark_t)3)

/*
 * The mark of an id whose timer was cancelled (kl_txn_cancel()): written
 * over KL__MARK_TIMER in the cancel's commit, timed by it, so that the
 * sweeps remove it a retention after the cancel. Its copies are
 * duplicates until then: the worker reads it as KL_MARK_APPLIED
 * (kl__txn_seen()), kl_txn_seen() as KL_MARK_NONE (not applied), and
 * `keylane store get --id` shows "cancelled". LMDB keeps it in the bit
 * above the time (lmdb_ids.c), PostgreSQL in its smallint.
 */
#define KL__MARK_CANCELLED ((kl_mark_t)4)

/**
 * The mark an idempotency key keeps when it is marked @p mark over @p have,
 * in a batch's buffer, a lane's overlay or the store: an applied mark is
 * never replaced, by a dead-letter one or a timer's. An id reused by two
 * events stays applied once either applied (the other is a duplicate, or
 * its dead letter is sent but not recorded over it); a dead letter becomes
 * applied when it is redriven, or a timer's when its redrive waits for its
 * time (worker/apply.c); a timer's becomes applied or dead-lettered when it
 * fires.
 */
static inline kl_mark_t kl__mark_merge(kl_mark_t have, kl_mark_t mark) {
  return have == KL_MARK_APPLIED ? KL_MARK_APPLIED : mark;
}

/* ---- idempotency keys scoped by entity key ---------------------------- */

/*
 * An event's idempotency key is scoped by its topic and its entity key: the
 * same id on two keys names two events, each applied once, and whichever
 * key's lane runs first cannot take the other's id (so a live worker and
 * `keylane store rebuild` decide alike). The backends store a scoped id,
 * a "sid": a NUL byte, the entity key's length (2 bytes, big-endian), the
 * key, then the id. An id never holds a NUL (event.h), so a sid never
 * equals an unscoped id: those keep a space of their own, which holds the
 * ids a store recorded before ids were scoped (LMDB format 2, PostgreSQL
 * schema 6); no public call writes there any more.
 */
#define KL__SID_MAX (3 + KL_KEY_MAX + KL_ID_MAX)

/** Writes the sid of @p id on entity @p key (lengths checked by the
 *  caller) into @p out. @returns its length. */
size_t kl__sid_encode(const void *key, size_t key_len, const char *id,
                      size_t id_len, char out[KL__SID_MAX]);

/** Splits a sid (or an unscoped id: *key NULL, *key_len 0) into its parts,
 *  borrowed from @p sid. @returns 0, or -1 when it is malformed. */
int kl__sid_decode(const char *sid, size_t len, const void **key,
                   size_t *key_len, const char **id, size_t *id_len);

/**
 * @returns nonzero while @p store may hold ids recorded before ids were
 * scoped by key that have not expired yet: until the retention has passed
 * since the store was upgraded. Meanwhile a scoped id that is not found is
 * looked up unscoped too, so an event applied before the upgrade is still
 * a duplicate after it.
 */
int kl__store_legacy_ids(const kl_store_t *store);

/** kl_txn_seen(), kl_txn_mark() and kl_txn_prefetch() of encoded sids,
 *  unchecked: for the lanes' child txns, which hold sids and hand them to
 *  their batch. An unscoped id passed as a sid names the space of the ids
 *  recorded before the scoping (the tests of the upgrades write there). */
kl_err_t kl__txn_seen_sid(kl_txn_t *txn, const char *sid, size_t sid_len,
                          kl_mark_t *mark);
/** kl_txn_seen() that reads KL__MARK_TIMER as it is, and
 *  KL__MARK_CANCELLED as KL_MARK_APPLIED (its copies are duplicates): the
 *  worker's. */
kl_err_t kl__txn_seen(kl_txn_t *txn, const void *key, size_t key_len,
                      const char *id, size_t id_len, kl_mark_t *mark);
kl_err_t kl__txn_mark_sid(kl_txn_t *txn, const char *sid, size_t sid_len,
                          kl_mark_t mark);
kl_err_t kl__txn_prefetch_sids(kl_txn_t *txn, const char *const *sids,
                               const size_t *sid_lens, size_t n);

/** A batch's sids, for a prefetch: with their unscoped ids too while
 *  kl__store_legacy_ids(). */
typedef struct kl__sids {
  char *arena;
  const char **sids;
  size_t *lens;
  size_t n;
} kl__sids_t;

/** Builds @p s from @p n (key, id) pairs; kl__sids_free() frees it. */
kl_err_t kl__sids_build(kl__sids_t *s, const kl_store_t *store,
                        const void *const *keys, const size_t *key_lens,
                        const char *const *ids, const size_t *id_lens,
                        size_t n);
void kl__sids_free(kl__sids_t *s);

/**
 * Rewinds @p partition of @p topic, for `keylane store reset` after its
 * log went backwards: takes a new epoch, so that a live owner is fenced,
 * and sets the watermark to 0, so that the next owner starts at the log's
 * beginning. Idempotency keys, handler state and counters stay.
 * @returns KL_OK with the new state in @p state; KL_ENOTFOUND when the
 *          store has no state for the partition.
 */
kl_err_t kl__store_reset(kl_store_t *store, const char *topic,
                         int32_t partition, kl_partition_state_t *state);

/** One batch of kl__store_commit_many(). */
typedef struct kl__store_commit {
  kl_txn_t *txn;     /**< freed by the call */
  int64_t watermark; /**< as kl_store_commit() takes it */
  kl_err_t err;      /**< the outcome, set by the call */
  char why[512];     /**< kl_err_detail() of this batch's failure */
} kl__store_commit_t;

/**
 * Commits @p n batches of one store, each to its watermark and guarded by
 * its own epoch, as kl_store_commit() does one; where the backend can
 * (LMDB) in ONE write transaction, so that they share its fsyncs. A fenced
 * batch writes nothing (err = KL_EFENCED) and does not stop the others;
 * when the shared write fails otherwise, each batch is tried alone, so
 * that one batch (too big for the map, say) fails only itself. Every txn
 * is freed. For the worker's group commit of several lanes.
 */
void kl__store_commit_many(kl__store_commit_t *commits, size_t n);

/** One partition's heartbeat, for kl__store_beat(). */
typedef struct kl__beat {
  int32_t partition;
  uint64_t epoch; /**< the epoch it is held with */
  kl_err_t err;   /**< set by the call: KL_OK, or KL_EFENCED (newer owner) */
} kl__beat_t;

/**
 * Heartbeats of an owner that holds @p n partitions of @p topic: adds one
 * to each partition's `beats` iff its epoch is still beats[i].epoch, all in
 * ONE short write (one fsync however many partitions it holds). For owners
 * outside the group (replay, redrive), which may hold a partition long
 * without a commit: a live worker they fenced takes the partition back
 * once its state, beats included, has not changed for
 * worker.fenced.retake.ms (worker.c), so such an owner beats at least
 * every third of that period while it works (kl__beat_period_ns()).
 * @returns KL_OK with each beats[i].err set; or a store error, with nothing
 *          written.
 */
kl_err_t kl__store_beat(kl_store_t *store, const char *topic, kl__beat_t *beats,
                        size_t n);

/**
 * How often an owner outside the group beats: a third of @p conf's
 * worker.fenced.retake.ms, and at most once a second, so that a fleet whose
 * period is shorter than the one the replay was given still sees it work.
 */
int64_t kl__beat_period_ns(const kl_conf_t *conf);

/**
 * Tells the store that this process no longer owns @p partition of
 * @p topic (a revoke): the owner cache drops what it holds of it
 * (cache.h). Safe to call for any partition, on any backend.
 */
void kl__store_forget(kl_store_t *store, const char *topic, int32_t partition);

/**
 * A batch of @p topic's partition 0 at the epoch it has now, even 0 (no
 * owner yet), which kl_store_begin() refuses: for a check, before a worker
 * starts, of what a handler's SQL needs on the batch's connection
 * (kl_txn_pg_conn()). Abort it: an owner that takes the partition
 * meanwhile fences its commit, and the check neither writes nor locks.
 * @returns KL_OK, or kl_store_begin()'s failures (KL_EFENCED when the
 *          partition changed owner thrice while it began).
 */
kl_err_t kl__store_begin_check(kl_store_t *store, const char *topic,
                               kl_txn_t **txn);

/**
 * How long a batch's session may sit idle in its transaction before the
 * store's server ends it: on PostgreSQL store.pg.idle.timeout of the conf
 * the store was opened with or, when that is 0, the server's own
 * idle_in_transaction_session_timeout, read at open. A handler that works
 * that long without using the session leaves a batch that cannot commit.
 * @returns milliseconds; 0: no such bound (LMDB, or none on the server).
 */
int64_t kl__store_idle_ms(const kl_store_t *store);

/** @returns nonzero when kl_txn_prefetch() saves round trips on @p store
 *  (PostgreSQL), so that a caller decodes ids for it only then. */
int kl__store_has_prefetch(kl_store_t *store);

/**
 * kl_store_begin() and kl_txn_prefetch() of @p ids in one go, without
 * waiting for either, on a backend that can (PostgreSQL: BEGIN, the epoch
 * check and the ids' lookup leave in one pipeline on an idle pooled
 * connection), so that the caller does other work (another partition's
 * handlers) while the server answers. kl__store_settle() reads the
 * answers; any call on the txn does so first, and kl_store_abort()
 * discards them.
 * @returns KL_OK with *@p out pending; KL_ESTORE_BUSY at once when no
 *          pooled connection is idle (it never connects or waits for
 *          one; a connection's first use prepares the statements it
 *          sends, as every pipeline does); the send's failure; or
 *          KL_EINVAL, naming the backend, on one whose reads cost no
 *          round trip (LMDB): there, begin with kl_store_begin(). Only
 *          a store with kl__store_has_prefetch() begins ahead.
 */
kl_err_t kl__store_begin_ahead(kl_store_t *store, const char *topic,
                               int32_t partition, uint64_t epoch,
                               const char *const *ids, const size_t *id_lens,
                               size_t n, kl_txn_t **out);

/** How long a txn begun ahead may wait to be settled: at most this, and at
 *  most half of store.pg.idle.timeout (its session is idle in a
 *  transaction meanwhile). */
#define KL__STORE_AHEAD_MAX_MS 1000

/**
 * Reads what kl__store_begin_ahead() sent. @returns KL_OK (also for a txn
 * not begun ahead, and on a backend that never begins ahead), or what
 * kl_store_begin() or kl_txn_prefetch() would have returned: KL_EFENCED,
 * a store error; KL_ESTORE_BUSY when it waited longer than
 * KL__STORE_AHEAD_MAX_MS. The txn is then to be aborted; after a failure
 * to read them, any other call on it returns the same error.
 */
kl_err_t kl__store_settle(kl_txn_t *txn);

/** @returns nonzero while @p txn, begun ahead, is not settled and has not
 *  waited longer than KL__STORE_AHEAD_MAX_MS (then it is to be aborted);
 *  0 for any other txn, and for NULL. */
int kl__store_pending(kl_txn_t *txn);

/**
 * @returns nonzero when @p txn lost its link to the store (a PostgreSQL
 * server that restarted under it): it cannot commit, and what failed in it
 * failed for the store, not for the event (the worker runs the event again
 * without counting an attempt). 0 for LMDB.
 */
int kl__txn_lost(kl_txn_t *txn);

/**
 * @returns how many txns of @p store may be open at once before a begin
 * waits for one to end (PostgreSQL: store.pg.pool, one connection each),
 * or 0 when there is no such bound (LMDB). A caller that holds txns and
 * begins more must end some first past it, or wait for itself.
 */
size_t kl__store_txn_max(kl_store_t *store);

struct kl__cache_stats;
/**
 * The owner cache's size and counters (zeroes when the backend has none or
 * store.cache.max is 0), for the worker's metrics and the benchmark.
 */
void kl__store_cache_stats(kl_store_t *store, struct kl__cache_stats *stats);

/* The LMDB store's format: bumped on any incompatible layout change.
 * Format 1 kept idempotency keys unscoped in KL__LMDB_IDS_V1_DB, keyed by
 * the encoded id alone (a tag byte, 0 raw or 1 a packed UUID, then the
 * bytes); format 2 scopes them by topic; format 3 by topic and entity key
 * (store/lmdb_ids.c); format 4 sweeps them per topic (store/lmdb_sweep.c)
 * and so drops format 3's store-wide "sweep.cursor": its keys are format
 * 3's, but an older keylane would sweep every topic's ids by its own
 * retention, so it must refuse the store; format 5 records each topic's
 * owner (kl__store_owner_t, "owners"), which an older keylane would not
 * check; format 6 keeps the ids in KL__LMDB_IDS_DB, a UUID id before its
 * entity key (store/lmdb_ids.c, tag 5), and KL__LMDB_IDS_V5_DB becomes an
 * empty tombstone on which an older keylane still running fails every
 * read and write of an id (store/lmdb_migrate.c). Older formats are
 * migrated when opened; the ids formats 1 and 2 hold stay unscoped, and
 * meta's KL__LMDB_LEGACY_IDS_KEY says when the upgrade was (int64 store
 * ms, host order). */
#define KL__LMDB_FORMAT 6u
#define KL__LMDB_LEGACY_IDS_KEY "legacy_ids_at"
#define KL__LMDB_META_DB "meta"
#define KL__LMDB_FORMAT_KEY "format" /* value: uint32_t, host order */
#define KL__LMDB_IDS_V1_DB "ids"
#define KL__LMDB_IDS_V5_DB "topic_ids"
#define KL__LMDB_IDS_DB "ids_v6"

/**
 * The store's layout version: the LMDB format or the PostgreSQL schema
 * version, in @p version, and the one this build writes in @p latest.
 * For `keylane doctor` and `keylane store`.
 */
kl_err_t kl__store_version(kl_store_t *store, int *version, int *latest);

/** What kl__store_version() counts, for a message: "format" (LMDB's
 *  file) or "schema" (PostgreSQL's tables). Static. */
const char *kl__store_layout(kl_store_t *store);

/**
 * Writes into @p missing (NUL-terminated, cut to @p size) the columns the
 * store's schema lacks though its version says it has them (dropped or
 * renamed by hand); "" when none, and on a backend whose version
 * describes its whole layout (LMDB). For `keylane doctor`.
 * @returns KL_OK, or a store error (the columns could not be read).
 */
kl_err_t kl__store_missing(kl_store_t *store, char *missing, size_t size);

/**
 * Reads the clock the store stamps idempotency keys with, when it is not
 * this host's (PostgreSQL's clock_timestamp()): *@p server_ms, read between
 * *@p before_ms and *@p after_ms on this host's store clock. For `keylane
 * doctor`'s skew check.
 * @returns KL_OK; KL_ENOTFOUND when the store keeps no clock of its own
 *          (LMDB: it stamps with this host's, so there is no skew to
 *          measure); or a store error.
 */
kl_err_t kl__store_server_clock(kl_store_t *store, int64_t *server_ms,
                                int64_t *before_ms, int64_t *after_ms);

/* ---- PostgreSQL's process-wide settings (store/pg.c, pg_migrations.c) - */

/**
 * Names this process's sessions "keylane-ROLE-INSTANCE" in
 * pg_stat_activity (libpq's fallback_application_name: a URI's
 * application_name wins). @p role: worker, replay, doctor, cli;
 * @p instance: worker.instance.id, or NULL for "HOST-PID". Process wide:
 * call it before opening a store; an LMDB store has no sessions to name.
 */
void kl__pg_set_application(const char *role, const char *instance);

/**
 * Whether libpq reads the PostgreSQL location @p uri (a URI's syntax,
 * known keywords), without connecting: a location that does not read
 * fails the same way however long one waits.
 * @returns KL_OK, or KL_ECONF with libpq's reason (password scrubbed).
 */
kl_err_t kl__pg_location_check(const char *uri);

/**
 * `keylane store migrate`: connects to the PostgreSQL store @p uri and
 * applies every migration above its version (kl__pg_migrate(), pg.h).
 * @p from and @p to receive the versions before and after.
 * @returns KL_OK, KL_ESTORE_VERSION for a schema newer than this build,
 *          KL_ESTORE_BUSY, or KL_ESTORE when the server is unreachable.
 */
kl_err_t kl__store_pg_migrate(const char *uri, int *from, int *to);

/** Space used by one LMDB named database (or the whole file). */
typedef struct kl__store_usage {
  uint64_t map_size;   /**< this process's current map size, bytes */
  uint64_t file_pages; /**< pages in use in the data file */
  uint64_t page_size;
  uint64_t ids;        /**< idempotency keys held */
  uint64_t ids_pages;  /**< branch + leaf + overflow pages of "topic_ids" */
  uint64_t data_pages; /**< the same for the handlers' "data" */
  uint64_t txns;       /**< write transactions since the store was made;
                            each syncs twice at store.durability=full */
} kl__store_usage_t;

/**
 * Fills @p usage from mdb_env_info/mdb_stat.
 * @returns KL_OK, or KL_EINVAL when @p store is not an LMDB store.
 */
kl_err_t kl__store_lmdb_usage(kl_store_t *store, kl__store_usage_t *usage);

/**
 * Called for each idempotency key by kl__store_ids_walk(); return nonzero
 * to stop. @p topic is the topic it is scoped to, @p key the entity key
 * (NULL for an unscoped id) and @p id the id as it was marked (all
 * borrowed: valid for the call only), @p time_ms when it was recorded.
 */
typedef int(kl__store_id_cb_t)(void *opaque, const char *topic, const void *key,
                               size_t key_len, const char *id, size_t id_len,
                               int64_t time_ms, kl_mark_t mark);

/** The backends' form of it: the encoded sid. */
typedef int(kl__store_sid_cb_t)(void *opaque, const char *topic,
                                const char *sid, size_t sid_len,
                                int64_t time_ms, kl_mark_t mark);

/**
 * Calls @p cb for every idempotency key, in the backend's order, from one
 * consistent snapshot (safe while workers commit). For `keylane store`
 * (key counts and ages) and tests; it reads every key, so it is not for a
 * worker's path.
 * @returns KL_OK; KL_EINVAL when the backend has no such walk yet.
 */
kl_err_t kl__store_ids_walk(kl_store_t *store, kl__store_id_cb_t *cb,
                            void *opaque);

/* ---- the sweep of idempotency keys, per topic -------------------------- */

/**
 * Called for each topic whose ids a sweep removed, by kl__store_sweeps():
 * @p retention_ms is the store.dedup.retention of the last sweep that
 * removed ids of @p topic (borrowed: valid for the call only), @p at_ms
 * when (store clock). Return nonzero to stop.
 */
typedef int(kl__store_sweep_cb_t)(void *opaque, const char *topic,
                                  int64_t retention_ms, int64_t at_ms);

/**
 * Calls @p cb for each topic the store holds a sweep record of, in topic
 * order: what the fleets sharing the store actually sweep with, for
 * `keylane doctor`.
 */
kl_err_t kl__store_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                          void *opaque);

/**
 * Sweeps @p topic's expired ids, as kl_store_sweep() sweeps each topic
 * this handle took partitions of: the ids of every other topic are never
 * touched, whatever retention their fleets keep.
 */
kl_err_t kl__store_sweep_topic(kl_store_t *store, const char *topic, size_t max,
                               size_t *removed);

/* ---- the log a partition's watermark belongs to ------------------------ */

/**
 * Sets the identity of the record at the commit's watermark - 1 (as the
 * worker computes it: kl__apply_ident(), worker/apply.h), which the store
 * keeps with that watermark. A new owner reads the record at watermark - 1
 * from the log and compares: another record there means the log was
 * replaced (a topic deleted and created again with more records than the
 * watermark), whose records would otherwise be skipped as applied. @p ident
 * (at most KL__SID_MAX bytes) is copied. Call before the commit.
 */
kl_err_t kl__txn_set_last(kl_txn_t *txn, const void *ident, size_t len);

/**
 * The identity the store keeps for @p partition (kl__txn_set_last()) and
 * the watermark it belongs to: *@p len 0 when none is kept (a store written
 * by an older release, or a backend without it). It identifies the record
 * at watermark - 1 only while *@p watermark is the partition's watermark.
 * @p ident holds KL__SID_MAX bytes.
 */
kl_err_t kl__store_last(kl_store_t *store, const char *topic, int32_t partition,
                        int64_t *watermark, void *ident, size_t *len);

/* ---- the outbox: follow-up events committed with their source ------- */

/**
 * Called for each outbox record by kl__store_outbox_list(), in seq order;
 * @p rec (outbox_rec.h) is borrowed for the call. Return nonzero to stop.
 */
typedef int(kl__outbox_cb_t)(void *opaque, uint64_t seq, const void *rec,
                             size_t len);

/**
 * Lists up to @p max follow-ups that batches of @p partition of @p topic
 * committed and nobody removed, with a seq above @p after, in seq order
 * (commit order: seqs come from one counter of the store and only grow).
 * @returns KL_OK; KL_EINVAL for a store without an outbox.
 */
kl_err_t kl__store_outbox_list(kl_store_t *store, const char *topic,
                               int32_t partition, uint64_t after, size_t max,
                               kl__outbox_cb_t *cb, void *opaque);

/** One follow-up of the outbox, for kl__store_outbox_del(). */
typedef struct kl__outbox_ack {
  int32_t partition;
  uint64_t seq;
} kl__outbox_ack_t;

/**
 * Removes the follow-ups @p acks of @p topic (published and acknowledged),
 * of any partitions, in ONE short write; ones already gone are skipped.
 * Not fenced: a record Kafka acknowledged may go whoever owns its
 * partition.
 */
kl_err_t kl__store_outbox_del(kl_store_t *store, const char *topic,
                              const kl__outbox_ack_t *acks, size_t n);

/**
 * Tells @p txn which event its handler runs now, by its place in the log:
 * kl_txn_emit() derives the follow-ups' ids from @p topic (borrowed until
 * the next call), @p partition and @p offset, and counts their index from
 * 0 (outbox_rec.h). A NULL @p topic ends it (kl_txn_emit() is then
 * refused).
 */
void kl__txn_source(kl_txn_t *txn, const char *topic, int32_t partition,
                    int64_t offset);

struct kl_event; /* keylane/event.h */
struct kl_fence;
/** kl__txn_source() of the event @p fence names; @p event's W3C trace
 *  context (traceparent, tracestate) goes on with its follow-ups. */
void kl__txn_source_event(kl_txn_t *txn, const struct kl_event *event,
                          const struct kl_fence *fence);

/**
 * Sets the largest Kafka record a follow-up of @p txn may be:
 * kl_txn_emit() refuses one over @p message_max (a message.max.bytes; 0:
 * KL_MESSAGE_MAX), named @p source in its error (borrowed, as long as the
 * txn), so that an event whose follow-up could never be published fails
 * whole, before anything of it is committed.
 */
void kl__txn_set_message_max(kl_txn_t *txn, size_t message_max,
                             const char *source);

/**
 * Sets how far ahead a follow-up of @p txn's current event may be due
 * (kl_emit_opts_t.not_before): at most @p max_ms (timer.max.delay; 0: no
 * bound) after @p src_ms, the time of the event's record as the worker
 * judges a delayed event by it (0: unknown), or after now when that is
 * earlier, since the follow-up's own consumer and kl_publish() judge it by
 * their clocks later. Call it after kl__txn_source_event(), which forgets
 * @p src_ms; @p max_ms is kept for the txn's later events.
 */
void kl__txn_set_timer_max(kl_txn_t *txn, int64_t max_ms, int64_t src_ms);

typedef struct kl__emits kl__emits_t; /* outbox_rec.h */

/** Moves @p txn's emits out (NULL when none): the caller frees them with
 *  kl__emits_free(). */
kl__emits_t *kl__txn_take_emits(kl_txn_t *txn);

/** Appends @p emits to @p txn's, to be written with its commit. */
kl_err_t kl__txn_add_emits(kl_txn_t *txn, const kl__emits_t *emits);

#endif
