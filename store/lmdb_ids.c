/*
 * The LMDB store's idempotency keys: how an id (a sid, store_internal.h)
 * becomes a key of KL__LMDB_IDS_DB, and the reads and writes of one.
 *
 * A key is the topic's number (4 bytes, big-endian), a tag byte, then:
 *   0  an unscoped id, raw                       (format 2's ids)
 *   1  an unscoped canonical lowercase UUID, packed into 16 bytes
 *   2  the entity key's length (2 bytes), the key, the id raw
 *   3  the same, with the id a UUID packed into 16 bytes: formats 3 to 5
 *      only; format 6 writes tag 5 instead (lmdb_migrate.c moves them)
 *   4  a sid too long for LMDB's 511-byte keys (a long entity key and a
 *      long id): its first KL_LONG_PREFIX bytes, the FNV-1a of all of it
 *      (8 bytes) and a number (2 bytes) that tells apart sids sharing the
 *      two; the value holds the whole sid after the time and mark, and a
 *      lookup compares it, so two such sids never share a record.
 *   5  a UUID packed into 16 bytes, then the entity key's length (2
 *      bytes) and the key.
 * Tag 5 puts the UUID first because kl_publish()'s ids are UUIDv7, whose
 * first 48 bits are the time: a batch's new ids then sort together at the
 * end of the topic's range and a commit rewrites a few leaf pages, where
 * tag 3 put each at its entity key's place, one leaf page per key the
 * batch touched (a commit of 2,300 events over 1,000 keys wrote about 4 MB
 * with tag 3, 1 MB with tag 5: keylane-bench worker --breakdown under
 * strace, 2026-12-07).
 * The value is 6 bytes: insert ms << 2 | mark's low 2 bits, and its third
 * bit (KL__MARK_CANCELLED) as the value's top bit, which a time before
 * the year 3085 leaves 0 (then the sid, for tag 4).
 * A stored UUID takes 50-70 bytes on disk instead of ~110.
 *
 * A batch buffers its marks by "logical" key: the LMDB key for tags 0-3,
 * and for tag 4 the topic's number, the tag and the whole sid, which the
 * lookups and the commit turn into the records above.
 */
#include <string.h>

#include "common/bytes.h"
#include "common/hash.h"
#include "event/uuid.h"
#include "store/lmdb.h"

#define KL_LMDB_KEY_MAX 511 /* mdb_env_get_maxkeysize() of Debian's LMDB */
#define KL_LONG_PREFIX 480
#define KL_LONG_HEAD (KL__TOPIC_NO_LEN + 1 + KL_LONG_PREFIX + 8)

enum {
  KL_RAW = 0,
  KL_UUID = 1,
  KL_KEY_RAW = 2,
  KL_KEY_UUID = 3,
  KL_LONG = 4,
  KL_UUID_KEY = 5
};

/* The id, packed when it is a UUID, at @p out: @returns its length. */
static size_t id_put(const char *id, size_t id_len, unsigned char *tag,
                     int raw_tag, unsigned char *out) {
  if (kl__uuid_parse(id, id_len, out) == 0) {
    *tag = (unsigned char)(raw_tag + 1);
    return 16;
  }
  *tag = (unsigned char)raw_tag;
  memcpy(out, id, id_len);
  return id_len;
}

size_t kl__lmdb_id_encode(uint32_t topic_no, const char *sid, size_t sid_len,
                          unsigned char out[KL__IDKEY_MAX]) {
  kl__put_be32(out, topic_no);
  unsigned char *tag = out + KL__TOPIC_NO_LEN;
  const void *key;
  const char *id;
  size_t key_len, id_len;
  if (kl__sid_decode(sid, sid_len, &key, &key_len, &id, &id_len) != 0 ||
      !key) /* unscoped (store.c checked the sid it encoded) */
    return KL__TOPIC_NO_LEN + 1 + id_put(sid, sid_len, tag, KL_RAW, tag + 1);
  if (KL__TOPIC_NO_LEN + 3 + key_len + id_len > KL_LMDB_KEY_MAX) {
    *tag = KL_LONG;
    memcpy(tag + 1, sid, sid_len);
    return KL__TOPIC_NO_LEN + 1 + sid_len;
  }
  if (kl__uuid_parse(id, id_len, tag + 1) == 0) {
    *tag = KL_UUID_KEY;
    memcpy(tag + 1 + 16, (const char *)sid + 1, 2 + key_len);
    return KL__TOPIC_NO_LEN + 1 + 16 + 2 + key_len;
  }
  *tag = KL_KEY_RAW;
  memcpy(tag + 1, (const char *)sid + 1, 2 + key_len);
  memcpy(tag + 3 + key_len, id, id_len);
  return KL__TOPIC_NO_LEN + 3 + key_len + id_len;
}

