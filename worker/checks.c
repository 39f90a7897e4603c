/* Checks of the environment (see checks.h). */
#include "worker/checks.h"
#include "worker/checks_log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kafka.h"

const char *kl__check_status_name(kl__check_status_t status) {
  return status == KL__CHECK_OK     ? "OK"
         : status == KL__CHECK_WARN ? "WARN"
                                    : "FAIL";
}

void kl__duration_format(int64_t ms, char *buf, size_t size) {
  static const struct {
    const char *unit;
    int64_t ms;
  } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
  for (size_t i = 0; ms > 0 && i < sizeof(units) / sizeof(units[0]); i++)
    if (ms % units[i].ms == 0) {
      snprintf(buf, size, "%" PRId64 "%s", ms / units[i].ms, units[i].unit);
      return;
    }
  snprintf(buf, size, "%" PRId64 "ms", ms);
}

static void check_say(kl__check_t *out, kl__check_status_t status,
                      const char *fmt, ...) KL__PRINTF(3, 4);
static void check_say(kl__check_t *out, kl__check_status_t status,
                      const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  out->status = status;
  vsnprintf(out->msg, sizeof(out->msg), fmt, ap);
  va_end(ap);
}

/* check_say() about a topic: "ROLE TOPIC " and then @p fmt. */
static void topic_say(kl__check_t *out, kl__check_status_t status,
                      const char *role, const char *topic, const char *fmt, ...)
    KL__PRINTF(5, 6);
static void topic_say(kl__check_t *out, kl__check_status_t status,
                      const char *role, const char *topic, const char *fmt,
                      ...) {
  va_list ap;
  va_start(ap, fmt);
  out->status = status;
  int n = snprintf(out->msg, sizeof(out->msg), "%s %s ", role, topic);
  if (n >= 0 && (size_t)n < sizeof(out->msg))
    vsnprintf(out->msg + n, sizeof(out->msg) - (size_t)n, fmt, ap);
  va_end(ap);
}

/* ---- retention ---------------------------------------------------------- */

void kl__check_retention_judge(const char *role, const char *topic,
                               int64_t retention_ms, const char *source,
                               int64_t dedup_ms, kl__check_t *out) {
  char keep[32], dedup[32];
  kl__duration_format(retention_ms, keep, sizeof(keep));
  kl__duration_format(dedup_ms, dedup, sizeof(dedup));
  if (retention_ms < 0)
    topic_say(out, KL__CHECK_FAIL, role, topic,
              "keeps records forever (%s) but "
              "store.dedup.retention is %s: an event read again after "
              "its id was swept (a replay, a redrive, a re-published "
              "event) is applied twice; give the %s "
              "a finite retention.ms of at most %" PRId64 " (%s), or set "
              "worker.retention.check=warn to run anyway",
              source, dedup, role, dedup_ms, dedup);
  else if (dedup_ms < retention_ms)
    topic_say(out, KL__CHECK_FAIL, role, topic,
              "keeps records for %s (%s) but "
              "store.dedup.retention is %s: an id swept while its event "
              "can still be redelivered or re-published is applied "
              "twice; set store.dedup.retention "
              "(--dedup-retention) to at least %s, or lower the %s's "
              "retention.ms to at most %" PRId64 ", or set "
              "worker.retention.check=warn to run anyway",
              keep, source, dedup, keep, role, dedup_ms);
  else
    topic_say(out, KL__CHECK_OK, role, topic,
              "keeps records for %s (%s), within "
              "store.dedup.retention %s",
              keep, source, dedup);
}

static kl__topic_config_fn *_Atomic kl_config_hook;

void kl__checks_set_topic_config(kl__topic_config_fn *fn) {
  atomic_store(&kl_config_hook, fn);
}

/* The configuration entries @p names of @p topic, from the hook or the
 * cluster. @returns as kl__kafka_topic_configs(); 1 when the cluster can
 * answer no DescribeConfigs. */
