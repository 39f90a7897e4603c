/*
 * The gateway reads a msgpack body from its bytes (broker/gateway_body.c):
 * it must take the same events, and refuse the same bodies, as the way it
 * read them before, through a JSON document (the oracle,
 * tests/support/msgpack_oracle.h). Bodies of every kind of value, fault
 * and field, generated from a seed and then cut or bit-flipped, each
 * decoded as the gateway does (in its arena) and compared; and the
 * messages of the faults of the msgpack itself, which must stay those of
 * kl__msgpack_body_to_json().
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "broker/gateway_internal.h"
#include "common/json_msgpack.h"
#include "support/msgpack_oracle.h"

static uint64_t kl_rng = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n) {
  kl_rng ^= kl_rng << 13;
  kl_rng ^= kl_rng >> 7;
  kl_rng ^= kl_rng << 17;
  return (uint32_t)(kl_rng % n);
}

static void pack_text(msgpack_packer *pk, const char *s, size_t len) {
  msgpack_pack_str(pk, len);
  msgpack_pack_str_body(pk, s, len);
}

/* A string, now and then one JSON cannot carry or the rules refuse. */
static void pack_any_str(msgpack_packer *pk) {
  static const char *const texts[] = {"a",
                                      "acct-7",
                                      "t",
                                      "",
                                      "h\xc3\xa9",
                                      "\xe2\x82\xac",
                                      "x\0y",
                                      "\xc3",             /* cut */
                                      "\xed\xa0\x80",     /* a surrogate */
                                      "\xf4\x90\x80\x80", /* above U+10FFFF */
                                      "~reserved",
                                      "15m",
                                      "0",
                                      "500ms",
                                      "3d",
                                      "nope",
                                      "$base64"};
  static const size_t lens[] = {1, 6, 1, 0, 3, 3, 3, 1, 3,
                                4, 9, 3, 1, 5, 2, 4, 7};
  uint32_t i = rnd(sizeof(lens) / sizeof(lens[0]));
  pack_text(pk, texts[i], lens[i]);
}

static void pack_value(msgpack_packer *pk, int depth);

static void pack_map(msgpack_packer *pk, int depth) {
  uint32_t n = rnd(depth > 3 ? 2 : 4);
  msgpack_pack_map(pk, n);
  for (uint32_t i = 0; i < n; i++) {
    if (rnd(12) == 0)
      msgpack_pack_int(pk, 1); /* a key that is not a string */
    else
      pack_any_str(pk); /* some twice in one map */
    pack_value(pk, depth + 1);
  }
}

static void pack_value(msgpack_packer *pk, int depth) {
  switch (rnd(depth > 4 ? 9 : 12)) {
  case 0:
    msgpack_pack_nil(pk);
    break;
  case 1:
    rnd(2) ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    break;
  case 2: {
    static const int64_t ints[] = {
        0, 1, -1, 127, 128, -33, 65536, 1767225600000, INT64_MAX, INT64_MIN};
    msgpack_pack_int64(pk, ints[rnd(10)]);
    break;
  }
  case 3:
    rnd(4) ? msgpack_pack_uint64(pk, 5) : msgpack_pack_uint64(pk, UINT64_MAX);
    break;
  case 4: {
    static const double ds[] = {0.5, -0.0, 1e300, 0.0 / 0.0, 1.0 / 0.0};
    rnd(3) ? msgpack_pack_double(pk, ds[rnd(5)])
           : msgpack_pack_float(pk, (float)ds[rnd(5)]);
    break;
  }
  case 5:
  case 6:
    pack_any_str(pk);
    break;
  case 7: {
    uint32_t n = rnd(3) ? rnd(8) : 700 + rnd(900); /* a piece or more */
    char *b = malloc(n + 1);
    for (uint32_t i = 0; i < n; i++)
      b[i] = (char)rnd(256);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, b, n);
    free(b);
    break;
  }
  case 8:
    if (rnd(4)) {
      msgpack_pack_ext(pk, 1, 1);
      msgpack_pack_ext_body(pk, "x", 1);
    } else {
      msgpack_pack_nil(pk);
    }
    break;
  case 9:
  case 10: {
    uint32_t n = rnd(4);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
      pack_value(pk, depth + 1);
    break;
  }
  default:
    pack_map(pk, depth);
  }
}

