/*
 * The built-in ledger handler, used by the demo and the tests.
 *
 * Events "credit" and "debit" carry the msgpack map {"amount": int,
 * "seq": int}; a "transfer" {"to": key, "amount": int, "seq": int} debits
 * its key and emits (kl_txn_emit()) a "credit" {"amount": int, "from":
 * key} to "to", committed with the debit: money moves between two owners
 * without a lock. A credit without a seq (a transfer's) is applied with no
 * order check; a transfer to its own key is refused. Per entity key the store
 * holds "ledger/" KEY => balance, last seq and order violations (three
 * big-endian int64). An event whose seq is not last seq + 1 is still applied,
 * and counted as a violation: with one writer per key and in-order application
 * there must be none.
 *
 * An amount is positive (a debit subtracts it), and a balance never wraps:
 * an event that is not, or that would carry the balance past int64, FAILs
 * with the reason, so it is dead-lettered and the balance stays as it was;
 * so does a payload that has one of the fields it reads twice.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "common/bytes.h"
#include "keylane/worker.h"
#include "handlers/ledger.h"

int kl__ledger_decode(const void *val, size_t len, kl_ledger_entry_t *entry) {
  if (len != KL_LEDGER_VALUE_LEN)
    return -1;
  entry->balance = (int64_t)kl__get_be(val, 8);
  entry->last_seq = (int64_t)kl__get_be((const unsigned char *)val + 8, 8);
  entry->violations = (int64_t)kl__get_be((const unsigned char *)val + 16, 8);
  return 0;
}

void kl__ledger_encode(msgpack_sbuffer *sb, const kl_ledger_args_t *a) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1 + !!a->to + !!a->has_seq + !!a->from);
  if (a->to) {
    msgpack_pack_str_with_body(&pk, "to", 2);
    msgpack_pack_str_with_body(&pk, a->to, a->to_len);
  }
  msgpack_pack_str_with_body(&pk, "amount", 6);
  msgpack_pack_int64(&pk, a->amount);
  if (a->has_seq) {
    msgpack_pack_str_with_body(&pk, "seq", 3);
    msgpack_pack_int64(&pk, a->seq);
  }
  if (a->from) {
    msgpack_pack_str_with_body(&pk, "from", 4);
    msgpack_pack_str_with_body(&pk, a->from, a->from_len);
  }
}

static int key_is(const msgpack_object *k, const char *name) {
  size_t n = strlen(name);
  return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
         memcmp(k->via.str.ptr, name, n) == 0;
}

static int int_of(const msgpack_object *v, int64_t *out) {
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
      (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)) {
    *out = v->via.i64;
    return 1;
  }
  return 0;
}

static void ledger_field(const msgpack_object *k, const msgpack_object *v,
                         kl_ledger_args_t *a) {
  if (key_is(k, "amount"))
    a->has_amount = int_of(v, &a->amount);
  else if (key_is(k, "seq"))
    a->has_seq = int_of(v, &a->seq);
  else if (key_is(k, "to") &&
           (v->type == MSGPACK_OBJECT_STR || v->type == MSGPACK_OBJECT_BIN)) {
    a->to = v->via.str.ptr; /* str and bin share the layout */
    a->to_len = v->via.str.size;
  }
}

/* Reads the payload map with msgpack-c; @p up holds what a->to points at
 * (the caller destroys it). @returns 0 for a map, -1 otherwise. */
