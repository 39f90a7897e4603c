/*
 * The public store API: picks a backend by location and forwards every
 * call to it. Argument checks that hold for every backend live here, once.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/mutant.h"
#include "common/strbuf.h"
#include "store/backend.h"
#include "store/location.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "store/timers.h"

kl_err_t kl_store_open(const char *location, const kl_conf_t *conf,
                       kl_store_t **out) {
  kl__err_clear();
  if (!location || !*location || !out)
    return kl__err(KL_EINVAL, "kl_store_open: location and out are required");
  *out = NULL;
  if (!kl__location_is_pg(location))
    return kl__store_lmdb_open(location, conf, out);
  return kl__store_pg_open(location, conf, out);
}

/* Guards every handle's sweep_topics: taken once per acquire and sweep. */
static pthread_mutex_t kl_sweep_mu = PTHREAD_MUTEX_INITIALIZER;

void kl_store_destroy(kl_store_t *store) {
  if (!store)
    return;
  kl__store_spare_drop_t *drop = atomic_load(&store->spare_drop);
  for (size_t i = 0; i < KL__STORE_SPARES; i++) {
    kl_txn_t *txn = atomic_exchange(&store->spares[i], NULL);
    if (txn)
      drop(txn);
  }
  for (size_t i = 0; i < store->sweep_count; i++)
    free(store->sweep_topics[i]);
  free(store->sweep_topics);
  store->ops->destroy(store);
}

/* Adds @p topic to the topics kl_store_sweep() sweeps. Out of memory it is
 * left out: its ids then outlive the retention, which is safe. */
static void sweep_topic_add(kl_store_t *store, const char *topic) {
  pthread_mutex_lock(&kl_sweep_mu);
  size_t i = 0;
  while (i < store->sweep_count && strcmp(store->sweep_topics[i], topic))
    i++;
  char **grown = NULL;
  if (i == store->sweep_count)
    grown = realloc(store->sweep_topics, (i + 1) * sizeof(*grown));
  if (grown) {
    store->sweep_topics = grown;
    if ((grown[i] = strdup(topic)))
      store->sweep_count++;
  }
  pthread_mutex_unlock(&kl_sweep_mu);
}

/* The topic kl_store_sweep() sweeps next, copied to @p topic: 0, or -1
 * when this handle took no partition yet. */
static int sweep_topic_next(kl_store_t *store, char topic[KL__TOPIC_MAX + 1]) {
  pthread_mutex_lock(&kl_sweep_mu);
  int n = store->sweep_count ? 0 : -1;
  if (n == 0) {
    size_t i = store->sweep_next++ % store->sweep_count;
    snprintf(topic, KL__TOPIC_MAX + 1, "%s", store->sweep_topics[i]);
  }
  pthread_mutex_unlock(&kl_sweep_mu);
  return n;
}

kl_err_t kl__store_check_tp(const char *fn, const char *topic,
                            int32_t partition) {
  if (!topic || !*topic)
    return kl__err(KL_EINVAL, "%s: a topic is required", fn);
  size_t len = strlen(topic);
  if (len > KL__TOPIC_MAX)
    return kl__err(KL_EINVAL, "%s: topic is %zu bytes, Kafka allows %d", fn,
                   len, KL__TOPIC_MAX);
  if (partition < 0)
    return kl__err(KL_EINVAL, "%s: partition %d is negative", fn,
                   (int)partition);
  return KL_OK;
}

kl_err_t kl__store_acquire_owned(kl_store_t *store, const char *topic,
                                 int32_t partition, uint64_t floor,
                                 const kl__store_owner_t *owner,
                                 kl__store_owner_t *recorded, int *refused,
                                 kl_partition_state_t *state) {
  kl_err_t err = kl__store_check_tp("kl_store_acquire", topic, partition);
  if (err || !store || !state || (owner && (!recorded || !refused)))
    return err ? err
               : kl__err(KL_EINVAL, "kl_store_acquire: store and state "
                                    "are required");
  if (refused)
    *refused = 0;
  if (KL__MUTANT(KL__MUTANT_OWNER)) /* test only: common/mutant.h */
    owner = NULL;
  err = store->ops->acquire(store, topic, partition, floor, owner, recorded,
                            refused, state);
  if (!err && !(refused && *refused))
    sweep_topic_add(store, topic);
  return err;
}

kl_err_t kl__store_acquire_above(kl_store_t *store, const char *topic,
                                 int32_t partition, uint64_t floor,
                                 kl_partition_state_t *state) {
  return kl__store_acquire_owned(store, topic, partition, floor, NULL, NULL,
                                 NULL, state);
}

