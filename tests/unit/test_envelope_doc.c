/*
 * docs/envelope.md's byte-by-byte examples are the envelopes keylane
 * writes: the bytes after "<!-- envelope-example -->" (and after
 * "<!-- envelope-example-delayed -->", the same event with a not_before)
 * decode to the event the page names, and that event encodes back to the
 * same bytes. A change of the format, or a typo in the page, fails here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/event.h"

/* The hex bytes of the first ``` block after @p marker in @p path. */
static size_t read_example(const char *path, const char *marker,
                           unsigned char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f)
    fail_msg("cannot open %s", path);
  char line[256];
  int seen_marker = 0, in_block = 0;
  size_t n = 0;
  while (fgets(line, sizeof(line), f)) {
    if (!seen_marker) {
      seen_marker = strstr(line, marker) != NULL;
      continue;
    }
    if (strncmp(line, "```", 3) == 0) {
      if (in_block)
        break;
      in_block = 1;
      continue;
    }
    if (!in_block)
      continue;
    for (char *tok = strtok(line, " \n"); tok; tok = strtok(NULL, " \n")) {
      unsigned v;
      assert_true(n < cap);
      assert_int_equal(sscanf(tok, "%2x", &v), 1);
      out[n++] = (unsigned char)v;
    }
  }
  fclose(f);
  assert_true(seen_marker);
  return n;
}

/* The example of @p marker: @p want bytes, the page's event with
 * @p not_before, encoded back to the same bytes. */
static void check_example(const char *marker, size_t want, int64_t not_before) {
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof(path), "%s/docs/envelope.md", src ? src : ".");
  unsigned char bytes[256];
  size_t n = read_example(path, marker, bytes, sizeof(bytes));
  assert_int_equal(n, want); /* as the page says */

  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t ev;
  assert_int_equal(kl_event_decode(decoder, "acct-7", 6, bytes, n, &ev), KL_OK);
  assert_int_equal(ev.id_len, 15);
  assert_memory_equal(ev.id, "order-17-credit", 15);
  assert_int_equal(ev.type_len, 6);
  assert_memory_equal(ev.type, "credit", 6);
  assert_int_equal(ev.ts, 1700000000000LL);
  assert_int_equal(ev.header_count, 0);
  assert_int_equal(ev.not_before, not_before);
  static const unsigned char payload[] = {0x82, 0xa6, 'a', 'm',  'o',
                                          'u',  'n',  't', 0x64, 0xa3,
                                          's',  'e',  'q', 0x01};
  assert_int_equal(ev.payload_len, sizeof(payload));
  assert_memory_equal(ev.payload, payload, sizeof(payload));

  void *again;
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &again, &len), KL_OK);
  assert_int_equal(len, n);
  assert_memory_equal(again, bytes, n);
  free(again);
  kl_decoder_destroy(decoder);
}

static void test_the_example_decodes_and_encodes_back(void **state) {
  (void)state;
  check_example("<!-- envelope-example -->", 62, 0);
}

/* Version 2, "nb" last: the bytes every client must write for it. */
static void test_the_delayed_example_decodes_and_encodes_back(void **state) {
  (void)state;
  check_example("<!-- envelope-example-delayed -->", 74, 1700000900000LL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_example_decodes_and_encodes_back),
      cmocka_unit_test(test_the_delayed_example_decodes_and_encodes_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
