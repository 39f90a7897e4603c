/*
 * The publish-side subcommands through the real executable (KEYLANE_BIN):
 * keylane route, keylane broker --embedded, keylane publish; and the
 * JSON <-> msgpack mapping and base64 that publish rests on.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "common/internal.h"
#include "common/json_msgpack.h"
#include "keylane/embedded.h"
#include "keylane/producer.h"
#include "support/run.h"
#include "support/spawn.h"
#include "support/support.h"

/* ---- running the binary ---- */

typedef kl_t_run_t kl_run_t;

static void kl_run(const char *const *args, const char *input, kl_run_t *r) {
  kl_t_run(args, input, input ? strlen(input) : 0, r);
}

static void kl_run_free(kl_run_t *r) {
  kl_t_run_free(r);
}

/* ---- keylane route ---- */

static void test_route_args(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "50", "foobar", "21", "abc",
                          NULL},
         NULL, &r);
  assert_int_equal(r.rc, 0);
  char want[128];
  snprintf(want, sizeof(want), "foobar\t16\n21\t%d\nabc\t%d\n",
           (int)kl_partition("21", 2, 50), (int)kl_partition("abc", 3, 50));
  assert_string_equal(r.out, want);
  kl_run_free(&r);
}

static void test_route_stdin(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "7", NULL},
         "acct-1\nacct-2\nlast-no-newline", &r);
  assert_int_equal(r.rc, 0);
  char want[128];
  snprintf(want, sizeof(want), "acct-1\t%d\nacct-2\t%d\nlast-no-newline\t%d\n",
           (int)kl_partition("acct-1", 6, 7), (int)kl_partition("acct-2", 6, 7),
           (int)kl_partition("last-no-newline", 15, 7));
  assert_string_equal(r.out, want);
  kl_run_free(&r);
}

static void test_route_bad_key_names_line(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "7", NULL}, "a\n\nb\n", &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "stdin line 2"));
  assert_non_null(strstr(r.err, "empty"));
  assert_int_equal(strncmp(r.out, "a\t", 2), 0); /* line 1 came out */
  kl_run_free(&r);

  char *big = malloc(2000);
  memset(big, 'k', 1025);
  strcpy(big + 1025, "\n");
  kl_run((const char *[]){"route", "--partitions", "7", NULL}, big, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "stdin line 1: the key is 1025 bytes, the "
                                "limit is 1024"));
  kl_run_free(&r);
  free(big);

  kl_run((const char *[]){"route", "k", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--partitions N is required"));
  kl_run_free(&r);
}

static void test_help_everywhere(void **state) {
  (void)state;
  const char *subs[] = {"route", "broker", "publish"};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    kl_run_t r;
    kl_run((const char *[]){subs[i], "--help", NULL}, NULL, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "usage: keylane"));
    assert_non_null(strstr(r.out, "examples:"));
    kl_run_free(&r);
  }
}

/* ---- keylane broker --embedded ---- */

typedef struct kl_broker {
  pid_t pid;
  FILE *out;
  char bootstrap[600];
} kl_broker_t;

