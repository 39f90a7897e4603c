/*
 * keylane doctor (cli/doctor_run.h, cli/doctor.c) on a mock cluster
 * of this process: each check's OK and its FAIL or WARN, the partitioner
 * named for records another client's default put on the wrong partition,
 * the sample being the last records, the store's checks on LMDB, and
 * through the executable (KEYLANE_BIN): --help, usage errors (2), exit 1
 * on a FAIL and 0 on WARNs, and --json parsed by jansson. The retention
 * and replication checks read topic configurations through the test hook
 * of checks.h: the mock cluster answers no DescribeConfigs (WARN).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "event/partitioners.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/run.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "cli/doctor_run.h"
#include "store/store_internal.h"
#include "worker/checks.h"

#define KL_TOPIC "events"
#define KL_PARTS 4

typedef struct kl_fx {
  rd_kafka_t *owner; /* holds the mock cluster */
  rd_kafka_mock_cluster_t *mc;
  const char *boot;
  kl_conf_t *conf;
  char dir[64]; /* an LMDB store */
} kl_fx_t;

static int kl_setup(void **state) {
  kl_fx_t *fx = calloc(1, sizeof(*fx));
  char errstr[256];
  fx->owner = rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), errstr,
                           sizeof(errstr));
  assert_non_null(fx->owner);
  fx->mc = rd_kafka_mock_cluster_new(fx->owner, 3);
  assert_non_null(fx->mc);
  assert_int_equal(rd_kafka_mock_topic_create(fx->mc, KL_TOPIC, KL_PARTS, 3),
                   0);
  assert_int_equal(rd_kafka_mock_topic_create(fx->mc, KL_TOPIC ".dlq", 2, 3),
                   0);
  fx->boot = rd_kafka_mock_cluster_bootstraps(fx->mc);
  fx->conf = kl_conf_new();
  assert_int_equal(kl_conf_set(fx->conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  assert_int_equal(kl_conf_set(fx->conf, "store.create", "no"), KL_OK);
  kl_t_tmpdir(fx->dir);
  *state = fx;
  return 0;
}

static int kl_teardown(void **state) {
  kl_fx_t *fx = *state;
  kl__checks_set_topic_config(NULL);
  kl_conf_destroy(fx->conf);
  kl_t_rmrf(fx->dir);
  rd_kafka_mock_cluster_destroy(fx->mc);
  rd_kafka_destroy(fx->owner);
  free(fx);
  return 0;
}

/* ---- records ------------------------------------------------------------ */

/* Produces @p n records keyed PREFIX-i to @p topic, placed by librdkafka's
 * partitioner @p partitioner ("consistent_random": confluent-kafka's
 * default, CRC32; "fnv1a_random": Sarama's FNV-1a; "murmur2_random": the
 * Java client's, keylane's). */
static void kl_produce(kl_fx_t *fx, const char *topic, const char *partitioner,
                       const char *prefix, int n) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  assert_int_equal(rd_kafka_conf_set(c, "bootstrap.servers", fx->boot, errstr,
                                     sizeof(errstr)),
                   RD_KAFKA_CONF_OK);
  assert_int_equal(
      rd_kafka_conf_set(c, "partitioner", partitioner, errstr, sizeof(errstr)),
      RD_KAFKA_CONF_OK);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  for (int i = 0; i < n; i++) {
    char key[32];
    snprintf(key, sizeof(key), "%s-%d", prefix, i);
    assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                                       RD_KAFKA_V_KEY(key, strlen(key)),
                                       RD_KAFKA_V_VALUE("x", 1),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_END),
                     0);
  }
  assert_int_equal(rd_kafka_flush(rk, 10000), 0);
  rd_kafka_destroy(rk);
}

/* ---- running the doctor ---------------------------------------------- */

/* Runs the doctor on @p topic in this process. @returns its output (the
 * caller frees it); *@p worst the worst status. */
static char *kl_doctor(kl_fx_t *fx, const char *topic, const char *store,
                       size_t sample, kl__check_status_t *worst) {
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  assert_non_null(out);
  kl__doctor_opts_t o = {fx->conf, topic, store, sample, 0, NULL};
  assert_int_equal(kl__doctor_run(&o, out, worst), KL_OK);
  fclose(out);
  return buf;
}

