/* librdkafka feature gating (common/kafka_features.h): the decision for
 * built/loaded version pairs, the consumer properties each gets, that they
 * are exactly what the librdkafka loaded here accepts, and a worker asked
 * for KIP-848's protocol on a librdkafka without it refusing to start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "common/kafka.h"
#include "common/kafka_features.h"
#include "keylane/worker.h"
#include "support/support.h"

#define V(a, b, c) KL__RDK_V(a, b, c)

static void test_decision(void **state) {
  kl__rdk_features_t f = kl__rdk_features(V(2, 0, 2), V(2, 0, 2));
  assert_false(f.fetch_queue_backoff || f.consumer_protocol || f.topic_ids);
  /* Properties follow the library loaded, APIs need both. */
  f = kl__rdk_features(V(2, 0, 2), V(2, 6, 0));
  assert_true(f.fetch_queue_backoff);
  assert_false(f.consumer_protocol);
  assert_false(f.topic_ids);
  f = kl__rdk_features(V(2, 6, 0), V(2, 0, 2));
  assert_false(f.fetch_queue_backoff || f.topic_ids);
  f = kl__rdk_features(V(2, 3, 0), V(2, 3, 0));
  assert_true(f.fetch_queue_backoff && f.topic_ids);
  assert_false(f.consumer_protocol);
  f = kl__rdk_features(V(2, 12, 0), V(2, 16, 1));
  assert_true(f.fetch_queue_backoff && f.consumer_protocol && f.topic_ids);
  f = kl__rdk_features(V(2, 12, 0), V(2, 12, 0) - 0xff + 1); /* 2.12.0-RC1 */
  assert_false(f.consumer_protocol);
  f = kl__rdk_features(V(2, 2, 0), V(2, 1, 1));
  assert_false(f.fetch_queue_backoff);
  f = kl__rdk_features_here();
  assert_int_equal(f.built, RD_KAFKA_VERSION);
  assert_int_equal(f.loaded, rd_kafka_version());
}

static void test_version_str(void **state) {
  char s[32];
  kl__rdk_version_str(V(2, 0, 2), s, sizeof(s));
  assert_string_equal(s, "2.0.2");
  kl__rdk_version_str(V(2, 13, 0) - 0xff + 1, s, sizeof(s));
  assert_string_equal(s, "2.13.0-RC1");
  kl__rdk_version_str(rd_kafka_version(), s, sizeof(s));
  assert_non_null(strstr(rd_kafka_version_str(), s));
}

static const char *kl_get(const char *const *d, const char *name) {
  for (size_t i = 0; d[i]; i += 2)
    if (strcmp(d[i], name) == 0)
      return d[i + 1];
  return NULL;
}

static void test_consumer_defaults(void **state) {
  const char *d[KL__RDK_DEFAULTS_MAX];
  kl__rdk_features_t old = kl__rdk_features(V(2, 0, 2), V(2, 0, 2));
  assert_int_equal(kl__rdk_consumer_defaults(&old, 0, "g", "10000", "1000", d),
                   KL_OK);
  assert_string_equal(kl_get(d, "queued.min.messages"), "1000000");
  assert_null(kl_get(d, "fetch.queue.backoff.ms"));
  assert_string_equal(kl_get(d, "partition.assignment.strategy"),
                      "cooperative-sticky");
  assert_string_equal(kl_get(d, "session.timeout.ms"), "10000");
  assert_null(kl_get(d, "group.protocol"));

  kl__rdk_features_t newer = kl__rdk_features(V(2, 0, 2), V(2, 2, 0));
  assert_int_equal(
      kl__rdk_consumer_defaults(&newer, 0, "g", "10000", "1000", d), KL_OK);
  assert_string_equal(kl_get(d, "fetch.queue.backoff.ms"), "10");
  assert_null(kl_get(d, "queued.min.messages"));

  assert_int_equal(kl__rdk_consumer_defaults(&old, 1, "g", "1", "1", d),
                   KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "2.12.0"));
  assert_non_null(strstr(kl_err_detail(), "librdkafka 2.0.2"));
  assert_non_null(strstr(kl_err_detail(), "worker.group.protocol=classic"));

  kl__rdk_features_t kip848 = kl__rdk_features(V(2, 12, 0), V(2, 12, 0));
  assert_int_equal(kl__rdk_consumer_defaults(&kip848, 1, "g", "1", "1", d),
                   KL_OK);
  assert_string_equal(kl_get(d, "group.protocol"), "consumer");
  assert_string_equal(kl_get(d, "group.id"), "g");
  assert_null(kl_get(d, "session.timeout.ms"));
  assert_null(kl_get(d, "heartbeat.interval.ms"));
  assert_null(kl_get(d, "partition.assignment.strategy"));
}

/* @returns what kl__kafka_conf_apply() says of @p d on the library here. */
static kl_err_t kl_apply(const char *const *d) {
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  kl_err_t err = kl__kafka_conf_apply(kconf, NULL, d);
  rd_kafka_conf_destroy(kconf);
  return err;
}

/* What the decision picks for the library loaded here, it accepts; what
 * it would pick for a newer one, this one may refuse: the run-time check
 * is what keeps a binary built against newer headers working here. */
static void test_loaded_library_accepts(void **state) {
  const char *d[KL__RDK_DEFAULTS_MAX];
  kl__rdk_features_t here = kl__rdk_features_here();
  assert_int_equal(kl__rdk_consumer_defaults(&here, 0, "g", "10000", "1000", d),
                   KL_OK);
  assert_int_equal(kl_apply(d), KL_OK);
  kl__rdk_features_t built_newer =
      kl__rdk_features(V(2, 16, 0), rd_kafka_version());
  assert_int_equal(
      kl__rdk_consumer_defaults(&built_newer, 0, "g", "10000", "1000", d),
      KL_OK);
  assert_int_equal(kl_apply(d), KL_OK);
  if (rd_kafka_version() < KL__RDK_FETCH_QUEUE_BACKOFF) {
    kl__rdk_features_t wrong = kl__rdk_features(V(2, 2, 0), V(2, 2, 0));
    assert_int_equal(
        kl__rdk_consumer_defaults(&wrong, 0, "g", "10000", "1000", d), KL_OK);
    assert_int_not_equal(kl_apply(d), KL_OK);
    assert_non_null(strstr(kl_err_detail(), "fetch.queue.backoff.ms"));
  }
}

static kl_handler_result_t kl_ok(void *opaque, const kl_event_t *event,
                                 const kl_fence_t *fence, kl_txn_t *txn,
                                 char *errbuf, size_t errbuf_size) {
  return KL_HANDLER_OK;
}

static void test_worker_refuses_kip848_without_it(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.group.protocol", "consumer"),
                   KL_OK);
  assert_int_not_equal(kl_conf_set(conf, "worker.group.protocol", "new"),
                       KL_OK);
  kl_worker_t *worker = NULL;
  kl_err_t err = kl_worker_new(conf, "t", store, kl_ok, NULL, &worker);
  if (rd_kafka_version() < KL__RDK_CONSUMER_PROTOCOL) {
    assert_int_equal(err, KL_ECONF);
    assert_non_null(strstr(kl_err_detail(), "worker.group.protocol=consumer"));
  } else {
    assert_int_equal(err, KL_OK);
    kl_worker_destroy(worker);
  }
  kl_conf_destroy(conf);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decision),
      cmocka_unit_test(test_version_str),
      cmocka_unit_test(test_consumer_defaults),
      cmocka_unit_test(test_loaded_library_accepts),
      cmocka_unit_test(test_worker_refuses_kip848_without_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
