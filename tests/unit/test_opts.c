/*
 * The command line's option parser (cli/opts.h): every kind of option, the
 * ranges, conf keys, unknown options, missing values, required options,
 * the generated --help; and, through the executable, --help and -X/--set
 * on every subcommand, and the gateway's limits set as conf keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker/gateway.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "common/conf.h"
#include "common/internal.h"
#include "support/run.h"
#include "support/support.h"

typedef struct pair {
  int64_t a, b;
} pair_t;

typedef struct args {
  int flag;
  const char *string, *list, *mode;
  int64_t count, ms, duration, size, dflt;
  pair_t pair;
} args_t;

/* "A:B", for the .parse kind. */
static kl_err_t parse_pair(const kl__opt_t *opt, const char *text,
                           void *field) {
  pair_t *p = field;
  long long a, b;
  char end;
  if (sscanf(text, "%lld:%lld%c", &a, &b, &end) != 2)
    return kl__err(KL_EINVAL, "--%s \"%s\": expected A:B", opt->name, text);
  p->a = a;
  p->b = b;
  return KL_OK;
}

static const kl__opt_t test_opts[] = {
    {.name = "flag",
     .letter = 'f',
     .kind = KL__OPT_FLAG,
     .off = offsetof(args_t, flag),
     .help = "a flag"},
    {.name = "string",
     .letter = 's',
     .kind = KL__OPT_STRING,
     .meta = "TEXT",
     .off = offsetof(args_t, string),
     .required = "say what it is",
     .help = "some text"},
    {.name = "list",
     .kind = KL__OPT_LIST,
     .off = offsetof(args_t, list),
     .help = "a,b,c"},
    {.name = "mode",
     .kind = KL__OPT_ENUM,
     .values = "fast|safe",
     .def = "safe",
     .off = offsetof(args_t, mode),
     .help = "how"},
    {.name = "count",
     .letter = 'n',
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 100,
     .off = offsetof(args_t, count),
     .help = "how many"},
    {.name = "wait-ms",
     .kind = KL__OPT_MS,
     .min = 0,
     .max = 60000,
     .off = offsetof(args_t, ms),
     .help = "how long"},
    {.name = "timeout",
     .kind = KL__OPT_DURATION,
     .min = 1,
     .max = 3600000,
     .off = offsetof(args_t, duration),
     .help = "how long at most"},
    {.name = "size",
     .kind = KL__OPT_SIZE,
     .min = 1,
     .max = INT64_MAX,
     .off = offsetof(args_t, size),
     .help = "how big"},
    {.name = "default",
     .kind = KL__OPT_COUNT,
     .min = 0,
     .max = 1000,
     .def = "42",
     .off = offsetof(args_t, dflt),
     .help = "has a default"},
    {.name = "pair",
     .meta = "A:B",
     .parse = parse_pair,
     .off = offsetof(args_t, pair),
     .help = "two numbers"},
    {.name = "batch", .key = "worker.batch.max"},
    {.name = "partitions",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 10,
     .key = "worker.expect.partitions",
     .help = "narrower than its key"},
    {.name = "durability", .key = "store.durability"},
    {.name = "internal",
     .kind = KL__OPT_FLAG,
     .key = "gateway.allow.internal.topics",
     .help = "sets its key to true"},
    {.kind = KL__OPT_TEXT, .help = "Section:\n"},
    {.name = "later",
     .kind = KL__OPT_FLAG,
     .off = offsetof(args_t, flag),
     .help = "in the section"},
    {0}};

static const kl__cmd_t test_cmd = {.name = "test",
                                   .args = "[ARG...]",
                                   .about = "What it does.\n",
                                   .opts = test_opts,
                                   .notes = "A note.\n",
                                   .examples = "  keylane test -s x\n",
                                   .conf = true};

/* One parse of @p argv (NULL-terminated, without argv[0]); its message in
 * *err (the caller frees it). */
static int kl_parse(const char *const *argv, args_t *a, kl_conf_t *conf,
                    char **err, char ***rest, int *nrest) {
  static char *v[32];
  int argc = 0;
  v[argc++] = "test";
  while (*argv)
    v[argc++] = (char *)*argv++;
  memset(a, 0, sizeof(*a));
  kl_t_stderr_t log;
  kl_t_stderr_begin(&log);
  int first = -7;
  int rc = kl__opts_parse(&test_cmd, argc, v, a, conf, &first);
  *err = kl_t_stderr_end(&log);
  if (rest) {
    *rest = v + first;
    *nrest = argc - first;
  }
  return rc;
}

