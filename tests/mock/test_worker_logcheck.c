/*
 * A log that went backwards or lost records (worker/log_guard.h) on the
 * embedded cluster: a store that outlives its topic stops the partition,
 * counts nothing as redelivered, says so on /healthz and /metrics, and
 * `keylane store reset` (KEYLANE_BIN) starts it again; a worker that lags
 * past retention (the embedded cluster keeps 5 MiB per partition) stops
 * with the count of records lost, or with worker.on.gap=skip goes on and
 * counts them; so does a running worker whose position falls off the log,
 * also when librdkafka's out-of-range error is lost (log_guard.c,
 * guard_watch()); a lane given records below its position counts none as
 * redelivered until the log is checked; `keylane store reset` refuses a
 * partition the store does not know; `keylane doctor`'s check of the logs
 * (kl__check_log()) says the same. The two tests of a topic deleted and
 * created again under the store run in the kafka suite too, where the
 * broker deletes it (kl_t_cluster_topic_recreate()); the others need the
 * embedded cluster's small retention.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "common/kafka_pos.h"
#include "support/cluster.h"
#include "support/http.h"
#include "support/ledger_checks.h"
#include "support/prom.h"
#include "support/support.h"
#include "worker/lanes.h"
#include "worker/log_guard.h"
#include "worker/checks_log.h"
#include "cli/metrics_server.h"
#include "worker/worker_internal.h"
#include "keylane/handlers.h"

typedef kl_t_ledger_fx_t kl_fx_t;

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

/* Partition 0's entry in the worker's log guard; zeroes when it has none. */
static kl__log_guard_stop_t kl_stop_of(kl_t_worker_t *w) {
  kl__log_guard_stop_t stops[4], none = {0};
  size_t n = kl__log_guard_stops(kl__worker_log_guard(w->worker), stops, 4);
  for (size_t i = 0; i < n; i++)
    if (stops[i].partition == 0)
      return stops[i];
  return none;
}

/* Waits up to 30 s until partition 0 is stopped (@p stopped) or not. */
static kl__log_guard_stop_t kl_wait_stop(kl_t_worker_t *w, int stopped) {
  kl__log_guard_stop_t s = kl_stop_of(w);
  for (int i = 0; i < 600 && s.stopped != stopped; i++) {
    kl_t_sleep_ms(50);
    s = kl_stop_of(w);
  }
  assert_int_equal(s.stopped, stopped);
  return s;
}

/* Waits up to 30 s until the store applied partition 0 up to @p end. */
static void kl_wait_watermark(kl_store_t *store, const char *topic,
                              int64_t end) {
  kl_partition_state_t st = {0};
  for (int i = 0; i < 600 && st.watermark < end; i++) {
    kl_t_sleep_ms(50);
    assert_int_equal(kl_store_partition(store, topic, 0, &st), KL_OK);
  }
  assert_int_equal(st.watermark, end);
}

static kl__metrics_server_t *kl_serve(kl_t_worker_t *w, kl_fx_t *fx,
                                      int *port) {
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL, fx->topic,
                                            w->worker, fx->store, &server),
                   KL_OK);
  *port = kl__metrics_server_port(server);
  return server;
}

/* GET @p path: asserts @p status and that the body holds @p text. */
static void kl_assert_get(int port, const char *path, int status,
                          const char *text) {
  kl_t_http_resp_t resp;
  memset(&resp, 0, sizeof(resp));
  assert_int_equal(kl_t_http_once(port, "GET", path, NULL, NULL, &resp), 0);
  char err[256];
  if (strcmp(path, "/metrics") == 0 &&
      kl_t_prom_check(resp.body, err, sizeof(err)) != 0)
    fail_msg("/metrics does not parse: %s\n%s", err, resp.body);
  if (resp.status != status || !strstr(resp.body, text))
    fail_msg("GET %s: %d, expected %d with \"%s\":\n%s", path, resp.status,
             status, text, resp.body);
  kl_t_http_resp_free(&resp);
}