/* Asserts that @p text has a line starting "STATUS CHECK: " holding
 * @p part. */
static void kl_assert_line(const char *text, const char *status,
                           const char *check, const char *part) {
  char head[64];
  int n = snprintf(head, sizeof(head), "%s %s: ", status, check);
  for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l) {
    const char *end = strchr(l, '\n');
    size_t len = end ? (size_t)(end - l) : strlen(l);
    char line[2048];
    snprintf(line, sizeof(line), "%.*s", (int)len, l);
    if (strncmp(line, head, (size_t)n) == 0 && strstr(line, part))
      return;
  }
  fail_msg("no line \"%s...%s\" in:\n%s", head, part, text);
}

/* Asserts that @p text has no line of check @p check. */
static void kl_assert_no_check(const char *text, const char *check) {
  char needle[64];
  snprintf(needle, sizeof(needle), " %s: ", check);
  for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l) {
    const char *sp = strchr(l, ' ');
    if (sp && strncmp(sp, needle, strlen(needle)) == 0)
      fail_msg("unexpected check %s in:\n%s", check, text);
  }
}

/* The same through the executable. */
static void kl_cli(kl_fx_t *fx, const char *const *extra, kl_t_run_t *r) {
  const char *args[24] = {"doctor", "-b", fx->boot, "-t", KL_TOPIC};
  size_t n = 5;
  for (size_t i = 0; extra && extra[i]; i++)
    args[n++] = extra[i];
  args[n] = NULL;
  kl_t_run_for(args, NULL, 0, 120000, r);
}

/* ---- the partition count -------------------------------------------- */

static void test_partitions(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "partitions", "topic events has 4 partitions");
  free(out);

  assert_int_equal(kl_conf_set(fx->conf, "worker.expect.partitions", "8"),
                   KL_OK);
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "partitions",
                 "topic events has 4 partitions, the fleet expects 8");
  free(out);
  assert_int_equal(kl_conf_set(fx->conf, "worker.expect.partitions", "0"),
                   KL_OK);

  /* A topic that does not exist: nothing else about it is checked. */
  rd_kafka_mock_topic_set_error(fx->mc, "gone",
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  out = kl_doctor(fx, "gone", NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "partitions", "topic gone does not exist");
  kl_assert_no_check(out, "routing");
  kl_assert_no_check(out, "retention");
  free(out);
}

/* ---- routing ----------------------------------------------------------- */

/* Records placed by confluent-kafka's default partitioner (CRC32) are
 * found and CRC32 is named with the setting to fix; keylane's own
 * (murmur2) pass; FNV-1a (Sarama's default) is named on its topic. */
static void test_routing_names_the_partitioner(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  kl_produce(fx, KL_TOPIC, "murmur2_random", "ok", 40);
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "routing", "all 40 sampled keys route");
  free(out);

  kl_produce(fx, KL_TOPIC, "consistent_random", "crc", 40);
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "routing",
                 "of 80 sampled records are on "
                 "another partition");
  kl_assert_line(out, "FAIL", "routing", "CRC32");
  kl_assert_line(out, "FAIL", "routing", "partitioner=murmur2_random");
  free(out);

  assert_int_equal(rd_kafka_mock_topic_create(fx->mc, "sarama", KL_PARTS, 3),
                   0);
  kl_produce(fx, "sarama", "fnv1a_random", "fnv", 40);
  out = kl_doctor(fx, "sarama", NULL, 0, &worst);
  kl_assert_line(out, "FAIL", "routing", "FNV-1a");
  free(out);
}

/* The sample is each partition's last records: misrouted records older
 * than the last N are not read. */
static void test_routing_samples_the_last_records(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  kl_produce(fx, KL_TOPIC, "consistent_random", "old", 40);
  /* Then at least 3 well-routed records on every partition. */
  kl_produce(fx, KL_TOPIC, "murmur2_random", "new", 80);
  for (int32_t p = 0; p < KL_PARTS; p++) {
    int n = 0;
    for (int i = 0; i < 80; i++) {
      char key[32];
      snprintf(key, sizeof(key), "new-%d", i);
      n += kl_partition(key, strlen(key), KL_PARTS) == p;
    }
    assert_true(n >= 3);
  }
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 3, &worst);
  kl_assert_line(out, "OK", "routing", "all 12 sampled keys route");
  free(out);
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "FAIL", "routing", "of 120 sampled records");
  free(out);
}