/* A usage error whose message holds each of @p says (NULL-terminated). */
static void kl_refused(const char *const *argv, const char *const *says) {
  args_t a;
  char *err;
  kl_conf_t *conf = kl_conf_new();
  int rc = kl_parse(argv, &a, conf, &err, NULL, NULL);
  if (rc != KL_EXIT_USAGE)
    fail_msg("%s ...: rc %d, stderr: %s", argv[0], rc, err);
  for (; *says; says++)
    if (!strstr(err, *says))
      fail_msg("%s ...: \"%s\" is not in: %s", argv[0], *says, err);
  assert_non_null(strstr(err, "try 'keylane test --help'"));
  free(err);
  kl_conf_destroy(conf);
}

static void test_every_kind(void **state) {
  (void)state;
  args_t a;
  char *err, **rest;
  int nrest;
  kl_conf_t *conf = kl_conf_new();
  int rc =
      kl_parse((const char *[]){"one",          "-f",           "--string",
                                "text",         "--list=a,b",   "--mode",
                                "fast",         "-n7",          "--wait-ms",
                                "2s",           "--timeout",    "90s",
                                "--size",       "16K",          "--pair",
                                "3:1042",       "two",          "--batch",
                                "50",           "--partitions", "4",
                                "--durability", "meta",         "--internal",
                                "--",           "--three",      NULL},
               &a, conf, &err, &rest, &nrest);
  if (rc != -1)
    fail_msg("rc %d: %s", rc, err);
  assert_int_equal(a.flag, 1);
  assert_string_equal(a.string, "text");
  assert_string_equal(a.list, "a,b");
  assert_string_equal(a.mode, "fast");
  assert_int_equal(a.count, 7);
  assert_int_equal(a.ms, 2000);
  assert_int_equal(a.duration, 90000);
  assert_int_equal(a.size, 16384);
  assert_int_equal(a.dflt, 42); /* its .def */
  assert_int_equal(a.pair.a, 3);
  assert_int_equal(a.pair.b, 1042);
  assert_string_equal(kl_conf_get(conf, "worker.batch.max"), "50");
  assert_string_equal(kl_conf_get(conf, "worker.expect.partitions"), "4");
  assert_string_equal(kl_conf_get(conf, "store.durability"), "meta");
  assert_string_equal(kl_conf_get(conf, "gateway.allow.internal.topics"),
                      "true");
  /* The arguments, in order, after the options: "--" ended the options. */
  assert_int_equal(nrest, 3);
  assert_string_equal(rest[0], "one");
  assert_string_equal(rest[1], "two");
  assert_string_equal(rest[2], "--three");
  free(err);
  kl_conf_destroy(conf);
}

/* -fn5 is -f -n 5; --str is --string; -sVALUE; the last one given wins. */
static void test_forms(void **state) {
  (void)state;
  args_t a;
  char *err;
  kl_conf_t *conf = kl_conf_new();
  int rc = kl_parse((const char *[]){"-fn5", "--str", "x", "-sy", "--mode=fast",
                                     "--mode", "safe", "--key", "-v", NULL},
                    &a, conf, &err, NULL, NULL);
  /* "--key" is not an option of this table: refused, after the others. */
  assert_int_equal(rc, KL_EXIT_USAGE);
  assert_non_null(strstr(err, "unknown option \"--key\""));
  free(err);
  rc = kl_parse((const char *[]){"-fn5", "--str", "x", "-sy", "--mode=fast",
                                 "--mode", "safe", "--pair", "-1:-2", NULL},
                &a, conf, &err, NULL, NULL);
  assert_int_equal(rc, -1);
  assert_int_equal(a.flag, 1);
  assert_int_equal(a.count, 5);
  assert_string_equal(a.string, "y");
  assert_string_equal(a.mode, "safe");
  assert_int_equal(a.pair.a, -1); /* a value may begin with '-' */
  free(err);
  kl_conf_destroy(conf);
}

