/*
 * The worker's metrics server on keylane's HTTP layer (common/http.h):
 * the strictness and limits the gateway has, with text answers. A head
 * over 8 KiB is 431, a body over 8 KiB 413 (no route reads one), a
 * header name with a space before its colon 400, a transfer coding other
 * than chunked 501, an HTTP/1.1 request without Host 400, a request that
 * does not arrive whole within 10 s 408 (slowloris), and a second request
 * on a connection is not answered (one request per connection). Each
 * refusal closes its connection.
 */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/metrics_server.h"
#include "common/internal.h"
#include "support/cluster.h"
#include "support/http.h"
#include "support/support.h"

typedef struct kl_fx {
  char dir[64];
  kl_t_cluster_t *cluster;
  kl_store_t *store;
  kl_t_worker_t *w;
  kl__metrics_server_t *server;
  int port;
} kl_fx_t;

/* Armed, the store's reads wait until released: a PostgreSQL server
 * SIGSTOPped, as the hostile test of issue 37 had it. */
static struct {
  atomic_int armed, released, held;
  atomic_int delay_ms; /* each read takes this long: a slow store */
} t_store;

static int kl_setup(void **state) {
  kl_fx_t *fx = calloc(1, sizeof(*fx));
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_t_cluster_new(1, "mhttp", 1, &fx->cluster), KL_OK);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
  fx->w = kl_t_worker_new(kl_t_bootstrap(fx->cluster), kl_t_topic(fx->cluster),
                          kl_t_group(fx->cluster, "g"), fx->store, NULL);
  assert_int_equal(
      kl__metrics_server_start("127.0.0.1:0", NULL, kl_t_topic(fx->cluster),
                               fx->w->worker, fx->store, &fx->server),
      KL_OK);
  fx->port = kl__metrics_server_port(fx->server);
  *state = fx;
  return 0;
}

static int kl_teardown(void **state) {
  kl_fx_t *fx = *state;
  t_store.released = 1; /* a failed test's held read ends */
  t_store.delay_ms = 0;
  kl__metrics_server_stop(fx->server);
  kl_worker_destroy(fx->w->worker);
  free(fx->w);
  kl_store_destroy(fx->store);
  kl_t_cluster_destroy(fx->cluster);
  kl_t_rmrf(fx->dir);
  free(fx);
  return 0;
}

/* Sends @p raw on a new connection; the answer must be @p status with
 * @p says in its body, and the connection closed after it. */
static void kl_expect(int port, const char *raw, size_t len, int status,
                      const char *says, int timeout_ms) {
  kl_t_http_t *http = kl_t_http_open(port);
  assert_non_null(http);
  assert_int_equal(kl_t_http_send(http, raw, len), 0);
  kl_t_http_resp_t resp = {0};
  assert_int_equal(kl_t_http_recv(http, &resp, timeout_ms), 0);
  if (resp.status != status || !resp.body || !strstr(resp.body, says))
    fail_msg("wanted %d \"%s\", got %d: %s", status, says, resp.status,
             resp.body ? resp.body : "");
  assert_false(resp.keep_alive);
  kl_t_http_resp_free(&resp);
  kl_t_http_resp_t more = {0};
  assert_int_equal(kl_t_http_recv(http, &more, 2000), -1); /* closed */
  kl_t_http_resp_free(&more);
  kl_t_http_close(http);
}

static void test_sizes(void **state) {
  kl_fx_t *fx = *state;
  size_t len;
  static char big[9000];
  memset(big, 'a', sizeof(big));
  char *req = kl_t_http_format("POST", "/livez", NULL, big, sizeof(big), &len);
  kl_expect(fx->port, req, len, 413, "the limit is 8192 (8 KiB)", 5000);
  free(req);
  char head[9300];
  len = (size_t)snprintf(head, sizeof(head),
                         "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                         "X-Long: %.*s\r\n\r\n",
                         9000, big);
  req = strdup(head);
  kl_expect(fx->port, req, len, 431, "exceed 8192 bytes (8 KiB)", 5000);
  free(req);
}

