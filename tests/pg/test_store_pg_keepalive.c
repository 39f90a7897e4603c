/*
 * A PostgreSQL link that dies is noticed within about 25 s, not after the
 * OS's 2 h (keepalives) or 15 min (retransmissions): a connection made by
 * kl__pg_connect() (the one way keylane connects) from a test host (a
 * network namespace, support/netns.h) waits for a long statement, the
 * host's veth is taken down, and the wait ends with an error, whether the
 * link died after the statement was acknowledged (keepalives notice) or
 * before (tcp_user_timeout does). The two cases run at once, each from a
 * host of its own, since each spends its time waiting for the OS to give
 * up. Skips, saying why, when it cannot make namespaces (not root, no
 * iproute2) or PostgreSQL is not installed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/netns.h"
#include "support/pg.h"
#include "support/sql.h"
#include "support/support.h"
#include "store/pg.h"

typedef struct t_host {
  kl_t_netns_t *ns;
  kl_t_pg_t *pg;
  char why[512];
  char uri[2][256]; /* the server, as host 0 and host 1 reach it */
} t_host_t;

static int t_up(void **state) {
  t_host_t *h = calloc(1, sizeof(*h));
  *state = h;
  if (!(h->ns = kl_t_netns_new(2, h->why, sizeof(h->why))))
    return 0;
  h->pg = kl_t_pg_start_on(0, kl_t_netns_gateways(h->ns), "10.213.0.0/16",
                           h->why, sizeof(h->why));
  char local[256];
  if (!h->pg || kl_t_pg_createdb(h->pg, "keepalive", local, sizeof(local)))
    return h->pg ? -1 : 0;
  for (int i = 0; i < 2; i++)
    snprintf(h->uri[i], sizeof(h->uri[i]),
             "postgresql://keylane@%s:%d/keepalive",
             kl_t_netns_gateway(h->ns, i), h->pg->port);
  return 0;
}

static int t_down(void **state) {
  t_host_t *h = *state;
  kl_t_pg_stop(h->pg);
  kl_t_netns_destroy(h->ns);
  free(h);
  return 0;
}

/* A statement that outlasts the test, sent from inside host @p host once
 * the test says go. */
typedef struct t_wait {
  t_host_t *h;
  int host;
  int sock; /* the connection's, once connected */
  int connected, go, done, failed;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} t_wait_t;

static void t_wait_set(t_wait_t *w, int *field) {
  pthread_mutex_lock(&w->mu);
  *field = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Waits up to @p s seconds for *@p field. @returns it. */
static int t_wait_for(t_wait_t *w, const int *field, int s) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += s;
  pthread_mutex_lock(&w->mu);
  while (!*field && pthread_cond_timedwait(&w->cv, &w->mu, &deadline) == 0)
    ;
  int got = *field;
  pthread_mutex_unlock(&w->mu);
  return got;
}

static void *t_wait_main(void *opaque) {
  t_wait_t *w = opaque;
  char path[128];
  snprintf(path, sizeof(path), "/var/run/netns/%s",
           kl_t_netns_name(w->h->ns, w->host));
  int fd = open(path, O_RDONLY);
  int entered = fd >= 0 && setns(fd, CLONE_NEWNET) == 0; /* this thread */
  if (fd >= 0)
    close(fd);
  PGconn *pg = NULL;
  if (entered &&
      kl__pg_connect(w->h->uri[w->host], 10, KL_ESTORE, &pg) == KL_OK) {
    w->sock = PQsocket(pg);
    t_wait_set(w, &w->connected);
    t_wait_for(w, &w->go, 60);
    PGresult *res = PQexec(pg, "SELECT pg_sleep(600)");
    w->failed = PQresultStatus(res) != PGRES_TUPLES_OK;
    PQclear(res);
  } else {
    fprintf(stderr, "host %d cannot reach %s: %s\n", w->host,
            w->h->uri[w->host], entered ? kl_err_detail() : "setns failed");
    w->failed = 1;
  }
  PQfinish(pg);
  t_wait_set(w, &w->done);
  return NULL;
}

