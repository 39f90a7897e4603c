/*
 * The producer on the embedded cluster: a round trip read back by a plain
 * librdkafka consumer in another process (a consumer group over TCP, as the
 * worker fleet uses it), generated ids, the partition-count check, the
 * in-flight budget, delivery failures, and the embedded cluster's API.
 *
 * The consumer runs in a child that re-executes this binary with
 * --child-consume: fork() then exec() is safe with librdkafka's threads
 * running, and the child is a process of its own, like a worker.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "keylane/embedded.h"
#include "keylane/producer.h"
#include "support/kafka_read.h"

#define KL_RT_EVENTS 600

typedef struct kl_rec {
  int delivered;
  kl_err_t err;
  int32_t partition;
  int64_t offset;
  char id[KL_ID_MAX + 1];
} kl_rec_t;

typedef struct kl_recs {
  kl_rec_t *rec;
  size_t count;
  int reports;
} kl_recs_t;

static void kl_t_dr(void *cb_opaque, const kl_delivery_t *d) {
  kl_recs_t *recs = cb_opaque;
  size_t i = (size_t)(uintptr_t)d->opaque;
  assert_true(i < recs->count);
  kl_rec_t *r = &recs->rec[i];
  assert_int_equal(strlen(d->id), d->id_len); /* NUL terminated */
  r->delivered++;
  r->err = d->err;
  r->partition = d->partition;
  r->offset = d->offset;
  memcpy(r->id, d->id, d->id_len + 1);
  if (d->err)
    assert_non_null(d->errmsg);
  recs->reports++;
}

static kl_recs_t *kl_recs_new(size_t count) {
  kl_recs_t *recs = calloc(1, sizeof(*recs));
  assert_non_null(recs);
  recs->rec = calloc(count, sizeof(*recs->rec));
  assert_non_null(recs->rec);
  recs->count = count;
  return recs;
}

static void kl_recs_destroy(kl_recs_t *recs) {
  free(recs->rec);
  free(recs);
}

/* A producer for @p bootstrap; @p extra: "key", "value" pairs, NULL-ended. */
static kl_producer_t *kl_rec_producer(const char *bootstrap, kl_recs_t *recs,
                                      const char *const *extra) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap),
                   KL_OK);
  for (; extra && extra[0]; extra += 2)
    if (kl_conf_set(conf, extra[0], extra[1]))
      fail_msg("%s", kl_err_detail());
  kl_producer_t *producer;
  kl_err_t err = kl_producer_new(conf, kl_t_dr, recs, &producer);
  if (err)
    fail_msg("kl_producer_new: %s", kl_err_detail());
  kl_conf_destroy(conf);
  return producer;
}

/* @returns @p topic's partition count, asserting that it could be read and
 * that a call that succeeded left no error detail behind. */
static int32_t kl_t_partitions(kl_producer_t *producer, const char *topic) {
  int32_t count = -1;
  kl_err_t err = kl_producer_partitions(producer, topic, &count);
  if (err)
    fail_msg("kl_producer_partitions %s: %s", topic, kl_err_detail());
  assert_string_equal(kl_err_detail(), "");
  return count;
}

static kl_event_t kl_t_event(const char *key, const char *type) {
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .type = type,
                   .type_len = strlen(type)};
  return ev;
}

/* ---- the child: a plain group consumer printing what it reads ---- */

static void kl_child_print(const rd_kafka_message_t *m) {
  printf("%d %lld %.*s ", (int)m->partition, (long long)m->offset,
         (int)m->key_len, (const char *)m->key);
  const unsigned char *p = m->payload;
  for (size_t i = 0; i < m->len; i++)
    printf("%02x", p[i]);
  printf("\n");
}

static int kl_child_consume(const char *bootstrap, const char *topic,
                            const char *group, int want) {
  rd_kafka_t *rk = kl_t_consumer(bootstrap, group, topic);
  if (!rk)
    return 3;
  int got = 0;
  time_t deadline = time(NULL) + 40;
  while (got < want && time(NULL) < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (m && !m->err) {
      kl_child_print(m);
      got++;
    }
    if (m)
      rd_kafka_message_destroy(m);
  }
  fflush(stdout);
  kl_t_consumer_destroy(rk);
  return got == want ? 0 : 4;
}

