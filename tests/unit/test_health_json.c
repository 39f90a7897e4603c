/* /healthz as JSON (cli/health_json.h): the Burrow-style status of a
 * partition (OK, WARN, ERR, STALL), the group's status from the HTTP
 * status and its partitions, lag in seconds from the envelope ts, and a
 * document that parses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli/health_json.h"

static kl__stall_t kl_part(int32_t partition) {
  return (kl__stall_t){.partition = partition, .watermark = 10};
}

static void test_partition_status(void **state) {
  kl__stall_t s = kl_part(0);
  assert_string_equal(kl__health_partition_status(&s, 0, 1000), "OK");
  s.records = 3;
  s.for_ms = 499; /* holds records, moving recently enough */
  assert_string_equal(kl__health_partition_status(&s, 0, 1000), "OK");
  s.for_ms = 500; /* half of worker.stall.ms without moving */
  assert_string_equal(kl__health_partition_status(&s, 0, 1000), "WARN");
  assert_string_equal(kl__health_partition_status(&s, 0, 0), "OK");
  s.for_ms = 0;
  s.waiting = 1; /* a key in retry backoff */
  assert_string_equal(kl__health_partition_status(&s, 0, 1000), "WARN");
  s.stalled = 1;
  assert_string_equal(kl__health_partition_status(&s, 0, 1000), "STALL");
  assert_string_equal(kl__health_partition_status(&s, 1, 1000), "ERR");
}

static void test_lag_seconds(void **state) {
  kl__stall_t s = kl_part(0);
  assert_true(kl__health_lag_seconds(&s, 5000) == 0); /* holds nothing */
  s.oldest_ts_ms = 2000;
  assert_true(kl__health_lag_seconds(&s, 5500) == 3.5);
  assert_true(kl__health_lag_seconds(&s, 1000) == 0); /* ts from the future */
}

static json_t *kl_render(const kl__health_t *health) {
  size_t len = 0;
  char *text = kl__health_json(health, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  json_error_t err;
  json_t *doc = json_loads(text, 0, &err);
  if (!doc)
    fail_msg("not JSON (%s): %s", err.text, text);
  free(text);
  return doc;
}

static const char *kl_str(json_t *obj, const char *path0, const char *path1) {
  json_t *v = json_object_get(path1 ? json_object_get(obj, path0) : obj,
                              path1 ? path1 : path0);
  assert_true(json_is_string(v));
  return json_string_value(v);
}

static void test_document(void **state) {
  kl__stall_t stalls[3] = {kl_part(0), kl_part(1), kl_part(2)};
  stalls[1].records = 4;
  stalls[1].oldest_ts_ms = 1000;
  stalls[1].waiting = 1;
  kl__health_t health = {200,      "ok: owns 3 partitions\n",
                         "events", "g1",
                         stalls,   3,
                         NULL,     0,
                         300000,   11000};
  json_t *doc = kl_render(&health);
  assert_false(json_is_true(json_object_get(doc, "error")));
  assert_string_equal(kl_str(doc, "message", NULL), "ok: owns 3 partitions");
  json_t *st = json_object_get(doc, "status");
  assert_string_equal(kl_str(st, "status", NULL), "WARN");
  assert_string_equal(kl_str(st, "group", NULL), "g1");
  assert_string_equal(kl_str(st, "topic", NULL), "events");
  assert_int_equal(json_integer_value(json_object_get(st, "partition_count")),
                   3);
  assert_true(json_real_value(json_object_get(st, "maxlag_seconds")) == 10.0);
  json_t *parts = json_object_get(st, "partitions");
  assert_int_equal(json_array_size(parts), 3);
  json_t *p1 = json_array_get(parts, 1);
  assert_string_equal(kl_str(p1, "status", NULL), "WARN");
  assert_int_equal(json_integer_value(json_object_get(p1, "partition")), 1);
  assert_int_equal(json_integer_value(json_object_get(p1, "records")), 4);
  assert_true(json_real_value(json_object_get(p1, "lag_seconds")) == 10.0);
  assert_string_equal(kl_str(json_array_get(parts, 0), "status", NULL), "OK");
  json_decref(doc);

  stalls[1].waiting = 0; /* every partition OK */
  doc = kl_render(&health);
  assert_string_equal(kl_str(doc, "status", "status"), "OK");
  json_decref(doc);

  /* Degraded: a 200 that still needs an operator (a kept follow-up). */
  health.message = KL__HEALTH_DEGRADED "owns 3 partitions; 1 follow-ups...\n";
  doc = kl_render(&health);
  assert_false(json_is_true(json_object_get(doc, "error")));
  assert_string_equal(kl_str(doc, "status", "status"), "WARN");
  json_decref(doc);

  /* A stopped partition the worker no longer owns is listed, ERR; a 503
   * makes the group ERR whatever its partitions say. */
  int32_t stopped[] = {7};
  health.stopped = stopped;
  health.stopped_count = 1;
  health.http_status = 503;
  health.message = "unhealthy: stopped partition 7: ...\n";
  doc = kl_render(&health);
  assert_true(json_is_true(json_object_get(doc, "error")));
  assert_string_equal(kl_str(doc, "status", "status"), "ERR");
  parts = json_object_get(json_object_get(doc, "status"), "partitions");
  assert_int_equal(json_array_size(parts), 4);
  json_t *p7 = json_array_get(parts, 3);
  assert_int_equal(json_integer_value(json_object_get(p7, "partition")), 7);
  assert_string_equal(kl_str(p7, "status", NULL), "ERR");
  json_decref(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partition_status),
      cmocka_unit_test(test_lag_seconds),
      cmocka_unit_test(test_document),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
