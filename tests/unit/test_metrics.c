/* The metrics registry: rendering, label escaping, histograms, the series
 * cap and its overflow series, removal, and updates from many threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"
#include "support/prom.h"

static char *kl_render(kl__metrics_t *m) {
  size_t len = 0;
  char *text = kl__metrics_render(m, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  char err[256];
  if (kl_t_prom_check(text, err, sizeof(err)) != 0)
    fail_msg("%s\n%s", err, text);
  return text;
}

static void test_render_counter_gauge_histogram(void **state) {
  kl__metrics_t *m = kl__metrics_new();
  kl__metric_t *c =
      kl__metrics_counter(m, "req_total", "requests\nby code", "route,code");
  kl__metric_t *g = kl__metrics_gauge(m, "temp", "a gauge", NULL);
  const double b[] = {0.1, 1, 10};
  kl__metric_t *h =
      kl__metrics_histogram(m, "lat_seconds", "latency", NULL, b, 3);
  kl__metric_add(c, (const char *[]){"events", "200"}, 2);
  kl__metric_add(c, (const char *[]){"a\"b\\c\nd", "500"}, 1);
  kl__metric_add(c, (const char *[]){"events", "200"}, -5); /* ignored */
  kl__metric_set(g, NULL, -2.5);
  for (double v = 0.05; v < 20; v *= 2)
    kl__metric_observe(h, NULL, v);
  char *text = kl_render(m);
  assert_non_null(strstr(text, "# HELP req_total requests\\nby code\n"));
  assert_non_null(strstr(text, "req_total{route=\"events\",code=\"200\"} 2\n"));
  assert_non_null(
      strstr(text, "req_total{route=\"a\\\"b\\\\c\\nd\",code=\"500\"} 1\n"));
  assert_non_null(strstr(text, "temp -2.5\n"));
  assert_non_null(strstr(text, "lat_seconds_bucket{le=\"0.1\"} 2\n"));
  assert_non_null(strstr(text, "lat_seconds_bucket{le=\"10\"} 8\n"));
  assert_non_null(strstr(text, "lat_seconds_bucket{le=\"+Inf\"} 9\n"));
  assert_non_null(strstr(text, "lat_seconds_count 9\n"));
  free(text);
  kl__metrics_destroy(m);
}

/* Observations gathered (kl__observed_*) and added in one go render as
 * the same observations made one at a time; a NaN is dropped by both; a
 * NULL series or a counter gathers nothing. */
static void test_observed_as_one_by_one(void **state) {
  (void)state;
  kl__metrics_t *m = kl__metrics_new();
  const double b[] = {0.1, 1, 10};
  kl__metric_t *one =
      kl__metrics_histogram(m, "one_seconds", "one by one", NULL, b, 3);
  kl__metric_t *all =
      kl__metrics_histogram(m, "all_seconds", "in one go", NULL, b, 3);
  kl__series_t *s1 = kl__metric_series(one, NULL);
  kl__observed_t o;
  kl__observed_init(&o, kl__metric_series(all, NULL));
  for (int round = 0; round < 2; round++) { /* flushed twice: it adds */
    for (double v = 0.05; v < 20; v *= 2) {
      kl__series_observe(s1, v);
      kl__observed_add(&o, v);
    }
    kl__series_observe(s1, 0.0 / 0.0);
    kl__observed_add(&o, 0.0 / 0.0);
    kl__observed_flush(&o);
  }
  kl__observed_t none;
  kl__observed_init(&none, NULL);
  kl__observed_add(&none, 1);
  kl__observed_flush(&none);
  kl__observed_init(
      &none, kl__metric_series(
                 kl__metrics_counter(m, "c_total", "a counter", NULL), NULL));
  kl__observed_add(&none, 1);
  kl__observed_flush(&none);
  char *text = kl_render(m);
  const char *lines[] = {"_bucket{le=\"0.1\"} 4\n", "_bucket{le=\"1\"} 10\n",
                         "_bucket{le=\"10\"} 16\n", "_bucket{le=\"+Inf\"} 18\n",
                         "_count 18\n"};
  for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
    char want[64];
    snprintf(want, sizeof(want), "one_seconds%s", lines[i]);
    if (!strstr(text, want))
      fail_msg("no %s in\n%s", want, text);
    snprintf(want, sizeof(want), "all_seconds%s", lines[i]);
    if (!strstr(text, want))
      fail_msg("no %s in\n%s", want, text);
  }
  assert_non_null(strstr(text, "c_total 0\n"));
  free(text);
  kl__metrics_destroy(m);
}

static void test_bad_registrations(void **state) {
  kl__metrics_t *m = kl__metrics_new();
  const double b[] = {1, 0.5};
  assert_null(kl__metrics_counter(m, "1bad", "x", NULL));
  assert_null(kl__metrics_counter(m, "ok", "x", "a,__b"));
  assert_null(kl__metrics_counter(m, "ok", "x", "a,b-c"));
  assert_null(kl__metrics_histogram(m, "h", "x", "le", NULL, 0));
  assert_null(kl__metrics_histogram(m, "h", "x", NULL, b, 2));
  assert_non_null(kl__metrics_gauge(m, "dup", "x", NULL));
  assert_null(kl__metrics_gauge(m, "dup", "x", NULL));
  kl__metric_add(NULL, NULL, 1); /* a failed registration costs nothing */
  kl__series_observe(NULL, 1);
  kl__metrics_destroy(m);
}