/* Starts `keylane broker --embedded ARGS...` and reads its first line. */
static void kl_broker_start(kl_broker_t *b, const char *const *args) {
  const char *argv[32] = {kl_t_bin(), "broker", "--embedded"};
  for (size_t i = 0; args && args[i]; i++)
    argv[i + 3] = args[i];
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  b->pid = fork();
  assert_true(b->pid >= 0);
  if (b->pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  b->out = fdopen(fds[0], "r");
  char line[600];
  assert_non_null(fgets(line, sizeof(line), b->out));
  assert_int_equal(strncmp(line, "bootstrap=127.0.0.1:", 20), 0);
  line[strcspn(line, "\n")] = '\0';
  snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", line + 10);
}

static int kl_broker_stop(kl_broker_t *b, int sig) {
  kill(b->pid, sig);
  int status;
  assert_int_equal(waitpid(b->pid, &status, 0), b->pid);
  fclose(b->out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_broker_embedded_sigterm(void **state) {
  (void)state;
  char file[64];
  snprintf(file, sizeof(file), "/tmp/keylane-bootstrap-%d", (int)getpid());
  kl_broker_t b;
  kl_broker_start(&b, (const char *[]){"-t", "orders", "--partitions", "5",
                                       "--brokers", "2", "--bootstrap-file",
                                       file, NULL});
  assert_non_null(strchr(b.bootstrap, ',')); /* two brokers */
  FILE *f = fopen(file, "r");
  assert_non_null(f);
  char line[600];
  assert_non_null(fgets(line, sizeof(line), f));
  fclose(f);
  char want[700];
  snprintf(want, sizeof(want), "bootstrap=%s\n", b.bootstrap);
  assert_string_equal(line, want);
  assert_int_equal(kl_broker_stop(&b, SIGTERM), 0);
  assert_int_equal(access(file, F_OK), -1); /* removed at exit */
}

static void test_broker_embedded_sigint(void **state) {
  (void)state;
  kl_broker_t b;
  kl_broker_start(&b, NULL);
  assert_int_equal(kl_broker_stop(&b, SIGINT), 0);
}

static double kl_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* SIGTERM right after `keylane worker` starts: it exits 0 at once with an
 * eager assignor (it used to wait for the group's first join, 3 s and more
 * on the embedded cluster), and the assignment a cooperative one still
 * waits for on librdkafka < 2.3 takes no partition: a worker that is
 * stopping takes no epoch, which would fence the partitions' owners. */
static void test_worker_sigterm_during_startup(void **state) {
  (void)state;
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "early", 4, &cluster), KL_OK);
  assert_int_equal(kl_embedded_topic_create(cluster, "early.dlq", 1), KL_OK);
  char dir[64], store[96], line[512];
  kl_t_tmpdir(dir);
  snprintf(store, sizeof(store), "%s/store", dir);
  /* range at once; cooperative-sticky at once, and 0.5 s in, while its
   * first join is under way (the embedded cluster's takes 3 s) */
  for (int run = 0; run < 3; run++) {
    int coop = run > 0;
    const char *argv[] = {kl_t_bin(),
                          "worker",
                          "-b",
                          kl_embedded_bootstrap(cluster),
                          "-t",
                          "early",
                          "-g",
                          run == 2 ? "early-late"
                          : coop   ? "early-coop"
                                   : "early-eager",
                          "--store",
                          store,
                          "--handler",
                          "ledger",
                          "-X",
                          coop ? "kafka.partition.assignment.strategy="
                                 "cooperative-sticky"
                               : "kafka.partition.assignment.strategy=range",
                          NULL};
    pid_t pid = kl_t_spawn_worker(dir, run, argv);
    for (int i = 0;
         i < 500 && !kl_t_log_find(dir, run, "librdkafka", line, sizeof(line));
         i++)
      kl_t_sleep_ms(10);
    if (run == 2)
      kl_t_sleep_ms(500); /* where the signal lands, not an assertion */
    double t0 = kl_now_s();
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    double took = kl_now_s() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail_msg("%s: status %d", coop ? "cooperative" : "eager", status);
    if (kl_t_log_find(dir, run, "assigned partition=", line, sizeof(line)))
      fail_msg("a stopping worker took a partition: %s", line);
    if (!coop && took > 1.5)
      fail_msg("SIGTERM during start-up took %.1f s to exit", took);
    print_message("%s%s: exited %.2f s after SIGTERM\n",
                  coop ? "cooperative-sticky" : "range",
                  run == 2 ? " (in its first join)" : "", took);
  }
  kl_t_rmrf(dir);
  kl_embedded_destroy(cluster);
}

/* An unknown KEYLANE_LOG is an error naming the levels (exit 2), not a
 * silent info; a level's name in any case, or empty, runs. */
static void test_keylane_log_levels(void **state) {
  (void)state;
  static const char *const values[][2] = {
      {"verbose", "2"}, {"WARNING", "2"}, {"info\n", "2"}, {"debug", "0"},
      {"ERROR", "0"},   {"Warn", "0"},    {"", "0"},
  };
  for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
    setenv("KEYLANE_LOG", values[i][0], 1);
    kl_run_t r;
    kl_run((const char *[]){"route", "--partitions", "7", "k", NULL}, NULL, &r);
    unsetenv("KEYLANE_LOG");
    int want = atoi(values[i][1]);
    if (r.rc != want ||
        (want && !strstr(r.err, "is not a log level: set it to error, warn, "
                                "info or debug")))
      fail_msg("KEYLANE_LOG=\"%s\": exit %d, stderr: %s", values[i][0], r.rc,
               r.err);
    if (i == 2 && !strstr(r.err, "KEYLANE_LOG=\"info\\x0a\""))
      fail_msg("the value is not escaped: %s", r.err);
    kl_run_free(&r);
  }
}

