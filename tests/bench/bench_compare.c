/*
 * Statistics over a benchmark's rounds, and keylane-bench all --compare:
 * whether a ratio moved beyond its noise. Pure functions, tested by
 * tests/unit/test_bench_compare.c.
 */
#include <math.h>
#include <stdlib.h>

#include "bench.h"

static int kl_bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double kl_bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), kl_bench_cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double kl_bench_spread(const double *rounds, int n) {
  if (n < 2 || n > KL_BENCH_ROUNDS_MAX)
    return 0;
  double v[KL_BENCH_ROUNDS_MAX];
  for (int i = 0; i < n; i++)
    v[i] = rounds[i];
  double median = kl_bench_median(v, n); /* sorted: v[0] low, v[n-1] high */
  return median > 0 ? (v[n - 1] - v[0]) / median : 0;
}

kl_bench_verdict_t kl_bench_compare(const kl_bench_figure_t *before,
                                    const kl_bench_figure_t *now,
                                    double *change, double *noise) {
  *noise = fmax(KL_BENCH_NOISE_MIN, fmax(before->spread, now->spread));
  *change = before->value > 0 ? now->value / before->value - 1 : 0;
  if (*change < -*noise)
    return KL_BENCH_REGRESSED;
  if (*change > *noise)
    return KL_BENCH_IMPROVED;
  return KL_BENCH_SAME;
}

const char *kl_bench_verdict_name(kl_bench_verdict_t v) {
  return v == KL_BENCH_REGRESSED  ? "regressed"
         : v == KL_BENCH_IMPROVED ? "improved"
                                  : "same";
}
