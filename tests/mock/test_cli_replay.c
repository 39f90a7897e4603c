/*
 * keylane replay, store rebuild|stats|keys|get and inspect through the
 * real executable (KEYLANE_BIN), against an embedded cluster in this
 * process: --help for each, usage errors that name the fix, and the shape
 * of their JSON.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "support/history.h"
#include "support/spawn.h"
#include "support/support.h"
#include "worker/dlq.h"

typedef struct kl_run {
  int rc;
  char *out, *err;
} kl_run_t;

static int kl_tmpfd(void) {
  char path[] = "/tmp/keylane-cli-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  return fd;
}

static char *kl_slurp(int fd) {
  off_t size = lseek(fd, 0, SEEK_END);
  char *buf = malloc((size_t)size + 1);
  assert_int_equal(pread(fd, buf, (size_t)size, 0), (ssize_t)size);
  buf[size] = '\0';
  close(fd);
  return buf;
}

/* Runs keylane with @p args (NULL-terminated); stdout and stderr to files. */
static void kl_run(const char *const *args, kl_run_t *r) {
  const char *argv[40] = {kl_t_bin()};
  for (size_t i = 0; args[i]; i++)
    argv[i + 1] = args[i];
  int out = kl_tmpfd(), err = kl_tmpfd();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r->out = kl_slurp(out);
  r->err = kl_slurp(err);
}

static void kl_run_free(kl_run_t *r) {
  free(r->out);
  free(r->err);
}

static json_t *kl_json(const char *text) {
  json_error_t e;
  json_t *o = json_loads(text, 0, &e);
  if (!o)
    fail_msg("not JSON (%s): %s", e.text, text);
  return o;
}

/* Asserts that @p o has integer members @p names (NULL-terminated). */
static void kl_has_ints(const json_t *o, const char *const *names) {
  for (size_t i = 0; names[i]; i++)
    if (!json_is_integer(json_object_get(o, names[i])))
      fail_msg("\"%s\" is not an integer in %s", names[i],
               json_dumps(o, JSON_COMPACT));
}

static json_int_t kl_int(const json_t *o, const char *name) {
  return json_integer_value(json_object_get(o, name));
}

/* ---- help and usage ----------------------------------------------------- */

static void test_help(void **state) {
  static const char *const cmds[][3] = {
      {"replay", "--help", NULL},   {"store", "rebuild", "--help"},
      {"store", "stats", "--help"}, {"store", "keys", "--help"},
      {"store", "get", "--help"},   {"inspect", "--help", NULL}};
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
    kl_run_t r;
    kl_run((const char *[]){cmds[i][0], cmds[i][1], cmds[i][2], NULL}, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "usage: keylane "));
    assert_non_null(strstr(r.out, "example"));
    kl_run_free(&r);
  }
  kl_run_t r;
  kl_run((const char *[]){"--help", NULL}, &r);
  assert_non_null(strstr(r.out, "replay"));
  assert_non_null(strstr(r.out, "inspect"));
  kl_run_free(&r);
  kl_run((const char *[]){"store", "--help", NULL}, &r);
  assert_non_null(strstr(r.out, "rebuild"));
  assert_non_null(strstr(r.out, "migrate"));
  kl_run_free(&r);
}

static void kl_assert_usage(const char *const *args, const char *says) {
  kl_run_t r;
  kl_run(args, &r);
  if (r.rc != 2 || !strstr(r.err, says))
    fail_msg("rc %d, stderr: %s (expected 2 and \"%s\")", r.rc, r.err, says);
  kl_run_free(&r);
}

