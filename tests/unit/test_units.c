/*
 * The one parser of numbers, durations and sizes (common/units.h), the conf
 * keys that use it, and flags of the executable that used to have their own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "common/units.h"
#include "support/run.h"

static int64_t kl_ok(const char *text, kl__units_kind_t kind) {
  int64_t v = -1;
  kl_err_t err = kl__units_parse("--flag", text, kind, 0, INT64_MAX, &v);
  if (err)
    fail_msg("\"%s\" refused: %s", text, kl_err_detail());
  return v;
}

static void kl_refused(const char *text, kl__units_kind_t kind) {
  int64_t v = 7;
  if (kl__units_parse("--flag", text, kind, 0, INT64_MAX, &v) != KL_EINVAL)
    fail_msg("\"%s\" accepted as %lld", text, (long long)v);
  assert_int_equal(v, 7); /* untouched */
  assert_non_null(strstr(kl_err_detail(), "--flag"));
}

static void test_counts(void **state) {
  (void)state;
  assert_int_equal(kl_ok("0", KL__UNITS_COUNT), 0);
  assert_int_equal(kl_ok("0012", KL__UNITS_COUNT), 12);
  assert_int_equal(kl_ok("9223372036854775807", KL__UNITS_COUNT), INT64_MAX);
  const char *bad[] = {"",
                       "1e3",
                       " 5",
                       "5 ",
                       "+5",
                       "-5",
                       "0x10",
                       "1.",
                       "1.5",
                       "5k",
                       "12a",
                       "1 000",
                       "\t1",
                       "9223372036854775808",
                       "99999999999999999999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    kl_refused(bad[i], KL__UNITS_COUNT);
}

/* A flag named -ms reads a bare number as ms and honours a unit: "30s" is
 * 30 s, never 30 ms. */
static void test_ms_durations(void **state) {
  (void)state;
  assert_int_equal(kl_ok("30", KL__UNITS_MS), 30);
  assert_int_equal(kl_ok("30ms", KL__UNITS_MS), 30);
  assert_int_equal(kl_ok("30s", KL__UNITS_MS), 30000);
  assert_int_equal(kl_ok("2m", KL__UNITS_MS), 120000);
  assert_int_equal(kl_ok("1h", KL__UNITS_MS), 3600000);
  assert_int_equal(kl_ok("7d", KL__UNITS_MS), 7 * 86400000LL);
  const char *bad[] = {"1e3", "30 s", "30S", "30sec", "1.5s",
                       "s",   "30s ", "-1",  "30ss",  "106751991167301d"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    kl_refused(bad[i], KL__UNITS_MS);
}

/* A duration whose name gives no unit needs one: "30" could be either. */
static void test_durations_need_a_unit(void **state) {
  (void)state;
  assert_int_equal(kl_ok("0", KL__UNITS_DURATION), 0);
  assert_int_equal(kl_ok("500ms", KL__UNITS_DURATION), 500);
  assert_int_equal(kl_ok("30s", KL__UNITS_DURATION), 30000);
  kl_refused("30", KL__UNITS_DURATION);
  assert_non_null(strstr(kl_err_detail(), "with a unit"));
  kl_refused("1e3s", KL__UNITS_DURATION);
}

static void test_sizes(void **state) {
  (void)state;
  assert_int_equal(kl_ok("4096", KL__UNITS_SIZE), 4096);
  assert_int_equal(kl_ok("16K", KL__UNITS_SIZE), 16384);
  assert_int_equal(kl_ok("64KiB", KL__UNITS_SIZE), 65536);
  assert_int_equal(kl_ok("1M", KL__UNITS_SIZE), 1 << 20);
  assert_int_equal(kl_ok("1MiB", KL__UNITS_SIZE), 1 << 20);
  assert_int_equal(kl_ok("4G", KL__UNITS_SIZE), 4LL << 30);
  assert_int_equal(kl_ok("2TiB", KL__UNITS_SIZE), 2LL << 40);
  const char *bad[] = {"1e3", "16k", "16KB", "16 K",     "1.5M",
                       "M",   "1MM", "16Ki", "8388608T", "-1K"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    kl_refused(bad[i], KL__UNITS_SIZE);
}

/* The message names the flag, the value, the forms and the range. */
static void test_message(void **state) {
  (void)state;
  int64_t v;
  assert_int_equal(kl__units_parse("--handler-timeout-ms", "1e3", KL__UNITS_MS,
                                   1, 86400000, &v),
                   KL_EINVAL);
  const char *d = kl_err_detail();
  assert_non_null(strstr(d, "--handler-timeout-ms"));
  assert_non_null(strstr(d, "\"1e3\""));
  assert_non_null(strstr(d, "30s"));
  assert_non_null(strstr(d, "from 1ms to 1d"));
  assert_int_equal(
      kl__units_parse("--max-body", "0", KL__UNITS_SIZE, 1, 1 << 30, &v),
      KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "from 1 to 1G"));
  /* What was typed is shown escaped: a newline cannot start a line. */
  assert_int_equal(kl__units_parse("--limit", "5\n2026-01-01 ERROR x",
                                   KL__UNITS_COUNT, 1, 10, &v),
                   KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "got \"5\\x0a2026-01-01 ERROR x\""));
  assert_null(strchr(kl_err_detail(), '\n'));
  /* Every example lies in the range: timer.max.delay (at least 1s) was
   * offered "such as 500ms", which it refuses. */
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "timer.max.delay", "500ms"), KL_ECONF);
  kl_conf_destroy(conf);
  assert_non_null(strstr(kl_err_detail(), "such as 1s, 30s, 2m, 1h, 1d, at "
                                          "least 1s; got \"500ms\""));
  assert_int_equal(
      kl__units_parse("--grace", "5", KL__UNITS_DURATION, 60000, 300000, &v),
      KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "such as 2m, from 1m to 5m"));
  assert_int_equal(kl__units_parse("--tick", "5", KL__UNITS_MS, 2000, 9000, &v),
                   KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "such as 2s, from 2s to 9s"));
  char buf[32];
  assert_string_equal(kl__units_format(KL__UNITS_MS, 90000, buf, sizeof(buf)),
                      "90s");
  assert_string_equal(kl__units_format(KL__UNITS_SIZE, 1536, buf, sizeof(buf)),
                      "1536");
}

