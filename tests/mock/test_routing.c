/*
 * Routing is checked on every record, on the embedded cluster: a record
 * whose key routes (murmur2) to another partition than the one it arrived
 * on, as a producer with another partitioner puts it, is never applied
 * there. worker.misrouted=dlq (the default) dead-letters it with reason
 * misrouted and the expected and actual partitions; forward re-publishes
 * it to its key's partition, where its owner applies it (once, however
 * often it is forwarded); apply applies it where it is. A redrive of a
 * misrouted letter sends it to its key's partition. A record that does
 * not decode is a decode letter wherever it arrived. The partitioner that
 * explains a misrouted record is named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "event/partitioners.h"
#include "support/http.h"
#include "support/support.h"
#include "cli/metrics_server.h"
#include "worker/checks.h"
#include "worker/letters.h"
#include "worker/redrive.h"
#include "keylane/handlers.h"

#define KL_TOPIC "rt"
#define KL_PARTS 4

typedef struct kl_fx {
  char dir[64];
  kl_embedded_t *cluster;
  const char *boot;
  kl_store_t *store;
  kl_t_worker_t *w; /* running; stopped by the teardown after a failure */
} kl_fx_t;

static int kl_setup(void **state) {
  kl_fx_t *fx = calloc(1, sizeof(*fx));
  assert_non_null(fx);
  assert_int_equal(kl_embedded_new(1, KL_TOPIC, KL_PARTS, &fx->cluster), KL_OK);
  assert_int_equal(kl_embedded_topic_create(fx->cluster, KL_TOPIC ".dlq", 2),
                   KL_OK);
  fx->boot = kl_embedded_bootstrap(fx->cluster);
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
  *state = fx;
  return 0;
}

static int kl_teardown(void **state) {
  kl_fx_t *fx = *state;
  if (fx->w)
    kl_t_worker_stop(fx->w);
  kl_store_destroy(fx->store);
  kl_t_rmrf(fx->dir);
  kl_embedded_destroy(fx->cluster);
  free(fx);
  return 0;
}

/* A ledger credit of @p amount (0..127) as a keylane envelope, produced
 * raw to @p partition, wherever its key routes. */
static void kl_credit_to(kl_fx_t *fx, const char *key, const char *id,
                         int amount, int32_t partition) {
  assert_int_equal(
      kl_t_produce_credit(fx->boot, KL_TOPIC, partition, key, id, amount), 0);
}

/* The partition next to the one @p key routes to. */
static int32_t kl_wrong(const char *key) {
  return (kl_partition(key, strlen(key), KL_PARTS) + 1) % KL_PARTS;
}

static int32_t kl_right(const char *key) {
  return kl_partition(key, strlen(key), KL_PARTS);
}

typedef int(kl_cond_fn)(const kl_worker_stats_t *st);

/* Waits (30 s at most) until @p cond holds of the worker's stats. */
static void kl_await(kl_t_worker_t *w, kl_cond_fn *cond,
                     kl_worker_stats_t *st) {
  for (int i = 0; i < 300; i++) {
    kl_worker_stats(w->worker, st, sizeof(*st));
    if (cond(st))
      return;
    kl_t_sleep_ms(100);
  }
  fail_msg("condition not met: applied=%llu misrouted=%llu dead_letters="
           "%llu forwarded=%llu",
           (unsigned long long)st->applied, (unsigned long long)st->misrouted,
           (unsigned long long)st->dead_letters,
           (unsigned long long)st->forwarded);
}

/* A ledger worker of group @p group, with @p setting ("key=value") when
 * not NULL. */
static kl_t_worker_t *kl_start(kl_fx_t *fx, const char *group,
                               const char *setting) {
  const char *extra[] = {"worker.session.timeout.ms=3000", setting, NULL};
  return fx->w = kl_t_worker_start(fx->boot, KL_TOPIC, group, fx->store, extra);
}

