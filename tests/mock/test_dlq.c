/*
 * Partitions that must move on (issue 14 item 1):
 * - dead letters Kafka refuses (worker/dlq.h): a record just under the
 *   producer's message.max.bytes fails to decode; its letter, with the
 *   keylane.dlq.* headers, is over the limit and refused for good. No copy
 *   cut short goes instead: the partition waits at the record, saying so,
 *   until a limit that takes the whole letter;
 * - a partition that does not (worker/lanes_stall.h): /healthz answers 503
 *   naming it, and keylane_worker_partition_stalled is 1.
 */
#include <setjmp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "support/cluster.h"
#include "support/kafka_read.h"
#include "support/http.h"
#include "support/support.h"
#include "cli/metrics_server.h"

/* The dead-letter producer gets the worker's kafka.* settings: with
 * message.max.bytes at 100,000 this record fits, its dead letter (the same
 * bytes plus about 300 bytes of headers) not, as a record just under
 * KL_RECORD_MAX does not with the default. */
static const char *const kl_small_max[] = {
    "worker.session.timeout.ms=3000", "kafka.message.max.bytes=100000", NULL};
#define KL_BIG 99800

typedef struct kl_letter {
  size_t key_len, len;
  char truncated[128], reason[32];
  int64_t offset, original_size, original_key_size;
} kl_letter_t;

static void kl_letter_read(void *opaque, const rd_kafka_message_t *m, int i) {
  kl_letter_t *letter = (kl_letter_t *)opaque + i;
  rd_kafka_headers_t *h = NULL;
  rd_kafka_message_headers(m, &h);
  letter->key_len = m->key_len;
  letter->len = m->len;
  kl_t_header(h, "keylane.dlq.truncated", letter->truncated,
              sizeof(letter->truncated));
  kl_t_header(h, "keylane.dlq.reason", letter->reason, sizeof(letter->reason));
  letter->offset = kl_t_header_i64(h, "keylane.dlq.offset");
  letter->original_size = kl_t_header_i64(h, "keylane.dlq.original_size");
  letter->original_key_size =
      kl_t_header_i64(h, "keylane.dlq.original_key_size");
}

/* Reads @p want letters from @p topic, 20 s at most, in origin offset
 * order (they are keyed by the original key: partitions differ). */
static int kl_read_letters(const char *boot, const char *topic,
                           const char *group, kl_letter_t *out, int want) {
  rd_kafka_t *rk = kl_t_consumer(boot, group, topic);
  assert_non_null(rk);
  int n = kl_t_consume(rk, want, 20000, kl_letter_read, out);
  kl_t_consumer_destroy(rk);
  if (n == 2 && out[0].offset > out[1].offset) {
    kl_letter_t first = out[1];
    out[1] = out[0];
    out[0] = first;
  }
  return n;
}

/* @returns 1 once /healthz of @p port answers 503 naming partition 0 as
 * stalled (30 s at most). */
static int kl_stalled_at_0(int port) {
  kl_t_http_resp_t resp = {0};
  int stalled = 0;
  for (int i = 0; i < 300 && !stalled; i++) {
    kl_t_http_resp_free(&resp);
    assert_int_equal(kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &resp),
                     0);
    stalled = resp.status == 503 && resp.body &&
              strstr(resp.body, "partition 0 holds");
    if (!stalled)
      kl_t_sleep_ms(100);
  }
  kl_t_http_resp_free(&resp);
  return stalled;
}

/* A record whose dead letter is over the dead-letter producer's limit: the
 * letter was cut to 1 KiB and the record's tail lost. Now no letter is cut
 * short: the partition waits at the record and says so (/healthz names it
 * stalled), and nothing of it reaches the dead-letter topic; a worker with
 * a limit that takes the letter writes it whole, and the partition moves
 * on. */
