/*
 * `keylane store timers` on an LMDB store holding timers of two
 * partitions: listed per partition in due order with key, id, due time
 * and the scheduling offset, as text (keys escaped) and as JSON parsed
 * here; --limit bounds the rows and counts the rest; -t, --partition and
 * --key narrow it, and a --partition the store does not hold is an
 * error; keys with control or direction characters are escaped;
 * `keylane store stats` counts them per partition.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "keylane/event.h"
#include "keylane/store.h"
#include "support/run.h"
#include "support/support.h"
#include "common/internal.h"
#include "store/timers.h"

#define MIN_MS 60000LL

static int64_t t_now;

/* Schedules event @p id of @p key in @p partition of "events", due at
 * @p due, as the record at @p offset would be. */
static void t_timer(kl_store_t *store, int32_t partition, const char *key,
                    const char *id, int64_t due, int64_t offset) {
  kl_partition_state_t st;
  kl_txn_t *txn;
  assert_int_equal(kl_store_acquire(store, "events", partition, &st), KL_OK);
  assert_int_equal(kl_store_begin(store, "events", partition, st.epoch, &txn),
                   KL_OK);
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = "credit",
                   .type_len = 6,
                   .not_before = due};
  void *env;
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &env, &len), KL_OK);
  kl__timer_t t = {due, offset, 0};
  assert_int_equal(kl__timer_put(txn, "events", partition, key, strlen(key), id,
                                 strlen(id), &t, env, len),
                   KL_OK);
  free(env);
  assert_int_equal(kl_store_commit(txn, offset + 1), KL_OK);
}

/* A new store in a new directory @p dir; t_now read. */
static kl_store_t *t_open(char dir[64]) {
  kl_store_t *store;
  kl_t_tmpdir(dir);
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  t_now = kl__now_ms();
  return store;
}

static void t_store(const char *dir) {
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  t_now = kl__now_ms();
  t_timer(store, 0, "acct-2", "later", t_now + 60 * MIN_MS, 5);
  t_timer(store, 0, "acct-1", "past", t_now - MIN_MS, 3);
  t_timer(store, 0, "a\x01z", "ctl", t_now + 120 * MIN_MS, 6);
  t_timer(store, 1, "acct-9", "p1", t_now + 30 * MIN_MS, 2);
  kl_store_destroy(store);
}

/* keylane store timers --store @p dir ARGS... exits 0: its stdout. */
static void t_timers(kl_t_run_t *r, const char *dir, ...) {
  const char *args[16] = {"store", "timers", "--store", dir};
  size_t n = 4;
  va_list ap;
  va_start(ap, dir);
  for (const char *a; n < 15 && (a = va_arg(ap, const char *)) != NULL;)
    args[n++] = a;
  va_end(ap);
  args[n] = NULL;
  kl_t_run_for(args, NULL, 0, 30000, r);
  if (r->rc != 0)
    fail_msg("keylane store timers: exit %d\nstdout: %s\nstderr: %s", r->rc,
             r->out, r->err);
}

static json_t *t_json(const kl_t_run_t *r) {
  json_error_t e;
  json_t *o = json_loads(r->out, 0, &e);
  if (!o)
    fail_msg("not JSON (%s): %s", e.text, r->out);
  return o;
}

static const char *t_str(const json_t *row, const char *field) {
  const char *s = json_string_value(json_object_get(row, field));
  if (!s)
    fail_msg("no string %s in a timer row", field);
  return s;
}

static void test_json_lists_in_due_order(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store(dir);
  kl_t_run_t r;
  t_timers(&r, dir, "--json", NULL);
  json_t *o = t_json(&r);
  json_t *rows = json_object_get(o, "timers");
  assert_int_equal(json_array_size(rows), 4);
  const char *ids[] = {"past", "later", "ctl", "p1"};
  const int64_t offsets[] = {3, 5, 6, 2};
  for (size_t i = 0; i < 4; i++) {
    json_t *row = json_array_get(rows, i);
    assert_string_equal(t_str(row, "id"), ids[i]);
    assert_string_equal(t_str(row, "topic"), "events");
    assert_int_equal(json_integer_value(json_object_get(row, "partition")),
                     i < 3 ? 0 : 1);
    assert_int_equal(json_integer_value(json_object_get(row, "offset")),
                     offsets[i]);
    assert_int_equal(json_is_true(json_object_get(row, "due_now")), i == 0);
  }
  json_t *past = json_array_get(rows, 0);
  assert_string_equal(t_str(past, "key"), "acct-1");
  int64_t due = t_now - MIN_MS;
  assert_int_equal(json_integer_value(json_object_get(past, "due_ms")), due);
  char iso[40], day[32];
  time_t secs = (time_t)(due / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(iso, sizeof(iso), "%s.%03dZ", day, (int)(due % 1000));
  assert_string_equal(t_str(past, "due"), iso);
  json_t *ctl = json_array_get(rows, 2);
  assert_string_equal(t_str(ctl, "key"), "a\x01z"); /* exact in JSON */
  assert_string_equal(t_str(ctl, "key_escaped"), "a\\x01z");
  json_t *parts = json_object_get(o, "partitions");
  assert_int_equal(json_array_size(parts), 2);
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(parts, 0), "pending")),
      3);
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(parts, 1), "pending")),
      1);
  assert_int_equal(json_integer_value(json_object_get(o, "more")), 0);
  json_decref(o);
  kl_t_run_free(&r);

  /* text: one line per timer, keys escaped */
  t_timers(&r, dir, NULL);
  assert_non_null(strstr(r.out, "acct-1"));
  assert_non_null(strstr(r.out, iso));
  assert_non_null(strstr(r.out, "a\\x01z"));
  assert_null(strchr(r.out, '\x01'));
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

