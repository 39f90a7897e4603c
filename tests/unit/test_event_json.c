/*
 * An event written as JSON (event/event_json.c), the reading `keylane
 * publish` and the gateway share: here its delivery time, "not_before" or
 * "delay", and the types keylane keeps for itself; and the publishing
 * side's bounds on that time, case by case from the table the Python and
 * Go clients are held to as well (tests/clients/not_before_cases.json).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/internal.h"
#include "event/envelope.h"
#include "event/event_json.h"

#define KL_T_NOW INT64_C(1767225600000) /* 2026-01-01T00:00:00Z */

static int64_t kl_t_now(void) {
  return KL_T_NOW;
}

/* @p text parsed: KL_OK or KL_EINVAL, with the message in @p err. */
static kl_err_t kl_parse(const char *text, kl__jevent_t *je, char *err,
                         size_t size) {
  json_error_t jerr;
  json_t *root = json_loads(text, JSON_ALLOW_NUL, &jerr);
  if (!root)
    fail_msg("test JSON %s: %s", text, jerr.text);
  kl_err_t e = kl__jevent_parse(je, root, err, size);
  json_decref(root);
  return e;
}

static int64_t kl_not_before(const char *text) {
  kl__jevent_t je;
  char err[400] = "";
  if (kl_parse(text, &je, err, sizeof(err)) != KL_OK)
    fail_msg("%s refused: %s", text, err);
  int64_t nb = je.ev.not_before;
  kl__jevent_clear(&je);
  return nb;
}

static void kl_refused(const char *text, const char *problem) {
  kl__jevent_t je;
  char err[400] = "";
  if (kl_parse(text, &je, err, sizeof(err)) != KL_EINVAL)
    fail_msg("%s accepted", text);
  if (!strstr(err, problem))
    fail_msg("%s: expected \"%s\" in: %s", text, problem, err);
}

static int kl_setup(void **state) {
  (void)state;
  kl__set_now_ms(kl_t_now);
  return 0;
}

static int kl_teardown(void **state) {
  (void)state;
  kl__set_now_ms(NULL);
  return 0;
}

static void test_not_before(void **state) {
  (void)state;
  assert_int_equal(kl_not_before("{\"key\":\"k\",\"type\":\"t\"}"), 0);
  assert_int_equal(kl_not_before("{\"key\":\"k\",\"type\":\"t\","
                                 "\"not_before\":1767225900000}"),
                   INT64_C(1767225900000));
  assert_int_equal(kl_not_before("{\"key\":\"k\",\"type\":\"t\","
                                 "\"not_before\":9223372036854775807}"),
                   INT64_MAX);
  const char *bad[] = {"0",    "-5",  "1.5e12", "\"1767225900000\"",
                       "null", "true"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char text[128];
    snprintf(text, sizeof(text),
             "{\"key\":\"k\",\"type\":\"t\",\"not_before\":%s}", bad[i]);
    kl_refused(text, "\"not_before\" must be a positive integer, ms since "
                     "the Unix epoch");
  }
}

/* "delay" is now + the duration, in the units every keylane duration
 * takes; "0" is no delay, so the envelope stays version 1. */
static void test_delay(void **state) {
  (void)state;
  const struct {
    const char *text;
    int64_t not_before;
  } good[] = {{"500ms", KL_T_NOW + 500},    {"30s", KL_T_NOW + 30000},
              {"15m", KL_T_NOW + 900000},   {"2h", KL_T_NOW + 7200000},
              {"3d", KL_T_NOW + 259200000}, {"0", 0}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    char text[128];
    snprintf(text, sizeof(text),
             "{\"key\":\"k\",\"type\":\"t\",\"delay\":\"%s\"}", good[i].text);
    assert_int_equal(kl_not_before(text), good[i].not_before);
  }
  const char *bad[] = {"\"15\"", "\"15 m\"", "\"-1s\"",
                       "\"1w\"", "\"\"",     "\"1.5h\""};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char text[128];
    snprintf(text, sizeof(text), "{\"key\":\"k\",\"type\":\"t\",\"delay\":%s}",
             bad[i]);
    kl_refused(text,
               "\"delay\" takes a duration with a unit, ms, s, m, h or d");
  }
  kl_refused("{\"key\":\"k\",\"type\":\"t\",\"delay\":900}",
             "\"delay\" must be a string, a duration with a unit");
  /* a string, with a NUL in it: said as it is, not "not a string" */
  kl_refused("{\"key\":\"k\",\"type\":\"t\",\"delay\":\"15m\\u0000x\"}",
             "\"delay\" holds a NUL byte at byte 3: give a duration with a "
             "unit and nothing after it, such as \"15m\"");
  kl_refused("{\"key\":\"k\",\"type\":\"t\",\"delay\":\"9223372036854775s\"}",
             "ends after the year");
}