static void test_digits(void **state) {
  (void)state;
  int64_t v = 0;
  assert_int_equal(kl__units_digits("123x", 3, &v), 0);
  assert_int_equal(v, 123);
  assert_int_equal(kl__units_digits("123x", 4, &v), -1);
  assert_int_equal(kl__units_digits("-1", 2, &v), -1);
  assert_int_equal(kl__units_digits("", 0, &v), -1);
  assert_int_equal(kl__units_digits(NULL, 0, &v), -1);
  assert_int_equal(v, 123);
}

/* Conf keys go through the same parser: a .ms key takes units, a number
 * key refuses "1e3" and spaces, a duration key needs its unit. */
static void test_conf_keys(void **state) {
  (void)state;
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "worker.session.timeout.ms", "10s"),
                   KL_OK);
  assert_int_equal(kl__conf_int(conf, "worker.session.timeout.ms"), 10000);
  assert_int_equal(kl_conf_set(conf, "worker.retry.max.ms", "2500"), KL_OK);
  assert_int_equal(kl__conf_int(conf, "worker.retry.max.ms"), 2500);
  assert_int_equal(kl_conf_set(conf, "store.map.size", "512MiB"), KL_OK);
  assert_int_equal(kl__conf_int(conf, "store.map.size"), 512LL << 20);
  const char *bad[][2] = {{"worker.batch.max", "1e3"},
                          {"worker.batch.max", " 10"},
                          {"worker.batch.max", "10 "},
                          {"worker.batch.max", "0"},
                          {"worker.session.timeout.ms", "1e3"},
                          {"store.dedup.retention", "3600"},
                          {"store.map.size", "1e9"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (kl_conf_set(conf, bad[i][0], bad[i][1]) != KL_ECONF)
      fail_msg("%s=%s accepted", bad[i][0], bad[i][1]);
    assert_non_null(strstr(kl_err_detail(), bad[i][0]));
    assert_non_null(strstr(kl_err_detail(), bad[i][1]));
  }
  kl_conf_destroy(conf);
}

/* One *.ms key takes a bare number of milliseconds, 500ms and 1s; junk and
 * out-of-range values are refused naming the key, the value and the forms
 * accepted. */
static void kl_ms_key(kl_conf_t *conf, const char *key) {
  static const struct {
    const char *text;
    int64_t ms;
  } ok[] = {{"1000", 1000}, {"500ms", 500}, {"1s", 1000}};
  static const char *const bad[] = {"10x", "1e3", "-1s", "100000h"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    if (kl_conf_set(conf, key, ok[i].text) != KL_OK)
      fail_msg("%s=%s refused: %s", key, ok[i].text, kl_err_detail());
    assert_int_equal(kl__conf_int(conf, key), ok[i].ms);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (kl_conf_set(conf, key, bad[i]) != KL_ECONF)
      fail_msg("%s=%s accepted", key, bad[i]);
    const char *err = kl_err_detail();
    /* the forms; the examples are the key's range's (test_message) */
    if (!strstr(err, key) || !strstr(err, bad[i]) ||
        !strstr(err, "a bare number is milliseconds, or a unit ms, s, m, h "
                     "or d), such as "))
      fail_msg("%s=%s: \"%s\" names not the key, the value and the forms", key,
               bad[i], err);
  }
}

/* Every key whose name ends in ".ms" takes what the configuration
 * reference promises: a bare number of milliseconds, or 500ms, 10s, 2m, 1h.
 * Two of them (*.partitions.check.ms) took digits only. The keys: the conf
 * table's, and any docs/configuration.md lists (a key documented there
 * later is checked too). */