/* A field of an event: mostly the known ones with values of their kind. */
static void pack_field(msgpack_packer *pk) {
  static const char *const names[] = {"key",        "type",        "id",
                                      "payload",    "payload_b64", "headers",
                                      "not_before", "delay",       "paylaod"};
  uint32_t f = rnd(9);
  pack_text(pk, names[f], strlen(names[f]));
  if (rnd(10) == 0) {
    pack_value(pk, 3);
    return;
  }
  switch (f) {
  case 0:
  case 1:
  case 2:
  case 7:
    pack_any_str(pk);
    break;
  case 4:
    pack_text(pk, rnd(2) ? "AAE=" : "AA=E", 4);
    break;
  case 5: {
    uint32_t n = rnd(4);
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < n; i++) {
      pack_any_str(pk);
      rnd(6) ? pack_any_str(pk) : pack_value(pk, 4);
    }
    break;
  }
  case 6:
    msgpack_pack_int64(pk, rnd(5) ? 1767225600000 : -1);
    break;
  default:
    pack_value(pk, 3);
  }
}

static void pack_event(msgpack_packer *pk) {
  /* key and type first most of the time, so that many events pass. */
  bool good = rnd(6) != 0;
  uint32_t extra = rnd(3);
  msgpack_pack_map(pk, (good ? 2 : 0) + extra);
  if (good) {
    pack_text(pk, "key", 3);
    pack_text(pk, "acct-7", 6);
    pack_text(pk, "type", 4);
    pack_text(pk, "credit", 6);
  }
  for (uint32_t i = 0; i < extra; i++)
    pack_field(pk);
}

static void body_make(msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  uint32_t shape = rnd(10);
  if (shape == 0) {
    pack_event(&pk);
  } else if (shape == 1) {
    pack_value(&pk, 1);
  } else {
    uint32_t n = rnd(4);
    msgpack_pack_array(&pk, n);
    for (uint32_t i = 0; i < n; i++)
      rnd(12) ? pack_event(&pk) : pack_value(&pk, 2);
  }
  if (rnd(16) == 0 && sb->size > 0) /* cut */
    sb->size = rnd((uint32_t)sb->size);
  else if (rnd(16) == 0 && sb->size > 0) /* a bit flipped */
    sb->data[rnd((uint32_t)sb->size)] ^= (char)(1u << rnd(8));
  else if (rnd(32) == 0) /* trailing */
    msgpack_pack_nil(&pk);
}

/* Decodes @p body as the gateway does and compares with the oracle.
 * @returns the status. */
static int decode_checked(kl__gw_arena_t *arena, const void *body, size_t len,
                          size_t max_events, kl__gw_bad_t *bad) {
  kl__gw_batch_t batch;
  char why[700];
  kl__gw_arena_begin(arena);
  int status = kl__gw_batch_decode(&batch, "application/msgpack", body, len,
                                   max_events, bad);
  const char *diff = kl_msgpack_oracle_diff(body, len, max_events, status,
                                            &batch, why, sizeof(why));
  if (diff) {
    fprintf(stderr, "body of %zu bytes:", len);
    for (size_t i = 0; i < len && i < 256; i++)
      fprintf(stderr, " %02x", ((const unsigned char *)body)[i]);
    fprintf(stderr, "\n%s\n", diff);
  }
  assert_null(diff);
  if (status == 0)
    kl__gw_batch_free(&batch);
  kl__gw_arena_end(arena);
  return status;
}

static void generated_bodies_read_as_the_oracle_reads_them(void **state) {
  (void)state;
  kl__gw_arena_t arena = {0};
  int took = 0, refused = 0;
  for (int i = 0; i < 200000; i++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    body_make(&sb);
    kl__gw_bad_t bad;
    if (decode_checked(&arena, sb.data, sb.size, 3, &bad) == 0)
      took++;
    else
      refused++;
    msgpack_sbuffer_destroy(&sb);
  }
  printf("took %d, refused %d\n", took, refused);
  /* Both ways are exercised, or the comparison says little. */
  assert_true(took > 20000);
  assert_true(refused > 20000);
  kl__gw_arena_destroy(&arena);
}

/* The msgpack's own faults keep kl__msgpack_body_to_json()'s words and byte
 * offsets, whatever event they are in. */
