/*
 * The envelope codec: round trips, and one exact error code for each kind of
 * malformed record, since that code is the reason a dead letter carries.
 * Malformed envelopes are built with msgpack-c's packer, an encoder
 * independent of the decoder under test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>
#include <pthread.h>

#include "common/internal.h"
#include "event/envelope.h"
#include "event/uuid.h"
#include "keylane/event.h"

#define assert_err(expr, want)                                                 \
  do {                                                                         \
    kl_err_t got_ = (expr);                                                    \
    if (got_ != (want))                                                        \
      fail_msg("%s: got %s (%s), want %s", #expr, kl_err_name(got_),           \
               kl_err_detail(), kl_err_name(want));                            \
  } while (0)

#define assert_detail(text)                                                    \
  do {                                                                         \
    if (strstr(kl_err_detail(), (text)) == NULL)                               \
      fail_msg("detail \"%s\" lacks \"%s\"", kl_err_detail(), (text));         \
  } while (0)

static const char KEY[] = "account-42";
static kl_decoder_t *decoder;

/* ---- building envelopes with msgpack-c ---- */

typedef void (*pack_fn)(msgpack_packer *pk);

typedef struct buf {
  char *data;
  size_t size;
} buf_t;

/* Build options: leave out one field, pack one field's value with fn, or
 * append one more pair (a duplicate of a standard field or an unknown one). */
typedef struct spec {
  const char *skip;
  const char *over;
  pack_fn fn;
  const char *extra;
  pack_fn extra_fn;
} spec_t;

static const char *const FIELDS[] = {"v", "id", "t", "ts", "p", "h"};
enum { NFIELDS = 6 };
static size_t g_len; /* the length the *_len packers use */

static void pack_cstr(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_fill_str(msgpack_packer *pk, size_t len, char c) {
  char *s = malloc(len + 1);
  memset(s, c, len);
  msgpack_pack_str(pk, len);
  msgpack_pack_str_body(pk, s, len);
  free(s);
}

static void pack_std(msgpack_packer *pk, const char *f) {
  if (strcmp(f, "v") == 0) {
    msgpack_pack_int(pk, 1);
  } else if (strcmp(f, "id") == 0) {
    pack_cstr(pk, "0190e6c1-8d2c-7a3b-8f00-0123456789ab");
  } else if (strcmp(f, "t") == 0) {
    pack_cstr(pk, "credit");
  } else if (strcmp(f, "ts") == 0) {
    msgpack_pack_int64(pk, 1700000000000);
  } else if (strcmp(f, "p") == 0) {
    msgpack_pack_bin(pk, 5);
    msgpack_pack_bin_body(pk, "hello", 5);
  } else {
    msgpack_pack_map(pk, 1);
    pack_cstr(pk, "trace");
    pack_cstr(pk, "abc");
  }
}

static buf_t build(spec_t s) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, NFIELDS - (s.skip != NULL) + (s.extra != NULL));
  for (int i = 0; i < NFIELDS; i++) {
    if (s.skip && strcmp(s.skip, FIELDS[i]) == 0)
      continue;
    pack_cstr(&pk, FIELDS[i]);
    if (s.over && strcmp(s.over, FIELDS[i]) == 0)
      s.fn(&pk);
    else
      pack_std(&pk, FIELDS[i]);
  }
  if (s.extra) {
    pack_cstr(&pk, s.extra);
    if (s.extra_fn)
      s.extra_fn(&pk);
    else
      pack_std(&pk, s.extra);
  }
  return (buf_t){sb.data, sb.size};
}

/* Decodes a copy of exactly @p len bytes, so ASan sees any overread. */
static kl_err_t decode_n(const void *value, size_t len) {
  void *copy = len > 0 ? malloc(len) : NULL;
  if (len > 0)
    memcpy(copy, value, len);
  kl_event_t ev;
  kl_err_t err = kl_event_decode(decoder, KEY, strlen(KEY), copy, len, &ev);
  free(copy);
  return err;
}

static kl_err_t decode_spec(spec_t s) {
  buf_t b = build(s);
  kl_err_t err = decode_n(b.data, b.size);
  free(b.data);
  return err;
}

static void pack_nil(msgpack_packer *pk) {
  msgpack_pack_nil(pk);
}
static void pack_true(msgpack_packer *pk) {
  msgpack_pack_true(pk);
}
static void pack_int(msgpack_packer *pk) {
  msgpack_pack_int(pk, 7);
}
static void pack_neg(msgpack_packer *pk) {
  msgpack_pack_int(pk, -7);
}
static void pack_float(msgpack_packer *pk) {
  msgpack_pack_double(pk, 1.0);
}
static void pack_str(msgpack_packer *pk) {
  pack_cstr(pk, "x");
}
static void pack_bin(msgpack_packer *pk) {
  msgpack_pack_bin(pk, 1);
  msgpack_pack_bin_body(pk, "x", 1);
}
static void pack_array(msgpack_packer *pk) {
  msgpack_pack_array(pk, 1);
  msgpack_pack_int(pk, 1);
}
static void pack_map(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "a");
  pack_cstr(pk, "b");
}
static void pack_ext(msgpack_packer *pk) {
  msgpack_pack_ext(pk, 1, 1);
  msgpack_pack_ext_body(pk, "x", 1);
}
static void pack_empty_str(msgpack_packer *pk) {
  pack_cstr(pk, "");
}
static void pack_str_len(msgpack_packer *pk) {
  pack_fill_str(pk, g_len, 'a');
}
static void pack_bin_len(msgpack_packer *pk) {
  char *p = calloc(1, g_len + 1);
  msgpack_pack_bin(pk, g_len);
  msgpack_pack_bin_body(pk, p, g_len);
  free(p);
}
/* h with g_len distinct headers "h0", "h1", ... */
static void pack_headers_n(msgpack_packer *pk) {
  msgpack_pack_map(pk, g_len);
  for (size_t i = 0; i < g_len; i++) {
    char name[24];
    snprintf(name, sizeof(name), "h%zu", i);
    pack_cstr(pk, name);
    pack_cstr(pk, "v");
  }
}
static void pack_header_name_len(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_fill_str(pk, g_len, 'n');
  pack_cstr(pk, "v");
}
static void pack_header_value_len(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "n");
  pack_fill_str(pk, g_len, 'v');
}
static void pack_header_int_name(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  msgpack_pack_int(pk, 1);
  pack_cstr(pk, "v");
}
static void pack_header_int_value(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "n");
  msgpack_pack_int(pk, 1);
}
static void pack_header_bin_value(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "n");
  pack_bin(pk);
}
static void pack_header_nil_value(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "n");
  msgpack_pack_nil(pk);
}
static void pack_header_dup(msgpack_packer *pk) {
  msgpack_pack_map(pk, 2);
  pack_cstr(pk, "n");
  pack_cstr(pk, "1");
  pack_cstr(pk, "n");
  pack_cstr(pk, "2");
}
static void pack_header_empty_value(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "n");
  pack_cstr(pk, "");
}
static void pack_header_empty_name(msgpack_packer *pk) {
  msgpack_pack_map(pk, 1);
  pack_cstr(pk, "");
  pack_cstr(pk, "v");
}

