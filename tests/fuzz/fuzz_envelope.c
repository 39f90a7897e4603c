/*
 * libFuzzer target for the envelope codec. Each input is used twice:
 *
 * 1. As a Kafka message: a 2-byte little-endian key length, the key, and the
 *    value. The decoder must not crash, overread or leak. When it accepts,
 *    msgpack-c's own unpacker must agree on every field, down to the pointer
 *    (both borrow from the value, neither copies), and the event must survive
 *    encode -> decode -> encode unchanged.
 * 2. As field material for an event: when kl_event_validate() accepts it,
 *    kl_event_encode() must produce an envelope that decodes to it.
 *
 * 3. As a ledger payload, and the payload of every event the decoder
 *    accepts: when the ledger's reader (kl__ledger_payload()) accepts it,
 *    msgpack-c must read the same map, with the same amount, seq, to and
 *    field given twice.
 *
 * msgpack_unpack() is only called on values the decoder accepted: on
 * arbitrary bytes it allocates whatever a container header claims.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "tests/fuzz/fuzz.h"
#include "keylane/event.h"
#include "handlers/ledger.h"

static kl_decoder_t *decoder, *decoder2;

static int bytes_equal(const void *a, size_t alen, const void *b, size_t blen) {
  return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

static int events_equal(const kl_event_t *a, const kl_event_t *b) {
  if (!bytes_equal(a->key, a->key_len, b->key, b->key_len) ||
      !bytes_equal(a->id, a->id_len, b->id, b->id_len) ||
      !bytes_equal(a->type, a->type_len, b->type, b->type_len) ||
      a->ts != b->ts ||
      !bytes_equal(a->payload, a->payload_len, b->payload, b->payload_len) ||
      a->header_count != b->header_count)
    return 0;
  for (size_t i = 0; i < a->header_count; i++) {
    const kl_header_t *x = &a->headers[i], *y = &b->headers[i];
    if (!bytes_equal(x->name, x->name_len, y->name, y->name_len) ||
        !bytes_equal(x->value, x->value_len, y->value, y->value_len))
      return 0;
  }
  return 1;
}

/* For an empty str or bin msgpack-c points at the length byte, not past
 * it, so only a nonempty one must point exactly where the decoder does. */
static int same_span(const void *ptr, uint32_t size, const void *p,
                     size_t len) {
  return size == len && (len == 0 || ptr == p);
}

static int same_str(const msgpack_object *o, const void *p, size_t len) {
  return o->type == MSGPACK_OBJECT_STR &&
         same_span(o->via.str.ptr, o->via.str.size, p, len);
}

static void check_headers(const msgpack_object *h, const kl_event_t *ev) {
  CHECK(h->type == MSGPACK_OBJECT_MAP && h->via.map.size == ev->header_count);
  for (uint32_t i = 0; i < h->via.map.size; i++) {
    const kl_header_t *kh = &ev->headers[i];
    CHECK(same_str(&h->via.map.ptr[i].key, kh->name, kh->name_len));
    CHECK(same_str(&h->via.map.ptr[i].val, kh->value, kh->value_len));
  }
}

static void check_field(const msgpack_object *k, const msgpack_object *v,
                        const kl_event_t *ev) {
  const char *name = k->via.str.ptr;
  uint32_t n = k->via.str.size;
  if (n == 1 && name[0] == 'v') /* 2 may carry nb; 1 never does */
    CHECK(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
          (v->via.u64 == 2 || (v->via.u64 == 1 && ev->not_before == 0)));
  else if (n == 2 && memcmp(name, "nb", 2) == 0)
    CHECK(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && ev->not_before > 0 &&
          v->via.u64 == (uint64_t)ev->not_before);
  else if (n == 2 && memcmp(name, "id", 2) == 0)
    CHECK(same_str(v, ev->id, ev->id_len));
  else if (n == 1 && name[0] == 't')
    CHECK(same_str(v, ev->type, ev->type_len));
  else if (n == 2 && memcmp(name, "ts", 2) == 0)
    CHECK(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER
              ? ev->ts >= 0 && v->via.u64 == (uint64_t)ev->ts
              : v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER &&
                    v->via.i64 == ev->ts);
  else if (n == 1 && name[0] == 'p')
    CHECK(v->type == MSGPACK_OBJECT_BIN &&
          same_span(v->via.bin.ptr, v->via.bin.size, ev->payload,
                    ev->payload_len));
  else if (n == 1 && name[0] == 'h')
    check_headers(v, ev);
  else
    CHECK(!"msgpack-c sees a field the decoder accepted as unknown");
}