kl_err_t kl__store_owner_make(kl__store_owner_t *owner, const char *cluster,
                              const char *group) {
  memset(owner, 0, sizeof(*owner));
  if (!cluster || !*cluster || strlen(cluster) > KL__OWNER_CLUSTER_MAX)
    return kl__err(KL_EINVAL,
                   "a Kafka cluster id of 1 to %d bytes is required, got "
                   "\"%.40s\"",
                   KL__OWNER_CLUSTER_MAX, cluster ? cluster : "");
  if (!group || !*group || strlen(group) > KL__OWNER_GROUP_MAX)
    return kl__err(KL_EINVAL,
                   "a consumer group of 1 to %d bytes is required, got "
                   "\"%.40s\"",
                   KL__OWNER_GROUP_MAX, group ? group : "");
  snprintf(owner->cluster, sizeof(owner->cluster), "%s", cluster);
  snprintf(owner->group, sizeof(owner->group), "%s", group);
  return KL_OK;
}

int kl__store_owner_equal(const kl__store_owner_t *a,
                          const kl__store_owner_t *b) {
  return strcmp(a->cluster, b->cluster) == 0 && strcmp(a->group, b->group) == 0;
}

kl_err_t kl__store_owner(kl_store_t *store, const char *topic,
                         kl__store_owner_t *owner) {
  kl_err_t err = kl__store_check_tp("kl__store_owner", topic, 0);
  memset(owner, 0, sizeof(*owner));
  return err ? err : store->ops->owner_get(store, topic, owner);
}

kl_err_t kl__store_bind(kl_store_t *store, const char *topic,
                        const kl__store_owner_t *owner) {
  kl_err_t err = kl__store_check_tp("kl__store_bind", topic, 0);
  if (!err && (!owner->cluster[0] || !owner->group[0]))
    err = kl__err(KL_EINVAL, "kl__store_bind: a cluster and a group are "
                             "required");
  return err ? err : store->ops->owner_set(store, topic, owner);
}

kl_err_t kl_store_acquire(kl_store_t *store, const char *topic,
                          int32_t partition, kl_partition_state_t *state) {
  kl__err_clear();
  return kl__store_acquire_above(store, topic, partition, 0, state);
}

kl_err_t kl_store_partition(kl_store_t *store, const char *topic,
                            int32_t partition, kl_partition_state_t *state) {
  kl__err_clear();
  kl_err_t err = kl__store_check_tp("kl_store_partition", topic, partition);
  if (err || !store || !state)
    return err ? err
               : kl__err(KL_EINVAL, "kl_store_partition: store and "
                                    "state are required");
  return store->ops->partition(store, topic, partition, state);
}

kl_err_t kl__store_reset(kl_store_t *store, const char *topic,
                         int32_t partition, kl_partition_state_t *state) {
  kl_err_t err = kl__store_check_tp("kl__store_reset", topic, partition);
  if (err || !store || !state)
    return err ? err
               : kl__err(KL_EINVAL, "kl__store_reset: store and state "
                                    "are required");
  if ((err = store->ops->reset(store, topic, partition, state)))
    return err;
  if (state->epoch == 0)
    return kl__err(KL_ENOTFOUND,
                   "the store has no state for topic %s "
                   "partition %" PRId32 ": nothing to reset",
                   topic, partition);
  return KL_OK;
}

kl_err_t kl__store_beat(kl_store_t *store, const char *topic, kl__beat_t *beats,
                        size_t n) {
  if (!store || (!beats && n))
    return kl__err(KL_EINVAL, "kl__store_beat: a store and the beats are "
                              "required");
  for (size_t i = 0; i < n; i++) {
    kl_err_t err =
        kl__store_check_tp("kl__store_beat", topic, beats[i].partition);
    if (err || !beats[i].epoch)
      return err ? err
                 : kl__err(KL_EINVAL,
                           "kl__store_beat: partition %d "
                           "has epoch 0, which no owner "
                           "holds",
                           (int)beats[i].partition);
  }
  return n ? store->ops->beat(store, topic, beats, n) : KL_OK;
}

int64_t kl__beat_period_ns(const kl_conf_t *conf) {
  int64_t third_ms =
      conf ? kl__conf_int(conf, "worker.fenced.retake.ms") / 3 : 0;
  return (third_ms > 0 && third_ms < 1000 ? third_ms : 1000) * 1000000;
}

kl_err_t kl_store_begin(kl_store_t *store, const char *topic, int32_t partition,
                        uint64_t epoch, kl_txn_t **txn) {
  kl__err_clear();
  kl_err_t err = kl__store_check_tp("kl_store_begin", topic, partition);
  if (err)
    return err;
  if (!store || !txn)
    return kl__err(KL_EINVAL, "kl_store_begin: store and txn are required");
  *txn = NULL;
  if (epoch == 0)
    return kl__err(KL_EINVAL, "kl_store_begin: epoch 0 belongs to no owner: "
                              "take the partition with kl_store_acquire()");
  return store->ops->begin(store, topic, partition, epoch, txn);
}