/* ---- events ---- */

static int events_equal(const kl_event_t *a, const kl_event_t *b) {
  if (a->key_len != b->key_len || memcmp(a->key, b->key, a->key_len) ||
      a->id_len != b->id_len || memcmp(a->id, b->id, a->id_len) ||
      a->type_len != b->type_len || memcmp(a->type, b->type, a->type_len) ||
      a->ts != b->ts || a->payload_len != b->payload_len ||
      a->header_count != b->header_count)
    return 0;
  if (a->payload_len && memcmp(a->payload, b->payload, a->payload_len))
    return 0;
  for (size_t i = 0; i < a->header_count; i++) {
    const kl_header_t *x = &a->headers[i], *y = &b->headers[i];
    if (x->name_len != y->name_len || memcmp(x->name, y->name, x->name_len) ||
        x->value_len != y->value_len ||
        (x->value_len && memcmp(x->value, y->value, x->value_len)))
      return 0;
  }
  return 1;
}

static const kl_header_t HEADERS[] = {
    {"trace", 5, "00-4bf92f3577b34da6-01", 22},
    {"source", 6, "billing", 7},
    {"empty", 5, "", 0},
};

static kl_event_t sample_event(void) {
  return (kl_event_t){.key = KEY,
                      .key_len = strlen(KEY),
                      .id = "0190e6c1-8d2c-7a3b-8f00-0123456789ab",
                      .id_len = 36,
                      .type = "credit",
                      .type_len = 6,
                      .ts = 1700000000123,
                      .payload = "{\"amount\":5}",
                      .payload_len = 12,
                      .headers = HEADERS,
                      .header_count = 3};
}

/* Encodes @p in, decodes it and checks every field came back. */
static void roundtrip(const kl_event_t *in) {
  void *buf = NULL;
  size_t len = 0;
  kl_event_t out;
  assert_err(kl_event_encode(in, &buf, &len), KL_OK);
  assert_true(len <= KL_ENVELOPE_MAX);
  assert_err(kl_event_decode(decoder, in->key, in->key_len, buf, len, &out),
             KL_OK);
  assert_true(events_equal(in, &out));
  free(buf);
}

static int group_setup(void **state) {
  decoder = kl_decoder_new();
  return decoder ? 0 : -1;
}

static int group_teardown(void **state) {
  kl_decoder_destroy(decoder);
  return 0;
}

/* ---- round trips ---- */

static void test_roundtrip_full(void **state) {
  kl_event_t ev = sample_event();
  roundtrip(&ev);
  ev.ts = INT64_MIN;
  roundtrip(&ev);
  ev.ts = INT64_MAX;
  roundtrip(&ev);
}

static void test_roundtrip_no_headers(void **state) {
  kl_event_t ev = sample_event();
  ev.headers = NULL;
  ev.header_count = 0;
  roundtrip(&ev);
}

static void test_roundtrip_empty_payload(void **state) {
  kl_event_t ev = sample_event();
  ev.payload = NULL;
  ev.payload_len = 0;
  roundtrip(&ev);
}

static void test_roundtrip_max_sizes(void **state) {
  static kl_header_t headers[KL_HEADERS_MAX];
  static char names[KL_HEADERS_MAX][KL_HEADER_NAME_MAX];
  static char value[KL_HEADER_VALUE_MAX];
  static char key[KL_KEY_MAX], id[KL_ID_MAX], type[KL_TYPE_MAX];
  char *payload = malloc(KL_PAYLOAD_MAX);
  memset(payload, 0xab, KL_PAYLOAD_MAX);
  memset(value, 'v', sizeof(value));
  memset(key, 'k', sizeof(key));
  memset(id, 'i', sizeof(id));
  memset(type, 't', sizeof(type));
  for (int i = 0; i < KL_HEADERS_MAX; i++) {
    memset(names[i], 'n', KL_HEADER_NAME_MAX);
    names[i][0] = (char)('A' + i); /* distinct names */
    headers[i] =
        (kl_header_t){names[i], KL_HEADER_NAME_MAX, value, KL_HEADER_VALUE_MAX};
  }
  kl_event_t ev = {key,       KL_KEY_MAX,     id,
                   KL_ID_MAX, type,           KL_TYPE_MAX,
                   INT64_MAX, payload,        KL_PAYLOAD_MAX,
                   headers,   KL_HEADERS_MAX, INT64_MAX};
  roundtrip(&ev);
  free(payload);
}

