/*
 * W3C trace context end to end on the embedded cluster: a traceparent and
 * tracestate sent as HTTP headers to the gateway travel in the events'
 * headers to `keylane worker --handler exec:...`, whose child reads them
 * in its input line, and the worker's log line about the event (here its
 * dead letter) carries the trace id. An event naming its own traceparent
 * keeps it; a malformed traceparent header is a 400 that names it.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/cluster.h"
#include "support/http.h"
#include "support/support.h"

#define KL_TRACE_ID "4bf92f3577b34da6a3ce929d0e0e4736"
#define KL_SPAN_ID "00f067aa0ba902b7"
#define KL_TP "00-" KL_TRACE_ID "-" KL_SPAN_ID "-01"
#define KL_OWN_TP "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

/* The whole of @p path, or "" when it does not exist yet. */
static char *kl_slurp(const char *path) {
  static char text[65536];
  text[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f)
    return text;
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* Waits (polling, up to 30 s) until @p path holds @p want. */
static const char *kl_wait_for(const char *path, const char *want) {
  for (int i = 0; i < 600; i++) {
    const char *text = kl_slurp(path);
    if (strstr(text, want))
      return text;
    kl_t_sleep_ms(50);
  }
  fail_msg("%s never held \"%s\":\n%s", path, want, kl_slurp(path));
  return NULL;
}

static pid_t kl_worker(kl_t_cluster_t *cluster, const char *dir,
                       const char *log) {
  char handler[512];
  snprintf(handler, sizeof(handler),
           "exec:while read -r l; do printf '%%s\\n' \"$l\" >> %s/in.jsonl; "
           "case \"$l\" in *'\"type\":\"fail\"'*) echo '{\"status\":\"fail\","
           "\"error\":\"refused by the test\"}';; *) echo "
           "'{\"status\":\"ok\"}';; esac; done",
           dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(kl_t_bin(), "keylane", "worker", "-b", kl_t_bootstrap(cluster), "-t",
          kl_t_topic(cluster), "-g", kl_t_group(cluster, "gt"), "--store", dir,
          "--handler", handler, "--handler-timeout-ms", "5000",
          "--session-timeout-ms", "3000", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* The input line the child got for the event of key @p key. */
static json_t *kl_input(const char *lines, const char *key) {
  char want[64];
  snprintf(want, sizeof(want), "\"key\":\"%s\"", key);
  const char *at = strstr(lines, want);
  assert_non_null(at);
  while (at > lines && at[-1] != '\n')
    at--;
  json_error_t err;
  json_t *doc = json_loadb(at, strcspn(at, "\n"), 0, &err);
  if (!doc)
    fail_msg("input line not JSON (%s): %s", err.text, at);
  return doc;
}

static void test_http_traceparent_reaches_exec_handler(void **state) {
  char dir[64], log[128], in[128];
  kl_t_tmpdir(dir);
  snprintf(log, sizeof(log), "%s/worker.log", dir);
  snprintf(in, sizeof(in), "%s/in.jsonl", dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "trace", 1, &cluster), KL_OK);
  assert_int_equal(kl_t_cluster_topic_create(cluster, "trace.dlq", 1), KL_OK);
  kl_t_gateway_t *tg = kl_t_gateway_start(kl_t_bootstrap(cluster), NULL, NULL);
  char path[256];
  snprintf(path, sizeof(path), "/v1/topics/%s/events", kl_t_topic(cluster));
  kl_t_http_resp_t r;
  int up = 0; /* the gateway takes events once Kafka answered it */
  for (int i = 0; i < 200 && !up; i++) {
    up = kl_t_http_once(tg->port, "GET", "/healthz", NULL, NULL, &r) == 0 &&
         r.status == 200;
    kl_t_http_resp_free(&r);
    if (!up)
      kl_t_sleep_ms(50);
  }
  assert_true(up);
  assert_int_equal(kl_t_http_once(tg->port, "POST", path,
                                  "Content-Type: application/json\r\n"
                                  "traceparent: " KL_TP "\r\n"
                                  "tracestate: rojo=" KL_SPAN_ID "\r\n",
                                  "[{\"key\":\"k1\",\"type\":\"fail\"},"
                                  "{\"key\":\"k2\",\"type\":\"ok\",\"headers\":"
                                  "{\"traceparent\":\"" KL_OWN_TP "\"}}]",
                                  &r),
                   0);
  if (r.status != 200)
    fail_msg("publish: %d %s", r.status, r.body);
  kl_t_http_resp_free(&r);

  assert_int_equal(kl_t_http_once(tg->port, "POST", path,
                                  "Content-Type: application/json\r\n"
                                  "traceparent: 00-abc\r\n",
                                  "{\"key\":\"k3\",\"type\":\"ok\"}", &r),
                   0);
  assert_int_equal(r.status, 400);
  assert_non_null(strstr(r.body, "traceparent"));
  assert_non_null(strstr(r.body, "00-abc"));
  kl_t_http_resp_free(&r);
  assert_int_equal(kl_t_http_once(tg->port, "POST", path,
                                  "Content-Type: application/json\r\n"
                                  "traceparent: " KL_TP "\r\n"
                                  "traceparent: " KL_OWN_TP "\r\n",
                                  "{\"key\":\"k3\",\"type\":\"ok\"}", &r),
                   0);
  assert_int_equal(r.status, 400); /* which one would it be? */
  assert_non_null(strstr(r.body, "once"));
  kl_t_http_resp_free(&r);

  pid_t pid = kl_worker(cluster, dir, log);
  const char *lines = kl_wait_for(in, "\"key\":\"k2\"");
  json_t *k1 = kl_input(lines, "k1");
  assert_string_equal(json_string_value(json_object_get(k1, "traceparent")),
                      KL_TP);
  assert_string_equal(json_string_value(json_object_get(k1, "tracestate")),
                      "rojo=" KL_SPAN_ID);
  json_decref(k1);
  json_t *k2 = kl_input(lines, "k2");
  assert_string_equal(json_string_value(json_object_get(k2, "traceparent")),
                      KL_OWN_TP);
  assert_null(json_object_get(k2, "tracestate"));
  json_decref(k2);
  const char *text = kl_wait_for(log, "dead letter partition=0 offset=0");
  const char *line = strstr(text, "dead letter partition=0 offset=0");
  const char *want = " trace_id=" KL_TRACE_ID " span_id=" KL_SPAN_ID "\n";
  const char *end = strchr(line, '\n');
  if (!end || strncmp(end + 1 - strlen(want), want, strlen(want)) != 0)
    fail_msg("the dead letter's log line carries no trace:\n%s", text);

  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  kl_t_gateway_stop(tg);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_http_traceparent_reaches_exec_handler),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