size_t kl__lmdb_id_upgrade(const MDB_val *key,
                           unsigned char out[KL__IDKEY_MAX]) {
  const unsigned char *k = key->mv_data;
  size_t n = key->mv_size, head = KL__TOPIC_NO_LEN + 1;
  if (n <= head || n > KL__IDKEY_MAX)
    return 0;
  memcpy(out, k, n);
  if (k[KL__TOPIC_NO_LEN] != KL_KEY_UUID)
    return n;
  if (n != head + 2 + 16 + (n < head + 2 ? 0 : kl__get_be(k + head, 2)))
    return 0;
  size_t key_len = n - head - 2 - 16;
  out[KL__TOPIC_NO_LEN] = KL_UUID_KEY;
  memcpy(out + head, k + head + 2 + key_len, 16);
  memcpy(out + head + 16, k + head, 2 + key_len);
  return n;
}

void kl__lmdb_idval_encode(int64_t now_ms, kl_mark_t mark,
                           unsigned char out[KL__IDVAL_LEN]) {
  /* 45 bits of ms reach the year 3085. */
  uint64_t t = now_ms < 0 ? 0 : (uint64_t)now_ms & ((1ULL << 45) - 1);
  uint64_t v = t << 2 | ((uint64_t)mark & 3) | ((uint64_t)mark >> 2 & 1) << 47;
  for (int i = 0; i < KL__IDVAL_LEN; i++)
    out[i] = (unsigned char)(v >> (8 * i));
}

int kl__lmdb_idval_decode(const MDB_val *val, int64_t *time_ms,
                          kl_mark_t *mark) {
  if (val->mv_size < KL__IDVAL_LEN)
    return -1;
  const unsigned char *p = val->mv_data;
  uint64_t v = 0;
  for (int i = KL__IDVAL_LEN - 1; i >= 0; i--)
    v = v << 8 | p[i];
  *time_ms = (int64_t)(v >> 2 & ((1ULL << 45) - 1));
  *mark = (kl_mark_t)((v & 3) | (v >> 47 & 1) << 2);
  return 0;
}

int kl__lmdb_id_decode(const MDB_val *key, const MDB_val *val,
                       uint32_t *topic_no, char out[KL__SID_MAX], size_t *len) {
  const unsigned char *k = key->mv_data;
  if (key->mv_size < KL__TOPIC_NO_LEN + 2)
    return MDB_CORRUPTED;
  *topic_no = kl__get_be32(k);
  const unsigned char *p = k + KL__TOPIC_NO_LEN + 1;
  size_t n = key->mv_size - KL__TOPIC_NO_LEN - 1, key_len = 0, at = 0;
  switch (k[KL__TOPIC_NO_LEN]) {
  case KL_RAW:
  case KL_UUID:
    break;
  case KL_KEY_RAW:
  case KL_KEY_UUID:
    if (n < 3 || n < 3 + (key_len = (size_t)kl__get_be(p, 2)))
      return MDB_CORRUPTED;
    out[0] = 0;
    memcpy(out + 1, p, 2 + key_len);
    at = 3 + key_len, p += 2 + key_len, n -= 2 + key_len;
    break;
  case KL_UUID_KEY:
    if (n < 16 + 2 || n != 16 + 2 + (size_t)kl__get_be(p + 16, 2))
      return MDB_CORRUPTED;
    out[0] = 0;
    memcpy(out + 1, p + 16, n - 16);
    kl__uuid_format(p, out + 1 + (n - 16));
    *len = 1 + (n - 16) + 36;
    return 0;
  case KL_LONG:
    if (val->mv_size <= KL__IDVAL_LEN ||
        val->mv_size - KL__IDVAL_LEN > KL__SID_MAX)
      return MDB_CORRUPTED;
    *len = val->mv_size - KL__IDVAL_LEN;
    memcpy(out, (const unsigned char *)val->mv_data + KL__IDVAL_LEN, *len);
    return 0;
  default:
    return MDB_CORRUPTED;
  }
  if (k[KL__TOPIC_NO_LEN] == KL_UUID || k[KL__TOPIC_NO_LEN] == KL_KEY_UUID) {
    if (n != 16)
      return MDB_CORRUPTED;
    kl__uuid_format(p, out + at);
    *len = at + 36;
    return 0;
  }
  if (n == 0 || n > KL_ID_MAX)
    return MDB_CORRUPTED;
  memcpy(out + at, p, n);
  *len = at + n;
  return 0;
}

/* ---- the records of long sids (tag 4) ------------------------------- */

static int is_long(const unsigned char *lkey, size_t len) {
  return len > KL__TOPIC_NO_LEN && lkey[KL__TOPIC_NO_LEN] == KL_LONG;
}

/* The records' common head of the long sid in @p lkey. */
static void long_head(const unsigned char *lkey, size_t len,
                      unsigned char head[KL_LONG_HEAD]) {
  const unsigned char *sid = lkey + KL__TOPIC_NO_LEN + 1;
  size_t sid_len = len - KL__TOPIC_NO_LEN - 1;
  memcpy(head, lkey, KL__TOPIC_NO_LEN + 1 + KL_LONG_PREFIX);
  uint64_t h = kl__fnv1a(sid, sid_len);
  for (int i = 0; i < 8; i++)
    head[KL__TOPIC_NO_LEN + 1 + KL_LONG_PREFIX + i] =
        (unsigned char)(h >> (56 - 8 * i));
}