static void test_routing_empty_topic(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "WARN", "routing", "no keyed record in the sample");
  free(out);
}

/* ---- the dead-letter topic ----------------------------------------- */

static void test_dlq(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "dlq", "dead-letter topic events.dlq exists");
  free(out);

  rd_kafka_mock_topic_set_error(fx->mc, KL_TOPIC ".dlq",
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "dlq",
                 "dead-letter topic events.dlq does "
                 "not exist: create topic events.dlq");
  kl_assert_no_check(out, "dlq-retention");
  kl_assert_no_check(out, "dlq-replication");
  free(out);
  rd_kafka_mock_topic_set_error(fx->mc, KL_TOPIC ".dlq",
                                RD_KAFKA_RESP_ERR_NO_ERROR);
}

/* ---- retention and replication, through the topic-config hook ------- */

static const char *kl_topic_retention, *kl_dlq_retention, *kl_min_isr;

static const char *kl_config(const char *topic, const char *name) {
  if (strcmp(name, "min.insync.replicas") == 0)
    return kl_min_isr;
  if (strcmp(name, "retention.ms") == 0)
    return strcmp(topic, KL_TOPIC) == 0 ? kl_topic_retention : kl_dlq_retention;
  return NULL;
}

static void test_retention(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_WARN); /* the mock cannot tell */
  kl_assert_line(out, "WARN", "retention",
                 "cannot read the retention of "
                 "topic events");
  free(out);

  kl__checks_set_topic_config(kl_config);
  kl_topic_retention = kl_dlq_retention = NULL; /* the broker's 7d */
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "retention", "keeps records for 7d");
  kl_assert_line(out, "OK", "dlq-retention",
                 "events.dlq keeps records for "
                 "7d");
  free(out);

  kl_topic_retention = "1209600000"; /* 14d */
  kl_dlq_retention = "-1";
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "retention", "keeps records for 14d");
  kl_assert_line(out, "FAIL", "retention", "at least 14d");
  kl_assert_line(out, "FAIL", "dlq-retention", "keeps records forever");
  free(out);

  assert_int_equal(kl_conf_set(fx->conf, "store.dedup.retention", "14d"),
                   KL_OK);
  kl_dlq_retention = NULL;
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "retention", "within store.dedup.retention 14d");
  kl_assert_line(out, "OK", "timer-retention",
                 "keeps records for 14d (retention.ms=1209600000), at least "
                 "timer.max.delay 7d");
  free(out);

  kl_topic_retention = "86400000"; /* 1d: shorter than timer.max.delay */
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_WARN);
  kl_assert_line(out, "OK", "retention", "within store.dedup.retention 14d");
  kl_assert_line(out, "WARN", "timer-retention",
                 "keeps records for 1d (retention.ms=86400000), less than "
                 "timer.max.delay 7d");
  free(out);
  assert_int_equal(kl_conf_set(fx->conf, "store.dedup.retention", "7d"), KL_OK);
}

static void test_replication(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  char *out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "WARN", "replication",
                 "cannot tell its "
                 "min.insync.replicas");
  free(out);

  kl__checks_set_topic_config(kl_config);
  kl_min_isr = "2";
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "OK", "replication",
                 "replication factor 3 and "
                 "min.insync.replicas=2");
  kl_assert_line(out, "OK", "dlq-replication",
                 "events.dlq has replication "
                 "factor 3");
  free(out);

  kl_min_isr = NULL; /* the broker's default: 1 */
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  kl_assert_line(out, "WARN", "replication",
                 "min.insync.replicas=1: acks=all "
                 "then waits for the leader alone");
  free(out);

  kl_min_isr = "4";
  out = kl_doctor(fx, KL_TOPIC, NULL, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "replication", "NOT_ENOUGH_REPLICAS");
  free(out);

  /* One replica (the mock gives every topic its cluster's replication
   * factor, so this one is judged without it). */
  kl__check_t c;
  kl__check_replication_judge("topic", "thin", 1, 1, "", &c);
  assert_int_equal(c.status, KL__CHECK_WARN);
  assert_non_null(strstr(c.msg, "topic thin has replication factor 1: an "
                                "acknowledged event lives on one broker"));
  /* The same warning, and fix, for one in-sync replica of three. */
  kl__check_replication_judge("topic", "lone", 3, 1, "", &c);
  assert_int_equal(c.status, KL__CHECK_WARN);
  assert_string_equal(
      c.msg, "topic lone has min.insync.replicas=1: acks=all then waits for "
             "the leader alone, so an acknowledged event lives on one broker "
             "and is lost with it; give it a replication factor of 3 and "
             "min.insync.replicas=2 (kafka-configs.sh --alter --entity-type "
             "topics --entity-name lone --add-config min.insync.replicas=2)");
}