static void test_usage_errors_name_the_fix(void **state) {
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "-t", "e",
                                   "--from", "0", "--store", "/tmp/x",
                                   "--handler", "ledger", NULL},
                  "-p is required");
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "-t", "e",
                                   "-p", "all", "--from", "yesterday", NULL},
                  "@YYYY-MM-DDTHH:MM:SSZ");
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "-t", "e",
                                   "-p", "0", "--from", "0", "--reason",
                                   "decode", NULL},
                  "need --from-dlq");
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "--from-dlq",
                                   "e.dlq", "-p", "0", NULL},
                  "its own origin partition");
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "-t", "e",
                                   "-p", "0", "--from", "5", "--to", "2",
                                   "--store", "/tmp/x", "--handler", "ledger",
                                   NULL},
                  "--from 5 is after --to 2");
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "--from-dlq",
                                   "e.dlq", "--from", "@2024-05-02T00:00:00Z",
                                   "--to", "@2024-05-01T00:00:00Z", "--store",
                                   "/tmp/x", "--handler", "ledger", NULL},
                  "is after --to");
  kl_assert_usage((const char *[]){"store", "rebuild", "-b", "127.0.0.1:1",
                                   "-t", "e", "--handler", "ledger", NULL},
                  "--store NEW_STORE is required");
  kl_assert_usage((const char *[]){"inspect", "-t", "e", NULL},
                  "-b BOOTSTRAP is required");
  kl_assert_usage((const char *[]){"store", "get", "--store", "/tmp", NULL},
                  "KEY is required");
  kl_run_t r;
  kl_run((const char *[]){"store", "stats", "--store", "/nonexistent/kl", NULL},
         &r);
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "does not exist"));
  kl_run_free(&r);
}

/* --reason takes, and --help lists, every reason worker/dlq.c names:
 * read from its list here too, so a reason added there is checked. */
static void test_reason_is_one_of_the_dlq_reasons(void **state) {
  char all[256] = "";
  size_t n = 0;
  for (int i = 0; strcmp(kl__dlq_reason_name((kl__dlq_reason_t)i), "unknown");
       i++, n++) {
    const char *name = kl__dlq_reason_name((kl__dlq_reason_t)i);
    snprintf(all + strlen(all), sizeof(all) - strlen(all), "%s%s",
             i ? ", " : "", name);
    kl_run_t r;
    kl_run((const char *[]){"replay", "-b", "127.0.0.1:1", "-t", "e", "-p", "0",
                            "--from", "0", "--reason", name, NULL},
           &r);
    if (r.rc != 2 || !strstr(r.err, "need --from-dlq")) /* taken, then this */
      fail_msg("--reason %s: exit %d, stderr: %s", name, r.rc, r.err);
    kl_run_free(&r);
  }
  assert_true(n >= 5);
  char want[320];
  snprintf(want, sizeof(want), "--reason takes one of %s; got \"bogus\"", all);
  kl_assert_usage((const char *[]){"replay", "-b", "127.0.0.1:1", "--from-dlq",
                                   "e.dlq", "--reason", "bogus", "--store",
                                   "/tmp/x", "--handler", "ledger", NULL},
                  want);
  kl_run_t r;
  kl_run((const char *[]){"replay", "--help", NULL}, &r);
  assert_int_equal(r.rc, 0);
  /* the help wraps its lines: compare without the breaks */
  char *flat = r.out, *w = r.out;
  for (const char *c = r.out; *c; c++)
    if (*c == '\n' || (*c == ' ' && (w == flat || w[-1] == ' ')))
      continue;
    else
      *w++ = *c;
  *w = '\0';
  snprintf(want, sizeof(want), "only letters of reason R (%s)", all);
  if (!strstr(flat, want))
    fail_msg("--help lacks \"%s\": %s", want, flat);
  kl_run_free(&r);
}

/* Commands that read or change a store refuse a path holding none, and
 * create nothing there: no directory, no data.mdb. They open the store
 * before they talk to Kafka, so none is needed here. Only the commands
 * that start a store create one (worker, and store rebuild when it writes:
 * test_rebuild_replay_and_store_json). */