/* A client of the cluster at @p boot, for offset queries. */
static rd_kafka_t *kl_client(const char *boot) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", boot, errstr, sizeof(errstr));
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  return rk;
}

/* What `keylane doctor` says of partition 0's log (kl__check_log()):
 * asserts @p status and that the message holds @p text. */
static void kl_assert_doctor(kl_fx_t *fx, kl__check_status_t status,
                             const char *text) {
  rd_kafka_t *rk = kl_client(fx->boot);
  kl__check_t check;
  kl__check_log(rk, fx->store, fx->topic, 1, 10000, &check);
  rd_kafka_destroy(rk);
  if (check.status != status || !strstr(check.msg, text))
    fail_msg("kl__check_log: %s %s, expected %s with \"%s\"",
             kl__check_status_name(check.status), check.msg,
             kl__check_status_name(status), text);
}

/* Asserts that partition 0's epoch in the store is still @p old's: a
 * worker that found another log than its store's took none, so that it
 * fenced nobody (the store's owner may be applying the right log, on
 * another cluster). */
static void kl_assert_epoch_kept(kl_fx_t *fx, const kl_partition_state_t *old) {
  kl_partition_state_t now;
  assert_int_equal(kl_store_partition(fx->store, fx->topic, 0, &now), KL_OK);
  assert_int_equal(now.epoch, old->epoch);
  assert_int_equal(now.watermark, old->watermark);
}

/* A worker of group "g" on the fixture's topic. */
static kl_t_worker_t *kl_start(kl_fx_t *fx) {
  return kl_t_worker_start(fx->boot, fx->topic, kl_t_group(fx->cluster, "g"),
                           fx->store, kl_fast);
}

/* Deletes the fixture's topic @p base, creates it again and publishes
 * @p events events of another generator to it: a new log under the
 * store of the old one. */
static void kl_replace_log(kl_fx_t *fx, const char *base, int events) {
  kl_producer_destroy(fx->producer);
  kl__ledger_gen_destroy(fx->gen);
  assert_int_equal(kl_t_cluster_topic_recreate(&fx->cluster, base, 1), KL_OK);
  fx->boot = kl_t_bootstrap(fx->cluster);
  fx->topic = kl_t_topic(fx->cluster);
  fx->gen = kl__ledger_gen_new(20, 1, 6);
  fx->producer = kl_t_producer(fx->boot, fx->gen);
  for (int i = 0; i < events; i++)
    assert_int_equal(kl__ledger_gen_publish(fx->gen, fx->producer, fx->topic),
                     KL_OK);
  assert_int_equal(kl_flush(fx->producer, 30000), KL_OK);
}

/* The cluster is rebuilt under the store: the topic of the same name
 * starts over at offset 0 and holds 10 new events, all below the store's
 * watermark of the old topic. */