kl_err_t kl_store_commit(kl_txn_t *txn, int64_t watermark) {
  kl__err_clear();
  if (!txn)
    return kl__err(KL_EINVAL, "kl_store_commit: txn is required");
  kl_err_t err = kl__store_commit_outboxless(txn);
  return err ? err : txn->store->ops->commit(txn, watermark);
}

void kl__store_commit_many(kl__store_commit_t *commits, size_t n) {
  int one_store = 1;
  for (size_t i = 1; i < n; i++)
    one_store &= commits[i].txn->store == commits[0].txn->store;
  if (n && one_store && commits[0].txn->store->ops->commit_many) {
    commits[0].txn->store->ops->commit_many(commits, n);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    commits[i].err = kl_store_commit(commits[i].txn, commits[i].watermark);
    snprintf(commits[i].why, sizeof(commits[i].why), "%s",
             commits[i].err ? kl_err_detail() : "");
  }
}

const char *kl_store_backend(const kl_store_t *store) {
  return store ? store->ops->name : "";
}

void kl_store_abort(kl_txn_t *txn) {
  if (txn)
    txn->store->ops->abort(txn);
}

/* LMDB's default key limit; PostgreSQL's is larger, but a handler that
 * works on one backend must work on the other. */
#define KL_STORE_KEY_MAX 511

static kl_err_t store_check_key(const char *fn, const void *key,
                                size_t key_len) {
  if (!key || key_len == 0 || key_len > KL_STORE_KEY_MAX)
    return kl__err(KL_EINVAL,
                   "%s: key is %zu bytes, expected 1..%d: hash "
                   "longer entity keys into the store key",
                   fn, key_len, KL_STORE_KEY_MAX);
  return KL_OK;
}

/* An idempotency key is 1..KL_ID_MAX bytes (event.h). */
static kl_err_t store_check_id(const char *fn, const char *id, size_t id_len) {
  if (!id || id_len == 0 || id_len > KL_ID_MAX)
    return kl__err(KL_EINVAL,
                   "%s: idempotency key is %zu bytes, expected "
                   "1..%d",
                   fn, id_len, KL_ID_MAX);
  if (memchr(id, 0, id_len))
    return kl__err(KL_EINVAL,
                   "%s: idempotency key holds a NUL byte; an id is text "
                   "(event.h)",
                   fn);
  return KL_OK;
}

/* An entity key is 1..KL_KEY_MAX bytes (event.h). */
static kl_err_t store_check_entity(const char *fn, const void *key,
                                   size_t key_len) {
  if (!key || key_len == 0 || key_len > KL_KEY_MAX)
    return kl__err(KL_EINVAL, "%s: entity key is %zu bytes, expected 1..%d", fn,
                   key_len, KL_KEY_MAX);
  return KL_OK;
}

size_t kl__sid_encode(const void *key, size_t key_len, const char *id,
                      size_t id_len, char out[KL__SID_MAX]) {
  out[0] = 0;
  kl__put_be(out + 1, key_len, 2);
  memcpy(out + 3, key, key_len);
  memcpy(out + 3 + key_len, id, id_len);
  return 3 + key_len + id_len;
}

int kl__sid_decode(const char *sid, size_t len, const void **key,
                   size_t *key_len, const char **id, size_t *id_len) {
  if (len > 0 && sid[0] != 0) { /* unscoped */
    *key = NULL, *key_len = 0, *id = sid, *id_len = len;
    return len <= KL_ID_MAX ? 0 : -1;
  }
  if (len < 3)
    return -1;
  size_t k = (size_t)kl__get_be(sid + 1, 2);
  if (k == 0 || k > KL_KEY_MAX || len <= 3 + k || len - 3 - k > KL_ID_MAX)
    return -1;
  *key = sid + 3, *key_len = k, *id = sid + 3 + k, *id_len = len - 3 - k;
  return 0;
}

int kl__store_legacy_ids(const kl_store_t *store) {
  return store->legacy_ids_until_ms > 0 &&
         kl__store_now_ms() < store->legacy_ids_until_ms;
}

kl_err_t kl_txn_get(kl_txn_t *txn, const void *key, size_t key_len,
                    const void **val, size_t *val_len) {
  kl__err_clear();
  kl_err_t err = store_check_key("kl_txn_get", key, key_len);
  if (err || !txn || !val || !val_len)
    return err ? err
               : kl__err(KL_EINVAL, "kl_txn_get: txn, val and val_len "
                                    "are required");
  return txn->store->ops->get(txn, key, key_len, val, val_len);
}

