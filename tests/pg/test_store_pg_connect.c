/*
 * How the PostgreSQL store connects: a server that accepts TCP and never
 * answers costs a connection attempt store.pg.connect.timeout, not the
 * OS's minutes, with an error naming the timeout and the setting (for the
 * store and for `keylane store migrate`'s connection); every pooled
 * connection carries keylane's TCP keepalives and connect timeout, and a
 * URI that sets one of them wins. Skips, saying why, when PostgreSQL is not
 * installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/pg_group.h"
#include "support/store_contract.h"
#include "store/pg.h"

/* ---- a server that never answers ------------------------------------- */

/* A loopback listener nobody accepts from: the kernel completes the
 * handshake and takes libpq's startup packet, and no answer ever comes. */
static int t_silent_listener(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
  assert_int_equal(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
  *port = ntohs(addr.sin_port);
  return fd;
}

/* A connection attempt on its own thread, so that one that hangs fails
 * the test instead of hanging it. */
typedef struct t_attempt {
  char uri[128];
  const char *timeout; /* store.pg.connect.timeout; NULL: migrate */
  kl_err_t err;
  char detail[1024];
  int done;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} t_attempt_t;

static void *t_attempt_main(void *opaque) {
  t_attempt_t *a = opaque;
  kl_err_t err;
  if (a->timeout) {
    kl_store_t *store = NULL;
    err = kl_t_store_try_open(a->uri, &store, "store.pg.connect.timeout",
                              a->timeout, NULL);
    kl_store_destroy(store);
  } else {
    int from, to;
    err = kl__store_pg_migrate(a->uri, &from, &to);
  }
  pthread_mutex_lock(&a->mu);
  a->err = err;
  snprintf(a->detail, sizeof(a->detail), "%s", kl_err_detail());
  a->done = 1;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

/* Runs @p a against a silent listener; asserts it gave up after at least
 * @p min_s and before @p max_s, with KL_ESTORE. @returns the seconds. */
static double t_attempt_run(t_attempt_t *a, double min_s, double max_s) {
  int port;
  int fd = t_silent_listener(&port);
  snprintf(a->uri, sizeof(a->uri), "postgresql://keylane@127.0.0.1:%d/none",
           port);
  a->done = 0;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  int64_t t0 = kl__mono_ns();
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, t_attempt_main, a), 0);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)max_s;
  pthread_mutex_lock(&a->mu);
  while (!a->done && pthread_cond_timedwait(&a->cv, &a->mu, &deadline) == 0)
    ;
  int done = a->done;
  pthread_mutex_unlock(&a->mu);
  double secs = (double)(kl__mono_ns() - t0) / 1e9;
  close(fd); /* resets a connection still waiting: the thread ends */
  pthread_join(thread, NULL);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  fprintf(stderr, "silent server: gave up after %.1f s: %s\n", secs, a->detail);
  if (!done)
    fail_msg("the connection attempt still waited after %.0f s", max_s);
  assert_int_equal(a->err, KL_ESTORE);
  assert_true(secs >= min_s);
  return secs;
}

/* libpq counts the timeout in whole seconds of the wall clock: 2 s is
 * between 1 and 2 s of waiting. Without a timeout, the attempt waits for
 * the OS (hours: the connection is up, the answer never comes). */
static void test_open_gives_up_on_a_silent_server(void **state) {
  (void)state;
  t_attempt_t a = {.timeout = "2s"};
  t_attempt_run(&a, 1.0, 8.0);
  assert_non_null(strstr(a.detail, "cannot connect"));
  assert_non_null(strstr(a.detail, "connect timeout: 2 s"));
  assert_non_null(strstr(a.detail, "store.pg.connect.timeout"));
}

/* A timeout below libpq's 2 s is rounded up, not taken as "none". */
static void test_open_rounds_a_short_timeout_up(void **state) {
  (void)state;
  t_attempt_t a = {.timeout = "300ms"};
  t_attempt_run(&a, 1.0, 8.0);
  assert_non_null(strstr(a.detail, "connect timeout: 2 s"));
}

