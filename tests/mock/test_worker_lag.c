/*
 * What operators' existing dashboards and probes read from a worker's
 * /metrics and /healthz (cli/metrics_server.h), on the embedded
 * cluster: kafka_exporter's kafka_consumergroup_lag{consumergroup,topic,
 * partition}, keylane_worker_lag_seconds from the envelope ts of the
 * oldest unapplied event, /healthz as Burrow-style JSON on ?format=json or
 * Accept: application/json (plain text stays the default), and every
 * metric name keeping Prometheus' conventions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/internal.h"
#include "keylane/producer.h"
#include "cli/metrics_server.h"

#include "support/cluster.h"
#include "support/http.h"
#include "support/prom.h"
#include "support/support.h"

#define KL_AGE_MS 90000 /* how old the held event's envelope ts is */

/* Retries the key "slow" for as long as the test runs; applies others. */
static kl_handler_result_t
kl_slow_handler(void *opaque, const kl_event_t *event, const kl_fence_t *fence,
                kl_txn_t *txn, char *errbuf, size_t errbuf_size) {
  if (event->key_len == 4 && memcmp(event->key, "slow", 4) == 0) {
    snprintf(errbuf, errbuf_size, "held by the test");
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}

static void kl_publish_at(const char *bootstrap, const char *topic,
                          const char *key, int64_t ts) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap),
                   KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  kl_event_t event = {
      .key = key, .key_len = strlen(key), .type = "t", .type_len = 1, .ts = ts};
  assert_int_equal(kl_publish(producer, topic, &event, NULL), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
}

typedef struct kl_fixture {
  char dir[64];
  kl_t_cluster_t *cluster;
  kl_store_t *store;
  kl_t_worker_t *tw;
  kl__metrics_server_t *server;
  const char *group;
  int port;
} kl_fixture_t;

/* A worker of group "lag" on a one-partition topic holding one event of
 * key "slow" published KL_AGE_MS ago in retry backoff, with its /metrics. */
static void kl_fixture_start(kl_fixture_t *f) {
  kl_t_tmpdir(f->dir);
  assert_int_equal(kl_t_cluster_new(1, "lag", 1, &f->cluster), KL_OK);
  const char *bootstrap = kl_t_bootstrap(f->cluster);
  const char *topic = kl_t_topic(f->cluster);
  assert_int_equal(kl_t_cluster_topic_create(f->cluster, "lag.dlq", 1), KL_OK);
  assert_int_equal(kl_store_open(f->dir, NULL, &f->store), KL_OK);
  kl_publish_at(bootstrap, topic, "slow", kl__now_ms() - KL_AGE_MS);
  f->group = kl_t_group(f->cluster, "lag");
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.group", f->group), KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.session.timeout.ms", "3000"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.retry.initial.ms", "600000"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.retry.max.ms", "600000"), KL_OK);
  f->tw = calloc(1, sizeof(*f->tw));
  assert_int_equal(kl_worker_new(conf, topic, f->store, kl_slow_handler, NULL,
                                 &f->tw->worker),
                   KL_OK);
  kl_t_worker_go(f->tw);
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, topic,
                                            f->tw->worker, f->store,
                                            &f->server),
                   KL_OK);
  kl_conf_destroy(conf);
  f->port = kl__metrics_server_port(f->server);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && st.waiting_keys != 1; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(f->tw->worker, &st, sizeof(st));
  }
  assert_int_equal(st.waiting_keys, 1);
}

static void kl_fixture_stop(kl_fixture_t *f) {
  kl__metrics_server_stop(f->server);
  kl_t_worker_stop(f->tw);
  kl_store_destroy(f->store);
  kl_t_cluster_destroy(f->cluster);
  kl_t_rmrf(f->dir);
}

static void kl_get(int port, const char *path, const char *extra,
                   kl_t_http_resp_t *resp) {
  memset(resp, 0, sizeof(*resp));
  assert_int_equal(kl_t_http_once(port, "GET", path, extra, NULL, resp), 0);
}

/* @returns the value of the sample that starts with @p series. */
static double kl_sample(const char *text, const char *series) {
  const char *at = strstr(text, series);
  if (!at)
    fail_msg("no %s in /metrics:\n%s", series, text);
  return strtod(at + strlen(series), NULL);
}