static int read_configs(rd_kafka_t *rk, const char *topic,
                        const char *const *names, size_t n, char **values,
                        int timeout_ms, kl_err_t *err) {
  kl__topic_config_fn *hook = atomic_load(&kl_config_hook);
  *err = KL_OK;
  if (hook) {
    for (size_t i = 0; i < n; i++) {
      const char *v = hook(topic, names[i]);
      values[i] = v ? strdup(v) : NULL;
    }
    return 0;
  }
  int has = kl__kafka_has_controller(rk, timeout_ms);
  if (has == 0)
    return 1;
  *err = has < 0
             ? KL_EKAFKA_TRANSIENT
             : kl__kafka_topic_configs(rk, topic, names, n, values, timeout_ms);
  return 0;
}

/* What @p topic keeps (retention.ms, cleanup.policy, retention.bytes):
 * *@p retention_ms as kl__check_retention_judge() takes it, @p source the
 * setting it came from, *@p bytes retention.bytes (-1: unbounded).
 * @returns as read_configs(), its error in *@p err. */
static int topic_retention(rd_kafka_t *rk, const char *topic, int timeout_ms,
                           int64_t *retention_ms, char *source, size_t size,
                           int64_t *bytes, kl_err_t *err) {
  static const char *const names[] = {"retention.ms", "cleanup.policy",
                                      "retention.bytes"};
  char *values[3] = {NULL, NULL, NULL};
  if (read_configs(rk, topic, names, 3, values, timeout_ms, err) || *err)
    return *err ? 0 : 1;
  /* The broker's defaults when it lists none: 7 days, delete, no bound. */
  *retention_ms = values[0] ? strtoll(values[0], NULL, 10) : 604800000;
  snprintf(source, size, "retention.ms=%s",
           values[0] ? values[0] : "604800000");
  if (values[1] && strstr(values[1], "compact") &&
      !strstr(values[1], "delete")) {
    *retention_ms = -1; /* compaction keeps each key's last record */
    snprintf(source, size, "cleanup.policy=%s", values[1]);
  }
  *bytes = values[2] ? strtoll(values[2], NULL, 10) : -1;
  for (int i = 0; i < 3; i++)
    free(values[i]);
  return 0;
}

void kl__check_retention(rd_kafka_t *rk, const char *role, const char *topic,
                         int64_t dedup_ms, int timeout_ms, kl__check_t *out) {
  char dedup[32];
  kl__duration_format(dedup_ms, dedup, sizeof(dedup));
  kl_err_t err;
  int64_t retention_ms, bytes;
  char source[64];
  if (topic_retention(rk, topic, timeout_ms, &retention_ms, source,
                      sizeof(source), &bytes, &err)) {
    check_say(out, KL__CHECK_WARN,
              "cannot read the retention of %s %s: the cluster names no "
              "controller to answer DescribeConfigs (librdkafka's mock "
              "cluster, the embedded one, has none); make sure its "
              "retention.ms is at most store.dedup.retention (%s)",
              role, topic, dedup);
    return;
  }
  if (err) {
    check_say(out, KL__CHECK_FAIL,
              "cannot read the retention of %s %s: %s; grant "
              "DescribeConfigs on it (kafka-acls --operation "
              "DescribeConfigs), or set "
              "worker.retention.check=warn to run unchecked",
              role, topic, kl_err_detail());
    return;
  }
  kl__check_retention_judge(role, topic, retention_ms, source, dedup_ms, out);
}

void kl__check_timer_judge(const char *topic, int64_t retention_ms,
                           const char *source, int64_t bytes, int64_t max_ms,
                           kl__check_t *out) {
  char keep[32], max[32];
  kl__duration_format(retention_ms, keep, sizeof(keep));
  kl__duration_format(max_ms, max, sizeof(max));
  if (retention_ms >= 0 && retention_ms < max_ms)
    topic_say(out, KL__CHECK_WARN, "topic", topic,
              "keeps records for %s (%s), less than timer.max.delay %s: a "
              "timer that waits longer outlives its event's record, and "
              "`keylane store rebuild` (which finds pending timers in the "
              "log) loses it; raise the topic's retention.ms to at least "
              "%" PRId64 " (%s), or lower timer.max.delay to at most %s",
              keep, source, max, max_ms, max, keep);
  else if (bytes >= 0)
    topic_say(out, KL__CHECK_WARN, "topic", topic,
              "deletes records by size too (retention.bytes=%" PRId64
              "), whatever their age: whether a timer's record outlives "
              "timer.max.delay %s depends on the rate, and a timer whose "
              "record is gone is lost to `keylane store rebuild`; set "
              "retention.bytes=-1 and keep retention.ms at least %" PRId64
              " (%s)",
              bytes, max, max_ms, max);
  else
    topic_say(out, KL__CHECK_OK, "topic", topic,
              "keeps records %s%s (%s), at least timer.max.delay %s",
              retention_ms < 0 ? "forever" : "for ",
              retention_ms < 0 ? "" : keep, source, max);
}

