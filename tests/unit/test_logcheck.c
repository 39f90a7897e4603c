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

/* The store never saw the owner the group committed, or not its last
 * commits: an epoch at least the store's with an offset above both its
 * watermark and the log's start. */
static void test_store_unknown(void **state) {
  kl_partition_state_t empty = {0}, old = {.epoch = 3, .watermark = 40};
  kl__checks_log_result_t c = {.low = 0, .high = 90};
  /* A new fleet: the group committed nothing, or not keylane's epoch. */
  assert_int_equal(kl__checks_log_store_unknown(&empty, 0, -1001, 0, &c), 0);
  assert_int_equal(kl__checks_log_store_unknown(&empty, 0, 90, 0, &c), 0);
  /* The fleet's store: its epoch and watermark at least the group's; a
   * `store reset` (a newer epoch, watermark 0). */
  assert_int_equal(kl__checks_log_store_unknown(&old, 0, 40, 3, &c), 0);
  assert_int_equal(kl__checks_log_store_unknown(&old, 0, 90, 2, &c), 0);
  /* Below the group's epoch with nothing in between to apply again: a
   * rebuild's empty partition, a log retention emptied. */
  assert_int_equal(kl__checks_log_store_unknown(&empty, 0, 0, 4, &c), 0);
  assert_int_equal(kl__checks_log_store_unknown(&empty, 90, 90, 4, &c), 0);
  assert_int_equal(kl__checks_log_store_unknown(&old, 0, 40, 4, &c), 0);
  assert_int_equal(c.verdict, KL__CHECKS_LOG_OK); /* untouched */
  /* An empty store, and a backup, under a group that committed more. */
  assert_int_equal(kl__checks_log_store_unknown(&empty, 0, 90, 4, NULL), 1);
  /* A backup taken while the owner the group committed last ran: the
   * group's offset leads the store's watermark under the same epoch. */
  assert_int_equal(kl__checks_log_store_unknown(&old, 0, 90, 3, &c), 1);
  assert_int_equal(c.committed_epoch, c.store_epoch);
  char same[2048];
  kl__checks_log_describe("events", 3, &c, same, sizeof(same));
  assert_non_null(strstr(same, "it never saw that owner's last commits"));
  assert_int_equal(kl__checks_log_store_unknown(&old, 20, 90, 4, &c), 1);
  assert_int_equal(c.verdict, KL__CHECKS_LOG_STORE_UNKNOWN);
  assert_int_equal(c.committed, 90);
  assert_int_equal(c.committed_epoch, 4);
  assert_int_equal(c.store_epoch, 3);
  assert_int_equal(c.watermark, 40);
  char buf[2048];
  c.low = 20;
  kl__checks_log_describe("events", 3, &c, buf, sizeof(buf));
  assert_non_null(strstr(buf, "topic events partition 3 is unknown to this "
                              "store: the group committed offset 90 with "
                              "owner epoch 4, the store holds watermark 40 "
                              "and epoch 3"));
  assert_non_null(strstr(buf, "records from offset 40 to 89"));
  assert_non_null(strstr(buf, "keylane replay -b BOOTSTRAP -t events -p 3 "
                              "--from watermark"));
  kl__checks_log_store_unknown(&empty, 0, 90, 4, &c);
  c.low = 0;
  kl__checks_log_describe("events", 3, &c, buf, sizeof(buf));
  assert_non_null(strstr(buf, "keylane store rebuild -b BOOTSTRAP -t events "
                              "-p 3 --store STORE"));
  assert_string_equal(kl__checks_log_verdict_name(KL__CHECKS_LOG_STORE_UNKNOWN),
                      "store_unknown");
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
      cmocka_unit_test(test_store_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