static void test_ranges(void **state) {
  (void)state;
  kl_refused((const char *[]){"-s", "x", "--count", "0", NULL},
             (const char *[]){"--count takes a whole number", "from 1 to 100",
                              "got \"0\"", NULL});
  kl_refused((const char *[]){"-s", "x", "-n", "1e2", NULL},
             (const char *[]){"--count", "\"1e2\"", NULL});
  kl_refused((const char *[]){"-s", "x", "--wait-ms", "2m", NULL},
             (const char *[]){"--wait-ms", "from 0 to 1m", "\"2m\"", NULL});
  kl_refused((const char *[]){"-s", "x", "--timeout", "30", NULL},
             (const char *[]){"--timeout takes a duration with a unit",
                              "\"30\"", NULL});
  kl_refused((const char *[]){"-s", "x", "--size", "16X", NULL},
             (const char *[]){"--size takes a size", "\"16X\"", NULL});
  kl_refused(
      (const char *[]){"-s", "x", "--mode", "slow", NULL},
      (const char *[]){"--mode takes one of fast|safe; got \"slow\"", NULL});
  /* A flag's own range, narrower than its key's (0..100000). */
  kl_refused((const char *[]){"-s", "x", "--partitions", "11", NULL},
             (const char *[]){"--partitions", "from 1 to 10", NULL});
  /* A key's range and values, named by the flag. */
  kl_refused((const char *[]){"-s", "x", "--batch", "0", NULL},
             (const char *[]){"--batch takes a whole number",
                              "from 1 to 100000", NULL});
  kl_refused(
      (const char *[]){"-s", "x", "--durability", "most", NULL},
      (const char *[]){"--durability takes one of full|meta|none", NULL});
  kl_refused((const char *[]){"-s", "x", "--pair", "3", NULL},
             (const char *[]){"--pair \"3\": expected A:B", NULL});
}

static void test_unknown_missing_required(void **state) {
  (void)state;
  kl_refused((const char *[]){"-s", "x", "--bogus", NULL},
             (const char *[]){"unknown option \"--bogus\"", NULL});
  kl_refused((const char *[]){"-s", "x", "-Z", NULL},
             (const char *[]){"unknown option \"-Z\"", NULL});
  /* --t is --timeout; --s is --string or --size. */
  kl_refused(
      (const char *[]){"-s", "x", "--s", "1", NULL},
      (const char *[]){"\"--s\" is ambiguous", "--string", "--size", NULL});
  kl_refused((const char *[]){"-s", "x", "--count", NULL},
             (const char *[]){"--count needs a value: N, from 1 to 100", NULL});
  kl_refused((const char *[]){"-s", "x", "--mode", NULL},
             (const char *[]){"--mode needs a value: one of fast|safe", NULL});
  kl_refused((const char *[]){"-s", NULL},
             (const char *[]){"--string needs a value", NULL});
  kl_refused((const char *[]){"-f", NULL},
             (const char *[]){"-s TEXT is required: say what it is", NULL});
  kl_refused((const char *[]){"-s", "", NULL},
             (const char *[]){"-s TEXT is required", NULL});
  kl_refused((const char *[]){"-s", "x", "--flag=1", NULL},
             (const char *[]){"--flag takes no value", NULL});
}

/* -X and --set: a key, a kafka.* key, or a librdkafka property alone. */
static void test_set(void **state) {
  (void)state;
  args_t a;
  char *err;
  kl_conf_t *conf = kl_conf_new();
  int rc =
      kl_parse((const char *[]){"-s", "x", "-X", "worker.batch.max=9", "--set",
                                "linger.ms=5", "--set=kafka.acks=1",
                                "-Xworker.group=g", NULL},
               &a, conf, &err, NULL, NULL);
  assert_int_equal(rc, -1);
  assert_string_equal(kl_conf_get(conf, "worker.batch.max"), "9");
  assert_string_equal(kl_conf_get(conf, "kafka.linger.ms"), "5");
  assert_string_equal(kl_conf_get(conf, "kafka.acks"), "1");
  assert_string_equal(kl_conf_get(conf, "worker.group"), "g");
  free(err);
  kl_conf_destroy(conf);
  kl_refused((const char *[]){"-s", "x", "-X", "worker.batch.max=0", NULL},
             (const char *[]){"worker.batch.max", "\"0\"", NULL});
  kl_refused((const char *[]){"-s", "x", "--set", "novalue", NULL},
             (const char *[]){"-X takes name=value", NULL});
  /* keylane's prefixes are keylane's: not passed to librdkafka */
  kl_refused((const char *[]){"-s", "x", "-X", "worker.batch.mx=9", NULL},
             (const char *[]){"unknown configuration key \"worker.batch.mx\"",
                              "did you mean worker.batch.max?", NULL});
  kl_refused((const char *[]){"-s", "x", "-X", "producer.nothing=1", NULL},
             (const char *[]){"\"producer.nothing\"", NULL});
  assert_true(kl__conf_keylane_prefix("store.x"));
  assert_false(kl__conf_keylane_prefix("socket.timeout.ms"));
  assert_false(kl__conf_keylane_prefix("worker"));
  assert_null(kl__conf_key_nearest("worker.bogus"));
}

static char *kl_help(const kl__cmd_t *cmd) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kl__opts_help(cmd, f);
  fclose(f);
  return text;
}

