/* kl__grow(): the one array-doubling helper (common/strbuf.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grows_from_first_then_doubles),
      cmocka_unit_test(test_room_left_keeps_the_array),
      cmocka_unit_test(test_overflow_refused_and_array_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
