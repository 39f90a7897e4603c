/*
 * The store's backend interface. store.c dispatches the public kl_store_*
 * and kl_txn_* calls to a backend: lmdb.c (a directory) or
 * pg.c ("postgresql://..."). Each backend embeds kl_store_t and
 * kl_txn_t as the first member of its own structs.
 */
#ifndef KEYLANE_STORE_BACKEND_H
#define KEYLANE_STORE_BACKEND_H

#include <stdatomic.h>

#include "keylane/store.h"
#include "store/cache.h"
#include "store/store_internal.h"
#include "store/txn_buffer.h"

/* What kl__store_savepoint() does (store_internal.h). */
typedef enum kl__savepoint {
  KL__SAVEPOINT_SET,
  KL__SAVEPOINT_RELEASE,
  KL__SAVEPOINT_ROLLBACK,
} kl__savepoint_t;

typedef struct kl__store_ops {
  const char *name; /* "lmdb", "postgresql" */
  void (*destroy)(kl_store_t *store);
  /* The new epoch is above both the current one and @p floor. With
   * @p owner, as kl__store_acquire_owned() says: the topic's owner is
   * recorded or compared in the same write (@p recorded and @p refused
   * are then set; NULL and unset without @p owner). */
  kl_err_t (*acquire)(kl_store_t *store, const char *topic, int32_t partition,
                      uint64_t floor, const kl__store_owner_t *owner,
                      kl__store_owner_t *recorded, int *refused,
                      kl_partition_state_t *state);
  /* kl__store_owner() (KL_ENOTFOUND: none recorded) and kl__store_bind(). */
  kl_err_t (*owner_get)(kl_store_t *store, const char *topic,
                        kl__store_owner_t *owner);
  kl_err_t (*owner_set)(kl_store_t *store, const char *topic,
                        const kl__store_owner_t *owner);
  kl_err_t (*partition)(kl_store_t *store, const char *topic, int32_t partition,
                        kl_partition_state_t *state);
  /* kl__store_reset(): a new epoch and watermark 0, in one write; state
   * zeroed when the partition is unknown (then nothing is written). */
  kl_err_t (*reset)(kl_store_t *store, const char *topic, int32_t partition,
                    kl_partition_state_t *state);
  kl_err_t (*beat)(kl_store_t *store, const char *topic, kl__beat_t *beats,
                   size_t n);
  kl_err_t (*begin)(kl_store_t *store, const char *topic, int32_t partition,
                    uint64_t epoch, kl_txn_t **txn);
  kl_err_t (*commit)(kl_txn_t *txn, int64_t watermark);
  /* Optional (NULL: store.c commits them one after another): several txns
   * of this store at once, as kl__store_commit_many() says. */
  void (*commit_many)(kl__store_commit_t *commits, size_t n);
  void (*abort)(kl_txn_t *txn);
  kl_err_t (*get)(kl_txn_t *txn, const void *key, size_t key_len,
                  const void **val, size_t *val_len);
  kl_err_t (*put)(kl_txn_t *txn, const void *key, size_t key_len,
                  const void *val, size_t val_len);
  kl_err_t (*del)(kl_txn_t *txn, const void *key, size_t key_len);
  kl_err_t (*seen)(kl_txn_t *txn, const char *id, size_t id_len,
                   kl_mark_t *mark);
  kl_err_t (*mark)(kl_txn_t *txn, const char *id, size_t id_len,
                   kl_mark_t mark);
  void (*count_duplicate)(kl_txn_t *txn);
  /* Removes expired ids of @p topic alone, judged by this store's
   * retention, from the topic's own position (kl_store_sweep()); records
   * that retention for the topic when it removes any (sweeps). */
  kl_err_t (*sweep)(kl_store_t *store, const char *topic, size_t max,
                    size_t *removed);
  /* kl__store_sweeps(): each topic's recorded sweep retention. */
  kl_err_t (*sweeps)(kl_store_t *store, kl__store_sweep_cb_t *cb, void *opaque);
  kl_err_t (*scan)(kl_store_t *store, const void *prefix, size_t prefix_len,
                   kl_store_scan_cb_t *cb, void *opaque);
  kl_err_t (*foreach_partition)(kl_store_t *store, kl_store_partition_cb_t *cb,
                                void *opaque);
  kl_err_t (*id_count)(kl_store_t *store, uint64_t *count);
  kl_err_t (*version)(kl_store_t *store, int *version, int *latest);
  /* Optional (NULL: kl__store_ids_walk() says the backend lacks it). */
  kl_err_t (*ids_walk)(kl_store_t *store, kl__store_sid_cb_t *cb, void *opaque);
  /* Optional (NULL: kl_txn_pg_conn() returns NULL): the PGconn a handler
   * may run its SQL on, in the transaction that commits the txn. */
  struct pg_conn *(*pg_conn)(kl_txn_t *txn);
  /* Optional (NULL: no SQL to undo, kl__store_savepoint() does nothing):
   * a savepoint in the transaction pg_conn lends. */
  kl_err_t (*savepoint)(kl_txn_t *txn, kl__savepoint_t what);
  /* Optional (NULL: kl__store_begin_ahead() refuses with KL_EINVAL,
   * naming the backend; kl__store_settle() is KL_OK and
   * kl__store_pending() 0 on every txn): a begin and a prefetch sent
   * without waiting for the answers, as kl__store_begin_ahead() says. */
  kl_err_t (*begin_ahead)(kl_store_t *store, const char *topic,
                          int32_t partition, uint64_t epoch,
                          const char *const *ids, const size_t *id_lens,
                          size_t n, kl_txn_t **txn);
  kl_err_t (*settle)(kl_txn_t *txn);
  int (*pending)(kl_txn_t *txn);
  /* What version() counts, for messages: "format" (a file layout),
   * "schema" (a database's). */
  const char *layout;
  /* Optional (NULL: the version says it all, nothing is missing):
   * kl__store_missing(). */
  kl_err_t (*missing)(kl_store_t *store, char *missing, size_t size);
  /* Optional (NULL: the store keeps no clock of its own, it stamps with
   * this host's): kl__store_server_clock(). */
  kl_err_t (*server_clock)(kl_store_t *store, int64_t *server_ms,
                           int64_t *before_ms, int64_t *after_ms);
  /* Optional (NULL: kl_txn_prefetch() does nothing): looks up a batch's
   * idempotency keys at once, for kl_txn_seen() to answer from memory. */
  kl_err_t (*prefetch)(kl_txn_t *txn, const char *const *ids,
                       const size_t *id_lens, size_t n);
  /* Optional (NULL: never): nonzero when the txn can no longer commit
   * because its link to the store is lost (kl__txn_lost()). */
  int (*lost)(kl_txn_t *txn);
  /* Optional (NULL: no bound): how many txns may be open at once
   * (kl__store_txn_max()). */
  size_t (*txn_max)(kl_store_t *store);
  /* Optional (NULL: 0, no bound): how long the store's server lets a
   * session sit idle in a transaction (kl__store_idle_ms()). */
  int64_t (*idle_ms)(const kl_store_t *store);
  /* Optional (NULL: no owner cache): kl__store_forget() and
   * kl__store_cache_stats(). */
  void (*forget)(kl_store_t *store, const char *topic, int32_t partition);
  void (*cache_stats)(kl_store_t *store, kl__cache_stats_t *stats);
  /* Optional (NULL: the store has no outbox, kl_txn_emit()'s commit is
   * refused): kl__store_outbox_list() and kl__store_outbox_del(). A
   * backend with them writes txn->emits in its commit, after the fence
   * check, each under the next seq of the store's outbox counter. */
  kl_err_t (*outbox_list)(kl_store_t *store, const char *topic,
                          int32_t partition, uint64_t after, size_t max,
                          kl__outbox_cb_t *cb, void *opaque);
  kl_err_t (*outbox_del)(kl_store_t *store, const char *topic,
                         const kl__outbox_ack_t *acks, size_t n);
  /* Optional (NULL: none kept): kl__store_last(). A backend with it keeps
   * txn->last with the commit's watermark, when that becomes the
   * partition's. */
  kl_err_t (*last)(kl_store_t *store, const char *topic, int32_t partition,
                   int64_t *watermark, void *ident, size_t *len);
} kl__store_ops_t;

