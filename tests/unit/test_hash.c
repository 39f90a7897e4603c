/* common/hash.h: kl__fnv1a(), the one FNV-1a of the code base, for what
 * is stored; kl__hash(), the in-memory tables' word-at-a-time hash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* Equal bytes hash equal at any alignment and length 0 to 40 (the tail
 * is read with memcpy, never past the end: ASan checks it), and a
 * trailing zero byte is a different key. */
static void test_hash_alignment_and_length(void **state) {
  (void)state;
  unsigned char a[64], b[72];
  for (size_t i = 0; i < sizeof(a); i++)
    a[i] = (unsigned char)(i * 37 + 11);
  for (size_t n = 0; n <= 40; n++) {
    for (size_t off = 1; off < 8; off++) {
      memcpy(b + off, a, n);
      assert_true(kl__hash(b + off, n) == kl__hash(a, n));
    }
    unsigned char z[48] = {0};
    memcpy(z, a, n);
    assert_true(kl__hash(z, n) != kl__hash(z, n + 1));
  }
  assert_true(kl__hash("ab", 2) != kl__hash("ba", 2));
  assert_true(kl__hash_more(1, "k", 1) != kl__hash_more(2, "k", 1));
}

/* The tables index by the low bits: sids that differ in one character
 * (an event id's counter, an entity key's number) must spread over them.
 * 65,536 such keys into 4,096 buckets: no bucket above 40 (16 expected;
 * kl__hash() puts 34 in its fullest, FNV-1a 32, and kl__hash() without
 * its finalizer 177). */
static void test_hash_low_bits_spread(void **state) {
  (void)state;
  static unsigned counts[4096];
  memset(counts, 0, sizeof(counts));
  char key[64];
  for (unsigned i = 0; i < 65536; i++) {
    int n = snprintf(key, sizeof(key),
                     "account-%05u/0190d6a4-7b2c-7def-8abc-%012u", i % 1000, i);
    counts[kl__hash(key, (size_t)n) & 4095]++;
  }
  unsigned max = 0;
  for (size_t i = 0; i < 4096; i++)
    max = counts[i] > max ? counts[i] : max;
  assert_true(max <= 40);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_vectors),
      cmocka_unit_test(test_more_continues),
      cmocka_unit_test(test_hash_alignment_and_length),
      cmocka_unit_test(test_hash_low_bits_spread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
