/*
 * The built-in ledger handler, used by the demo and the tests.
 *
 * Events "credit" and "debit" carry the msgpack map {"amount": int,
 * "seq": int}; a "transfer" {"to": key, "amount": int, "seq": int} debits
 * its key and emits (kl_txn_emit()) a "credit" {"amount": int, "from":
 * key} to "to", committed with the debit: money moves between two owners
 * without a lock. A credit without a seq (a transfer's) is applied with no
 * order check; a transfer to its own key is refused. Per entity key the store
 * holds "ledger:" TOPIC "/" KEY => balance, last seq and order violations
 * (three big-endian int64; a fourth, the base, for an entry that started
 * from an unscoped one: ledger.h). An event whose seq is not last seq + 1 is
 * still applied, and counted as a violation: with one writer per key and
 * in-order application there must be none.
 *
 * A transfer with "at" (ms since the Unix epoch) is scheduled: reserve
 * now, settle later. It debits its key at once and holds the amount (the
 * entry's held: money is balance + held), and emits to its own key a
 * "settle" {"to", "amount"} delayed until "at" (kl_txn_emit_opts()); the
 * settle, applied once when its time came, releases the hold and emits
 * the destination's credit. The settle is the ledger's own follow-up: one
 * a service published (its id is no follow-up's), or one for more than
 * the key holds, FAILs. The entry also counts the delayed events applied
 * to the key (a settle is one), for a reader that knows when they were
 * due (cli/ledger_gen.c checks that none ran early).
 *
 * An amount is positive (a debit subtracts it), and a balance never wraps:
 * an event that is not, or that would carry the balance past int64, FAILs
 * with the reason, so it is dead-lettered and the balance stays as it was;
 * so does a payload that has one of the fields it reads twice.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/msgpack_read.h"
#include "common/strbuf.h"
#include "keylane/handlers.h"
#include "handlers/ledger.h"

int kl__ledger_decode(const void *val, size_t len, kl_ledger_entry_t *entry) {
  const unsigned char *v = val;
  if (len != KL_LEDGER_VALUE_LEN && len != KL_LEDGER_VALUE_BASE_LEN &&
      len != KL_LEDGER_VALUE_HELD_LEN)
    return -1;
  entry->balance = (int64_t)kl__get_be(v, 8);
  entry->last_seq = (int64_t)kl__get_be(v + 8, 8);
  entry->violations = (int64_t)kl__get_be(v + 16, 8);
  entry->base = len > KL_LEDGER_VALUE_LEN ? (int64_t)kl__get_be(v + 24, 8) : 0;
  int held = len == KL_LEDGER_VALUE_HELD_LEN;
  entry->held = held ? (int64_t)kl__get_be(v + 32, 8) : 0;
  entry->delayed = held ? (int64_t)kl__get_be(v + 40, 8) : 0;
  return 0;
}

size_t kl__ledger_key(const char *topic, const void *key, size_t key_len,
                      unsigned char *out) {
  size_t plen = sizeof(KL_LEDGER_PREFIX) - 1, tlen = strnlen(topic, 249);
  memcpy(out, KL_LEDGER_PREFIX, plen);
  memcpy(out + plen, topic, tlen);
  out[plen + tlen] = '/';
  memcpy(out + plen + tlen + 1, key, key_len);
  return plen + tlen + 1 + key_len;
}

void kl__ledger_encode(msgpack_sbuffer *sb, const kl_ledger_args_t *a) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1 + !!a->to + !!a->has_seq + !!a->has_at + !!a->from);
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
  if (a->has_at) {
    msgpack_pack_str_with_body(&pk, "at", 2);
    msgpack_pack_int64(&pk, a->at);
  }
  if (a->from) {
    msgpack_pack_str_with_body(&pk, "from", 4);
    msgpack_pack_str_with_body(&pk, a->from, a->from_len);
  }
}

static int key_is(const kl__mp_item_t *k, const char *name) {
  size_t n = strlen(name);
  return k->kind == KL__MP_STR && k->n == n && memcmp(k->body, name, n) == 0;
}

static int int_of(const kl__mp_item_t *v, int64_t *out) {
  if (v->kind != KL__MP_INT || v->big)
    return 0;
  *out = v->i;
  return 1;
}

/* Reads one whole item: an array's or a map's elements too, which the
 * ledger never looks into. @returns 0, or -1 on bytes that are not
 * msgpack. */
