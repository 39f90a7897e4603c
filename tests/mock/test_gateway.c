/*
 * The HTTP publish gateway, in-process, over real TCP on loopback: what it
 * publishes (200): one event and an array, JSON and msgpack alike, delayed
 * events and their bounds, a request whose record is too large refused
 * whole, and curl as a client. Refusals are in test_gateway_refusals.c;
 * Kafka away, bytes, connections and /metrics in test_gateway_transport.c.
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
#include <msgpack.h>

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

/* ---- 200 ---- */

static void test_publish_one_and_array(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  kl_t_http_resp_t r;
  const char *one[] = {"acct-1"};
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL,
                                "{\"key\":\"acct-1\",\"type\":\"credit\","
                                "\"id\":\"id-one\",\"payload\":{\"amount\":5}}",
                                &r),
                   0);
  kl_t_gw_assert_routed(&r, one, 1);
  assert_non_null(strstr(r.body, "\"id\":\"id-one\""));
  kl_t_http_resp_free(&r);
  const char *three[] = {"a", "b", "c"};
  assert_int_equal(
      kl_t_gw_post(
          tg->port, KL_T_GW_TOPIC, "Content-Type: application/json\r\n",
          "[{\"key\":\"a\",\"type\":\"t\"},{\"key\":\"b\",\"type\":\"t\","
          "\"payload_b64\":\"AAEC\",\"headers\":{\"h\":\"v\"}},"
          "{\"key\":\"c\",\"type\":\"t\",\"payload\":[1,2.5,null]}]",
          &r),
      0);
  kl_t_gw_assert_routed(&r, three, 3);
  kl_t_http_resp_free(&r);
  kl_t_gateway_stop(tg);
}

static void test_publish_msgpack(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 2);
  for (int i = 0; i < 2; i++) {
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "key", 3);
    msgpack_pack_str_with_body(&pk, i ? "mp-2" : "mp-1", 4);
    msgpack_pack_str_with_body(&pk, "type", 4);
    msgpack_pack_str_with_body(&pk, "t", 1);
    msgpack_pack_str_with_body(&pk, "payload", 7);
    if (i)
      msgpack_pack_bin_with_body(&pk, "\x00\x01", 2);
    else
      msgpack_pack_int(&pk, 42);
  }
  kl_t_http_t *http = kl_t_http_open(tg->port);
  assert_int_equal(kl_t_http_request(http, "POST", "/v1/topics/events/events",
                                     "Content-Type: application/msgpack\r\n",
                                     sb.data, sb.size),
                   0);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
  const char *keys[] = {"mp-1", "mp-2"};
  kl_t_gw_assert_routed(&r, keys, 2);
  kl_t_http_resp_free(&r);
  /* A hostile header: a map claiming 268M entries in 5 bytes. */
  assert_int_equal(kl_t_http_request(http, "POST", "/v1/topics/events/events",
                                     "Content-Type: application/msgpack\r\n",
                                     "\xdf\x0f\xff\xff\xff", 5),
                   0);
  assert_int_equal(kl_t_http_recv(http, &r, 10000), 0);
  assert_int_equal(r.status, 400);
  kl_t_http_resp_free(&r);
  kl_t_http_close(http);
  msgpack_sbuffer_destroy(&sb);
  kl_t_gateway_stop(tg);
}

/* Packs {k0: v0, k1: v1, ...} (strings with lengths, so NULs stay). */
static void kl_mp_map(msgpack_sbuffer *sb, const char *const *kv,
                      const size_t *len, size_t pairs) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, pairs);
  for (size_t i = 0; i < 2 * pairs; i++)
    msgpack_pack_str_with_body(&pk, kv[i], len[i]);
}