void kl__check_timer_retention(rd_kafka_t *rk, const char *topic,
                               int64_t max_ms, int timeout_ms,
                               kl__check_t *out) {
  kl_err_t err;
  int64_t retention_ms, bytes;
  char source[64], max[32];
  kl__duration_format(max_ms, max, sizeof(max));
  if (topic_retention(rk, topic, timeout_ms, &retention_ms, source,
                      sizeof(source), &bytes, &err) ||
      err) {
    check_say(out, KL__CHECK_WARN,
              "cannot read the retention of topic %s (%s): make sure it "
              "keeps records at least timer.max.delay (%s), or `keylane "
              "store rebuild` loses the timers that wait longer",
              topic,
              err ? kl_err_detail()
                  : "the cluster names no controller to answer "
                    "DescribeConfigs, as the embedded one",
              max);
    return;
  }
  kl__check_timer_judge(topic, retention_ms, source, bytes, max_ms, out);
}

int64_t kl__check_message_max(rd_kafka_t *rk, const char *topic,
                              int timeout_ms) {
  static const char *const names[] = {"max.message.bytes"};
  char *value = NULL;
  kl_err_t err;
  int64_t max = 0;
  if (!read_configs(rk, topic, names, 1, &value, timeout_ms, &err) && !err &&
      value)
    max = strtoll(value, NULL, 10);
  free(value);
  return max > 0 ? max : 0;
}

/* ---- replication -------------------------------------------------------- */

/* The WARN of a topic where an acks=all publish may rest on one broker:
 * one replica, or min.insync.replicas below 2; @p how says the fix. */
static void one_broker(const char *role, const char *topic, int rf, int min_isr,
                       const char *how, kl__check_t *out) {
  char why[128];
  if (rf < 2)
    snprintf(why, sizeof(why), "replication factor %d:", rf);
  else
    snprintf(why, sizeof(why),
             "min.insync.replicas=%d: acks=all then waits for the leader "
             "alone, so",
             min_isr);
  topic_say(out, KL__CHECK_WARN, role, topic,
            "has %s an acknowledged event lives on one broker and is lost "
            "with it; %s",
            why, how);
}

void kl__check_replication_judge(const char *role, const char *topic, int rf,
                                 int min_isr, const char *unknown,
                                 kl__check_t *out) {
  static const char fix[] =
      "give it a replication factor of 3 and min.insync.replicas=2 "
      "(kafka-configs.sh --alter --entity-type topics --entity-name %s "
      "--add-config min.insync.replicas=2)";
  char how[300];
  snprintf(how, sizeof(how), fix, topic);
  if (min_isr > rf)
    topic_say(out, KL__CHECK_FAIL, role, topic,
              "has min.insync.replicas=%d but only %d replicas: "
              "every acks=all publish is refused (NOT_ENOUGH_REPLICAS); "
              "lower min.insync.replicas to at most %d, or add replicas",
              min_isr, rf, rf);
  else if (rf < 2 || (min_isr >= 0 && min_isr < 2))
    one_broker(role, topic, rf, min_isr, how, out);
  else if (min_isr < 0)
    topic_say(out, KL__CHECK_WARN, role, topic,
              "has replication factor %d; cannot tell its "
              "min.insync.replicas (%s): acks=all is durable only when "
              "it is at least 2; check it with kafka-configs.sh "
              "--describe --entity-type topics --entity-name %s",
              rf, unknown, topic);
  else
    topic_say(out, KL__CHECK_OK, role, topic,
              "has replication factor %d and min.insync.replicas=%d: "
              "an acknowledged event is on at least %d brokers",
              rf, min_isr, min_isr);
}