static void test_broker_bad_flags(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"broker", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--embedded"));
  kl_run_free(&r);
  kl_run((const char *[]){"broker", "--embedded", "--brokers", "0", NULL}, NULL,
         &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--brokers takes a whole number"));
  assert_non_null(strstr(r.err, "from 1 to 16; got \"0\""));
  kl_run_free(&r);
  kl_run((const char *[]){"broker", "--embedded", "-t", "a b", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "topic \"a b\""));
  kl_run_free(&r);
}

/* A tokens file that never ends (/dev/zero) is refused at once: it used to
 * be read forever, deaf to SIGTERM. One that blocks (a FIFO nobody writes)
 * still gives way to SIGTERM. */
static void test_gateway_tokens_file_bounded(void **state) {
  (void)state;
  kl_run_t r;
  kl_t_run_for((const char *[]){"broker", "--listen", "127.0.0.1:0", "-b",
                                "127.0.0.1:1", "--tokens-file", "/dev/zero",
                                NULL},
               NULL, 0, 10000, &r);
  if (r.rc != 2 || !strstr(r.err, "/dev/zero"))
    fail_msg("exit %d, stderr: %s", r.rc, r.err);
  kl_run_free(&r);
  char dir[64], fifo[96];
  kl_t_tmpdir(dir);
  snprintf(fifo, sizeof(fifo), "%s/tokens", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  kl_t_run_term((const char *[]){"broker", "--listen", "127.0.0.1:0", "-b",
                                 "127.0.0.1:1", "--tokens-file", fifo, NULL},
                300, 10000, &r);
  if (r.rc == 137 || r.rc == 0)
    fail_msg("SIGTERM did not end it: exit %d, stderr: %s", r.rc, r.err);
  kl_run_free(&r);
  kl_t_rmrf(dir);
}

/* An empty --allow-topics used to allow every topic (fail open): it is a
 * usage error naming the flag, the value and the fix, as a list of empty
 * entries was. */
static void test_gateway_empty_allow_topics_refused(void **state) {
  (void)state;
  static const char *const lists[] = {"", ",", " , "};
  for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
    kl_run_t r;
    kl_t_run_for((const char *[]){"broker", "--listen", "127.0.0.1:0", "-b",
                                  "127.0.0.1:1", "--allow-topics", lists[i],
                                  NULL},
                 NULL, 0, 10000, &r);
    char value[16];
    snprintf(value, sizeof(value), "\"%s\"", lists[i]);
    if (r.rc != 2 || !strstr(r.err, "--allow-topics") ||
        !strstr(r.err, value) || !strstr(r.err, "leave the flag out"))
      fail_msg("--allow-topics '%s': exit %d, stderr: %s", lists[i], r.rc,
               r.err);
    kl_run_free(&r);
  }
}

/* A gateway any host can reach that asks for no token says so at start,
 * once, naming the address and the flag that sets tokens; on loopback, or
 * with tokens, it does not. */
static void test_gateway_warns_off_loopback_without_tokens(void **state) {
  (void)state;
  char dir[64], tokens[96];
  kl_t_tmpdir(dir);
  snprintf(tokens, sizeof(tokens), "%s/tokens", dir);
  FILE *f = fopen(tokens, "w");
  assert_non_null(f);
  fputs("0123456789abcdef0123456789abcdef\n", f);
  assert_int_equal(fclose(f), 0);
  static const struct {
    const char *listen;
    int tokens, warns;
  } runs[] = {{"0.0.0.0:0", 0, 1},
              {"127.0.0.1:0", 0, 0},
              {"127.0.0.2:0", 0, 0}, /* 127/8 is loopback */
              {"0.0.0.0:0", 1, 0}};
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    kl_run_t r;
    const char *args[] = {"broker",      "--listen",      runs[i].listen, "-b",
                          "127.0.0.1:1", "--tokens-file", tokens,         NULL};
    if (!runs[i].tokens)
      args[5] = NULL;
    kl_t_run_term(args, 500, 10000, &r);
    /* "TIME WARN [pid] gateway: --listen ADDR is not a loopback..." */
    const char *warn = strstr(r.err, "gateway: --listen ");
    if (warn) {
      const char *line = warn;
      while (line > r.err && line[-1] != '\n')
        line--;
      char head[256];
      snprintf(head, sizeof(head), "%.*s", (int)(warn - line), line);
      assert_non_null(strstr(head, " WARN "));
    }
    if (r.rc != 0 || !strstr(r.out, "listening=") || !warn != !runs[i].warns)
      fail_msg("--listen %s%s: exit %d, stderr: %s", runs[i].listen,
               runs[i].tokens ? " --tokens-file" : "", r.rc, r.err);
    if (warn) {
      char want[64];
      snprintf(want, sizeof(want), "--listen %s ", runs[i].listen);
      assert_non_null(strstr(warn, want));
      assert_non_null(strstr(warn, "--tokens-file"));
      assert_null(strstr(warn + 1, "gateway: --listen ")); /* once */
    }
    kl_run_free(&r);
  }
  kl_t_rmrf(dir);
}

