/* W3C trace context (keylane/event.h "Trace context", event/trace.h):
 * which traceparents are valid, kl_event_validate() refusing a malformed
 * one while the decoder passes it on, the exec handler's request line
 * carrying a valid one, and the log lines of a thread working on an event
 * carrying its trace id. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "event/envelope.h"
#include "event/trace.h"
#include "common/internal.h"
#include "common/log.h"
#include "keylane/event.h"
#include "handlers/exec_line.h"

#define KL_TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static int kl_valid(const char *s) {
  return kl_traceparent_valid(s, strlen(s));
}

static void test_traceparent_valid(void **state) {
  assert_true(kl_valid(KL_TP));
  assert_true(
      kl_valid("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
  /* a later version may append fields after a dash */
  assert_true(
      kl_valid("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz"));
  const char *bad[] = {
      "",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",     /* short */
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* v00 +  */
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* ff */
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  /* zeros */
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  /* zeros */
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  /* upper */
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* dash */
      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  /* hex */
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", /* v01 */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (kl_valid(bad[i]))
      fail_msg("\"%s\" taken as a traceparent", bad[i]);
  assert_true(
      kl_tracestate_valid("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", 39));
  assert_false(kl_tracestate_valid("a=\x01", 3));
  char longer[KL_TRACESTATE_MAX + 2];
  memset(longer, 'a', sizeof(longer));
  assert_false(kl_tracestate_valid(longer, sizeof(longer)));
}

static kl_event_t kl_event(kl_header_t *h, size_t n) {
  return (kl_event_t){.key = "k",
                      .key_len = 1,
                      .id = "i",
                      .id_len = 1,
                      .type = "t",
                      .type_len = 1,
                      .ts = 1,
                      .headers = h,
                      .header_count = n};
}

static void test_validate_and_decode(void **state) {
  kl_header_t h[2] = {{"traceparent", 11, "00-zz", 5},
                      {"tracestate", 10, "a=b", 3}};
  kl_event_t ev = kl_event(h, 2);
  assert_int_equal(kl_event_validate(&ev, 0), KL_EDECODE_TYPE);
  assert_non_null(strstr(kl_err_detail(), "traceparent \"00-zz\""));
  h[0].value = KL_TP;
  h[0].value_len = strlen(KL_TP);
  assert_int_equal(kl_event_validate(&ev, 0), KL_OK);
  h[1].value = "a=\n";
  assert_int_equal(kl_event_validate(&ev, 0), KL_EDECODE_TYPE);
  assert_non_null(strstr(kl_err_detail(), "tracestate"));

  /* Another producer's malformed traceparent decodes (the worker passes it
   * on as a header) but is no trace context. */
  kl_header_t tp = {"traceparent", 11, "00-zz", 5};
  kl_event_t sent = kl_event(&tp, 1);
  uint8_t buf[256];
  assert_true(kl__envelope_size(&sent) <= sizeof(buf));
  size_t len = kl__envelope_write(&sent, buf);
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t got;
  assert_int_equal(kl_event_decode(decoder, "k", 1, buf, len, &got), KL_OK);
  const kl_header_t *h0 = kl_event_header(&got, KL_TRACEPARENT);
  assert_non_null(h0);
  assert_int_equal(h0->value_len, 5);
  assert_null(kl__trace_parent(&got));
  assert_null(kl_event_header(&got, KL_TRACESTATE));
  kl_decoder_destroy(decoder);
}

static json_t *kl_request(const kl_event_t *ev) {
  kl_fence_t fence = {"events", 3, 7, 42};
  size_t len;
  char *line = kl__exec_request(ev, &fence, &len);
  assert_non_null(line);
  size_t seq = kl__exec_request_seq(line, 1);
  json_error_t err;
  json_t *doc = json_loadb(line + KL__EXEC_SEQ_ROOM - seq, seq + len, 0, &err);
  if (!doc)
    fail_msg("exec request not JSON: %s", err.text);
  free(line);
  return doc;
}

static void test_exec_request_carries_trace(void **state) {
  kl_header_t h[2] = {{"traceparent", 11, KL_TP, strlen(KL_TP)},
                      {"tracestate", 10, "rojo=00f067aa0ba902b7", 21}};
  kl_event_t ev = kl_event(h, 2);
  json_t *doc = kl_request(&ev);
  assert_string_equal(json_string_value(json_object_get(doc, "traceparent")),
                      KL_TP);
  assert_string_equal(json_string_value(json_object_get(doc, "tracestate")),
                      "rojo=00f067aa0ba902b7");
  json_decref(doc);
  h[0].value = "00-zz"; /* not a trace context: not handed on as one */
  h[0].value_len = 5;
  doc = kl_request(&ev);
  assert_null(json_object_get(doc, "traceparent"));
  assert_null(json_object_get(doc, "tracestate"));
  json_decref(doc);
}

/* Runs kl__log with stderr in a file; @returns what it wrote. */
static char *kl_logged(const char *traceparent) {
  char path[] = "/tmp/kl_trace_logXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  kl__log_trace_set(traceparent);
  KL_LOG_W("test", "dead letter partition=0 offset=5");
  kl__log_trace_set(NULL);
  KL_LOG_W("test", "after");
  dup2(saved, STDERR_FILENO);
  close(saved);
  static char text[1024];
  ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  return text;
}

static void test_log_lines_carry_trace(void **state) {
  char *text = kl_logged(KL_TP);
  assert_non_null(strstr(text, "offset=5 trace_id=4bf92f3577b34da6a3ce929d0e0e"
                               "4736 span_id=00f067aa0ba902b7\n"));
  assert_non_null(strstr(text, "test: after\n")); /* cleared */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_traceparent_valid),
      cmocka_unit_test(test_validate_and_decode),
      cmocka_unit_test(test_exec_request_carries_trace),
      cmocka_unit_test(test_log_lines_carry_trace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