static void test_limit_and_filters(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store(dir);
  kl_t_run_t r;
  t_timers(&r, dir, "--limit", "2", "--json", NULL);
  json_t *o = t_json(&r);
  assert_int_equal(json_array_size(json_object_get(o, "timers")), 2);
  assert_int_equal(json_integer_value(json_object_get(o, "more")), 2);
  json_decref(o);
  kl_t_run_free(&r);
  t_timers(&r, dir, "--limit", "2", NULL);
  assert_non_null(strstr(r.out, "... and 2 more"));
  kl_t_run_free(&r);

  t_timers(&r, dir, "-t", "events", "--partition", "1", "--json", NULL);
  o = t_json(&r);
  json_t *rows = json_object_get(o, "timers");
  assert_int_equal(json_array_size(rows), 1);
  assert_string_equal(t_str(json_array_get(rows, 0), "id"), "p1");
  json_decref(o);
  kl_t_run_free(&r);

  t_timers(&r, dir, "--key", "acct-2", "--json", NULL);
  o = t_json(&r);
  rows = json_object_get(o, "timers");
  assert_int_equal(json_array_size(rows), 1);
  assert_string_equal(t_str(json_array_get(rows, 0), "id"), "later");
  json_decref(o);
  kl_t_run_free(&r);

  t_timers(&r, dir, "--key", "nobody", NULL);
  assert_non_null(strstr(r.out, "no timer waits for that key"));
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* keylane store stats counts each partition's timers, and not their
 * records among the handlers' keys; store keys does not list them. */
static void test_stats_counts_timers(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store(dir);
  kl_t_run_t r;
  kl_t_run_for(
      (const char *[]){"store", "stats", "--store", dir, "--json", NULL}, NULL,
      0, 30000, &r);
  assert_int_equal(r.rc, 0);
  json_t *o = t_json(&r);
  assert_int_equal(json_integer_value(json_object_get(o, "handler_keys")), 0);
  json_t *parts = json_object_get(o, "partitions");
  assert_int_equal(json_array_size(parts), 2);
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(parts, i), "timers")),
        i == 0 ? 3 : 1);
  json_decref(o);
  kl_t_run_free(&r);
  /* nor among the keys `keylane store keys` lists */
  kl_t_run_for((const char *[]){"store", "keys", "--store", dir, NULL}, NULL, 0,
               30000, &r);
  assert_int_equal(r.rc, 0);
  assert_string_equal(r.out, "");
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* A key holding a right-to-left override (U+202E) or another direction
 * mark is printed escaped, like a control byte, so that it cannot show
 * its row reversed; --json keeps it exact. */
