/*
 * keylane-bench latency through the real executable (KEYLANE_BUILD_DIR's
 * bin/keylane-bench), on an embedded cluster: --handler none measures a
 * bare consumer with the same figures and JSON keys as a worker run, and
 * an unknown handler is refused before any cluster starts. The figures
 * themselves are measured, not tested.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/run.h"
#include "support/support.h"

static void test_unknown_handler_is_refused(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run_for(
      (const char *[]){"latency", "--embedded", "--handler", "ledgr", NULL},
      NULL, 0, 60000, &r);
  assert_int_equal(r.rc, 2);
  if (!strstr(r.err, "--handler ledgr: expected ledger, exec:trivial, "
                     "exec:COMMAND or none"))
    fail_msg("stderr: %s", r.err);
  kl_t_run_free(&r);
}

/* p50 <= p99 <= p999, all measured (not null). */
static void kl_assert_percentiles(const json_t *h) {
  double p50 = json_real_value(json_object_get(h, "p50_ms"));
  double p99 = json_real_value(json_object_get(h, "p99_ms"));
  double p999 = json_real_value(json_object_get(h, "p999_ms"));
  assert_true(json_is_real(json_object_get(h, "p999_ms")));
  assert_true(p50 > 0 && p50 <= p99 && p99 <= p999);
}

static void kl_assert_unmeasured(const json_t *h) {
  assert_true(json_is_null(json_object_get(h, "p50_ms")));
  assert_true(json_is_null(json_object_get(h, "p99_ms")));
  assert_true(json_is_null(json_object_get(h, "p999_ms")));
}

/* The run's keys are a worker run's: scripts read both alike. */
static void kl_assert_keys(json_t *j) {
  static const char *const keys[] = {"cluster",
                                     "handler",
                                     "rate",
                                     "seconds",
                                     "partitions",
                                     "published",
                                     "applied",
                                     "backlog",
                                     "drain_ms",
                                     "warmup_s",
                                     "publish_to_applied",
                                     "taken_to_applied",
                                     "store_commit",
                                     "warmup_publish_to_applied",
                                     NULL};
  size_t n = 0;
  for (; keys[n]; n++)
    if (!json_object_get(j, keys[n]))
      fail_msg("no \"%s\" in the JSON", keys[n]);
  assert_int_equal(json_object_size(j), n);
}

static void test_bare_consumer_measures_kafka_alone(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"latency", "--embedded", "--handler", "none",
                                "--rate", "1000", "--seconds", "1", "--warmup",
                                "1", "--drain-ms", "3000", "--json", NULL},
               NULL, 0, 120000, &r);
  if (r.rc != 0)
    fail_msg("rc %d, stderr: %s", r.rc, r.err);
  json_t *j = kl_t_run_json(&r);
  kl_assert_keys(j);
  assert_string_equal(json_string_value(json_object_get(j, "handler")), "none");
  assert_int_equal(json_integer_value(json_object_get(j, "published")), 2000);
  assert_int_equal(json_integer_value(json_object_get(j, "applied")), 2000);
  assert_int_equal(json_integer_value(json_object_get(j, "backlog")), 0);
  kl_assert_percentiles(json_object_get(j, "publish_to_applied"));
  kl_assert_unmeasured(json_object_get(j, "taken_to_applied"));
  kl_assert_unmeasured(json_object_get(j, "store_commit"));
  kl_assert_percentiles(json_object_get(j, "warmup_publish_to_applied"));
  json_decref(j);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_handler_is_refused),
      cmocka_unit_test(test_bare_consumer_measures_kafka_alone),
  };
  return cmocka_run_group_tests(tests, kl_t_use_bench, NULL);
}