static kl_err_t kl_stop(kl_fx_t *fx) {
  kl_t_worker_t *w = fx->w;
  fx->w = NULL;
  return kl_t_worker_stop(w);
}

static uint64_t kl_applied_on(kl_fx_t *fx, int32_t partition) {
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx->store, KL_TOPIC, partition, &st),
                   KL_OK);
  return st.applied;
}

static const char *kl_header(rd_kafka_message_t *m, const char *name, char *buf,
                             size_t size) {
  rd_kafka_headers_t *h = NULL;
  const void *v;
  size_t len;
  if (rd_kafka_message_headers(m, &h) || !h ||
      rd_kafka_header_get_last(h, name, &v, &len))
    return NULL;
  snprintf(buf, size, "%.*s", (int)len, (const char *)v);
  return buf;
}

static void kl_read_letters(kl_fx_t *fx, kl__letters_t *letters) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  kl__pos_t from = {.kind = KL__POS_BEGINNING}, to = {.kind = KL__POS_END};
  memset(letters, 0, sizeof(*letters));
  assert_int_equal(
      kl__letters_read(conf, KL_TOPIC ".dlq", &from, &to, NULL, letters),
      KL_OK);
  kl_conf_destroy(conf);
}

/* The worker's /metrics holds the line @p want. */
static void kl_expect_metric(kl_fx_t *fx, kl_t_worker_t *w, const char *want) {
  kl_conf_t *conf = kl_conf_new();
  kl__metrics_server_t *ms;
  assert_int_equal(
      kl__metrics_server_start(":0", conf, KL_TOPIC, w->worker, fx->store, &ms),
      KL_OK);
  kl_t_http_resp_t r;
  assert_int_equal(kl_t_http_once(kl__metrics_server_port(ms), "GET",
                                  "/metrics", NULL, NULL, &r),
                   0);
  kl__metrics_server_stop(ms);
  kl_conf_destroy(conf);
  if (!strstr(r.body, want))
    fail_msg("/metrics lacks %s:\n%s", want, r.body);
  kl_t_http_resp_free(&r);
}

static int kl_dlq_done(const kl_worker_stats_t *st) {
  return st->applied == 1 && st->dead_letters == 1;
}

/* Default policy: the misrouted record is dead-lettered, not applied, with
 * the expected and actual partitions; the routed one is applied. */
static void test_misrouted_is_dead_lettered(void **state) {
  kl_fx_t *fx = *state;
  /* acct-1 arrives on partition 3, acct-6 is routed to partition 1 */
  assert_int_equal(kl_wrong("acct-1"), 3);
  assert_int_equal(kl_right("acct-6"), 1);
  kl_credit_to(fx, "acct-1", "id-wrong", 100, kl_wrong("acct-1"));
  kl_credit_to(fx, "acct-6", "id-right", 5, kl_right("acct-6"));
  kl_t_worker_t *w = kl_start(fx, "g-dlq", NULL);
  kl_worker_stats_t st;
  kl_await(w, kl_dlq_done, &st);
  assert_int_equal(st.misrouted, 1);
  assert_int_equal(st.forwarded, 0);
  assert_int_equal(st.failed, 0);
  kl_expect_metric(fx, w,
                   "keylane_worker_misrouted_total{topic=\"rt\","
                   "partition=\"3\"} 1\n");
  assert_int_equal(kl_stop(fx), KL_OK);
  assert_int_equal(kl_applied_on(fx, kl_wrong("acct-1")), 0);

  kl__letters_t letters;
  kl_read_letters(fx, &letters);
  assert_int_equal(letters.n, 1);
  kl__letter_t *l = &letters.v[0];
  char buf[512];
  assert_string_equal(l->reason, "misrouted");
  assert_int_equal(l->partition, kl_wrong("acct-1"));
  assert_non_null(
      kl_header(l->msg, "keylane.dlq.expected_partition", buf, sizeof(buf)));
  assert_int_equal(atoi(buf), kl_right("acct-1"));
  assert_non_null(kl_header(l->msg, "keylane.dlq.error", buf, sizeof(buf)));
  assert_non_null(strstr(buf, "routes to partition"));
  kl__letters_clear(&letters);
}