static void test_store_outlives_its_topic(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "reborn", 1, 20, 5, NULL);
  kl_t_ledger_fx_publish(&fx, 30); /* 33 records: 3 re-published */
  kl_t_worker_t *w = kl_start(&fx);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_partition_state_t old;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &old), KL_OK);
  assert_int_equal(old.watermark, 33);

  kl_replace_log(&fx, "reborn", 10);

  w = kl_start(&fx);
  int port;
  kl__metrics_server_t *server = kl_serve(w, &fx, &port);
  kl__log_guard_stop_t s = kl_wait_stop(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_BACKWARDS);
  kl_assert_epoch_kept(&fx, &old);
  assert_int_equal(s.check.watermark, 33);
  assert_int_equal(s.check.low, 0);
  assert_int_equal(s.check.high, 10);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 0);
  assert_int_equal(st.redelivered, 0);
  char text[512];
  snprintf(text, sizeof(text),
           "stopped partition 0: topic %s partition 0 went backwards: its "
           "log ends at offset 10, below the store's watermark 33",
           fx.topic);
  kl_assert_get(port, "/healthz", 503, text);
  kl_assert_doctor(&fx, KL__CHECK_FAIL, strstr(text, "topic "));
  snprintf(text, sizeof(text),
           "keylane_worker_partition_stopped{topic=\"%s\",partition=\"0\","
           "reason=\"went_backwards\"} 1\n",
           fx.topic);
  kl_assert_get(port, "/metrics", 200, text);

  /* The operator's word: the new log is the one to apply. */
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "%s store reset -t %s -p 0 --store %s > %s/reset.out", kl_t_bin(),
           fx.topic, fx.where, fx.dir);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof(cmd),
           "grep -q 'watermark 33 -> 0, epoch %" PRIu64 " -> %" PRIu64
           "' %s/reset.out",
           old.epoch, old.epoch + 1, fx.dir);
  assert_int_equal(system(cmd), 0);
  kl_wait_stop(w, 0);
  kl_wait_watermark(fx.store, fx.topic, 10);
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 10);
  assert_int_equal(st.redelivered, 0);
  kl_assert_get(port, "/healthz", 200, "ok");
  kl_assert_doctor(&fx, KL__CHECK_OK, "hold the store's watermarks");
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_partition_state_t now;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &now), KL_OK);
  assert_int_equal(now.applied, old.applied + 10);
  kl_t_ledger_fx_down(&fx);
}

/* The cluster is rebuilt under the store, and the topic of the same name
 * holds MORE records than the store's watermark: no offset tells, but the
 * record at the watermark - 1 is another one than the store applied there
 * (issue 27). The partition stops (reason log_replaced), nothing of the
 * new log is skipped as applied, and `keylane store reset` starts it. */
static void test_store_outlives_a_longer_topic(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "replaced", 1, 20, 5, NULL);
  kl_t_ledger_fx_publish(&fx, 30); /* 33 records: 3 re-published */
  kl_t_worker_t *w = kl_start(&fx);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  /* A worker that takes it again on the same log reads the record before
   * the watermark, finds the one the store applied, and goes on. */
  kl_t_ledger_fx_publish(&fx, 5);
  w = kl_start(&fx);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  assert_int_equal(kl_stop_of(w).stopped, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_partition_state_t old;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &old), KL_OK);
  assert_true(old.watermark >= 38);

  kl_replace_log(&fx, "replaced", 60);

  w = kl_start(&fx);
  int port;
  kl__metrics_server_t *server = kl_serve(w, &fx, &port);
  kl__log_guard_stop_t s = kl_wait_stop(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_REPLACED);
  kl_assert_epoch_kept(&fx, &old);
  assert_int_equal(s.check.watermark, old.watermark);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 0);
  char text[512];
  snprintf(text, sizeof(text),
           "topic %s partition 0 holds another log than the one the store "
           "applied",
           fx.topic);
  kl_assert_get(port, "/healthz", 503, text);
  snprintf(text, sizeof(text),
           "keylane_worker_partition_stopped{topic=\"%s\",partition=\"0\","
           "reason=\"log_replaced\"} 1\n",
           fx.topic);
  kl_assert_get(port, "/metrics", 200, text);
  /* doctor reads that record too */
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                   KL_OK);
  rd_kafka_t *rk;
  assert_int_equal(kl__kafka_reader_new(conf, "doctor", "earliest", &rk),
                   KL_OK);
  kl_conf_destroy(conf);
  kl__check_t check;
  kl__check_log(rk, fx.store, fx.topic, 1, 10000, &check);
  rd_kafka_destroy(rk);
  if (check.status != KL__CHECK_FAIL || !strstr(check.msg, "another log"))
    fail_msg("kl__check_log: %s %s", kl__check_status_name(check.status),
             check.msg);

  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s store reset -t %s -p 0 --store %s", kl_t_bin(),
           fx.topic, fx.where);
  assert_int_equal(system(cmd), 0);
  kl_wait_stop(w, 0);
  kl_wait_watermark(fx.store, fx.topic, 60);
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 60); /* none taken for one already applied */
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* A ledger event of @p key and @p seq carrying @p pad bytes of filler the
 * handler ignores: {"amount": 1, "seq": seq, "pad": bin}. */
