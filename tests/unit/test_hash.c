/* kl__fnv1a(): the one FNV-1a of the code base (common/hash.h), which
 * every hash table and key grouping uses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"

/* The published FNV-1a 64 test vectors (Fowler, Noll, Vo). */
static void test_known_vectors(void **state) {
  (void)state;
  assert_true(kl__fnv1a("", 0) == 0xcbf29ce484222325ULL);
  assert_true(kl__fnv1a("a", 1) == 0xaf63dc4c8601ec8cULL);
  assert_true(kl__fnv1a("foobar", 6) == 0x85944171f73967e8ULL);
}

/* Hashing in pieces equals hashing the whole (the overlay hashes its
 * space byte, then the key). */
static void test_more_continues(void **state) {
  (void)state;
  uint64_t h = kl__fnv1a("foo", 3);
  assert_true(kl__fnv1a_more(h, "bar", 3) == kl__fnv1a("foobar", 6));
  assert_true(kl__fnv1a_more(h, "", 0) == h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_vectors),
      cmocka_unit_test(test_more_continues),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