kl_err_t kl__txn_kv_put(kl_txn_t *txn, const void *key, size_t key_len,
                        const void *val, size_t val_len) {
  kl_err_t err = store_check_key("kl_txn_put", key, key_len);
  if (err || !txn || (!val && val_len))
    return err ? err
               : kl__err(KL_EINVAL, "kl_txn_put: txn and val are "
                                    "required");
  return txn->store->ops->put(txn, key, key_len, val, val_len);
}

kl_err_t kl__txn_kv_del(kl_txn_t *txn, const void *key, size_t key_len) {
  kl_err_t err = store_check_key("kl_txn_del", key, key_len);
  if (err || !txn)
    return err ? err : kl__err(KL_EINVAL, "kl_txn_del: txn is required");
  return txn->store->ops->del(txn, key, key_len);
}

/* Keys beginning with KL__STORE_OWN are keylane's (its timers): a handler
 * that wrote one could schedule or cancel any event. */
static kl_err_t store_check_own(const char *fn, const void *key,
                                size_t key_len) {
  if (key && key_len && *(const char *)key == KL__STORE_OWN)
    return kl__err(KL_EINVAL,
                   "%s: keys beginning with '%c' are keylane's own (its "
                   "timers); choose a key that does not",
                   fn, KL__STORE_OWN);
  return KL_OK;
}

kl_err_t kl_txn_put(kl_txn_t *txn, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  kl__err_clear();
  kl_err_t err = store_check_own("kl_txn_put", key, key_len);
  return err ? err : kl__txn_kv_put(txn, key, key_len, val, val_len);
}

kl_err_t kl_txn_del(kl_txn_t *txn, const void *key, size_t key_len) {
  kl__err_clear();
  kl_err_t err = store_check_own("kl_txn_del", key, key_len);
  return err ? err : kl__txn_kv_del(txn, key, key_len);
}

kl_err_t kl__txn_seen_sid(kl_txn_t *txn, const char *sid, size_t sid_len,
                          kl_mark_t *mark) {
  kl_err_t err = txn->store->ops->seen(txn, sid, sid_len, mark);
  const void *key;
  size_t key_len, id_len;
  const char *id;
  /* Ids recorded before they were scoped by key suppress their events'
   * copies until they expire (kl__store_legacy_ids()). */
  if (!err && *mark == KL_MARK_NONE && sid_len && sid[0] == 0 &&
      kl__store_legacy_ids(txn->store) &&
      kl__sid_decode(sid, sid_len, &key, &key_len, &id, &id_len) == 0)
    err = txn->store->ops->seen(txn, id, id_len, mark);
  return err;
}

/* A mark a caller may write: KL__MARK_TIMER and KL__MARK_CANCELLED only
 * keylane's own (@p own). */
static kl_err_t store_check_mark(kl_mark_t mark, int own) {
  if (mark == KL_MARK_APPLIED || mark == KL_MARK_DEAD_LETTER ||
      (own && (mark == KL__MARK_TIMER || mark == KL__MARK_CANCELLED)))
    return KL_OK;
  return kl__err(KL_EINVAL,
                 "kl_txn_mark: mark %d is neither "
                 "KL_MARK_APPLIED nor KL_MARK_DEAD_LETTER",
                 (int)mark);
}

kl_err_t kl__txn_mark_sid(kl_txn_t *txn, const char *sid, size_t sid_len,
                          kl_mark_t mark) {
  kl_err_t err = store_check_mark(mark, 1);
  return err ? err : txn->store->ops->mark(txn, sid, sid_len, mark);
}

/* The mark as stored, KL__MARK_TIMER and KL__MARK_CANCELLED included. */
static kl_err_t store_seen(kl_txn_t *txn, const void *key, size_t key_len,
                           const char *id, size_t id_len, kl_mark_t *mark) {
  kl__err_clear();
  kl_err_t err = store_check_entity("kl_txn_seen", key, key_len);
  if (!err)
    err = store_check_id("kl_txn_seen", id, id_len);
  if (err || !txn || !mark)
    return err ? err
               : kl__err(KL_EINVAL, "kl_txn_seen: txn and mark are "
                                    "required");
  char sid[KL__SID_MAX];
  size_t len = kl__sid_encode(key, key_len, id, id_len, sid);
  return kl__txn_seen_sid(txn, sid, len, mark);
}

kl_err_t kl__txn_seen(kl_txn_t *txn, const void *key, size_t key_len,
                      const char *id, size_t id_len, kl_mark_t *mark) {
  kl_err_t err = store_seen(txn, key, key_len, id, id_len, mark);
  if (!err && *mark == KL__MARK_CANCELLED) /* settled: copies are duplicates */
    *mark = KL_MARK_APPLIED;
  return err;
}

kl_err_t kl_txn_seen(kl_txn_t *txn, const void *key, size_t key_len,
                     const char *id, size_t id_len, kl_mark_t *mark) {
  kl_err_t err = store_seen(txn, key, key_len, id, id_len, mark);
  /* waiting, or cancelled: not applied */
  if (!err && (*mark == KL__MARK_TIMER || *mark == KL__MARK_CANCELLED))
    *mark = KL_MARK_NONE;
  return err;
}

