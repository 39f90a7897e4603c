/*
 * keylane doctor's PostgreSQL checks (worker/checks.h, cli/doctor_run.h) on
 * a throwaway server: the skew between this host's clock and the server's
 * (OK, and WARN when the host's store clock is moved ahead or behind), no
 * clock check for LMDB, and the doctor's store lines for a PostgreSQL
 * store: its schema version, a newer schema refused, the log, the epochs
 * and the clock. Skips, saying why, when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/internal.h"
#include "keylane/embedded.h"
#include "keylane/store.h"
#include "support/pg_group.h"
#include "support/support.h"
#include "cli/doctor_run.h"
#include "store/store_internal.h"
#include "store/pg.h"

typedef struct t_state {
  char uri[256];
  kl_store_t *store;
} t_state_t;

static int t_setup(void **state) {
  static int seq;
  if (!kl_t_pg_group())
    return 0;
  t_state_t *st = calloc(1, sizeof(*st));
  char name[32];
  snprintf(name, sizeof(name), "doctor%d", ++seq);
  if (kl_t_pg_createdb(kl_t_pg_group(), name, st->uri, sizeof(st->uri)) ||
      kl_store_open(st->uri, NULL, &st->store)) /* makes the schema */
    return -1;
  *state = st;
  return 0;
}

static int t_teardown(void **state) {
  t_state_t *st = *state;
  kl__store_set_clock(NULL);
  if (st)
    kl_store_destroy(st->store);
  free(st);
  return 0;
}

static int64_t t_ahead(void) {
  return kl__now_ms() + 5000;
}

static int64_t t_behind(void) {
  return kl__now_ms() - 5000;
}

static void test_clock_skew(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl__check_t c;
  assert_int_equal(kl__check_clock(st->store, KL__CLOCK_SKEW_WARN_MS, &c), 1);
  if (c.status != KL__CHECK_OK)
    fail_msg("%s", c.msg);
  assert_non_null(strstr(c.msg, "of the PostgreSQL server's"));

  kl__store_set_clock(t_ahead);
  assert_int_equal(kl__check_clock(st->store, KL__CLOCK_SKEW_WARN_MS, &c), 1);
  assert_int_equal(c.status, KL__CHECK_WARN);
  assert_non_null(strstr(c.msg, "ahead of the PostgreSQL server's (more "
                                "than 1000 ms)"));
  assert_non_null(strstr(c.msg, "synchronise the clocks"));

  kl__store_set_clock(t_behind);
  assert_int_equal(kl__check_clock(st->store, KL__CLOCK_SKEW_WARN_MS, &c), 1);
  assert_int_equal(c.status, KL__CHECK_WARN);
  assert_non_null(strstr(c.msg, "behind the PostgreSQL server's"));
}

static void test_no_clock_check_for_lmdb(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl__check_t c = {KL__CHECK_OK, "untouched"};
  assert_int_equal(kl__check_clock(store, KL__CLOCK_SKEW_WARN_MS, &c), 0);
  assert_string_equal(c.msg, "untouched");
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* Runs the doctor on topic "events" of @p boot with the store @p uri. */
static char *t_doctor(const char *boot, const char *uri,
                      kl__check_status_t *worst) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", boot), KL_OK);
  assert_int_equal(kl_conf_set(conf, "store.create", "no"), KL_OK);
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  kl__doctor_opts_t o = {conf, "events", uri, 0, 0, NULL};
  assert_int_equal(kl__doctor_run(&o, out, worst), KL_OK);
  fclose(out);
  kl_conf_destroy(conf);
  return buf;
}

static void t_assert_has(const char *text, const char *part) {
  if (!strstr(text, part))
    fail_msg("no \"%s\" in:\n%s", part, text);
}

static void test_doctor_store_lines(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 2, &cluster), KL_OK);
  assert_int_equal(kl_embedded_topic_create(cluster, "events.dlq", 1), KL_OK);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(st->store, "events", 0, &ps), KL_OK);
  kl__check_status_t worst;
  char *out = t_doctor(kl_embedded_bootstrap(cluster), st->uri, &worst);
  t_assert_has(out, "OK store-version: store ");
  char version[96];
  snprintf(version, sizeof(version),
           "(postgresql) has schema version %d, the one this build writes",
           KL__PG_SCHEMA_VERSION);
  t_assert_has(out, version);
  t_assert_has(out, "OK log: ");
  t_assert_has(out, "OK epochs: ");
  t_assert_has(out, "OK clock: this host's clock is within");
  free(out);

  kl__store_set_clock(t_ahead);
  out = t_doctor(kl_embedded_bootstrap(cluster), st->uri, &worst);
  t_assert_has(out, "WARN clock: this host's clock is ");
  free(out);
  kl__store_set_clock(NULL);

  PGconn *pg = PQconnectdb(st->uri);
  assert_int_equal(PQstatus(pg), CONNECTION_OK);
  PQclear(PQexec(pg, "INSERT INTO keylane_schema_version (version) "
                     "VALUES (99)"));
  PQfinish(pg);
  out = t_doctor(kl_embedded_bootstrap(cluster), st->uri, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  t_assert_has(out, "FAIL store-version: cannot open the store");
  t_assert_has(out, "99");
  free(out);
  kl_embedded_destroy(cluster);
}

#define T(name) cmocka_unit_test_setup_teardown(name, t_setup, t_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_clock_skew),
      cmocka_unit_test(test_no_clock_check_for_lmdb),
      T(test_doctor_store_lines),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