/* `keylane store migrate` connects the same way, with the default 10 s. */
static void test_migrate_gives_up_on_a_silent_server(void **state) {
  (void)state;
  t_attempt_t a = {.timeout = NULL};
  t_attempt_run(&a, 9.0, 20.0);
  assert_non_null(strstr(a.detail, "connect timeout: 10 s"));
  assert_non_null(strstr(a.detail, "store.pg.connect.timeout"));
}

/* libpq's message of a refused connection spans two lines; the error, a
 * log line, is one. */
static void test_refused_is_one_line(void **state) {
  (void)state;
  kl_store_t *store = NULL;
  assert_int_equal(
      kl_store_open("postgresql://keylane@127.0.0.1:1/none", NULL, &store),
      KL_ESTORE);
  const char *detail = kl_err_detail();
  assert_non_null(strstr(detail, "cannot connect"));
  assert_null(strchr(detail, '\n'));
  assert_null(strchr(detail, '\t'));
}

/* ---- what a pooled connection carries -------------------------------- */

/* @p keyword's value on a pooled connection of @p store, into @p buf. */
static const char *t_pooled_option(kl_store_t *store, const char *keyword,
                                   char *buf, size_t size) {
  kl__pg_conn_t *conn;
  assert_int_equal(kl__pg_conn_take((kl__pg_t *)store, &conn), KL_OK);
  PQconninfoOption *opts = PQconninfo(conn->pg);
  snprintf(buf, size, "(unset)");
  for (PQconninfoOption *o = opts; o && o->keyword; o++)
    if (strcmp(o->keyword, keyword) == 0 && o->val)
      snprintf(buf, size, "%s", o->val);
  PQconninfoFree(opts);
  kl__pg_conn_give((kl__pg_t *)store, conn, 0);
  return buf;
}

static void t_assert_option(kl_store_t *store, const char *keyword,
                            const char *want) {
  char got[64];
  assert_string_equal(t_pooled_option(store, keyword, got, sizeof(got)), want);
}

static void t_uri(char *uri, size_t size) {
  kl_t_pg_t *pg = kl_t_pg_need();
  static int seq;
  char name[32];
  snprintf(name, sizeof(name), "conn%d", ++seq);
  assert_int_equal(kl_t_pg_createdb(pg, name, uri, size), 0);
}

static void test_pooled_connection_has_keylane_defaults(void **state) {
  (void)state;
  char uri[256];
  t_uri(uri, sizeof(uri));
  kl_store_t *store = kl_t_store_open(uri, NULL);
  t_assert_option(store, "keepalives", "1");
  t_assert_option(store, "keepalives_idle", "10");
  t_assert_option(store, "keepalives_interval", "5");
  t_assert_option(store, "keepalives_count", "3");
  t_assert_option(store, "tcp_user_timeout", "25000");
  t_assert_option(store, "connect_timeout", "10");
  kl_store_destroy(store);
  store = kl_t_store_open(uri, "store.pg.connect.timeout", "2500ms", NULL);
  t_assert_option(store, "connect_timeout", "3");
  kl_store_destroy(store);
}

/* What the URI sets wins over keylane's defaults; the rest stay. */
static void test_uri_settings_win(void **state) {
  (void)state;
  char uri[256], with[320];
  t_uri(uri, sizeof(uri));
  snprintf(with, sizeof(with), "%s%sconnect_timeout=7&keepalives_idle=99", uri,
           strchr(uri, '?') ? "&" : "?");
  kl_store_t *store =
      kl_t_store_open(with, "store.pg.connect.timeout", "30s", NULL);
  t_assert_option(store, "connect_timeout", "7");
  t_assert_option(store, "keepalives_idle", "99");
  t_assert_option(store, "keepalives_interval", "5");
  kl_store_destroy(store);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_gives_up_on_a_silent_server),
      cmocka_unit_test(test_open_rounds_a_short_timeout_up),
      cmocka_unit_test(test_migrate_gives_up_on_a_silent_server),
      cmocka_unit_test(test_refused_is_one_line),
      cmocka_unit_test(test_pooled_connection_has_keylane_defaults),
      cmocka_unit_test(test_uri_settings_win),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
