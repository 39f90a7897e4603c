/* Timers in the store's key space: store/timers.h. */
#include "store/timers.h"

#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/hash.h"
#include "common/internal.h"
#include "store/backend.h"
#include "store/store_internal.h"

/* "~t"/"~d", the topic and its NUL, the partition: @returns the length. */
static size_t timer_prefix(unsigned char *out, char kind, const char *topic,
                           int32_t partition) {
  size_t tl = strlen(topic) + 1;
  out[0] = KL__STORE_OWN;
  out[1] = (unsigned char)kind;
  memcpy(out + 2, topic, tl);
  kl__put_be32(out + 2 + tl, (uint32_t)partition);
  return 2 + tl + 4;
}

static uint64_t timer_hash(const void *key, size_t key_len, const char *id,
                           size_t id_len) {
  unsigned char len[2];
  kl__put_be(len, key_len, 2);
  return kl__fnv1a_more(kl__fnv1a_more(kl__fnv1a(len, 2), key, key_len), id,
                        id_len);
}

static size_t main_key(unsigned char *out, const char *topic, int32_t partition,
                       uint64_t h) {
  size_t n = timer_prefix(out, 't', topic, partition);
  kl__put_be(out + n, h, 8);
  return n + 8;
}

static size_t due_key(unsigned char *out, const char *topic, int32_t partition,
                      int64_t due_ms, uint64_t h) {
  size_t n = timer_prefix(out, 'd', topic, partition);
  kl__put_be(out + n, (uint64_t)due_ms, 8);
  kl__put_be(out + n + 8, h, 8);
  return n + 16;
}

/* A main record: due, offset, key length, key, id. */
#define KL_MAIN_HEAD 18

static int main_matches(const unsigned char *v, size_t len, const void *key,
                        size_t key_len, const char *id, size_t id_len) {
  return len >= KL_MAIN_HEAD && kl__get_be(v + 16, 2) == key_len &&
         len == KL_MAIN_HEAD + key_len + id_len &&
         memcmp(v + KL_MAIN_HEAD, key, key_len) == 0 &&
         memcmp(v + KL_MAIN_HEAD + key_len, id, id_len) == 0;
}

kl_err_t kl__timer_get(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, kl__timer_t *t) {
  unsigned char k[KL__TIMER_KEY_MAX];
  size_t kn =
      main_key(k, topic, partition, timer_hash(key, key_len, id, id_len));
  const void *v;
  size_t vn;
  kl_err_t err = kl_txn_get(txn, k, kn, &v, &vn);
  if (err)
    return err;
  if (!main_matches(v, vn, key, key_len, id, id_len))
    return KL_ENOTFOUND; /* another event's, in the same slot */
  t->due_ms = (int64_t)kl__get_be(v, 8);
  t->offset = (int64_t)kl__get_be((const unsigned char *)v + 8, 8);
  t->h = 0;
  return KL_OK;
}

kl_err_t kl__timer_put(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, const kl__timer_t *t, const void *env,
                       size_t env_len) {
  uint64_t h = timer_hash(key, key_len, id, id_len);
  unsigned char k[KL__TIMER_KEY_MAX];
  size_t kn = main_key(k, topic, partition, h);
  const void *v;
  size_t vn;
  kl_err_t err = kl_txn_get(txn, k, kn, &v, &vn);
  if (err != KL_ENOTFOUND)
    return err ? err
               : kl__err(KL_EINVAL,
                         "the timer slot of this key and id holds another "
                         "event's timer (their 64-bit hashes are equal): "
                         "publish it with another id");
  size_t mn = KL_MAIN_HEAD + key_len + id_len;
  size_t dn = 10 + key_len + env_len;
  unsigned char *buf = malloc(mn > dn ? mn : dn);
  if (!buf)
    return kl__err(KL_ENOMEM, "a timer: out of memory");
  kl__put_be(buf, (uint64_t)t->due_ms, 8);
  kl__put_be(buf + 8, (uint64_t)t->offset, 8);
  kl__put_be(buf + 16, key_len, 2);
  memcpy(buf + KL_MAIN_HEAD, key, key_len);
  memcpy(buf + KL_MAIN_HEAD + key_len, id, id_len);
  err = kl__txn_kv_put(txn, k, kn, buf, mn);
  if (!err) {
    kl__put_be(buf, (uint64_t)t->offset, 8);
    kl__put_be(buf + 8, key_len, 2);
    memcpy(buf + 10, key, key_len);
    if (env_len)
      memcpy(buf + 10 + key_len, env, env_len);
    kn = due_key(k, topic, partition, t->due_ms, h);
    err = kl__txn_kv_put(txn, k, kn, buf, dn);
  }
  free(buf);
  if (err)
    return err;
  txn->timers++;
  char sid[KL__SID_MAX];
  return kl__txn_mark_sid(
      txn, sid, kl__sid_encode(key, key_len, id, id_len, sid), KL__MARK_TIMER);
}