static void kl_publish_padded(kl_producer_t *producer, const char *topic,
                              const char *key, int64_t seq, size_t pad) {
  static unsigned char buf[16384];
  size_t n = 0;
  buf[n++] = 0x83;
  const char *names[] = {"amount", "seq"};
  int64_t values[] = {1, seq};
  for (int f = 0; f < 2; f++) {
    size_t len = strlen(names[f]);
    buf[n++] = (unsigned char)(0xa0 | len);
    memcpy(buf + n, names[f], len);
    n += len;
    buf[n++] = 0xd3;
    for (int i = 7; i >= 0; i--)
      buf[n++] = (unsigned char)((uint64_t)values[f] >> (8 * i));
  }
  memcpy(buf + n, "\xa3pad\xc5", 5);
  n += 5;
  buf[n++] = (unsigned char)(pad >> 8);
  buf[n++] = (unsigned char)pad;
  for (size_t i = 0; i < pad; i++) /* incompressible */
    buf[n++] = (unsigned char)rand();
  kl_event_t e = {.key = key,
                  .key_len = strlen(key),
                  .type = "credit",
                  .type_len = 6,
                  .payload = buf,
                  .payload_len = n};
  assert_int_equal(kl_publish(producer, topic, &e, NULL), KL_OK);
}

/* The retained log of partition 0 of @p topic: [*low, *high). */
static void kl_log_range(const char *boot, const char *topic, int64_t *low,
                         int64_t *high) {
  rd_kafka_t *rk = kl_client(boot);
  assert_int_equal(
      rd_kafka_query_watermark_offsets(rk, topic, 0, low, high, 10000),
      RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(rk);
}

/* A worker stopped while 6 MiB arrive: the embedded cluster keeps 5 MiB
 * per partition, so the records after the store's watermark are deleted
 * before any worker applied them. */
static void test_lag_past_retention(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "lagging", 1, 20, 8, NULL);
  kl_t_ledger_fx_publish(&fx, 20); /* 22 records */
  kl_t_worker_t *w = kl_start(&fx);
  kl_wait_watermark(fx.store, fx.topic, 22);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                   KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  for (int i = 0; i < 750; i++)
    kl_publish_padded(producer, fx.topic, "filler", i + 1, 8192);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
  int64_t low, high;
  kl_log_range(fx.boot, fx.topic, &low, &high);
  assert_int_equal(high, 22 + 750);
  assert_true(low > 22);

  /* By default the partition stops, saying how many records were lost,
   * before it takes an epoch. */
  kl_partition_state_t old;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &old), KL_OK);
  w = kl_start(&fx);
  kl__log_guard_stop_t s = kl_wait_stop(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_GAP);
  kl_assert_epoch_kept(&fx, &old);
  assert_int_equal(s.check.watermark, 22);
  assert_int_equal(s.check.lost, low - 22);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 0);
  assert_int_equal(st.redelivered, 0);
  int port;
  kl__metrics_server_t *server = kl_serve(w, &fx, &port);
  char text[256];
  snprintf(text, sizeof(text),
           "topic lagging partition 0 lost %" PRId64
           " records: its log starts at offset %" PRId64,
           low - 22, low);
  kl_assert_get(port, "/healthz", 503, text);
  kl_assert_doctor(&fx, KL__CHECK_FAIL, text);
  kl_assert_get(port, "/metrics", 200,
                "keylane_worker_partition_stopped{topic=\"lagging\","
                "partition=\"0\",reason=\"retention_gap\"} 1\n");
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  /* worker.on.gap=skip goes on from the log's start and counts them. */
  static const char *const skip[] = {"worker.session.timeout.ms=3000",
                                     "worker.on.gap=skip", NULL};
  w = kl_t_worker_start(fx.boot, fx.topic, kl_t_group(fx.cluster, "g"),
                        fx.store, skip);
  server = kl_serve(w, &fx, &port);
  kl_wait_watermark(fx.store, fx.topic, high);
  s = kl_stop_of(w);
  assert_int_equal(s.stopped, 0);
  assert_int_equal(s.gap_records, (uint64_t)(low - 22));
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, (uint64_t)(high - low));
  assert_int_equal(st.redelivered, 0);
  kl_assert_get(port, "/healthz", 200, "ok");
  snprintf(text, sizeof(text),
           "keylane_worker_gap_records_total{topic="
           "\"lagging\",partition=\"0\"} %" PRId64 "\n",
           low - 22);
  kl_assert_get(port, "/metrics", 200, text);
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* Holds every event's handler call while set: the lane's window fills
 * and the worker pauses its partition. */