static void faults_keep_their_messages(void **state) {
  (void)state;
  static const struct {
    const char *body;
    size_t len;
  } cases[] = {
      {"\x91\x82\xa3key\xa1k\xa4type\xa2t\xc3", 17}, /* bad UTF-8 */
      {"\x91\x82\xa3key\xa1k\xa3key\xa1t", 13},      /* key twice */
      {"\x91\x82\xa3key\xa1k\x01\xa1t", 10},         /* int key */
      {"\x91\x82\xa3key\xa1k\xa4type\xa1t\xc0", 16}, /* trailing */
      {"\x91\x82\xa3key\xa1k\xa4type\xa1", 13},      /* cut */
      {"\x91\x81\xa7payload\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 18},
      {"\x91\x81\xa7payload\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", 18},
      {"\x91\x81\xa7payload\x81\xa2k\x00\xc0", 15}, /* NUL key */
      {"\x92\x80\xdd\xff\xff\xff\xff", 7},          /* huge array */
  };
  kl__gw_arena_t arena = {0};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl__gw_bad_t bad;
    assert_int_equal(
        decode_checked(&arena, cases[i].body, cases[i].len, 100, &bad), 400);
    json_t *doc;
    assert_int_not_equal(
        kl__msgpack_body_to_json(cases[i].body, cases[i].len, &doc), KL_OK);
    char want[600];
    snprintf(want, sizeof(want), "the body is not valid msgpack: %s",
             kl_err_detail());
    assert_string_equal(bad.msg, want);
    assert_int_equal(bad.index, -1);
  }
  kl__gw_arena_destroy(&arena);
}

/* An event of key "k", type "t" and a payload, up to its value. */
static void pack_head(msgpack_packer *pk) {
  msgpack_pack_map(pk, 3);
  pack_text(pk, "key", 3);
  pack_text(pk, "k", 1);
  pack_text(pk, "type", 4);
  pack_text(pk, "t", 1);
  pack_text(pk, "payload", 7);
}

/* An event whose payload is a map of @p n keys, over the stack's 1 KiB:
 * measured, then written in place, its keys' set in the arena; with
 * @p twice, its last key is its first again. */
static void big_map_event(msgpack_sbuffer *sb, int n, bool twice) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  pack_head(&pk);
  msgpack_pack_map(&pk, (size_t)n);
  for (int i = 0; i < n; i++) {
    char k[16];
    int len = snprintf(k, sizeof(k), "k%d", twice && i == n - 1 ? 0 : i);
    pack_text(&pk, k, (size_t)len);
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "abc", 3);
  }
}

static void large_payloads_read_as_the_oracle_reads_them(void **state) {
  (void)state;
  kl__gw_arena_t arena = {0};
  for (int twice = 0; twice < 2; twice++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    big_map_event(&sb, 3000, twice);
    kl__gw_bad_t bad;
    assert_int_equal(decode_checked(&arena, sb.data, sb.size, 1, &bad),
                     twice ? 400 : 0);
    if (twice)
      assert_non_null(strstr(bad.msg, "the map key \"k0\" appears twice"));
    msgpack_sbuffer_destroy(&sb);
  }
  kl__gw_arena_destroy(&arena);
}

/* Decodes @p body as @p ctype: @returns the status, with the bad
 * event's index in @p index. */
static int decode_status(const char *ctype, const char *body, size_t len,
                         long *index) {
  kl__gw_arena_t arena = {0};
  kl__gw_batch_t batch;
  kl__gw_bad_t bad = {.index = -2};
  kl__gw_arena_begin(&arena);
  int status = kl__gw_batch_decode(&batch, ctype, body, len, 1, &bad);
  if (status == 0)
    kl__gw_batch_free(&batch);
  kl__gw_arena_end(&arena);
  kl__gw_arena_destroy(&arena);
  *index = status ? bad.index : -2;
  return status;
}

/* A payload nested around its limit, or a key nested around jansson's
 * limit of a JSON text, in a lone event and in an array: a msgpack body is
 * taken or refused as the JSON body of the same value is, with the same
 * event index (-1: the body as a whole). (Before, the
 * body's own containers counted against the payload's limit: a payload
 * 63 levels deep, taken as JSON, was refused as msgpack.) */