static void test_no_store_is_created_at_a_typo(void **state) {
  char dir[64], typo[96], empty[96];
  kl_t_tmpdir(dir);
  snprintf(typo, sizeof(typo), "%s/typo", dir);
  snprintf(empty, sizeof(empty), "%s/empty", dir);
  assert_int_equal(mkdir(empty, 0700), 0);
  const char *const at[] = {typo, empty};
  for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
    const char *const runs[][16] = {
        {"replay", "-b", "127.0.0.1:1", "-t", "e", "-p", "0", "--from", "0",
         "--store", at[i], "--handler", "ledger", "--dry-run", NULL},
        {"replay", "-b", "127.0.0.1:1", "-t", "e", "-p", "0", "--from", "0",
         "--store", at[i], "--handler", "ledger", NULL},
        {"replay", "-b", "127.0.0.1:1", "--from-dlq", "e.dlq", "--store", at[i],
         "--handler", "ledger", "--dry-run", NULL},
        {"store", "rebuild", "-b", "127.0.0.1:1", "-t", "e", "--store", at[i],
         "--handler", "ledger", "--dry-run", NULL},
        {"store", "reset", "-t", "e", "-p", "0", "--store", at[i], NULL},
        {"store", "migrate", "--store", at[i], NULL},
        {"store", "stats", "--store", at[i], NULL},
    };
    for (size_t j = 0; j < sizeof(runs) / sizeof(runs[0]); j++) {
      kl_run_t r;
      kl_run(runs[j], &r);
      char want[128];
      snprintf(want, sizeof(want), "no keylane store at %s (", at[i]);
      if (r.rc != 1 || !strstr(r.err, want) ||
          !strstr(r.err, "`keylane worker` creates one, or check the path"))
        fail_msg("keylane %s %s --store %s: exit %d, stderr: %s", runs[j][0],
                 runs[j][1], at[i], r.rc, r.err);
      kl_run_free(&r);
      if (i == 0 && access(typo, F_OK) == 0)
        fail_msg("keylane %s %s created %s", runs[j][0], runs[j][1], typo);
      char file[128];
      snprintf(file, sizeof(file), "%s/data.mdb", empty);
      if (i == 1 && access(file, F_OK) == 0)
        fail_msg("keylane %s %s created %s", runs[j][0], runs[j][1], file);
    }
  }
  kl_t_rmrf(dir);
}

/* ---- against a cluster -------------------------------------------------- */

typedef struct kl_fx {
  kl_embedded_t *cluster;
  const char *boot;
  kl__ledger_gen_t *gen;
  char dir[64], store[80];
} kl_fx_t;

/* Publishes @p n ledger events (every tenth re-publishing an older
 * one) to @p topic. */
