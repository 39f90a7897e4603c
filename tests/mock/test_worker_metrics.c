/*
 * The worker's /metrics and /healthz (cli/metrics_server.h) on the
 * embedded cluster: the text parses with the strict checker and counts
 * what the worker applied; /healthz is 200 while it owns partitions and
 * 503 once the test takes the partitions' epochs and its commit is fenced;
 * bounds on connections; and `keylane worker --handler exec:...
 * --metrics-listen` as a process (KEYLANE_BIN).
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "common/internal.h"
#include "worker/worker_internal.h"

#include "support/cluster.h"
#include "support/http.h"
#include "support/prom.h"
#include "support/support.h"
#include "cli/metrics_server.h"

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

static int kl_get(int port, const char *path, kl_t_http_resp_t *resp) {
  memset(resp, 0, sizeof(*resp));
  return kl_t_http_once(port, "GET", path, NULL, NULL, resp);
}

static void kl_assert_line(const char *text, const char *line) {
  if (!strstr(text, line))
    fail_msg("\"%s\" not in /metrics:\n%s", line, text);
}

/* Both latency histograms of @p topic counted @p applied events (not the
 * suppressed duplicate), each within @p within_s of its publish. */
static void kl_assert_latency(const char *text, const char *topic, int applied,
                              const char *within_s) {
  static const char *const names[] = {
      "keylane_worker_event_latency_seconds",
      "keylane_worker_event_commit_latency_seconds"};
  char line[256];
  for (int i = 0; i < 2; i++) {
    snprintf(line, sizeof(line), "# TYPE %s histogram\n", names[i]);
    kl_assert_line(text, line);
    snprintf(line, sizeof(line), "%s_count{topic=\"%s\"} %d\n", names[i], topic,
             applied);
    kl_assert_line(text, line);
    snprintf(line, sizeof(line), "%s_bucket{topic=\"%s\",le=\"%s\"} %d\n",
             names[i], topic, within_s, applied);
    kl_assert_line(text, line);
  }
}

static void test_metrics_and_healthz(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "metrics", 2, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(20, 2, 11);
  kl_producer_t *producer = kl_t_producer(kl_t_bootstrap(cluster), gen);
  for (int i = 0; i < 100; i++)
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl__ledger_gen_republish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(cluster), topic,
                        kl_t_group(cluster, "gm"), store, kl_fast);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(cluster)),
      KL_OK);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, topic,
                                            w->worker, store, &server),
                   KL_OK);
  kl_conf_destroy(conf);
  int port = kl__metrics_server_port(server);
  assert_true(port > 0);
  assert_int_equal(kl__ledger_gen_wait(gen, store, topic, 0, 30000), 0);
  kl_t_sleep_ms(200); /* the gauges refresh every few ms */

  kl_t_http_resp_t resp;
  assert_int_equal(kl_get(port, "/metrics", &resp), 0);
  assert_int_equal(resp.status, 200);
  char err[256], ctype[128];
  if (kl_t_prom_check(resp.body, err, sizeof(err)) != 0)
    fail_msg("/metrics does not parse: %s\n%s", err, resp.body);
  assert_non_null(
      kl_t_http_header(&resp, "content-type", ctype, sizeof(ctype)));
  assert_non_null(strstr(ctype, "version=0.0.4"));
  kl_assert_line(resp.body, "keylane_worker_events_applied_total 100\n");
  kl_assert_line(resp.body, "keylane_worker_events_suppressed_total 1\n");
  kl_assert_latency(resp.body, topic, 100, "10");
  kl_assert_line(resp.body, "keylane_worker_fenced_batches_total 0\n");
  kl_assert_line(resp.body, "keylane_worker_owned_partitions 2\n");
  kl_assert_line(resp.body, "keylane_worker_waiting_keys 0\n");
  kl_assert_line(resp.body, "keylane_worker_outbox_pending 0\n");
  kl_assert_line(resp.body, "keylane_worker_outbox_published_total 0\n");
  kl_assert_line(resp.body,
                 "keylane_worker_partition_epoch{partition=\"0\"} 1\n");
  kl_assert_line(resp.body,
                 "keylane_worker_partition_lag{partition=\"1\"} 0\n");
  char line[128];
  snprintf(line, sizeof(line),
           "keylane_worker_partition_watermark{partition=\"0\"} %lld\n",
           (long long)kl__ledger_gen_end(gen, 0));
  kl_assert_line(resp.body, line);
  kl_t_http_resp_free(&resp);

  assert_int_equal(kl_get(port, "/healthz", &resp), 0);
  assert_int_equal(resp.status, 200);
  kl_t_http_resp_free(&resp);
  assert_int_equal(kl_get(port, "/nope", &resp), 0);
  assert_int_equal(resp.status, 404);
  kl_t_http_resp_free(&resp);

  /* Another owner takes both partitions: the worker's next commits are
   * fenced and it drops them. */
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_acquire(store, topic, p, &st), KL_OK);
  }
  for (int i = 0; i < 20; i++)
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  int status = 0;
  for (int i = 0; i < 200 && status != 503; i++) {
    kl_t_sleep_ms(100);
    assert_int_equal(kl_get(port, "/healthz", &resp), 0);
    status = resp.status;
    if (status == 503)
      assert_non_null(strstr(resp.body, "fenced"));
    kl_t_http_resp_free(&resp);
  }
  assert_int_equal(status, 503);
  assert_int_equal(kl_get(port, "/metrics", &resp), 0);
  assert_int_equal(kl_t_prom_check(resp.body, err, sizeof(err)), 0);
  assert_null(strstr(resp.body, "keylane_worker_fenced_batches_total 0\n"));
  kl_t_http_resp_free(&resp);

  kl__metrics_server_stop(server);
  kl_t_worker_stop(w);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

