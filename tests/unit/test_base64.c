/*
 * base64 (common/json_msgpack.c), which payload_b64 and a msgpack body's
 * bin payloads cross: every byte value at every position of a group
 * against the alphabet, padding, round trips of every length up to 300,
 * and a msgpack bin read as {"$base64": ...} on both sides of the stack
 * buffer that mp_bin() encodes into.
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_byte_at_every_position),
      cmocka_unit_test(test_padding_and_length),
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_bin_as_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