static int kl_post_msgpack_to(int port, const char *topic,
                              const msgpack_sbuffer *sb, kl_t_http_resp_t *r) {
  char path[300];
  snprintf(path, sizeof(path), "/v1/topics/%s/events", topic);
  kl_t_http_t *http = kl_t_http_open(port);
  assert_int_equal(kl_t_http_request(http, "POST", path,
                                     "Content-Type: application/msgpack\r\n",
                                     sb->data, sb->size),
                   0);
  int rc = kl_t_http_recv(http, r, 10000);
  kl_t_http_close(http);
  return rc;
}

static int kl_post_msgpack(int port, const msgpack_sbuffer *sb,
                           kl_t_http_resp_t *r) {
  return kl_post_msgpack_to(port, KL_T_GW_TOPIC, sb, r);
}

/* Starts {"key": @p key, "type": "t", @p third: ...} in @p sb: the caller
 * packs the third value and destroys @p sb. */
static void kl_mp_event(msgpack_sbuffer *sb, msgpack_packer *pk,
                        const char *key, const char *third) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(pk, 3);
  msgpack_pack_str_with_body(pk, "key", 3);
  msgpack_pack_str_with_body(pk, key, strlen(key));
  msgpack_pack_str_with_body(pk, "type", 4);
  msgpack_pack_str_with_body(pk, "t", 1);
  msgpack_pack_str_with_body(pk, third, strlen(third));
}

/* A 400 whose "error" says @p says. */
static bool kl_refused_with(const kl_t_http_resp_t *r, const char *says) {
  if (r->status != 400)
    return false;
  json_t *o = kl_t_gw_json(r);
  const char *e = json_string_value(json_object_get(o, "error"));
  bool found = e && strstr(e, says);
  json_decref(o);
  return found;
}

/* One validation for both encodings: what JSON refuses, msgpack refuses,
 * with the same message; nothing is produced. */
static void test_json_and_msgpack_refuse_alike(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  double before =
      kl_t_gw_metric(tg->port, "keylane_gateway_events_produced_total");
  static const struct {
    const char *json;
    const char *kv[8];
    size_t len[8];
    size_t pairs;
    const char *says;
  } bodies[] = {
      {"{\"key\":\"a\\u0000b\",\"type\":\"t\"}",
       {"key", "a\0b", "type", "t"},
       {3, 3, 4, 1},
       2,
       "\"key\" holds a NUL byte at byte 1"},
      {"{\"key\":\"a\",\"type\":\"t\\u0000\"}",
       {"key", "a", "type", "t\0"},
       {3, 1, 4, 2},
       2,
       "\"type\" holds a NUL byte"},
      {"{\"key\":\"a\",\"type\":\"t\",\"id\":\"\\u0000\"}",
       {"key", "a", "type", "t", "id", "\0"},
       {3, 1, 4, 1, 2, 1},
       3,
       "\"id\" holds a NUL byte"},
      {"{\"key\":\"a\",\"key\":\"b\",\"type\":\"t\"}",
       {"key", "a", "key", "b", "type", "t"},
       {3, 1, 3, 1, 4, 1},
       3,
       "key"},
      {"{\"key\":\"a\",\"type\":\"t\",\"type\":\"u\"}",
       {"key", "a", "type", "t", "type", "u"},
       {3, 1, 4, 1, 4, 1},
       3,
       "type"},
  };
  kl_t_http_resp_t r;
  for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
    assert_int_equal(
        kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, bodies[i].json, &r), 0);
    if (!kl_refused_with(&r, bodies[i].says))
      fail_msg("JSON body %zu: %d %s", i, r.status, r.body);
    kl_t_http_resp_free(&r);
    msgpack_sbuffer sb;
    kl_mp_map(&sb, bodies[i].kv, bodies[i].len, bodies[i].pairs);
    assert_int_equal(kl_post_msgpack(tg->port, &sb, &r), 0);
    if (!kl_refused_with(&r, bodies[i].says))
      fail_msg("msgpack body %zu: %d %s", i, r.status, r.body);
    kl_t_http_resp_free(&r);
    msgpack_sbuffer_destroy(&sb);
  }
  /* A NUL in a header value, and in a header name (msgpack only). */
  assert_int_equal(
      kl_t_gw_post(
          tg->port, KL_T_GW_TOPIC, NULL,
          "{\"key\":\"a\",\"type\":\"t\",\"headers\":{\"h\":\"\\u0000\"}}", &r),
      0);
  assert_int_equal(r.status, 400);
  kl_t_http_resp_free(&r);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  kl_mp_event(&sb, &pk, "a", "headers");
  msgpack_pack_map(&pk, 2);
  msgpack_pack_str_with_body(&pk, "h\0x", 3);
  msgpack_pack_str_with_body(&pk, "1", 1);
  msgpack_pack_str_with_body(&pk, "h", 1);
  msgpack_pack_str_with_body(&pk, "2", 1);
  assert_int_equal(kl_post_msgpack(tg->port, &sb, &r), 0);
  if (!kl_refused_with(&r, "NUL"))
    fail_msg("msgpack header name with a NUL: %d %s", r.status, r.body);
  kl_t_http_resp_free(&r);
  msgpack_sbuffer_destroy(&sb);
  assert_true(kl_t_gw_metric(
                  tg->port, "keylane_gateway_events_produced_total") == before);
  kl_t_gateway_stop(tg);
}