static void kl_fx_publish(kl_fx_t *fx, const char *topic, int n) {
  kl_producer_t *producer = kl_t_producer(fx->boot, fx->gen);
  for (int i = 0; i < n; i++) {
    assert_int_equal(kl__ledger_gen_publish(fx->gen, producer, topic), KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(fx->gen, producer, topic),
                       KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
}

static void kl_fx_up(kl_fx_t *fx, const char *topic, int partitions, int n) {
  assert_int_equal(kl_embedded_new(1, topic, partitions, &fx->cluster), KL_OK);
  fx->boot = kl_embedded_bootstrap(fx->cluster);
  fx->gen = kl__ledger_gen_new(20, partitions, 11);
  kl_fx_publish(fx, topic, n);
  kl_t_tmpdir(fx->dir);
  snprintf(fx->store, sizeof(fx->store), "%s/store", fx->dir);
}

static void kl_fx_down(kl_fx_t *fx) {
  kl__ledger_gen_destroy(fx->gen);
  kl_embedded_destroy(fx->cluster);
  kl_t_rmrf(fx->dir);
}

static const char *const kl_totals[] = {
    "read", "applied", "skipped_applied", "skipped_duplicate", "failed", NULL};
static const char *const kl_part_ints[] = {"partition",
                                           "from",
                                           "to",
                                           "watermark_before",
                                           "watermark_after",
                                           "resume_offset",
                                           "epoch",
                                           "read",
                                           "applied",
                                           "skipped_applied",
                                           "skipped_duplicate",
                                           "failed",
                                           NULL};

static json_t *kl_rebuild_json(kl_fx_t *fx, const char *topic) {
  kl_run_t r;
  kl_run((const char *[]){"store", "rebuild", "-b", fx->boot, "-t", topic,
                          "--store", fx->store, "--handler", "ledger", "--json",
                          NULL},
         &r);
  if (r.rc != 0)
    fail_msg("rebuild exited %d: %s", r.rc, r.err);
  json_t *o = kl_json(r.out);
  assert_non_null(strstr(r.err, "store rebuild: finished")); /* progress */
  kl_run_free(&r);
  kl_has_ints(o, kl_totals);
  assert_true(json_is_array(json_object_get(o, "history_truncated")));
  assert_true(json_is_array(json_object_get(o, "partitions")));
  assert_string_equal(json_string_value(json_object_get(o, "status")), "done");
  assert_true(json_is_false(json_object_get(o, "dry_run")));
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(o, "partitions"), i, p) {
    kl_has_ints(p, kl_part_ints);
    assert_string_equal(json_string_value(json_object_get(p, "status")),
                        "done");
  }
  return o;
}

static void test_rebuild_replay_and_store_json(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "cli", 3, 300);
  uint64_t published = kl__ledger_gen_published(fx.gen);
  uint64_t republished = kl__ledger_gen_republished(fx.gen);

  json_t *o = kl_rebuild_json(&fx, "cli");
  assert_int_equal(kl_int(o, "read"), published + republished);
  /* A second rebuild into it is refused before any progress is told. */
  kl_run_t again;
  kl_run((const char *[]){"store", "rebuild", "-b", fx.boot, "-t", "cli",
                          "--store", fx.store, "--handler", "ledger", NULL},
         &again);
  if (again.rc != 1 ||
      !strstr(again.err, "the store already holds topic cli") ||
      strstr(again.err, "finished"))
    fail_msg("exit %d, stderr: %s", again.rc, again.err);
  kl_run_free(&again);
  assert_int_equal(kl_int(o, "applied"), published);
  assert_int_equal(kl_int(o, "skipped_duplicate"), republished);
  assert_int_equal(json_array_size(json_object_get(o, "history_truncated")), 0);
  assert_int_equal(json_array_size(json_object_get(o, "partitions")), 3);
  json_decref(o);

  /* A dry run over the applied log: nothing would apply; one object. */
  kl_run_t r;
  kl_run((const char *[]){"replay", "-b", fx.boot, "-t", "cli", "-p", "0,2",
                          "--from", "beginning", "--store", fx.store,
                          "--handler", "ledger", "--dry-run", "--json", NULL},
         &r);
  assert_int_equal(r.rc, 0);
  o = kl_json(r.out);
  kl_has_ints(o, kl_totals);
  assert_true(json_is_true(json_object_get(o, "dry_run")));
  assert_true(json_is_true(json_object_get(o, "exact")));
  assert_int_equal(kl_int(o, "applied"), 0);
  assert_int_equal(kl_int(o, "skipped_applied"), kl_int(o, "read"));
  assert_int_equal(json_array_size(json_object_get(o, "partitions")), 2);
  json_decref(o);
  kl_run_free(&r);

  /* stats: epochs and watermarks, key counts and ages, size. */
  kl_run(
      (const char *[]){"store", "stats", "--store", fx.store, "--json", NULL},
      &r);
  assert_int_equal(r.rc, 0);
  o = kl_json(r.out);
  assert_string_equal(json_string_value(json_object_get(o, "backend")), "lmdb");
  json_t *ids = json_object_get(o, "ids");
  kl_has_ints(ids, (const char *[]){"count", "applied", "dead_letters",
                                    "oldest_ms", "newest_ms", NULL});
  assert_int_equal(kl_int(ids, "count"), published);
  assert_true(kl_int(ids, "oldest_ms") <= kl_int(ids, "newest_ms"));
  kl_has_ints(json_object_get(o, "size"),
              (const char *[]){"disk_bytes", "used_bytes", "map_bytes", NULL});
  assert_int_equal(kl_int(o, "handler_keys"), 20);
  json_t *parts = json_object_get(o, "partitions");
  assert_int_equal(json_array_size(parts), 3);
  uint64_t applied = 0;
  size_t i;
  json_t *p;
  json_array_foreach(parts, i, p) {
    kl_has_ints(p, (const char *[]){"partition", "epoch", "watermark",
                                    "applied", "duplicates", NULL});
    assert_int_equal(kl_int(p, "epoch"), 1); /* the dry run took none */
    int32_t partition = (int32_t)kl_int(p, "partition");
    assert_int_equal(kl_int(p, "watermark"),
                     kl__ledger_gen_end(fx.gen, partition));
    applied += (uint64_t)kl_int(p, "applied");
  }
  assert_int_equal(applied, published);
  json_decref(o);
  kl_run_free(&r);
  kl_run((const char *[]){"store", "stats", "--store", fx.store, NULL}, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "idempotency keys: "));
  assert_non_null(strstr(r.out, "watermark"));
  kl_run_free(&r);

  /* keys, and one key's record. */
  kl_run((const char *[]){"store", "keys", "--store", fx.store, "--prefix",
                          "ledger:cli/acct-001", NULL},
         &r);
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.out, "ledger:cli/acct-0010\nledger:cli/acct-0011\n"
                             "ledger:cli/acct-0012\nledger:cli/acct-0013\n"
                             "ledger:cli/acct-0014\nledger:cli/acct-0015\n"
                             "ledger:cli/acct-0016\nledger:cli/acct-0017\n"
                             "ledger:cli/acct-0018\nledger:cli/acct-0019\n");
  kl_run_free(&r);
  kl_run((const char *[]){"store", "get", "ledger:cli/acct-0003", "--store",
                          fx.store, "--json", NULL},
         &r);
  assert_int_equal(r.rc, 0);
  o = kl_json(r.out);
  kl_has_ints(json_object_get(o, "ledger"),
              (const char *[]){"balance", "last_seq", "violations", NULL});
  assert_int_equal(kl_int(json_object_get(o, "ledger"), "violations"), 0);
  json_decref(o);
  kl_run_free(&r);
  kl_run((const char *[]){"store", "get", "ledger:cli/nobody", "--store",
                          fx.store, NULL},
         &r);
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.err, "keylane store keys"));
  kl_run_free(&r);
  kl_fx_down(&fx);
}