/* The event points into the value buffer: nothing is copied. */
static void test_decode_borrows_value(void **state) {
  kl_event_t in = sample_event(), out;
  void *buf;
  size_t len;
  assert_err(kl_event_encode(&in, &buf, &len), KL_OK);
  assert_err(kl_event_decode(decoder, KEY, 10, buf, len, &out), KL_OK);
  const char *lo = buf, *hi = lo + len;
  assert_ptr_equal(out.key, KEY);
  assert_true(out.id > lo && out.id + out.id_len <= hi);
  assert_true(out.type > lo && out.type + out.type_len <= hi);
  assert_true((const char *)out.payload > lo &&
              (const char *)out.payload + out.payload_len <= hi);
  assert_true(out.headers[0].name > lo && out.headers[2].value <= hi);
  free(buf);
}

/* Other encoders may pick wider formats than msgpack-c; all are valid. */
static void test_decode_wide_formats(void **state) {
  static const uint8_t wide[] = {
      0xdf, 0,   0,    0,    6, /* map32 */
      0xd9, 1,   'v',  0xcf, 0,    0,    0,   0,    0,
      0,    0,   1, /* str8, uint64 */
      0xda, 0,   2,    'i',  'd',  0xdb, 0,   0,    0,
      1,    'X',                  /* str16, str32 */
      0xa1, 't', 0xd9, 1,    'c', /* str8 */
      0xa2, 't', 's',  0xd3, 0x80, 0,    0,   0,    0,
      0,    0,   0,                                      /* int64 min */
      0xa1, 'p', 0xc6, 0,    0,    0,    2,   'h',  'i', /* bin32 */
      0xa1, 'h', 0xde, 0,    1,    0xa1, 'a', 0xda, 0,
      0, /* map16, str16 "" */
  };
  kl_event_t ev;
  assert_err(kl_event_decode(decoder, KEY, 10, wide, sizeof(wide), &ev), KL_OK);
  assert_int_equal(ev.id_len, 1);
  assert_int_equal(ev.ts, INT64_MIN);
  assert_int_equal(ev.payload_len, 2);
  assert_int_equal(ev.header_count, 1);
  assert_int_equal(ev.headers[0].value_len, 0);
  static const uint8_t negs[] = {0x85, 0xa1, 'v',  0xd0, 1,    0xa2, 'i',  'd',
                                 0xa1, 'X',  0xa1, 't',  0xa1, 'c',  0xa2, 't',
                                 's',  0xd1, 0xff, 0x38, 0xa1, 'p',  0xc4, 0};
  assert_err(kl_event_decode(decoder, KEY, 10, negs, sizeof(negs), &ev), KL_OK);
  assert_int_equal(ev.ts, -200);
  assert_null(ev.headers);
}

/* ---- malformed input ---- */

static void test_truncated_every_offset(void **state) {
  kl_event_t ev = sample_event();
  void *buf;
  size_t len;
  assert_err(kl_event_encode(&ev, &buf, &len), KL_OK);
  for (size_t n = 0; n < len; n++)
    assert_err(decode_n(buf, n), KL_EDECODE_TRUNCATED);
  assert_err(decode_n(buf, len), KL_OK);
  free(buf);
}

static void test_wrong_types(void **state) {
  static const struct {
    const char *name;
    pack_fn fn;
    int ok_for; /* bit per field index for which this kind is right */
  } kinds[] = {
      {"nil", pack_nil, 0},     {"bool", pack_true, 0},
      {"int", pack_int, 1 | 8}, {"negative int", pack_neg, 1 | 8},
      {"float", pack_float, 0}, {"str", pack_str, 2 | 4},
      {"bin", pack_bin, 16},    {"array", pack_array, 0},
      {"map", pack_map, 32},    {"ext", pack_ext, 0},
  };
  for (int f = 0; f < NFIELDS; f++)
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      if (kinds[k].ok_for & (1 << f))
        continue;
      kl_err_t err =
          decode_spec((spec_t){.over = FIELDS[f], .fn = kinds[k].fn});
      if (err != KL_EDECODE_TYPE)
        fail_msg("field %s as %s: got %s", FIELDS[f], kinds[k].name,
                 kl_err_name(err));
    }
}

static void test_header_wrong_types(void **state) {
  pack_fn bad[] = {pack_header_int_name, pack_header_int_value,
                   pack_header_bin_value, pack_header_nil_value};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_err(decode_spec((spec_t){.over = "h", .fn = bad[i]}),
               KL_EDECODE_TYPE);
}

static void test_field_name_not_str(void **state) {
  static const uint8_t in[] = {0x81, 0x01, 0x01};
  assert_err(decode_n(in, sizeof(in)), KL_EDECODE_TYPE);
}

static void test_limits_exceeded_by_one(void **state) {
  g_len = KL_ID_MAX;
  assert_err(decode_spec((spec_t){.over = "id", .fn = pack_str_len}), KL_OK);
  g_len = KL_ID_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "id", .fn = pack_str_len}),
             KL_EDECODE_OVERSIZE);
  assert_detail("envelope field \"id\" is 256 bytes, the limit is 255");
  g_len = KL_TYPE_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "t", .fn = pack_str_len}),
             KL_EDECODE_OVERSIZE);
  g_len = KL_PAYLOAD_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "p", .fn = pack_bin_len}),
             KL_EDECODE_OVERSIZE);
  g_len = KL_HEADERS_MAX;
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_headers_n}), KL_OK);
  g_len = KL_HEADERS_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_headers_n}),
             KL_EDECODE_OVERSIZE);
  g_len = KL_HEADER_NAME_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_name_len}),
             KL_EDECODE_OVERSIZE);
  g_len = KL_HEADER_VALUE_MAX;
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_value_len}),
             KL_OK);
  g_len = KL_HEADER_VALUE_MAX + 1;
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_value_len}),
             KL_EDECODE_OVERSIZE);
}