static void test_not_before_and_delay(void **state) {
  (void)state;
  kl_refused("{\"key\":\"k\",\"type\":\"t\",\"not_before\":1767225900000,"
             "\"delay\":\"15m\"}",
             "both \"not_before\" and \"delay\" are given: pass one");
  kl_refused("{\"key\":\"k\",\"type\":\"t\",\"nb\":1767225900000}",
             "headers, and not_before or delay");
}

/* A type beginning with '~' is keylane's: no client writes one, delayed
 * or not. */
static void test_reserved_type(void **state) {
  (void)state;
  kl_refused("{\"key\":\"k\",\"type\":\"~timer\"}",
             "keeps for its own records");
  kl_refused("{\"key\":\"k\",\"type\":\"~timer\",\"delay\":\"1m\"}",
             "keeps for its own records");
  assert_int_equal(kl_not_before("{\"key\":\"k\",\"type\":\"a~\"}"), 0);
}

/* kl__not_before_check(), as the publishers call it, gives each case of the
 * table shared with the clients its error word for word, or none: seconds for
 * ms, timer.max.delay behind and ahead of now (inclusive bounds), the excess
 * exact to the millisecond. */
static void test_not_before_bounds(void **state) {
  (void)state;
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof(path), "%s/tests/clients/not_before_cases.json",
           src ? src : ".");
  json_error_t jerr;
  json_t *doc = json_load_file(path, 0, &jerr);
  if (!doc)
    fail_msg("%s: %s", path, jerr.text);
  int64_t now = json_integer_value(json_object_get(doc, "now_ms"));
  json_t *cases = json_object_get(doc, "cases"), *c;
  size_t i, refused = 0;
  assert_true(json_array_size(cases) >= 10);
  json_array_foreach(cases, i, c) {
    kl_event_t ev = {.not_before =
                         json_integer_value(json_object_get(c, "not_before"))};
    int64_t max = json_integer_value(json_object_get(c, "max_ms"));
    const char *want = json_string_value(json_object_get(c, "error"));
    kl_err_t err = kl__not_before_check(&ev, now, max, max, "timer.max.delay");
    if (!want && err)
      fail_msg("case %zu (%lld): refused: %s", i, (long long)ev.not_before,
               kl_err_detail());
    if (want && (err != KL_EINVAL || strcmp(kl_err_detail(), want) != 0))
      fail_msg("case %zu (%lld): %s\nexpected: %s", i, (long long)ev.not_before,
               err ? kl_err_detail() : "accepted", want);
    refused += want != NULL;
  }
  assert_true(refused >= 5 && refused < json_array_size(cases));
  json_decref(doc);
  /* The worker's bound into the past is store.dedup.retention: its text
   * names that bound in the fix too, not timer.max.delay (attack LOW). */
  kl_event_t ev = {.not_before = now - 8 * 86400000LL};
  assert_int_equal(kl__not_before_check(&ev, now, 86400000LL, 7 * 86400000LL,
                                        "store.dedup.retention"),
                   KL_EINVAL);
  if (!strstr(kl_err_detail(), "1d more than store.dedup.retention (7d) "
                               "allows: give milliseconds since the Unix "
                               "epoch of a time at most store.dedup."
                               "retention ago") ||
      strstr(kl_err_detail(), "timer.max.delay"))
    fail_msg("%s", kl_err_detail());
}

/* Which problem an event with several is refused for: the fields are read
 * in one walk over the object, and the checks still come in their order
 * (an unknown field first, then key, type, id, the time, headers, the
 * payload), whatever order the fields are written in. */
