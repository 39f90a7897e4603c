/*
 * keylane-bench all --compare's judgement (tests/bench/bench_compare.c):
 * the spread of a run's rounds, and a change called a regression only
 * beyond the noise of either run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include <cmocka.h>

#include "bench/bench.h"

static void spread_is_range_over_median(void **state) {
  (void)state;
  const double r[] = {0.40, 0.30, 0.34};
  assert_float_equal(kl_bench_spread(r, 3), (0.40 - 0.30) / 0.34, 1e-9);
  assert_float_equal(r[0], 0.40, 0); /* the caller's rounds stay as given */
  assert_float_equal(kl_bench_spread(r, 1), 0, 0);
  const double even[] = {1, 2, 3, 4};
  assert_float_equal(kl_bench_spread(even, 4), 3 / 2.5, 1e-9);
}

static void change_within_noise_is_same(void **state) {
  (void)state;
  double change, noise;
  kl_bench_figure_t before = {0.37, 0.26}, now = {0.36, 0.17};
  assert_int_equal(kl_bench_compare(&before, &now, &change, &noise),
                   KL_BENCH_SAME);
  assert_float_equal(noise, 0.26, 1e-9);                /* the wider spread */
  assert_true(fabs(change - (0.36 / 0.37 - 1)) < 1e-9); /* negative */
}

static void change_beyond_noise_has_a_verdict(void **state) {
  (void)state;
  double change, noise;
  kl_bench_figure_t before = {0.50, 0.04}, down = {0.40, 0.02},
                    up = {0.60, 0.03};
  assert_int_equal(kl_bench_compare(&before, &down, &change, &noise),
                   KL_BENCH_REGRESSED);
  assert_float_equal(noise, KL_BENCH_NOISE_MIN, 0); /* never below it */
  assert_string_equal(kl_bench_verdict_name(KL_BENCH_REGRESSED), "regressed");
  assert_int_equal(kl_bench_compare(&before, &up, &change, &noise),
                   KL_BENCH_IMPROVED);
  /* 4 % down, below the 5 % floor: noise, even with tight rounds */
  kl_bench_figure_t close = {0.48, 0.0};
  assert_int_equal(kl_bench_compare(&before, &close, &change, &noise),
                   KL_BENCH_SAME);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(spread_is_range_over_median),
      cmocka_unit_test(change_within_noise_is_same),
      cmocka_unit_test(change_beyond_noise_has_a_verdict),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