/* The records of topic "delayed": each one's key and not_before. */
typedef struct kl_delayed {
  kl_decoder_t *decoder;
  char key[3][16];
  int64_t not_before[3];
} kl_delayed_t;

static void kl_delayed_read(void *opaque, const rd_kafka_message_t *m, int i) {
  kl_delayed_t *d = opaque;
  kl_event_t ev;
  assert_int_equal(
      kl_event_decode(d->decoder, m->key, m->key_len, m->payload, m->len, &ev),
      KL_OK);
  snprintf(d->key[i], sizeof(d->key[i]), "%.*s", (int)m->key_len,
           (const char *)m->key);
  d->not_before[i] = ev.not_before;
}

/* "not_before" and "delay" reach the envelope, from JSON and msgpack
 * bodies alike; both at once, or a type of keylane's, are refused. */
static void test_publish_delayed(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  kl_t_http_resp_t r;
  assert_int_equal(
      kl_t_gw_post(tg->port, "delayed", NULL,
                   "{\"key\":\"a\",\"type\":\"t\",\"delay\":\"1d\","
                   "\"not_before\":1767225600000}",
                   &r),
      0);
  if (!kl_refused_with(&r, "both \"not_before\" and \"delay\" are given"))
    fail_msg("both: %d %s", r.status, r.body);
  kl_t_http_resp_free(&r);
  assert_int_equal(kl_t_gw_post(tg->port, "delayed", NULL,
                                "{\"key\":\"a\",\"type\":\"~timer\"}", &r),
                   0);
  if (!kl_refused_with(&r, "keeps for its own records"))
    fail_msg("~timer: %d %s", r.status, r.body);
  kl_t_http_resp_free(&r);
  int64_t nb = kl__now_ms() + 3600000, before = kl__now_ms();
  char body[200];
  snprintf(body, sizeof(body),
           "[{\"key\":\"at\",\"type\":\"t\",\"not_before\":%lld},"
           "{\"key\":\"in\",\"type\":\"t\",\"delay\":\"15m\"}]",
           (long long)nb);
  assert_int_equal(kl_t_gw_post(tg->port, "delayed", NULL, body, &r), 0);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);
  int64_t after = kl__now_ms();
  msgpack_sbuffer sb;
  msgpack_packer pk;
  kl_mp_event(&sb, &pk, "mp", "not_before");
  msgpack_pack_int64(&pk, nb);
  assert_int_equal(kl_post_msgpack_to(tg->port, "delayed", &sb, &r), 0);
  msgpack_sbuffer_destroy(&sb);
  kl_t_gateway_stop(tg);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);

  kl_delayed_t d = {.decoder = kl_decoder_new()};
  rd_kafka_t *rk = kl_t_consumer(kl_t_gw_bootstrap, "delayed-test", "delayed");
  assert_non_null(rk);
  int n = kl_t_consume(rk, 3, 20000, kl_delayed_read, &d);
  kl_t_consumer_destroy(rk);
  kl_decoder_destroy(d.decoder);
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    if (strcmp(d.key[i], "in") == 0)
      assert_in_range(d.not_before[i], before + 900000, after + 900000);
    else
      assert_int_equal(d.not_before[i], nb);
  }
}