/* Runs the child; returns its stdout as a FILE to read, and its pid. */
static FILE *kl_child_start(const char *bootstrap, const char *topic,
                            const char *group, int want, pid_t *pid) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  char want_s[16];
  snprintf(want_s, sizeof(want_s), "%d", want);
  *pid = fork();
  assert_true(*pid >= 0);
  if (*pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl("/proc/self/exe", "test_producer", "--child-consume", bootstrap,
          topic, group, want_s, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *out = fdopen(fds[0], "r");
  assert_non_null(out);
  return out;
}

static int kl_child_wait(pid_t pid) {
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* ---- round trip ---- */

typedef struct kl_rt_line {
  int partition;
  long long offset;
  char key[64];
  unsigned char value[4096];
  size_t value_len;
} kl_rt_line_t;

static int kl_rt_parse(const char *line, kl_rt_line_t *out) {
  char hex[8200];
  if (sscanf(line, "%d %lld %63s %8199s", &out->partition, &out->offset,
             out->key, hex) != 4)
    return -1;
  out->value_len = strlen(hex) / 2;
  for (size_t i = 0; i < out->value_len; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    out->value[i] = (unsigned char)v;
  }
  return 0;
}

static void kl_rt_publish(kl_producer_t *producer, size_t n) {
  kl_header_t header = {"source", 6, "test", 4};
  for (size_t i = 0; i < n; i++) {
    char key[32], id[32], payload[32];
    snprintf(key, sizeof(key), "acct-%zu", i);
    snprintf(id, sizeof(id), "given-%zu", i);
    int plen = snprintf(payload, sizeof(payload), "payload %zu", i);
    kl_event_t ev = kl_t_event(key, "credit");
    ev.payload = payload;
    ev.payload_len = (size_t)plen;
    if (i % 2) { /* odd: the caller's id and header; even: generated */
      ev.id = id;
      ev.id_len = strlen(id);
      ev.headers = &header;
      ev.header_count = 1;
    }
    if (kl_publish(producer, "rt", &ev, (void *)(uintptr_t)i) != KL_OK)
      fail_msg("publish %zu: %s", i, kl_err_detail());
  }
}

static void kl_rt_check(const kl_rt_line_t *l, kl_recs_t *recs,
                        kl_decoder_t *decoder) {
  size_t i;
  assert_int_equal(sscanf(l->key, "acct-%zu", &i), 1);
  assert_true(i < recs->count);
  const kl_rec_t *r = &recs->rec[i];
  assert_int_equal(r->partition, l->partition);
  assert_int_equal(r->offset, l->offset);
  assert_int_equal(l->partition, kl_partition(l->key, strlen(l->key), 6));
  kl_event_t ev;
  if (kl_event_decode(decoder, l->key, strlen(l->key), l->value, l->value_len,
                      &ev) != KL_OK)
    fail_msg("decode %s: %s", l->key, kl_err_detail());
  char payload[32];
  snprintf(payload, sizeof(payload), "payload %zu", i);
  assert_int_equal(ev.payload_len, strlen(payload));
  assert_memory_equal(ev.payload, payload, ev.payload_len);
  assert_int_equal(ev.id_len, strlen(r->id));
  assert_memory_equal(ev.id, r->id, ev.id_len);
  assert_int_equal(ev.type_len, 6);
  assert_true(ev.ts > 1600000000000LL); /* stamped by the producer */
  assert_int_equal(ev.header_count, i % 2);
  if (i % 2 == 0)
    assert_int_equal(ev.id_len, 36); /* generated: a UUID */
}

static void test_round_trip_group_consumer(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(3, "rt", 6, &embedded), KL_OK);
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  kl_recs_t *recs = kl_recs_new(KL_RT_EVENTS);
  kl_producer_t *producer = kl_rec_producer(bootstrap, recs, NULL);
  kl_rt_publish(producer, KL_RT_EVENTS);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  assert_int_equal(kl_producer_inflight(producer), 0);
  assert_int_equal(recs->reports, KL_RT_EVENTS);
  for (size_t i = 0; i < KL_RT_EVENTS; i++)
    assert_int_equal(recs->rec[i].err, KL_OK);

  pid_t pid;
  FILE *out = kl_child_start(bootstrap, "rt", "rt-group", KL_RT_EVENTS, &pid);
  kl_decoder_t *decoder = kl_decoder_new();
  char line[10000];
  int lines = 0;
  kl_rt_line_t *l = malloc(sizeof(*l));
  while (fgets(line, sizeof(line), out)) {
    assert_int_equal(kl_rt_parse(line, l), 0);
    kl_rt_check(l, recs, decoder);
    lines++;
  }
  fclose(out);
  assert_int_equal(kl_child_wait(pid), 0);
  assert_int_equal(lines, KL_RT_EVENTS);
  free(l);
  kl_decoder_destroy(decoder);
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_embedded_destroy(embedded);
}

/* ---- ids ---- */

static int kl_cmp_id(const void *a, const void *b) {
  return strcmp(((const kl_rec_t *)a)->id, ((const kl_rec_t *)b)->id);
}

static void test_generated_ids_unique(void **state) {
  (void)state;
  enum { N = 20000 };
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "ids", 4, &embedded), KL_OK);
  kl_recs_t *recs = kl_recs_new(N);
  kl_producer_t *producer =
      kl_rec_producer(kl_embedded_bootstrap(embedded), recs, NULL);
  kl_event_t ev = kl_t_event("same-key", "t");
  for (size_t i = 0; i < N; i++)
    assert_int_equal(kl_publish(producer, "ids", &ev, (void *)(uintptr_t)i),
                     KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  assert_int_equal(recs->reports, N);
  /* One key, one partition: offsets follow publish order, and so must the
   * time-ordered ids. */
  for (size_t i = 1; i < N; i++) {
    assert_int_equal(recs->rec[i].offset, recs->rec[i - 1].offset + 1);
    assert_true(strcmp(recs->rec[i - 1].id, recs->rec[i].id) < 0);
  }
  qsort(recs->rec, N, sizeof(kl_rec_t), kl_cmp_id);
  for (size_t i = 0; i < N; i++) {
    assert_int_equal(strlen(recs->rec[i].id), 36);
    if (i > 0)
      assert_string_not_equal(recs->rec[i - 1].id, recs->rec[i].id);
  }
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_embedded_destroy(embedded);
}