static void nesting_reads_as_json_does(void **state) {
  (void)state;
  int took = 0;
  for (int array = 0; array < 2; array++) {
    for (int levels = 58; levels <= 2048;
         levels += levels == 67 ? 2045 - 67 : 1) {
      for (int in_key = 0; in_key < 2; in_key++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        char json[4400];
        size_t n = 0;
        if (array) {
          msgpack_pack_array(&pk, 1);
          json[n++] = '[';
        }
        /* {"type":"t",("key":"k",)FIELD:[[...null...]]} */
        msgpack_pack_map(&pk, in_key ? 2 : 3);
        pack_text(&pk, "type", 4);
        pack_text(&pk, "t", 1);
        if (!in_key) {
          pack_text(&pk, "key", 3);
          pack_text(&pk, "k", 1);
        }
        pack_text(&pk, in_key ? "key" : "payload", in_key ? 3 : 7);
        n += (size_t)snprintf(
            json + n, sizeof(json) - n,
            "{\"type\":\"t\",%s\"%s\":", in_key ? "" : "\"key\":\"k\",",
            in_key ? "key" : "payload");
        for (int i = 0; i < levels; i++) {
          msgpack_pack_array(&pk, 1);
          json[n++] = '[';
        }
        msgpack_pack_nil(&pk);
        n += (size_t)snprintf(json + n, sizeof(json) - n, "null");
        for (int i = 0; i < levels; i++)
          json[n++] = ']';
        json[n++] = '}';
        if (array)
          json[n++] = ']';
        long mi, ji;
        int ms = decode_status("application/msgpack", sb.data, sb.size, &mi);
        int js = decode_status("application/json", json, n, &ji);
        if (ms != js || mi != ji)
          fail_msg("%s %d levels deep%s: msgpack %d (event %ld), JSON %d "
                   "(event %ld)",
                   in_key ? "a key" : "a payload", levels,
                   array ? " in an array" : "", ms, mi, js, ji);
        took += ms == 0;
        kl__gw_arena_t arena = {0};
        kl__gw_bad_t bad;
        decode_checked(&arena, sb.data, sb.size, 1, &bad);
        kl__gw_arena_destroy(&arena);
        msgpack_sbuffer_destroy(&sb);
      }
    }
  }
  assert_int_equal(took, 2 * 6); /* payloads of 58 to 63 levels */
}

/* A bin payload is its bytes; a map payload of the shape of a bin's JSON
 * form, {"$base64": STR}, is that map: before, it was taken for a bin and
 * stored as the bytes its string encodes. */
static void only_a_bin_is_raw_bytes(void **state) {
  (void)state;
  static const char bin[] = "\x83\xa3key\xa1k\xa4type\xa1t"
                            "\xa7payload\xc4\x02\x00\x01";
  static const char map[] = "\x83\xa3key\xa1k\xa4type\xa1t"
                            "\xa7payload\x81\xa7$base64\xa4"
                            "AAE=";
  kl__gw_arena_t arena = {0};
  kl__gw_batch_t batch;
  kl__gw_bad_t bad;
  kl__gw_arena_begin(&arena);
  assert_int_equal(kl__gw_batch_decode(&batch, "application/msgpack", bin,
                                       sizeof(bin) - 1, 1, &bad),
                   0);
  assert_int_equal(batch.events[0].ev.payload_len, 2);
  assert_memory_equal(batch.events[0].ev.payload, "\x00\x01", 2);
  kl__gw_batch_free(&batch);
  assert_int_equal(kl__gw_batch_decode(&batch, "application/msgpack", map,
                                       sizeof(map) - 1, 1, &bad),
                   0);
  assert_int_equal(batch.events[0].ev.payload_len, 14);
  assert_memory_equal(batch.events[0].ev.payload,
                      "\x81\xa7$base64\xa4"
                      "AAE=",
                      14);
  kl__gw_batch_free(&batch);
  kl__gw_arena_end(&arena);
  kl__gw_arena_destroy(&arena);
}

/* A JSON body sent as msgpack is told to change its Content-Type. */
static void json_sent_as_msgpack_is_named(void **state) {
  (void)state;
  static const char body[] = "[{\"key\":\"k\",\"type\":\"t\"}]";
  kl__gw_arena_t arena = {0};
  kl__gw_bad_t bad;
  assert_int_equal(decode_checked(&arena, body, sizeof(body) - 1, 1, &bad),
                   400);
  assert_non_null(strstr(bad.msg, "Content-Type: application/json"));
  kl__gw_arena_destroy(&arena);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(generated_bodies_read_as_the_oracle_reads_them),
      cmocka_unit_test(faults_keep_their_messages),
      cmocka_unit_test(large_payloads_read_as_the_oracle_reads_them),
      cmocka_unit_test(nesting_reads_as_json_does),
      cmocka_unit_test(only_a_bin_is_raw_bytes),
      cmocka_unit_test(json_sent_as_msgpack_is_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