/* Runs inspect; @returns its JSON lines as an array. */
static json_t *kl_inspect(const char *const *args) {
  kl_run_t r;
  kl_run(args, &r);
  if (r.rc != 0)
    fail_msg("inspect exited %d: %s", r.rc, r.err);
  json_t *lines = json_array();
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n"))
    json_array_append_new(lines, kl_json(line));
  kl_run_free(&r);
  return lines;
}

static void test_inspect_prints_records(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "ins", 2, 60);
  uint64_t records =
      kl__ledger_gen_published(fx.gen) + kl__ledger_gen_republished(fx.gen);
  /* not a map */
  assert_int_equal(
      kl_t_produce_raw(fx.boot, "ins", 0, "acct-0001", "\x92\x01", 2, NULL), 0);
  kl_event_t ev = {.key = "acct-0002",
                   .key_len = 9,
                   .id = "order-7",
                   .id_len = 7,
                   .type = "debit",
                   .type_len = 5,
                   .ts = 1000,
                   .payload = "\x81\xa1x\x01",
                   .payload_len = 4};
  void *env;
  size_t env_len;
  assert_int_equal(kl_event_encode(&ev, &env, &env_len), KL_OK);
  static const char *const dlq[] = {"keylane.dlq.reason",
                                    "handler_fail",
                                    "keylane.dlq.error",
                                    "boom",
                                    "keylane.dlq.attempts",
                                    "5",
                                    "keylane.dlq.topic",
                                    "ins",
                                    "keylane.dlq.partition",
                                    "1",
                                    "keylane.dlq.offset",
                                    "7",
                                    NULL};
  assert_int_equal(
      kl_t_produce_raw(fx.boot, "ins.dlq", 0, "acct-0002", env, env_len, dlq),
      0);
  free(env);

  json_t *all =
      kl_inspect((const char *[]){"inspect", "-b", fx.boot, "-t", "ins", NULL});
  assert_int_equal(json_array_size(all), records + 1);
  size_t i, bad = 0;
  json_t *line;
  json_array_foreach(all, i, line) {
    kl_has_ints(line, (const char *[]){"partition", "offset", NULL});
    if (json_object_get(line, "error")) {
      bad++;
      assert_true(json_is_string(json_object_get(line, "value_b64")));
      assert_true(json_is_string(json_object_get(line, "key_b64")));
      continue;
    }
    kl_has_ints(line, (const char *[]){"ts", NULL});
    assert_true(json_is_string(json_object_get(line, "key")));
    assert_true(json_is_string(json_object_get(line, "id")));
    assert_true(json_is_string(json_object_get(line, "type")));
    kl_has_ints(json_object_get(line, "payload"),
                (const char *[]){"amount", "seq", NULL});
    assert_true(json_is_object(json_object_get(line, "headers")));
  }
  assert_int_equal(bad, 1);
  json_decref(all);

  json_t *some = kl_inspect((const char *[]){
      "inspect", "-b", fx.boot, "-t", "ins", "--key", "acct-0003", NULL});
  assert_true(json_array_size(some) > 0);
  json_array_foreach(some, i, line) assert_string_equal(
      json_string_value(json_object_get(line, "key")), "acct-0003");
  json_decref(some);
  some =
      kl_inspect((const char *[]){"inspect", "-b", fx.boot, "-t", "ins", "-p",
                                  "1", "--from", "2", "--count", "3", NULL});
  assert_int_equal(json_array_size(some), 3);
  json_array_foreach(some, i, line) {
    assert_int_equal(kl_int(line, "partition"), 1);
    assert_int_equal(kl_int(line, "offset"), 2 + (json_int_t)i);
  }
  json_decref(some);
  some = kl_inspect((const char *[]){"inspect", "-b", fx.boot, "-t", "ins",
                                     "--from", "end", NULL});
  assert_int_equal(json_array_size(some), 0);
  json_decref(some);

  /* A dead letter: the envelope, and the worker's headers read back. */
  some = kl_inspect(
      (const char *[]){"inspect", "-b", fx.boot, "-t", "ins.dlq", NULL});
  assert_int_equal(json_array_size(some), 1);
  line = json_array_get(some, 0);
  assert_string_equal(json_string_value(json_object_get(line, "id")),
                      "order-7");
  assert_int_equal(kl_int(json_object_get(line, "payload"), "x"), 1);
  json_t *dl = json_object_get(line, "dead_letter");
  assert_string_equal(json_string_value(json_object_get(dl, "reason")),
                      "handler_fail");
  assert_string_equal(json_string_value(json_object_get(dl, "error")), "boom");
  assert_string_equal(json_string_value(json_object_get(dl, "origin_topic")),
                      "ins");
  kl_has_ints(dl, (const char *[]){"attempts", "origin_partition",
                                   "origin_offset", NULL});
  assert_int_equal(kl_int(dl, "origin_offset"), 7);
  json_decref(some);
  kl_fx_down(&fx);
}