static void test_direction_marks_are_escaped(void **state) {
  (void)state;
  char dir[64];
  kl_store_t *store = t_open(dir);
  t_timer(store, 0,
          "acct-\xe2\x80\xae"
          "1-tcca",
          "rlo", t_now + MIN_MS, 1);
  t_timer(store, 0, "b\xe2\x81\xa6x\xe2\x80\x8f", "isolate\xe2\x80\xaeid",
          t_now + 2 * MIN_MS, 2);
  kl_store_destroy(store);
  kl_t_run_t r;
  t_timers(&r, dir, NULL);
  if (!strstr(r.out, "acct-\\xe2\\x80\\xae1-tcca") ||
      !strstr(r.out, "b\\xe2\\x81\\xa6x\\xe2\\x80\\x8f") ||
      !strstr(r.out, "isolate\\xe2\\x80\\xaeid") || strstr(r.out, "\xe2\x80"))
    fail_msg("not escaped:\n%s", r.out);
  kl_t_run_free(&r);
  t_timers(&r, dir, "--json", NULL);
  json_t *o = t_json(&r);
  json_t *row = json_array_get(json_object_get(o, "timers"), 0);
  assert_string_equal(t_str(row, "key"), "acct-\xe2\x80\xae"
                                         "1-tcca");
  assert_string_equal(t_str(row, "key_escaped"), "acct-\\xe2\\x80\\xae1-tcca");
  json_decref(o);
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* --partition N of a partition the store does not hold is an error that
 * says how many it holds, exit 1, as store reset -p does; not "no timer
 * waits", which a partition without timers answers. */
static void test_unknown_partition_is_an_error(void **state) {
  (void)state;
  char dir[64];
  kl_store_t *store = t_open(dir);
  for (int32_t p = 0; p < 4; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_acquire(store, "events", p, &st), KL_OK);
  }
  t_timer(store, 1, "k", "one", t_now + MIN_MS, 1);
  kl_store_destroy(store);
  const char *const args[][4] = {{"--partition", "99", NULL, NULL},
                                 {"--partition", "99", "--json", NULL},
                                 {"-t", "events", "--partition", "4"}};
  const char *const says[] = {
      "has no partition 99 of any topic: it has 4 partitions, the highest 3; "
      "check --partition",
      "has no partition 99 of any topic: it has 4 partitions",
      "has no partition 4 of topic events: it has 4 partitions, the highest 3"};
  for (size_t i = 0; i < 3; i++) {
    kl_t_run_t r;
    const char *argv[10] = {"store", "timers", "--store", dir};
    for (size_t j = 0; j < 4; j++)
      argv[4 + j] = args[i][j];
    kl_t_run_for(argv, NULL, 0, 30000, &r);
    if (r.rc != 1 || !strstr(r.err, says[i]) || r.out[0])
      fail_msg("case %zu: exit %d\nstdout: %s\nstderr: %s", i, r.rc, r.out,
               r.err);
    kl_t_run_free(&r);
  }
  /* a partition the store holds, without timers: no error */
  kl_t_run_t r;
  t_timers(&r, dir, "--partition", "2", NULL);
  assert_string_equal(r.out, "no timer waits\n");
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* --key names a key an event can have (1 to KL_KEY_MAX bytes), as the
 * console's key= does: an empty or longer one is a usage error (exit 2),
 * not "no timer waits for that key" (attack LOW: the two disagreed). */
static void test_key_out_of_range_is_refused(void **state) {
  (void)state;
  char dir[64];
  kl_store_t *store = t_open(dir);
  t_timer(store, 1, "k", "one", t_now + MIN_MS, 1);
  kl_store_destroy(store);
  static char long_key[KL_KEY_MAX + 2];
  memset(long_key, 'k', KL_KEY_MAX + 1);
  const char *const keys[] = {"", long_key};
  const char *const says[] = {"--key takes an entity key of 1 to 1024 "
                              "bytes; this one is 0",
                              "this one is 1025"};
  for (size_t i = 0; i < 2; i++) {
    kl_t_run_t r;
    const char *argv[] = {"store", "timers", "--store", dir,
                          "--key", keys[i],  NULL};
    kl_t_run_for(argv, NULL, 0, 30000, &r);
    if (r.rc != 2 || !strstr(r.err, says[i]) || r.out[0])
      fail_msg("case %zu: exit %d\nstdout: %s\nstderr: %s", i, r.rc, r.out,
               r.err);
    kl_t_run_free(&r);
  }
  kl_t_rmrf(dir);
}

/* `store get --id` shows an id and its key escaped, as `store timers`
 * does: an ESC or a direction mark in them must not reach the terminal
 * (attack 2, M3); so does its error for a handler key that is not there. */
static void test_store_get_escapes(void **state) {
  (void)state;
  char dir[64];
  kl_store_t *store = t_open(dir);
  t_timer(store, 0,
          "k\xe2\x80\xae"
          "1",
          "id-e\x1b[31m", t_now + MIN_MS, 1);
  kl_store_destroy(store);
  kl_t_run_t r;
  const char *argv[] = {"store",   "get", "--id", "id-e\x1b[31m",
                        "--store", dir,   NULL};
  kl_t_run_for(argv, NULL, 0, 30000, &r);
  if (r.rc != 0 || strchr(r.out, '\x1b') || strstr(r.out, "\xe2\x80\xae") ||
      !strstr(r.out, "id-e\\x1b[31m") || !strstr(r.out, "k\\xe2\\x80\\xae1"))
    fail_msg("exit %d\nstdout: %s\nstderr: %s", r.rc, r.out, r.err);
  kl_t_run_free(&r);
  const char *missing[] = {"store",   "get", "nokey\x1b[2J",
                           "--store", dir,   NULL};
  kl_t_run_for(missing, NULL, 0, 30000, &r);
  if (r.rc != 1 || strchr(r.err, '\x1b') || !strstr(r.err, "nokey\\x1b[2J"))
    fail_msg("exit %d\nstderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_lists_in_due_order),
      cmocka_unit_test(test_limit_and_filters),
      cmocka_unit_test(test_stats_counts_timers),
      cmocka_unit_test(test_direction_marks_are_escaped),
      cmocka_unit_test(test_unknown_partition_is_an_error),
      cmocka_unit_test(test_key_out_of_range_is_refused),
      cmocka_unit_test(test_store_get_escapes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
