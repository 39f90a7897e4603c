/*
 * The HTTP publish gateway's transport, in-process, over real TCP on
 * loopback: Kafka away (503, and 429 when the budget is full), bodies
 * arriving one byte per read, pipelined requests answered in order, a
 * client that stops reading, the connection cap and timeouts, and
 * /metrics checked by a strict Prometheus text parser.
 *
 * The cluster is librdkafka's mock cluster made by support/gateway_fx.c
 * (not through kl_embedded) so that tests can take its brokers down and up
 * again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "broker/gateway_internal.h"
#include "broker/producer_internal.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "keylane/producer.h"
#include "support/gateway_fx.h"
#include "support/http.h"
#include "support/kafka_read.h"
#include "support/prom.h"
#include "support/support.h"

/* ---- 503 and 429: Kafka away ---- */

static void test_503_then_retry_with_same_ids(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  const char *ev = "[{\"key\":\"r1\",\"type\":\"t\",\"id\":\"retry-1\"},"
                   "{\"key\":\"r2\",\"type\":\"t\"}]";
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, ev, &r), 0);
  assert_int_equal(r.status, 200); /* the topic is known from here on */
  kl_t_http_resp_free(&r);
  kl_t_gw_brokers(0);
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, ev, &r), 0);
  assert_int_equal(r.status, 503);
  char ra[16];
  assert_non_null(kl_t_http_header(&r, "retry-after", ra, sizeof(ra)));
  json_t *o = kl_t_gw_json(&r);
  json_t *ids = json_object_get(o, "ids");
  assert_int_equal(json_array_size(ids), 2);
  assert_string_equal(json_string_value(json_array_get(ids, 0)), "retry-1");
  char retry[512];
  snprintf(retry, sizeof(retry),
           "[{\"key\":\"r1\",\"type\":\"t\",\"id\":"
           "\"retry-1\"},{\"key\":\"r2\",\"type\":\"t\",\"id\":\"%s\"}]",
           json_string_value(json_array_get(ids, 1)));
  json_decref(o);
  kl_t_http_resp_free(&r);
  kl_t_gw_wait_health(tg->port, 503);
  kl_t_gw_brokers(1);
  kl_t_gw_wait_health(tg->port, 200);
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, retry, &r), 0);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);
  assert_true(kl_t_gw_metric(tg->port, "keylane_gateway_events_failed_total") >=
              2);
  kl_t_gateway_stop(tg);
}

static void test_429_when_budget_full(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.max_inflight = 3;
  o.produce_timeout_ms = 8000;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_gw_wait_health(tg->port, 200);
  const char *three = "[{\"key\":\"a\",\"type\":\"t\"},{\"key\":\"b\","
                      "\"type\":\"t\"},{\"key\":\"c\",\"type\":\"t\"}]";
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, three, &r), 0);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);
  /* Four events can never fit a budget of three. */
  assert_int_equal(
      kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL,
                   "[{\"key\":\"a\","
                   "\"type\":\"t\"},{\"key\":\"b\",\"type\":\"t\"},"
                   "{\"key\":\"c\",\"type\":\"t\"},{\"key\":\"d\","
                   "\"type\":\"t\"}]",
                   &r),
      0);
  assert_int_equal(r.status, 413);
  kl_t_http_resp_free(&r);
  kl_t_gw_brokers(0);
  kl_t_http_t *waiting = kl_t_http_open(tg->port);
  kl_t_http_request(waiting, "POST", "/v1/topics/events/events",
                    KL_T_GW_JSON_CT, three, strlen(three));
  for (int i = 0; i < 500; i++) {
    if (kl_t_gw_metric(tg->port, "keylane_gateway_inflight_events") >= 3)
      break;
    kl_t_sleep_ms(20);
  }
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL,
                                "{\"key\":\"z\",\"type\":\"t\"}", &r),
                   0);
  assert_int_equal(r.status, 429);
  char ra[16];
  assert_string_equal(kl_t_http_header(&r, "retry-after", ra, sizeof(ra)), "1");
  kl_t_http_resp_free(&r);
  kl_t_gw_brokers(1);
  assert_int_equal(kl_t_http_recv(waiting, &r, 15000), 0);
  assert_int_equal(r.status, 200); /* it waited, and got through */
  kl_t_http_resp_free(&r);
  kl_t_http_close(waiting);
  kl_t_gateway_stop(tg);
}

