/*
 * The event envelope: its limits, its msgpack encoding and a strict decoder.
 *
 * Neither direction goes through msgpack-c. Encoding writes the envelope's
 * few msgpack forms straight into one buffer (see the encoding section).
 * Decoding does not use msgpack-c's unpacker: msgpack_unpack() allocates
 * count * sizeof(msgpack_object) as soon as it reads a container header,
 * before the elements exist, so the 5 bytes "\xdf\x0f\xff\xff\xff" (a map
 * claiming 268M pairs) ask malloc for 16 GiB.
 * A worker must survive any record, so the decoder below reads the envelope's
 * fixed shape directly from the value bytes: one pass, bounds-checked before
 * every read, nothing allocated, and every failure located to one field. The
 * fuzzer checks it against msgpack_unpack() on every envelope it accepts.
 *
 * Lifetime: a decoded event's key, id, type, payload and header strings point
 * into the caller's key and value buffers (no copies); its header array is the
 * decoder's, overwritten by the next decode.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "event/envelope.h"
#include "event/emit_id.h"
#include "event/trace.h"
#include "common/bytes.h"
#include "common/internal.h"
#include "common/msgpack_read.h"
#include "common/strbuf.h"
#include "common/units.h"
#include "keylane/event.h"

struct kl_decoder {
  kl_header_t headers[KL_HEADERS_MAX];
};

/* ---- limits, shared by kl_event_validate() and the decoder ---- */

static kl_err_t key_check(size_t key_len) {
  if (key_len == 0)
    return kl__err(
        KL_EDECODE_KEY,
        "message has no key; the entity key is required, 1..%d bytes",
        KL_KEY_MAX);
  if (key_len > KL_KEY_MAX)
    return kl__err(KL_EDECODE_KEY, "message key is %zu bytes, the limit is %d",
                   key_len, KL_KEY_MAX);
  return KL_OK;
}

static kl_err_t len_check(const char *field, size_t len, size_t min,
                          size_t max) {
  if (len < min)
    return kl__err(KL_EDECODE_EMPTY, "envelope field \"%s\" is empty", field);
  if (len > max)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "envelope field \"%s\" is %zu bytes, the limit is %zu",
                   field, len, max);
  return KL_OK;
}

/* An id is text: the gateway and `keylane publish` take it from JSON, the
 * stores and the exec handler compare and print it as such, so the
 * decoder refuses what they could not have sent, not only what they can.
 * kl__utf8_valid_len() takes ASCII 8 bytes at a time: a byte at a time
 * through kl__utf8_seq() was a tenth of kl_publish()'s own time for a UUID
 * (keylane-bench produce). */
static kl_err_t id_text_check(const char *id, size_t len) {
  size_t i = kl__utf8_valid_len(id, len, false);
  if (i < len)
    return kl__err(KL_EDECODE_TYPE,
                   "envelope field \"id\" %s at byte %zu: an id is "
                   "UTF-8 text without NUL, as JSON carries it",
                   id[i] == 0 ? "holds a NUL" : "is not valid UTF-8", i);
  return KL_OK;
}

/* Writes at most 64 bytes of @p s into @p out with control and non-ASCII
 * bytes shown as '?', so that a hostile name cannot garble a log line. */
static const char *envelope_printable(const char *s, size_t len, char out[68]) {
  size_t n = len < 64 ? len : 64;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    out[i] = (c >= 0x20 && c < 0x7f && c != '"') ? (char)c : '?';
  }
  strcpy(out + n, len > n ? "..." : "");
  return out;
}

/* Checks headers[i] against the limits and against headers[0..i-1]: a msgpack
 * map with two equal keys means different things to different readers. */
static kl_err_t header_check(const kl_header_t *headers, size_t i) {
  const kl_header_t *h = &headers[i];
  char name[68];
  if (h->name_len == 0)
    return kl__err(KL_EDECODE_EMPTY, "header %zu has an empty name", i);
  if (h->name_len > KL_HEADER_NAME_MAX)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "header %zu's name is %zu bytes, the limit is %d", i,
                   h->name_len, KL_HEADER_NAME_MAX);
  if (h->value_len > KL_HEADER_VALUE_MAX)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "header \"%s\" value is %zu bytes, the limit is %d",
                   envelope_printable(h->name, h->name_len, name), h->value_len,
                   KL_HEADER_VALUE_MAX);
  for (size_t j = 0; j < i; j++)
    if (headers[j].name_len == h->name_len &&
        memcmp(headers[j].name, h->name, h->name_len) == 0)
      return kl__err(KL_EDECODE_DUPLICATE, "header \"%s\" appears twice",
                     envelope_printable(h->name, h->name_len, name));
  return KL_OK;
}

