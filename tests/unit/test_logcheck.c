/*
 * The log against the store's watermark (worker/checks_log.h): the
 * comparison the worker's log guard and `keylane doctor` share, and the
 * message that names the figures and the fix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "worker/checks_log.h"

static void test_classify(void **state) {
  kl__checks_log_result_t c;
  /* The watermark inside the retained log, at its end, at its start. */
  assert_int_equal(kl__checks_log_classify(0, 100, 50, &c), KL__CHECKS_LOG_OK);
  assert_int_equal(kl__checks_log_classify(0, 100, 100, &c), KL__CHECKS_LOG_OK);
  assert_int_equal(kl__checks_log_classify(30, 100, 30, &c), KL__CHECKS_LOG_OK);
  assert_int_equal(c.lost, 0);
  /* Nothing applied: a consumer starts at the log's beginning. */
  assert_int_equal(kl__checks_log_classify(500, 900, 0, &c), KL__CHECKS_LOG_OK);
  /* The log ends below it: recreated or truncated. */
  assert_int_equal(kl__checks_log_classify(0, 10, 33, &c),
                   KL__CHECKS_LOG_BACKWARDS);
  assert_int_equal(c.high, 10);
  assert_int_equal(c.watermark, 33);
  assert_int_equal(c.lost, 0);
  /* An empty recreated log that retention already moved past 0. */
  assert_int_equal(kl__checks_log_classify(5, 5, 33, &c),
                   KL__CHECKS_LOG_BACKWARDS);
  /* The log starts above it: records deleted before they were applied. */
  assert_int_equal(kl__checks_log_classify(170, 772, 22, &c),
                   KL__CHECKS_LOG_GAP);
  assert_int_equal(c.lost, 148);
  assert_int_equal(kl__checks_log_classify(170, 772, 22, NULL),
                   KL__CHECKS_LOG_GAP);
}

static void test_names_and_messages(void **state) {
  assert_string_equal(kl__checks_log_verdict_name(KL__CHECKS_LOG_OK), "ok");
  assert_string_equal(kl__checks_log_verdict_name(KL__CHECKS_LOG_BACKWARDS),
                      "went_backwards");
  assert_string_equal(kl__checks_log_verdict_name(KL__CHECKS_LOG_GAP),
                      "retention_gap");
  kl__checks_log_result_t c;
  char buf[1024];
  kl__checks_log_classify(0, 10, 33, &c);
  kl__checks_log_describe("events", 3, &c, buf, sizeof(buf));
  assert_non_null(strstr(buf, "topic events partition 3 went backwards: its "
                              "log ends at offset 10, below the store's "
                              "watermark 33"));
  assert_non_null(strstr(buf, "keylane store reset -t events -p 3"));
  kl__checks_log_classify(170, 772, 22, &c);
  kl__checks_log_describe("events", 3, &c, buf, sizeof(buf));
  assert_non_null(strstr(buf, "topic events partition 3 lost 148 records: "
                              "its log starts at offset 170, above the "
                              "store's watermark 22"));
  assert_non_null(strstr(buf, "worker.on.gap=skip"));
  kl__checks_log_classify(0, 100, 50, &c);
  assert_string_equal(
      kl__checks_log_describe("events", 3, &c, buf, sizeof(buf)), "");
  /* A short buffer is cut, never overrun. */
  kl__checks_log_classify(0, 10, 33, &c);
  kl__checks_log_describe("events", 3, &c, buf, 16);
  assert_int_equal(strlen(buf), 15);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_names_and_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