static void test_refused_letter_holds_its_partition(void **state) {
  (void)state;
  char dir[64], dlq[160];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "big", 1, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster), *boot = kl_t_bootstrap(cluster);
  char *big = malloc(KL_BIG);
  assert_non_null(big);
  memset(big, 'x', KL_BIG); /* not an envelope: a decode dead letter */
  assert_int_equal(
      kl_t_produce_raw(boot, topic, 0, "big-key", big, KL_BIG, NULL), 0);
  free(big);
  /* The same key: it waits behind the big one. */
  assert_int_equal(kl_t_produce_raw(boot, topic, 0, "big-key", "junk", 4, NULL),
                   0);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  static const char *const held[] = {"worker.session.timeout.ms=3000",
                                     "kafka.message.max.bytes=100000",
                                     "worker.stall.ms=1500", NULL};
  kl_t_worker_t *w =
      kl_t_worker_new(boot, topic, kl_t_group(cluster, "g"), store, held);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", boot), KL_OK);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, topic,
                                            w->worker, store, &server),
                   KL_OK);
  kl_conf_destroy(conf);
  kl_t_worker_go(w);
  assert_true(kl_stalled_at_0(kl__metrics_server_port(server)));
  kl_partition_state_t st = {0};
  kl_store_partition(store, topic, 0, &st);
  assert_int_equal(st.watermark, 0); /* waiting at the big record */
  kl_worker_stats_t ws;
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.dead_letters, 0);
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  /* The default limit takes the letter: it is written whole. */
  w = kl_t_worker_start(
      boot, topic, kl_t_group(cluster, "g"), store,
      (const char *[]){"worker.session.timeout.ms=3000", NULL});
  for (int i = 0; i < 300 && st.watermark < 2; i++) {
    kl_t_sleep_ms(100);
    kl_store_partition(store, topic, 0, &st);
  }
  assert_int_equal(st.watermark, 2); /* past both records */
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.dead_letters, 2);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  kl_letter_t letters[2];
  snprintf(dlq, sizeof(dlq), "%s.dlq", topic);
  assert_int_equal(
      kl_read_letters(boot, dlq, kl_t_group(cluster, "reader"), letters, 2), 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(letters[i].offset, i);
    assert_string_equal(letters[i].reason, "decode");
    assert_string_equal(letters[i].truncated, "");
  }
  assert_int_equal(letters[0].len, KL_BIG); /* whole */
  assert_int_equal(letters[0].key_len, 7);
  assert_int_equal(letters[1].len, 4);
  assert_int_equal(letters[1].key_len, 7);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

static void kl_count_delivered(void *opaque, const kl_delivery_t *d) {
  if (d->err)
    fprintf(stderr, "delivery failed: %s\n", d->errmsg);
  else
    ++*(int *)opaque;
}

/* The broker, not the producer, refuses the letter for good (Kafka's
 * answer when a topic's max.message.bytes is below the producer's limit):
 * no copy cut short follows; the letter is tried again, whole, and goes
 * through once the broker takes it (an operator raised the limit). */