/* A request whose event is due too far ahead, too far back, or in
 * seconds is refused whole, 400 naming the event's index and the fix,
 * before any of its events is published: the gateway once published the
 * events before it and answered 503, as for a Kafka failure, which a
 * client retried forever. */
static void test_publish_delayed_bounds(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  double before =
      kl_t_gw_metric(tg->port, "keylane_gateway_events_produced_total");
  int64_t now = kl__now_ms(), day = 86400000;
  struct {
    int64_t nb;
    const char *says;
  } bad[] = {
      {now + 8 * day, " ms from now, "},
      {now - 8 * day, "ms in the past, "},
      {1767225600, "it looks like seconds; give milliseconds since the Unix "
                   "epoch (1767225600000 if it is seconds)"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char body[300];
    snprintf(body, sizeof(body),
             "[{\"key\":\"a\",\"type\":\"t\"},{\"key\":\"b\",\"type\":\"t\","
             "\"delay\":\"1h\"},{\"key\":\"c\",\"type\":\"t\","
             "\"not_before\":%lld}]",
             (long long)bad[i].nb);
    kl_t_http_resp_t r;
    assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, body, &r), 0);
    if (!kl_refused_with(&r, "event 2: not_before ") ||
        !kl_refused_with(&r, "no event of the request was published"))
      fail_msg("case %zu: %d %.*s", i, r.status, (int)r.body_len, r.body);
    json_t *o = kl_t_gw_json(&r);
    assert_int_equal(json_integer_value(json_object_get(o, "index")), 2);
    const char *e = json_string_value(json_object_get(o, "error"));
    if (!strstr(e, bad[i].says) ||
        (i < 2 && !strstr(e, "more than timer.max.delay (7d) allows")))
      fail_msg("case %zu: %s", i, e);
    json_decref(o);
    kl_t_http_resp_free(&r);
  }
  /* a day ahead and a day back are within the bound: published */
  char body[200];
  snprintf(body, sizeof(body),
           "[{\"key\":\"d\",\"type\":\"t\",\"not_before\":%lld},"
           "{\"key\":\"e\",\"type\":\"t\",\"not_before\":%lld}]",
           (long long)(now + day), (long long)(now - day));
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, body, &r), 0);
  assert_int_equal(r.status, 200);
  kl_t_http_resp_free(&r);
  assert_true(
      kl_t_gw_metric(tg->port, "keylane_gateway_events_produced_total") ==
      before + 2);
  kl_t_gateway_stop(tg);
}

/* An event too large for one Kafka record (its payload and headers each
 * within their limits, the body within a raised --max-body) refuses its
 * request whole, 400 with its index, like any bad event: kl_publish()
 * found it only after the events before it were published, and the
 * request got 503. */
