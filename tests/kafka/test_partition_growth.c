/*
 * A topic's partition count grows while a worker, a producer and the
 * publish gateway run (CreatePartitions on a real broker: librdkafka
 * 2.0.2's mock cluster cannot add partitions). None was started with an
 * expected count, so the count each saw at start is the expected one, and
 * each notices the change on its timer: kl_publish() refuses with
 * KL_EPARTITIONS naming both counts, the gateway answers 409 with that
 * message, and the worker stops taking the topic: /healthz 503, the
 * mismatch gauge 1, its partitions paused (an event published after the
 * change is not applied).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/cluster.h"
#include "support/http.h"
#include "support/support.h"
#include "cli/metrics_server.h"

#define KL_PARTS 4
#define KL_GROWN 6

static kl_event_t kl_event(const char *key) {
  /* msgpack {"amount": 1, "seq": 1} */
  static const unsigned char payload[] = {0x82, 0xa6, 'a', 'm',  'o',
                                          'u',  'n',  't', 0x01, 0xa3,
                                          's',  'e',  'q', 0x01};
  return (kl_event_t){.key = key,
                      .key_len = strlen(key),
                      .type = "credit",
                      .type_len = 6,
                      .payload = payload,
                      .payload_len = sizeof(payload)};
}

static kl_producer_t *kl_producer(const char *boot) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", boot), KL_OK);
  assert_int_equal(kl_conf_set(conf, "producer.partitions.check.ms", "200"),
                   KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  return producer;
}

static int kl_health(int port) {
  kl_t_http_resp_t r;
  int status = kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &r) == 0
                   ? r.status
                   : 0;
  kl_t_http_resp_free(&r);
  return status;
}

static int kl_post(int port, const char *topic, kl_t_http_resp_t *r) {
  char path[300];
  snprintf(path, sizeof(path), "/v1/topics/%s/events", topic);
  return kl_t_http_once(port, "POST", path,
                        "Content-Type: application/json\r\n",
                        "{\"key\":\"acct-1\",\"type\":\"credit\","
                        "\"payload\":{\"amount\":1,\"seq\":1}}",
                        r);
}

static void test_growth_is_refused(void **state) {
  (void)state;
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "grow", KL_PARTS, &cluster), KL_OK);
  const char *boot = kl_t_bootstrap(cluster);
  const char *topic = kl_t_topic(cluster);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  const char *extra[] = {"worker.session.timeout.ms=3000",
                         "worker.partitions.check.ms=200", NULL};
  kl_t_worker_t *w =
      kl_t_worker_start(boot, topic, kl_t_group(cluster, "g"), store, extra);
  kl_conf_t *mconf = kl_conf_new();
  kl__metrics_server_t *ms;
  assert_int_equal(
      kl__metrics_server_start(":0", mconf, topic, w->worker, store, &ms),
      KL_OK);
  int mport = kl__metrics_server_port(ms);
  const char *gw_extra[] = {"producer.partitions.check.ms=200", NULL};
  kl_t_gateway_t *gw = kl_t_gateway_start(boot, NULL, gw_extra);
  kl_producer_t *producer = kl_producer(boot);

  kl_event_t ev = kl_event("acct-1");
  assert_int_equal(kl_publish(producer, topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  /* The gateway serves a new topic once its Kafka probe answered. */
  for (int i = 0; i < 300 && kl_health(gw->port) != 200; i++)
    kl_t_sleep_ms(100);
  kl_t_http_resp_t r;
  assert_int_equal(kl_post(gw->port, topic, &r), 0);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);
  kl_worker_stats_t st;
  for (int i = 0; i < 300; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.applied == 2 && kl_health(mport) == 200)
      break;
    kl_t_sleep_ms(100);
  }
  assert_int_equal(st.applied, 2);
  assert_int_equal(kl_health(mport), 200);

  assert_int_equal(kl_t_cluster_grow(cluster, topic, KL_GROWN), KL_OK);

  /* The producer refuses within its check period. */
  kl_err_t err = KL_OK;
  for (int i = 0; i < 300 && err != KL_EPARTITIONS; i++) {
    err = kl_publish(producer, topic, &ev, NULL);
    if (err != KL_EPARTITIONS)
      kl_t_sleep_ms(100);
  }
  assert_int_equal(err, KL_EPARTITIONS);
  char want[128];
  snprintf(want, sizeof(want), "has %d partitions now, %d when this producer",
           KL_GROWN, KL_PARTS);
  assert_non_null(strstr(kl_err_detail(), want));
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  /* The gateway answers 409 with the reason. */
  int status = 0;
  for (int i = 0; i < 300 && status != 409; i++) {
    assert_int_equal(kl_post(gw->port, topic, &r), 0);
    status = r.status;
    if (status == 409)
      assert_non_null(strstr(r.body, "partitions now"));
    kl_t_http_resp_free(&r);
    if (status != 409)
      kl_t_sleep_ms(100);
  }
  assert_int_equal(status, 409);

  /* The worker stops taking the topic. */
  for (int i = 0; i < 300 && kl_health(mport) != 503; i++)
    kl_t_sleep_ms(100);
  assert_int_equal(kl_health(mport), 503);
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.partitions_expected, KL_PARTS);
  assert_int_equal(st.partitions_live, KL_GROWN);
  assert_int_equal(kl_t_http_once(mport, "GET", "/metrics", NULL, NULL, &r), 0);
  assert_non_null(strstr(r.body, "keylane_worker_partition_count_mismatch 1"));
  kl_t_http_resp_free(&r);
  /* An event published now (raw, routed by the old count) stays unapplied:
   * its partition is paused. */
  uint64_t applied = st.applied;
  assert_int_equal(kl_t_produce_raw(boot, topic, 0, "k", "x", 1, NULL), 0);
  kl_t_sleep_ms(1000); /* nothing to await: the absence of an effect */
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, applied);
  assert_int_equal(st.dead_letters, 0);

  kl_producer_destroy(producer);
  kl_t_gateway_stop(gw);
  kl__metrics_server_stop(ms);
  kl_conf_destroy(mconf);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
  kl_t_cluster_destroy(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_growth_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