static atomic_int kl_hold;

static kl_handler_result_t kl_held(void *opaque, const kl_event_t *event,
                                   const kl_fence_t *fence, kl_txn_t *txn,
                                   char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)event, (void)fence, (void)txn, (void)errbuf,
      (void)errbuf_size;
  while (atomic_load(&kl_hold))
    kl_t_sleep_ms(10);
  return KL_HANDLER_OK;
}

/* Starts a worker with @p extra whose handler is held (kl_hold) from its
 * first event, offset 0, on; then 6 MiB arrive, so that the log starts
 * past offset 1. @returns the worker; *@p low and *@p high the log's
 * offsets. */
static kl_t_worker_t *kl_held_behind(kl_fx_t *fx, const char *const *extra,
                                     int64_t *low, int64_t *high) {
  atomic_store(&kl_hold, 1);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx->boot, fx->topic, kl_t_group(fx->cluster, "g"),
                           fx->store, extra, kl_held, NULL);
  kl_t_worker_go(w);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  kl_publish_padded(producer, fx->topic, "first", 1, 8192);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && st.owned == 0; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  assert_int_equal(st.owned, 1);
  for (int i = 0; i < 750; i++)
    kl_publish_padded(producer, fx->topic, "filler", i + 2, 8192);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
  kl_log_range(fx->boot, fx->topic, low, high);
  assert_int_equal(*high, 751);
  assert_true(*low > 1);
  return w;
}

/* A running worker falls behind past retention (a benchmark publishing
 * more than the embedded cluster keeps): its handler is held, its window
 * fills and the partition pauses while 6 MiB arrive. When the handler
 * goes on, the consumer's position is out of the log, and the partition
 * stops saying so (/healthz, /metrics). */
static void test_running_worker_falls_off_the_log(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "falling", 1, 20, 12, NULL);
  static const char *const small[] = {"worker.session.timeout.ms=3000",
                                      "worker.window.max=16",
                                      "worker.concurrency=2", NULL};
  int64_t low, high;
  kl_t_worker_t *w = kl_held_behind(&fx, small, &low, &high);
  atomic_store(&kl_hold, 0);
  int port;
  kl__metrics_server_t *server = kl_serve(w, &fx, &port);
  kl__log_guard_stop_t s = kl_wait_stop(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_GAP);
  kl_assert_get(port, "/healthz", 503, "topic falling partition 0 lost");
  kl_assert_get(port, "/metrics", 200,
                "keylane_worker_partition_stopped{topic=\"falling\","
                "partition=\"0\",reason=\"retention_gap\"} 1\n");
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* Moves the worker's consumer of partition 0 to @p offset, from this
 * thread. */
static void kl_consumer_seek(kl_t_worker_t *w, const char *topic,
                             int64_t offset) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, 0)->offset = offset;
  rd_kafka_error_t *error =
      rd_kafka_seek_partitions(kl__worker_consumer(w->worker), l, 10000);
  assert_null(error);
  rd_kafka_topic_partition_list_destroy(l);
}