/* The fewest replicas of any partition of @p topic; -1 (kl_err_detail()
 * says why) when its metadata cannot be read. */
static int replication_factor(rd_kafka_t *rk, const char *topic,
                              int timeout_ms) {
  const struct rd_kafka_metadata *md = NULL;
  if (kl__kafka_metadata(rk, topic, timeout_ms, &md))
    return -1;
  rd_kafka_resp_err_t kerr =
      md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
  int rf = -1;
  for (int i = 0; !kerr && i < md->topics[0].partition_cnt; i++)
    if (rf < 0 || md->topics[0].partitions[i].replica_cnt < rf)
      rf = md->topics[0].partitions[i].replica_cnt;
  rd_kafka_metadata_destroy(md);
  if (kerr || rf < 0)
    kl__err(kerr ? kl__kafka_err(kerr) : KL_EKAFKA_TRANSIENT,
            "cannot read the metadata of topic %s: %s", topic,
            kerr ? rd_kafka_err2str(kerr) : "it has no partitions");
  return kerr ? -1 : rf;
}

void kl__check_replication(rd_kafka_t *rk, const char *role, const char *topic,
                           int timeout_ms, kl__check_t *out) {
  int rf = replication_factor(rk, topic, timeout_ms);
  if (rf < 0) {
    check_say(out, KL__CHECK_WARN, "%s", kl_err_detail());
    return;
  }
  static const char *const names[] = {"min.insync.replicas"};
  char *value = NULL;
  kl_err_t err;
  char unknown[300] = "";
  int min_isr = -1;
  if (read_configs(rk, topic, names, 1, &value, timeout_ms, &err))
    snprintf(unknown, sizeof(unknown),
             "the cluster names no controller to "
             "answer DescribeConfigs, as librdkafka's mock cluster, the "
             "embedded one");
  else if (err)
    snprintf(unknown, sizeof(unknown), "%s", kl_err_detail());
  else /* the broker's default when it lists none: 1 */
    min_isr = value ? atoi(value) : 1;
  free(value);
  kl__check_replication_judge(role, topic, rf, min_isr, unknown, out);
}

/* ---- the topic's owner --------------------------------------------------- */

kl_err_t kl__checks_kafka_owner(rd_kafka_t *rk, const char *group,
                                int timeout_ms, kl__store_owner_t *owner) {
  char *cluster = rd_kafka_clusterid(rk, timeout_ms);
  if (!cluster)
    return kl__err(KL_EKAFKA_TRANSIENT,
                   "the Kafka cluster did not say its id within %d ms",
                   timeout_ms);
  kl_err_t err = kl__store_owner_make(owner, cluster, group);
  rd_kafka_mem_free(rk, cluster);
  return err;
}

kl_err_t kl__checks_hand_owner(rd_kafka_t *rk, kl_store_t *store,
                               const char *topic, const char *group,
                               int timeout_ms, const char *who) {
  kl__store_owner_t recorded, mine;
  kl_err_t err = kl__store_owner(store, topic, &recorded);
  if (err == KL_ENOTFOUND)
    return KL_OK;
  if (err)
    return err;
  if (kl__checks_kafka_owner(rk, group ? group : recorded.group, timeout_ms,
                             &mine))
    return kl__err(KL_ECONF,
                   "%s, and the store records Kafka cluster %s as the "
                   "owner of topic %s: a %s that cannot check it takes "
                   "nothing; try again when the cluster answers",
                   kl_err_detail(), recorded.cluster, topic, who);
  if (kl__store_owner_equal(&recorded, &mine))
    return KL_OK;
  int other_cluster = strcmp(recorded.cluster, mine.cluster) != 0;
  return kl__err(
      KL_ECONF,
      "the store records Kafka cluster %s and group %s as the owner of "
      "topic %s, and this %s reads %s %s: it would apply %s and fence "
      "the fleet that owns the topic; %s, or, if the fleet moved on "
      "purpose, record the new owner first with `keylane store bind -t %s "
      "-b BOOTSTRAP -g GROUP --store STORE`",
      recorded.cluster, recorded.group, topic, who,
      other_cluster ? "cluster" : "group",
      other_cluster ? mine.cluster : mine.group,
      other_cluster ? "another cluster's log" : "the log for another group",
      other_cluster ? "give it the fleet's bootstrap servers (-b)"
                    : "give it the fleet's group (-X worker.group)",
      topic);
}