/* The help comes from the table: the usage line from the required options,
 * every option with its value's name, default and key, the implicit -X and
 * -h before the first section, the units of the kinds used, the notes and
 * the examples. */
static void test_help_generated(void **state) {
  (void)state;
  char *help = kl_help(&test_cmd);
  static const char *const has[] = {
      "usage: keylane test -s TEXT [options] [ARG...]\n",
      "\nWhat it does.\n",
      "\noptions:\n",
      "  -f, --flag ",
      "  -s, --string TEXT ",
      "      --list LIST ",
      "      --mode MODE ",
      "(default: safe)",
      "  -n, --count N ",
      "      --wait-ms MS ",
      "      --timeout DUR ",
      "      --size SIZE ",
      "(default: 42)",
      "      --pair A:B ",
      "      --batch N ",
      "events per store commit at most",
      "worker.batch.max)",
      "  -X, --set NAME=VALUE ",
      "  -h, --help ",
      "\nSection:\n      --later ",
      "MS is milliseconds",
      "DUR is a duration with a unit",
      "SIZE is bytes",
      "\nA note.\n",
      "\nexamples:\n  keylane test -s x\n",
  };
  for (size_t i = 0; i < sizeof(has) / sizeof(has[0]); i++)
    if (!strstr(help, has[i]))
      fail_msg("the help lacks \"%s\":\n%s", has[i], help);
  assert_true(strstr(help, "-h, --help") < strstr(help, "Section:"));
  for (const char *l = help; *l; l = strchr(l, '\n') + 1) /* 79 columns */
    if (strcspn(l, "\n") > KL__OPTS_WIDTH)
      fail_msg("a line is wider than %d: %.*s", KL__OPTS_WIDTH,
               (int)strcspn(l, "\n"), l);
  free(help);
}

/* ---- the executable ----------------------------------------------------- */

/* Every subcommand's --help is generated: exit 0, the usage line, the
 * options (-X/--set where it takes a conf), examples. */
static void test_every_subcommand_help(void **state) {
  (void)state;
  static const struct {
    const char *args[4];
    int conf;
  } subs[] = {
      {{"route"}, 0},          {{"publish"}, 1},
      {{"broker"}, 0},         {{"broker", "--listen", "127.0.0.1:0"}, 1},
      {{"worker"}, 1},         {{"ledger"}, 0},
      {{"demo"}, 0},           {{"replay"}, 1},
      {{"inspect"}, 1},        {{"doctor"}, 1},
      {{"config"}, 1},         {{"store", "migrate"}, 0},
      {{"store", "stats"}, 0}, {{"store", "keys"}, 0},
      {{"store", "get"}, 0},   {{"store", "rebuild"}, 1},
      {{"store", "reset"}, 1}, {{"store", "outbox"}, 0},
      {{"store", "bind"}, 1},
  };
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    const char *argv[6] = {NULL};
    size_t n = 0;
    while (n < 4 && subs[i].args[n])
      argv[n] = subs[i].args[n], n++;
    argv[n] = "--help";
    char usage[64];
    snprintf(usage, sizeof(usage), "usage: keylane %s%s%s ", argv[0],
             strcmp(argv[0], "store") ? "" : " ",
             strcmp(argv[0], "store") ? "" : argv[1]);
    kl_t_run_t r;
    kl_t_run(argv, NULL, 0, &r);
    if (r.rc != 0 || strncmp(r.out, usage, strlen(usage)) != 0 ||
        !strstr(r.out, "\noptions:\n") || !strstr(r.out, "  -h, --help ") ||
        !strstr(r.out, "\nexamples:\n  ") ||
        !strstr(r.out, "      --config FILE ") ||
        !strstr(r.out, "  -X, --set NAME=VALUE ") != !subs[i].conf)
      fail_msg("keylane %s %s --help: exit %d:\n%s%s", argv[0],
               n > 1 ? argv[1] : "", r.rc, r.out, r.err);
    kl_t_run_free(&r);
  }
}

/* -X and --set on every subcommand that takes a conf: a key's value out of
 * range is refused there, naming the key, before anything starts. */
static void test_every_subcommand_takes_x(void **state) {
  (void)state;
  static const char *const subs[][3] = {
      {"publish"},         {"broker", "--listen", "127.0.0.1:0"},
      {"worker"},          {"replay"},
      {"inspect"},         {"doctor"},
      {"store", "rebuild"}};
  static const char *const forms[][2] = {{"-X", "store.map.size=1"},
                                         {"--set", "store.map.size=1"},
                                         {"--set=store.map.size=1", NULL}};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
      const char *argv[8] = {NULL};
      size_t n = 0;
      while (n < 3 && subs[i][n])
        argv[n] = subs[i][n], n++;
      argv[n++] = forms[f][0];
      argv[n++] = forms[f][1];
      kl_t_run_t r;
      kl_t_run_for(argv, NULL, 0, 10000, &r);
      if (r.rc != 2 || !strstr(r.err, "store.map.size takes a size") ||
          !strstr(r.err, "got \"1\""))
        fail_msg("keylane %s %s %s: exit %d, stderr: %s", argv[0], forms[f][0],
                 forms[f][1] ? forms[f][1] : "", r.rc, r.err);
      kl_t_run_free(&r);
    }
}

