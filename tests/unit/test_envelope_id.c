/*
 * The id's text rule (event/envelope.c's id_text_check(), which reads
 * ASCII 8 bytes at a time): a NUL or a byte that is no UTF-8 is refused
 * wherever it sits, inside an 8-byte word or in the tail after the last,
 * with its offset; UTF-8 text of any length is taken.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/event.h"

enum { LEN_MAX = 41 };

static kl_err_t validate_id(const char *id, size_t len) {
  kl_event_t ev = {.key = "k",
                   .key_len = 1,
                   .id = id,
                   .id_len = len,
                   .type = "t",
                   .type_len = 1};
  return kl_event_validate(&ev, 0);
}

/* Every length, every position, each bad byte: refused, at that byte. */
static void test_bad_byte_anywhere(void **state) {
  (void)state;
  static const unsigned char bad[] = {0x00, 0x80, 0xbf, 0xc0, 0xc1,
                                      0xf5, 0xff, 0xe0, 0xed};
  char id[LEN_MAX], want[32];
  for (size_t len = 1; len <= LEN_MAX; len++)
    for (size_t at = 0; at < len; at++)
      for (size_t b = 0; b < sizeof(bad); b++) {
        memset(id, 'a', len);
        id[at] = (char)bad[b];
        kl_err_t err = validate_id(id, len);
        if (err != KL_EDECODE_TYPE)
          fail_msg("0x%02x at byte %zu of %zu: got %s, want "
                   "KL_EDECODE_TYPE",
                   bad[b], at, len, kl_err_name(err));
        snprintf(want, sizeof(want), "at byte %zu", at);
        if (!strstr(kl_err_detail(), want))
          fail_msg("0x%02x at byte %zu of %zu: \"%s\" lacks \"%s\"", bad[b], at,
                   len, kl_err_detail(), want);
        if (bad[b] == 0 && !strstr(kl_err_detail(), "holds a NUL"))
          fail_msg("NUL at byte %zu: \"%s\"", at, kl_err_detail());
      }
}

/* ASCII from 0x01 to 0x7f and whole UTF-8 sequences anywhere: taken. */
static void test_text_taken(void **state) {
  (void)state;
  static const char *const seqs[] = {"\x01", "\x7f", "\xc3\xa9", "\xe2\x82\xac",
                                     "\xf0\x9f\x98\x80"};
  char id[LEN_MAX + 4];
  for (size_t len = 1; len <= LEN_MAX; len++)
    for (size_t at = 0; at < len; at++)
      for (size_t s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++) {
        size_t n = strlen(seqs[s]);
        if (at + n > len)
          continue;
        memset(id, 'a', len);
        memcpy(id + at, seqs[s], n);
        if (validate_id(id, len) != KL_OK)
          fail_msg("sequence %zu at byte %zu of %zu: %s", s, at, len,
                   kl_err_detail());
      }
}

/* A sequence cut by the id's end is no UTF-8, at the word's edge too. */
static void test_cut_sequence(void **state) {
  (void)state;
  char id[LEN_MAX];
  for (size_t len = 2; len <= LEN_MAX; len++) {
    memset(id, 'a', len);
    memcpy(id + len - 2, "\xe2\x82", 2);
    assert_int_equal(validate_id(id, len), KL_EDECODE_TYPE);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_byte_anywhere),
      cmocka_unit_test(test_text_taken),
      cmocka_unit_test(test_cut_sequence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