static int ledger_payload(const void *buf, size_t len, msgpack_unpacked *up,
                          kl_ledger_args_t *a) {
  size_t off = 0;
  memset(a, 0, sizeof(*a));
  if (msgpack_unpack_next(up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
      off != len || up->data.type != MSGPACK_OBJECT_MAP)
    return -1;
  const msgpack_object_map *map = &up->data.via.map;
  for (uint32_t i = 0; i < map->size; i++)
    ledger_field(&map->ptr[i].key, &map->ptr[i].val, a);
  return 0;
}

/* The first field the ledger reads that @p map has twice, or NULL: it
 * would take the last one over the first, and the producer may have
 * meant either. */
static const char *ledger_twice(const msgpack_object_map *map) {
  static const char *const fields[] = {"amount", "seq", "to"};
  unsigned seen = 0;
  for (uint32_t i = 0; i < map->size; i++)
    for (unsigned f = 0; f < 3; f++)
      if (key_is(&map->ptr[i].key, fields[f])) {
        if (seen & 1u << f)
          return fields[f];
        seen |= 1u << f;
      }
  return NULL;
}

static int type_is(const kl_event_t *event, const char *name) {
  size_t n = strlen(name);
  return event->type_len == n && memcmp(event->type, name, n) == 0;
}

/* The new balance in *balance; -1 (and errbuf) when @p amount is not
 * positive or the balance would leave int64. */
static int ledger_apply(int credit, int64_t amount, int64_t *balance,
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

typedef enum kl_ledger_kind {
  KL_CREDIT,
  KL_DEBIT,
  KL_TRANSFER
} kl_ledger_kind_t;

static int ledger_kind(const kl_event_t *event, kl_ledger_kind_t *kind,
                       char *errbuf, size_t errbuf_size) {
  if (type_is(event, "credit"))
    *kind = KL_CREDIT;
  else if (type_is(event, "debit"))
    *kind = KL_DEBIT;
  else if (type_is(event, "transfer"))
    *kind = KL_TRANSFER;
  else {
    snprintf(errbuf, errbuf_size,
             "ledger: event type \"%.*s\" is neither "
             "credit, debit nor transfer",
             (int)event->type_len, event->type);
    return -1;
  }
  return 0;
}

/* What the payload of @p kind must hold; -1 with the reason otherwise. */
static int ledger_check(const kl_event_t *event, kl_ledger_kind_t kind,
                        const kl_ledger_args_t *a, char *errbuf,
                        size_t errbuf_size) {
  const char *want = kind == KL_TRANSFER
                         ? "{\"to\": key, \"amount\": int, \"seq\": int}"
                     : kind == KL_DEBIT ? "{\"amount\": int, \"seq\": int}"
                                        : "{\"amount\": int, \"seq\"?: int}";
  if (!a->has_amount || (kind != KL_CREDIT && !a->has_seq) ||
      (kind == KL_TRANSFER && (!a->to || !a->to_len))) {
    snprintf(errbuf, errbuf_size, "ledger: payload is not a msgpack map %s",
             want);
    return -1;
  }
  if (kind == KL_TRANSFER && a->to_len == event->key_len &&
      memcmp(a->to, event->key, a->to_len) == 0) {
    snprintf(errbuf, errbuf_size,
             "ledger: transfer from %.*s to itself: a "
             "transfer moves an amount between two different keys",
             (int)(event->key_len > 64 ? 64 : event->key_len),
             (const char *)event->key);
    return -1;
  }
  return 0;
}

/* The credit a transfer emits to its destination: {"amount", "from"},
 * without a seq (the destination's order is its own). */
static kl_handler_result_t ledger_emit_credit(kl_txn_t *txn,
                                              const kl_event_t *event,
                                              const kl_ledger_args_t *a,
                                              char *errbuf,
                                              size_t errbuf_size) {
  kl_ledger_args_t credit = {
      .amount = a->amount, .from = event->key, .from_len = event->key_len};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, &credit);
  kl_err_t err =
      kl_txn_emit(txn, NULL, a->to, a->to_len, "credit", sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (!err)
    return KL_HANDLER_OK;
  snprintf(errbuf, errbuf_size,
           "ledger: transfer's credit to its "
           "destination: %s",
           kl_err_detail());
  return err == KL_ENOMEM ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
}

static kl_handler_result_t ledger_store(kl_txn_t *txn, const void *key,
                                        size_t klen, const kl_ledger_entry_t *e,
                                        char *errbuf, size_t errbuf_size) {
  unsigned char out[KL_LEDGER_VALUE_LEN];
  kl__put_be(out, (uint64_t)e->balance, 8);
  kl__put_be(out + 8, (uint64_t)e->last_seq, 8);
  kl__put_be(out + 16, (uint64_t)e->violations, 8);
  if (kl_txn_put(txn, key, klen, out, sizeof(out))) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}

/* Applies @p a to the key's entry: a credit adds, a debit and a transfer
 * subtract; a seq is checked against the last one, a credit without one
 * (a transfer's) is not. */
static kl_handler_result_t
ledger_apply_event(kl_txn_t *txn, const kl_event_t *event,
                   kl_ledger_kind_t kind, const kl_ledger_args_t *a,
                   char *errbuf, size_t errbuf_size) {
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
    snprintf(errbuf, errbuf_size,
             "ledger: stored entry has %zu bytes, "
             "expected %d",
             vlen, KL_LEDGER_VALUE_LEN);
    return KL_HANDLER_FAIL;
  } else if (err != KL_OK && err != KL_ENOTFOUND) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  if (ledger_apply(kind == KL_CREDIT, a->amount, &e.balance, errbuf,
                   errbuf_size))
    return KL_HANDLER_FAIL;
  if (a->has_seq) {
    if (a->seq != e.last_seq + 1)
      e.violations++;
    e.last_seq = a->seq;
  }
  return ledger_store(txn, key, klen, &e, errbuf, errbuf_size);
}

kl_handler_result_t kl_ledger_handler(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  (void)opaque;
  (void)fence;
  kl_ledger_kind_t kind;
  if (ledger_kind(event, &kind, errbuf, errbuf_size))
    return KL_HANDLER_FAIL;
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  kl_ledger_args_t a;
  kl_handler_result_t r = KL_HANDLER_FAIL;
  const char *twice = NULL;
  if (ledger_payload(event->payload, event->payload_len, &up, &a))
    a.has_amount = 0; /* not a map: ledger_check() says what it must be */
  else
    twice = ledger_twice(&up.data.via.map);
  if (twice)
    snprintf(errbuf, errbuf_size,
             "ledger: the payload has \"%s\" twice: each field must appear "
             "once (which one was meant?)",
             twice);
  else if (!ledger_check(event, kind, &a, errbuf, errbuf_size))
    r = ledger_apply_event(txn, event, kind, &a, errbuf, errbuf_size);
  if (r == KL_HANDLER_OK && kind == KL_TRANSFER)
    r = ledger_emit_credit(txn, event, &a, errbuf, errbuf_size);
  msgpack_unpacked_destroy(&up);
  return r;
}