/*
 * Declares backend @p b's txn and outbox operations for its ops table:
 * kl__<b>_begin, _commit, _commit_many, _abort, _get, _put, _del, _seen,
 * _mark, _count_duplicate, _outbox_list and _outbox_del, with the
 * signatures of the ops above. Written once, so that the backends cannot
 * drift apart; each defines them in its own files.
 */
#define KL__STORE_BACKEND_DECLARE(b)                                           \
  kl_err_t kl__##b##_begin(kl_store_t *store, const char *topic,               \
                           int32_t partition, uint64_t epoch, kl_txn_t **txn); \
  kl_err_t kl__##b##_commit(kl_txn_t *txn, int64_t watermark);                 \
  void kl__##b##_commit_many(kl__store_commit_t *commits, size_t n);           \
  void kl__##b##_abort(kl_txn_t *txn);                                         \
  kl_err_t kl__##b##_get(kl_txn_t *txn, const void *key, size_t key_len,       \
                         const void **val, size_t *val_len);                   \
  kl_err_t kl__##b##_put(kl_txn_t *txn, const void *key, size_t key_len,       \
                         const void *val, size_t val_len);                     \
  kl_err_t kl__##b##_del(kl_txn_t *txn, const void *key, size_t key_len);      \
  kl_err_t kl__##b##_seen(kl_txn_t *txn, const char *id, size_t id_len,        \
                          kl_mark_t *mark);                                    \
  kl_err_t kl__##b##_mark(kl_txn_t *txn, const char *id, size_t id_len,        \
                          kl_mark_t mark);                                     \
  void kl__##b##_count_duplicate(kl_txn_t *txn);                               \
  kl_err_t kl__##b##_outbox_list(                                              \
      kl_store_t *store, const char *topic, int32_t partition, uint64_t after, \
      size_t max, kl__outbox_cb_t *cb, void *opaque);                          \
  kl_err_t kl__##b##_outbox_del(kl_store_t *store, const char *topic,          \
                                const kl__outbox_ack_t *acks, size_t n)