/* Takes the out-of-range error librdkafka queued for the worker's
 * consumer, from this thread, so that the worker never reads it.
 * @returns the offset it names. */
static int64_t kl_steal_out_of_range(kl_t_worker_t *w) {
  rd_kafka_t *rk = kl__worker_consumer(w->worker);
  for (int i = 0; i < 100; i++) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    int64_t offset = m ? m->offset : -1;
    int found = m && m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET;
    if (m)
      rd_kafka_message_destroy(m);
    if (found)
      return offset;
  }
  fail_msg("no out-of-range error was queued in 10 s");
  return -1;
}

/* librdkafka 2.0 stops fetching a partition whose position is out of its
 * log and queues an error for the application, and a pause before the
 * application read it can purge it (log_guard.c, guard_watch()): the
 * worker then never heard, and sat silent. Here the loss is made
 * certain: the poll thread of a worker with @p extra is held in a handler
 * (kl_held_behind()), its consumer is moved to offset 1, deleted (a
 * fetcher that fell behind), and the error is taken away. @returns the
 * worker, running again; *@p low and *@p high the log's offsets. */
static kl_t_worker_t *kl_lose_out_of_range(kl_fx_t *fx,
                                           const char *const *extra,
                                           int64_t *low, int64_t *high) {
  kl_t_worker_t *w = kl_held_behind(fx, extra, low, high);
  kl_consumer_seek(w, fx->topic, 1); /* deleted: the fetch fails */
  assert_int_equal(kl_steal_out_of_range(w), 1);
  atomic_store(&kl_hold, 0);
  return w;
}

/* The partition still stops, saying why: the log, /healthz, /metrics. */
static void test_lost_out_of_range_error_still_stops(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "silent", 1, 20, 13, NULL);
  int64_t low, high;
  kl_t_worker_t *w = kl_lose_out_of_range(&fx, kl_fast, &low, &high);
  int port;
  kl__metrics_server_t *server = kl_serve(w, &fx, &port);
  kl__log_guard_stop_t s = kl_wait_stop(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_GAP);
  assert_int_equal(s.check.watermark, 1);
  assert_true(s.check.low >= low);
  char text[256];
  snprintf(text, sizeof(text),
           "topic silent partition 0 lost %" PRId64
           " records: its log starts at offset %" PRId64,
           s.check.low - 1, s.check.low);
  kl_assert_get(port, "/healthz", 503, text);
  kl_assert_get(port, "/metrics", 200,
                "keylane_worker_partition_stopped{topic=\"silent\","
                "partition=\"0\",reason=\"retention_gap\"} 1\n");
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* With worker.on.gap=skip the partition goes on from the log's start,
 * fetched again, and counts the records lost. */
static void test_lost_out_of_range_error_skips(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "silentskip", 1, 20, 14, NULL);
  static const char *const skip[] = {"worker.session.timeout.ms=3000",
                                     "worker.on.gap=skip", NULL};
  int64_t low, high;
  kl_t_worker_t *w = kl_lose_out_of_range(&fx, skip, &low, &high);
  kl_wait_watermark(fx.store, fx.topic, high);
  kl__log_guard_stop_t s = kl_stop_of(w);
  assert_int_equal(s.stopped, 0);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(s.gap_records + st.applied, (uint64_t)high);
  assert_true(s.gap_records >= (uint64_t)(low - 1));
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* Reads @p n records of partition 0 of @p topic from offset 0.
 * @returns the consumer: destroy it once every record is destroyed. */
static rd_kafka_t *kl_read_records(const char *boot, const char *topic,
                                   rd_kafka_message_t **out, int n) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", boot, errstr, sizeof(errstr));
  rd_kafka_conf_set(c, "group.id", "reader", errstr, sizeof(errstr));
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, 0)->offset = 0;
  assert_int_equal(rd_kafka_assign(rk, l), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(l);
  int got = 0;
  for (int t = 0; t < 300 && got < n; t++) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (m && !m->err)
      out[got++] = m;
    else if (m)
      rd_kafka_message_destroy(m);
  }
  assert_int_equal(got, n);
  return rk;
}