/* The reference unpacker must read the accepted value the same way. */
static void check_against_msgpack(const uint8_t *value, size_t len,
                                  const kl_event_t *ev) {
  msgpack_zone zone;
  msgpack_object obj;
  size_t off = 0;
  CHECK(msgpack_zone_init(&zone, 4096));
  CHECK(msgpack_unpack((const char *)value, len, &off, &zone, &obj) ==
        MSGPACK_UNPACK_SUCCESS);
  CHECK(obj.type == MSGPACK_OBJECT_MAP);
  for (uint32_t i = 0; i < obj.via.map.size; i++) {
    CHECK(obj.via.map.ptr[i].key.type == MSGPACK_OBJECT_STR);
    check_field(&obj.via.map.ptr[i].key, &obj.via.map.ptr[i].val, ev);
  }
  msgpack_zone_destroy(&zone);
}

/* encode -> decode -> encode gives back the event and the same bytes. */
static void check_roundtrip(const kl_event_t *ev) {
  void *enc = NULL, *enc2 = NULL;
  size_t len = 0, len2 = 0;
  kl_event_t back;
  CHECK(kl_event_encode(ev, &enc, &len) == KL_OK);
  CHECK(len <= KL_ENVELOPE_MAX);
  CHECK(kl_event_decode(decoder2, ev->key, ev->key_len, enc, len, &back) ==
        KL_OK);
  CHECK(events_equal(ev, &back));
  CHECK(kl_event_encode(&back, &enc2, &len2) == KL_OK);
  CHECK(bytes_equal(enc, len, enc2, len2));
  free(enc);
  free(enc2);
}

static int key_is(const msgpack_object *k, const char *name) {
  return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
         memcmp(k->via.str.ptr, name, k->via.str.size) == 0;
}

static int int_of(const msgpack_object *v, int64_t *out) {
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
      (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)) {
    *out = v->via.i64;
    return 1;
  }
  return 0;
}

/* What the ledger's reader accepts, msgpack-c reads the same way. */
static void fuzz_ledger_payload(const uint8_t *buf, size_t len) {
  kl_ledger_args_t a;
  const char *twice;
  if (kl__ledger_payload(buf, len, &a, &twice))
    return;
  msgpack_zone zone;
  msgpack_object obj;
  size_t off = 0;
  CHECK(msgpack_zone_init(&zone, 4096));
  msgpack_unpack_return r =
      msgpack_unpack((const char *)buf, len, &off, &zone, &obj);
  /* msgpack-c refuses what nests deeper than its stack: not a ledger
   * field's business, which the reader passes over. */
  if (r == MSGPACK_UNPACK_PARSE_ERROR || r == MSGPACK_UNPACK_NOMEM_ERROR) {
    msgpack_zone_destroy(&zone);
    return;
  }
  CHECK(r == MSGPACK_UNPACK_SUCCESS && off == len &&
        obj.type == MSGPACK_OBJECT_MAP);
  kl_ledger_args_t b = {0};
  const char *twice_b = NULL;
  static const char *const fields[] = {"amount", "seq", "to", "at"};
  unsigned seen = 0;
  for (uint32_t i = 0; i < obj.via.map.size; i++) {
    const msgpack_object *k = &obj.via.map.ptr[i].key;
    const msgpack_object *v = &obj.via.map.ptr[i].val;
    for (unsigned f = 0; f < 4; f++)
      if (key_is(k, fields[f])) {
        if (seen & 1u << f && !twice_b)
          twice_b = fields[f];
        seen |= 1u << f;
      }
    if (key_is(k, "amount"))
      b.has_amount = int_of(v, &b.amount);
    else if (key_is(k, "seq"))
      b.has_seq = int_of(v, &b.seq);
    else if (key_is(k, "at"))
      b.has_at = int_of(v, &b.at);
    else if (key_is(k, "to") &&
             (v->type == MSGPACK_OBJECT_STR || v->type == MSGPACK_OBJECT_BIN)) {
      b.to = v->via.str.ptr;
      b.to_len = v->via.str.size;
    }
  }
  CHECK(!twice == !twice_b && (!twice || strcmp(twice, twice_b) == 0));
  CHECK(a.has_amount == b.has_amount && a.has_seq == b.has_seq &&
        a.has_at == b.has_at && !!a.to == !!b.to);
  CHECK(!a.has_amount || a.amount == b.amount);
  CHECK(!a.has_seq || a.seq == b.seq);
  CHECK(!a.has_at || a.at == b.at);
  CHECK(!a.to || same_span(b.to, (uint32_t)b.to_len, a.to, a.to_len));
  msgpack_zone_destroy(&zone);
}