static int kl_forward_done(const kl_worker_stats_t *st) {
  return st->forwarded == 1 && st->applied == 1;
}

static int kl_duplicate_one(const kl_worker_stats_t *st) {
  return st->duplicates == 1;
}

/* forward: the record goes to its key's partition with its id, is applied
 * there once; nothing reaches the dead-letter topic. */
static void test_misrouted_is_forwarded(void **state) {
  kl_fx_t *fx = *state;
  kl_credit_to(fx, "acct-3", "id-fwd", 7, kl_wrong("acct-3"));
  kl_t_worker_t *w = kl_start(fx, "g-fwd", "worker.misrouted=forward");
  kl_worker_stats_t st;
  kl_await(w, kl_forward_done, &st);
  assert_int_equal(st.misrouted, 1);
  assert_int_equal(st.dead_letters, 0);
  /* A second forward of the same id (a restarted owner) is a duplicate. */
  kl_credit_to(fx, "acct-3", "id-fwd", 7, kl_wrong("acct-3"));
  kl_await(w, kl_duplicate_one, &st);
  assert_int_equal(st.applied, 1);
  assert_int_equal(kl_stop(fx), KL_OK);
  assert_int_equal(kl_applied_on(fx, kl_right("acct-3")), 1);
  assert_int_equal(kl_applied_on(fx, kl_wrong("acct-3")), 0);
  kl__letters_t letters;
  kl_read_letters(fx, &letters);
  assert_int_equal(letters.n, 0);
  kl__letters_clear(&letters);
}

static int kl_applied_one(const kl_worker_stats_t *st) {
  return st->applied == 1;
}

/* apply: today's behaviour, named explicitly. */
static void test_misrouted_applied_when_asked(void **state) {
  kl_fx_t *fx = *state;
  kl_credit_to(fx, "acct-4", "id-apply", 3, kl_wrong("acct-4"));
  kl_t_worker_t *w = kl_start(fx, "g-apply", "worker.misrouted=apply");
  kl_worker_stats_t st;
  kl_await(w, kl_applied_one, &st);
  assert_int_equal(st.misrouted, 0);
  assert_int_equal(kl_stop(fx), KL_OK);
  assert_int_equal(kl_applied_on(fx, kl_wrong("acct-4")), 1);
}

/* Key-parallel lanes take the same path. */
static void test_misrouted_key_parallel(void **state) {
  kl_fx_t *fx = *state;
  kl_credit_to(fx, "acct-5", "id-kp-wrong", 1, kl_wrong("acct-5"));
  kl_credit_to(fx, "acct-6", "id-kp-right", 1, kl_right("acct-6"));
  kl_t_worker_t *w = kl_start(fx, "g-kp", "worker.concurrency=4");
  kl_worker_stats_t st;
  kl_await(w, kl_dlq_done, &st);
  assert_int_equal(st.misrouted, 1);
  assert_int_equal(kl_stop(fx), KL_OK);
}

static int kl_two_letters(const kl_worker_stats_t *st) {
  return st->dead_letters == 2;
}

/* A record no owner could apply is a decode letter on whatever partition
 * it arrived, judged before its routing: a valid envelope under a key past
 * KL_KEY_MAX, and bytes that are no envelope, each on a partition its key
 * does not route to. Neither is misrouted (nor forwarded to an owner that
 * would refuse it too). */