/* Connections past the cap are closed; a silent one does not block others. */
static void test_bounds(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "bounds", 1, &cluster), KL_OK);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_t_worker_t *w =
      kl_t_worker_new(kl_t_bootstrap(cluster), kl_t_topic(cluster),
                      kl_t_group(cluster, "gb"), store, kl_fast);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("nohost:1", NULL, "t", w->worker,
                                            store, &server),
                   KL_ECONF);
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL,
                                            kl_t_topic(cluster), w->worker,
                                            store, &server),
                   KL_OK);
  int port = kl__metrics_server_port(server);
  kl_t_http_t *idle[40];
  for (int i = 0; i < 40; i++)
    idle[i] = kl_t_http_open(port);
  kl_t_sleep_ms(200);
  for (int i = 0; i < 40; i++)
    kl_t_http_close(idle[i]);
  kl_t_sleep_ms(200);
  kl_t_http_resp_t resp;
  assert_int_equal(kl_get(port, "/healthz", &resp), 0);
  assert_int_equal(resp.status, 200); /* never fenced: healthy though idle */
  kl_t_http_resp_free(&resp);
  /* 40 idle connections held open must not lock a liveness probe out: a
   * new connection takes the place of the oldest idle one. */
  for (int i = 0; i < 40; i++)
    assert_non_null(idle[i] = kl_t_http_open(port));
  for (int probe = 0; probe < 3; probe++) {
    assert_int_equal(kl_get(port, "/healthz", &resp), 0);
    assert_int_equal(resp.status, 200);
    kl_t_http_resp_free(&resp);
  }
  for (int i = 0; i < 40; i++)
    kl_t_http_close(idle[i]);
  kl__metrics_server_stop(server);
  kl_worker_destroy(w->worker);
  free(w);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

/* A port nobody listens on now (a race with other programs is possible
 * but harmless here: the worker would fail to start and the test say so). */
static int kl_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(addr);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
  getsockname(fd, (struct sockaddr *)&addr, &len);
  close(fd);
  return ntohs(addr.sin_port);
}

/* Polls /healthz until its status is @p want and its body holds @p says
 * (at most @p ms); @returns 0, or -1. */
static int kl_await_health(int port, int want, const char *says, int ms) {
  for (int waited = 0; waited < ms; waited += 100) {
    kl_t_http_resp_t resp;
    int ok = kl_get(port, "/healthz", &resp) == 0 && resp.status == want &&
             resp.body && strstr(resp.body, says);
    kl_t_http_resp_free(&resp);
    if (ok)
      return 0;
    kl_t_sleep_ms(100);
  }
  return -1;
}

