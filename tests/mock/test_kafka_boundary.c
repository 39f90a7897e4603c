/*
 * The Kafka boundary (common/kafka.h): librdkafka's errors mapped to
 * kl_err_t in one place, and every metadata request through one function,
 * so that a topic Kafka refuses (not authorized) is not taken for a missing
 * one, and a topic without a leader yet is waited for, not refused.
 * Against librdkafka's mock cluster, whose topics can be given an error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "common/kafka.h"
#include "common/kafka_pos.h"

typedef struct kl_t_mock {
  rd_kafka_t *owner; /* the mock cluster's own handle */
  rd_kafka_mock_cluster_t *mcluster;
  rd_kafka_t *rk; /* a client of it */
} kl_t_mock_t;

static rd_kafka_t *kl_t_handle(const char *bootstrap) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
  if (bootstrap)
    assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap,
                                       errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  assert_non_null(rk);
  return rk;
}

static void kl_t_mock_start(kl_t_mock_t *m) {
  m->owner = kl_t_handle(NULL);
  m->mcluster = rd_kafka_mock_cluster_new(m->owner, 1);
  assert_non_null(m->mcluster);
  m->rk = kl_t_handle(rd_kafka_mock_cluster_bootstraps(m->mcluster));
}

static void kl_t_mock_stop(kl_t_mock_t *m) {
  rd_kafka_destroy(m->rk);
  rd_kafka_mock_cluster_destroy(m->mcluster);
  rd_kafka_destroy(m->owner);
}

static void test_mapping(void **state) {
  (void)state;
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR_NO_ERROR), KL_OK);
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
                   KL_ENOTFOUND);
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR__TRANSPORT),
                   KL_EKAFKA_TRANSIENT);
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE),
                   KL_EKAFKA_TRANSIENT);
  /* Waiting does not cure a refusal. */
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED),
                   KL_EKAFKA);
  assert_int_equal(kl__kafka_err(RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED),
                   KL_EKAFKA);
  assert_false(kl_err_is_retriable(
      kl__kafka_err(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)));
  assert_true(kl__kafka_record_refused(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
  assert_false(kl__kafka_record_refused(RD_KAFKA_RESP_ERR__TRANSPORT));
}

static void test_partition_count_classifies(void **state) {
  (void)state;
  kl_t_mock_t m;
  kl_t_mock_start(&m);
  assert_int_equal(rd_kafka_mock_topic_create(m.mcluster, "ok", 3, 1), 0);
  assert_int_equal(rd_kafka_mock_topic_create(m.mcluster, "secret", 3, 1), 0);
  assert_int_equal(rd_kafka_mock_topic_create(m.mcluster, "new", 3, 1), 0);
  rd_kafka_mock_topic_set_error(m.mcluster, "secret",
                                RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
  rd_kafka_mock_topic_set_error(m.mcluster, "new",
                                RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE);
  int32_t count = 0;
  assert_int_equal(kl__kafka_partition_count(m.rk, "ok", 10000, &count), KL_OK);
  assert_int_equal(count, 3);
  /* Not authorized: said so, and not retriable; not "does not exist". */
  assert_int_equal(kl__kafka_partition_count(m.rk, "secret", 10000, &count),
                   KL_EKAFKA);
  assert_non_null(strstr(kl_err_detail(), "topic secret"));
  assert_non_null(strstr(kl_err_detail(), "uthoriz"));
  /* No leader yet: worth waiting for. */
  assert_int_equal(kl__kafka_partition_count(m.rk, "new", 10000, &count),
                   KL_EKAFKA_TRANSIENT);
  kl_t_mock_stop(&m);
}

/* A cluster that does not answer: the request's own failure, transient,
 * naming what was asked and the timeout. */
static void test_metadata_unreachable(void **state) {
  (void)state;
  rd_kafka_t *rk = kl_t_handle("127.0.0.1:1");
  const struct rd_kafka_metadata *md = NULL;
  kl_err_t err = kl__kafka_metadata(rk, "events", 300, &md);
  assert_int_equal(err, KL_EKAFKA_TRANSIENT);
  assert_non_null(strstr(kl_err_detail(), "topic events within 300 ms"));
  assert_int_equal(kl__kafka_metadata(rk, NULL, 300, &md), KL_EKAFKA_TRANSIENT);
  assert_non_null(strstr(kl_err_detail(), "the cluster within 300 ms"));
  rd_kafka_destroy(rk);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mapping),
      cmocka_unit_test(test_partition_count_classifies),
      cmocka_unit_test(test_metadata_unreachable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