/* ---- keylane publish ---- */

typedef struct kl_msg {
  int32_t partition;
  int64_t offset;
  char key[64];
  unsigned char *value;
  size_t value_len;
} kl_msg_t;

/* Reads every message of @p topic's @p partitions partitions from the
 * start, with a plain consumer (no group): up to 64, for 3 s. */
static size_t kl_consume_all(const char *bootstrap, const char *topic,
                             int partitions, kl_msg_t *msgs) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                    sizeof(errstr));
  rd_kafka_conf_set(conf, "group.id", "cli-test", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(8);
  for (int p = 0; p < partitions; p++)
    rd_kafka_topic_partition_list_add(list, topic, p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  assert_int_equal(rd_kafka_assign(rk, list), 0);
  rd_kafka_topic_partition_list_destroy(list);
  size_t n = 0;
  for (time_t end = time(NULL) + 3; time(NULL) < end && n < 64;) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (m && !m->err) {
      kl_msg_t *out = &msgs[n++];
      out->partition = m->partition;
      out->offset = m->offset;
      snprintf(out->key, sizeof(out->key), "%.*s", (int)m->key_len,
               (const char *)m->key);
      out->value = malloc(m->len);
      memcpy(out->value, m->payload, m->len);
      out->value_len = m->len;
    }
    if (m)
      rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return n;
}

static const kl_msg_t *kl_msg_find(const kl_msg_t *msgs, size_t n,
                                   const char *key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(msgs[i].key, key) == 0)
      return &msgs[i];
  fail_msg("no message with key %s", key);
  return NULL;
}

/* The payload as stored: msgpack of the line's JSON, which reads back as
 * the same JSON value. */
static void kl_check_payload(const kl_msg_t *m, const char *json_text) {
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t ev;
  assert_int_equal(kl_event_decode(decoder, m->key, strlen(m->key), m->value,
                                   m->value_len, &ev),
                   KL_OK);
  json_t *want = json_loads(json_text, JSON_DECODE_ANY, NULL), *got;
  assert_non_null(want);
  if (kl__msgpack_to_json(ev.payload, ev.payload_len, &got) != KL_OK)
    fail_msg("payload of %s: %s", m->key, kl_err_detail());
  assert_true(json_equal(want, got));
  json_decref(want);
  json_decref(got);
  kl_decoder_destroy(decoder);
}

static void kl_check_out_line(json_t *line, const char *key,
                              const kl_msg_t *msgs, size_t n) {
  assert_non_null(line);
  assert_string_equal(json_string_value(json_object_get(line, "key")), key);
  const kl_msg_t *m = kl_msg_find(msgs, n, key);
  assert_int_equal(json_integer_value(json_object_get(line, "partition")),
                   m->partition);
  assert_int_equal(json_integer_value(json_object_get(line, "offset")),
                   m->offset);
  assert_int_equal(m->partition, kl_partition(key, strlen(key), 6));
  assert_int_equal(json_object_size(line), 4);
}