kl_err_t kl_txn_mark(kl_txn_t *txn, const void *key, size_t key_len,
                     const char *id, size_t id_len, kl_mark_t mark) {
  kl__err_clear();
  kl_err_t err = store_check_entity("kl_txn_mark", key, key_len);
  if (!err)
    err = store_check_id("kl_txn_mark", id, id_len);
  if (!err)
    err = store_check_mark(mark, 0);
  if (err || !txn)
    return err ? err : kl__err(KL_EINVAL, "kl_txn_mark: txn is required");
  char sid[KL__SID_MAX];
  size_t len = kl__sid_encode(key, key_len, id, id_len, sid);
  return kl__txn_mark_sid(txn, sid, len, mark);
}

kl_err_t kl_txn_cancel(kl_txn_t *txn, const void *key, size_t key_len,
                       const char *id, size_t id_len) {
  kl__err_clear();
  kl_err_t err = store_check_entity("kl_txn_cancel", key, key_len);
  if (!err)
    err = store_check_id("kl_txn_cancel", id, id_len);
  if (err || !txn)
    return err ? err : kl__err(KL_EINVAL, "kl_txn_cancel: txn is required");
  const kl_event_t *src = txn->src;
  if (!src || !txn->src_topic)
    return kl__err(KL_EINVAL, "kl_txn_cancel: the txn runs no event; cancel "
                              "from a handler, whose event's key and "
                              "partition hold the timer");
  /* The key's lane runs the cancel and the timer's firing in log order;
   * another key's timer has another writer (docs/design.md). */
  if (key_len != src->key_len || memcmp(key, src->key, key_len) != 0) {
    char shown[KL__ESCAPED_SIZE(64)];
    return kl__err(KL_EINVAL,
                   "kl_txn_cancel: the key is not the running event's "
                   "(\"%s\"): a handler cancels its own key's timers; emit "
                   "a follow-up to the other key whose handler cancels it",
                   kl__escape(shown, sizeof(shown), src->key, src->key_len));
  }
  kl__timer_t t;
  char shown[KL__ESCAPED_SIZE(64)];
  err = kl__timer_get(txn, txn->src_topic, txn->src_partition, key, key_len, id,
                      id_len, &t);
  /* A dead-lettered id's timer no longer waits: the commit that records
   * its firing record's dead letter takes it (kl__apply_dead_letter()),
   * where a rebuild takes it too, and a cancel run before that commit
   * must answer as the rebuild's does. */
  char sid[KL__SID_MAX];
  size_t sid_len = kl__sid_encode(key, key_len, id, id_len, sid);
  kl_mark_t mark = KL_MARK_NONE;
  if (!err && !(err = kl__txn_seen_sid(txn, sid, sid_len, &mark)) &&
      mark == KL_MARK_DEAD_LETTER)
    err = KL_ENOTFOUND;
  if (err == KL_ENOTFOUND)
    return kl__err(KL_ENOTFOUND,
                   "kl_txn_cancel: no timer of id \"%s\" waits for this "
                   "key in partition %d of %s",
                   kl__escape(shown, sizeof(shown), id, id_len),
                   (int)txn->src_partition, txn->src_topic);
  if (!err && KL__MUTANT(KL__MUTANT_TIMER_CANCEL)) /* test only: mutant.h */
    return KL_OK;
  if (!err)
    err = kl__timer_del(txn, txn->src_topic, txn->src_partition, key, key_len,
                        id, id_len, t.due_ms);
  /* Its copies stay duplicates for a retention from now, no longer
   * (KL__MARK_CANCELLED); an id settled otherwise keeps its mark. */
  return err || mark != KL__MARK_TIMER
             ? err
             : kl__txn_mark_sid(txn, sid, sid_len, KL__MARK_CANCELLED);
}

/* kl__mark_merge() on a buffer's tags (KL_MARK_NONE is 0: no entry). */
static int buf_mark_merge(int have, int mark) {
  return (int)kl__mark_merge((kl_mark_t)have, (kl_mark_t)mark);
}

kl_err_t kl__store_buf_mark(kl__buf_t *ids, const void *key, size_t key_len,
                            kl_mark_t mark) {
  if (kl__buf_retag(ids, key, key_len, buf_mark_merge, (int)mark))
    return kl__err(KL_ENOMEM, "kl_txn_mark: out of memory");
  return KL_OK;
}