/* ---- how bytes arrive ---- */

static void test_body_one_byte_per_write(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  const char *body = "[{\"key\":\"slow-1\",\"type\":\"t\",\"payload\":"
                     "{\"a\":[1,2,3]}},{\"key\":\"slow-2\",\"type\":\"t\"}]";
  size_t len;
  char *req = kl_t_http_format("POST", "/v1/topics/events/events",
                               "Content-Type: application/json\r\n", body,
                               strlen(body), &len);
  kl_t_http_t *http = kl_t_http_open(tg->port);
  for (size_t i = 0; i < len; i++) {
    assert_int_equal(kl_t_http_send(http, req + i, 1), 0);
    kl_t_sleep_ms(1); /* so that each byte is a read of its own */
  }
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
  const char *keys[] = {"slow-1", "slow-2"};
  kl_t_gw_assert_routed(&r, keys, 2);
  kl_t_http_resp_free(&r);
  kl_t_http_close(http);
  free(req);
  kl_t_gateway_stop(tg);
}

static void test_pipelined_in_order(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  char all[16384] = "";
  size_t off = 0;
  for (int i = 0; i < 12; i++) {
    char body[128], *req;
    size_t len;
    snprintf(body, sizeof(body),
             "{\"key\":\"pipe-%d\",\"type\":\"t\","
             "\"id\":\"pipe-id-%d\"}",
             i, i);
    if (i % 4 == 1)
      req = kl_t_http_format("GET", "/nope", NULL, NULL, 0, &len);
    else if (i % 4 == 2)
      req = kl_t_http_format("POST", "/v1/topics/events/events",
                             KL_T_GW_JSON_CT, "{\"key\":1}", 9, &len);
    else
      req = kl_t_http_format("POST", "/v1/topics/events/events",
                             KL_T_GW_JSON_CT, body, strlen(body), &len);
    memcpy(all + off, req, len);
    off += len;
    free(req);
  }
  kl_t_http_t *http = kl_t_http_open(tg->port);
  assert_int_equal(kl_t_http_send(http, all, off), 0); /* one write */
  for (int i = 0; i < 12; i++) {
    kl_t_http_resp_t r;
    assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
    int want = i % 4 == 1 ? 404 : i % 4 == 2 ? 400 : 200;
    assert_int_equal(r.status, want);
    if (want == 200) {
      char id[32];
      snprintf(id, sizeof(id), "\"pipe-id-%d\"", i);
      assert_non_null(strstr(r.body, id));
    }
    kl_t_http_resp_free(&r);
  }
  kl_t_http_close(http);
  kl_t_gateway_stop(tg);
}

/* A request answered at its head (404 here) whose body is still coming
 * stays in the FIFO until the body was read: an earlier request answered
 * by Kafka meanwhile used to write and free it while the parser still
 * held it, so the rest of its body, or an error in it (a body over
 * --max-body, malformed chunked framing), wrote into freed memory. */
static void test_answer_waits_for_its_body(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.max_body = 1024;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_gw_wait_health(tg->port, 200);
  char *a = NULL, big[2048 + 16];
  size_t a_len;
  a = kl_t_http_format("POST", "/v1/topics/events/events", KL_T_GW_JSON_CT,
                       KL_T_GW_SM_EV, strlen(KL_T_GW_SM_EV), &a_len);
  static const char b[] = "POST /nope HTTP/1.1\r\nHost: x\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n";
  kl_t_http_t *http = kl_t_http_open(tg->port);
  assert_int_equal(kl_t_http_send(http, a, a_len), 0);
  assert_int_equal(kl_t_http_send(http, b, sizeof(b) - 1), 0);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
  assert_int_equal(r.status, 200); /* Kafka answered the publish */
  kl_t_http_resp_free(&r);
  if (kl_t_http_recv(http, &r, 500) == 0)
    fail_msg("the 404 went out before its body was read: %d", r.status);
  memcpy(big, "800\r\n", 5); /* 2048 bytes: over --max-body */
  memset(big + 5, 'x', 2048);
  assert_int_equal(kl_t_http_send(http, big, 5 + 2048), 0);
  assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
  assert_int_equal(r.status, 413);
  assert_false(r.keep_alive);
  kl_t_http_resp_free(&r);
  kl_t_http_close(http);
  free(a);
  kl_t_gateway_stop(tg);
}

