/*
 * The text checks and escapes of common/strbuf.c that go 8 bytes at a
 * time: kl__strbuf_json_str() against a byte-at-a-time escape, and
 * kl__utf8_valid_len() against kl__utf8_seq() called byte by byte, for
 * every byte value at every position of a 16-byte text (both 8-byte
 * steps and the tail), and on random texts; jansson reads every escaped
 * text, valid UTF-8 or not, and reads valid UTF-8 back as the bytes it
 * came from.
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
#include <jansson.h>

#include "common/strbuf.h"

/* The escape, a byte (or a character) at a time. */
static void json_str_slow(kl__strbuf_t *sb, const char *s, size_t len) {
  kl__strbuf_add(sb, "\"", 1);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    size_t n = kl__utf8_seq((const unsigned char *)s + i, len - i);
    if (c == '"' || c == '\\')
      kl__strbuf_printf(sb, "\\%c", c);
    else if (c < 0x20)
      kl__strbuf_printf(sb, "\\u%04x", c);
    else if (n == 0)
      kl__strbuf_puts(sb, "\\ufffd");
    else {
      kl__strbuf_add(sb, s + i, n);
      i += n - 1;
    }
  }
  kl__strbuf_add(sb, "\"", 1);
}

static void same_escape(const char *s, size_t len) {
  kl__strbuf_t fast = KL__STRBUF_INIT, slow = KL__STRBUF_INIT;
  kl__strbuf_json_str(&fast, s, len);
  json_str_slow(&slow, s, len);
  size_t flen, slen;
  char *f = kl__strbuf_take(&fast, &flen), *w = kl__strbuf_take(&slow, &slen);
  assert_int_equal(flen, slen);
  assert_memory_equal(f, w, flen);
  free(f);
  free(w);
}

static size_t utf8_slow(const char *s, size_t len, bool nul_ok) {
  size_t i = 0;
  while (i < len) {
    if (s[i] == 0 && !nul_ok)
      return i;
    size_t n = kl__utf8_seq((const unsigned char *)s + i, len - i);
    if (n == 0)
      return i;
    i += n;
  }
  return len;
}

static void test_every_byte_at_every_position(void **state) {
  (void)state;
  for (size_t len = 1; len <= 16; len++)
    for (size_t at = 0; at < len; at++)
      for (int c = 0; c < 256; c++) {
        char s[16];
        memset(s, 'a', sizeof(s));
        s[at] = (char)c;
        same_escape(s, len);
        assert_int_equal(kl__utf8_valid_len(s, len, true),
                         utf8_slow(s, len, true));
        assert_int_equal(kl__utf8_valid_len(s, len, false),
                         utf8_slow(s, len, false));
      }
}

static void test_random_texts(void **state) {
  (void)state;
  uint64_t x = 88172645463325252u;
  /* Bytes from a small alphabet, so that escapes, NULs and every UTF-8
   * lead and continuation byte meet at every offset. */
  static const unsigned char alphabet[] = {
      'a',  'Z',  '0',  ' ',  '"',  '\\', 0x00, 0x01, 0x1f, 0x7f, 0x80, 0xbf,
      0xc2, 0xc3, 0xa9, 0xe0, 0xa0, 0xed, 0x9f, 0xf0, 0x90, 0xf4, 0x8f, 0xff};
  for (int round = 0; round < 20000; round++) {
    char s[40];
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t len = (size_t)(x % sizeof(s));
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      s[i] = (char)alphabet[x % sizeof(alphabet)];
    }
    same_escape(s, len);
    size_t valid = kl__utf8_valid_len(s, len, true);
    assert_int_equal(valid, utf8_slow(s, len, true));
    assert_int_equal(kl__utf8_valid_len(s, len, false),
                     utf8_slow(s, len, false));
    /* The escape is valid JSON whatever the bytes; jansson reads it back
     * as these bytes when they are UTF-8. */
    kl__strbuf_t sb = KL__STRBUF_INIT;
    kl__strbuf_json_str(&sb, s, len);
    size_t n;
    char *text = kl__strbuf_take(&sb, &n);
    json_error_t jerr;
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!v)
      fail_msg("not JSON: %s", jerr.text);
    if (valid == len) {
      assert_int_equal(json_string_length(v), len);
      assert_memory_equal(json_string_value(v), s, len);
    }
    json_decref(v);
    free(text);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_byte_at_every_position),
      cmocka_unit_test(test_random_texts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