static void test_ts_beyond_int64(void **state) {
  static const uint8_t in[] = {0x85, 0xa1, 'v', 1,    0xa2, 'i',  'd', 0xa1,
                               'X',  0xa1, 't', 0xa1, 'c',  0xa2, 't', 's',
                               0xcf, 0x80, 0,   0,    0,    0,    0,   0,
                               0,    0xa1, 'p', 0xc4, 0};
  assert_err(decode_n(in, sizeof(in)), KL_EDECODE_OVERSIZE);
}

/* Rejected from its length alone, before a byte is parsed. */
static void test_envelope_too_large(void **state) {
  size_t len = KL_ENVELOPE_MAX + 1;
  char *big = malloc(len);
  memset(big, 0xc1, len); /* not msgpack at all */
  kl_event_t ev;
  assert_err(kl_event_decode(decoder, KEY, 10, big, len, &ev),
             KL_EDECODE_OVERSIZE);
  free(big);
}

static void test_key_limits(void **state) {
  static char key[KL_KEY_MAX + 1];
  buf_t b = build((spec_t){0});
  kl_event_t ev;
  assert_err(kl_event_decode(decoder, key, 0, b.data, b.size, &ev),
             KL_EDECODE_KEY);
  assert_err(kl_event_decode(decoder, NULL, 0, b.data, b.size, &ev),
             KL_EDECODE_KEY);
  assert_err(kl_event_decode(decoder, key, 1, b.data, b.size, &ev), KL_OK);
  assert_err(kl_event_decode(decoder, key, KL_KEY_MAX, b.data, b.size, &ev),
             KL_OK);
  assert_err(kl_event_decode(decoder, key, KL_KEY_MAX + 1, b.data, b.size, &ev),
             KL_EDECODE_KEY);
  assert_detail("1025");
  free(b.data);
}

static void pack_v0(msgpack_packer *pk) {
  msgpack_pack_int(pk, 0);
}
static void pack_v2(msgpack_packer *pk) {
  msgpack_pack_int(pk, 2);
}
static void pack_v3(msgpack_packer *pk) {
  msgpack_pack_int(pk, 3);
}
static void pack_vneg(msgpack_packer *pk) {
  msgpack_pack_int(pk, -1);
}
static void pack_vhuge(msgpack_packer *pk) {
  msgpack_pack_uint64(pk, UINT64_MAX);
}

static void test_unknown_version(void **state) {
  pack_fn versions[] = {pack_v0, pack_v3, pack_vneg, pack_vhuge};
  for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++)
    assert_err(decode_spec((spec_t){.over = "v", .fn = versions[i]}),
               KL_EDECODE_VERSION);
  assert_err(decode_spec((spec_t){.over = "v", .fn = pack_v3}),
             KL_EDECODE_VERSION);
  assert_detail("is 3");
  assert_detail("versions 1 to 2");
  /* version 2 without "nb": an event applied when read, like version 1 */
  assert_err(decode_spec((spec_t){.over = "v", .fn = pack_v2}), KL_OK);
}

static void pack_nb(msgpack_packer *pk) {
  msgpack_pack_int64(pk, INT64_C(1700000000000));
}
static void pack_nb_zero(msgpack_packer *pk) {
  msgpack_pack_int(pk, 0);
}
static void pack_nb_neg(msgpack_packer *pk) {
  msgpack_pack_int(pk, -5);
}
static void pack_nb_huge(msgpack_packer *pk) {
  msgpack_pack_uint64(pk, UINT64_MAX);
}

/* "nb" (not before) is version 2's: a version 1 envelope that carries it
 * was not written by a producer that meant it, and a worker too old for
 * timers refuses version 2 rather than apply the event early. */
static void test_not_before(void **state) {
  buf_t b = build(
      (spec_t){.over = "v", .fn = pack_v2, .extra = "nb", .extra_fn = pack_nb});
  kl_event_t ev;
  assert_err(kl_event_decode(decoder, KEY, strlen(KEY), b.data, b.size, &ev),
             KL_OK);
  assert_int_equal(ev.not_before, INT64_C(1700000000000));
  free(b.data);
  assert_err(decode_spec((spec_t){.extra = "nb", .extra_fn = pack_nb}),
             KL_EDECODE_UNKNOWN);
  assert_detail("version 1, which lacks it");
  pack_fn bad[] = {pack_nb_zero, pack_nb_neg, pack_nil};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_err(
        decode_spec((spec_t){
            .over = "v", .fn = pack_v2, .extra = "nb", .extra_fn = bad[i]}),
        KL_EDECODE_TYPE);
  assert_err(
      decode_spec((spec_t){
          .over = "v", .fn = pack_v2, .extra = "nb", .extra_fn = pack_nb_huge}),
      KL_EDECODE_OVERSIZE);
  /* encoded: version 2 and "nb" exactly when there is a not_before */
  ev = sample_event();
  ev.not_before = 1;
  void *out;
  size_t len;
  assert_err(kl_event_encode(&ev, &out, &len), KL_OK);
  kl_event_t back;
  assert_err(kl_event_decode(decoder, ev.key, ev.key_len, out, len, &back),
             KL_OK);
  assert_int_equal(back.not_before, 1);
  assert_memory_equal((const char *)out + 1, "\xa1v\x02", 3);
  free(out);
  ev.not_before = -1;
  assert_err(kl_event_validate(&ev, 0), KL_EINVAL);
  assert_detail("not_before is -1");
}