static void t_wait_start(t_host_t *h, int host, t_wait_t *w,
                         pthread_t *thread) {
  *w = (t_wait_t){.h = h, .host = host, .sock = -1};
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  assert_int_equal(pthread_create(thread, NULL, t_wait_main, w), 0);
  assert_true(t_wait_for(w, &w->connected, 30));
}

/* Once the link was cut at @p t0: the wait must end, failed, within 45 s.
 * Past 60 s the test shuts the socket down to free the thread, then
 * fails. @p what names the case. */
static void t_wait_end(t_host_t *h, t_wait_t *w, pthread_t thread, int64_t t0,
                       const char *what) {
  int done = t_wait_for(w, &w->done, 60);
  double secs = (double)(kl__mono_ns() - t0) / 1e9;
  kl_t_netns_cut(h->ns, w->host, 0);
  if (!done) /* libpq reads the end of the connection: the thread goes */
    shutdown(w->sock, SHUT_RDWR);
  pthread_join(thread, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  fprintf(stderr, "link cut %s: the wait ended after %.1f s%s\n", what, secs,
          done ? "" : " (not by itself: the test shut the socket down)");
  assert_true(done);
  assert_true(w->failed);
  assert_true(secs < 45.0);
}

static PGconn *t_admin(t_host_t *h) {
  char uri[256];
  kl_t_pg_admin_uri(h->pg, uri, sizeof(uri));
  return PQconnectdb(uri);
}

/* @returns the bytes the connection sent and the server has not
 * acknowledged (its kernel acknowledges within its delayed-ACK time). */
static unsigned t_unacked(int sock) {
  struct tcp_info info;
  socklen_t len = sizeof(info);
  assert_int_equal(getsockopt(sock, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
  return info.tcpi_unacked;
}

/* Case "while waiting", host 0: the statement runs and every byte was
 * acknowledged when the link is cut: the connection is idle, and only
 * keepalives notice (the OS's: after 2 h). @returns when it was cut. */
static int64_t t_cut_while_waiting(t_host_t *h, t_wait_t *w) {
  PGconn *admin = t_admin(h);
  t_wait_set(w, &w->go);
  const char *running = "SELECT count(*) FROM pg_stat_activity WHERE query = "
                        "'SELECT pg_sleep(600)' AND state = 'active'";
  for (int i = 0; i < 3000 && (!kl_t_sql(admin, running) || t_unacked(w->sock));
       i++)
    kl_t_sleep_ms(10);
  assert_int_equal(kl_t_sql(admin, running), 1);
  assert_int_equal(t_unacked(w->sock), 0);
  PQfinish(admin);
  assert_int_equal(kl_t_netns_cut(h->ns, w->host, 1), 0);
  return kl__mono_ns();
}

/* Case "while sending", host 1: the statement is sent into a link already
 * dead: its bytes stay unacknowledged, when keepalives do not run and
 * only the retransmission timeout would end it (the OS's: about 15 min).
 * @returns when it was cut. */
static int64_t t_cut_while_sending(t_host_t *h, t_wait_t *w) {
  assert_int_equal(kl_t_netns_cut(h->ns, w->host, 1), 0);
  int64_t t0 = kl__mono_ns();
  t_wait_set(w, &w->go);
  return t0;
}

/* Both cases at once, each on its own host and connection: the one
 * sending is cut once the one waiting is, and each must end by itself. */
static void test_dead_link_noticed_while_waiting_or_sending(void **state) {
  t_host_t *h = *state;
  if (!h->pg) {
    fprintf(stderr, "skipped: %s\n", h->why);
    skip();
  }
  t_wait_t waiting, sending;
  pthread_t waiting_thread, sending_thread;
  t_wait_start(h, 0, &waiting, &waiting_thread);
  t_wait_start(h, 1, &sending, &sending_thread);
  int64_t t_waiting = t_cut_while_waiting(h, &waiting);
  int64_t t_sending = t_cut_while_sending(h, &sending);
  t_wait_end(h, &waiting, waiting_thread, t_waiting, "while waiting");
  t_wait_end(h, &sending, sending_thread, t_sending, "while sending");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dead_link_noticed_while_waiting_or_sending),
  };
  return cmocka_run_group_tests(tests, t_up, t_down);
}