/* A client that sends and never reads fills its own queue only. */
static void test_client_that_stops_reading(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.max_pipeline = 8;
  o.max_output = 64 * 1024;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_gw_wait_health(tg->port, 200);
  kl_t_http_t *stuck = kl_t_http_open(tg->port);
  int small = 4096;
  setsockopt(kl_t_http_fd(stuck), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  size_t len;
  char *req = kl_t_http_format("GET", "/metrics", NULL, NULL, 0, &len);
  size_t total = 0;
  /* Send until the gateway stops reading and our send buffer fills. */
  for (int i = 0; i < 20000; i++) {
    ssize_t n =
        send(kl_t_http_fd(stuck), req, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0)
      break;
    total += (size_t)n;
  }
  free(req);
  assert_true(total > 0);
  int64_t t0 = kl__mono_ns();
  for (int i = 0; i < 20; i++) {
    kl_t_http_resp_t r;
    assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL,
                                  "{\"key\":\"other\",\"type\":\"t\"}", &r),
                     0);
    assert_int_equal(r.status, 200);
    kl_t_http_resp_free(&r);
  }
  assert_true((kl__mono_ns() - t0) / 1000000 < 5000);
  assert_true(kl_t_gw_metric(tg->port, "keylane_gateway_connections_paused") >=
              1);
  kl_t_http_close(stuck);
  kl_t_gateway_stop(tg);
}

/* ---- connections: cap and timeouts ---- */

static void test_connection_cap(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.max_connections = 2;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_http_t *a = kl_t_http_open(tg->port), *b = kl_t_http_open(tg->port);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_request(a, "GET", "/metrics", NULL, NULL, 0), 0);
  assert_int_equal(kl_t_http_recv(a, &r, 5000), 0);
  kl_t_http_resp_free(&r);
  assert_int_equal(kl_t_http_request(b, "GET", "/metrics", NULL, NULL, 0), 0);
  assert_int_equal(kl_t_http_recv(b, &r, 5000), 0);
  kl_t_http_resp_free(&r);
  kl_t_http_t *c = kl_t_http_open(tg->port);
  assert_int_equal(kl_t_http_recv(c, &r, 5000), 0);
  assert_int_equal(r.status, 503);
  kl_t_http_resp_free(&r);
  kl_t_http_close(c);
  kl_t_http_close(a);
  kl_t_http_close(b);
  kl_t_gateway_stop(tg);
}

static void test_idle_and_request_timeouts(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.idle_timeout_ms = 800;
  o.request_timeout_ms = 800;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_http_t *idle = kl_t_http_open(tg->port);
  kl_t_http_t *half = kl_t_http_open(tg->port);
  kl_t_http_send(half, "GET /metrics HTTP/1.1\r\nHost:", 28);
  char byte;
  int64_t t0 = kl__mono_ns();
  assert_int_equal(recv(kl_t_http_fd(idle), &byte, 1, 0), 0); /* closed */
  int64_t waited = (kl__mono_ns() - t0) / 1000000;
  assert_true(waited >= 700 && waited < 4000);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_recv(half, &r, 5000), 0);
  assert_int_equal(r.status, 408);
  kl_t_http_resp_free(&r);
  kl_t_http_close(idle);
  kl_t_http_close(half);
  kl_t_gateway_stop(tg);
}

/* Stopping with a request stuck on Kafka: the drain ends at its deadline,
 * the connection is cut (the client retries with the same ids), and the
 * orphaned request is freed by its late delivery report. */
