/*
 * The environment checks' judgements (worker/checks.h), without a cluster:
 * a topic's retention against store.dedup.retention at its boundaries, and
 * the durations its messages name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "worker/checks.h"

static void test_duration_format(void **state) {
  (void)state;
  static const struct {
    int64_t ms;
    const char *text;
  } cases[] = {{604800000, "7d"}, {129600000, "36h"}, {90000, "90s"},
               {120000, "2m"},    {250, "250ms"},     {1500, "1500ms"},
               {0, "0ms"}};
  char buf[32];
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl__duration_format(cases[i].ms, buf, sizeof(buf));
    assert_string_equal(buf, cases[i].text);
  }
}

static void test_retention_judged_at_its_boundaries(void **state) {
  (void)state;
  kl__check_t c;
  kl__check_retention_judge("topic", "events", 604800000,
                            "retention.ms=604800000", 604800000, &c);
  assert_int_equal(c.status, KL__CHECK_OK); /* equal covers it */
  kl__check_retention_judge("topic", "events", 604800001,
                            "retention.ms=604800001", 604800000, &c);
  assert_int_equal(c.status, KL__CHECK_FAIL);
  assert_non_null(strstr(c.msg, "at least 604800001ms"));
  kl__check_retention_judge("dead-letter topic", "events.dlq", 3600000,
                            "retention.ms=3600000", 604800000, &c);
  assert_int_equal(c.status, KL__CHECK_OK); /* shorter is safe */
  kl__check_retention_judge("dead-letter topic", "events.dlq", -1,
                            "retention.ms=-1", 8640000000000LL, &c);
  assert_int_equal(c.status, KL__CHECK_FAIL); /* no finite dedup covers it */
  assert_non_null(strstr(c.msg, "dead-letter topic events.dlq keeps records "
                                "forever (retention.ms=-1) but "
                                "store.dedup.retention is 100000d"));
  assert_non_null(strstr(c.msg, "worker.retention.check=warn"));
  assert_string_equal(kl__check_status_name(c.status), "FAIL");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_duration_format),
      cmocka_unit_test(test_retention_judged_at_its_boundaries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