static void test_framing(void **state) {
  kl_fx_t *fx = *state;
  static const struct {
    const char *raw;
    int status;
    const char *says;
  } cases[] = {
      {"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n", 400,
       "header name holds a space"},
      {"POST /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, "
       "chunked\r\n\r\n",
       501, "implements chunked alone"},
      {"GET /healthz HTTP/1.1\r\n\r\n", 400, "no Host header"},
      {"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400,
       "obs-fold"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    kl_expect(fx->port, cases[i].raw, strlen(cases[i].raw), cases[i].status,
              cases[i].says, 5000);
}

/* A client that sends its head slowly is answered 408 and let go, not
 * held: the 10 s bound, checked every second. */
static void test_slow_request(void **state) {
  kl_fx_t *fx = *state;
  const char *raw = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  kl_expect(fx->port, raw, strlen(raw), 408, "within 10000 ms (10 s)", 15000);
}

/* One request per connection: the first is answered with Connection:
 * close, the one pipelined after it is not. */
static void test_one_request(void **state) {
  kl_fx_t *fx = *state;
  const char *two = "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
                    "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
  kl_t_http_t *http = kl_t_http_open(fx->port);
  assert_non_null(http);
  assert_int_equal(kl_t_http_send(http, two, strlen(two)), 0);
  kl_t_http_resp_t resp = {0};
  assert_int_equal(kl_t_http_recv(http, &resp, 5000), 0);
  assert_int_equal(resp.status, 200);
  assert_false(resp.keep_alive);
  kl_t_http_resp_free(&resp);
  assert_int_equal(kl_t_http_recv(http, &resp, 2000), -1);
  kl_t_http_resp_free(&resp);
  kl_t_http_close(http);
}

/* ---- a store that accepts and never answers ---- */

kl_err_t __real_kl_store_foreach_partition(kl_store_t *store,
                                           kl_store_partition_cb_t *cb,
                                           void *opaque);
kl_err_t __wrap_kl_store_foreach_partition(kl_store_t *store,
                                           kl_store_partition_cb_t *cb,
                                           void *opaque);
kl_err_t __real_kl_store_partition(kl_store_t *store, const char *topic,
                                   int32_t partition,
                                   kl_partition_state_t *state);
kl_err_t __wrap_kl_store_partition(kl_store_t *store, const char *topic,
                                   int32_t partition,
                                   kl_partition_state_t *state);

static void t_store_wait(void) {
  if (t_store.delay_ms)
    kl_t_sleep_ms(t_store.delay_ms);
  if (!t_store.armed)
    return;
  t_store.held++;
  for (int t = 0; t < 60000 && !t_store.released; t++)
    kl_t_sleep_ms(1);
  t_store.held--;
}

kl_err_t __wrap_kl_store_foreach_partition(kl_store_t *store,
                                           kl_store_partition_cb_t *cb,
                                           void *opaque) {
  t_store_wait();
  return __real_kl_store_foreach_partition(store, cb, opaque);
}

kl_err_t __wrap_kl_store_partition(kl_store_t *store, const char *topic,
                                   int32_t partition,
                                   kl_partition_state_t *state) {
  t_store_wait();
  return __real_kl_store_partition(store, topic, partition, state);
}

/* GET @p path on a new connection, answered within @p timeout_ms.
 * @returns the status; the body in @p body (freed by the caller). */
static int t_get(int port, const char *path, int timeout_ms, char **body,
                 int64_t *took_ms) {
  int64_t t0 = kl__mono_ns();
  kl_t_http_t *http = kl_t_http_open(port);
  assert_non_null(http);
  assert_int_equal(kl_t_http_request(http, "GET", path, NULL, NULL, 0), 0);
  kl_t_http_resp_t resp = {0};
  if (kl_t_http_recv(http, &resp, timeout_ms) != 0)
    fail_msg("GET %s: no answer within %d ms", path, timeout_ms);
  kl_t_http_close(http);
  *took_ms = (kl__mono_ns() - t0) / 1000000;
  *body = resp.body ? strdup(resp.body) : strdup("");
  int status = resp.status;
  kl_t_http_resp_free(&resp);
  return status;
}

/* While the store holds every read, /healthz answers 503 naming the
 * wait once the read is 2 s old, /livez answers at once, /metrics says
 * how old the read is, and kl_worker_health() returns; one read waits,
 * however many ask. Released, /healthz is the store's again. Before
 * worker/store_read.c, the first /healthz held the server's loop until
 * the store answered. */
static void test_store_that_never_answers(void **state) {
  kl_fx_t *fx = *state;
  t_store.released = 0;
  t_store.armed = 1;
  char *body;
  int64_t took;
  int status = t_get(fx->port, "/healthz", 10000, &body, &took);
  if (status != 503 || !strstr(body, "the store has not answered a read for"))
    fail_msg("/healthz with a hung store: %d %s", status, body);
  free(body);
  assert_in_range(took, 1900, 5000); /* the 2 s bound, from the read's start */
  status = t_get(fx->port, "/livez", 1000, &body, &took);
  assert_int_equal(status, 200);
  free(body);
  assert_in_range(took, 0, 500);
  status = t_get(fx->port, "/metrics", 3000, &body, &took);
  assert_int_equal(status, 200);
  static const char series[] = "\nkeylane_worker_store_read_age_seconds ";
  const char *age = strstr(body, series);
  assert_non_null(age);
  assert_true(strtod(age + strlen(series), NULL) >= 2.0);
  free(body);
  assert_in_range(took, 0, 1500);
  status = t_get(fx->port, "/v1/partitions", 3000, &body, &took);
  assert_int_equal(status, 200);
  free(body);
  assert_in_range(took, 0, 1500);
  kl_worker_health_t h = {.size = sizeof(h)};
  assert_int_equal(kl_worker_health(fx->w->worker, &h), KL_OK);
  assert_int_equal(h.status, KL_WORKER_HEALTH_FAILING);
  assert_int_equal(h.cause, KL_WORKER_CAUSE_STORE);
  assert_int_equal(t_store.held, 1); /* one read, shared by every caller */
  t_store.released = 1;
  status = 503;
  for (int t = 0; t < 50 && status == 503; t++) {
    status = t_get(fx->port, "/healthz", 3000, &body, &took);
    free(body);
    kl_t_sleep_ms(100);
  }
  assert_int_equal(status, 200);
  assert_int_equal(t_store.held, 0);
  t_store.armed = 0;
}

/* A store that answers every read in 1.5 s, below the 2 s bound: after
 * the first read, /healthz answers from the last read at once, and /livez
 * never queues behind it (a probe's timeout is often 1 s). Before the
 * server's reader was cached, each /healthz waited for a read of its own
 * and /livez behind it. */
static void test_slow_store_holds_no_probe(void **state) {
  kl_fx_t *fx = *state;
  t_store.delay_ms = 1500;
  char *body;
  int64_t took;
  assert_int_equal(t_get(fx->port, "/healthz", 10000, &body, &took), 200);
  free(body);
  int64_t worst = 0;
  for (int i = 0; i < 12; i++) {
    const char *path = i % 2 ? "/livez" : "/healthz";
    int status = t_get(fx->port, path, 5000, &body, &took);
    if (status != 200)
      fail_msg("%s with a slow store: %d %s", path, status, body);
    free(body);
    worst = took > worst ? took : worst;
    kl_t_sleep_ms(250);
  }
  t_store.delay_ms = 0;
  if (worst > 1000) /* a read of its own takes 1500 ms */
    fail_msg("a probe took %lld ms with reads of 1500 ms", (long long)worst);
}

/* A scrape asks Kafka nothing: with the cluster away it answers at once
 * (it took 500 ms a partition when it asked for the high watermarks, 1 s
 * with a budget, and librdkafka 2.0.2's query could outwait its timeout
 * and hold /livez for the whole outage), and every partition the store
 * knows still has its watermark series. */
static void test_scrape_asks_kafka_nothing(void **state) {
  kl_fx_t *fx = *state;
  const char *topic = kl_t_topic(fx->cluster);
  kl_partition_state_t st;
  for (int32_t p = 0; p < 8; p++)
    assert_int_equal(kl_store_acquire(fx->store, topic, p, &st), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.group", "g"), KL_OK);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, topic,
                                            fx->w->worker, fx->store, &server),
                   KL_OK);
  kl_conf_destroy(conf);
  char *body;
  int64_t took;
  int status =
      t_get(kl__metrics_server_port(server), "/metrics", 10000, &body, &took);
  kl__metrics_server_stop(server);
  assert_int_equal(status, 200);
  for (int p = 0; p < 8; p++) {
    char series[64];
    snprintf(series, sizeof(series),
             "keylane_worker_partition_watermark{partition=\"%d\"}", p);
    if (!strstr(body, series))
      fail_msg("no %s in /metrics", series);
  }
  free(body);
  if (took > 500)
    fail_msg("a scrape took %lld ms with Kafka away", (long long)took);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sizes, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_framing, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_slow_request, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_one_request, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_store_that_never_answers, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_slow_store_holds_no_probe, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_scrape_asks_kafka_nothing, kl_setup,
                                      kl_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