static void test_field_errors(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"type\":1,\"paylaod\":1}", "unknown field \"paylaod\""},
      {"{\"zz\":1,\"yy\":1,\"key\":\"k\"}", "unknown field \"zz\""},
      {"{\"type\":\"t\",\"payload\":1}", "\"key\" is missing"},
      {"{\"id\":\"\",\"type\":7,\"key\":\"k\"}", "\"type\" must be a string"},
      {"{\"id\":\"\",\"type\":\"t\",\"key\":\"k\"}",
       "\"id\" is empty; omit it"},
      {"{\"payload\":1,\"payload_b64\":\"AA==\",\"headers\":1,\"delay\":"
       "\"1s\",\"not_before\":1,\"type\":\"t\",\"key\":\"k\"}",
       "both \"not_before\" and \"delay\""},
      {"{\"payload\":1,\"payload_b64\":\"AA==\",\"headers\":1,\"type\":"
       "\"t\",\"key\":\"k\"}",
       "\"headers\" must be an object"},
      {"{\"payload_b64\":\"AA==\",\"payload\":1,\"type\":\"t\",\"key\":\"k\"}",
       "both \"payload\" and \"payload_b64\""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl__jevent_t je;
    char err[400];
    assert_int_equal(kl_parse(cases[i].text, &je, err, sizeof(err)), KL_EINVAL);
    if (!strstr(err, cases[i].want))
      fail_msg("%s: %s\nexpected: %s", cases[i].text, err, cases[i].want);
  }
  /* and every field read from where it is written (the strings are
   * borrowed from the document: it lives until the end) */
  kl__jevent_t je;
  char err[400];
  json_t *root = json_loads("{\"headers\":{\"h\":\"v\"},\"payload\":[1],"
                            "\"id\":\"i\",\"type\":\"t\",\"key\":\"k\"}",
                            0, NULL);
  assert_non_null(root);
  assert_int_equal(kl__jevent_parse(&je, root, err, sizeof(err)), KL_OK);
  assert_memory_equal(je.ev.key, "k", 1);
  assert_memory_equal(je.ev.type, "t", 1);
  assert_memory_equal(je.ev.id, "i", 1);
  assert_int_equal(je.ev.header_count, 1);
  assert_memory_equal(je.ev.headers[0].value, "v", 1);
  assert_int_equal(je.ev.payload_len, 2);
  assert_memory_equal(je.ev.payload, "\x91\x01", 2);
  kl__jevent_clear(&je);
  json_decref(root);
}

static char kl_t_mem[8192];
static size_t kl_t_used;

static void *kl_t_alloc(void *ctx, size_t size) {
  (void)ctx;
  if (size > sizeof(kl_t_mem) - kl_t_used)
    return NULL;
  kl_t_used += size;
  return kl_t_mem + kl_t_used - size;
}

/* kl__json_to_msgpack_in() packs on its stack what fits in 1 KiB and
 * measures the rest first: the same bytes as kl__json_to_msgpack() on
 * both sides of that edge, and the same refusal past max_size. */
static void test_pack_in_edges(void **state) {
  (void)state;
  /* a string of n bytes (n >= 256) packs to n + 3 */
  const size_t lens[] = {1019, 1020, 1021, 1022, 3000};
  char text[3001];
  memset(text, 'x', sizeof(text));
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    json_t *v = json_pack("[s#]", text, (int)lens[i]);
    void *want;
    size_t want_len, len;
    const void *got;
    assert_int_equal(kl__json_to_msgpack(v, KL_PAYLOAD_MAX, &want, &want_len),
                     KL_OK);
    assert_int_equal(want_len, lens[i] + 4);
    kl_t_used = 0;
    assert_int_equal(
        kl__json_to_msgpack_in(v, KL_PAYLOAD_MAX, kl_t_alloc, NULL, &got, &len),
        KL_OK);
    assert_int_equal(len, want_len);
    assert_memory_equal(got, want, len);
    assert_int_equal(kl_t_used, len);
    /* a limit of one byte less refuses it, one of exactly its size not */
    assert_int_equal(
        kl__json_to_msgpack_in(v, len - 1, kl_t_alloc, NULL, &got, &len),
        KL_EINVAL);
    assert_non_null(strstr(kl_err_detail(), "packs to more than"));
    assert_int_equal(
        kl__json_to_msgpack_in(v, want_len, kl_t_alloc, NULL, &got, &len),
        KL_OK);
    assert_memory_equal(got, want, len);
    free(want);
    json_decref(v);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_not_before, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_delay, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_not_before_and_delay, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_reserved_type, kl_setup,
                                      kl_teardown),
      cmocka_unit_test(test_not_before_bounds),
      cmocka_unit_test(test_field_errors),
      cmocka_unit_test(test_pack_in_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