/* A NULL pointer with a nonzero length is a caller bug, not bad input. */
static kl_err_t ptr_check(const char *what, const void *p, size_t len) {
  if (p == NULL && len > 0)
    return kl__err(KL_EINVAL, "%s is NULL but its length is %zu", what, len);
  return KL_OK;
}

static kl_err_t headers_check(const kl_header_t *headers, size_t count) {
  kl_err_t err = ptr_check("event headers", headers, count);
  if (count > KL_HEADERS_MAX)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "envelope field \"h\" has %zu headers, the limit is %d",
                   count, KL_HEADERS_MAX);
  for (size_t i = 0; err == KL_OK && i < count; i++) {
    err = ptr_check("a header name", headers[i].name, headers[i].name_len);
    if (err == KL_OK)
      err = ptr_check("a header value", headers[i].value, headers[i].value_len);
    if (err == KL_OK)
      err = header_check(headers, i);
  }
  return err;
}

kl_err_t kl_event_validate(const kl_event_t *event, int id_optional) {
  kl__err_clear();
  if (event == NULL)
    return kl__err(KL_EINVAL, "event is NULL");
  kl_err_t err = key_check(event->key_len);
  if (err == KL_OK)
    err = ptr_check("event key", event->key, event->key_len);
  if (err == KL_OK)
    err = ptr_check("event id", event->id, event->id_len);
  if (err == KL_OK && !(id_optional && event->id_len == 0))
    err = len_check("id", event->id_len, 1, KL_ID_MAX);
  if (err == KL_OK)
    err = id_text_check(event->id, event->id_len);
  if (err == KL_OK)
    err = ptr_check("event type", event->type, event->type_len);
  if (err == KL_OK)
    err = len_check("t", event->type_len, 1, KL_TYPE_MAX);
  if (err == KL_OK)
    err = ptr_check("event payload", event->payload, event->payload_len);
  if (err == KL_OK)
    err = len_check("p", event->payload_len, 0, KL_PAYLOAD_MAX);
  if (err == KL_OK)
    err = headers_check(event->headers, event->header_count);
  if (err == KL_OK && event->not_before < 0)
    err = kl__err(KL_EINVAL,
                  "not_before is %lld: give ms since the Unix epoch, or 0 "
                  "to have the event applied when it is read",
                  (long long)event->not_before);
  if (err == KL_OK && event->header_count > 0) /* the trace headers' */
    err = kl__trace_check(event);
  return err;
}

kl_err_t kl__id_check(const char *id, size_t id_len, int follow_ups) {
  char shown[68];
  kl__emit_src_t src;
  if (id_len == 0 || id[0] != KL_ID_RESERVED)
    return KL_OK;
  if (!follow_ups)
    return kl__err(KL_EINVAL,
                   "id \"%s\" begins with '%c', which keylane keeps for the "
                   "ids it derives for follow-up events: choose an id that "
                   "does not (or omit it to have one made)",
                   envelope_printable(id, id_len, shown), KL_ID_RESERVED);
  if (kl__emit_id_parse(id, id_len, &src) == 0)
    return KL_OK;
  return kl__err(KL_EINVAL,
                 "id \"%s\" begins with '%c' but is no follow-up's id "
                 "(~TOPIC/PARTITION/OFFSET/INDEX/NONCE, as kl_txn_emit() "
                 "makes it): keylane keeps such ids for its follow-ups, so a "
                 "record that is not one is never applied; fix its "
                 "producer, which does not publish through keylane",
                 envelope_printable(id, id_len, shown), KL_ID_RESERVED);
}

kl_err_t kl__reserved_check(const kl_event_t *event, int own) {
  kl_err_t err = kl__id_check(event->id, event->id_len, own);
  if (err || event->type_len == 0 || event->type[0] != KL_TYPE_RESERVED)
    return err;
  char shown[68];
  return kl__err(KL_EINVAL,
                 "type \"%s\" begins with '%c', which keylane keeps for "
                 "its own records: choose a type that does not (a record "
                 "of one that another producer wrote is never applied)",
                 envelope_printable(event->type, event->type_len, shown),
                 KL_TYPE_RESERVED);
}

