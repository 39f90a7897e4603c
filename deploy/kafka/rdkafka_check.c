/*
 * rdkafka_check: does the installed librdkafka work against this Kafka the
 * way keylane uses it? Idempotent producer with acks=all (delivery reports
 * checked), then a cooperative-sticky consumer group that reads everything
 * back, commits offsets synchronously and reads the commit back.
 *
 * usage: rdkafka_check BOOTSTRAP TOPIC COUNT
 * Exits 0 when every message was delivered, consumed once and committed.
 * Built and run by selftest.sh; not part of keylane.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int delivered, failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m,
                        void *opaque) {
  (void)rk, (void)opaque;
  if (m->err) {
    failed++;
    fprintf(stderr, "delivery failed: %s\n", rd_kafka_err2str(m->err));
  } else {
    delivered++;
  }
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
  rd_kafka_error_t *error = NULL;
  (void)opaque;
  fprintf(stderr, "rebalance (%s): %s %d partition(s)\n",
          rd_kafka_rebalance_protocol(rk),
          err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS ? "assign" : "revoke",
          parts->cnt);
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
    error = rd_kafka_incremental_assign(rk, parts);
  else
    error = rd_kafka_incremental_unassign(rk, parts);
  if (error) {
    fprintf(stderr, "incremental (un)assign: %s\n",
            rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
}

static rd_kafka_conf_t *conf_new(const char *const *kv) {
  char errstr[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  for (; kv[0]; kv += 2) {
    if (rd_kafka_conf_set(conf, kv[0], kv[1], errstr, sizeof errstr) !=
        RD_KAFKA_CONF_OK) {
      fprintf(stderr, "%s=%s: %s\n", kv[0], kv[1], errstr);
      exit(2);
    }
  }
  return conf;
}

static int produce(const char *bootstrap, const char *topic, int count) {
  const char *kv[] = {"bootstrap.servers",
                      bootstrap,
                      "enable.idempotence",
                      "true",
                      "acks",
                      "all",
                      "message.timeout.ms",
                      "60000",
                      NULL};
  char errstr[512], key[32], val[64];
  rd_kafka_conf_t *conf = conf_new(kv);
  rd_kafka_t *rk;
  rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
  if (!rk) {
    fprintf(stderr, "producer: %s\n", errstr);
    return 1;
  }
  for (int i = 0; i < count; i++) {
    snprintf(key, sizeof key, "k%d", i);
    snprintf(val, sizeof val, "v%d", i);
    rd_kafka_resp_err_t err = rd_kafka_producev(
        rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE(val, strlen(val)),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (err) {
      fprintf(stderr, "produce: %s\n", rd_kafka_err2str(err));
      failed++;
    }
    rd_kafka_poll(rk, 0);
  }
  if (rd_kafka_flush(rk, 70000))
    fprintf(stderr, "flush timed out\n");
  rd_kafka_destroy(rk);
  printf("produced %d delivered %d failed %d (idempotent, acks=all)\n", count,
         delivered, failed);
  return delivered == count && failed == 0 ? 0 : 1;
}

static int consume(const char *bootstrap, const char *topic, int count) {
  char group[64], errstr[512];
  snprintf(group, sizeof group, "rdkafka-check-%ld", (long)time(NULL));
  const char *kv[] = {"bootstrap.servers",
                      bootstrap,
                      "group.id",
                      group,
                      "partition.assignment.strategy",
                      "cooperative-sticky",
                      "auto.offset.reset",
                      "earliest",
                      "enable.auto.commit",
                      "false",
                      NULL};
  rd_kafka_conf_t *conf = conf_new(kv);
  rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
  if (!rk) {
    fprintf(stderr, "consumer: %s\n", errstr);
    return 1;
  }
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_subscribe(rk, sub);
  rd_kafka_topic_partition_list_destroy(sub);

  int got = 0;
  time_t deadline = time(NULL) + 60;
  while (got < count && time(NULL) < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
    if (!m)
      continue;
    if (m->err)
      fprintf(stderr, "consume: %s\n", rd_kafka_message_errstr(m));
    else
      got++;
    rd_kafka_message_destroy(m);
  }
  rd_kafka_resp_err_t cerr = rd_kafka_commit(rk, NULL, 0); /* synchronous */
  rd_kafka_topic_partition_list_t *assigned = NULL;
  rd_kafka_assignment(rk, &assigned);
  int64_t committed = 0;
  rd_kafka_resp_err_t qerr = rd_kafka_committed(rk, assigned, 10000);
  for (int i = 0; assigned && i < assigned->cnt; i++)
    if (assigned->elems[i].offset > 0)
      committed += assigned->elems[i].offset;
  printf("consumed %d of %d, group %s (%s), commit: %s, committed offsets sum "
         "%lld (%s)\n",
         got, count, group, rd_kafka_rebalance_protocol(rk),
         rd_kafka_err2str(cerr), (long long)committed, rd_kafka_err2str(qerr));
  if (assigned)
    rd_kafka_topic_partition_list_destroy(assigned);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return got == count && !cerr && !qerr && committed == count ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s BOOTSTRAP TOPIC COUNT\n", argv[0]);
    return 2;
  }
  int count = atoi(argv[3]);
  printf("librdkafka %s\n", rd_kafka_version_str());
  if (produce(argv[1], argv[2], count))
    return 1;
  return consume(argv[1], argv[2], count);
}