struct pg_conn *kl_txn_pg_conn(kl_txn_t *txn) {
  kl__err_clear();
  if (!txn) {
    kl__err(KL_EINVAL, "kl_txn_pg_conn: txn is required");
    return NULL;
  }
  if (!txn->store->ops->pg_conn) {
    kl__err(KL_EINVAL,
            "kl_txn_pg_conn: the store is %s, which has no SQL connection: "
            "open a postgresql://... store for a handler that runs SQL",
            txn->store->ops->name);
    return NULL;
  }
  return txn->store->ops->pg_conn(txn); /* its NULL says why */
}

kl_err_t kl__store_savepoint(kl_txn_t *txn, kl__savepoint_t what) {
  return txn && txn->store->ops->savepoint
             ? txn->store->ops->savepoint(txn, what)
             : KL_OK;
}

kl_err_t kl__txn_prefetch_sids(kl_txn_t *txn, const char *const *sids,
                               const size_t *sid_lens, size_t n) {
  return n && txn->store->ops->prefetch
             ? txn->store->ops->prefetch(txn, sids, sid_lens, n)
             : KL_OK;
}

void kl__sids_free(kl__sids_t *s) {
  free(s->arena);
  free(s->sids);
  free(s->lens);
  memset(s, 0, sizeof(*s));
}

kl_err_t kl__sids_build(kl__sids_t *s, const kl_store_t *store,
                        const void *const *keys, const size_t *key_lens,
                        const char *const *ids, const size_t *id_lens,
                        size_t n) {
  int legacy = kl__store_legacy_ids(store);
  size_t bytes = 0;
  memset(s, 0, sizeof(*s));
  for (size_t i = 0; i < n; i++)
    bytes += 3 + key_lens[i] + (legacy ? 2 : 1) * id_lens[i];
  size_t cap = legacy ? 2 * n : n;
  s->arena = malloc(bytes ? bytes : 1);
  s->sids = malloc((cap ? cap : 1) * sizeof(*s->sids));
  s->lens = malloc((cap ? cap : 1) * sizeof(*s->lens));
  if (!s->arena || !s->sids || !s->lens) {
    kl__sids_free(s);
    return kl__err(KL_ENOMEM, "kl_txn_prefetch: out of memory");
  }
  char *at = s->arena;
  for (size_t i = 0; i < n; i++) {
    s->sids[s->n] = at;
    s->lens[s->n] =
        kl__sid_encode(keys[i], key_lens[i], ids[i], id_lens[i], at);
    at += s->lens[s->n++];
    if (legacy) { /* kl__txn_seen_sid() may ask for the unscoped id too */
      s->sids[s->n] = memcpy(at, ids[i], id_lens[i]);
      s->lens[s->n++] = id_lens[i];
      at += id_lens[i];
    }
  }
  return KL_OK;
}

kl_err_t kl_txn_prefetch(kl_txn_t *txn, const void *const *keys,
                         const size_t *key_lens, const char *const *ids,
                         const size_t *id_lens, size_t n) {
  kl__err_clear();
  if (!txn || (n && (!keys || !key_lens || !ids || !id_lens)))
    return kl__err(KL_EINVAL, "kl_txn_prefetch: txn, keys, key_lens, "
                              "ids and id_lens are required");
  for (size_t i = 0; i < n; i++) {
    kl_err_t err = store_check_entity("kl_txn_prefetch", keys[i], key_lens[i]);
    if (!err)
      err = store_check_id("kl_txn_prefetch", ids[i], id_lens[i]);
    if (err)
      return err;
  }
  if (!n || !txn->store->ops->prefetch)
    return KL_OK;
  kl__sids_t s;
  kl_err_t err =
      kl__sids_build(&s, txn->store, keys, key_lens, ids, id_lens, n);
  if (!err)
    err = kl__txn_prefetch_sids(txn, (const char *const *)s.sids, s.lens, s.n);
  kl__sids_free(&s);
  return err;
}

kl_err_t kl__txn_set_last(kl_txn_t *txn, const void *ident, size_t len) {
  if (!txn || !ident || len == 0 || len > KL__SID_MAX)
    return kl__err(KL_EINVAL,
                   "kl__txn_set_last: an ident of 1..%d bytes is "
                   "required",
                   KL__SID_MAX);
  /* Room for any ident, kept while the txn is recycled: one malloc per
   * txn, not per batch. */
  if (!txn->last && !(txn->last = malloc(KL__SID_MAX)))
    return kl__err(KL_ENOMEM, "kl__txn_set_last: out of memory");
  memcpy(txn->last, ident, len);
  txn->last_len = len;
  return KL_OK;
}

void kl__txn_recycle(kl_txn_t *txn) {
  kl__emits_free(txn->emits);
  *txn = (kl_txn_t){.store = txn->store, .last = txn->last};
}

/* The slots are taken and given by exchange, never by a read and a write,
 * so that a txn is in one slot or with one thread, and no lock is needed. */
