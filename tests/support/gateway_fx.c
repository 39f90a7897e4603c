#include "support/gateway_fx.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "keylane/event.h"
#include "support/support.h"

static rd_kafka_t *mock_rk;
rd_kafka_mock_cluster_t *kl_t_gw_mc;
char kl_t_gw_bootstrap[512];

/* Reconnect fast once brokers come back; answer 503 within 2 s. */
static const char *const fast[] = {"kafka.reconnect.backoff.max.ms=200", NULL};

static void quiet_log(const rd_kafka_t *rk, int level, const char *fac,
                      const char *buf) {
  (void)rk, (void)level, (void)fac, (void)buf;
}

int kl_t_gw_up(void **state) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(conf, quiet_log);
  mock_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  assert_non_null(mock_rk);
  kl_t_gw_mc = rd_kafka_mock_cluster_new(mock_rk, KL_T_GW_BROKERS);
  assert_non_null(kl_t_gw_mc);
  rd_kafka_mock_topic_create(kl_t_gw_mc, KL_T_GW_TOPIC, KL_T_GW_PARTS,
                             KL_T_GW_BROKERS);
  /* The gateway serves topics that exist (test_missing_topic_is_404). */
  static const char *const more[] = {"events.dlq", "orders-1", "junk-0",
                                     "junk-1",     "junk-2",   "delayed"};
  for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
    rd_kafka_mock_topic_create(kl_t_gw_mc, more[i], 4, KL_T_GW_BROKERS);
  snprintf(kl_t_gw_bootstrap, sizeof(kl_t_gw_bootstrap), "%s",
           rd_kafka_mock_cluster_bootstraps(kl_t_gw_mc));
  return 0;
}

int kl_t_gw_down(void **state) {
  rd_kafka_mock_cluster_destroy(kl_t_gw_mc);
  rd_kafka_destroy(mock_rk);
  return 0;
}

void kl_t_gw_brokers(int up) {
  for (int id = 1; id <= KL_T_GW_BROKERS; id++)
    if (up)
      rd_kafka_mock_broker_set_up(kl_t_gw_mc, id);
    else
      rd_kafka_mock_broker_set_down(kl_t_gw_mc, id);
}

kl_t_gateway_t *kl_t_gw_start(const kl__gateway_opts_t *opts) {
  kl__gateway_opts_t o;
  if (opts)
    o = *opts;
  else
    kl__gateway_opts_default(&o);
  if (!opts)
    o.produce_timeout_ms = 2000;
  return kl_t_gateway_start(kl_t_gw_bootstrap, &o, fast);
}

void kl_t_gw_wait_health(int port, int want) {
  for (int i = 0; i < 200; i++) {
    kl_t_http_resp_t r;
    int rc = kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &r);
    int status = rc == 0 ? r.status : 0;
    kl_t_http_resp_free(&r);
    if (status == want)
      return;
    kl_t_sleep_ms(50);
  }
  fail_msg("/healthz never answered %d", want);
}

static bool kl_has_ctype(const char *extra) {
  for (const char *p = extra; p && *p; p++)
    if (strncasecmp(p, "content-type:", 13) == 0)
      return true;
  return false;
}

int kl_t_gw_post(int port, const char *topic, const char *extra,
                 const char *body, kl_t_http_resp_t *r) {
  char path[300], head[2048];
  snprintf(path, sizeof(path), "/v1/topics/%s/events", topic);
  snprintf(head, sizeof(head), "%s%s",
           kl_has_ctype(extra) ? "" : KL_T_GW_JSON_CT, extra ? extra : "");
  return kl_t_http_once(port, "POST", path, head, body, r);
}

json_t *kl_t_gw_json(const kl_t_http_resp_t *r) {
  json_error_t err;
  json_t *v = json_loadb(r->body ? r->body : "", r->body_len, 0, &err);
  if (!v)
    fail_msg("not JSON (%s): %.200s", err.text, r->body ? r->body : "");
  return v;
}

void kl_t_gw_assert_routed(const kl_t_http_resp_t *r, const char *const *keys,
                           size_t n) {
  assert_int_equal(r->status, 200);
  json_t *arr = kl_t_gw_json(r);
  assert_true(json_is_array(arr));
  assert_int_equal(json_array_size(arr), n);
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    int32_t want = kl_partition(keys[i], strlen(keys[i]), KL_T_GW_PARTS);
    assert_int_equal(json_integer_value(json_object_get(o, "partition")), want);
    assert_true(json_integer_value(json_object_get(o, "offset")) >= 0);
    assert_true(json_string_length(json_object_get(o, "id")) > 0);
  }
  json_decref(arr);
}

double kl_t_gw_metric(int port, const char *sample) {
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_once(port, "GET", "/metrics", NULL, NULL, &r), 0);
  double v = -1;
  size_t n = strlen(sample);
  for (const char *p = r.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (!strncmp(p, sample, n) && p[n] == ' ')
      v = strtod(p + n + 1, NULL);
  kl_t_http_resp_free(&r);
  return v;
}