/* ---- the store ------------------------------------------------------- */

/* Gives each partition of the store an owner and the watermark @p wm
 * (-1: the log's end). */
static void kl_store_at(kl_fx_t *fx, int64_t wm) {
  kl_store_t *store;
  assert_int_equal(kl_store_open(fx->dir, NULL, &store), KL_OK);
  rd_kafka_t *rk;
  assert_int_equal(kl__kafka_reader_new(fx->conf, "t", "earliest", &rk), KL_OK);
  for (int32_t p = 0; p < KL_PARTS; p++) {
    int64_t low, high;
    assert_int_equal(
        rd_kafka_query_watermark_offsets(rk, KL_TOPIC, p, &low, &high, 10000),
        0);
    kl_partition_state_t st;
    assert_int_equal(kl_store_acquire(store, KL_TOPIC, p, &st), KL_OK);
    kl_txn_t *txn;
    assert_int_equal(kl_store_begin(store, KL_TOPIC, p, st.epoch, &txn), KL_OK);
    assert_int_equal(kl_store_commit(txn, wm < 0 ? high : wm), KL_OK);
  }
  rd_kafka_destroy(rk);
  kl_store_destroy(store);
}

/* Records @p cluster (NULL: the fixture's) and @p group as the owner of
 * KL_TOPIC in the fixture's store (kl__store_bind()). */
static void kl_bind_owner(kl_fx_t *fx, const char *cluster, const char *group) {
  kl_store_t *store;
  rd_kafka_t *rk;
  kl__store_owner_t owner;
  assert_int_equal(kl__kafka_reader_new(fx->conf, "t", "earliest", &rk), KL_OK);
  assert_int_equal(kl__checks_kafka_owner(rk, group, 10000, &owner), KL_OK);
  rd_kafka_destroy(rk);
  if (cluster)
    snprintf(owner.cluster, sizeof(owner.cluster), "%s", cluster);
  assert_int_equal(kl_store_open(fx->dir, NULL, &store), KL_OK);
  assert_int_equal(kl__store_bind(store, KL_TOPIC, &owner), KL_OK);
  kl_store_destroy(store);
}

static void test_store_checks(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  kl_produce(fx, KL_TOPIC, "murmur2_random", "k", 40);
  kl_store_at(fx, -1);
  char *out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  kl_assert_line(out, "OK", "store-version", "(lmdb) has format version 6");
  kl_assert_line(out, "WARN", "owner", "records no owner of topic");
  kl_assert_line(out, "OK", "log", "hold the store's watermarks on all 4");
  kl_assert_line(out, "OK", "epochs",
                 "at least those group keylane "
                 "recorded");
  kl_assert_no_check(out, "clock"); /* LMDB: this host's clock */
  free(out);

  /* The owner: this cluster and group recorded, OK; another group or
   * cluster recorded, FAIL naming both and the fix. */
  kl_bind_owner(fx, NULL, "keylane");
  out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  kl_assert_line(out, "OK", "owner", "and group keylane as the owner");
  free(out);
  kl_bind_owner(fx, NULL, "other");
  out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "owner", "belongs to another consumer group");
  kl_assert_line(out, "FAIL", "owner", "keylane store bind -t " KL_TOPIC);
  free(out);
  kl_bind_owner(fx, "elsewhere", "keylane");
  out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  kl_assert_line(out, "FAIL", "owner", "records Kafka cluster elsewhere");
  free(out);
  kl_bind_owner(fx, NULL, "keylane"); /* the next tests' store: this fleet's */

  /* The log went backwards: the store applied past its end. */
  kl_store_at(fx, 1000);
  out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "log", "went backwards");
  kl_assert_line(out, "FAIL", "log", "keylane store reset");
  free(out);
}