static void test_invalid_record_is_decode_wherever(void **state) {
  kl_fx_t *fx = *state;
  char long_key[KL_KEY_MAX + 64];
  memset(long_key, 'k', sizeof(long_key) - 1);
  long_key[sizeof(long_key) - 1] = '\0';
  assert_int_equal(kl_t_produce_credit_under(fx->boot, KL_TOPIC,
                                             kl_wrong(long_key), long_key,
                                             "acct-1", "id-long", 1),
                   0);
  assert_int_equal(kl_t_produce_raw(fx->boot, KL_TOPIC, kl_wrong("acct-2"),
                                    "acct-2", "not an envelope", 15, NULL),
                   0);
  kl_t_worker_t *w = kl_start(fx, "g-invalid", "worker.misrouted=forward");
  kl_worker_stats_t st;
  kl_await(w, kl_two_letters, &st);
  assert_int_equal(st.misrouted, 0);
  assert_int_equal(st.forwarded, 0);
  assert_int_equal(kl_stop(fx), KL_OK);
  kl__letters_t letters;
  kl_read_letters(fx, &letters);
  assert_int_equal(letters.n, 2);
  for (size_t i = 0; i < letters.n; i++)
    if (strcmp(letters.v[i].reason, "decode") != 0)
      fail_msg("the letter of partition %d offset %lld has reason %s, want "
               "decode",
               (int)letters.v[i].partition, (long long)letters.v[i].offset,
               letters.v[i].reason);
  kl__letters_clear(&letters);
}

static int kl_applied_two(const kl_worker_stats_t *st) {
  return st->applied == 2;
}

/* A misrouted letter redriven goes to its key's partition, whose owner
 * applies it; a dry run sends nothing. */
static void test_redrive_misrouted(void **state) {
  kl_fx_t *fx = *state;
  kl_credit_to(fx, "acct-7", "id-rd", 9, kl_wrong("acct-7"));
  kl_credit_to(fx, "acct-8", "id-rd-ok", 1, kl_right("acct-8"));
  kl_t_worker_t *w = kl_start(fx, "g-rd", NULL);
  kl_worker_stats_t st;
  kl_await(w, kl_dlq_done, &st);

  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  kl__redrive_opts_t o = {.conf = conf,
                          .dlq_topic = KL_TOPIC ".dlq",
                          .store = fx->store,
                          .handler = kl_ledger_handler,
                          .dry_run = 1};
  o.from.kind = KL__POS_BEGINNING;
  o.to.kind = KL__POS_END;
  kl__redrive_t *r = NULL;
  assert_int_equal(kl__redrive_run(&o, &r), KL_OK);
  assert_int_equal(kl__redrive_count(r, KL__OUT_REPUBLISHED), 1);
  kl__redrive_destroy(r);
  o.dry_run = 0;
  assert_int_equal(kl__redrive_run(&o, &r), KL_OK);
  size_t n;
  const kl__redriven_t *res = kl__redrive_results(r, &n);
  assert_int_equal(n, 1);
  assert_int_equal(res[0].outcome, KL__OUT_REPUBLISHED);
  assert_non_null(strstr(res[0].why, "partition"));
  kl__redrive_destroy(r);
  kl_conf_destroy(conf);

  kl_await(w, kl_applied_two, &st);
  assert_int_equal(st.misrouted, 1); /* not misrouted any more */
  assert_int_equal(kl_stop(fx), KL_OK);
  assert_int_equal(kl_applied_on(fx, kl_wrong("acct-7")),
                   kl_wrong("acct-7") == kl_right("acct-8") ? 1 : 0);
  assert_true(kl_applied_on(fx, kl_right("acct-7")) >= 1);
}

static int kl_twenty_done(const kl_worker_stats_t *st) {
  return st->applied + st->dead_letters == 20;
}

/* The case: a service publishing with confluent-kafka's default
 * partitioner (librdkafka's consistent_random, CRC32; kl_t_produce_raw()
 * leaves the partition to it). Every key CRC32 puts elsewhere than murmur2
 * is dead-lettered, none applied, and each letter is explained by CRC32. */
