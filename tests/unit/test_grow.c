/* kl__grow(), kl__reserve() and kl__grow_zeroed(): the one growable array
 * (common/strbuf.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/strbuf.h"

static void test_grows_from_first_then_doubles(void **state) {
  (void)state;
  int *v = NULL;
  size_t cap = 0, n = 0;
  for (int i = 0; i < 100; i++) {
    int *grown = kl__grow(v, &cap, n, sizeof(*v), 4);
    assert_non_null(grown);
    v = grown;
    assert_true(n < cap);
    v[n++] = i;
  }
  assert_int_equal(cap, 128); /* 4, 8, ..., 128 */
  for (int i = 0; i < 100; i++)
    assert_int_equal(v[i], i);
  free(v);
}

static void test_room_left_keeps_the_array(void **state) {
  (void)state;
  size_t cap = 8;
  int *v = malloc(cap * sizeof(*v));
  assert_ptr_equal(kl__grow(v, &cap, 7, sizeof(*v), 4), v);
  assert_int_equal(cap, 8);
  free(v);
}

/* A size past SIZE_MAX is refused, not wrapped into a small buffer, and
 * the caller keeps its array and capacity. */
static void test_overflow_refused_and_array_kept(void **state) {
  (void)state;
  size_t cap = 4;
  char *v = malloc(cap);
  assert_null(kl__grow(v, &cap, 4, SIZE_MAX / 4, 1));
  assert_int_equal(cap, 4);
  cap = SIZE_MAX / 2 + 1;
  assert_null(kl__grow(v, &cap, cap, 1, 1));
  assert_int_equal(cap, SIZE_MAX / 2 + 1);
  free(v);
}

/* Room for many at once: doubled from first (or the capacity) until they
 * fit, not grown to the exact count. */
static void test_reserve_doubles_until_it_fits(void **state) {
  (void)state;
  size_t cap = 0;
  char *v = kl__reserve(NULL, &cap, 1000, 1, 256);
  assert_non_null(v);
  assert_int_equal(cap, 1024);
  assert_ptr_equal(kl__reserve(v, &cap, 1024, 1, 256), v); /* fits */
  v = kl__reserve(v, &cap, 5000, 1, 256);
  assert_non_null(v);
  assert_int_equal(cap, 8192);
  free(v);
  cap = 4;
  char *w = malloc(cap);
  assert_null(kl__reserve(w, &cap, SIZE_MAX, 1, 1)); /* would wrap */
  assert_int_equal(cap, 4);
  free(w);
}

/* An array indexed by partition grows to the partition seen, exactly,
 * the new entries zero and the old ones kept. */
static void test_grow_zeroed_exact_and_zero(void **state) {
  (void)state;
  int *v = kl__grow_zeroed(NULL, 0, 3, sizeof(*v));
  assert_non_null(v);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(v[i], 0);
    v[i] = i + 1;
  }
  v = kl__grow_zeroed(v, 3, 7, sizeof(*v));
  assert_non_null(v);
  for (int i = 0; i < 3; i++)
    assert_int_equal(v[i], i + 1);
  for (int i = 3; i < 7; i++)
    assert_int_equal(v[i], 0);
  assert_null(kl__grow_zeroed(v, 7, SIZE_MAX / 2, sizeof(*v)));
  free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grows_from_first_then_doubles),
      cmocka_unit_test(test_room_left_keeps_the_array),
      cmocka_unit_test(test_overflow_refused_and_array_kept),
      cmocka_unit_test(test_reserve_doubles_until_it_fits),
      cmocka_unit_test(test_grow_zeroed_exact_and_zero),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