/* The group committed epochs (keylane.epoch=E) above the store's: a new
 * store, whose next owners will take epochs above them; with an offset
 * above its watermark, a store that never saw that owner. */
static void test_epochs_below_the_group(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  kl_store_at(fx, 0);
  rd_kafka_t *rk;
  assert_int_equal(kl__kafka_reader_new(fx->conf, "g-old", "earliest", &rk),
                   KL_OK);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_t *tp =
      rd_kafka_topic_partition_list_add(l, KL_TOPIC, 2);
  tp->offset = 0;
  kl__kafka_epoch_set(tp, 9);
  assert_int_equal(rd_kafka_commit(rk, l, 0), 0);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  assert_int_equal(kl_conf_set(fx->conf, "worker.group", "g-old"), KL_OK);
  char *out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  kl_assert_line(out, "WARN", "epochs", "on 1 partition(s): 2 (1 < 9)");
  free(out);
  /* An offset above the store's watermark too: the store never saw that
   * owner, and a worker would refuse the partition. */
  assert_int_equal(kl__kafka_reader_new(fx->conf, "g-old", "earliest", &rk),
                   KL_OK);
  l = rd_kafka_topic_partition_list_new(1);
  tp = rd_kafka_topic_partition_list_add(l, KL_TOPIC, 2);
  tp->offset = 7;
  kl__kafka_epoch_set(tp, 9);
  assert_int_equal(rd_kafka_commit(rk, l, 0), 0);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "epochs",
                 "group g-old committed offsets above the store's watermarks, "
                 "with epochs above the store's, on 1 partition(s) of topic "
                 "events: 2 (1 < 9)");
  free(out);
  assert_int_equal(kl_conf_set(fx->conf, "worker.group", "keylane"), KL_OK);
}

static void test_store_version_and_missing_store(void **state) {
  kl_fx_t *fx = *state;
  kl__check_status_t worst;
  kl_store_at(fx, 0);
  kl_t_lmdb_set_format(fx->dir, 7);
  char *out = kl_doctor(fx, KL_TOPIC, fx->dir, 0, &worst);
  assert_int_equal(worst, KL__CHECK_FAIL);
  kl_assert_line(out, "FAIL", "store-version", "format version 7");
  kl_assert_no_check(out, "log");
  free(out);

  char missing[96];
  snprintf(missing, sizeof(missing), "%s/typo", fx->dir);
  out = kl_doctor(fx, KL_TOPIC, missing, 0, &worst);
  kl_assert_line(out, "FAIL", "store", "does not exist");
  free(out);
}

/* ---- the command line ------------------------------------------------- */

static void kl_assert_usage(const char *const *args, const char *part) {
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  if (r.rc != 2 || !strstr(r.err, part))
    fail_msg("keylane %s %s: rc %d, stderr:\n%s", args[0], args[1], r.rc,
             r.err);
  kl_t_run_free(&r);
}

static void test_cli_help_and_usage(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run((const char *[]){"doctor", "--help", NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "OK|WARN|FAIL CHECK"));
  assert_non_null(strstr(r.out, "--sample N"));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"--help", NULL}, NULL, 0, &r);
  assert_non_null(strstr(r.out, "doctor"));
  kl_t_run_free(&r);
  kl_assert_usage((const char *[]){"doctor", "-t", "e", NULL},
                  "-b BOOTSTRAP is required");
  kl_assert_usage((const char *[]){"doctor", "-b", "127.0.0.1:1", NULL},
                  "-t TOPIC is required");
  kl_assert_usage((const char *[]){"doctor", "-b", "127.0.0.1:1", "-t", "e",
                                   "--sample", "0", NULL},
                  "--sample");
  kl_assert_usage((const char *[]){"doctor", "-b", "127.0.0.1:1", "-t", "e",
                                   "--partitions", "many", NULL},
                  "--partitions");
  kl_assert_usage((const char *[]){"doctor", "-b", "127.0.0.1:1", "-t", "e",
                                   "--bogus", NULL},
                  "unknown option");
  kl_assert_usage(
      (const char *[]){"doctor", "-b", "127.0.0.1:1", "-t", "e", "extra", NULL},
      "unexpected argument \"extra\"");
}