/* How many finished txns a store keeps for reuse: as many as a worker's
 * lanes hold at once, typically; each keeps at most KL__BUF_KEEP_MAX per
 * buffer. */
#define KL__STORE_SPARES 8

/* Frees a spare txn for good (its buffers, emits and struct). */
typedef void(kl__store_spare_drop_t)(kl_txn_t *txn);

struct kl_store {
  const kl__store_ops_t *ops;
  /* The topics this handle took partitions of (kl_store_acquire()), the
   * ones kl_store_sweep() sweeps, in turn (sweep_next); store.c's, freed
   * by kl_store_destroy(), guarded by a lock of store.c. */
  char **sweep_topics;
  size_t sweep_count, sweep_next;
  /* kl__store_legacy_ids(): until when (store clock, ms) the store may
   * hold unexpired ids recorded before ids were scoped by key; 0: none.
   * Set by the backend's open. */
  int64_t legacy_ids_until_ms;
  /* Finished txns the backend keeps for its next begins, with their
   * buffers (kl__store_spare_take/give()); a slot is NULL or owns one.
   * Zeroed with the handle; emptied by kl_store_destroy(). */
  _Atomic(kl_txn_t *) spares[KL__STORE_SPARES];
  _Atomic(kl__store_spare_drop_t *) spare_drop;
};

typedef struct kl__emits kl__emits_t; /* outbox_rec.h */

/* The emit fields are the store.c's (kl_txn_emit()); a backend zeroes
 * them with its txn, writes emits in its commit and frees them with
 * kl__txn_emits_free() when the txn ends. */