/* Records below a lane's position are noted for the log check, never
 * counted as redelivered before it: they may be a new log's records. */
static void test_lane_counts_nothing_below_its_position(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "below", 1, 20, 9, NULL);
  for (int i = 0; i < 8; i++)
    assert_int_equal(kl__ledger_gen_publish(fx.gen, fx.producer, fx.topic),
                     KL_OK);
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  rd_kafka_message_t *m[8];
  rd_kafka_t *reader = kl_read_records(fx.boot, fx.topic, m, 8);

  kl_conf_t *conf = kl_conf_new();
  kl__applier_t applier = {
      .store = fx.store, .topic = fx.topic, .handler = kl_ledger_handler};
  kl__lanes_t *lanes;
  assert_int_equal(kl__lanes_new(conf, &applier, NULL, NULL, &lanes), KL_OK);
  kl__lanes_own(lanes, 0, 1, 5);  /* the store applied 0..4 */
  kl__lanes_push(lanes, m[6], 0); /* next_offset 7 */
  for (int i = 0; i < 6; i++)     /* 0..4 below the watermark, 5 in between */
    kl__lanes_push(lanes, m[i], 0);
  kl__lanes_push(lanes, m[7], 0);
  kl_worker_stats_t st;
  kl__lanes_stats(lanes, &st);
  assert_int_equal(st.redelivered, 0);
  int32_t below[4];
  assert_int_equal(kl__lanes_below(lanes, below, 4), 1);
  assert_int_equal(below[0], 0);
  kl__lane_pos_t pos;
  assert_int_equal(kl__lanes_pos(lanes, 0, &pos), 0);
  assert_int_equal(pos.watermark, 5);
  assert_int_equal(pos.next_offset, 8);
  assert_int_equal(pos.below, 0);
  assert_int_equal(pos.below_applied, 5);
  assert_int_equal(kl__lanes_below(lanes, below, 4), 0); /* read once */
  /* Once the log is seen to hold the position, they were redeliveries. */
  kl__lanes_halt(lanes, 0);
  kl__lanes_go_on(lanes, 0, pos.next_offset, pos.below_applied);
  kl__lanes_stats(lanes, &st);
  assert_int_equal(st.redelivered, 5);
  kl__lanes_destroy(lanes); /* and the record it held */
  rd_kafka_consumer_close(reader);
  rd_kafka_destroy(reader);
  kl_conf_destroy(conf);
  kl_t_ledger_fx_down(&fx);
}

/* Runs `keylane store reset ARGS`; @returns its exit code, its output in
 * @p out (stdout and stderr). */
static int kl_reset_cli(const char *args, char *out, size_t size) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s store reset %s 2>&1", kl_t_bin(), args);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, size - 1, f);
  out[n] = '\0';
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A partition the store does not know is refused and nothing is reset;
 * `all` is every partition the store knows; --json says what it did. */
