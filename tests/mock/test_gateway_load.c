/*
 * The gateway as deployed: the keylane binary (KEYLANE_BIN) running
 * `keylane broker --embedded --listen 127.0.0.1:0 --tokens-file F`, loaded
 * by wrk over 16 keep-alive connections on loopback for a few seconds.
 * wrk reports requests/s and p99; then the topic is read back with plain
 * librdkafka: every event that got a 200 is there exactly once, at the
 * partition and offset the 200 named, and on the partition kl_partition()
 * names for its key. Finally SIGTERM drains and exits 0.
 */
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
#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "keylane/event.h"
#include "keylane/producer.h"
#include "support/http.h"
#include "support/support.h"

#define KL_L_TOPIC "load"
#define KL_L_PARTS 8
#define KL_L_TOKEN "load-test-token"
#define KL_L_SECONDS "5s"

typedef struct kl_l_broker {
  pid_t pid;
  FILE *out;
  char bootstrap[600];
  int port;
} kl_l_broker_t;

static void kl_l_start(kl_l_broker_t *b, const char *dir) {
  char tokens[128];
  snprintf(tokens, sizeof(tokens), "%s/tokens", dir);
  FILE *f = fopen(tokens, "w");
  fprintf(f, "%s\n", KL_L_TOKEN);
  fclose(f);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  b->pid = fork();
  if (b->pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    setenv("KEYLANE_LOG", "warn", 1);
    execl(kl_t_bin(), "keylane", "broker", "--embedded", "-t", KL_L_TOPIC,
          "--partitions", "8", "--brokers", "1", "--listen", "127.0.0.1:0",
          "--tokens-file", tokens, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  b->out = fdopen(fds[0], "r");
  char line[600];
  while (fgets(line, sizeof(line), b->out)) {
    line[strcspn(line, "\n")] = '\0';
    if (!strncmp(line, "bootstrap=", 10))
      snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", line + 10);
    if (!strncmp(line, "listening=", 10)) {
      b->port = atoi(strrchr(line, ':') + 1);
      break;
    }
  }
  assert_true(b->port > 0 && b->bootstrap[0]);
  kl_t_http_wait_up(b->port);
}

static int kl_l_stop(kl_l_broker_t *b) {
  kill(b->pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300 && waitpid(b->pid, &status, WNOHANG) == 0; i++)
    kl_t_sleep_ms(50);
  if (waitpid(b->pid, &status, WNOHANG) == 0) {
    kill(b->pid, SIGKILL);
    waitpid(b->pid, &status, 0);
    return -1;
  }
  fclose(b->out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Each wrk thread POSTs 10 events per request with ids "w<thread>-<n>-<i>"
 * and appends every 200 body (one JSON line) to ok-<thread>.jsonl. */
static void kl_l_script(const char *dir, char *path, size_t size) {
  snprintf(path, size, "%s/load.lua", dir);
  FILE *f = fopen(path, "w");
  fprintf(f,
          "local nthreads = 0\n"
          "function setup(thread)\n"
          "  thread:set('tid', nthreads)\n"
          "  nthreads = nthreads + 1\n"
          "end\n"
          "function init(args)\n"
          "  counter = 0\n"
          "  out = io.open('%s/ok-' .. tid .. '.jsonl', 'w')\n"
          "  out:setvbuf('line')\n"
          "end\n"
          "function request()\n"
          "  counter = counter + 1\n"
          "  local ev = {}\n"
          "  for i = 1, 10 do\n"
          "    local n = counter * 10 + i\n"
          "    ev[i] = string.format('{\"key\":\"k%%d\",\"type\":\"load\","
          "\"id\":\"w%%d-%%d-%%d\",\"payload\":{\"n\":%%d}}', n %% 997, tid,"
          " counter, i, n)\n"
          "  end\n"
          "  return wrk.format('POST', '/v1/topics/%s/events',\n"
          "    {['Content-Type'] = 'application/json',\n"
          "     ['Authorization'] = 'Bearer %s'},\n"
          "    '[' .. table.concat(ev, ',') .. ']')\n"
          "end\n"
          "function response(status, headers, body)\n"
          "  if status == 200 then out:write(body) else\n"
          "    io.stderr:write('non-2xx ' .. status .. ': ' .. body .. '\\n')\n"
          "  end\n"
          "end\n",
          dir, KL_L_TOPIC, KL_L_TOKEN);
  fclose(f);
}

/* Runs wrk; prints and returns its requests/s; @p p99 gets its p99. */
static double kl_l_wrk(const char *script, int port, char *p99, size_t size,
                       long *non2xx) {
  char cmd[1024], line[512];
  snprintf(cmd, sizeof(cmd),
           "wrk -t2 -c16 -d%s --latency -s %s "
           "http://127.0.0.1:%d/ 2>&1",
           KL_L_SECONDS, script, port);
  printf("running: %s\n", cmd);
  FILE *p = popen(cmd, "r");
  double rps = 0;
  *non2xx = 0;
  while (fgets(line, sizeof(line), p)) {
    fputs(line, stdout);
    sscanf(line, " Requests/sec: %lf", &rps);
    sscanf(line, " Non-2xx or 3xx responses: %ld", non2xx);
    if (sscanf(line, " 99%% %63s", p99) == 1)
      p99[size - 1] = '\0';
  }
  assert_int_equal(pclose(p), 0);
  return rps;
}

/* id -> [partition, offset] of every event that got a 200. */
static json_t *kl_l_acked(const char *dir) {
  json_t *acked = json_object();
  for (int t = 0; t < 2; t++) {
    char path[128], line[1 << 16];
    snprintf(path, sizeof(path), "%s/ok-%d.jsonl", dir, t);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
      json_t *arr = json_loads(line, 0, NULL);
      assert_true(json_is_array(arr));
      size_t i;
      json_t *o;
      json_array_foreach(arr, i, o) {
        json_object_set_new(acked, json_string_value(json_object_get(o, "id")),
                            json_pack("[O,O]", json_object_get(o, "partition"),
                                      json_object_get(o, "offset")));
      }
      json_decref(arr);
    }
    fclose(f);
  }
  return acked;
}

static rd_kafka_t *kl_l_consumer(const char *bootstrap) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                    sizeof(errstr));
  rd_kafka_conf_set(conf, "group.id", "load-check", errstr, sizeof(errstr));
  rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr,
                    sizeof(errstr));
  rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr,
                    sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_topic_partition_list_t *parts =
      rd_kafka_topic_partition_list_new(KL_L_PARTS);
  for (int p = 0; p < KL_L_PARTS; p++)
    rd_kafka_topic_partition_list_add(parts, KL_L_TOPIC, p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  assert_int_equal(rd_kafka_assign(rk, parts), 0);
  rd_kafka_topic_partition_list_destroy(parts);
  return rk;
}

/* One consumed record: counted by id, checked against its key's route. */
static void kl_l_record(const rd_kafka_message_t *m, kl_decoder_t *dec,
                        json_t *seen, json_t *acked, long *matched) {
  kl_event_t ev;
  assert_int_equal(
      kl_event_decode(dec, m->key, m->key_len, m->payload, m->len, &ev), KL_OK);
  assert_int_equal(m->partition, kl_partition(m->key, m->key_len, KL_L_PARTS));
  char id[KL_ID_MAX + 1];
  snprintf(id, sizeof(id), "%.*s", (int)ev.id_len, ev.id);
  json_t *count = json_object_get(seen, id);
  if (count)
    fail_msg("event %s is in the topic twice", id);
  json_object_set_new(seen, id, json_integer(1));
  json_t *ack = json_object_get(acked, id);
  if (ack) {
    assert_int_equal(json_integer_value(json_array_get(ack, 0)), m->partition);
    assert_int_equal(json_integer_value(json_array_get(ack, 1)), m->offset);
    (*matched)++;
  }
}

static void kl_l_check_topic(const char *bootstrap, json_t *acked) {
  rd_kafka_t *rk = kl_l_consumer(bootstrap);
  kl_decoder_t *dec = kl_decoder_new();
  json_t *seen = json_object();
  long matched = 0;
  int eofs = 0;
  int64_t deadline = kl__mono_ns() + 40000000000LL;
  while (eofs < KL_L_PARTS && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
    if (!m)
      continue;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
      eofs++;
    else if (!m->err)
      kl_l_record(m, dec, seen, acked, &matched);
    rd_kafka_message_destroy(m);
  }
  assert_int_equal(eofs, KL_L_PARTS);
  printf("topic %s: %zu events, %ld of %zu acknowledged ones found, each "
         "once, on its key's partition\n",
         KL_L_TOPIC, json_object_size(seen), matched, json_object_size(acked));
  assert_int_equal(matched, (long)json_object_size(acked));
  json_decref(seen);
  kl_decoder_destroy(dec);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
}

/* The test's broker, stopped by the teardown also when the test fails. */
static kl_l_broker_t kl_l_running;

static int kl_l_teardown(void **state) {
  (void)state;
  if (kl_l_running.pid > 0)
    kl_l_stop(&kl_l_running);
  kl_l_running.pid = 0;
  return 0;
}

static void test_wrk_load_then_every_200_is_in_kafka_once(void **state) {
  char dir[64], script[128], p99[64] = "?";
  if (system("wrk --version >/dev/null 2>&1") != 0 &&
      system("command -v wrk >/dev/null") != 0)
    skip(); /* deploy/install-deps.sh --test installs it */
  kl_t_tmpdir(dir);
  kl_l_broker_t *b = &kl_l_running;
  memset(b, 0, sizeof(*b));
  kl_l_start(b, dir);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_once(b->port, "POST", "/v1/topics/load/events",
                                  NULL, "{\"key\":\"k\",\"type\":\"t\"}", &r),
                   0);
  assert_int_equal(r.status, 401);
  kl_t_http_resp_free(&r);
  kl_l_script(dir, script, sizeof(script));
  long non2xx;
  double rps = kl_l_wrk(script, b->port, p99, sizeof(p99), &non2xx);
  printf("wrk: %.0f requests/s (%.0f events/s), p99 %s, non-2xx %ld\n", rps,
         rps * 10, p99, non2xx);
  assert_true(rps > 0);
  assert_int_equal(non2xx, 0);
  json_t *acked = kl_l_acked(dir);
  assert_true(json_object_size(acked) > 0);
  kl_l_check_topic(b->bootstrap, acked);
  json_decref(acked);
  int rc = kl_l_stop(b);
  b->pid = 0; /* stopped: not the teardown's */
  assert_int_equal(rc, 0);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_wrk_load_then_every_200_is_in_kafka_once,
                                kl_l_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