/* A type beginning with '~' is keylane's: neither a client nor another
 * producer may use one. */
static void test_reserved_types(void **state) {
  kl_event_t ev = sample_event();
  ev.type = "~timer";
  ev.type_len = 6;
  for (int own = 0; own < 2; own++) {
    assert_err(kl__reserved_check(&ev, own), KL_EINVAL);
    assert_detail("keeps for its own records");
  }
  ev.type = "x~";
  ev.type_len = 2;
  assert_err(kl__reserved_check(&ev, 0), KL_OK);
}

static void test_missing_each_field(void **state) {
  for (int f = 0; f < NFIELDS - 1; f++) {
    assert_err(decode_spec((spec_t){.skip = FIELDS[f]}), KL_EDECODE_MISSING);
    char quoted[8];
    snprintf(quoted, sizeof(quoted), "\"%s\"", FIELDS[f]);
    assert_detail(quoted);
  }
  assert_err(decode_spec((spec_t){.skip = "h"}), KL_OK);
  static const uint8_t empty_map[] = {0x80};
  assert_err(decode_n(empty_map, 1), KL_EDECODE_MISSING);
}

static void test_empty_fields(void **state) {
  assert_err(decode_spec((spec_t){.over = "id", .fn = pack_empty_str}),
             KL_EDECODE_EMPTY);
  assert_detail("\"id\"");
  assert_err(decode_spec((spec_t){.over = "t", .fn = pack_empty_str}),
             KL_EDECODE_EMPTY);
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_empty_name}),
             KL_EDECODE_EMPTY);
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_empty_value}),
             KL_OK);
}

static const char *g_id; /* what pack_g_id packs, g_len bytes */

static void pack_g_id(msgpack_packer *pk) {
  msgpack_pack_str(pk, g_len);
  msgpack_pack_str_body(pk, g_id, g_len);
}

/* An id is UTF-8 text without NUL, as the gateway takes it from JSON: the
 * decoder refuses any other, and kl_event_validate() too, so no producer
 * writes one the workers would dead-letter. */
static void test_id_must_be_utf8_text(void **state) {
  static const struct {
    const char *id;
    size_t len;
    kl_err_t want;
  } ids[] = {
      {"plain-id", 8, KL_OK},
      {"caf\xc3\xa9", 5, KL_OK},
      {"\xe2\x82\xac-\xf0\x9f\x98\x80", 8, KL_OK},
      {"\xff", 1, KL_EDECODE_TYPE},
      {"ab\xfe\xfe", 4, KL_EDECODE_TYPE},
      {"\xc0\x80", 2, KL_EDECODE_TYPE},         /* overlong NUL */
      {"\xe0\x80\xaf", 3, KL_EDECODE_TYPE},     /* overlong '/' */
      {"\xed\xa0\x80", 3, KL_EDECODE_TYPE},     /* a surrogate */
      {"\xf4\x90\x80\x80", 4, KL_EDECODE_TYPE}, /* above U+10FFFF */
      {"x\xe2\x82", 3, KL_EDECODE_TYPE},        /* cut short */
      {"a\0b", 3, KL_EDECODE_TYPE},
  };
  for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
    g_id = ids[i].id;
    g_len = ids[i].len;
    kl_err_t got = decode_spec((spec_t){.over = "id", .fn = pack_g_id});
    if (got != ids[i].want)
      fail_msg("id %zu: decode gave %s", i, kl_err_name(got));
    if (got)
      assert_detail("\"id\"");
    kl_event_t ev = sample_event();
    ev.id = ids[i].id;
    ev.id_len = ids[i].len;
    got = kl_event_validate(&ev, 0);
    if (got != ids[i].want)
      fail_msg("id %zu: validate gave %s", i, kl_err_name(got));
  }
}

static void test_duplicate_fields(void **state) {
  for (int f = 0; f < NFIELDS; f++)
    assert_err(decode_spec((spec_t){.extra = FIELDS[f]}), KL_EDECODE_DUPLICATE);
  assert_err(decode_spec((spec_t){.over = "h", .fn = pack_header_dup}),
             KL_EDECODE_DUPLICATE);
}

static void test_unknown_field(void **state) {
  assert_err(decode_spec((spec_t){.extra = "x", .extra_fn = pack_int}),
             KL_EDECODE_UNKNOWN);
  assert_detail("\"x\"");
  assert_err(decode_spec((spec_t){.extra = "V", .extra_fn = pack_int}),
             KL_EDECODE_UNKNOWN);
}

static void test_trailing_bytes(void **state) {
  buf_t b = build((spec_t){0});
  char *twice = malloc(2 * b.size);
  memcpy(twice, b.data, b.size);
  memcpy(twice + b.size, b.data, b.size);
  assert_err(decode_n(twice, b.size + 1), KL_EDECODE_TRAILING);
  assert_err(decode_n(twice, 2 * b.size), KL_EDECODE_TRAILING);
  free(twice);
  free(b.data);
}

static void test_not_a_map(void **state) {
  static const uint8_t array[] = {0x91, 0x01};
  static const uint8_t str[] = {0xa1, 'v'};
  static const uint8_t num[] = {0x01};
  static const uint8_t nil[] = {0xc0};
  static const uint8_t bin[] = {0xc4, 0x00};
  static const uint8_t unused[] = {0xc1};
  assert_err(decode_n(array, sizeof(array)), KL_EDECODE_NOT_MAP);
  assert_err(decode_n(str, sizeof(str)), KL_EDECODE_NOT_MAP);
  assert_err(decode_n(num, sizeof(num)), KL_EDECODE_NOT_MAP);
  assert_err(decode_n(nil, sizeof(nil)), KL_EDECODE_NOT_MAP);
  assert_err(decode_n(bin, sizeof(bin)), KL_EDECODE_NOT_MAP);
  assert_err(decode_n(unused, sizeof(unused)), KL_EDECODE_NOT_MAP);
}