/* The gateway's limits are conf keys: their defaults are the gateway's,
 * -X sets them, and the flags set the same keys. */
static void test_gateway_limits_are_conf_keys(void **state) {
  (void)state;
  kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  assert_string_equal(o.listen, "127.0.0.1:8080");
  assert_null(o.tokens_file);
  assert_int_equal(o.max_connections, 1024);
  assert_int_equal(o.max_header, 16 * 1024);
  assert_int_equal(o.max_body, 1024 * 1024);
  assert_int_equal(o.max_inflight, 10000);
  assert_int_equal(o.max_inflight_bytes, 64 * 1024 * 1024);
  assert_int_equal(o.max_pipeline, 32);
  assert_int_equal(o.max_output, 1024 * 1024);
  assert_int_equal(o.idle_timeout_ms, 30000);
  assert_int_equal(o.request_timeout_ms, 30000);
  assert_int_equal(o.produce_timeout_ms, 10000);
  assert_int_equal(o.retry_after_s, 1);
  assert_int_equal(o.drain_timeout_ms, 10000);
  assert_int_equal(o.max_topics, 1024);
  assert_int_equal(o.topic_idle_ms, 60000);
  assert_null(o.allow_origins);
  assert_false(o.allow_internal_topics);
  kl_conf_t *conf = kl_conf_new();
  static const char *const set[][2] = {
      {"gateway.listen", "0.0.0.0:9000"},
      {"gateway.tokens.file", "/etc/t"},
      {"gateway.max.connections", "7"},
      {"gateway.max.body", "2M"},
      {"gateway.max.inflight.bytes", "1G"},
      {"gateway.idle.timeout", "5s"},
      {"gateway.retry.after", "1500ms"},
      {"gateway.allow.topics", "orders-*"},
      {"gateway.allow.origins", "https://a.example"},
      {"gateway.allow.internal.topics", "true"}};
  for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++)
    if (kl_conf_set(conf, set[i][0], set[i][1]))
      fail_msg("%s=%s: %s", set[i][0], set[i][1], kl_err_detail());
  kl__gateway_opts_from_conf(&o, conf);
  assert_string_equal(o.listen, "0.0.0.0:9000");
  assert_string_equal(o.tokens_file, "/etc/t");
  assert_int_equal(o.max_connections, 7);
  assert_int_equal(o.max_body, 2 << 20);
  assert_int_equal(o.max_inflight_bytes, 1 << 30);
  assert_int_equal(o.idle_timeout_ms, 5000);
  assert_int_equal(o.retry_after_s, 2); /* whole seconds, rounded up */
  assert_string_equal(o.allow_topics, "orders-*");
  assert_string_equal(o.allow_origins, "https://a.example");
  assert_true(o.allow_internal_topics);
  kl_conf_destroy(conf);
  /* Through the executable: the gateway sees -X's value and the flag's,
   * and refuses them together before it connects to anything. */
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"broker", "--listen", "127.0.0.1:0", "-b",
                                "127.0.0.1:1", "-X",
                                "gateway.max.inflight.bytes=1K", "--max-body",
                                "2K", NULL},
               NULL, 0, 10000, &r);
  if (r.rc != 2 || !strstr(r.err, "(1024) is below --max-body (2048)"))
    fail_msg("exit %d, stderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_t_run_for((const char *[]){"broker", "--listen", "127.0.0.1:0", "-b",
                                "127.0.0.1:1", "--max-body", "1e3", NULL},
               NULL, 0, 10000, &r);
  if (r.rc != 2 || !strstr(r.err, "--max-body takes a size"))
    fail_msg("exit %d, stderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_kind),
      cmocka_unit_test(test_forms),
      cmocka_unit_test(test_ranges),
      cmocka_unit_test(test_unknown_missing_required),
      cmocka_unit_test(test_set),
      cmocka_unit_test(test_help_generated),
      cmocka_unit_test(test_every_subcommand_help),
      cmocka_unit_test(test_every_subcommand_takes_x),
      cmocka_unit_test(test_gateway_limits_are_conf_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