/* ---- the partition-count check ---- */

static void test_expect_partitions_mismatch(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "events", 6, &embedded), KL_OK);
  kl_recs_t *recs = kl_recs_new(4);
  const char *extra[] = {"producer.expect.partitions", "12", NULL};
  kl_producer_t *producer =
      kl_rec_producer(kl_embedded_bootstrap(embedded), recs, extra);
  kl_event_t ev = kl_t_event("k", "t");
  assert_int_equal(kl_publish(producer, "events", &ev, NULL), KL_EPARTITIONS);
  assert_non_null(strstr(kl_err_detail(),
                         "topic events has 6 partitions, the fleet expects 12: "
                         "keys would move between owners; recreate the topic "
                         "or pass --partitions 6"));
  /* Remembered, not re-read, and nothing was queued. */
  assert_int_equal(kl_publish(producer, "events", &ev, NULL), KL_EPARTITIONS);
  assert_int_equal(kl_t_partitions(producer, "events"), 6);
  assert_int_equal(kl_producer_inflight(producer), 0);
  /* Another topic with the expected count is fine. */
  assert_int_equal(kl_embedded_topic_create(embedded, "twelve", 12), KL_OK);
  assert_int_equal(kl_publish(producer, "twelve", &ev, (void *)(uintptr_t)1),
                   KL_OK);
  assert_int_equal(kl_flush(producer, 10000), KL_OK);
  assert_int_equal(recs->rec[1].err, KL_OK);
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_embedded_destroy(embedded);
}

/* ---- the budget, and failures, against a cluster whose brokers we can
 * take down (the test owns the mock cluster directly for that) ---- */

