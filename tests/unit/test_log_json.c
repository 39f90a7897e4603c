/*
 * KEYLANE_LOG_FORMAT=json (common/log.c): every line a log shipper reads
 * is one JSON object with ts, level, pid, component and msg, whatever the
 * message quotes (quotes, backslashes, newlines, bytes that are not
 * UTF-8), and a value that is not a format is refused by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/log.h"

/* Runs the logging below with stderr on a pipe; @returns what it wrote. */
static char *log_captured(void) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  assert_int_equal(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
  close(fds[1]);
  KL_LOG_I("worker", "plain message");
  KL_LOG_W("store", "quote \" backslash \\ newline\nend");
  KL_LOG_E("handler", "not utf-8 \xff\xfe, utf-8 caf\xc3\xa9, tab\t, esc \x1b");
  KL_LOG_D("worker", "debug is below the default level");
  kl__log_trace_set("00-0123456789abcdef0123456789abcdef-0123456789abcdef-01");
  KL_LOG_I("lane", "traced");
  kl__log_trace_set(NULL);
  assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
  close(saved);
  static char out[65536];
  size_t n = 0;
  ssize_t r;
  while ((r = read(fds[0], out + n, sizeof(out) - 1 - n)) > 0)
    n += (size_t)r;
  close(fds[0]);
  out[n] = '\0';
  return out;
}

static void test_json_lines(void **state) {
  (void)state;
  char *out = log_captured();
  static const struct {
    const char *level, *component, *msg;
  } want[] = {
      {"INFO", "worker", "plain message"},
      {"WARN", "store", "quote \" backslash \\ newline\nend"},
      {"ERROR", "handler",
       "not utf-8 \\xff\\xfe, utf-8 caf\xc3\xa9, tab\t, esc \x1b"},
      {"INFO", "lane", "traced"},
  };
  size_t lines = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    assert_true(lines < sizeof(want) / sizeof(want[0]));
    json_error_t err;
    json_t *obj = json_loads(line, 0, &err);
    if (!obj)
      fail_msg("line %zu is not JSON (%s): %s", lines + 1, err.text, line);
    const char *ts = json_string_value(json_object_get(obj, "ts"));
    assert_non_null(ts);
    assert_int_equal(strlen(ts), strlen("2026-01-02T03:04:05.678Z"));
    assert_int_equal(ts[strlen(ts) - 1], 'Z');
    assert_string_equal(json_string_value(json_object_get(obj, "level")),
                        want[lines].level);
    assert_int_equal(json_integer_value(json_object_get(obj, "pid")),
                     (json_int_t)getpid());
    assert_string_equal(json_string_value(json_object_get(obj, "component")),
                        want[lines].component);
    assert_string_equal(json_string_value(json_object_get(obj, "msg")),
                        want[lines].msg);
    json_t *trace = json_object_get(obj, "trace_id");
    if (strcmp(want[lines].msg, "traced") == 0) {
      assert_string_equal(json_string_value(trace),
                          "0123456789abcdef0123456789abcdef");
      assert_string_equal(json_string_value(json_object_get(obj, "span_id")),
                          "0123456789abcdef");
    } else {
      assert_null(trace);
    }
    json_decref(obj);
    lines++;
  }
  assert_int_equal(lines, sizeof(want) / sizeof(want[0]));
}

static void test_unknown_format_is_refused(void **state) {
  (void)state;
  assert_int_equal(kl__log_env_check(), KL_OK);
  setenv("KEYLANE_LOG_FORMAT", "yaml", 1);
  assert_int_equal(kl__log_env_check(), KL_ECONF);
  assert_string_equal(kl_err_detail(), "KEYLANE_LOG_FORMAT=\"yaml\" is not a "
                                       "log format: use text (the default) "
                                       "or json");
  setenv("KEYLANE_LOG_FORMAT", "TEXT", 1);
  assert_int_equal(kl__log_env_check(), KL_OK);
  setenv("KEYLANE_LOG_FORMAT", "json", 1);
}

int main(void) {
  /* Read once, at the first line logged. */
  setenv("KEYLANE_LOG_FORMAT", "json", 1);
  unsetenv("KEYLANE_LOG");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_lines),
      cmocka_unit_test(test_unknown_format_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