/* A map that claims 4G pairs must cost nothing: no allocation, no loop. */
static void test_hostile_counts(void **state) {
  static const uint8_t map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t h[] = {0x81, 0xa1, 'h', 0xdf, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t p[] = {0x81, 0xa1, 'p', 0xc6, 0xff, 0xff, 0xff, 0xff};
  assert_err(decode_n(map, sizeof(map)), KL_EDECODE_TRUNCATED);
  assert_err(decode_n(h, sizeof(h)), KL_EDECODE_OVERSIZE);
  assert_err(decode_n(p, sizeof(p)), KL_EDECODE_TRUNCATED);
}

static void test_decode_failure_keeps_event(void **state) {
  kl_event_t ev = sample_event(), before = ev;
  static const uint8_t nil[] = {0xc0};
  assert_err(kl_event_decode(decoder, KEY, 10, nil, 1, &ev),
             KL_EDECODE_NOT_MAP);
  assert_memory_equal(&ev, &before, sizeof(ev));
}

static void test_bad_arguments(void **state) {
  kl_event_t ev;
  assert_err(kl_event_decode(NULL, KEY, 10, "\x80", 1, &ev), KL_EINVAL);
  assert_err(kl_event_decode(decoder, KEY, 10, "\x80", 1, NULL), KL_EINVAL);
  assert_err(kl_event_decode(decoder, KEY, 10, NULL, 5, &ev), KL_EINVAL);
  assert_err(kl_event_decode(decoder, NULL, 5, "\x80", 1, &ev), KL_EINVAL);
  assert_err(kl_event_decode(decoder, KEY, 10, NULL, 0, &ev),
             KL_EDECODE_TRUNCATED);
  kl_decoder_destroy(NULL);
}

/* ---- validate and encode ---- */

static void test_validate(void **state) {
  kl_event_t ev = sample_event();
  assert_err(kl_event_validate(&ev, 0), KL_OK);
  assert_err(kl_event_validate(NULL, 0), KL_EINVAL);
  ev.id = NULL;
  ev.id_len = 0;
  assert_err(kl_event_validate(&ev, 1), KL_OK);
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_EMPTY);
  ev.id_len = 3;
  assert_err(kl_event_validate(&ev, 1), KL_EINVAL);
  ev = sample_event();
  ev.key_len = KL_KEY_MAX + 1;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_KEY);
  ev = sample_event();
  ev.id_len = KL_ID_MAX + 1;
  assert_err(kl_event_validate(&ev, 1), KL_EDECODE_OVERSIZE);
  ev = sample_event();
  ev.type_len = 0;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_EMPTY);
  ev.type_len = KL_TYPE_MAX + 1;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_OVERSIZE);
  ev = sample_event();
  ev.payload_len = KL_PAYLOAD_MAX + 1;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_OVERSIZE);
  ev.payload = NULL;
  ev.payload_len = 1;
  assert_err(kl_event_validate(&ev, 0), KL_EINVAL);
}

static void test_validate_headers(void **state) {
  kl_event_t ev = sample_event();
  kl_header_t h[2] = {{"a", 1, "x", 1}, {"a", 1, "y", 1}};
  ev.headers = h;
  ev.header_count = 2;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_DUPLICATE);
  h[1].name_len = 0;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_EMPTY);
  h[1] = (kl_header_t){"b", KL_HEADER_NAME_MAX + 1, "y", 1};
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_OVERSIZE);
  h[1] = (kl_header_t){"b", 1, "y", KL_HEADER_VALUE_MAX + 1};
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_OVERSIZE);
  h[1] = (kl_header_t){"b", 1, NULL, 1};
  assert_err(kl_event_validate(&ev, 0), KL_EINVAL);
  ev.header_count = KL_HEADERS_MAX + 1;
  assert_err(kl_event_validate(&ev, 0), KL_EDECODE_OVERSIZE);
  ev.headers = NULL;
  ev.header_count = 1;
  assert_err(kl_event_validate(&ev, 0), KL_EINVAL);
}

/* Failure leaves *out untouched; the id is required on the wire. */
static void test_encode_rejects_invalid(void **state) {
  kl_event_t ev = sample_event();
  void *buf = (void *)&ev;
  size_t len = 77;
  ev.id_len = 0;
  assert_err(kl_event_encode(&ev, &buf, &len), KL_EDECODE_EMPTY);
  assert_ptr_equal(buf, &ev);
  assert_int_equal(len, 77);
  assert_err(kl_event_encode(&ev, NULL, &len), KL_EINVAL);
}

/* ---- the bytes on the wire ---- */

/* The envelope as msgpack-c's packer writes it, field by field in
 * kl_event_encode()'s order: the reference the encoder's bytes must equal,
 * so that envelopes stay byte-identical to those published before it wrote
 * msgpack itself (and to what other msgpack encoders produce). */
static void pack_ref_str(msgpack_packer *pk, const char *s, size_t len) {
  msgpack_pack_str(pk, len);
  if (len > 0) /* the body would memcpy() from NULL */
    msgpack_pack_str_body(pk, s, len);
}

static void pack_ref_bin(msgpack_packer *pk, const void *p, size_t len) {
  msgpack_pack_bin(pk, len);
  if (len > 0)
    msgpack_pack_bin_body(pk, p, len);
}

