/*
 * Text a client or a handler wrote, in a log line: kl__escape()
 * (common/strbuf.h) keeps a newline or an ESC from starting a line of its
 * own or driving a terminal; and the topic names (common/topic.h) an
 * exec handler's follow-up may and may not go to.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "common/topic.h"

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
      /* invisible: a key must not show as another key's text */
      {"d2\xe2\x80\x8b"
       "1",
       6, "d2\\xe2\\x80\\x8b1"},                       /* U+200B */
      {"\xef\xbb\xbfk", 4, "\\xef\\xbb\\xbfk"},        /* U+FEFF */
      {"a\xc2\xad", 3, "a\\xc2\\xad"},                 /* U+00AD */
      {"a\xcd\x8f", 3, "a\\xcd\\x8f"},                 /* U+034F */
      {"\xe1\xa0\x8e", 3, "\\xe1\\xa0\\x8e"},          /* U+180E */
      {"\xe2\x81\xa0", 3, "\\xe2\\x81\\xa0"},          /* U+2060 */
      {"\xe2\x81\xaa", 3, "\\xe2\\x81\\xaa"},          /* U+206A */
      {"\xef\xbf\xb9", 3, "\\xef\\xbf\\xb9"},          /* U+FFF9 */
      {"\xee\x80\x80", 3, "\\xee\\x80\\x80"},          /* U+E000 */
      {"\xf3\xa0\x80\x81", 4, "\\xf3\\xa0\\x80\\x81"}, /* U+E0001 */
      {"\xe2\x80\xae", 3, "\\xe2\\x80\\xae"},          /* U+202E */
      /* visible neighbours stay as they are */
      {"\xc2\xa0\xc2\xae", 4, "\xc2\xa0\xc2\xae"}, /* NBSP, (R) */
      {"\xe2\x80\x90\xe2\x80\xa7", 6, "\xe2\x80\x90\xe2\x80\xa7"},
      {"\xef\xbf\xbd\xf0\x9f\x98\x80", 7,
       "\xef\xbf\xbd\xf0\x9f\x98\x80"}, /* U+FFFD, an emoji */
  };
  char out[KL__ESCAPED_SIZE(20)];
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

static void test_topic_names(void **state) {
  (void)state;
  static const char *const valid[] = {"events", "a.b_c-D9", "x.dlq2", "dlq",
                                      "_single"};
  for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++) {
    assert_int_equal(kl__topic_check(valid[i], strlen(valid[i])), KL_OK);
    assert_null(kl__topic_reserved(valid[i]));
  }
  char long_name[KL__TOPIC_NAME_MAX + 1];
  memset(long_name, 'a', sizeof(long_name));
  const struct {
    const char *name;
    size_t len;
    const char *says;
  } invalid[] = {
      {"", 0, "Kafka allows 1..249"},
      {long_name, sizeof(long_name), "is 250 bytes"},
      {".", 1, "reserved by Kafka"},
      {"..", 2, "reserved by Kafka"},
      {"a b", 3, "has the byte 0x20 at 1"},
      {"a\nb", 3, "topic \"a\\x0ab\" has the byte 0x0a at 1"},
      {"caf\xc3\xa9", 5, "has the byte 0xc3 at 3"},
      {"a/b", 3, "letters, digits, '.', '_' and '-'"},
  };
  for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
    assert_int_equal(kl__topic_check(invalid[i].name, invalid[i].len),
                     KL_EINVAL);
    if (!strstr(kl_err_detail(), invalid[i].says))
      fail_msg("\"%s\" does not say \"%s\"", kl_err_detail(), invalid[i].says);
  }
  assert_non_null(strstr(kl__topic_reserved("events.dlq"), "dead-letter"));
  assert_non_null(strstr(kl__topic_reserved("__consumer_offsets"), "Kafka"));
  assert_non_null(kl__topic_reserved("__x"));
  assert_null(kl__topic_reserved(".dlq")); /* no topic before the suffix */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_escape),
      cmocka_unit_test(test_escape_cuts_whole_characters),
      cmocka_unit_test(test_topic_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