/* store get prints numbers as numbers: "recorded_ms (null)" and
 * "value_len (null)" were integers handed to %s; the JSON form agrees. */
static void test_store_get_prints_numbers(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "getnum", 1, 10);
  json_decref(kl_rebuild_json(&fx, "getnum"));
  json_t *lines = kl_inspect((const char *[]){"inspect", "-b", fx.boot, "-t",
                                              "getnum", "--count", "1", NULL});
  assert_int_equal(json_array_size(lines), 1);
  char id[128];
  snprintf(id, sizeof(id), "%s",
           json_string_value(json_object_get(json_array_get(lines, 0), "id")));
  json_decref(lines);

  kl_run_t r;
  kl_run((const char *[]){"store", "get", "--id", id, "--store", fx.store,
                          "--json", NULL},
         &r);
  assert_int_equal(r.rc, 0);
  json_t *o = kl_json(r.out);
  kl_run_free(&r);
  assert_string_equal(json_string_value(json_object_get(o, "id")), id);
  assert_string_equal(json_string_value(json_object_get(o, "mark")), "applied");
  json_int_t recorded = kl_int(o, "recorded_ms");
  assert_true(recorded > 1600000000000LL); /* a time, in ms */
  json_decref(o);

  kl_run(
      (const char *[]){"store", "get", "--id", id, "--store", fx.store, NULL},
      &r);
  assert_int_equal(r.rc, 0);
  char want[64];
  snprintf(want, sizeof(want), "recorded_ms  %lld\n", (long long)recorded);
  if (strstr(r.out, "(null)") || !strstr(r.out, want))
    fail_msg("no \"%s\" in:\n%s", want, r.out);
  kl_run_free(&r);

  kl_run((const char *[]){"store", "keys", "--store", fx.store, "--limit", "1",
                          NULL},
         &r);
  assert_int_equal(r.rc, 0);
  char key[128];
  snprintf(key, sizeof(key), "%.*s", (int)strcspn(r.out, "\n"), r.out);
  kl_run_free(&r);
  kl_run((const char *[]){"store", "get", key, "--store", fx.store, NULL}, &r);
  if (r.rc != 0)
    fail_msg("store get %s: exit %d, stderr: %s", key, r.rc, r.err);
  if (strstr(r.out, "(null)") || !strstr(r.out, "value_len    "))
    fail_msg("store get KEY printed:\n%s", r.out);
  kl_run_free(&r);
  kl_fx_down(&fx);
}