static buf_t pack_reference(const kl_event_t *ev) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5 + (ev->header_count > 0) + (ev->not_before > 0));
  pack_cstr(&pk, "v");
  msgpack_pack_int(&pk, ev->not_before > 0 ? 2 : 1);
  pack_cstr(&pk, "id");
  pack_ref_str(&pk, ev->id, ev->id_len);
  pack_cstr(&pk, "t");
  pack_ref_str(&pk, ev->type, ev->type_len);
  pack_cstr(&pk, "ts");
  msgpack_pack_int64(&pk, ev->ts);
  pack_cstr(&pk, "p");
  pack_ref_bin(&pk, ev->payload, ev->payload_len);
  if (ev->header_count > 0) {
    pack_cstr(&pk, "h");
    msgpack_pack_map(&pk, ev->header_count);
    for (size_t i = 0; i < ev->header_count; i++) {
      const kl_header_t *h = &ev->headers[i];
      pack_ref_str(&pk, h->name, h->name_len);
      pack_ref_str(&pk, h->value, h->value_len);
    }
  }
  if (ev->not_before > 0) {
    pack_cstr(&pk, "nb");
    msgpack_pack_int64(&pk, ev->not_before);
  }
  return (buf_t){sb.data, sb.size};
}

static void assert_bytes_as_msgpack_c(const kl_event_t *ev) {
  void *buf = NULL;
  size_t len = 0;
  assert_err(kl_event_encode(ev, &buf, &len), KL_OK);
  buf_t want = pack_reference(ev);
  if (len != want.size || memcmp(buf, want.data, len) != 0)
    fail_msg("ts %lld, id %zu, type %zu, payload %zu, %zu headers: %zu bytes, "
             "msgpack-c writes %zu",
             (long long)ev->ts, ev->id_len, ev->type_len, ev->payload_len,
             ev->header_count, len, want.size);
  free(buf);
  free(want.data);
}

/* Every width boundary of every form the envelope uses. */
static void test_encode_bytes_as_msgpack_c(void **state) {
  static const int64_t ts[] = {0,
                               1,
                               127,
                               128,
                               255,
                               256,
                               65535,
                               65536,
                               INT64_C(4294967295),
                               INT64_C(4294967296),
                               INT64_C(1700000000123),
                               INT64_MAX,
                               -1,
                               -32,
                               -33,
                               -128,
                               -129,
                               -32768,
                               -32769,
                               INT32_MIN,
                               (int64_t)INT32_MIN - 1,
                               INT64_MIN};
  static const size_t strs[] = {1, 31, 32, 255};
  static const size_t bins[] = {0, 1, 255, 256, 65535, 65536, KL_PAYLOAD_MAX};
  static const size_t values[] = {0, 31, 32, 255, 256, 4096};
  static const size_t counts[] = {0, 1, 15, 16, KL_HEADERS_MAX};
  static char text[KL_HEADER_VALUE_MAX];
  static char names[KL_HEADERS_MAX][2];
  static kl_header_t headers[KL_HEADERS_MAX];
  uint8_t *payload = malloc(KL_PAYLOAD_MAX);
  memset(payload, 0x5a, KL_PAYLOAD_MAX);
  memset(text, 'x', sizeof(text));
  kl_event_t ev = sample_event();
  for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
    ev.ts = ts[i];
    assert_bytes_as_msgpack_c(&ev);
    ev.not_before = ts[i] > 0 ? ts[i] : 0;
    assert_bytes_as_msgpack_c(&ev);
    ev.not_before = 0;
  }
  for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
    ev = sample_event();
    ev.id = ev.type = text;
    ev.id_len = ev.type_len = strs[i];
    assert_bytes_as_msgpack_c(&ev);
  }
  for (size_t i = 0; i < sizeof(bins) / sizeof(bins[0]); i++) {
    ev = sample_event();
    ev.payload = bins[i] ? payload : NULL;
    ev.payload_len = bins[i];
    assert_bytes_as_msgpack_c(&ev);
  }
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
    for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
      for (size_t i = 0; i < counts[c]; i++) {
        names[i][0] = (char)('0' + i / 10); /* "00".."63": distinct */
        names[i][1] = (char)('0' + i % 10);
        headers[i] = (kl_header_t){names[i], 2, text, values[v]};
      }
      ev = sample_event();
      ev.headers = counts[c] ? headers : NULL;
      ev.header_count = counts[c];
      assert_bytes_as_msgpack_c(&ev);
    }
  free(payload);
}

/* ---- ids ---- */

static void assert_uuid7(const char *id) {
  assert_int_equal(strlen(id), 36);
  for (int i = 0; i < 36; i++) {
    if (i == 8 || i == 13 || i == 18 || i == 23)
      assert_int_equal(id[i], '-');
    else
      assert_non_null(strchr("0123456789abcdef", id[i]));
  }
  assert_int_equal(id[14], '7');
  assert_non_null(strchr("89ab", id[19]));
}

static int64_t uuid_ms(const char *id) {
  char hex[13];
  memcpy(hex, id, 8);
  memcpy(hex + 8, id + 9, 4);
  hex[12] = '\0';
  return (int64_t)strtoll(hex, NULL, 16);
}

static void test_make_id_format(void **state) {
  char id[37];
  int64_t before = kl__now_ms();
  kl_event_make_id(id);
  int64_t after = kl__now_ms();
  assert_uuid7(id);
  assert_in_range(uuid_ms(id), before, after + 1);
  kl_event_t ev = sample_event();
  ev.id = id;
  ev.id_len = strlen(id);
  roundtrip(&ev);
}