static void test_exporter_lag_and_lag_seconds(void **state) {
  kl_fixture_t f;
  kl_fixture_start(&f);
  kl_t_http_resp_t resp;
  kl_get(f.port, "/metrics", NULL, &resp);
  assert_int_equal(resp.status, 200);
  char err[256], series[256];
  if (kl_t_prom_check(resp.body, err, sizeof(err)) != 0)
    fail_msg("/metrics does not parse: %s\n%s", err, resp.body);
  snprintf(series, sizeof(series),
           "kafka_consumergroup_lag{consumergroup="
           "\"%s\",topic=\"%s\",partition=\"0\"} ",
           f.group, kl_t_topic(f.cluster));
  assert_true(kl_sample(resp.body, series) == 1);
  snprintf(series, sizeof(series),
           "keylane_worker_lag_seconds{topic=\"%s\","
           "partition=\"0\"} ",
           kl_t_topic(f.cluster));
  double age = kl_sample(resp.body, series);
  if (age < KL_AGE_MS / 1000.0 || age > KL_AGE_MS / 1000.0 + 120)
    fail_msg("lag_seconds %g, want about %d", age, KL_AGE_MS / 1000);
  kl_t_http_resp_free(&resp);
  kl_fixture_stop(&f);
}

static json_t *kl_json(const kl_t_http_resp_t *resp) {
  char ctype[128];
  assert_non_null(kl_t_http_header(resp, "content-type", ctype, sizeof(ctype)));
  assert_string_equal(ctype, "application/json");
  json_error_t jerr;
  json_t *doc = json_loads(resp->body, 0, &jerr);
  if (!doc)
    fail_msg("/healthz is not JSON (%s): %s", jerr.text, resp->body);
  return doc;
}

static void kl_assert_warn(json_t *doc) {
  json_t *st = json_object_get(doc, "status");
  assert_string_equal(json_string_value(json_object_get(st, "status")), "WARN");
  json_t *p0 = json_array_get(json_object_get(st, "partitions"), 0);
  assert_string_equal(json_string_value(json_object_get(p0, "status")), "WARN");
  assert_int_equal(json_integer_value(json_object_get(p0, "waiting")), 1);
  assert_true(json_real_value(json_object_get(p0, "lag_seconds")) >=
              KL_AGE_MS / 1000.0);
}

static void test_healthz_json(void **state) {
  kl_fixture_t f;
  kl_fixture_start(&f);
  kl_t_http_resp_t resp;
  kl_get(f.port, "/healthz", NULL, &resp); /* existing probes: plain */
  assert_int_equal(resp.status, 200);
  assert_non_null(strstr(resp.body, "ok: owns 1 partitions"));
  kl_t_http_resp_free(&resp);

  kl_get(f.port, "/healthz?format=json", NULL, &resp);
  assert_int_equal(resp.status, 200);
  json_t *doc = kl_json(&resp);
  kl_assert_warn(doc);
  json_decref(doc);
  kl_t_http_resp_free(&resp);

  kl_get(f.port, "/healthz", "Accept: text/html, application/json\r\n", &resp);
  doc = kl_json(&resp);
  kl_assert_warn(doc);
  json_decref(doc);
  kl_t_http_resp_free(&resp);

  kl_get(f.port, "/healthz?format=text", "Accept: application/json\r\n", &resp);
  assert_non_null(strstr(resp.body, "ok: owns 1 partitions"));
  kl_t_http_resp_free(&resp);
  kl_get(f.port, "/healthz?format=xml", NULL, &resp);
  assert_int_equal(resp.status, 400);
  assert_non_null(strstr(resp.body, "format=json"));
  kl_t_http_resp_free(&resp);
  kl_fixture_stop(&f);
}

static void test_metric_names(void **state) {
  kl_fixture_t f;
  kl_fixture_start(&f);
  kl_t_http_resp_t resp;
  kl_get(f.port, "/metrics", NULL, &resp);
  char err[256];
  if (kl_t_prom_conventions(resp.body, err, sizeof(err)) != 0)
    fail_msg("%s", err);
  kl_t_http_resp_free(&resp);
  kl_fixture_stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exporter_lag_and_lag_seconds),
      cmocka_unit_test(test_healthz_json),
      cmocka_unit_test(test_metric_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