static int mp_item(kl__mp_reader_t *rd, kl__mp_item_t *item) {
  uint64_t need, left = 1;
  kl__mp_item_t inner;
  for (kl__mp_item_t *it = item; left; it = &inner, left--) {
    if (kl__mp_next(rd, it, &need) != KL__MP_OK || it->kind == KL__MP_NONE ||
        it->kind == KL__MP_NEVER)
      return -1;
    /* Each element takes a byte at least: a count beyond the bytes left
     * is refused here, so left stays small. */
    uint64_t elements = it->kind == KL__MP_MAP     ? 2 * it->n
                        : it->kind == KL__MP_ARRAY ? it->n
                                                   : 0;
    if (elements > (uint64_t)(rd->end - rd->p))
      return -1;
    left += elements;
  }
  return 0;
}

int kl__ledger_payload(const void *buf, size_t len, kl_ledger_args_t *a,
                       const char **twice) {
  static const char *const fields[] = {"amount", "seq", "to", "at"};
  memset(a, 0, sizeof(*a));
  *twice = NULL;
  kl__mp_reader_t rd = kl__mp_reader(buf, len);
  kl__mp_item_t map, k, v;
  uint64_t need;
  if (kl__mp_next(&rd, &map, &need) != KL__MP_OK || map.kind != KL__MP_MAP ||
      map.n > len)
    return -1;
  unsigned seen = 0;
  for (uint64_t i = 0; i < map.n; i++) {
    if (mp_item(&rd, &k) || mp_item(&rd, &v))
      goto not_msgpack;
    for (unsigned f = 0; f < 4; f++)
      if (key_is(&k, fields[f])) {
        if (seen & 1u << f && !*twice)
          *twice = fields[f];
        seen |= 1u << f;
      }
    if (key_is(&k, "amount"))
      a->has_amount = int_of(&v, &a->amount);
    else if (key_is(&k, "seq"))
      a->has_seq = int_of(&v, &a->seq);
    else if (key_is(&k, "at"))
      a->has_at = int_of(&v, &a->at);
    else if (key_is(&k, "to") &&
             (v.kind == KL__MP_STR || v.kind == KL__MP_BIN)) {
      a->to = (const char *)v.body;
      a->to_len = v.n;
    }
  }
  if (kl__mp_offset(&rd) == len)
    return 0;
not_msgpack: /* nothing read counts */
  memset(a, 0, sizeof(*a));
  *twice = NULL;
  return -1;
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
  KL_TRANSFER,
  KL_SETTLE /* a scheduled transfer's second half (the top says) */
} kl_ledger_kind_t;

static int ledger_kind(const kl_event_t *event, kl_ledger_kind_t *kind,
                       char *errbuf, size_t errbuf_size) {
  if (type_is(event, "credit"))
    *kind = KL_CREDIT;
  else if (type_is(event, "debit"))
    *kind = KL_DEBIT;
  else if (type_is(event, "transfer"))
    *kind = KL_TRANSFER;
  else if (type_is(event, "settle"))
    *kind = KL_SETTLE;
  else {
    snprintf(errbuf, errbuf_size,
             "ledger: event type \"%.*s\" is neither "
             "credit, debit, transfer nor settle",
             (int)event->type_len, event->type);
    return -1;
  }
  return 0;
}