kl_txn_t *kl__store_spare_take(kl_store_t *store) {
  for (size_t i = 0; i < KL__STORE_SPARES; i++)
    if (atomic_load_explicit(&store->spares[i], memory_order_relaxed)) {
      kl_txn_t *txn = atomic_exchange(&store->spares[i], NULL);
      if (txn)
        return txn;
    }
  return NULL;
}

void kl__store_spare_give(kl_store_t *store, kl_txn_t *txn,
                          kl__store_spare_drop_t *drop) {
#ifdef __SANITIZE_ADDRESS__
  /* Under AddressSanitizer a txn used after it ended must be caught as a
   * use after free, not find a reused one: nothing is kept. */
  (void)store;
  drop(txn);
  return;
#endif
  atomic_store(&store->spare_drop, drop);
  for (size_t i = 0; i < KL__STORE_SPARES; i++) {
    kl_txn_t *none = NULL;
    if (atomic_compare_exchange_strong(&store->spares[i], &none, txn))
      return;
  }
  drop(txn);
}

kl_err_t kl__store_last(kl_store_t *store, const char *topic, int32_t partition,
                        int64_t *watermark, void *ident, size_t *len) {
  kl_err_t err = kl__store_check_tp("kl__store_last", topic, partition);
  *watermark = 0;
  *len = 0;
  if (err || !store->ops->last)
    return err;
  return store->ops->last(store, topic, partition, watermark, ident, len);
}

kl_err_t kl__store_begin_check(kl_store_t *store, const char *topic,
                               kl_txn_t **txn) {
  kl__err_clear();
  kl_err_t err = kl__store_check_tp("kl__store_begin_check", topic, 0);
  for (int tries = 0; !err && tries < 3; tries++) {
    kl_partition_state_t ps;
    if ((err = store->ops->partition(store, topic, 0, &ps)) ||
        (err = store->ops->begin(store, topic, 0, ps.epoch, txn)) != KL_EFENCED)
      break;
  }
  return err;
}

int64_t kl__store_idle_ms(const kl_store_t *store) {
  return store && store->ops->idle_ms ? store->ops->idle_ms(store) : 0;
}

int kl__store_has_prefetch(kl_store_t *store) {
  return store && store->ops->prefetch != NULL;
}

kl_err_t kl__store_begin_ahead(kl_store_t *store, const char *topic,
                               int32_t partition, uint64_t epoch,
                               const char *const *ids, const size_t *id_lens,
                               size_t n, kl_txn_t **txn) {
  kl_err_t err = kl__store_check_tp("kl__store_begin_ahead", topic, partition);
  if (err)
    return err;
  if (!store->ops->begin_ahead)
    return kl__err(KL_EINVAL,
                   "kl__store_begin_ahead: the %s store does not begin "
                   "ahead (its reads cost no round trip): use "
                   "kl_store_begin()",
                   store->ops->name);
  return store->ops->begin_ahead(store, topic, partition, epoch, ids, id_lens,
                                 n, txn);
}

kl_err_t kl__store_settle(kl_txn_t *txn) {
  return txn && txn->store->ops->settle ? txn->store->ops->settle(txn) : KL_OK;
}

int kl__store_pending(kl_txn_t *txn) {
  return txn && txn->store->ops->pending && txn->store->ops->pending(txn);
}

const char *kl__store_layout(kl_store_t *store) {
  return store->ops->layout ? store->ops->layout : "format";
}

kl_err_t kl__store_missing(kl_store_t *store, char *missing, size_t size) {
  if (size)
    missing[0] = '\0';
  return store->ops->missing ? store->ops->missing(store, missing, size)
                             : KL_OK;
}

kl_err_t kl__store_server_clock(kl_store_t *store, int64_t *server_ms,
                                int64_t *before_ms, int64_t *after_ms) {
  if (!store->ops->server_clock)
    return kl__err(KL_ENOTFOUND,
                   "the %s store keeps no clock of its own: it stamps "
                   "idempotency keys with this host's",
                   store->ops->name);
  return store->ops->server_clock(store, server_ms, before_ms, after_ms);
}

int kl__txn_lost(kl_txn_t *txn) {
  return txn && txn->store->ops->lost && txn->store->ops->lost(txn);
}

size_t kl__store_txn_max(kl_store_t *store) {
  return store && store->ops->txn_max ? store->ops->txn_max(store) : 0;
}

void kl__store_forget(kl_store_t *store, const char *topic, int32_t partition) {
  if (store && topic && store->ops->forget)
    store->ops->forget(store, topic, partition);
}

void kl__store_cache_stats(kl_store_t *store, kl__cache_stats_t *stats) {
  memset(stats, 0, sizeof(*stats));
  if (store && store->ops->cache_stats)
    store->ops->cache_stats(store, stats);
}