struct kl_txn {
  kl_store_t *store;
  kl__emits_t *emits; /* the batch's follow-ups; NULL until one is emitted */
  const struct kl_event *src; /* the event it runs (borrowed), or NULL */
  const char *src_topic;      /* its place in the log (kl__txn_source()) */
  int32_t src_partition;
  int64_t src_offset;
  size_t src_first;   /* emits->count when that event began */
  size_t message_max; /* kl__txn_set_message_max(); 0: KL_MESSAGE_MAX */
  const char *message_max_src;
  uint64_t src_nonce;   /* its follow-ups' nonce, drawn at its first emit */
  int64_t timer_max_ms; /* kl__txn_set_timer_max(); 0: no bound */
  int64_t src_ms;       /* the source record's time; 0: unknown */
  int64_t timers; /* store/timers.c: timers it wrote less those it deleted,
                     for the owner's count (a child's, worker/lanes.c) */
  char *last;     /* kl__txn_set_last(): the ident of the record at the
                     commit's watermark - 1; NULL: keep the stored one */
  size_t last_len;
};

/* Kafka's own limit on a topic's name; the parts key holds the name, so
 * it is enforced. */
#define KL__TOPIC_MAX 249

/* Checks a topic and partition given to @p fn (store.c). */
kl_err_t kl__store_check_tp(const char *fn, const char *topic,
                            int32_t partition);

/* KL_OK, or (aborting @p txn) KL_EINVAL when it emitted follow-ups and
 * its store has no outbox: they would be lost. */
kl_err_t kl__store_commit_outboxless(kl_txn_t *txn);

/* Frees what store.c keeps in @p txn (its emits, its last record's
 * ident); for the backends' txn ends. */
void kl__txn_emits_free(kl_txn_t *txn);

/* Empties what store.c keeps in @p txn for its reuse by the next batch:
 * frees its emits, keeps its last record's ident buffer (emptied). */
void kl__txn_recycle(kl_txn_t *txn);

/*
 * A finished txn of @p store to begin the next batch with (its buffers
 * recycled: kl__buf_recycle()), or NULL: the backend makes a new one.
 * Thread safe: any lane's thread may take or give at any time.
 */
kl_txn_t *kl__store_spare_take(kl_store_t *store);

/*
 * Keeps the finished @p txn (recycled by the backend) for a next
 * kl__store_spare_take(), or, when the store keeps KL__STORE_SPARES
 * already, frees it with @p drop. kl_store_destroy() drops what is kept.
 */
void kl__store_spare_give(kl_store_t *store, kl_txn_t *txn,
                          kl__store_spare_drop_t *drop);

/* Backend constructors, called by kl_store_open(). */
kl_err_t kl__store_lmdb_open(const char *dir, const kl_conf_t *conf,
                             kl_store_t **out);
kl_err_t kl__store_pg_open(const char *uri, const kl_conf_t *conf,
                           kl_store_t **out);

/*
 * Buffers the mark of the idempotency key @p key (as the backend encodes
 * it) in @p ids, a buffer whose tags are kl_mark_t: kl__mark_merge() with
 * what the buffer holds, so a dead letter never replaces an applied mark.
 * For the backends' and the lanes' child txns' kl_txn_mark().
 */
kl_err_t kl__store_buf_mark(kl__buf_t *ids, const void *key, size_t key_len,
                            kl_mark_t mark);

/*
 * A savepoint in a batch whose handlers run SQL of their own (PostgreSQL),
 * so that one event's SQL can be undone without the batch's: SET before
 * the event's handler runs, then RELEASE when the event's writes are kept
 * or ROLLBACK (to the savepoint) when they are discarded (RETRY, FAIL),
 * which also recovers a transaction that a failed statement of the
 * handler aborted. One level: SET again only after a RELEASE or ROLLBACK.
 * A backend without the savepoint op (LMDB) has no SQL to undo: KL_OK.
 * @returns KL_OK, or a store error (the batch is then to be aborted).
 */
kl_err_t kl__store_savepoint(kl_txn_t *txn, kl__savepoint_t what);

#endif
