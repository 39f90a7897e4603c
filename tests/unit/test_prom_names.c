/* The Prometheus naming-convention checker (support/prom.h) refuses each
 * kind of bad name, so the /metrics tests that run it catch them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "support/prom.h"

static int kl_check(const char *name, const char *type, char *err,
                    size_t size) {
  char text[512];
  snprintf(text, sizeof(text), "# HELP %s h\n# TYPE %s %s\n%s 1\n", name, name,
           type, name);
  return kl_t_prom_conventions(text, err, size);
}

static void test_accepts(void **state) {
  char err[256];
  const char *good[][2] = {
      {"keylane_worker_events_applied_total", "counter"},
      {"keylane_worker_lag_seconds", "gauge"},
      {"keylane_gateway_request_duration_seconds", "histogram"},
      {"keylane_gateway_inflight_bytes", "gauge"},
      {"keylane_x_seconds_total", "counter"},
      {"kafka_consumergroup_lag", "gauge"},
  };
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
    if (kl_check(good[i][0], good[i][1], err, sizeof(err)) != 0)
      fail_msg("%s refused: %s", good[i][0], err);
}

static void test_refuses(void **state) {
  char err[256];
  const char *bad[][3] = {
      {"keylane_worker_applied", "counter", "ends in _total"},
      {"keylane_worker_owned_total", "gauge", "only counters"},
      {"keylane_worker_commit_ms", "histogram", "base unit"},
      {"keylane_worker_wait_minutes", "gauge", "base unit"},
      {"keylane_store_size_kb", "gauge", "base unit"},
      {"keylane_worker_seconds_lag", "gauge", "goes last"},
      {"keylane_Worker_lag", "gauge", "snake"},
      {"worker_lag", "gauge", "keylane_"},
      {"keylane_worker_commit_count", "gauge", "histogram"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    if (kl_check(bad[i][0], bad[i][1], err, sizeof(err)) == 0)
      fail_msg("%s (%s) accepted", bad[i][0], bad[i][1]);
    if (!strstr(err, bad[i][2]) || !strstr(err, bad[i][0]))
      fail_msg("%s: \"%s\" does not say \"%s\"", bad[i][0], err, bad[i][2]);
  }
  assert_int_equal(kl_t_prom_conventions("# TYPE keylane_x gauge\nkeylane_x "
                                         "1\n",
                                         err, sizeof(err)),
                   -1);
  assert_non_null(strstr(err, "HELP"));
  assert_int_equal(kl_t_prom_conventions("", err, sizeof(err)), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accepts),
      cmocka_unit_test(test_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