/* @p nb is @p by ms (> @p max_ms, @p key's bound) @p where ("from now",
 * "in the past"): said in ms and the excess exactly, since 604800001 ms
 * rounded to seconds read as the 604800 s the bound allows. */
static kl_err_t not_before_beyond(int64_t nb, int64_t by, int64_t max_ms,
                                  const char *key, const char *where,
                                  const char *fix) {
  char max[32], over[32];
  return kl__err(
      KL_EINVAL,
      "not_before %lld is %lld ms %s, %s more than %s (%s) allows: %s",
      (long long)nb, (long long)by, where,
      kl__units_format(KL__UNITS_DURATION, by - max_ms, over, sizeof(over)),
      key, kl__units_format(KL__UNITS_DURATION, max_ms, max, sizeof(max)), fix);
}

kl_err_t kl__not_before_check(const kl_event_t *event, int64_t now_ms,
                              int64_t max_ms, int64_t past_ms,
                              const char *past_key) {
  int64_t nb = event->not_before;
  if (nb <= 0)
    return KL_OK;
  if (nb < KL__NOT_BEFORE_MIN_MS / 1000) /* as seconds too */
    return kl__err(KL_EINVAL,
                   "not_before %lld is a time before 1973 in milliseconds "
                   "since the Unix epoch, and in seconds too; give "
                   "milliseconds since the Unix epoch, or a delay",
                   (long long)nb);
  if (nb < KL__NOT_BEFORE_MIN_MS)
    return kl__err(KL_EINVAL,
                   "not_before %lld is a time before 1973 in milliseconds "
                   "since the Unix epoch: it looks like seconds; give "
                   "milliseconds since the Unix epoch (%lld if it is "
                   "seconds), or a delay",
                   (long long)nb, (long long)nb * 1000);
  char fix[256];
  snprintf(fix, sizeof(fix),
           "give milliseconds since the Unix epoch of a time at most %s ago "
           "(a past time runs at once), or omit not_before to have the event "
           "applied when it is read",
           past_key);
  if (past_ms > 0 && nb < now_ms - past_ms)
    return not_before_beyond(nb, now_ms - nb, past_ms, past_key, "in the past",
                             fix);
  if (max_ms > 0 && nb - now_ms > max_ms)
    return not_before_beyond(nb, nb - now_ms, max_ms, "timer.max.delay",
                             "from now",
                             "publish the event closer to its time, or raise "
                             "timer.max.delay (at most store.dedup.retention)");
  return KL_OK;
}

kl_err_t kl__record_check(const kl_event_t *event, size_t envelope_size) {
  return kl__record_check_max(event, envelope_size, KL_MESSAGE_MAX, NULL);
}

kl_err_t kl__record_check_max(const kl_event_t *event, size_t envelope_size,
                              size_t message_max, const char *source) {
  if (!message_max)
    message_max = KL_MESSAGE_MAX;
  /* A record batch's framing: what KL_RECORD_MAX leaves of KL_MESSAGE_MAX. */
  size_t framing = KL_MESSAGE_MAX - KL_RECORD_MAX;
  size_t max = message_max > framing ? message_max - framing : 0;
  size_t size = event->key_len + envelope_size;
  if (size <= max)
    return KL_OK;
  return kl__err(KL_EDECODE_OVERSIZE,
                 "event is %zu bytes as a Kafka record (key %zu + envelope "
                 "%zu), over the %zu one record may carry (%s, %zu, less the "
                 "batch framing): make the payload (%zu bytes) or the "
                 "headers smaller",
                 size, event->key_len, envelope_size, max,
                 source ? source : "Kafka's default message.max.bytes",
                 message_max, event->payload_len);
}

/* ---- encoding ---- */

/* The envelope is written straight into one buffer by the few msgpack forms
 * it needs, each the smallest that holds the value: the choices msgpack-c's
 * packer makes, so the bytes are the ones it wrote before (the unit test
 * compares the two at every width boundary). Going through the packer cost
 * an indirect call and a bounds check per item, a third of kl_publish. */