static void fuzz_decode(const uint8_t *data, size_t size) {
  size_t key_len = size >= 2 ? (size_t)(data[0] | data[1] << 8) : 0;
  size_t skip = size >= 2 ? 2 : size;
  if (key_len > size - skip)
    key_len = size - skip;
  /* Separate exact-size copies, so that ASan sees an overread of either. */
  size_t value_len = size - skip - key_len;
  uint8_t *key = malloc(key_len > 0 ? key_len : 1);
  uint8_t *value = malloc(value_len > 0 ? value_len : 1);
  memcpy(key, data + skip, key_len);
  memcpy(value, data + skip + key_len, value_len);
  kl_event_t ev;
  kl_err_t err = kl_event_decode(decoder, key, key_len, value, value_len, &ev);
  if (err == KL_OK) {
    check_against_msgpack(value, value_len, &ev);
    fuzz_ledger_payload(ev.payload, ev.payload_len);
    /* The decoder passes on trace headers the encoder refuses (event.h:
     * a worker forwards what another producer wrote): such an event is
     * not written again, and the encoder says so. */
    void *enc = NULL;
    size_t enc_len = 0;
    if (kl_event_validate(&ev, 0) == KL_OK)
      check_roundtrip(&ev);
    else
      CHECK(kl_event_encode(&ev, &enc, &enc_len) != KL_OK && !enc);
  } else {
    CHECK(err >= KL_EDECODE_TRUNCATED && err <= KL_EDECODE_KEY);
    CHECK(kl_err_detail()[0] != '\0');
  }
  free(key);
  free(value);
}

/* A cursor that hands out slices of the input as event fields. */
typedef struct slicer {
  const uint8_t *p;
  size_t left;
} slicer_t;

static size_t slice_len(slicer_t *s, size_t max) {
  size_t n = s->left > 0 ? *s->p % (max + 1) : 0;
  s->p += s->left > 0;
  s->left -= s->left > 0;
  return n < s->left ? n : s->left;
}

static const void *slice(slicer_t *s, size_t n) {
  const void *p = s->p;
  s->p += n;
  s->left -= n;
  return p;
}

static void fuzz_encode(const uint8_t *data, size_t size) {
  slicer_t s = {data, size};
  kl_header_t headers[8];
  kl_event_t ev = {0};
  ev.key_len = slice_len(&s, 40);
  ev.key = slice(&s, ev.key_len);
  ev.id_len = slice_len(&s, 40);
  ev.id = slice(&s, ev.id_len);
  ev.type_len = slice_len(&s, 20);
  ev.type = slice(&s, ev.type_len);
  if (s.left >= sizeof(ev.ts))
    memcpy(&ev.ts, slice(&s, sizeof(ev.ts)), sizeof(ev.ts));
  ev.header_count = slice_len(&s, 8);
  for (size_t i = 0; i < ev.header_count; i++) {
    headers[i].name_len = slice_len(&s, 8);
    headers[i].name = slice(&s, headers[i].name_len);
    headers[i].value_len = slice_len(&s, 40);
    headers[i].value = slice(&s, headers[i].value_len);
  }
  ev.headers = ev.header_count > 0 ? headers : NULL;
  ev.payload_len = s.left;
  ev.payload = s.p;
  if (kl_event_validate(&ev, 0) == KL_OK)
    check_roundtrip(&ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (decoder == NULL) {
    decoder = kl_decoder_new();
    decoder2 = kl_decoder_new();
    CHECK(decoder && decoder2);
  }
  fuzz_decode(data, size);
  fuzz_encode(data, size);
  uint8_t *copy = malloc(size > 0 ? size : 1); /* an overread shows */
  memcpy(copy, data, size);
  fuzz_ledger_payload(copy, size);
  free(copy);
  return 0;
}