/* Every line is "OK|WARN|FAIL CHECK: message". */
static void kl_assert_lines(const char *text) {
  for (const char *l = text; *l; l = strchr(l, '\n') + 1) {
    size_t skip = strncmp(l, "OK ", 3) == 0     ? 3
                  : strncmp(l, "WARN ", 5) == 0 ? 5
                  : strncmp(l, "FAIL ", 5) == 0 ? 5
                                                : 0;
    const char *colon = strstr(l, ": ");
    if (!skip || !colon || colon > strchr(l, '\n') ||
        strspn(l + skip, "abcdefghijklmnopqrstuvwxyz-") !=
            (size_t)(colon - l - (long)skip))
      fail_msg("not a check line: %s", l);
  }
}

static void test_cli_exit_codes(void **state) {
  kl_fx_t *fx = *state;
  kl_produce(fx, KL_TOPIC, "murmur2_random", "k", 20);
  kl_t_run_t r;
  kl_cli(fx, NULL, &r); /* WARNs only: the mock answers no configs */
  if (r.rc != 0)
    fail_msg("rc %d:\n%s%s", r.rc, r.out, r.err);
  kl_assert_lines(r.out);
  kl_assert_line(r.out, "OK", "routing", "all 20 sampled keys");
  kl_assert_line(r.out, "WARN", "retention", "cannot read");
  kl_t_run_free(&r);

  kl_cli(fx, (const char *[]){"--partitions", "8", NULL}, &r);
  assert_int_equal(r.rc, 1);
  kl_assert_lines(r.out);
  kl_assert_line(r.out, "FAIL", "partitions", "the fleet expects 8");
  kl_t_run_free(&r);

  kl_produce(fx, KL_TOPIC, "consistent_random", "crc", 20);
  kl_cli(fx, (const char *[]){"--sample", "1000", NULL}, &r);
  assert_int_equal(r.rc, 1);
  kl_assert_line(r.out, "FAIL", "routing", "CRC32");
  kl_t_run_free(&r);
}

static void test_cli_json(void **state) {
  kl_fx_t *fx = *state;
  kl_store_at(fx, 0);
  kl_t_run_t r;
  kl_cli(
      fx,
      (const char *[]){"--json", "--store", fx->dir, "--partitions", "8", NULL},
      &r);
  assert_int_equal(r.rc, 1);
  json_t *o = kl_t_run_json(&r);
  assert_string_equal(json_string_value(json_object_get(o, "topic")), KL_TOPIC);
  assert_string_equal(json_string_value(json_object_get(o, "status")), "FAIL");
  json_t *checks = json_object_get(o, "checks");
  assert_true(json_is_array(checks));
  const char *want[] = {
      "security",        "partitions",    "routing",         "dlq",
      "retention",       "dlq-retention", "timer-retention", "replication",
      "dlq-replication", "store-version", "owner",           "log",
      "epochs"};
  assert_int_equal(json_array_size(checks), sizeof(want) / sizeof(want[0]));
  for (size_t i = 0; i < json_array_size(checks); i++) {
    json_t *c = json_array_get(checks, i);
    assert_string_equal(json_string_value(json_object_get(c, "check")),
                        want[i]);
    const char *status = json_string_value(json_object_get(c, "status"));
    assert_non_null(status);
    assert_true(strcmp(status, "OK") == 0 || strcmp(status, "WARN") == 0 ||
                strcmp(status, "FAIL") == 0);
    assert_true(json_is_string(json_object_get(c, "message")));
  }
  json_t *security = json_array_get(checks, 0);
  assert_string_equal(json_string_value(json_object_get(security, "status")),
                      "OK");
  assert_non_null(
      strstr(json_string_value(json_object_get(security, "message")),
             "security.protocol plaintext (the default): connected"));
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(checks, 1), "status")),
      "FAIL");
  json_decref(o);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_partitions, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_routing_names_the_partitioner,
                                      kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_routing_samples_the_last_records,
                                      kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_routing_empty_topic, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_dlq, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_retention, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_replication, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_store_checks, kl_setup, kl_teardown),
      cmocka_unit_test_setup_teardown(test_epochs_below_the_group, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_store_version_and_missing_store,
                                      kl_setup, kl_teardown),
      cmocka_unit_test(test_cli_help_and_usage),
      cmocka_unit_test_setup_teardown(test_cli_exit_codes, kl_setup,
                                      kl_teardown),
      cmocka_unit_test_setup_teardown(test_cli_json, kl_setup, kl_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