static void test_publish_good_lines_then_bad(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(3, "events", 6, &embedded), KL_OK);
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  const char *input =
      "{\"key\":\"acct-1\",\"type\":\"credit\",\"payload\":{\"amount\":5,"
      "\"tags\":[\"a\",null,true,1.5,-7]}}\n"
      "{\"key\":\"acct-2\",\"type\":\"debit\",\"id\":\"given-id\","
      "\"payload\":\"text\",\"headers\":{\"src\":\"test\"}}\n"
      "{\"key\":\"acct-3\",\"type\":\"raw\",\"payload_b64\":\"AAEC/w==\"}\n"
      "{\"key\":\"acct-4\",\"payload\":1}\n" /* no type: the bad line */
      "{\"key\":\"acct-5\",\"type\":\"never\"}\n";
  kl_run_t r;
  kl_run((const char *[]){"publish", "-b", bootstrap, "-t", "events", "-p", "6",
                          NULL},
         input, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "line 4: \"type\" is missing"));

  kl_msg_t msgs[64];
  size_t n = kl_consume_all(bootstrap, "events", 6, msgs);
  assert_int_equal(n, 3); /* lines 1-3, and not line 5 */
  const char *keys[] = {"acct-1", "acct-2", "acct-3"};
  char *save, *text = strtok_r(r.out, "\n", &save);
  for (size_t i = 0; i < 3; i++, text = strtok_r(NULL, "\n", &save)) {
    assert_non_null(text);
    json_t *line = json_loads(text, 0, NULL);
    kl_check_out_line(line, keys[i], msgs, n);
    const char *id = json_string_value(json_object_get(line, "id"));
    assert_int_equal(strlen(id), i == 1 ? 8 : 36);
    json_decref(line);
  }
  assert_null(text);
  kl_check_payload(kl_msg_find(msgs, n, "acct-1"),
                   "{\"amount\":5,\"tags\":[\"a\",null,true,1.5,-7]}");
  kl_check_payload(kl_msg_find(msgs, n, "acct-2"), "\"text\"");
  for (size_t i = 0; i < n; i++)
    free(msgs[i].value);
  kl_run_free(&r);
  kl_embedded_destroy(embedded);
}

/* A line's "not_before" or "delay" reaches the envelope ("nb", version 2);
 * a line with neither stays version 1. */
static void test_publish_not_before(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "later", 2, &embedded), KL_OK);
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  int64_t nb = kl__now_ms() + 3600000;
  char input[512];
  snprintf(input, sizeof(input),
           "{\"key\":\"at\",\"type\":\"t\",\"not_before\":%lld}\n"
           "{\"key\":\"in\",\"type\":\"t\",\"delay\":\"15m\"}\n"
           "{\"key\":\"now\",\"type\":\"t\"}\n",
           (long long)nb);
  int64_t before = kl__now_ms();
  kl_run_t r;
  kl_run((const char *[]){"publish", "-b", bootstrap, "-t", "later", NULL},
         input, &r);
  int64_t after = kl__now_ms();
  if (r.rc != 0)
    fail_msg("publish: exit %d, stderr: %s", r.rc, r.err);
  kl_msg_t msgs[64];
  size_t n = kl_consume_all(bootstrap, "later", 2, msgs);
  assert_int_equal(n, 3);
  kl_decoder_t *decoder = kl_decoder_new();
  const char *keys[] = {"at", "in", "now"};
  for (size_t i = 0; i < 3; i++) {
    const kl_msg_t *m = kl_msg_find(msgs, n, keys[i]);
    kl_event_t ev;
    assert_int_equal(kl_event_decode(decoder, m->key, strlen(m->key), m->value,
                                     m->value_len, &ev),
                     KL_OK);
    if (i == 0)
      assert_int_equal(ev.not_before, nb);
    if (i == 1)
      assert_in_range(ev.not_before, before + 900000, after + 900000);
    if (i == 2)
      assert_int_equal(ev.not_before, 0);
    /* version 2 exactly when delayed: "\xa1v" then the version */
    assert_int_equal(((const unsigned char *)m->value)[3], i < 2 ? 2 : 1);
  }
  kl_decoder_destroy(decoder);
  for (size_t i = 0; i < n; i++)
    free(msgs[i].value);
  kl_run_free(&r);
  kl_embedded_destroy(embedded);
}

/* A line whose not_before kl_publish() refuses (seconds for ms, more than
 * timer.max.delay behind or ahead) stops the run with exit 2 naming the
 * line and the fix, as any bad line: the lines before it are delivered and
 * listed on stdout, the lines after it are not read. */