static void test_every_ms_key_takes_units(void **state) {
  (void)state;
  static const char *const table[] = {
      "producer.enqueue.timeout.ms", "producer.partitions.check.ms",
      "worker.session.timeout.ms",   "worker.fenced.retake.ms",
      "worker.batch.wait.ms",        "worker.partitions.check.ms",
      "worker.handler.timeout.ms",   "worker.stall.ms",
      "worker.retry.initial.ms",     "worker.retry.max.ms"};
  kl_conf_t *conf = kl_conf_new();
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    kl_ms_key(conf, table[i]);
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char path[4096], line[4096], key[128];
  snprintf(path, sizeof(path), "%s/docs/configuration.md", src ? src : ".");
  FILE *f = fopen(path, "r");
  if (!f)
    fail_msg("cannot read %s (KEYLANE_SOURCE_DIR)", path);
  size_t documented = 0;
  while (fgets(line, sizeof(line), f)) {
    /* "| `name.ms` | type | default | range | meaning |" */
    size_t len;
    if (sscanf(line, "| `%127[a-z0-9.]` |", key) != 1 ||
        (len = strlen(key)) < 4 || strcmp(key + len - 3, ".ms") != 0 ||
        !kl_conf_get(conf, key))
      continue;
    kl_ms_key(conf, key);
    documented++;
  }
  fclose(f);
  kl_conf_destroy(conf);
  assert_true(documented >= 5); /* the reference was found and read */
  /* The two that took digits only, through -X as a user types them: read,
   * so the run goes on to open the store, which does not exist. */
  const char *const runs[][14] = {
      {"worker", "-b", "127.0.0.1:1", "-t", "t", "--store", "/nonexistent/s",
       "--handler", "ledger", "-X", "worker.partitions.check.ms=10s",
       "--kafka-wait", "0", NULL},
      {"worker", "-b", "127.0.0.1:1", "-t", "t", "--store", "/nonexistent/s",
       "--handler", "ledger", "-X", "producer.partitions.check.ms=2m",
       "--kafka-wait", "0", NULL},
  };
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for(runs[i], NULL, 0, 10000, &r);
    if (r.rc != 1 || !strstr(r.err, "cannot open the store"))
      fail_msg("%s: exit %d, stderr: %s", runs[i][10], r.rc, r.err);
    kl_t_run_free(&r);
  }
}

/* Flags of the executable: "1e3", signs, spaces and trailing characters
 * are a usage error (exit 2) that names the flag, before anything starts
 * (a run that starts instead is killed after 10 s). */
static void test_cli_flags(void **state) {
  (void)state;
  const char *const runs[][12] = {
      {"worker", "-b", "127.0.0.1:1", "-t", "t", "--store", "/nonexistent/s",
       "--handler", "ledger", "--handler-timeout-ms", "1e3", NULL},
      {"worker", "-b", "127.0.0.1:1", "-t", "t", "--store", "/nonexistent/s",
       "--handler", "ledger", "--session-timeout-ms", "10x", NULL},
      {"demo", "--events", "1e3", NULL},
      {"route", "--partitions", " 12", "k", NULL},
      {"broker", "--embedded", "--partitions", "+8", NULL},
      {"broker", "--listen", "127.0.0.1:0", "--embedded", "--idle-timeout",
       "30", NULL},
      {"broker", "--listen", "127.0.0.1:0", "--embedded", "--max-body", "1e3",
       NULL},
  };
  /* A -ms flag takes a unit: 30s is read (30 s), so the run goes on to
   * open the store, which does not exist. */
  kl_t_run_t ok;
  kl_t_run_for((const char *[]){"worker", "-b", "127.0.0.1:1", "-t", "t",
                                "--store", "/nonexistent/s", "--handler",
                                "ledger", "--handler-timeout-ms", "30s",
                                "--kafka-wait", "0", NULL},
               NULL, 0, 10000, &ok);
  if (ok.rc != 1 || !strstr(ok.err, "cannot open the store"))
    fail_msg("--handler-timeout-ms 30s: exit %d, stderr: %s", ok.rc, ok.err);
  kl_t_run_free(&ok);
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for(runs[i], NULL, 0, 10000, &r); /* today: at once */
    const char *flag = NULL;
    for (size_t j = 0; runs[i][j]; j++)
      if (runs[i][j][0] == '-' && runs[i][j][1] == '-')
        flag = runs[i][j];
    if (r.rc != 2 || !strstr(r.err, flag))
      fail_msg("keylane %s ... %s: exit %d, stderr: %s", runs[i][0], flag, r.rc,
               r.err);
    kl_t_run_free(&r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counts),
      cmocka_unit_test(test_ms_durations),
      cmocka_unit_test(test_durations_need_a_unit),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_message),
      cmocka_unit_test(test_digits),
      cmocka_unit_test(test_conf_keys),
      cmocka_unit_test(test_every_ms_key_takes_units),
      cmocka_unit_test(test_cli_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