static size_t str_size(size_t len) {
  return len + (len < 32 ? 1 : len < 256 ? 2 : len < 65536 ? 3 : 5);
}

static size_t bin_size(size_t len) {
  return len + (len < 256 ? 2 : len < 65536 ? 3 : 5);
}

size_t kl__envelope_size(const kl_event_t *event) {
  size_t n = 1 + 2 + 1 + 3 + str_size(event->id_len) + 2 +
             str_size(event->type_len) + 3 + 9 + 2 +
             bin_size(event->payload_len);
  if (event->header_count > 0)
    n += 2 + 3;
  if (event->not_before > 0)
    n += 3 + 9;
  for (size_t i = 0; i < event->header_count; i++)
    n += str_size(event->headers[i].name_len) +
         str_size(event->headers[i].value_len);
  return n;
}

/* A format byte followed by @p v big-endian in @p width bytes. */
static uint8_t *put_be(uint8_t *o, uint8_t format, uint64_t v, unsigned width) {
  *o++ = format;
  kl__put_be(o, v, width);
  return o + width;
}

/* A str's or bin's bytes; memcpy() must not see NULL, even for 0 bytes. */
static uint8_t *put_bytes(uint8_t *o, const void *p, size_t len) {
  if (len > 0)
    memcpy(o, p, len);
  return o + len;
}

/* A str's or bin's length: the 8-, 16- and 32-bit forms are consecutive
 * format bytes from @p format8 (0xd9 for str, 0xc4 for bin). */
static uint8_t *put_len(uint8_t *o, uint8_t format8, size_t len) {
  if (len < 256)
    return put_be(o, format8, len, 1);
  if (len < 65536)
    return put_be(o, (uint8_t)(format8 + 1), len, 2);
  return put_be(o, (uint8_t)(format8 + 2), len, 4);
}

static uint8_t *put_str(uint8_t *o, const char *s, size_t len) {
  if (len < 32)
    *o++ = (uint8_t)(0xa0 | len);
  else
    o = put_len(o, 0xd9, len);
  return put_bytes(o, s, len);
}

static uint8_t *put_bin(uint8_t *o, const void *p, size_t len) {
  return put_bytes(put_len(o, 0xc4, len), p, len);
}

static uint8_t *put_map(uint8_t *o, size_t count) {
  if (count < 16)
    *o++ = (uint8_t)(0x80 | count);
  else
    o = put_be(o, 0xde, count, 2); /* at most KL_HEADERS_MAX pairs */
  return o;
}

/* The two's complement bits of @p v, without an implementation-defined
 * conversion. */
static uint64_t envelope_twos(int64_t v) {
  return v < 0 ? ~(uint64_t)(-(v + 1)) : (uint64_t)v;
}

static uint8_t *put_int(uint8_t *o, int64_t v) {
  if (v >= 0 && v < 128)
    *o++ = (uint8_t)v;
  else if (v >= 0)
    o = v < 256                   ? put_be(o, 0xcc, (uint64_t)v, 1)
        : v < 65536               ? put_be(o, 0xcd, (uint64_t)v, 2)
        : v < INT64_C(4294967296) ? put_be(o, 0xce, (uint64_t)v, 4)
                                  : put_be(o, 0xcf, (uint64_t)v, 8);
  else if (v >= -32)
    *o++ = (uint8_t)envelope_twos(v);
  else
    o = v >= -128                   ? put_be(o, 0xd0, envelope_twos(v), 1)
        : v >= -32768               ? put_be(o, 0xd1, envelope_twos(v), 2)
        : v >= -INT64_C(2147483648) ? put_be(o, 0xd2, envelope_twos(v), 4)
                                    : put_be(o, 0xd3, envelope_twos(v), 8);
  return o;
}

/* A field name: one of the envelope's fixstr names, "\xa1v" to "\xa2ts". */
static uint8_t *put_name(uint8_t *o, const char *name, size_t len) {
  *o++ = (uint8_t)(0xa0 | len);
  memcpy(o, name, len);
  return o + len;
}