static void test_publish_not_before_bounds(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "bounds", 2, &embedded), KL_OK);
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  int64_t day = 86400000, now = kl__now_ms();
  char past[32];
  snprintf(past, sizeof(past), "%lld", (long long)(now - 8 * day));
  const struct {
    const char *field, *says;
  } bad[] = {
      {"\"not_before\":1767225600",
       "line 2: not_before 1767225600 is a time before 1973 in milliseconds "
       "since the Unix epoch: it looks like seconds; give milliseconds since "
       "the Unix epoch (1767225600000 if it is seconds)"},
      {"\"delay\":\"8d\"", "more than timer.max.delay (7d) allows: publish "
                           "the event closer to its time"},
      {past, "ms in the past, "},
  };
  size_t published = 0;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char input[512], field[64];
    snprintf(field, sizeof(field), "%s%s", i == 2 ? "\"not_before\":" : "",
             bad[i].field);
    snprintf(input, sizeof(input),
             "{\"key\":\"first\",\"type\":\"t\",\"not_before\":%lld}\n"
             "{\"key\":\"bad\",\"type\":\"t\",%s}\n"
             "{\"key\":\"after\",\"type\":\"t\"}\n",
             (long long)(now - day), field);
    kl_run_t r;
    kl_run((const char *[]){"publish", "-b", bootstrap, "-t", "bounds", NULL},
           input, &r);
    if (r.rc != 2 || !strstr(r.err, bad[i].says) ||
        (i == 2 && !strstr(r.err, "line 2: not_before ")))
      fail_msg("case %zu: exit %d, stderr: %s", i, r.rc, r.err);
    /* stdout: the first line, delivered; nothing else */
    if (strncmp(r.out, "{\"key\":\"first\"", 14) != 0 ||
        strchr(r.out, '\n') != r.out + strlen(r.out) - 1)
      fail_msg("case %zu: stdout %s", i, r.out);
    published++;
    kl_run_free(&r);
  }
  kl_msg_t msgs[64];
  size_t n = kl_consume_all(bootstrap, "bounds", 2, msgs);
  assert_int_equal(n, published);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(msgs[i].key, "first");
    free(msgs[i].value);
  }
  kl_embedded_destroy(embedded);
}

/* @p len bytes of input, so that it may hold a NUL. */
static void kl_expect_bad_n(const char *bootstrap, const char *input,
                            size_t len, const char *problem) {
  kl_run_t r;
  kl_t_run((const char *[]){"publish", "-b", bootstrap, "-t", "bad", NULL},
           input, len, &r);
  assert_int_equal(r.rc, 2);
  if (!strstr(r.err, problem))
    fail_msg("expected \"%s\" in: %s", problem, r.err);
  kl_run_free(&r);
}

static void kl_expect_bad(const char *bootstrap, const char *input,
                          const char *problem) {
  kl_expect_bad_n(bootstrap, input, strlen(input), problem);
}

static void test_publish_bad_lines(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "bad", 2, &embedded), KL_OK);
  const char *bs = kl_embedded_bootstrap(embedded);
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\"}\nnot json\n",
                "line 2: invalid JSON");
  kl_expect_bad(bs, "{\"type\":\"t\"}\n", "line 1: \"key\" is missing");
  kl_expect_bad(bs, "[1]\n", "line 1: an event must be a JSON object");
  kl_expect_bad(bs,
                "{\"key\":\"a\",\"type\":\"t\",\"payload\":1,"
                "\"payload_b64\":\"AA==\"}\n",
                "both \"payload\" and \"payload_b64\"");
  kl_expect_bad(bs,
                "{\"key\":\"a\",\"type\":\"t\",\"not_before\":1,"
                "\"delay\":\"1m\"}\n",
                "line 1: both \"not_before\" and \"delay\" are given");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\",\"delay\":\"15\"}\n",
                "line 1: \"delay\" takes a duration with a unit");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"~timer\"}\n",
                "line 1: type \"~timer\" begins with '~'");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\",\"payload_b64\":\"A*==\"}\n",
                "invalid character at offset 1");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\",\"ts\":1}\n",
                "unknown field \"ts\"");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\",\"id\":\"\"}\n",
                "\"id\" is empty; omit it");
  kl_expect_bad(bs, "{\"key\":\"a\",\"type\":\"t\",\"headers\":{\"h\":1}}\n",
                "header \"h\" must be a string");
  kl_expect_bad(bs, "{\"key\":\"a\",\"key\":\"b\",\"type\":\"t\"}\n",
                "duplicate object key");
  kl_expect_bad(bs, "\n", "line 1: the line is empty");
  /* A NUL-leading line is not empty: it is not JSON. */
  static const char nul_line[] = "\0{\"key\":\"a\",\"type\":\"t\"}\n";
  kl_expect_bad_n(bs, nul_line, sizeof(nul_line) - 1, "line 1: invalid JSON");
  /* The gateway's rules: a NUL in the key, an id that is not UTF-8. */
  kl_expect_bad(bs, "{\"key\":\"a\\u0000b\",\"type\":\"t\"}\n",
                "\"key\" holds a NUL byte");
  kl_expect_bad(
      bs, "{\"key\":\"a\",\"type\":\"t\",\"headers\":{\"h\":\"\\u0000\"}}\n",
      "header \"h\" holds a NUL byte");

  char deep[400] = "{\"key\":\"a\",\"type\":\"t\",\"payload\":";
  size_t len = strlen(deep);
  for (int i = 0; i < 65; i++)
    deep[len++] = '[';
  for (int i = 0; i < 65; i++)
    deep[len++] = ']';
  strcpy(deep + len, "}\n");
  kl_expect_bad(bs, deep, "nests deeper than 64");

  size_t big = 2 * 1024 * 1024 + 10;
  char *huge = malloc(big + 2);
  memset(huge, ' ', big);
  strcpy(huge + big, "\n");
  kl_expect_bad(bs, huge, "line 1: the line is longer than 2097152 bytes");
  free(huge);

  char type[300] = "{\"key\":\"a\",\"type\":\"";
  memset(type + strlen(type), 't', 256);
  strcpy(type + 19 + 256, "\"}\n");
  kl_expect_bad(bs, type, "line 1:");
  kl_embedded_destroy(embedded);
}