static void test_rebuild_reports_truncated_history(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "trunc", 1, 0);
  int64_t low = kl_t_publish_truncated(fx.boot, "trunc", "acct-1", 60);
  assert_true(low > 0);
  setenv("KEYLANE_PROGRESS_INTERVAL_MS", "1", 1);
  kl_run_t r;
  kl_run((const char *[]){"store", "rebuild", "-b", fx.boot, "-t", "trunc",
                          "--store", fx.store, "--handler", "ledger",
                          "--batch-max", "5", "--json", NULL},
         &r);
  unsetenv("KEYLANE_PROGRESS_INTERVAL_MS");
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.err, "WARNING: history truncated"));
  assert_non_null(strstr(r.err, "partitions done")); /* plain progress */
  json_t *o = kl_json(r.out);
  json_t *t = json_object_get(o, "history_truncated");
  assert_int_equal(json_array_size(t), 1);
  assert_int_equal(kl_int(json_array_get(t, 0), "partition"), 0);
  assert_int_equal(kl_int(json_array_get(t, 0), "earliest_offset"), low);
  assert_int_equal(kl_int(o, "applied"), 60 - low);
  json_decref(o);
  kl_run_free(&r);
  kl_fx_down(&fx);
}

/* A dead-letter topic that does not exist is a usage error that names the
 * ones there are, and asking does not create it (the embedded cluster
 * creates a topic that a metadata request names). */
static void test_redrive_of_a_missing_topic_is_refused(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "gone", 1, 10);
  json_decref(kl_rebuild_json(&fx, "gone"));
  assert_int_equal(kl_embedded_topic_create(fx.cluster, "gone.dlq", 1), KL_OK);
  for (int i = 0; i < 2; i++) { /* the second finds it still missing */
    kl_run_t r;
    kl_run((const char *[]){"replay", "-b", fx.boot, "--from-dlq", "nosuch.dlq",
                            "--store", fx.store, "--handler", "ledger", NULL},
           &r);
    if (r.rc != 2 ||
        !strstr(r.err, "dead-letter topic nosuch.dlq does not exist; the "
                       "cluster's dead-letter topics are: gone.dlq"))
      fail_msg("run %d: exit %d, stdout: %s stderr: %s", i, r.rc, r.out, r.err);
    kl_run_free(&r);
  }
  kl_run_t r;
  kl_run((const char *[]){"replay", "-b", fx.boot, "--from-dlq", "gone.dlq",
                          "--store", fx.store, "--handler", "ledger", NULL},
         &r);
  if (r.rc != 0 || !strstr(r.out, "letters: 0 applied"))
    fail_msg("exit %d, stderr: %s", r.rc, r.err);
  kl_run_free(&r);
  kl_fx_down(&fx);
}

/* Two live workers with one --instance-id on the embedded cluster, which
 * keeps no static members: the second is not refused there (Kafka fences
 * the older one: tests/kafka/test_static_membership.c). What holds: each
 * says so at start, both run as members of the group, and every event is
 * applied once. */
static void test_one_instance_id_twice_on_embedded(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "twice", 4, 200);
  assert_int_equal(kl_embedded_topic_create(fx.cluster, "twice.dlq", 1), KL_OK);
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        fx.boot,
                        "-t",
                        "twice",
                        "-g",
                        "twice",
                        "--store",
                        fx.store,
                        "--handler",
                        "ledger",
                        "--instance-id",
                        "w-1",
                        "-X",
                        "kafka.fetch.wait.max.ms=10",
                        NULL};
  pid_t pids[2];
  char line[1024];
  for (int i = 0; i < 2; i++) {
    pids[i] = kl_t_spawn_worker(fx.dir, i, argv);
    int said = 0;
    for (int t = 0; t < 1000 && !said; t++) {
      said = kl_t_log_find(fx.dir, i, "keeps no static members", line,
                           sizeof(line));
      if (!said)
        kl_t_sleep_ms(10);
    }
    if (!said)
      fail_msg("worker %d did not say the cluster keeps no static members", i);
    assert_non_null(strstr(line, "worker.instance.id=w-1: "));
  }
  kl_store_t *store;
  assert_int_equal(kl_store_open(fx.store, NULL, &store), KL_OK);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, store, "twice", 0, 60000), 0);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(fx.gen, store, "twice", &v), KL_OK);
  if (!v.ok)
    fail_msg("ledger: %" PRIu64 " keys bad, %" PRIu64 " violations", v.keys_bad,
             v.violations);
  kl_store_destroy(store);
  for (int i = 0; i < 2; i++) {
    int status;
    assert_int_equal(waitpid(pids[i], &status, WNOHANG), 0); /* running */
    assert_int_equal(kill(pids[i], SIGTERM), 0);
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail_msg("worker %d: status %d", i, status);
  }
  kl_fx_down(&fx);
}

