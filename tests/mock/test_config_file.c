/*
 * Settings from a file (--config, KEYLANE_CONFIG): values from the
 * environment (${NAME}) and from files (@/path), -X over the file, errors
 * that name the line, and secrets that appear in no output: a worker run
 * from a file alone on the embedded cluster applies its events, and the
 * secret it was given is in none of its output, its /proc/PID/cmdline or
 * what `keylane config` prints.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/cluster.h"
#include "support/run.h"
#include "support/spawn.h"
#include "support/support.h"

#define SECRET "kl-t-Secr3t-b4c9"

static void write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* The row of @p key in `keylane config --json`'s settings, or NULL. */
static json_t *setting(json_t *o, const char *key) {
  size_t i;
  json_t *row;
  json_array_foreach(json_object_get(o, "settings"), i, row) {
    if (strcmp(json_string_value(json_object_get(row, "key")), key) == 0)
      return row;
  }
  return NULL;
}

static void assert_setting(json_t *o, const char *key, const char *value,
                           const char *source) {
  json_t *row = setting(o, key);
  if (!row)
    fail_msg("no setting %s", key);
  assert_string_equal(json_string_value(json_object_get(row, "value")), value);
  const char *src = json_string_value(json_object_get(row, "source"));
  if (!strstr(src, source))
    fail_msg("%s came from \"%s\", not \"%s\"", key, src, source);
}

static void test_effective_configuration(void **state) {
  (void)state;
  char dir[64], conf[128], pw[128], text[1024];
  kl_t_tmpdir(dir);
  snprintf(conf, sizeof(conf), "%s/keylane.conf", dir);
  snprintf(pw, sizeof(pw), "%s/pg-password", dir);
  write_file(pw, SECRET "\n", 0600);
  snprintf(text, sizeof(text),
           "# a worker's settings\n"
           "\n"
           "kafka.bootstrap.servers = 127.0.0.1:9\n"
           "sasl.username = keylane\n"
           "kafka.sasl.password = ${KL_T_KAFKA_PASSWORD}\n"
           "kafka.ssl.key.password = @%s\n"
           "  worker.concurrency=4  \n"
           "worker.max.attempts = 7\n"
           "store.uri = postgresql://app:" SECRET "@db.internal/keylane\n",
           pw);
  write_file(conf, text, 0600);
  setenv("KL_T_KAFKA_PASSWORD", SECRET, 1);
  kl_t_run_t r;
  kl_t_run((const char *[]){"config", "--config", conf, "-X",
                            "worker.max.attempts=3", "--json", NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_null(strstr(r.out, SECRET));
  assert_null(strstr(r.err, SECRET));
  json_t *o = kl_t_run_json(&r);
  assert_setting(o, "kafka.bootstrap.servers", "127.0.0.1:9", "keylane.conf:3");
  assert_setting(o, "kafka.sasl.username", "keylane", "keylane.conf:4");
  assert_setting(o, "kafka.sasl.password", "(secret)",
                 "keylane.conf:5 (${KL_T_KAFKA_PASSWORD})");
  assert_setting(o, "kafka.ssl.key.password", "(secret)", "pg-password");
  assert_setting(o, "worker.concurrency", "4", "keylane.conf:7");
  assert_setting(o, "worker.max.attempts", "3", "-X"); /* -X over the file */
  assert_setting(o, "worker.batch.max", "1000", "default");
  assert_setting(o, "store.uri", "postgresql://app:****@db.internal/keylane",
                 "keylane.conf:9");
  json_decref(o);
  kl_t_run_free(&r);

  /* KEYLANE_CONFIG names the file when no --config does; text output */
  setenv("KEYLANE_CONFIG", conf, 1);
  kl_t_run((const char *[]){"config", "--store", "./elsewhere", NULL}, NULL, 0,
           &r);
  unsetenv("KEYLANE_CONFIG");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "worker.concurrency = 4  # "));
  assert_non_null(strstr(r.out, "store.uri = ./elsewhere  # --store"));
  assert_null(strstr(r.out, SECRET));
  kl_t_run_free(&r);
  unsetenv("KL_T_KAFKA_PASSWORD");
  kl_t_rmrf(dir);
}