static void kl_quiet(const rd_kafka_t *rk, int level, const char *fac,
                     const char *buf) {
  (void)rk, (void)level, (void)fac, (void)buf;
}

/* A worker started while Kafka is down waits with backoff, 503 in /healthz
 * saying for what, and runs once Kafka answers: it used to exit after
 * 10 s, so a fleet restarting with its brokers crash-looped. */
static void test_waits_for_kafka(void **state) {
  char dir[64], errstr[256];
  kl_t_tmpdir(dir);
  rd_kafka_conf_t *mconf = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(mconf, kl_quiet);
  rd_kafka_t *mrk =
      rd_kafka_new(RD_KAFKA_PRODUCER, mconf, errstr, sizeof(errstr));
  rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(mrk, 1);
  assert_non_null(mc);
  rd_kafka_mock_topic_create(mc, "waits", 1, 1);
  rd_kafka_mock_broker_set_down(mc, 1);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  static const char *const conf[] = {
      "worker.session.timeout.ms=3000", "worker.kafka.wait=60s",
      "kafka.reconnect.backoff.max.ms=200", NULL};
  kl_t_worker_t *w = kl_t_worker_new(rd_kafka_mock_cluster_bootstraps(mc),
                                     "waits", "gw", store, conf);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL, "waits",
                                            w->worker, store, &server),
                   KL_OK);
  int port = kl__metrics_server_port(server);
  kl_t_worker_go(w);
  assert_int_equal(kl_await_health(port, 503, "waiting for Kafka", 30000), 0);
  kl_t_http_resp_t resp;
  assert_int_equal(kl_get(port, "/healthz", &resp), 0);
  assert_non_null(strstr(resp.body, "topic waits"));
  assert_non_null(strstr(resp.body, "--kafka-wait"));
  kl_t_http_resp_free(&resp);
  assert_int_equal(kl_get(port, "/livez", &resp), 0);
  assert_int_equal(resp.status, 200); /* waiting is alive: no restart */
  kl_t_http_resp_free(&resp);
  rd_kafka_mock_broker_set_up(mc, 1);
  assert_int_equal(kl_await_health(port, 200, "ok", 60000), 0);
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  /* The bound: past it, the worker gives up and says so. */
  rd_kafka_mock_broker_set_down(mc, 1);
  static const char *const brief[] = {"worker.kafka.wait=1s", NULL};
  w = kl_t_worker_new(rd_kafka_mock_cluster_bootstraps(mc), "waits", "gw2",
                      store, brief);
  kl_t_worker_go(w);
  pthread_join(w->thread, NULL);
  assert_int_equal(w->result, KL_EKAFKA_TRANSIENT);
  assert_non_null(strstr(w->detail, "gave up after waiting 1000 ms"));
  kl_worker_destroy(w->worker);
  free(w);

  /* A stop while it waits ends it at once, with nothing to finish. */
  w = kl_t_worker_new(rd_kafka_mock_cluster_bootstraps(mc), "waits", "gw3",
                      store, conf);
  kl_t_worker_go(w);
  char why[512];
  for (int i = 0; i < 300 && !kl__worker_waiting(w->worker, why, sizeof(why));
       i++)
    kl_t_sleep_ms(100);
  assert_true(kl__worker_waiting(w->worker, why, sizeof(why)));
  int64_t t0 = kl__mono_ns();
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_true(kl__mono_ns() - t0 < 8000000000LL);
  kl_store_destroy(store);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(mrk);
  kl_t_rmrf(dir);
}

/* Holds the worker's loop (inline mode: the commit runs on it) for 11 s
 * at its first commit: past /livez's bound, 10 s at least. */
static atomic_int kl_held;
static void kl_hold_loop(void *opaque, const char *topic, int32_t partition,
                         uint64_t epoch) {
  (void)opaque, (void)topic, (void)partition, (void)epoch;
  if (atomic_exchange(&kl_held, 1) == 0)
    kl_t_sleep_ms(11000);
}

/* /livez, for a liveness probe: 200 while the worker's loop turns, also
 * while /healthz is 503 (a stopped or waiting worker is not fixed by a
 * restart); 503 once the loop has not turned for worker.stall.ms. */