static void test_oversize_record_refuses_the_request_whole(void **state) {
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.produce_timeout_ms = 2000;
  o.max_body = 4 << 20;
  o.max_inflight_bytes = 8 << 20;
  kl_t_gateway_t *tg = kl_t_gw_start(&o);
  kl_t_gw_wait_health(tg->port, 200);
  double before =
      kl_t_gw_metric(tg->port, "keylane_gateway_events_produced_total");
  kl__strbuf_t sb = KL__STRBUF_INIT;
  kl__strbuf_puts(&sb, "[{\"key\":\"a\",\"type\":\"t\"},{\"key\":\"b\","
                       "\"type\":\"t\",\"payload\":\"");
  for (int i = 0; i < 1000000; i++)
    kl__strbuf_puts(&sb, "x");
  kl__strbuf_puts(&sb, "\",\"headers\":{");
  for (int h = 0; h < 16; h++) {
    kl__strbuf_printf(&sb, "%s\"h%d\":\"", h ? "," : "", h);
    for (int i = 0; i < 4000; i++)
      kl__strbuf_puts(&sb, "v");
    kl__strbuf_puts(&sb, "\"");
  }
  kl__strbuf_puts(&sb, "}}]");
  assert_true(kl__strbuf_ok(&sb));
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_gw_post(tg->port, KL_T_GW_TOPIC, NULL, sb.data, &r), 0);
  kl__strbuf_free(&sb);
  if (!kl_refused_with(&r, "event 1: event is ") ||
      !kl_refused_with(&r, "one record may carry") ||
      !kl_refused_with(&r, "no event of the request was published"))
    fail_msg("%d %.*s", r.status, (int)(r.body_len > 400 ? 400 : r.body_len),
             r.body);
  json_t *e = kl_t_gw_json(&r);
  assert_int_equal(json_integer_value(json_object_get(e, "index")), 1);
  json_decref(e);
  kl_t_http_resp_free(&r);
  assert_true(kl_t_gw_metric(
                  tg->port, "keylane_gateway_events_produced_total") == before);
  kl_t_gateway_stop(tg);
}

/* curl, with Expect: 100-continue as it sends for big bodies. */
static void test_curl(void **state) {
  kl_t_gateway_t *tg = kl_t_gw_start(NULL);
  kl_t_gw_wait_health(tg->port, 200);
  char path[] = "/tmp/keylane-gw-body-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  fputc('[', f);
  for (int i = 0; i < 300; i++)
    fprintf(f,
            "%s{\"key\":\"curl-%d\",\"type\":\"t\",\"payload\":"
            "{\"n\":%d,\"pad\":\"%040d\"}}",
            i ? "," : "", i, i, i);
  fputc(']', f);
  fclose(f);
  char cmd[1024], line[512];
  snprintf(cmd, sizeof(cmd),
           "curl -sS -v -o /dev/null -w 'status=%%{http_code}\\n' "
           "-H 'Content-Type: application/json' -H 'Expect: 100-continue' "
           "--data-binary @%s "
           "http://127.0.0.1:%d/v1/topics/events/events 2>&1",
           path, tg->port);
  FILE *p = popen(cmd, "r");
  int code = 0, continued = 0;
  while (fgets(line, sizeof(line), p)) {
    sscanf(line, "status=%d", &code);
    continued |= strncmp(line, "< HTTP/1.1 100 Continue", 23) == 0;
  }
  pclose(p);
  unlink(path);
  assert_int_equal(code, 200);
  assert_true(continued); /* the gateway answered curl's Expect at once */
  snprintf(cmd, sizeof(cmd),
           "curl -sS 'http://127.0.0.1:%d/v1/topics/events/route?key=acct-1'",
           tg->port);
  p = popen(cmd, "r");
  char out[256] = "";
  assert_non_null(fgets(out, sizeof(out), p));
  pclose(p);
  char want[128];
  snprintf(want, sizeof(want), "{\"partition\":%d,\"partitions\":%d}",
           kl_partition("acct-1", 6, KL_T_GW_PARTS), KL_T_GW_PARTS);
  assert_non_null(strstr(out, want));
  kl_t_gateway_stop(tg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_publish_one_and_array),
      cmocka_unit_test(test_publish_msgpack),
      cmocka_unit_test(test_json_and_msgpack_refuse_alike),
      cmocka_unit_test(test_publish_delayed),
      cmocka_unit_test(test_publish_delayed_bounds),
      cmocka_unit_test(test_oversize_record_refuses_the_request_whole),
      cmocka_unit_test(test_curl),
  };
  return cmocka_run_group_tests(tests, kl_t_gw_up, kl_t_gw_down);
}
