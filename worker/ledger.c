/*
 * The built-in ledger handler, used by the demo and the tests.
 *
 * Events "credit" and "debit" carry the msgpack map {"amount": int,
 * "seq": int}. Per entity key the store holds "ledger/" KEY => balance,
 * last seq and order violations (three big-endian int64). An event whose
 * seq is not last seq + 1 is still applied, and counted as a violation:
 * with one writer per key and in-order application there must be none.
 *
 * An amount is positive (a debit subtracts it), and a balance never wraps:
 * an event that is not, or that would carry the balance past int64, FAILs
 * with the reason, so it is dead-lettered and the balance stays as it was.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "keylane/worker.h"
#include "worker/ledger.h"

static void kl_be64_put(unsigned char *p, int64_t v) {
  uint64_t u = (uint64_t)v;
  for (int i = 7; i >= 0; i--, u >>= 8)
    p[i] = (unsigned char)u;
}

static int64_t kl_be64_get(const unsigned char *p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; i++)
    u = u << 8 | p[i];
  return (int64_t)u;
}

int kl__ledger_decode(const void *val, size_t len, kl_ledger_entry_t *entry) {
  if (len != KL_LEDGER_VALUE_LEN)
    return -1;
  entry->balance = kl_be64_get(val);
  entry->last_seq = kl_be64_get((const unsigned char *)val + 8);
  entry->violations = kl_be64_get((const unsigned char *)val + 16);
  return 0;
}

/* Reads {"amount": int, "seq": int} with msgpack-c; returns 0 on success. */
static int kl_ledger_payload(const void *buf, size_t len, int64_t *amount,
                             int64_t *seq) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  int have = 0;
  if (msgpack_unpack_next(&up, buf, len, &off) == MSGPACK_UNPACK_SUCCESS &&
      off == len && up.data.type == MSGPACK_OBJECT_MAP) {
    const msgpack_object_map *map = &up.data.via.map;
    for (uint32_t i = 0; i < map->size; i++) {
      const msgpack_object *k = &map->ptr[i].key, *v = &map->ptr[i].val;
      if (k->type != MSGPACK_OBJECT_STR || (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                                            v->type != MSGPACK_OBJECT_NEGATIVE_INTEGER))
        continue;
      int64_t x = v->via.i64;
      if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > INT64_MAX)
        continue;
      if (k->via.str.size == 6 && memcmp(k->via.str.ptr, "amount", 6) == 0)
        *amount = x, have |= 1;
      else if (k->via.str.size == 3 && memcmp(k->via.str.ptr, "seq", 3) == 0)
        *seq = x, have |= 2;
    }
  }
  msgpack_unpacked_destroy(&up);
  return have == 3 ? 0 : -1;
}

static int kl_type_is(const kl_event_t *event, const char *name) {
  size_t n = strlen(name);
  return event->type_len == n && memcmp(event->type, name, n) == 0;
}

/* The new balance in *balance; -1 (and errbuf) when @p amount is not
 * positive or the balance would leave int64. */
static int kl_ledger_apply(int credit, int64_t amount, int64_t *balance,
                           char *errbuf, size_t errbuf_size) {
  int64_t was = *balance;
  if (amount <= 0) {
    snprintf(errbuf, errbuf_size,
             "ledger: amount %" PRId64 " is not positive: a credit adds a "
             "positive amount and a debit subtracts one",
             amount);
    return -1;
  }
  if (credit ? __builtin_add_overflow(was, amount, balance)
             : __builtin_sub_overflow(was, amount, balance)) {
    *balance = was;
    snprintf(errbuf, errbuf_size,
             "ledger: %s %" PRId64 " would take the key's balance %" PRId64
             " past the int64 range; the event is not applied",
             credit ? "crediting" : "debiting", amount, was);
    return -1;
  }
  return 0;
}

kl_handler_result_t kl_ledger_handler(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  (void)opaque;
  (void)fence;
  int64_t amount = 0, seq = 0;
  int credit = kl_type_is(event, "credit");
  if (!credit && !kl_type_is(event, "debit")) {
    snprintf(errbuf, errbuf_size, "ledger: event type \"%.*s\" is neither "
             "credit nor debit", (int)event->type_len, event->type);
    return KL_HANDLER_FAIL;
  }
  if (kl_ledger_payload(event->payload, event->payload_len, &amount, &seq)) {
    snprintf(errbuf, errbuf_size, "ledger: payload is not a msgpack map "
             "{\"amount\": int, \"seq\": int}");
    return KL_HANDLER_FAIL;
  }
  unsigned char key[sizeof(KL_LEDGER_PREFIX) - 1 + KL_KEY_MAX];
  size_t klen = sizeof(KL_LEDGER_PREFIX) - 1;
  memcpy(key, KL_LEDGER_PREFIX, klen);
  memcpy(key + klen, event->key, event->key_len);
  klen += event->key_len;

  kl_ledger_entry_t e = {0, 0, 0};
  const void *val;
  size_t vlen;
  kl_err_t err = kl_txn_get(txn, key, klen, &val, &vlen);
  if (err == KL_OK && kl__ledger_decode(val, vlen, &e) != 0) {
    snprintf(errbuf, errbuf_size, "ledger: stored entry has %zu bytes, "
             "expected %d", vlen, KL_LEDGER_VALUE_LEN);
    return KL_HANDLER_FAIL;
  } else if (err != KL_OK && err != KL_ENOTFOUND) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  if (kl_ledger_apply(credit, amount, &e.balance, errbuf, errbuf_size))
    return KL_HANDLER_FAIL;
  if (seq != e.last_seq + 1)
    e.violations++;
  e.last_seq = seq;
  unsigned char out[KL_LEDGER_VALUE_LEN];
  kl_be64_put(out, e.balance);
  kl_be64_put(out + 8, e.last_seq);
  kl_be64_put(out + 16, e.violations);
  if (kl_txn_put(txn, key, klen, out, sizeof(out))) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}