size_t kl__envelope_write(const kl_event_t *event, uint8_t *buf) {
  int nb = event->not_before > 0;
  uint8_t *o = put_map(buf, 5 + (event->header_count > 0) + nb);
  o = put_int(put_name(o, "v", 1), nb ? 2 : 1);
  o = put_str(put_name(o, "id", 2), event->id, event->id_len);
  o = put_str(put_name(o, "t", 1), event->type, event->type_len);
  o = put_int(put_name(o, "ts", 2), event->ts);
  o = put_bin(put_name(o, "p", 1), event->payload, event->payload_len);
  if (event->header_count > 0) {
    o = put_map(put_name(o, "h", 1), event->header_count);
    for (size_t i = 0; i < event->header_count; i++) {
      const kl_header_t *h = &event->headers[i];
      o = put_str(o, h->name, h->name_len);
      o = put_str(o, h->value, h->value_len);
    }
  }
  if (nb)
    o = put_int(put_name(o, "nb", 2), event->not_before);
  return (size_t)(o - buf);
}

kl_err_t kl_event_encode(const kl_event_t *event, void **out, size_t *out_len) {
  kl__err_clear();
  if (out == NULL || out_len == NULL)
    return kl__err(KL_EINVAL, "kl_event_encode needs out and out_len");
  kl_err_t err = kl_event_validate(event, 0);
  if (err != KL_OK)
    return err;
  size_t size = kl__envelope_size(event);
  uint8_t *buf = malloc(size);
  if (buf == NULL)
    return kl__err(KL_ENOMEM, "cannot allocate a %zu-byte envelope", size);
  *out_len = kl__envelope_write(event, buf);
  *out = buf;
  return KL_OK;
}

/* ---- decoding ---- */

static kl_err_t envelope_truncated(const kl__mp_reader_t *rd, const char *where,
                                   uint64_t need) {
  if (rd->end == rd->begin)
    return kl__err(KL_EDECODE_TRUNCATED,
                   "message value is empty: no envelope (a tombstone?)");
  return kl__err(KL_EDECODE_TRUNCATED,
                 "envelope is truncated in %s at byte %zu: it needs %llu "
                 "bytes, %zu are left",
                 where, kl__mp_offset(rd), (unsigned long long)need,
                 (size_t)(rd->end - rd->p));
}

/* Reads the next item into @p mp; @p where names it in messages. */
static kl_err_t mp_next(kl__mp_reader_t *rd, kl__mp_item_t *mp,
                        const char *where) {
  uint64_t need = 0;
  if (kl__mp_next(rd, mp, &need) != KL__MP_OK)
    return envelope_truncated(rd, where, need);
  return KL_OK;
}

/* Envelope fields; a bit each in the decoder's seen-mask. */
enum { KL_F_V, KL_F_ID, KL_F_T, KL_F_TS, KL_F_P, KL_F_H, KL_F_NB, KL_F__COUNT };
static const char *const kl_field_names[KL_F__COUNT] = {"v", "id", "t", "ts",
                                                        "p", "h",  "nb"};
static const char *const kl_field_where[KL_F__COUNT] = {
    "field \"v\"", "field \"id\"", "field \"t\"", "field \"ts\"",
    "field \"p\"", "field \"h\"",  "field \"nb\""};

static int field_lookup(const uint8_t *s, uint64_t n) {
  if (n == 1)
    switch (s[0]) {
    case 'v':
      return KL_F_V;
    case 't':
      return KL_F_T;
    case 'p':
      return KL_F_P;
    case 'h':
      return KL_F_H;
    }
  if (n == 2 && s[0] == 'i' && s[1] == 'd')
    return KL_F_ID;
  if (n == 2 && s[0] == 't' && s[1] == 's')
    return KL_F_TS;
  if (n == 2 && s[0] == 'n' && s[1] == 'b')
    return KL_F_NB;
  return -1;
}

static kl_err_t wrong_type(const char *field, const kl__mp_item_t *mp,
                           const char *want) {
  return kl__err(KL_EDECODE_TYPE,
                 "envelope field \"%s\" is a msgpack %s, it must be %s", field,
                 mp->what, want);
}

static kl_err_t version_read(const kl__mp_item_t *mp, int *version) {
  if (mp->kind != KL__MP_INT)
    return wrong_type("v", mp, "an int");
  if (mp->big || mp->i < 1 || mp->i > KL_ENVELOPE_VERSION)
    return kl__err(KL_EDECODE_VERSION,
                   "envelope version \"v\" is %s%lld, this build reads "
                   "versions 1 to %d",
                   mp->big ? ">" : "", (long long)(mp->big ? INT64_MAX : mp->i),
                   KL_ENVELOPE_VERSION);
  *version = (int)mp->i;
  return KL_OK;
}