void kl_txn_count_duplicate(kl_txn_t *txn) {
  if (txn)
    txn->store->ops->count_duplicate(txn);
}

kl_err_t kl__store_sweep_topic(kl_store_t *store, const char *topic, size_t max,
                               size_t *removed) {
  size_t dummy;
  kl_err_t err = kl__store_check_tp("kl__store_sweep_topic", topic, 0);
  if (removed)
    *removed = 0;
  if (err || !store)
    return err ? err
               : kl__err(KL_EINVAL, "kl__store_sweep_topic: store is "
                                    "required");
  return store->ops->sweep(store, topic, max, removed ? removed : &dummy);
}

kl_err_t kl_store_sweep(kl_store_t *store, size_t max, size_t *removed) {
  kl__err_clear();
  char topic[KL__TOPIC_MAX + 1];
  if (removed)
    *removed = 0;
  if (!store)
    return kl__err(KL_EINVAL, "kl_store_sweep: store is required");
  if (sweep_topic_next(store, topic))
    return KL_OK; /* no topic's ids are this handle's to judge */
  return kl__store_sweep_topic(store, topic, max, removed);
}

kl_err_t kl__store_sweeps(kl_store_t *store, kl__store_sweep_cb_t *cb,
                          void *opaque) {
  if (!store || !cb)
    return kl__err(KL_EINVAL, "kl__store_sweeps: store and cb are required");
  return store->ops->sweeps(store, cb, opaque);
}

kl_err_t kl_store_scan(kl_store_t *store, const void *prefix, size_t prefix_len,
                       kl_store_scan_cb_t *cb, void *opaque) {
  kl__err_clear();
  if (!store || !cb || (!prefix && prefix_len))
    return kl__err(KL_EINVAL, "kl_store_scan: store and cb are required");
  return store->ops->scan(store, prefix, prefix_len, cb, opaque);
}

kl_err_t kl_store_foreach_partition(kl_store_t *store,
                                    kl_store_partition_cb_t *cb, void *opaque) {
  kl__err_clear();
  if (!store || !cb)
    return kl__err(KL_EINVAL, "kl_store_foreach_partition: store and cb are "
                              "required");
  return store->ops->foreach_partition(store, cb, opaque);
}

kl_err_t kl_store_id_count(kl_store_t *store, uint64_t *count) {
  kl__err_clear();
  if (!store || !count)
    return kl__err(KL_EINVAL, "kl_store_id_count: store and count are "
                              "required");
  return store->ops->id_count(store, count);
}

typedef struct kl_ids_walk {
  kl__store_id_cb_t *cb;
  void *opaque;
  int bad; /* a sid that does not decode */
} kl_ids_walk_t;

static int ids_walk_sid(void *opaque, const char *topic, const char *sid,
                        size_t sid_len, int64_t time_ms, kl_mark_t mark) {
  kl_ids_walk_t *w = opaque;
  const void *key;
  const char *id;
  size_t key_len, id_len;
  if (kl__sid_decode(sid, sid_len, &key, &key_len, &id, &id_len))
    return w->bad = 1;
  return w->cb(w->opaque, topic, key, key_len, id, id_len, time_ms, mark);
}

kl_err_t kl__store_ids_walk(kl_store_t *store, kl__store_id_cb_t *cb,
                            void *opaque) {
  if (!store || !cb)
    return kl__err(KL_EINVAL, "kl__store_ids_walk: store and cb are required");
  if (!store->ops->ids_walk)
    return kl__err(KL_EINVAL,
                   "the %s store cannot list its idempotency keys "
                   "in this build",
                   store->ops->name);
  kl_ids_walk_t w = {cb, opaque, 0};
  kl_err_t err = store->ops->ids_walk(store, ids_walk_sid, &w);
  if (!err && w.bad)
    err = kl__err(KL_ESTORE,
                  "the %s store holds an idempotency key that does not "
                  "decode: the store is damaged or was written by another "
                  "program",
                  store->ops->name);
  return err;
}

kl_err_t kl__store_version(kl_store_t *store, int *version, int *latest) {
  if (!store || !version || !latest)
    return kl__err(KL_EINVAL, "kl__store_version: store, version and latest "
                              "are required");
  return store->ops->version(store, version, latest);
}

/* ---- the store's clock ----------------------------------------------- */

static int64_t (*_Atomic kl_store_clock)(void);

void kl__store_set_clock(int64_t (*now_ms)(void)) {
  atomic_store(&kl_store_clock, now_ms);
}

int64_t kl__store_now_ms(void) {
  int64_t (*now_ms)(void) = atomic_load(&kl_store_clock);
  return now_ms ? now_ms() : kl__now_ms();
}

int64_t kl__store_test_clock_ms(void) {
  int64_t (*now_ms)(void) = atomic_load(&kl_store_clock);
  return now_ms ? now_ms() : 0;
}