static void test_publish_usage(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"publish", "-t", "x", NULL}, "", &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "-b BOOTSTRAP is required"));
  kl_run_free(&r);
  kl_run((const char *[]){"publish", "-b", "127.0.0.1:1", NULL}, "", &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "-t TOPIC is required"));
  kl_run_free(&r);
  kl_run(
      (const char *[]){"publish", "-b", "h:1", "-t", "x", "-X", "nope=1", NULL},
      "", &r);
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "nope"));
  kl_run_free(&r);
  /* A keylane key misspelled is named as given, exit 2 like other
   * configuration errors, with the key it is near. */
  static const char *const keys[][2] = {
      {"worker.bogus=1", "unknown configuration key \"worker.bogus\": "},
      {"worker.max.attempt=3", "unknown configuration key "
                               "\"worker.max.attempt\" (did you mean "
                               "worker.max.attempts?)"},
      {"store.map.sise=1G", "(did you mean store.map.size?)"},
      {"gateway.bogus=1", "unknown configuration key \"gateway.bogus\""},
  };
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    kl_run((const char *[]){"worker", "-b", "127.0.0.1:1", "-t", "x", "-g", "g",
                            "--store", "/nonexistent/kl", "--handler", "ledger",
                            "-X", keys[i][0], NULL},
           "", &r);
    if (r.rc != 2 || !strstr(r.err, keys[i][1]) || strstr(r.err, "kafka.w") ||
        strstr(r.err, "kafka.s") || strstr(r.err, "kafka.g"))
      fail_msg("-X %s: exit %d, stderr: %s", keys[i][0], r.rc, r.err);
    kl_run_free(&r);
  }
}

/* Kafka refuses the produce (the mock answers every Produce with a
 * permanent error): exit 1 with the reason, nothing on stdout. */
static void test_publish_delivery_failure(void **state) {
  (void)state;
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, 1);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "refused", 2, 1), 0);
  rd_kafka_resp_err_t errs[50];
  for (size_t i = 0; i < 50; i++)
    errs[i] = RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
  rd_kafka_mock_push_request_errors_array(mc, 0 /* Produce */, 50, errs);
  kl_run_t r;
  kl_run((const char *[]){"publish", "-b", rd_kafka_mock_cluster_bootstraps(mc),
                          "-t", "refused", NULL},
         "{\"key\":\"a\",\"type\":\"t\"}\n", &r);
  assert_int_equal(r.rc, 1);
  assert_string_equal(r.out, "");
  assert_non_null(strstr(r.err, "line 1 (key a): not delivered"));
  kl_run_free(&r);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(rk);
}

/* The mapping publish and the gateway rely on, beyond what a line can
 * carry: msgpack that JSON cannot say, and hostile lengths. */