/* ---- epochs ------------------------------------------------------------- */

/* Appends " P (E<G)" for a partition whose store epoch E is below the
 * group's G; @returns how many were below so far. */
static int epochs_below(char *list, size_t size, int below, int32_t p,
                        uint64_t mine, uint64_t fleet) {
  size_t len = strlen(list);
  if (len + 48 < size)
    snprintf(list + len, size - len,
             "%s%" PRId32 " (%" PRIu64 " < %" PRIu64 ")", below ? ", " : "", p,
             mine, fleet);
  return below + 1;
}

void kl__check_epochs(kl_store_t *store, const kl_conf_t *conf,
                      const char *group, const char *topic, int32_t partitions,
                      int timeout_ms, kl__check_t *out) {
  uint64_t *fleet = calloc((size_t)partitions + 1, sizeof(*fleet));
  int64_t *committed = calloc((size_t)partitions + 1, sizeof(*committed));
  int32_t *ids = calloc((size_t)partitions + 1, sizeof(*ids));
  kl_err_t err = fleet && committed && ids ? KL_OK : KL_ENOMEM;
  for (int32_t p = 0; p < partitions && ids; p++)
    ids[p] = p;
  if (!err)
    err = kl__kafka_group_epochs(conf, group, topic, ids, (size_t)partitions,
                                 fleet, committed, timeout_ms);
  if (err)
    check_say(out, KL__CHECK_WARN,
              "cannot read the epochs group %s recorded for topic %s: %s",
              group, topic, kl_err_detail());
  char list[400] = "", unknown_list[400] = "";
  int below = 0, unknown = 0;
  for (int32_t p = 0; !err && p < partitions; p++) {
    kl_partition_state_t st;
    if ((err = kl_store_partition(store, topic, p, &st))) {
      check_say(out, KL__CHECK_FAIL,
                "cannot read partition %" PRId32
                " of topic %s in the store: %s",
                p, topic, kl_err_detail());
    } else if (kl__checks_log_store_unknown(&st, 0, committed[p], fleet[p],
                                            NULL)) {
      unknown = epochs_below(unknown_list, sizeof(unknown_list), unknown, p,
                             st.epoch, fleet[p]);
    } else if (st.epoch < fleet[p]) {
      below = epochs_below(list, sizeof(list), below, p, st.epoch, fleet[p]);
    }
  }
  if (!err && unknown)
    check_say(out, KL__CHECK_FAIL,
              "group %s committed offsets above the store's watermarks, with "
              "epochs above the store's, on %d partition(s) of topic %s: %s; "
              "the store never saw those owners, and a worker stops those "
              "partitions (store_unknown) unless retention deleted the "
              "records in between: point --store at the fleet's store, or "
              "adopt this one with `keylane store rebuild` or `keylane "
              "replay --from watermark` and -X worker.group=%s "
              "(docs/operations.md, \"A partition the store does not know\")",
              group, unknown, topic, unknown_list, group);
  else if (!err && below)
    check_say(out, KL__CHECK_WARN,
              "the store's epochs of topic %s are below those group %s "
              "recorded in Kafka on %d partition(s): %s; a new or rebuilt "
              "store: its next owners take epochs above the group's, which "
              "external resources that kept the old ones accept",
              topic, group, below, list);
  else if (!err)
    check_say(out, KL__CHECK_OK,
              "the store's epochs of topic %s are at least those group %s "
              "recorded in Kafka, on all %" PRId32 " partitions",
              topic, group, partitions);
  free(fleet);
  free(committed);
  free(ids);
}