static void test_letter_refused_by_the_broker_is_tried_again(void **state) {
  (void)state;
  char dir[64], errstr[256];
  kl_t_tmpdir(dir);
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  rd_kafka_conf_set(kconf, "log_level", "0", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, kconf, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, 1);
  assert_non_null(mc);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "refused", 1, 1), 0);
  assert_int_equal(rd_kafka_mock_topic_create(mc, "refused.dlq", 1, 1), 0);
  const char *boot = rd_kafka_mock_cluster_bootstraps(mc);
  assert_int_equal(kl_t_produce_raw(boot, "refused", 0, "k", "junk", 4, NULL),
                   0);
  rd_kafka_mock_push_request_errors(mc, 0 /* Produce */, 1,
                                    RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_t_worker_t *w =
      kl_t_worker_start(boot, "refused", "g-refused", store, kl_small_max);
  kl_partition_state_t st = {0};
  for (int i = 0; i < 300 && st.watermark < 1; i++) {
    kl_t_sleep_ms(100);
    kl_store_partition(store, "refused", 0, &st);
  }
  assert_int_equal(st.watermark, 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_letter_t letter;
  assert_int_equal(kl_read_letters(boot, "refused.dlq", "g-reader", &letter, 1),
                   1);
  assert_string_equal(letter.truncated, "");
  assert_int_equal(letter.len, 4);
  kl_store_destroy(store);
  rd_kafka_mock_cluster_destroy(mc);
  rd_kafka_destroy(rk);
  kl_t_rmrf(dir);
}

/* With the defaults, the largest event keylane documents (every field but
 * the headers at its limit) is published; headers that take it over one
 * record are refused by kl_publish() saying why, not by Kafka later. */
static void test_largest_event_is_published(void **state) {
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "max", 1, &cluster), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(cluster)),
      KL_OK);
  kl_producer_t *producer;
  int delivered = 0;
  assert_int_equal(
      kl_producer_new(conf, kl_count_delivered, &delivered, &producer), KL_OK);
  kl_conf_destroy(conf);
  static char key[KL_KEY_MAX], id[KL_ID_MAX], type[KL_TYPE_MAX];
  static char value[KL_HEADER_VALUE_MAX];
  memset(key, 'k', sizeof(key));
  memset(id, 'i', sizeof(id));
  memset(type, 't', sizeof(type));
  memset(value, 'v', sizeof(value));
  char *payload = malloc(KL_PAYLOAD_MAX);
  assert_non_null(payload);
  memset(payload, 'p', KL_PAYLOAD_MAX);
  kl_event_t ev = {.key = key,
                   .key_len = KL_KEY_MAX,
                   .id = id,
                   .id_len = KL_ID_MAX,
                   .type = type,
                   .type_len = KL_TYPE_MAX,
                   .payload = payload,
                   .payload_len = KL_PAYLOAD_MAX};
  const char *topic = kl_t_topic(cluster);
  assert_int_equal(kl_publish(producer, topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  assert_int_equal(delivered, 1);
  kl_header_t h = {"big", 3, value, sizeof(value)};
  ev.headers = &h;
  ev.header_count = 1;
  assert_int_equal(kl_publish(producer, topic, &ev, NULL), KL_EDECODE_OVERSIZE);
  assert_non_null(strstr(kl_err_detail(), "as a Kafka record"));
  free(payload);
  kl_producer_destroy(producer);
  kl_t_cluster_destroy(cluster);
}

static kl_handler_result_t
kl_always_retry(void *opaque, const kl_event_t *event, const kl_fence_t *fence,
                kl_txn_t *txn, char *errbuf, size_t errbuf_size) {
  snprintf(errbuf, errbuf_size, "the test's handler always says retry");
  return KL_HANDLER_RETRY;
}

static void *kl_run(void *opaque) {
  kl_worker_run(opaque);
  return NULL;
}

/* A handler that retries forever holds its partition still: after
 * worker.stall.ms the partition is stalled, in /healthz and /metrics. */
static void test_stalled_partition_is_unhealthy(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "stall", 1, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster), *boot = kl_t_bootstrap(cluster);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(4, 1, 3);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  const char *kv[][2] = {{"kafka.bootstrap.servers", boot},
                         {"worker.group", kl_t_group(cluster, "g")},
                         {"worker.session.timeout.ms", "3000"},
                         {"worker.max.attempts", "1000"},
                         {"worker.retry.initial.ms", "50"},
                         {"worker.retry.max.ms", "100"},
                         {"worker.stall.ms", "1500"}};
  for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
    assert_int_equal(kl_conf_set(conf, kv[i][0], kv[i][1]), KL_OK);
  kl_worker_t *worker;
  assert_int_equal(
      kl_worker_new(conf, topic, store, kl_always_retry, NULL, &worker), KL_OK);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, topic, worker,
                                            store, &server),
                   KL_OK);
  kl_conf_destroy(conf);
  pthread_t thread;
  pthread_create(&thread, NULL, kl_run, worker);
  int port = kl__metrics_server_port(server);
  kl_t_http_resp_t resp = {0};
  for (int i = 0; i < 300; i++) { /* until the group joined and 1.5 s more */
    kl_t_http_resp_free(&resp);
    assert_int_equal(kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &resp),
                     0);
    if (resp.status == 503)
      break;
    kl_t_sleep_ms(100);
  }
  assert_int_equal(resp.status, 503);
  if (!strstr(resp.body, "partition 0 holds 1 records"))
    fail_msg("/healthz does not name the partition: %s", resp.body);
  kl_t_http_resp_free(&resp);
  assert_int_equal(kl_t_http_once(port, "GET", "/metrics", NULL, NULL, &resp),
                   0);
  if (!strstr(resp.body, "keylane_worker_partition_stalled{partition=\"0\"} 1"))
    fail_msg("no stalled gauge in /metrics:\n%s", resp.body);
  kl_t_http_resp_free(&resp);
  kl_worker_stop(worker);
  pthread_join(thread, NULL);
  kl__metrics_server_stop(server);
  kl_worker_destroy(worker);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused_letter_holds_its_partition),
      cmocka_unit_test(test_stalled_partition_is_unhealthy),
      cmocka_unit_test(test_largest_event_is_published),
      cmocka_unit_test(test_letter_refused_by_the_broker_is_tried_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