static kl_err_t str_read(int f, const kl__mp_item_t *mp, size_t max,
                         const char **s, size_t *len) {
  if (mp->kind != KL__MP_STR)
    return wrong_type(kl_field_names[f], mp, "a str");
  *s = (const char *)mp->body;
  *len = mp->n;
  return len_check(kl_field_names[f], mp->n, 1, max);
}

/* "ts" or "nb": ms since the epoch, an int64; "nb" positive. */
static kl_err_t time_read(int f, const kl__mp_item_t *mp, int64_t *ms) {
  const char *name = kl_field_names[f];
  if (mp->kind != KL__MP_INT || (f == KL_F_NB && !mp->big && mp->i <= 0))
    return wrong_type(name, mp,
                      f == KL_F_NB ? "a positive int (ms since the epoch)"
                                   : "an int (ms since the epoch)");
  if (mp->big)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "envelope field \"%s\" is %llu, the limit is %lld", name,
                   (unsigned long long)mp->n, (long long)INT64_MAX);
  *ms = mp->i;
  return KL_OK;
}

static kl_err_t payload_read(const kl__mp_item_t *mp, kl_event_t *ev) {
  if (mp->kind != KL__MP_BIN)
    return wrong_type("p", mp, "a bin");
  ev->payload = mp->body;
  ev->payload_len = mp->n;
  return len_check("p", mp->n, 0, KL_PAYLOAD_MAX);
}

static kl_err_t header_str(kl__mp_reader_t *rd, const char *where,
                           const char **s, size_t *len) {
  kl__mp_item_t mp;
  kl_err_t err = mp_next(rd, &mp, where);
  if (err != KL_OK)
    return err;
  if (mp.kind != KL__MP_STR)
    return kl__err(
        KL_EDECODE_TYPE,
        "envelope field \"h\" holds a msgpack %s as a %s, it must be a str",
        mp.what, where);
  *s = (const char *)mp.body;
  *len = mp.n;
  return KL_OK;
}

static kl_err_t headers_read(kl_decoder_t *decoder, kl__mp_reader_t *rd,
                             const kl__mp_item_t *mp, kl_event_t *ev) {
  if (mp->kind != KL__MP_MAP)
    return wrong_type("h", mp, "a map of str to str");
  if (mp->n > KL_HEADERS_MAX)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "envelope field \"h\" has %llu headers, the limit is %d",
                   (unsigned long long)mp->n, KL_HEADERS_MAX);
  kl_header_t *headers = decoder->headers;
  kl_err_t err = KL_OK;
  for (size_t i = 0; err == KL_OK && i < mp->n; i++) {
    err = header_str(rd, "header name", &headers[i].name, &headers[i].name_len);
    if (err == KL_OK)
      err = header_str(rd, "header value", &headers[i].value,
                       &headers[i].value_len);
    if (err == KL_OK)
      err = header_check(headers, i);
  }
  ev->headers = mp->n > 0 ? headers : NULL;
  ev->header_count = mp->n;
  return err;
}

static kl_err_t value_read(kl_decoder_t *decoder, kl__mp_reader_t *rd, int f,
                           const kl__mp_item_t *mp, int *version,
                           kl_event_t *ev) {
  switch (f) {
  case KL_F_V:
    return version_read(mp, version);
  case KL_F_ID: {
    kl_err_t err = str_read(f, mp, KL_ID_MAX, &ev->id, &ev->id_len);
    return err ? err : id_text_check(ev->id, ev->id_len);
  }
  case KL_F_T:
    return str_read(f, mp, KL_TYPE_MAX, &ev->type, &ev->type_len);
  case KL_F_TS:
    return time_read(f, mp, &ev->ts);
  case KL_F_NB:
    return time_read(f, mp, &ev->not_before);
  case KL_F_P:
    return payload_read(mp, ev);
  default:
    return headers_read(decoder, rd, mp, ev);
  }
}