static void test_confluent_default_is_caught(void **state) {
  kl_fx_t *fx = *state;
  int expect = 0;
  char key[16], id[16];
  for (int k = 0; k < 20; k++) {
    snprintf(key, sizeof(key), "acct-%d", k);
    snprintf(id, sizeof(id), "crc-%d", k);
    expect += kl__partitioners_pick(KL__PARTITIONER_CRC32, key, strlen(key),
                                    KL_PARTS) != kl_right(key);
    kl_credit_to(fx, key, id, 1, RD_KAFKA_PARTITION_UA);
  }
  assert_true(expect > 0);
  kl_t_worker_t *w = kl_start(fx, "g-crc", NULL);
  kl_worker_stats_t st;
  kl_await(w, kl_twenty_done, &st);
  assert_int_equal(st.misrouted, expect);
  assert_int_equal(st.dead_letters, expect);
  assert_int_equal(st.applied, 20 - expect);
  assert_int_equal(kl_stop(fx), KL_OK);
  kl__letters_t letters;
  kl_read_letters(fx, &letters);
  assert_int_equal(letters.n, expect);
  for (size_t i = 0; i < letters.n; i++) {
    rd_kafka_message_t *m = letters.v[i].msg;
    assert_true(kl__partitioners_explaining(m->key, m->key_len, KL_PARTS,
                                            letters.v[i].partition) &
                (1u << KL__PARTITIONER_CRC32));
  }
  kl__letters_clear(&letters);
}

/* keylane doctor's partition-count check (worker/checks.h). */
static void test_check_partitions(void **state) {
  kl_fx_t *fx = *state;
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", fx->boot, errstr,
                    sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  assert_non_null(rk);
  kl__check_t c;
  kl__check_partitions(rk, KL_TOPIC, 0, 5000, &c);
  assert_int_equal(c.status, KL__CHECK_OK);
  assert_non_null(strstr(c.msg, "has 4 partitions"));
  kl__check_partitions(rk, KL_TOPIC, KL_PARTS, 5000, &c);
  assert_int_equal(c.status, KL__CHECK_OK);
  kl__check_partitions(rk, KL_TOPIC, 6, 5000, &c);
  assert_int_equal(c.status, KL__CHECK_FAIL);
  assert_non_null(strstr(c.msg, "topic rt has 4 partitions, the fleet "
                                "expects 6: keys would move between owners"));
  rd_kafka_destroy(rk);
}

/* The partitioners a misrouted record is explained by. */
static void test_partitioner_named(void **state) {
  (void)state;
  const char *key = "acct-17";
  for (int32_t n = 2; n <= 16; n++) {
    int32_t crc = kl__partitioners_pick(KL__PARTITIONER_CRC32, key, 7, n);
    kl__partitioners_t set = kl__partitioners_explaining(key, 7, n, crc);
    assert_true(set & (1u << KL__PARTITIONER_CRC32));
    int32_t mm = kl_partition(key, 7, n);
    assert_true(kl__partitioners_explaining(key, 7, n, mm) &
                (1u << KL__PARTITIONER_MURMUR2));
  }
  char buf[1024];
  kl__partitioners_explain(1u << KL__PARTITIONER_CRC32, buf, sizeof(buf));
  assert_non_null(strstr(buf, "partitioner=murmur2_random"));
  kl__partitioners_explain(1u << KL__PARTITIONER_FNV1A_REF, buf, sizeof(buf));
  assert_non_null(strstr(buf, "NewReferenceHashPartitioner"));
  kl__partitioners_explain(0, buf, sizeof(buf));
  assert_non_null(strstr(buf, "unknown"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_misrouted_is_dead_lettered, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_misrouted_is_forwarded, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_misrouted_applied_when_asked,
                                      kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_misrouted_key_parallel, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_redrive_misrouted, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_invalid_record_is_decode_wherever,
                                      kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_confluent_default_is_caught,
                                      kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_check_partitions, kl_setup,
                                      kl_teardown),
      cmocka_unit_test(test_partitioner_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
