/*
 * keylane-bench failover --quick through the real executable
 * (KEYLANE_BUILD_DIR's bin/keylane-bench) on the kafka suite's broker: each
 * scenario runs, prints its figures under the JSON keys scripts read, and
 * applies every event exactly once; a scenario list that names none is
 * refused before anything starts. The figures themselves are measured, not
 * tested.
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

static void test_unknown_scenario_is_refused(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"failover", "--scenarios", "reboot", NULL},
               NULL, 0, 60000, &r);
  assert_int_equal(r.rc, 2);
  if (!strstr(r.err, "--scenarios reboot names none of roll, kill-restart, "
                     "kill, stop"))
    fail_msg("stderr: %s", r.err);
  kl_t_run_free(&r);
}

static void assert_window(const json_t *w) {
  static const char *const keys[] = {"events", "p50_ms", "p99_ms", "max_ms"};
  for (size_t i = 0; i < 4; i++)
    assert_true(json_is_integer(json_object_get(w, keys[i])));
  json_int_t p50 = json_integer_value(json_object_get(w, "p50_ms"));
  json_int_t p99 = json_integer_value(json_object_get(w, "p99_ms"));
  json_int_t max = json_integer_value(json_object_get(w, "max_ms"));
  assert_true(json_integer_value(json_object_get(w, "events")) > 0);
  assert_true(p50 >= 0 && p50 <= p99 && p99 <= max);
}

static void test_quick_run(void **state) {
  (void)state;
  const char *boot = getenv("KEYLANE_TEST_BOOTSTRAP");
  if (!boot || !*boot)
    skip(); /* the kafka suite's fixture sets it */
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"failover", "--quick", "--bootstrap", boot,
                                "--json", NULL},
               NULL, 0, 110000, &r);
  if (r.rc != 0)
    fail_msg("rc %d, stderr: %s", r.rc, r.err);
  json_t *j = kl_t_run_json(&r);
  assert_int_equal(json_integer_value(json_object_get(j, "workers")), 2);
  json_t *list = json_object_get(j, "scenarios");
  static const char *const names[] = {"roll-static", "kill-restart-static",
                                      "kill-dynamic", "stop-dynamic"};
  assert_int_equal(json_array_size(list), 4);
  for (size_t i = 0; i < 4; i++) {
    json_t *x = json_array_get(list, i);
    assert_string_equal(json_string_value(json_object_get(x, "scenario")),
                        names[i]);
    assert_true(json_is_null(json_object_get(x, "error")));
    assert_true(json_is_true(json_object_get(x, "nothing_applied_twice")));
    assert_int_equal(json_integer_value(json_object_get(x, "published")),
                     json_integer_value(json_object_get(x, "applied")));
    assert_int_equal(
        json_integer_value(json_object_get(x, "worker_exits_failed")), 0);
    assert_true(json_is_boolean(json_object_get(x, "target_met")));
    assert_window(json_object_get(x, "steady"));
    assert_window(json_object_get(x, "during"));
  }
  json_decref(j);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_scenario_is_refused),
      cmocka_unit_test(test_quick_run),
  };
  return cmocka_run_group_tests(tests, kl_t_use_bench, NULL);
}