static void test_msgpack_to_json_limits(void **state) {
  (void)state;
  json_t *v;
  /* a 5-byte array header claiming 2^32-1 elements: refused, no alloc */
  assert_int_equal(kl__msgpack_to_json("\xdd\xff\xff\xff\xff", 5, &v),
                   KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "truncated"));
  assert_int_equal(kl__msgpack_to_json("\x81\x01\x02", 3, &v), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "not a string"));
  /* a str key holding a NUL is a string: said so, the key shown escaped */
  assert_int_equal(kl__msgpack_to_json("\x81\xa2"
                                       "a\x00\x01",
                                       5, &v),
                   KL_EINVAL);
  assert_string_equal(kl_err_detail(), "msgpack at byte 1: the map key "
                                       "\"a\\x00\" holds a NUL byte");
  assert_int_equal(kl__msgpack_to_json("\xa2\xff\xfe", 3, &v), KL_EINVAL);
  assert_int_equal(kl__msgpack_to_json("\xc1", 1, &v), KL_EINVAL);
  assert_int_equal(kl__msgpack_to_json("\x01\x02", 2, &v), KL_EINVAL);
  assert_int_equal(
      kl__msgpack_to_json("\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9, &v),
      KL_EINVAL);
  assert_int_equal(kl__msgpack_to_json("\xd4\x01\x00", 3, &v), KL_EINVAL);
  unsigned char deep[70];
  memset(deep, 0x91, sizeof(deep) - 1);
  deep[sizeof(deep) - 1] = 0xc0;
  assert_int_equal(kl__msgpack_to_json(deep, sizeof(deep), &v), KL_EINVAL);
  assert_int_equal(kl__msgpack_to_json("\xc4\x02\x00\xff", 4, &v), KL_OK);
  assert_string_equal(json_string_value(json_object_get(v, "$base64")), "AP8=");
  json_decref(v);
  assert_int_equal(kl__msgpack_to_json("\xd0\x80", 2, &v), KL_OK);
  assert_int_equal(json_integer_value(v), -128);
  json_decref(v);
  /* JSON -> msgpack over the size limit */
  json_t *s = json_string("0123456789");
  void *out;
  size_t out_len;
  assert_int_equal(kl__json_to_msgpack(s, 8, &out, &out_len), KL_EINVAL);
  assert_int_equal(kl__json_to_msgpack(s, 11, &out, &out_len), KL_OK);
  assert_int_equal(out_len, 11);
  free(out);
  json_decref(s);
}

static void test_base64(void **state) {
  (void)state;
  const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char *coded[] = {
      "",         "Zg==",     "Zm8=",    "Zm9v",
      "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"}; /* RFC 4648 section 10 */
  for (size_t i = 0; i < 7; i++) {
    char text[16];
    kl__base64_encode(plain[i], strlen(plain[i]), text);
    assert_string_equal(text, coded[i]);
    void *out;
    size_t len;
    assert_int_equal(kl__base64_decode(coded[i], strlen(coded[i]), &out, &len),
                     KL_OK);
    assert_int_equal(len, strlen(plain[i]));
    assert_memory_equal(out, plain[i], len);
    free(out);
  }
  void *out;
  size_t len;
  assert_int_equal(kl__base64_decode("Zg=", 3, &out, &len), KL_EINVAL);
  assert_int_equal(kl__base64_decode("Z=g=", 4, &out, &len), KL_EINVAL);
  assert_int_equal(kl__base64_decode("Zg==Zg==", 8, &out, &len), KL_EINVAL);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_route_args),
      cmocka_unit_test(test_route_stdin),
      cmocka_unit_test(test_route_bad_key_names_line),
      cmocka_unit_test(test_help_everywhere),
      cmocka_unit_test(test_broker_embedded_sigterm),
      cmocka_unit_test(test_broker_embedded_sigint),
      cmocka_unit_test(test_broker_bad_flags),
      cmocka_unit_test(test_keylane_log_levels),
      cmocka_unit_test(test_worker_sigterm_during_startup),
      cmocka_unit_test(test_gateway_tokens_file_bounded),
      cmocka_unit_test(test_gateway_empty_allow_topics_refused),
      cmocka_unit_test(test_gateway_warns_off_loopback_without_tokens),
      cmocka_unit_test(test_publish_good_lines_then_bad),
      cmocka_unit_test(test_publish_not_before),
      cmocka_unit_test(test_publish_not_before_bounds),
      cmocka_unit_test(test_publish_bad_lines),
      cmocka_unit_test(test_publish_usage),
      cmocka_unit_test(test_publish_delivery_failure),
      cmocka_unit_test(test_msgpack_to_json_limits),
      cmocka_unit_test(test_base64),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