/* Finds the record of the long sid in @p lkey: 0 with @p key and @p val
 * set, or MDB_NOTFOUND with *@p next the number a new record takes (or
 * -1 when all are taken), or an LMDB rc. */
static int long_find(const kl__lmdb_t *lmdb, MDB_txn *mtxn,
                     const unsigned char *lkey, size_t len,
                     unsigned char rec[KL_LONG_HEAD + 2], MDB_val *val,
                     long *next) {
  const void *sid = lkey + KL__TOPIC_NO_LEN + 1;
  size_t sid_len = len - KL__TOPIC_NO_LEN - 1;
  MDB_cursor *cur;
  long want = 0;
  long_head(lkey, len, rec);
  rec[KL_LONG_HEAD] = rec[KL_LONG_HEAD + 1] = 0;
  MDB_val k = {KL_LONG_HEAD + 2, rec};
  int rc = mdb_cursor_open(mtxn, lmdb->ids, &cur);
  if (rc)
    return rc;
  for (rc = mdb_cursor_get(cur, &k, val, MDB_SET_RANGE); rc == 0;
       rc = mdb_cursor_get(cur, &k, val, MDB_NEXT)) {
    if (k.mv_size != KL_LONG_HEAD + 2 || memcmp(k.mv_data, rec, KL_LONG_HEAD))
      break;
    const unsigned char *at = k.mv_data;
    long no = (long)kl__get_be(at + KL_LONG_HEAD, 2);
    if (val->mv_size == KL__IDVAL_LEN + sid_len &&
        memcmp((const unsigned char *)val->mv_data + KL__IDVAL_LEN, sid,
               sid_len) == 0) {
      memcpy(rec, k.mv_data, KL_LONG_HEAD + 2);
      mdb_cursor_close(cur);
      return 0;
    }
    if (no == want) /* numbers are taken in order; a gap is reused */
      want = no + 1;
  }
  mdb_cursor_close(cur);
  if (rc != 0 && rc != MDB_NOTFOUND)
    return rc;
  *next = want > 0xffff ? -1 : want;
  kl__put_be(rec + KL_LONG_HEAD, (uint64_t)want, 2);
  return MDB_NOTFOUND;
}

int kl__lmdb_id_get(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                    const unsigned char *lkey, size_t len, int64_t *time_ms,
                    kl_mark_t *mark) {
  MDB_val val;
  int rc;
  if (is_long(lkey, len)) {
    unsigned char rec[KL_LONG_HEAD + 2];
    long next;
    rc = long_find(lmdb, mtxn, lkey, len, rec, &val, &next);
  } else {
    MDB_val k = {len, (void *)lkey};
    rc = cur ? mdb_cursor_get(cur, &k, &val, MDB_SET)
             : mdb_get(mtxn, lmdb->ids, &k, &val);
  }
  if (rc == 0 && kl__lmdb_idval_decode(&val, time_ms, mark))
    rc = MDB_CORRUPTED;
  return rc;
}

int kl__lmdb_id_put(kl__lmdb_t *lmdb, MDB_txn *mtxn, MDB_cursor *cur,
                    const unsigned char *lkey, size_t len, int64_t now_ms,
                    kl_mark_t mark, int *written) {
  unsigned char val[KL__IDVAL_LEN + KL__SID_MAX];
  unsigned char rec[KL_LONG_HEAD + 2];
  MDB_val k = {len, (void *)lkey}, v = {KL__IDVAL_LEN, val}, have;
  kl__lmdb_idval_encode(now_ms, mark, val);
  int rc, found;
  *written = 0;
  if (is_long(lkey, len)) {
    long next = 0;
    rc = long_find(lmdb, mtxn, lkey, len, rec, &have, &next);
    if (rc != 0 && rc != MDB_NOTFOUND)
      return rc;
    if (rc == MDB_NOTFOUND && next < 0)
      return MDB_KEYEXIST; /* 65536 sids of one prefix and hash */
    found = rc == 0;
    k = (MDB_val){sizeof(rec), rec};
    memcpy(val + KL__IDVAL_LEN, lkey + KL__TOPIC_NO_LEN + 1,
           len - KL__TOPIC_NO_LEN - 1);
    v.mv_size += len - KL__TOPIC_NO_LEN - 1;
  } else if (mark != KL_MARK_APPLIED) {
    rc = mdb_cursor_get(cur, &k, &have, MDB_SET);
    if (rc != 0 && rc != MDB_NOTFOUND)
      return rc;
    found = rc == 0;
  } else {
    found = 0; /* an applied mark replaces whatever is there */
  }
  kl_mark_t old = KL_MARK_NONE;
  if (found) {
    /* A dead-letter or timer mark never replaces an applied one
     * (kl__mark_merge()). */
    int64_t t;
    if (kl__lmdb_idval_decode(&have, &t, &old))
      return MDB_CORRUPTED;
    if (kl__mark_merge(old, mark) != mark)
      return 0;
  }
  /* The same mark again (a commit whose answer was lost, run again) is
   * written, its time refreshed, and not counted a second time; a dead
   * letter over a timer's mark is a new one. */
  *written = !found || old != mark;
  return mdb_cursor_put(cur, &k, &v, 0);
}