kl_err_t kl__timer_find(kl_txn_t *txn, const char *topic, int32_t partition,
                        const void *key, size_t key_len, const char *id,
                        size_t id_len, int64_t named, int64_t due_ms,
                        const void *env, size_t env_len, kl__timer_t *t,
                        int *same) {
  *same = 0;
  if (named >= 0 && due_ms > 0) {
    uint64_t h = timer_hash(key, key_len, id, id_len);
    unsigned char k[KL__TIMER_KEY_MAX];
    const void *v;
    size_t vn;
    kl_err_t err =
        kl_txn_get(txn, k, due_key(k, topic, partition, due_ms, h), &v, &vn);
    if (err && err != KL_ENOTFOUND)
      return err;
    const unsigned char *d = v;
    size_t at = 10 + key_len; /* offset, key length, key, then the envelope */
    /* The envelope holds the id: equal to it, the row is this key's and
     * id's timer, not another's of the same h. */
    if (!err && vn == at + env_len && (int64_t)kl__get_be(d, 8) == named &&
        kl__get_be(d + 8, 2) == key_len && memcmp(d + 10, key, key_len) == 0 &&
        (!env_len || memcmp(d + at, env, env_len) == 0)) {
      *t = (kl__timer_t){due_ms, named, h};
      *same = 1;
      return KL_OK;
    }
  }
  /* Not the event a timer holds (a copy, a first reading): the main row
   * says whether one waits. */
  return kl__timer_get(txn, topic, partition, key, key_len, id, id_len, t);
}

kl_err_t kl__timer_del(kl_txn_t *txn, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const char *id,
                       size_t id_len, int64_t due_ms) {
  uint64_t h = timer_hash(key, key_len, id, id_len);
  unsigned char k[KL__TIMER_KEY_MAX];
  kl_err_t err = kl__txn_kv_del(txn, k, main_key(k, topic, partition, h));
  if (!err &&
      !(err = kl__txn_kv_del(txn, k, due_key(k, topic, partition, due_ms, h))))
    txn->timers--;
  return err;
}

typedef struct kl_timer_scan {
  size_t prefix_len; /* of the "~d" keys: before the partition, or after */
  int all;           /* every partition's */
  kl__timer_cb_t *cb;
  void *opaque;
  size_t *bad;
} kl_timer_scan_t;

static int timer_scan_one(void *opaque, const void *key, size_t key_len,
                          const void *val, size_t val_len) {
  kl_timer_scan_t *s = opaque;
  const unsigned char *k = key, *v = val;
  size_t at = s->prefix_len + (s->all ? 4 : 0); /* where due begins */
  size_t klen = val_len >= 10 ? (size_t)kl__get_be(v + 8, 2) : 0;
  if (key_len != at + 16 || val_len < 10 || klen == 0 || val_len < 10 + klen) {
    if (s->bad)
      (*s->bad)++;
    return 0;
  }
  kl__timer_t t = {(int64_t)kl__get_be(k + at, 8), (int64_t)kl__get_be(v, 8),
                   kl__get_be(k + at + 8, 8)};
  return s->cb(s->opaque, &t, v + 10, klen, v + 10 + klen, val_len - 10 - klen);
}

kl_err_t kl__timers_scan(kl_store_t *store, const char *topic,
                         int32_t partition, kl__timer_cb_t *cb, void *opaque,
                         size_t *bad) {
  unsigned char p[KL__TIMER_KEY_MAX];
  size_t pn = timer_prefix(p, 'd', topic, partition < 0 ? 0 : partition);
  kl_timer_scan_t s = {partition < 0 ? pn - 4 : pn, partition < 0, cb, opaque,
                       bad};
  return kl_store_scan(store, p, s.prefix_len, timer_scan_one, &s);
}

static int timer_count_one(void *opaque, const void *key, size_t key_len,
                           const void *val, size_t val_len) {
  (void)key, (void)key_len, (void)val, (void)val_len;
  (*(uint64_t *)opaque)++;
  return 0;
}

kl_err_t kl__timers_count(kl_store_t *store, const char *topic,
                          int32_t partition, uint64_t *n) {
  unsigned char p[KL__TIMER_KEY_MAX];
  *n = 0;
  return kl_store_scan(store, p, timer_prefix(p, 'd', topic, partition),
                       timer_count_one, n);
}