/* Strictly increasing, so also unique, however fast they are made. */
static void test_make_id_ordered(void **state) {
  enum { N = 200000 };
  char prev[37], id[37];
  kl_event_make_id(prev);
  for (int i = 0; i < N; i++) {
    kl_event_make_id(id);
    assert_uuid7(id);
    if (strcmp(prev, id) >= 0)
      fail_msg("id %d: %s is not above %s", i, id, prev);
    memcpy(prev, id, sizeof(id));
  }
}

enum { THREADS = 4, PER_THREAD = 20000 };
static char thread_ids[THREADS][PER_THREAD][37];

/* A made id reads back into its bytes and writes out the same; uppercase,
 * a wrong length or a misplaced dash is no canonical UUID. */
static void test_uuid_parse_format(void **state) {
  (void)state;
  char id[37], text[36];
  uint8_t b[16];
  kl_event_make_id(id);
  assert_int_equal(kl__uuid_parse(id, 36, b), 0);
  kl__uuid_format(b, text);
  assert_memory_equal(text, id, 36);
  const char *ok = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
  assert_int_equal(kl__uuid_parse(ok, 36, b), 0);
  assert_int_equal(b[0], 0x01);
  assert_int_equal(b[15], 0x5b);
  assert_int_equal(
      kl__uuid_parse("0190A1B2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", 36, b), -1);
  assert_int_equal(kl__uuid_parse(ok, 35, b), -1);
  assert_int_equal(
      kl__uuid_parse("0190a1b2c-3d4-7e5f-8a9b-0c1d2e3f4a5b", 36, b), -1);
  assert_int_equal(
      kl__uuid_parse("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5g", 36, b), -1);
  /* Every byte value at every position writes as printf's %02x. */
  for (int v = 0; v < 256; v++) {
    char want[37];
    for (int i = 0; i < 16; i++)
      b[i] = (uint8_t)(v + 37 * i);
    snprintf(want, sizeof(want),
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
             "%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
             b[11], b[12], b[13], b[14], b[15]);
    kl__uuid_format(b, text);
    assert_memory_equal(text, want, 36);
  }
}

/* Every byte value at every digit of a UUID: a lowercase hex digit parses
 * to its value, anything else (uppercase, a byte over 0x7f) refuses the
 * whole id; kl__uuid_parse() looks its digits up in a table. */
static void test_uuid_parse_every_byte(void **state) {
  (void)state;
  static const uint8_t at[16] = {0,  2,  4,  6,  9,  11, 14, 16,
                                 19, 21, 24, 26, 28, 30, 32, 34};
  char text[37];
  uint8_t b[16];
  for (int i = 0; i < 16; i++)
    for (int half = 0; half < 2; half++)
      for (int c = 0; c < 256; c++) {
        memcpy(text, "00000000-0000-0000-0000-000000000000", 37);
        text[at[i] + half] = (char)c;
        int want = (c >= '0' && c <= '9')   ? c - '0'
                   : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                            : -1;
        int got = kl__uuid_parse(text, 36, b);
        if (want < 0) {
          assert_int_equal(got, -1);
          continue;
        }
        assert_int_equal(got, 0);
        assert_int_equal(b[i], half ? want : want << 4);
      }
}

static void *make_ids(void *arg) {
  char(*ids)[37] = arg;
  for (int i = 0; i < PER_THREAD; i++)
    kl_event_make_id(ids[i]);
  return NULL;
}

static int cmp_id(const void *a, const void *b) {
  return strcmp(a, b);
}

static void test_make_id_threads(void **state) {
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, make_ids, thread_ids[i]), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < THREADS; i++)
    for (int j = 1; j < PER_THREAD; j++)
      assert_true(strcmp(thread_ids[i][j - 1], thread_ids[i][j]) < 0);
  char(*all)[37] = &thread_ids[0][0];
  qsort(all, THREADS * PER_THREAD, 37, cmp_id);
  for (int i = 1; i < THREADS * PER_THREAD; i++)
    assert_true(strcmp(all[i - 1], all[i]) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_full),
      cmocka_unit_test(test_uuid_parse_format),
      cmocka_unit_test(test_uuid_parse_every_byte),
      cmocka_unit_test(test_roundtrip_no_headers),
      cmocka_unit_test(test_roundtrip_empty_payload),
      cmocka_unit_test(test_roundtrip_max_sizes),
      cmocka_unit_test(test_decode_borrows_value),
      cmocka_unit_test(test_decode_wide_formats),
      cmocka_unit_test(test_truncated_every_offset),
      cmocka_unit_test(test_wrong_types),
      cmocka_unit_test(test_header_wrong_types),
      cmocka_unit_test(test_field_name_not_str),
      cmocka_unit_test(test_limits_exceeded_by_one),
      cmocka_unit_test(test_ts_beyond_int64),
      cmocka_unit_test(test_envelope_too_large),
      cmocka_unit_test(test_key_limits),
      cmocka_unit_test(test_unknown_version),
      cmocka_unit_test(test_not_before),
      cmocka_unit_test(test_reserved_types),
      cmocka_unit_test(test_missing_each_field),
      cmocka_unit_test(test_empty_fields),
      cmocka_unit_test(test_id_must_be_utf8_text),
      cmocka_unit_test(test_duplicate_fields),
      cmocka_unit_test(test_unknown_field),
      cmocka_unit_test(test_trailing_bytes),
      cmocka_unit_test(test_not_a_map),
      cmocka_unit_test(test_hostile_counts),
      cmocka_unit_test(test_decode_failure_keeps_event),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_validate),
      cmocka_unit_test(test_validate_headers),
      cmocka_unit_test(test_encode_rejects_invalid),
      cmocka_unit_test(test_encode_bytes_as_msgpack_c),
      cmocka_unit_test(test_make_id_format),
      cmocka_unit_test(test_make_id_ordered),
      cmocka_unit_test(test_make_id_threads),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
