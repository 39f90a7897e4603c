/*
 * msgpack -> JSON and base64 (common/json_msgpack.c), which a msgpack
 * body of the gateway and payload_b64 cross.
 *
 * base64: every byte value at every position of a group against the
 * alphabet, padding, round trips of every length up to 300, and a msgpack
 * bin read as {"$base64": ...} on both sides of the stack buffer that
 * mp_bin() encodes into.
 *
 * Map keys: the rules of jansson's reader (JSON_REJECT_DUPLICATES), each
 * refusal naming the key's byte offset, in the order they are checked
 * (UTF-8, NUL, twice), and the keys' order kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <msgpack.h>

#include "common/internal.h"
#include "common/json_msgpack.h"

static const char kl_t_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Every byte value at each position of a two-group text: decoded to the
 * alphabet's value where it is in the alphabet, refused naming its offset
 * elsewhere ('=' and NUL included; "==" ends only the last group). */
static void test_every_byte_at_every_position(void **state) {
  (void)state;
  for (int pos = 0; pos < 8; pos++)
    for (int c = 0; c < 256; c++) {
      char text[9] = "QUJDREVG"; /* "ABCDEF" */
      text[pos] = (char)c;
      void *out = NULL;
      size_t len = 0;
      const char *in = memchr(kl_t_alphabet, c, 64);
      kl_err_t err = kl__base64_decode(text, 8, &out, &len);
      if (!in) {
        int last_pad = c == '=' && pos == 7;
        if (last_pad) {
          assert_int_equal(err, KL_OK);
          assert_int_equal(len, 5);
          free(out);
          continue;
        }
        char want[64];
        snprintf(want, sizeof(want), "invalid character at offset %d", pos);
        if (err != KL_EINVAL || !strstr(kl_err_detail(), want))
          fail_msg("byte %d at %d: %s", c, pos, kl_err_detail());
        continue;
      }
      assert_int_equal(err, KL_OK);
      assert_int_equal(len, 6);
      /* The 6 bits of position pos are the character's index. */
      const uint8_t *b = out;
      int group = pos / 4, at = pos % 4;
      uint32_t w = (uint32_t)b[group * 3] << 16 |
                   (uint32_t)b[group * 3 + 1] << 8 | b[group * 3 + 2];
      assert_int_equal((w >> (18 - 6 * at)) & 63,
                       (uint32_t)(in - kl_t_alphabet));
      free(out);
    }
}

static void test_padding_and_length(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *says; /* NULL: decodes to want */
    const char *want;
  } cases[] = {
      {"", NULL, ""},
      {"QQ==", NULL, "A"},
      {"QUI=", NULL, "AB"},
      {"QUJD", NULL, "ABC"},
      {"QQ", "not a multiple of 4", NULL},
      {"QQ=", "not a multiple of 4", NULL},
      {"Q===", "invalid character at offset 1", NULL},
      {"QQ==QUJD", "invalid character at offset 2", NULL},
      {"QU=D", "invalid character at offset 2", NULL},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    void *out = NULL;
    size_t len = 0;
    kl_err_t err =
        kl__base64_decode(cases[i].text, strlen(cases[i].text), &out, &len);
    if (cases[i].says) {
      if (err != KL_EINVAL || !strstr(kl_err_detail(), cases[i].says))
        fail_msg("\"%s\": %s", cases[i].text, kl_err_detail());
      continue;
    }
    assert_int_equal(err, KL_OK);
    assert_int_equal(len, strlen(cases[i].want));
    assert_memory_equal(out, cases[i].want, len);
    free(out);
  }
}

static void test_round_trips(void **state) {
  (void)state;
  uint8_t data[300];
  char text[401];
  srand(7);
  for (size_t n = 0; n <= sizeof(data); n++) {
    for (size_t i = 0; i < n; i++)
      data[i] = (uint8_t)rand();
    kl__base64_encode(data, n, text);
    assert_int_equal(strlen(text), kl__base64_encoded_len(n));
    void *out = NULL;
    size_t len = 0;
    assert_int_equal(kl__base64_decode(text, strlen(text), &out, &len), KL_OK);
    assert_int_equal(len, n);
    if (n)
      assert_memory_equal(out, data, n);
    free(out);
  }
}