static kl_err_t field_read(kl_decoder_t *decoder, kl__mp_reader_t *rd,
                           unsigned *seen, int *version, kl_event_t *ev) {
  kl__mp_item_t name, value;
  char shown[68];
  kl_err_t err = mp_next(rd, &name, "a field name");
  if (err != KL_OK)
    return err;
  if (name.kind != KL__MP_STR)
    return kl__err(KL_EDECODE_TYPE,
                   "envelope field names must be str, found a msgpack %s",
                   name.what);
  int f = field_lookup(name.body, name.n);
  if (f < 0)
    return kl__err(KL_EDECODE_UNKNOWN,
                   "envelope has a field \"%s\" that version %d does not "
                   "define (v, id, t, ts, p, h, nb)",
                   envelope_printable((const char *)name.body, name.n, shown),
                   KL_ENVELOPE_VERSION);
  if (*seen & (1u << f))
    return kl__err(KL_EDECODE_DUPLICATE, "envelope field \"%s\" appears twice",
                   kl_field_names[f]);
  *seen |= 1u << f;
  err = mp_next(rd, &value, kl_field_where[f]);
  return err == KL_OK ? value_read(decoder, rd, f, &value, version, ev) : err;
}

static kl_err_t fields_present(unsigned seen, int version) {
  for (int f = KL_F_V; f < KL_F_H; f++)
    if (!(seen & (1u << f)))
      return kl__err(KL_EDECODE_MISSING,
                     "envelope lacks the required field \"%s\"",
                     kl_field_names[f]);
  /* A version 1 producer cannot mean "not before": the field is not its. */
  if ((seen & (1u << KL_F_NB)) && version < 2)
    return kl__err(KL_EDECODE_UNKNOWN,
                   "envelope has the field \"nb\" (not before) but version "
                   "%d, which lacks it: a delayed event is version 2",
                   version);
  return KL_OK;
}

/* Fields are checked in the order they appear; kl_event_encode() writes v
 * first, so a newer producer's envelope fails on its version. */
static kl_err_t envelope_read(kl_decoder_t *decoder, kl__mp_reader_t *rd,
                              kl_event_t *ev) {
  kl__mp_item_t map;
  kl_err_t err = mp_next(rd, &map, "the envelope's first item");
  if (err != KL_OK)
    return err;
  if (map.kind != KL__MP_MAP)
    return kl__err(KL_EDECODE_NOT_MAP,
                   "envelope is a msgpack %s, it must be a map", map.what);
  /* A hostile count costs nothing: by the 8th pair a field repeats or is
   * unknown, or the bytes run out. */
  unsigned seen = 0;
  int version = 0;
  for (uint64_t i = 0; err == KL_OK && i < map.n; i++)
    err = field_read(decoder, rd, &seen, &version, ev);
  if (err == KL_OK && rd->p != rd->end)
    err = kl__err(KL_EDECODE_TRAILING,
                  "envelope ends at byte %zu of %zu; trailing bytes: %zu",
                  (size_t)(rd->p - rd->begin), (size_t)(rd->end - rd->begin),
                  (size_t)(rd->end - rd->p));
  return err == KL_OK ? fields_present(seen, version) : err;
}

kl_decoder_t *kl_decoder_new(void) {
  return calloc(1, sizeof(kl_decoder_t));
}

void kl_decoder_destroy(kl_decoder_t *decoder) {
  free(decoder);
}

kl_err_t kl_event_decode(kl_decoder_t *decoder, const void *key, size_t key_len,
                         const void *value, size_t value_len,
                         kl_event_t *event) {
  kl__err_clear();
  if (decoder == NULL || event == NULL)
    return kl__err(KL_EINVAL, "kl_event_decode needs a decoder and an event");
  kl_err_t err = ptr_check("message key", key, key_len);
  if (err == KL_OK)
    err = ptr_check("message value", value, value_len);
  if (err == KL_OK)
    err = key_check(key_len);
  if (err != KL_OK)
    return err;
  if (value_len > KL_ENVELOPE_MAX)
    return kl__err(KL_EDECODE_OVERSIZE,
                   "envelope is %zu bytes, the limit is %d", value_len,
                   KL_ENVELOPE_MAX);
  kl__mp_reader_t rd = kl__mp_reader(value, value_len);
  kl_event_t ev = {.key = key, .key_len = key_len};
  err = envelope_read(decoder, &rd, &ev);
  if (err == KL_OK)
    *event = ev;
  return err;
}