/* What the payload of @p kind must hold; -1 with the reason otherwise. */
static int ledger_check(const kl_event_t *event, kl_ledger_kind_t kind,
                        const kl_ledger_args_t *a, char *errbuf,
                        size_t errbuf_size) {
  static const char *const want[] = {
      [KL_CREDIT] = "{\"amount\": int, \"seq\"?: int}",
      [KL_DEBIT] = "{\"amount\": int, \"seq\": int}",
      [KL_TRANSFER] = "{\"to\": key, \"amount\": int, \"seq\": int, "
                      "\"at\"?: int}",
      [KL_SETTLE] = "{\"to\": key, \"amount\": int}"};
  int moves = kind == KL_TRANSFER || kind == KL_SETTLE;
  if (!a->has_amount ||
      ((kind == KL_DEBIT || kind == KL_TRANSFER) && !a->has_seq) ||
      (moves && (!a->to || !a->to_len))) {
    snprintf(errbuf, errbuf_size, "ledger: payload is not a msgpack map %s",
             want[kind]);
    return -1;
  }
  if (kind == KL_TRANSFER && a->has_at && a->at <= 0) {
    snprintf(errbuf, errbuf_size,
             "ledger: a scheduled transfer's \"at\" is %" PRId64
             ": it is when the transfer settles, in ms since the Unix epoch",
             a->at);
    return -1;
  }
  if (kind == KL_SETTLE && (!event->id_len || event->id[0] != KL_ID_RESERVED)) {
    snprintf(errbuf, errbuf_size,
             "ledger: a settle is the ledger's own follow-up of a scheduled "
             "transfer, this one (id %.*s) was published: publish a "
             "transfer with \"at\" instead",
             (int)(event->id_len > 64 ? 64 : event->id_len), event->id);
    return -1;
  }
  if (moves && a->to_len == event->key_len &&
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

/* What a transfer emits: to its destination the credit {"amount",
 * "from"}, without a seq (the destination's order is its own); a
 * scheduled one to its own key the settle {"to", "amount"}, due at "at". A
 * settle emits the credit. */
static kl_handler_result_t ledger_emit(kl_txn_t *txn, const kl_event_t *event,
                                       kl_ledger_kind_t kind,
                                       const kl_ledger_args_t *a, char *errbuf,
                                       size_t errbuf_size) {
  int settle = kind == KL_TRANSFER && a->has_at;
  kl_ledger_args_t out = {.amount = a->amount};
  if (settle)
    out.to = a->to, out.to_len = a->to_len;
  else
    out.from = event->key, out.from_len = event->key_len;
  kl_emit_opts_t opts = {.size = sizeof(opts), .not_before = a->at};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, &out);
  kl_err_t err = settle
                     ? kl_txn_emit_opts(txn, NULL, event->key, event->key_len,
                                        "settle", sb.data, sb.size, &opts)
                     : kl_txn_emit(txn, NULL, a->to, a->to_len, "credit",
                                   sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (!err)
    return KL_HANDLER_OK;
  snprintf(errbuf, errbuf_size, "ledger: %s: %s",
           settle ? "scheduled transfer's settle, due at its \"at\""
                  : "transfer's credit to its destination",
           kl_err_detail());
  return err == KL_ENOMEM ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
}

static kl_handler_result_t ledger_store(kl_txn_t *txn, const void *key,
                                        size_t klen, const kl_ledger_entry_t *e,
                                        char *errbuf, size_t errbuf_size) {
  unsigned char out[KL_LEDGER_VALUE_HELD_LEN];
  kl__put_be(out, (uint64_t)e->balance, 8);
  kl__put_be(out + 8, (uint64_t)e->last_seq, 8);
  kl__put_be(out + 16, (uint64_t)e->violations, 8);
  kl__put_be(out + 24, (uint64_t)e->base, 8);
  kl__put_be(out + 32, (uint64_t)e->held, 8);
  kl__put_be(out + 40, (uint64_t)e->delayed, 8);
  /* the shortest layout that holds it: what an older keylane wrote */
  size_t len = e->held || e->delayed ? KL_LEDGER_VALUE_HELD_LEN
               : e->base             ? KL_LEDGER_VALUE_BASE_LEN
                                     : KL_LEDGER_VALUE_LEN;
  if (kl_txn_put(txn, key, klen, out, len)) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}

/* Applies @p a to the key's entry: a credit adds, a debit and a transfer
 * subtract; a seq is checked against the last one, a credit without one
 * (a transfer's) is not. */
/* Reads the entry at @p key into @p e (left as it is when absent);
 * @returns 1 when found, 0 when not, -1 with the reason in errbuf (*r the
 * verdict). */
static int ledger_read(kl_txn_t *txn, const void *key, size_t klen,
                       kl_ledger_entry_t *e, kl_handler_result_t *r,
                       char *errbuf, size_t errbuf_size) {
  const void *val;
  size_t vlen;
  kl_err_t err = kl_txn_get(txn, key, klen, &val, &vlen);
  if (err == KL_OK && kl__ledger_decode(val, vlen, e) != 0) {
    snprintf(errbuf, errbuf_size,
             "ledger: stored entry has %zu bytes, "
             "expected %d, %d or %d",
             vlen, KL_LEDGER_VALUE_LEN, KL_LEDGER_VALUE_BASE_LEN,
             KL_LEDGER_VALUE_HELD_LEN);
    *r = KL_HANDLER_FAIL;
    return -1;
  } else if (err != KL_OK && err != KL_ENOTFOUND) {
    snprintf(errbuf, errbuf_size, "ledger: %s", kl_err_detail());
    *r = KL_HANDLER_RETRY;
    return -1;
  }
  return err == KL_OK;
}

/* The key's entry on the event's topic; when it has none yet, one that
 * starts from the unscoped entry an older keylane kept ("ledger/" KEY),
 * which is only read: its balance becomes the new entry's base, so that
 * however many topics start from it, kl__ledger_walk() counts it once, and
 * no two owners ever write it. */
static int ledger_load(kl_txn_t *txn, const kl_event_t *event,
                       const kl_fence_t *fence, unsigned char *key,
                       size_t *klen, kl_ledger_entry_t *e,
                       kl_handler_result_t *r, char *errbuf,
                       size_t errbuf_size) {
  *klen = kl__ledger_key(fence->topic, event->key, event->key_len, key);
  int found = ledger_read(txn, key, *klen, e, r, errbuf, errbuf_size);
  if (found != 0)
    return found < 0 ? -1 : 0;
  unsigned char old[sizeof(KL_LEDGER_LEGACY_PREFIX) - 1 + KL_KEY_MAX];
  size_t olen = sizeof(KL_LEDGER_LEGACY_PREFIX) - 1;
  memcpy(old, KL_LEDGER_LEGACY_PREFIX, olen);
  memcpy(old + olen, event->key, event->key_len);
  kl_ledger_entry_t was = {0, 0, 0, 0, 0, 0};
  found = ledger_read(txn, old, olen + event->key_len, &was, r, errbuf,
                      errbuf_size);
  if (found < 0)
    return -1;
  *e = (kl_ledger_entry_t){was.balance, was.last_seq, 0, was.balance, 0, 0};
  return 0;
}

/* A settle: the hold its scheduled transfer took goes. */
static int ledger_release(int64_t amount, kl_ledger_entry_t *e, char *errbuf,
                          size_t errbuf_size) {
  if (amount <= 0 || amount > e->held) {
    snprintf(errbuf, errbuf_size,
             "ledger: settle of %" PRId64 " but the key holds %" PRId64
             ": a settle releases what its scheduled transfer held",
             amount, e->held);
    return -1;
  }
  e->held -= amount;
  return 0;
}

static kl_handler_result_t
ledger_apply_event(kl_txn_t *txn, const kl_event_t *event,
                   const kl_fence_t *fence, kl_ledger_kind_t kind,
                   const kl_ledger_args_t *a, char *errbuf,
                   size_t errbuf_size) {
  unsigned char key[KL_LEDGER_STORE_KEY_MAX];
  size_t klen;
  kl_ledger_entry_t e = {0, 0, 0, 0, 0, 0};
  kl_handler_result_t r;
  if (ledger_load(txn, event, fence, key, &klen, &e, &r, errbuf, errbuf_size))
    return r;
  if (kind == KL_SETTLE ? ledger_release(a->amount, &e, errbuf, errbuf_size)
                        : ledger_apply(kind == KL_CREDIT, a->amount, &e.balance,
                                       errbuf, errbuf_size))
    return KL_HANDLER_FAIL;
  /* reserved now, owed until its settle */
  if (kind == KL_TRANSFER && a->has_at &&
      __builtin_add_overflow(e.held, a->amount, &e.held)) {
    snprintf(errbuf, errbuf_size,
             "ledger: holding %" PRId64 " more would take the key's held "
             "amount past the int64 range; the event is not applied",
             a->amount);
    return KL_HANDLER_FAIL;
  }
  e.delayed += event->not_before > 0;
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
  kl_ledger_kind_t kind;
  if (ledger_kind(event, &kind, errbuf, errbuf_size))
    return KL_HANDLER_FAIL;
  kl_ledger_args_t a;
  kl_handler_result_t r = KL_HANDLER_FAIL;
  const char *twice = NULL;
  if (kl__ledger_payload(event->payload, event->payload_len, &a, &twice))
    a.has_amount = 0; /* not a map: ledger_check() says what it must be */
  if (twice)
    snprintf(errbuf, errbuf_size,
             "ledger: the payload has \"%s\" twice: each field must appear "
             "once (which one was meant?)",
             twice);
  else if (!ledger_check(event, kind, &a, errbuf, errbuf_size))
    r = ledger_apply_event(txn, event, fence, kind, &a, errbuf, errbuf_size);
  if (r == KL_HANDLER_OK && (kind == KL_TRANSFER || kind == KL_SETTLE))
    r = ledger_emit(txn, event, kind, &a, errbuf, errbuf_size);
  return r;
}

/* ---- reading the entries back: kl__ledger_walk() --------------------- */

typedef struct ledger_row {
  unsigned char *key;
  size_t len;
  kl_ledger_entry_t e;
} ledger_row_t;

typedef struct ledger_walk {
  size_t plen; /* the scanned prefix's length */
  int scoped;  /* rows are "ledger:" TOPIC "/" KEY: skip to the '/' */
  int summing; /* collect into rows; else call cb at once */
  kl_ledger_row_cb_t *cb;
  void *opaque;
  ledger_row_t *rows;
  size_t n, cap;
  int stopped; /* cb said stop, or out of memory (err) */
  kl_err_t err;
} ledger_walk_t;

static int walk_row(void *opaque, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  ledger_walk_t *w = opaque;
  kl_ledger_entry_t e;
  const unsigned char *k = (const unsigned char *)key + w->plen;
  size_t len = key_len - w->plen;
  const unsigned char *slash = w->scoped ? memchr(k, '/', len) : NULL;
  if (kl__ledger_decode(val, val_len, &e) != 0 || (w->scoped && !slash))
    return 0; /* not an entry: another handler's key */
  if (slash)
    len -= (size_t)(slash + 1 - k), k = slash + 1;
  if (!w->summing)
    return w->stopped = w->cb(w->opaque, k, len, &e);
  ledger_row_t *rows = kl__grow(w->rows, &w->cap, w->n, sizeof(*rows), 256);
  unsigned char *copy = malloc(len ? len : 1);
  if (!rows || !copy) {
    free(copy);
    w->err = kl__err(KL_ENOMEM, "keylane ledger: out of memory");
    return w->stopped = 1;
  }
  memcpy(copy, k, len);
  w->rows = rows;
  rows[w->n++] = (ledger_row_t){copy, len, e};
  return 0;
}

static int row_cmp(const void *a, const void *b) {
  const ledger_row_t *x = a, *y = b;
  int c = memcmp(x->key, y->key, x->len < y->len ? x->len : y->len);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Adds row @p r to the key's @p sum: its change since its base. */
static kl_err_t walk_add(kl_ledger_entry_t *sum, const ledger_row_t *r) {
  int64_t change;
  if (__builtin_sub_overflow(r->e.balance, r->e.base, &change) ||
      __builtin_add_overflow(sum->balance, change, &sum->balance))
    return kl__err(KL_EINVAL,
                   "keylane ledger: key %.*s's balance summed over its "
                   "topics leaves the int64 range; read one topic's",
                   (int)(r->len > 64 ? 64 : r->len), (const char *)r->key);
  sum->violations += r->e.violations;
  sum->held += r->e.held;
  sum->delayed += r->e.delayed;
  if (r->e.last_seq > sum->last_seq)
    sum->last_seq = r->e.last_seq;
  return KL_OK;
}

/* Sorts the rows by key and calls cb once per key with their sum. */
static kl_err_t walk_sum(ledger_walk_t *w) {
  if (w->n) /* none: rows is NULL, which qsort() may not be given */
    qsort(w->rows, w->n, sizeof(*w->rows), row_cmp);
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && i < w->n;) {
    kl_ledger_entry_t sum = {0, 0, 0, 0, 0, 0};
    size_t j = i;
    while (!err && j < w->n && row_cmp(&w->rows[i], &w->rows[j]) == 0)
      err = walk_add(&sum, &w->rows[j++]);
    if (!err && w->cb(w->opaque, w->rows[i].key, w->rows[i].len, &sum))
      break;
    i = j;
  }
  return err;
}

static kl_err_t walk_scan(kl_store_t *store, ledger_walk_t *w,
                          const char *prefix, int scoped) {
  w->plen = strlen(prefix);
  w->scoped = scoped;
  kl_err_t err =
      w->stopped ? KL_OK : kl_store_scan(store, prefix, w->plen, walk_row, w);
  return err ? err : w->err;
}

kl_err_t kl__ledger_walk(kl_store_t *store, const char *topic,
                         kl_ledger_row_cb_t *cb, void *opaque) {
  ledger_walk_t w = {.summing = !topic, .cb = cb, .opaque = opaque};
  kl_err_t err;
  if (topic) {
    char prefix[sizeof(KL_LEDGER_PREFIX) + 256];
    snprintf(prefix, sizeof(prefix), KL_LEDGER_PREFIX "%.249s/", topic);
    return walk_scan(store, &w, prefix, 0);
  }
  err = walk_scan(store, &w, KL_LEDGER_LEGACY_PREFIX, 0);
  if (!err)
    err = walk_scan(store, &w, KL_LEDGER_PREFIX, 1);
  if (!err)
    err = walk_sum(&w);
  for (size_t i = 0; i < w.n; i++)
    free(w.rows[i].key);
  free(w.rows);
  return err;
}