typedef struct kl_mock {
  rd_kafka_t *rk;
  rd_kafka_mock_cluster_t *mcluster;
} kl_mock_t;

static void kl_mock_start(kl_mock_t *mock, const char *topic) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
  mock->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  assert_non_null(mock->rk);
  mock->mcluster = rd_kafka_mock_cluster_new(mock->rk, 1);
  assert_non_null(mock->mcluster);
  assert_int_equal(rd_kafka_mock_topic_create(mock->mcluster, topic, 2, 1), 0);
}

static void kl_mock_stop(kl_mock_t *mock) {
  rd_kafka_mock_cluster_destroy(mock->mcluster);
  rd_kafka_destroy(mock->rk);
}

static void test_budget_full_times_out(void **state) {
  (void)state;
  kl_mock_t mock;
  kl_mock_start(&mock, "budget");
  kl_recs_t *recs = kl_recs_new(8);
  const char *extra[] = {"producer.inflight.max",
                         "5",
                         "producer.enqueue.timeout.ms",
                         "300",
                         "kafka.reconnect.backoff.max.ms",
                         "200",
                         NULL};
  kl_producer_t *producer = kl_rec_producer(
      rd_kafka_mock_cluster_bootstraps(mock.mcluster), recs, extra);
  kl_event_t ev = kl_t_event("k", "t");
  assert_int_equal(kl_publish(producer, "budget", &ev, (void *)(uintptr_t)0),
                   KL_OK);
  assert_int_equal(kl_flush(producer, 10000), KL_OK);

  rd_kafka_mock_broker_set_down(mock.mcluster, -1);
  for (uintptr_t i = 1; i <= 5; i++)
    assert_int_equal(kl_publish(producer, "budget", &ev, (void *)i), KL_OK);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  assert_int_equal(kl_publish(producer, "budget", &ev, (void *)(uintptr_t)6),
                   KL_EQUEUE_FULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double waited_ms =
      (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  assert_true(waited_ms >= 290 && waited_ms < 3000);
  assert_non_null(strstr(kl_err_detail(), "producer.inflight.max"));
  assert_int_equal(kl_producer_inflight(producer), 5);

  /* The broker comes back: the five queued events are delivered. */
  rd_kafka_mock_broker_set_up(mock.mcluster, -1);
  assert_int_equal(kl_flush(producer, 20000), KL_OK);
  for (size_t i = 0; i <= 5; i++) {
    assert_int_equal(recs->rec[i].delivered, 1);
    assert_int_equal(recs->rec[i].err, KL_OK);
  }
  assert_int_equal(recs->rec[6].delivered, 0);
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_mock_stop(&mock);
}

static void test_delivery_failure_reported(void **state) {
  (void)state;
  kl_mock_t mock;
  kl_mock_start(&mock, "fail");
  kl_recs_t *recs = kl_recs_new(2);
  const char *extra[] = {"kafka.message.timeout.ms", "500", NULL};
  kl_producer_t *producer = kl_rec_producer(
      rd_kafka_mock_cluster_bootstraps(mock.mcluster), recs, extra);
  kl_event_t ev = kl_t_event("k", "t");
  assert_int_equal(kl_t_partitions(producer, "fail"), 2);
  rd_kafka_mock_broker_set_down(mock.mcluster, -1);
  assert_int_equal(kl_publish(producer, "fail", &ev, (void *)(uintptr_t)1),
                   KL_OK);
  assert_int_equal(kl_flush(producer, 10000), KL_OK);
  assert_int_equal(recs->rec[1].delivered, 1);
  assert_int_equal(recs->rec[1].err, KL_EKAFKA_TRANSIENT); /* timed out */
  assert_int_equal(recs->rec[1].offset, -1);
  assert_true(kl_err_is_retriable(recs->rec[1].err));
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_mock_stop(&mock);
}

/* ---- argument and conf errors ---- */

static void test_invalid_event_not_queued(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "inv", 2, &embedded), KL_OK);
  kl_recs_t *recs = kl_recs_new(1);
  kl_producer_t *producer =
      kl_rec_producer(kl_embedded_bootstrap(embedded), recs, NULL);
  kl_event_t ev = kl_t_event("", "t");
  assert_int_equal(kl_publish(producer, "inv", &ev, NULL), KL_EDECODE_KEY);
  ev = kl_t_event("k", "");
  assert_int_not_equal(kl_publish(producer, "inv", &ev, NULL), KL_OK);
  assert_int_equal(kl_producer_inflight(producer), 0);
  int32_t count = -1;
  assert_int_equal(kl_producer_partitions(producer, NULL, &count), KL_EINVAL);
  assert_int_equal(kl_producer_partitions(producer, "inv", NULL), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "count are required"));
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_embedded_destroy(embedded);
}