/* --dry-run never runs an exec: handler, which may act outside the store:
 * here its one effect is a file it writes when it starts. The report says
 * what the replay would apply and skip, and that the handler did not run. */
static void test_dry_run_never_runs_an_exec_handler(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "dryexec", 2, 100);
  json_decref(kl_rebuild_json(&fx, "dryexec"));
  uint64_t published = kl__ledger_gen_published(fx.gen);
  uint64_t republished = kl__ledger_gen_republished(fx.gen);
  kl_fx_publish(&fx, "dryexec", 50);

  char marker[128], handler[512];
  snprintf(marker, sizeof(marker), "%s/handler-ran", fx.dir);
  snprintf(handler, sizeof(handler),
           "exec:touch '%s'; while read -r line; do "
           "echo '{\"status\":\"ok\"}'; done",
           marker);
  kl_run_t r;
  kl_run((const char *[]){"replay", "-b", fx.boot, "-t", "dryexec", "-p", "all",
                          "--from", "beginning", "--store", fx.store,
                          "--handler", handler, "--dry-run", "--json",
                          "--no-progress", NULL},
         &r);
  if (r.rc != 0)
    fail_msg("dry run exited %d: %s", r.rc, r.err);
  assert_int_equal(access(marker, F_OK), -1); /* never started */
  json_t *o = kl_json(r.out);
  assert_true(json_is_true(json_object_get(o, "dry_run")));
  assert_true(json_is_false(json_object_get(o, "handler_run")));
  assert_int_equal(kl_int(o, "read"), kl__ledger_gen_published(fx.gen) +
                                          kl__ledger_gen_republished(fx.gen));
  assert_int_equal(kl_int(o, "applied"),
                   kl__ledger_gen_published(fx.gen) - published);
  assert_int_equal(kl_int(o, "skipped_duplicate"),
                   kl__ledger_gen_republished(fx.gen) - republished);
  assert_int_equal(kl_int(o, "skipped_applied"), published + republished);
  assert_int_equal(kl_int(o, "failed"), 0);
  assert_non_null(strstr(r.err, "was not run"));
  json_decref(o);
  kl_run_free(&r);

  /* The built-in ledger, whose effects are all in the store, does run. */
  kl_run((const char *[]){"replay", "-b", fx.boot, "-t", "dryexec", "-p", "all",
                          "--from", "watermark", "--store", fx.store,
                          "--handler", "ledger", "--dry-run", "--json",
                          "--no-progress", NULL},
         &r);
  assert_int_equal(r.rc, 0);
  o = kl_json(r.out);
  assert_true(json_is_true(json_object_get(o, "handler_run")));
  assert_null(strstr(r.err, "was not run"));
  json_decref(o);
  kl_run_free(&r);
  kl_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_usage_errors_name_the_fix),
      cmocka_unit_test(test_reason_is_one_of_the_dlq_reasons),
      cmocka_unit_test(test_no_store_is_created_at_a_typo),
      cmocka_unit_test(test_rebuild_replay_and_store_json),
      cmocka_unit_test(test_inspect_prints_records),
      cmocka_unit_test(test_store_get_prints_numbers),
      cmocka_unit_test(test_rebuild_reports_truncated_history),
      cmocka_unit_test(test_dry_run_never_runs_an_exec_handler),
      cmocka_unit_test(test_redrive_of_a_missing_topic_is_refused),
      cmocka_unit_test(test_one_instance_id_twice_on_embedded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