static void test_livez(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "livez", 1, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  static const char *const conf[] = {"worker.session.timeout.ms=3000",
                                     "worker.stall.ms=1000", NULL};
  kl_t_worker_t *w = kl_t_worker_new(kl_t_bootstrap(cluster), topic,
                                     kl_t_group(cluster, "gl"), store, conf);
  kl__worker_set_before_commit(w->worker, kl_hold_loop, NULL);
  kl_conf_t *mconf = kl_conf_new();
  assert_int_equal(kl_conf_set(mconf, "worker.stall.ms", "1000"), KL_OK);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", mconf, topic,
                                            w->worker, store, &server),
                   KL_OK);
  kl_conf_destroy(mconf);
  int port = kl__metrics_server_port(server);
  kl_t_http_resp_t resp;
  assert_int_equal(kl_get(port, "/livez", &resp), 0);
  assert_int_equal(resp.status, 200); /* not running yet: alive */
  kl_t_http_resp_free(&resp);
  kl_t_worker_go(w);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(4, 1, 3);
  kl_producer_t *producer = kl_t_producer(kl_t_bootstrap(cluster), gen);
  assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  int dead = 0;
  for (int i = 0; i < 400 && !dead; i++) {
    assert_int_equal(kl_get(port, "/livez", &resp), 0);
    dead = resp.status == 503 && strstr(resp.body, "has not turned for");
    kl_t_http_resp_free(&resp);
    kl_t_sleep_ms(50);
  }
  assert_true(dead);
  int alive = 0; /* the hold ends: alive again */
  for (int i = 0; i < 200 && !alive; i++) {
    assert_int_equal(kl_get(port, "/livez", &resp), 0);
    alive = resp.status == 200 && strstr(resp.body, "ok: the loop turned");
    kl_t_http_resp_free(&resp);
    kl_t_sleep_ms(50);
  }
  assert_true(alive);
  assert_int_equal(kl_get(port, "/livez", &resp), 0);
  kl_t_http_resp_free(&resp);
  assert_int_equal(kl_t_http_once(port, "POST", "/livez", NULL, NULL, &resp),
                   0);
  assert_int_equal(resp.status, 405);
  kl_t_http_resp_free(&resp);
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

/* `keylane worker --handler exec:... --metrics-listen` as a process. */
static void test_process_exec_and_metrics(void **state) {
  char dir[64], listen[64], log[128];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "proc", 2, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster);
  assert_int_equal(kl_t_cluster_topic_create(cluster, "proc.dlq", 1), KL_OK);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(10, 2, 5);
  kl_producer_t *producer = kl_t_producer(kl_t_bootstrap(cluster), gen);
  for (int i = 0; i < 30; i++)
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  int port = kl_free_port();
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
  snprintf(log, sizeof(log), "%s/worker.log", dir);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(kl_t_bin(), "keylane", "worker", "-b", kl_t_bootstrap(cluster), "-t",
          topic, "-g", kl_t_group(cluster, "gp"), "--store", dir, "--handler",
          "exec:while read -r l; do echo '{\"status\":\"ok\"}'; "
          "done",
          "--handler-timeout-ms", "5000", "--session-timeout-ms", "3000",
          "--metrics-listen", listen, (char *)NULL);
    _exit(127);
  }
  int applied = 0;
  kl_t_http_resp_t resp;
  for (int i = 0; i < 300 && !applied; i++) {
    kl_t_sleep_ms(100);
    if (kl_get(port, "/metrics", &resp) != 0)
      continue;
    applied =
        strstr(resp.body, "keylane_worker_events_applied_total 30\n") != NULL;
    kl_t_http_resp_free(&resp);
  }
  if (!applied)
    fail_msg("the worker did not apply 30 events; see %s", log);
  assert_int_equal(kl_get(port, "/healthz", &resp), 0);
  assert_int_equal(resp.status, 200);
  kl_t_http_resp_free(&resp);
  kill(pid, SIGTERM);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metrics_and_healthz),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_waits_for_kafka),
      cmocka_unit_test(test_livez),
      cmocka_unit_test(test_process_exec_and_metrics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