static void test_conf_refused(void **state) {
  (void)state;
  kl_conf_t *conf = kl_conf_new();
  kl_producer_t *producer = NULL;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "kafka.bootstrap.servers"));
  kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1");
  kl_conf_set(conf, "kafka.acks", "1");
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "acks=all"));
  kl_conf_set(conf, "kafka.acks", "all");
  kl_conf_set(conf, "kafka.no.such.property", "1");
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "kafka.no.such.property"));
  assert_null(producer);
  kl_conf_destroy(conf);
  kl_producer_destroy(NULL);
}

static void test_embedded_arguments(void **state) {
  (void)state;
  kl_embedded_t *embedded = NULL;
  assert_int_equal(kl_embedded_new(0, NULL, 0, &embedded), KL_EINVAL);
  assert_int_equal(kl_embedded_new(17, NULL, 0, &embedded), KL_EINVAL);
  assert_int_equal(kl_embedded_new(1, "bad name", 3, &embedded), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "0x20"));
  assert_int_equal(kl_embedded_new(1, "t", 0, &embedded), KL_EINVAL);
  assert_null(embedded);
  assert_int_equal(kl_embedded_new(2, NULL, 0, &embedded), KL_OK);
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  assert_non_null(strchr(bootstrap, ',')); /* two brokers */
  assert_int_equal(strncmp(bootstrap, "127.0.0.1:", 10), 0);
  assert_int_equal(kl_embedded_topic_create(embedded, "a", 3), KL_OK);
  assert_int_equal(kl_embedded_topic_create(embedded, "a", 3), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "already exists"));
  /* A success does not leave the last failure's text behind. */
  assert_int_equal(kl_embedded_topic_create(embedded, "b", 3), KL_OK);
  assert_string_equal(kl_err_detail(), "");
  kl_embedded_destroy(embedded);
  kl_embedded_destroy(NULL);
}

/* The mock creates a missing topic on first use (4 partitions): what the
 * worker's <topic>.dlq relies on, and what embedded.h documents. */
static void test_embedded_auto_creates_topics(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(3, "events", 8, &embedded), KL_OK);
  kl_recs_t *recs = kl_recs_new(1);
  kl_producer_t *producer =
      kl_rec_producer(kl_embedded_bootstrap(embedded), recs, NULL);
  kl_event_t ev = kl_t_event("k", "t");
  assert_int_equal(kl_publish(producer, "events.dlq", &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(producer, 10000), KL_OK);
  assert_int_equal(recs->rec[0].err, KL_OK);
  assert_int_equal(kl_t_partitions(producer, "events.dlq"), 4);
  assert_int_equal(kl_t_partitions(producer, "events"), 8);
  kl_producer_destroy(producer);
  kl_recs_destroy(recs);
  kl_embedded_destroy(embedded);
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "--child-consume") == 0)
    return kl_child_consume(argv[2], argv[3], argv[4], atoi(argv[5]));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedded_arguments),
      cmocka_unit_test(test_conf_refused),
      cmocka_unit_test(test_invalid_event_not_queued),
      cmocka_unit_test(test_round_trip_group_consumer),
      cmocka_unit_test(test_generated_ids_unique),
      cmocka_unit_test(test_expect_partitions_mismatch),
      cmocka_unit_test(test_embedded_auto_creates_topics),
      cmocka_unit_test(test_budget_full_times_out),
      cmocka_unit_test(test_delivery_failure_reported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
