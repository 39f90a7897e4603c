/*
 * Text a client or a handler wrote, in a log line: kl__escape()
 * (common/strbuf.h) keeps a newline or an ESC from starting a line of its
 * own or driving a terminal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "common/strbuf.h"

static void test_escape(void **state) {
  (void)state;
  static const struct {
    const char *in;
    size_t len;
    const char *out;
  } cases[] = {
      {"plain", 5, "plain"},
      {"a\nb", 3, "a\\x0ab"},
      {"\x1b[2J", 4, "\\x1b[2J"},
      {"nul\0x", 5, "nul\\x00x"},
      {"back\\x0a", 8, "back\\\\x0a"}, /* one-to-one: not a "\x0a" */
      {"caf\xc3\xa9", 5, "caf\xc3\xa9"},
      {"c1\xc2\x85", 4, "c1\\xc2\\x85"},
      {"bad\xff", 4, "bad\\xff"},
      {"del\x7f", 4, "del\\x7f"},
  };
  char out[KL__ESCAPED_SIZE(16)];
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    assert_string_equal(kl__escape(out, sizeof(out), cases[i].in, cases[i].len),
                        cases[i].out);
  assert_string_equal(kl__escape(out, sizeof(out), NULL, 0), "");
}

/* Text that does not fit is cut between two characters, never inside an
 * escape, and says so with "...". */
static void test_escape_cuts_whole_characters(void **state) {
  (void)state;
  char out[12];
  assert_string_equal(kl__escape(out, sizeof(out), "abcdefghijklmnop", 16),
                      "abcdefgh...");
  assert_string_equal(kl__escape(out, sizeof(out), "ab\n\n\n\n", 6),
                      "ab\\x0a...");
  assert_string_equal(kl__escape(out, sizeof(out), "abcdefghijk", 11),
                      "abcdefghijk"); /* fits exactly */
  char tiny[3];
  assert_string_equal(kl__escape(tiny, sizeof(tiny), "abcdef", 6), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_escape),
      cmocka_unit_test(test_escape_cuts_whole_characters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