/* What a file may not hold: each refused with exit 2 and its line. */
static void test_refusals(void **state) {
  (void)state;
  char dir[64], conf[128];
  kl_t_tmpdir(dir);
  snprintf(conf, sizeof(conf), "%s/bad.conf", dir);
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"worker.concurrency = 4\nkafka.sasl.password = ${KL_T_UNSET_VAR}\n",
       "bad.conf:2: kafka.sasl.password = ${KL_T_UNSET_VAR}: the environment "
       "has no such variable"},
      {"kafka.sasl.password = @/nonexistent/kl-secret\n",
       "bad.conf:1: kafka.sasl.password: cannot read its file"},
      {"worker.concurency = 4\n", "bad.conf:1: unknown configuration key"},
      {"worker.concurrency = many\n", "bad.conf:1: "},
      {"sasl.password " SECRET "\n",
       "bad.conf:1: no '=' on the line: write key = value"},
      /* a value is ${NAME} whole, or taken as it is: never half of each */
      {"store.uri = postgresql://u:${KL_T_PW}@db/kl\n",
       "bad.conf:1: store.uri: ${NAME} stands for a whole value only"},
      {";x = y\n", "bad.conf:1: the key holds a character no key has"},
      {"kafka.sasl.password = @/tmp\n",
       "bad.conf:1: kafka.sasl.password: /tmp: it is not a regular file"},
      {"kafka.sasl.password = @\n",
       "bad.conf:1: kafka.sasl.password: '@' names no file"},
  };
  unsetenv("KL_T_UNSET_VAR");
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    write_file(conf, bad[i].text, 0600);
    kl_t_run_t r;
    kl_t_run((const char *[]){"config", "--config", conf, NULL}, NULL, 0, &r);
    if (r.rc != 2)
      fail_msg("case %zu exits %d: %s", i, r.rc, r.err);
    if (!strstr(r.err, bad[i].says))
      fail_msg("case %zu says \"%s\", not \"%s\"", i, r.err, bad[i].says);
    assert_null(strstr(r.err, SECRET));
    kl_t_run_free(&r);
  }
  kl_t_run_t r;
  kl_t_run((const char *[]){"config", "--config", "/nonexistent/kl.conf", NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--config /nonexistent/kl.conf: cannot read"));
  kl_t_run_free(&r);

  /* a file any user may write decides what keylane reads and where it
   * sends it: refused, the config file and a secret file alike */
  char secret_file[128];
  snprintf(secret_file, sizeof(secret_file), "%s/pw", dir);
  write_file(secret_file, SECRET "\n", 0606);
  char text[256];
  snprintf(text, sizeof(text), "kafka.sasl.password = @%s\n", secret_file);
  write_file(conf, text, 0600);
  kl_t_run((const char *[]){"config", "--config", conf, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "any user may write it (mode 0606)"));
  kl_t_run_free(&r);
  write_file(conf, "worker.concurrency = 2\n", 0666);
  kl_t_run((const char *[]){"config", "--config", conf, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "any user may write it (mode 0666)"));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"config", "--config", dir, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "it is not a regular file"));
  kl_t_run_free(&r);
  /* a UTF-8 byte order mark before the first key is no part of it */
  write_file(conf, "\xef\xbb\xbfworker.concurrency = 3\n", 0600);
  kl_t_run((const char *[]){"config", "--config", conf, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "worker.concurrency = 3  # "));
  kl_t_run_free(&r);

  /* a secret librdkafka refuses is named, its value never shown; and a
   * store URI's sslpassword (the client key's passphrase) is a password */
  write_file(conf,
             "kafka.bootstrap.servers = 127.0.0.1:9\n"
             "kafka.sasl.oauthbearer.client.secret = " SECRET "\n",
             0600);
  const char *ev = "{\"key\":\"a\",\"type\":\"t\"}\n";
  kl_t_run((const char *[]){"publish", "--config", conf, "-t", "events", NULL},
           ev, strlen(ev), &r);
  assert_int_not_equal(r.rc, 0);
  assert_non_null(strstr(r.err, "kafka.sasl.oauthbearer.client.secret"));
  assert_null(strstr(r.err, SECRET));
  assert_null(strstr(r.out, SECRET));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"config", "--store",
                            "postgresql://u@db/kl?sslpassword=" SECRET, NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_null(strstr(r.out, SECRET));
  /* a password on the command line: a warning naming where it goes */
  assert_non_null(strstr(r.err, "--store holds a password"));
  assert_non_null(strstr(r.err, "PGPASSFILE"));
  assert_null(strstr(r.err, SECRET));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"config", "--store", "./elsewhere", NULL}, NULL, 0,
           &r); /* none: no warning */
  assert_int_equal(r.rc, 0);
  assert_null(strstr(r.err, "holds a password"));
  kl_t_run_free(&r);

  /* a secret written in a file others may read: a warning naming the fix */
  write_file(conf, "kafka.sasl.password = " SECRET "\n", 0644);
  kl_t_run((const char *[]){"config", "--config", conf, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.err, "holds a secret and others may read it"));
  assert_non_null(strstr(r.err, "chmod 600"));
  assert_null(strstr(r.err, SECRET));
  assert_null(strstr(r.out, SECRET));
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* A worker from a file alone: bootstrap, store, group and a secret. */
static void test_worker_from_file(void **state) {
  (void)state;
  char dir[64], conf[128], store[128], text[1024];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "cfg", 2, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster);
  snprintf(conf, sizeof(conf), "%s/worker.conf", dir);
  snprintf(store, sizeof(store), "%s/store", dir);
  snprintf(text, sizeof(text),
           "kafka.bootstrap.servers = %s\n"
           "worker.group = %s\n"
           "store.uri = %s\n"
           "kafka.sasl.password = ${KL_T_KAFKA_PASSWORD}\n",
           kl_t_bootstrap(cluster), kl_t_group(cluster, "cfg"), store);
  write_file(conf, text, 0600);
  setenv("KL_T_KAFKA_PASSWORD", SECRET, 1);
  const char *ev = "{\"key\":\"acct-1\",\"type\":\"credit\",\"id\":\"c1\","
                   "\"payload\":{\"amount\":5,\"seq\":1}}\n";
  kl_t_run_t r;
  kl_t_run((const char *[]){"publish", "--config", conf, "-t", topic, NULL}, ev,
           strlen(ev), &r);
  assert_int_equal(r.rc, 0);
  kl_t_run_free(&r);
  const char *argv[] = {kl_t_bin(), "worker",    "--config", conf, "-t",
                        topic,      "--handler", "ledger",   NULL};
  pid_t pid = kl_t_spawn_worker(dir, 0, argv);
  char cmdline_path[64];
  snprintf(cmdline_path, sizeof(cmdline_path), "/proc/%d/cmdline", (int)pid);
  int applied = kl_t_run_until(
      (const char *[]){"ledger", "--config", conf, "--json", NULL},
      "\"acct-1\":{\"balance\":5", 30000);
  unsetenv("KL_T_KAFKA_PASSWORD");
  FILE *f = fopen(cmdline_path, "r");
  assert_non_null(f);
  char cmdline[4096];
  size_t n = fread(cmdline, 1, sizeof(cmdline) - 1, f);
  fclose(f);
  for (size_t i = 0; i < n; i++)
    cmdline[i] = cmdline[i] ? cmdline[i] : ' ';
  cmdline[n] = '\0';
  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  char log[128];
  snprintf(log, sizeof(log), "%s/worker-0.log", dir);
  char *out = slurp(log);
  if (!applied)
    fail_msg("the worker did not apply the event: %s", out);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_null(strstr(out, SECRET));
  assert_null(strstr(cmdline, SECRET));
  free(out);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_effective_configuration),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_worker_from_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