static void test_stop_while_kafka_is_away(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.produce_timeout_ms = 1500;
  o.drain_timeout_ms = 300;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_gw_wait_health(tg->port, 200);
  kl_t_http_resp_t r;
  const char *ev = "{\"key\":\"d\",\"type\":\"t\"}";
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, ev, &r), 0);
  kl_t_http_resp_free(&r);
  kl_t_gw_brokers(0);
  kl_t_http_t *stuck = kl_t_http_open(tg->port);
  kl_t_http_request(stuck, "POST", "/v1/topics/events/events", KL_T_GW_JSON_CT,
                    ev, strlen(ev));
  kl_t_http_t *idle = kl_t_http_open(tg->port);
  kl_t_sleep_ms(200);
  int64_t t0 = kl__mono_ns();
  kl_t_gateway_stop(tg);
  assert_true((kl__mono_ns() - t0) / 1000000 < 8000);
  assert_int_not_equal(kl_t_http_recv(stuck, &r, 1000), 0); /* cut */
  assert_int_not_equal(kl_t_http_recv(idle, &r, 1000), 0);  /* closed */
  kl_t_http_close(stuck);
  kl_t_http_close(idle);
  kl_t_gw_brokers(1);
}

/* ---- /metrics ---- */

static void test_metrics_parse_as_prometheus(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL,
                                "{\"key\":\"m\",\"type\":\"t\"}", &r),
                   0);
  kl_t_http_resp_free(&r);
  assert_int_equal(kl_t_http_once(tg->port, "GET", "/nope", NULL, NULL, &r), 0);
  kl_t_http_resp_free(&r);
  assert_int_equal(kl_t_http_once(tg->port, "GET", "/metrics", NULL, NULL, &r),
                   0);
  assert_int_equal(r.status, 200);
  char ct[128];
  assert_non_null(strstr(kl_t_http_header(&r, "content-type", ct, sizeof(ct)),
                         "version=0.0.4"));
  char err[256];
  int rc = kl_t_prom_check(r.body, err, sizeof(err));
  if (rc != 0)
    fail_msg("metrics do not parse: %s\n%s", err, r.body);
  if (kl_t_prom_conventions(r.body, err, sizeof(err)) != 0)
    fail_msg("%s", err);
  const char *want[] = {
      "keylane_gateway_requests_total{route=\"events\",code=\"200\"}",
      "keylane_gateway_requests_total{route=\"other\",code=\"404\"}",
      "keylane_gateway_delivery_latency_seconds_bucket{le=\"+Inf\"}",
      "keylane_gateway_inflight_events ",
      "keylane_gateway_kafka_errors_total",
      "keylane_gateway_limit{limit=\"connections\"} 1024",
      "keylane_gateway_rejected_total{limit=\"inflight\"}",
      "keylane_gateway_events_produced_total "};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (!strstr(r.body, want[i]))
      fail_msg("no %s in\n%s", want[i], r.body);
  kl_t_http_resp_free(&r);
  kl_t_gateway_stop(tg);
}

/* The checker itself refuses what Prometheus would. */
static void test_prom_checker_refuses(void **state) {
  const char *bad[] = {
      "# TYPE x counter\nx{a=\"1\"} notanumber\n",
      "# TYPE x counter\n1x 1\n",
      "# TYPE x counter\nx{a=1} 1\n",
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
      "h_sum 1\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n"
      "h_sum 1\nh_count 3\n",
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
      "x 1\n# TYPE x counter\n",
  };
  char err[256];
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (kl_t_prom_check(bad[i], err, sizeof(err)) == 0)
      fail_msg("accepted: %s", bad[i]);
  assert_int_equal(kl_t_prom_check("# HELP x a \\\\ b\n# TYPE x gauge\n"
                                   "x{a=\"q\\\"\\n\"} -1.5e3\nx{a=\"b\"} NaN\n",
                                   err, sizeof(err)),
                   0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prom_checker_refuses),
      cmocka_unit_test(test_503_then_retry_with_same_ids),
      cmocka_unit_test(test_429_when_budget_full),
      cmocka_unit_test(test_body_one_byte_per_write),
      cmocka_unit_test(test_pipelined_in_order),
      cmocka_unit_test(test_answer_waits_for_its_body),
      cmocka_unit_test(test_client_that_stops_reading),
      cmocka_unit_test(test_connection_cap),
      cmocka_unit_test(test_idle_and_request_timeouts),
      cmocka_unit_test(test_stop_while_kafka_is_away),
      cmocka_unit_test(test_metrics_parse_as_prometheus),
  };
  return cmocka_run_group_tests(tests, kl_t_gw_up, kl_t_gw_down);
}