/* A msgpack bin of n bytes read as JSON: {"$base64": its encoding}. */
static void kl_bin_reads_as_base64(size_t n) {
  uint8_t *data = malloc(n + 1);
  for (size_t i = 0; i < n; i++)
    data[i] = (uint8_t)(i * 7 + 1);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_bin(&pk, n);
  msgpack_pack_bin_body(&pk, data, n);
  json_t *value = NULL;
  assert_int_equal(kl__msgpack_to_json(sb.data, sb.size, &value), KL_OK);
  msgpack_sbuffer_destroy(&sb);
  assert_true(json_is_object(value));
  assert_int_equal(json_object_size(value), 1);
  json_t *b64 = json_object_get(value, "$base64");
  assert_true(json_is_string(b64));
  char *want = malloc(kl__base64_encoded_len(n) + 1);
  kl__base64_encode(data, n, want);
  assert_int_equal(json_string_length(b64), strlen(want));
  assert_string_equal(json_string_value(b64), want);
  free(want);
  free(data);
  json_decref(value);
}

static void test_bin_as_json(void **state) {
  (void)state;
  /* Around the 1 KiB of text encoded on the stack: 766 bytes take 1,024
   * characters, 765 take 1,020. */
  static const size_t sizes[] = {0, 1, 2, 3, 100, 765, 766, 767, 5000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    kl_bin_reads_as_base64(sizes[i]);
}

/* @p hex (two digits a byte) read as JSON: KL_OK with the value's
 * compact text in @p text, or the error with its detail there. */
static kl_err_t kl_read_hex(const char *hex, char *text, size_t size) {
  uint8_t data[64];
  size_t n = strlen(hex) / 2;
  assert_true(n <= sizeof(data));
  for (size_t i = 0; i < n; i++)
    sscanf(hex + 2 * i, "%2hhx", &data[i]);
  json_t *value = NULL;
  kl_err_t err = kl__msgpack_to_json(data, n, &value);
  if (err) {
    snprintf(text, size, "%s", kl_err_detail());
    return err;
  }
  char *dumped =
      json_dumps(value, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
  snprintf(text, size, "%s", dumped);
  free(dumped);
  json_decref(value);
  return KL_OK;
}

static void test_map_keys(void **state) {
  (void)state;
  static const struct {
    const char *hex;
    const char *says; /* the JSON text, or the refusal */
  } cases[] = {
      /* {"b": 1, "a": {"c": null}}: the order kept, nested */
      {"82a16201a16181a163c0", "{\"b\":1,\"a\":{\"c\":null}}"},
      {"80", "{}"},
      /* {"a": 1, "a": 2} */
      {"82a16101a16102", "msgpack at byte 4: the map key \"a\" appears twice"},
      /* nested: {"x": {"k": 1, "k": 2}} */
      {"81a17882a16b01a16b02",
       "msgpack at byte 7: the map key \"k\" appears twice"},
      /* {"a\0b": 1} */
      {"81a3610062"
       "01",
       "msgpack at byte 1: the map key \"a\\x00b\" holds a "
       "NUL byte"},
      /* {"\xff": 1} */
      {"81a1ff01", "msgpack at byte 1: a string is not valid UTF-8"},
      /* {"\xff": <truncated>}: the key's fault is found first */
      {"81a1ff", "msgpack at byte 1: a string is not valid UTF-8"},
      /* {1: 1} */
      {"810101", "msgpack at byte 1: a map key is not a string"},
      /* {"abc" cut after "a" */
      {"81a361", "(truncated)"},
      /* a key with the same bytes as another but longer: not a duplicate */
      {"82a16101a2616102", "{\"a\":1,\"aa\":2}"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char text[512];
    kl_err_t err = kl_read_hex(cases[i].hex, text, sizeof(text));
    int want_ok = cases[i].says[0] == '{';
    if (want_ok ? err != KL_OK || strcmp(text, cases[i].says) != 0
                : err != KL_EINVAL || !strstr(text, cases[i].says))
      fail_msg("%s: wanted %s, got %s (%s)", cases[i].hex, cases[i].says, text,
               kl_err_name(err));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_byte_at_every_position),
      cmocka_unit_test(test_padding_and_length),
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_bin_as_json),
      cmocka_unit_test(test_map_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
