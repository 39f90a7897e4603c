/*
 * libFuzzer target for the idempotency keys as the stores keep them and the
 * ids of follow-ups (store/store_internal.h, store/lmdb_ids.c,
 * event/emit_id.h). The first byte picks what the rest is:
 * - 0: a stored sid, as read back from a store: kl__sid_decode() either
 *   refuses it or splits it into parts that encode back to the same bytes;
 * - 1: a key and an id (split at the first 0xff byte): their sid decodes to
 *   them, and LMDB's record of it (kl__lmdb_id_encode(), with the value a
 *   long sid keeps) decodes back to the same sid, whatever the lengths;
 * - 2: an id: kl__emit_id_parse() refuses all but the ids kl__emit_id()
 *   makes (with a nonce or of the first form), and what it accepts it
 *   makes again byte for byte; nothing that does not begin with '~' (an
 *   id a client may publish) is a follow-up's; and the worker's rule on
 *   consumed ids (kl__id_check()) takes a '~' id exactly when it is one.
 * - 0xfe: a key as an LMDB store holds it (check_lmdb_key()).
 */
#include <stdint.h>
#include <string.h>

#include "event/envelope.h"
#include "store/lmdb.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "tests/fuzz/fuzz.h"

static void check_stored(const uint8_t *s, size_t n) {
  const void *key;
  const char *id;
  size_t key_len, id_len;
  if (kl__sid_decode((const char *)s, n, &key, &key_len, &id, &id_len))
    return;
  CHECK(id_len >= 1 && id_len <= KL_ID_MAX);
  if (!key) {
    CHECK(s[0] != 0 && id == (const char *)s && id_len == n);
    return;
  }
  CHECK(key_len >= 1 && key_len <= KL_KEY_MAX);
  char again[KL__SID_MAX];
  size_t len = kl__sid_encode(key, key_len, id, id_len, again);
  CHECK(len == n && memcmp(again, s, n) == 0);
}

static void check_lmdb(const char *sid, size_t len) {
  unsigned char lkey[KL__IDKEY_MAX], val[KL__IDVAL_LEN + KL__SID_MAX];
  size_t klen = kl__lmdb_id_encode(7, sid, len, lkey);
  CHECK(klen > KL__TOPIC_NO_LEN && klen <= KL__IDKEY_MAX);
  kl__lmdb_idval_encode(1700000000000LL, KL_MARK_APPLIED, val);
  MDB_val k = {klen, lkey}, v = {KL__IDVAL_LEN, val};
  if (lkey[KL__TOPIC_NO_LEN] == 4) { /* long: the value holds the sid */
    memcpy(val + KL__IDVAL_LEN, sid, len);
    v.mv_size += len;
  } else {
    CHECK(klen <= 511); /* LMDB's key limit */
  }
  char back[KL__SID_MAX];
  size_t back_len;
  uint32_t topic_no;
  CHECK(kl__lmdb_id_decode(&k, &v, &topic_no, back, &back_len) == 0);
  CHECK(topic_no == 7 && back_len == len && memcmp(back, sid, len) == 0);
}

/* A key as a store holds it, whatever its bytes: decoded or refused, and a
 * format-5 key moved to format 6 (kl__lmdb_id_upgrade()) decodes to the
 * same topic and sid. */
static void check_lmdb_key(const uint8_t *s, size_t n) {
  unsigned char val[KL__IDVAL_LEN] = {0}, up[KL__IDKEY_MAX];
  MDB_val k = {n, (void *)s}, v = {sizeof(val), val};
  char sid[KL__SID_MAX], back[KL__SID_MAX];
  size_t len, back_len;
  uint32_t no, back_no;
  if (n > 511) /* LMDB's longest key: a store holds none longer */
    return;
  int ok = kl__lmdb_id_decode(&k, &v, &no, sid, &len) == 0;
  size_t up_len = kl__lmdb_id_upgrade(&k, up);
  if (!ok || up_len == 0)
    return;
  MDB_val u = {up_len, up};
  CHECK(kl__lmdb_id_decode(&u, &v, &back_no, back, &back_len) == 0);
  CHECK(back_no == no && back_len == len && memcmp(back, sid, len) == 0);
}

static void check_key_and_id(const uint8_t *s, size_t n) {
  const uint8_t *cut = memchr(s, 0xff, n);
  if (!cut)
    return;
  size_t key_len = (size_t)(cut - s), id_len = n - key_len - 1;
  const char *id = (const char *)cut + 1;
  if (key_len < 1 || key_len > KL_KEY_MAX || id_len < 1 || id_len > KL_ID_MAX ||
      memchr(id, 0, id_len))
    return;
  char sid[KL__SID_MAX];
  size_t len = kl__sid_encode(s, key_len, id, id_len, sid);
  const void *k;
  const char *i;
  size_t kl, il;
  CHECK(kl__sid_decode(sid, len, &k, &kl, &i, &il) == 0);
  CHECK(kl == key_len && il == id_len && memcmp(k, s, kl) == 0 &&
        memcmp(i, id, il) == 0);
  check_lmdb(sid, len);
  if (id[0] != 0) /* the unscoped id too, as older stores keep it */
    check_lmdb(id, id_len);
}

static void check_emit_id(const uint8_t *s, size_t n) {
  kl__emit_src_t src;
  int parsed = kl__emit_id_parse((const char *)s, n, &src) == 0;
  if (n > 0 && s[0] == KL_ID_RESERVED) {
    CHECK((kl__id_check((const char *)s, n, 1) == KL_OK) == parsed);
    CHECK(kl__id_check((const char *)s, n, 0) != KL_OK);
  }
  if (!parsed)
    return;
  CHECK(n > 0 && s[0] == KL_ID_RESERVED);
  char again[KL_ID_MAX + 1];
  size_t len = kl__emit_id(&src, again);
  CHECK(len == n && memcmp(again, s, n) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const uint8_t *s = data + 1;
  size_t n = size - 1;
  if (data[0] == 0xfe) { /* apart: the kept inputs keep their meaning */
    check_lmdb_key(s, n);
    return 0;
  }
  switch (data[0] % 3) {
  case 0:
    check_stored(s, n);
    break;
  case 1:
    check_key_and_id(s, n);
    break;
  default:
    check_emit_id(s, n);
  }
  return 0;
}