static void test_series_cap_and_remove(void **state) {
  kl__metrics_t *m = kl__metrics_new();
  kl__metric_t *g = kl__metrics_gauge(m, "lag", "lag", "topic,partition");
  kl__metric_set_max_series(g, 4);
  char p[16];
  for (int i = 0; i < 10; i++) {
    snprintf(p, sizeof(p), "%d", i);
    kl__metric_set(g, (const char *[]){"t", p}, i);
  }
  char *text = kl_render(m);
  assert_non_null(strstr(text, "lag{topic=\"t\",partition=\"3\"} 3\n"));
  assert_null(strstr(text, "partition=\"4\""));
  assert_non_null(
      strstr(text, "lag{topic=\"_overflow\",partition=\"_overflow\"} 9\n"));
  assert_non_null(strstr(text, "keylane_metrics_overflow_total 6\n"));
  free(text);
  kl__metric_remove(g, (const char *[]){"t", "0"});
  kl__metric_set(g, (const char *[]){"t", "42"}, 1); /* room again */
  text = kl_render(m);
  assert_null(strstr(text, "partition=\"0\""));
  assert_non_null(strstr(text, "partition=\"42\"} 1\n"));
  free(text);
  kl__metrics_destroy(m);
}

/* A scrape's registry and one kept across scrapes render as one document:
 * both registries' families, the overflow counter once (their sum). */
static void test_render_with(void **state) {
  kl__metrics_t *scrape = kl__metrics_new(), *kept = kl__metrics_new();
  kl__metric_t *g = kl__metrics_gauge(kept, "g", "g", "topic");
  kl__metric_set_max_series(g, 1);
  kl__metric_set(g, (const char *[]){"a"}, 1);
  kl__metric_set(g, (const char *[]){"b"}, 2); /* overflows once */
  kl__metric_add(kl__metrics_counter(scrape, "c_total", "c", NULL), NULL, 3);
  size_t len;
  char *text = kl__metrics_render_with(scrape, kept, &len);
  assert_int_equal(strlen(text), len);
  char err[256];
  if (kl_t_prom_check(text, err, sizeof(err)) != 0)
    fail_msg("%s\n%s", err, text);
  assert_non_null(strstr(text, "keylane_metrics_overflow_total 1\n"));
  char *first = strstr(text, "# TYPE keylane_metrics_overflow_total");
  assert_null(strstr(first + 1, "# TYPE keylane_metrics_overflow_total"));
  assert_non_null(strstr(text, "c_total 3\n"));
  assert_non_null(strstr(text, "g{topic=\"a\"} 1\n"));
  free(text);
  kl__metrics_destroy(scrape);
  kl__metrics_destroy(kept);
}

static double kl_seven(void *opaque) {
  return *(double *)opaque;
}

static void test_gauge_fn(void **state) {
  kl__metrics_t *m = kl__metrics_new();
  double v = 7;
  assert_non_null(kl__metrics_gauge_fn(m, "seven", "s", kl_seven, &v));
  char *text = kl_render(m);
  assert_non_null(strstr(text, "seven 7\n"));
  free(text);
  kl__metrics_destroy(m);
}

typedef struct kl_tm {
  kl__metric_t *c;
  kl__metric_t *h;
} kl_tm_t;

static void *kl_hammer(void *opaque) {
  kl_tm_t *t = opaque;
  for (int i = 0; i < 20000; i++) {
    kl__metric_add(t->c, (const char *[]){i % 2 ? "a" : "b"}, 1);
    kl__metric_observe(t->h, NULL, i % 3);
  }
  return NULL;
}

static void test_threads(void **state) {
  kl__metrics_t *m = kl__metrics_new();
  const double b[] = {0.5, 1.5};
  kl_tm_t t = {kl__metrics_counter(m, "n_total", "n", "k"),
               kl__metrics_histogram(m, "h", "h", NULL, b, 2)};
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&th[i], NULL, kl_hammer, &t);
  for (int i = 0; i < 4; i++) {
    char *text = kl_render(m); /* rendering while others update */
    free(text);
  }
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  assert_true(kl__series_value(kl__metric_series(t.c, (const char *[]){"a"})) ==
              40000);
  assert_true(kl__series_value(kl__metric_series(t.h, NULL)) == 80000);
  kl__metrics_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_render_counter_gauge_histogram),
      cmocka_unit_test(test_observed_as_one_by_one),
      cmocka_unit_test(test_render_with),
      cmocka_unit_test(test_bad_registrations),
      cmocka_unit_test(test_series_cap_and_remove),
      cmocka_unit_test(test_gauge_fn),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