static void test_store_reset_cli(void **state) {
  char dir[64], args[256], out[2048];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  for (int32_t p = 0; p < 3; p += 2) { /* partitions 0 and 2 */
    kl_partition_state_t st;
    kl_txn_t *txn;
    assert_int_equal(kl_store_acquire(store, "events", p, &st), KL_OK);
    assert_int_equal(kl_store_begin(store, "events", p, st.epoch, &txn), KL_OK);
    assert_int_equal(kl_store_commit(txn, 40 + p), KL_OK);
  }
  snprintf(args, sizeof(args), "-t events -p 0-2 --store %s", dir);
  assert_int_equal(kl_reset_cli(args, out, sizeof(out)), 1);
  assert_non_null(strstr(out, "the store has no state for topic events "
                              "partition 1: nothing was reset"));
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(store, "events", 0, &st), KL_OK);
  assert_int_equal(st.watermark, 40);
  snprintf(args, sizeof(args), "-t other -p all --store %s", dir);
  assert_int_equal(kl_reset_cli(args, out, sizeof(out)), 1);
  assert_non_null(strstr(out, "has no partition of topic other"));
  /* --dry-run says what a reset would change, and changes nothing. */
  snprintf(args, sizeof(args), "-t events -p 2 --store %s --dry-run", dir);
  assert_int_equal(kl_reset_cli(args, out, sizeof(out)), 0);
  if (!strstr(out, "would reset topic events partition 2: watermark 42 -> 0, "
                   "epoch 1 -> 2") ||
      !strstr(out, "nothing was reset"))
    fail_msg("--dry-run: %s", out);
  snprintf(args, sizeof(args), "-t events -p all --store %s --dry-run --json",
           dir);
  assert_int_equal(kl_reset_cli(args, out, sizeof(out)), 0);
  assert_non_null(strstr(out, "{\"topic\":\"events\",\"dry_run\":true,"
                              "\"reset\":[{\"partition\":0,\"epoch_before\":1,"
                              "\"epoch\":2,\"watermark_before\":40,"
                              "\"watermark\":0},"));
  for (int32_t p = 0; p < 3; p += 2) {
    assert_int_equal(kl_store_partition(store, "events", p, &st), KL_OK);
    assert_int_equal(st.watermark, 40 + p);
    assert_int_equal(st.epoch, 1);
  }
  snprintf(args, sizeof(args), "-t events -p all --store %s --json", dir);
  assert_int_equal(kl_reset_cli(args, out, sizeof(out)), 0);
  assert_string_equal(out, "{\"topic\":\"events\",\"dry_run\":false,"
                           "\"reset\":["
                           "{\"partition\":0,\"epoch_before\":1,\"epoch\":2,"
                           "\"watermark_before\":40,\"watermark\":0},"
                           "{\"partition\":2,\"epoch_before\":1,\"epoch\":2,"
                           "\"watermark_before\":42,\"watermark\":0}]}\n");
  assert_int_equal(kl_store_partition(store, "events", 2, &st), KL_OK);
  assert_int_equal(st.watermark, 0);
  assert_int_equal(st.epoch, 2);
  assert_int_equal(kl_reset_cli("-t events", out, sizeof(out)), 2);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* The worker must hear of a position outside the log: a setting that
 * would move it silently is refused, naming the fix. */
static void test_refuses_silent_offset_reset(void **state) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "kafka.auto.offset.reset", "earliest"),
                   KL_OK);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_worker_t *w = NULL;
  assert_int_equal(kl_worker_new(conf, "t", store, kl_ledger_handler, NULL, &w),
                   KL_ECONF);
  assert_null(w);
  assert_non_null(strstr(kl_err_detail(), "kafka.auto.offset.reset=earliest: "
                                          "the worker resumes from the store's "
                                          "watermark"));
  kl_store_destroy(store);
  kl_conf_destroy(conf);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest recreated[] = {
      cmocka_unit_test(test_store_outlives_its_topic),
      cmocka_unit_test(test_store_outlives_a_longer_topic),
  };
  const char *real = getenv("KEYLANE_TEST_BOOTSTRAP");
  if (real && *real) /* the kafka suite: DeleteTopics on a real broker */
    return cmocka_run_group_tests(recreated, NULL, NULL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store_outlives_its_topic),
      cmocka_unit_test(test_store_outlives_a_longer_topic),
      cmocka_unit_test(test_lag_past_retention),
      cmocka_unit_test(test_running_worker_falls_off_the_log),
      cmocka_unit_test(test_lost_out_of_range_error_still_stops),
      cmocka_unit_test(test_lost_out_of_range_error_skips),
      cmocka_unit_test(test_lane_counts_nothing_below_its_position),
      cmocka_unit_test(test_store_reset_cli),
      cmocka_unit_test(test_refuses_silent_offset_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
