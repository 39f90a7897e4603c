/*
 * The group's offsets follow the store's watermarks also when an offset
 * commit fails: the coordinator refuses the first ones (a rebalance in
 * progress), and a partition that then goes idle still gets its offset,
 * sent again at the next tick (kl__lanes_kafka_committed()). Before, the
 * lanes took a commit as sent and an idle partition's group offset stayed
 * behind its watermark for good: lag monitors and the console showed a
 * lag that was not there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "support/kafka_read.h"
#include "support/support.h"

static void test_failed_offset_commit_is_sent_again(void **state) {
  (void)state;
  char dir[64], errstr[256];
  kl_t_tmpdir(dir);
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  rd_kafka_conf_set(kconf, "log_level", "0", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, kconf, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, 1);
  assert_non_null(mc);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "oc", 1, 1), 0);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "oc.dlq", 1, 1), 0);
  const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
  for (int i = 0; i < 3; i++) {
    char id[40];
    snprintf(id, sizeof(id), "0190a0a0-0000-7000-8000-00000000000%d", i);
    assert_int_equal(kl_t_produce_credit(boot, "oc", 0, "acct-1", id, 5), 0);
  }
  /* Every offset commit of the first ones fails: the one at assignment
   * and the lanes' after the events' store commit. */
  rd_kafka_mock_push_request_errors(mc, 8 /* OffsetCommit */, 6,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                    RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_t_worker_t *w = kl_t_worker_start(boot, "oc", "g-oc", store, NULL);
  kl_partition_state_t st = {0};
  for (int i = 0; i < 300 && st.watermark < 3; i++) {
    kl_t_sleep_ms(100);
    kl_store_partition(store, "oc", 0, &st);
  }
  assert_int_equal(st.watermark, 3);
  /* The partition is idle now: only a commit sent again moves the
   * group's offset to the watermark. */
  int64_t committed = -1;
  for (int i = 0; i < 100 && committed != 3; i++) {
    kl_t_sleep_ms(100);
    committed = kl_t_committed(boot, "g-oc", "oc", 0);
  }
  assert_int_equal(committed, 3);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_store_destroy(store);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(rk);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_failed_offset_commit_is_sent_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
