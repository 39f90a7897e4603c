#include "common/kafka.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conf.h"
#include "common/kafka_pos.h"
#include "common/log.h"

kl_err_t kl__kafka_set(void *rkconf, const char *name, const char *value) {
  char errstr[256];
  if (rd_kafka_conf_set(rkconf, name, value, errstr, sizeof(errstr)) ==
      RD_KAFKA_CONF_OK)
    return KL_OK;
  if (!kl__conf_is_secret(name))
    return kl__err(KL_ECONF, "kafka.%s=%s: %s", name, value, errstr);
  /* A secret: neither its value nor librdkafka's words if they quote it. */
  return kl__err(KL_ECONF, "kafka.%s (its value not shown: a secret): %s", name,
                 *value && strstr(errstr, value)
                     ? "librdkafka refused the value"
                     : errstr);
}

kl_err_t kl__kafka_conf_apply(rd_kafka_conf_t *rkconf, const kl_conf_t *conf,
                              const char *const *defaults) {
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && defaults && defaults[i]; i += 2)
    err = kl__kafka_set(rkconf, defaults[i], defaults[i + 1]);
  if (!err)
    err = kl_conf_foreach_kafka(conf, kl__kafka_set, rkconf);
  rd_kafka_conf_set_log_cb(rkconf, kl__kafka_log);
  rd_kafka_conf_set_error_cb(rkconf, kl__kafka_error);
  return err;
}

/* ---- refused credentials and TLS handshakes ---------------------------- */

/* The last refusal this process met (one cluster's settings a process). */
static pthread_mutex_t refusal_mu = PTHREAD_MUTEX_INITIALIZER;
static char refusal_why[768];

/* What to check for a refusal by @p rk of kind @p err. */
static void refusal_hint(rd_kafka_t *rk, int err, char *out, size_t size) {
  if (err == RD_KAFKA_RESP_ERR__SSL) {
    snprintf(out, size,
             "check kafka.ssl.ca.location (the CA that signed the brokers' "
             "certificates) and, for mutual TLS, "
             "kafka.ssl.certificate.location and kafka.ssl.key.location");
    return;
  }
  char mech[64] = "";
  size_t n = sizeof(mech);
  if (rd_kafka_conf_get(rd_kafka_conf(rk), "sasl.mechanisms", mech, &n) !=
      RD_KAFKA_CONF_OK)
    mech[0] = '\0';
  int scram = strncmp(mech, "SCRAM", 5) == 0;
  snprintf(out, size,
           "check kafka.sasl.mechanism (%s), kafka.sasl.username and "
           "kafka.sasl.password%s%s%s",
           mech[0] ? mech : "?",
           scram && rd_kafka_version() < 0x020601ff
               ? "; also, librdkafka before 2.6.1 (this is "
               : "",
           scram && rd_kafka_version() < 0x020601ff ? rd_kafka_version_str()
                                                    : "",
           scram && rd_kafka_version() < 0x020601ff
               ? ") cannot authenticate with SCRAM to Kafka 4 brokers "
                 "(librdkafka #4895): use PLAIN over SASL_SSL there, or a "
                 "newer librdkafka"
               : "");
}

void kl__kafka_refusal_note(rd_kafka_t *rk, int err, const char *reason) {
  if (err != RD_KAFKA_RESP_ERR__AUTHENTICATION &&
      err != RD_KAFKA_RESP_ERR__SSL &&
      err != RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED)
    return;
  char hint[512];
  refusal_hint(rk, err, hint, sizeof(hint));
  pthread_mutex_lock(&refusal_mu);
  snprintf(refusal_why, sizeof(refusal_why), "%s: %s; %s",
           err == RD_KAFKA_RESP_ERR__SSL ? "the TLS handshake with Kafka failed"
                                         : "Kafka refused keylane's "
                                           "credentials (authentication)",
           reason, hint);
  pthread_mutex_unlock(&refusal_mu);
}

void kl__kafka_error(rd_kafka_t *rk, int err, const char *reason,
                     void *opaque) {
  (void)opaque;
  kl__kafka_refusal_note(rk, err, reason);
  /* as librdkafka logs an error when no callback takes it */
  char line[1024];
  snprintf(line, sizeof(line), "[thrd:app]: %s: %s", rd_kafka_name(rk), reason);
  kl__kafka_log(rk, 3, "ERROR", line);
}

/* The refusal noted, into @p out; 0 when there is none. */
static int refusal_get(char *out, size_t size) {
  pthread_mutex_lock(&refusal_mu);
  int found = refusal_why[0] != '\0';
  snprintf(out, size, "%s", refusal_why);
  pthread_mutex_unlock(&refusal_mu);
  return found;
}

void kl__kafka_log(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf) {
  (void)rk;
  kl__log_level_t l = level <= 2   ? KL_LOG_ERROR
                      : level <= 4 ? KL_LOG_WARN
                      : level == 5 ? KL_LOG_INFO
                                   : KL_LOG_DEBUG;
  if (strcmp(fac, "COMMITFAIL") == 0)
    l = KL_LOG_DEBUG;
  /* A refusal is logged at once from librdkafka's thread, while the error
   * callback waits for a poll that a blocking metadata request holds off. */
  if (level <= 4 && strstr(buf, "SASL authentication error"))
    kl__kafka_refusal_note((rd_kafka_t *)rk, RD_KAFKA_RESP_ERR__AUTHENTICATION,
                           buf);
  else if (level <= 4 && strstr(buf, "SSL handshake failed"))
    kl__kafka_refusal_note((rd_kafka_t *)rk, RD_KAFKA_RESP_ERR__SSL, buf);
  if (kl__log_enabled(l))
    kl__log(l, "rdkafka", "%s: %s", fac, buf);
}

kl_err_t kl__kafka_err(rd_kafka_resp_err_t err) {
  switch (err) {
  case RD_KAFKA_RESP_ERR_NO_ERROR:
    return KL_OK;
  case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    return KL_EQUEUE_FULL;
  case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
  case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
  case RD_KAFKA_RESP_ERR__DESTROY:
    return KL_ESTOPPED;
  case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
  case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    return KL_ENOTFOUND;
  case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
  case RD_KAFKA_RESP_ERR__TIMED_OUT:
  case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
  case RD_KAFKA_RESP_ERR__TRANSPORT:
  case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
  case RD_KAFKA_RESP_ERR__RESOLVE:
  case RD_KAFKA_RESP_ERR__WAIT_COORD:
  case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
  case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
  case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
  case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
  case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
  case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
  case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
  case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
  case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
    return KL_EKAFKA_TRANSIENT;
  default:
    return KL_EKAFKA;
  }
}

bool kl__kafka_record_refused(rd_kafka_resp_err_t err) {
  switch (err) {
  case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
  case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
  case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
  case RD_KAFKA_RESP_ERR_INVALID_RECORD:
  case RD_KAFKA_RESP_ERR_INVALID_MSG:
    return true;
  default:
    return false;
  }
}

/* One metadata request: of every topic in the cluster (@p all), of
 * @p topic, or of the topics the handle knows. */
static kl_err_t kafka_metadata_req(rd_kafka_t *rk, int all, const char *topic,
                                   int timeout_ms,
                                   const struct rd_kafka_metadata **md) {
  rd_kafka_topic_t *rkt = topic ? rd_kafka_topic_new(rk, topic, NULL) : NULL;
  if (topic && !rkt)
    return kl__err(KL_EINVAL, "topic %s: %s", topic,
                   rd_kafka_err2str(rd_kafka_last_error()));
  /* In slices of a second, so that a refusal ends the wait at once. */
  char why[sizeof(refusal_why)];
  int64_t deadline = kl__mono_ns() + (int64_t)timeout_ms * 1000000;
  rd_kafka_resp_err_t kerr;
  int refused = 0;
  for (;;) {
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    kerr = rd_kafka_metadata(rk, all, rkt, md,
                             left_ms > 1000 ? 1000
                             : left_ms > 0  ? (int)left_ms
                                            : 1);
    if (!kerr || kl__kafka_err(kerr) != KL_EKAFKA_TRANSIENT ||
        (refused = refusal_get(why, sizeof(why))) || left_ms <= 1000)
      break;
  }
  if (rkt)
    rd_kafka_topic_destroy(rkt);
  if (kerr && refused)
    return kl__err(KL_EKAFKA, "%s", why);
  if (kerr)
    return kl__err(kl__kafka_err(kerr),
                   "cannot read the metadata of %s%s within %d ms: %s; is "
                   "the cluster reachable (-b, kafka.bootstrap.servers)?",
                   topic ? "topic " : "the cluster", topic ? topic : "",
                   timeout_ms, rd_kafka_err2str(kerr));
  return KL_OK;
}

kl_err_t kl__kafka_metadata(rd_kafka_t *rk, const char *topic, int timeout_ms,
                            const struct rd_kafka_metadata **md) {
  return kafka_metadata_req(rk, 0, topic, timeout_ms, md);
}

kl_err_t kl__kafka_metadata_all(rd_kafka_t *rk, int timeout_ms,
                                const struct rd_kafka_metadata **md) {
  return kafka_metadata_req(rk, 1, NULL, timeout_ms, md);
}

const rd_kafka_metadata_topic_t *
kl__kafka_metadata_find(const struct rd_kafka_metadata *md, const char *topic) {
  for (int i = 0; md && i < md->topic_cnt; i++)
    if (!md->topics[i].err && md->topics[i].partition_cnt > 0 &&
        strcmp(md->topics[i].topic, topic) == 0)
      return &md->topics[i];
  return NULL;
}

int kl__kafka_has_controller(rd_kafka_t *rk, int timeout_ms) {
  const struct rd_kafka_metadata *md = NULL;
  if (kl__kafka_metadata(rk, NULL, timeout_ms, &md))
    return -1;
  int32_t controller = rd_kafka_controllerid(rk, 0);
  int found = 0;
  for (int i = 0; i < md->broker_cnt && !found; i++)
    found = md->brokers[i].id == controller;
  rd_kafka_metadata_destroy(md);
  return found;
}

/* The DescribeConfigs result of one topic into @p values. */
static kl_err_t kafka_configs_take(rd_kafka_event_t *ev, const char *topic,
                                   const char *const *names, size_t n,
                                   char **values) {
  size_t cnt = 0;
  const rd_kafka_ConfigResource_t **res =
      rd_kafka_DescribeConfigs_result_resources(
          rd_kafka_event_DescribeConfigs_result(ev), &cnt);
  if (cnt != 1)
    return kl__err(KL_EKAFKA,
                   "describe the configuration of topic %s: the "
                   "cluster answered %zu resources, not 1",
                   topic, cnt);
  rd_kafka_resp_err_t kerr = rd_kafka_ConfigResource_error(res[0]);
  if (kerr)
    return kl__err(KL_EKAFKA, "describe the configuration of topic %s: %s",
                   topic,
                   rd_kafka_ConfigResource_error_string(res[0])
                       ? rd_kafka_ConfigResource_error_string(res[0])
                       : rd_kafka_err2str(kerr));
  size_t centries = 0;
  const rd_kafka_ConfigEntry_t **entries =
      rd_kafka_ConfigResource_configs(res[0], &centries);
  for (size_t i = 0; i < centries; i++)
    for (size_t j = 0; j < n; j++)
      if (!values[j] && rd_kafka_ConfigEntry_value(entries[i]) &&
          strcmp(rd_kafka_ConfigEntry_name(entries[i]), names[j]) == 0 &&
          !(values[j] = strdup(rd_kafka_ConfigEntry_value(entries[i]))))
        return KL_ENOMEM;
  return KL_OK;
}

kl_err_t kl__kafka_topic_configs(rd_kafka_t *rk, const char *topic,
                                 const char *const *names, size_t n,
                                 char **values, int timeout_ms) {
  memset(values, 0, n * sizeof(*values));
  char errstr[256];
  rd_kafka_AdminOptions_t *opts =
      rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
  rd_kafka_AdminOptions_set_request_timeout(opts, timeout_ms, errstr,
                                            sizeof(errstr));
  rd_kafka_ConfigResource_t *res =
      rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_DescribeConfigs(rk, &res, 1, opts, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, timeout_ms + 1000);
  kl_err_t err;
  if (!ev)
    err = kl__err(KL_EKAFKA_TRANSIENT,
                  "describe the configuration of topic "
                  "%s: no answer within %d ms",
                  topic, timeout_ms);
  else if (rd_kafka_event_error(ev))
    err = kl__err(rd_kafka_event_error(ev) == RD_KAFKA_RESP_ERR__TIMED_OUT
                      ? KL_EKAFKA_TRANSIENT
                      : KL_EKAFKA,
                  "describe the configuration of topic %s: %s", topic,
                  rd_kafka_event_error_string(ev));
  else
    err = kafka_configs_take(ev, topic, names, n, values);
  for (size_t i = 0; err && i < n; i++) {
    free(values[i]);
    values[i] = NULL;
  }
  if (ev)
    rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_ConfigResource_destroy(res);
  rd_kafka_AdminOptions_destroy(opts);
  return err;
}

/* ---- owner epochs in the commit metadata ------------------------------- */

#define KL_EPOCH_META "keylane.epoch="

void kl__kafka_epoch_set(rd_kafka_topic_partition_t *tp, uint64_t epoch) {
  char buf[48];
  int len = snprintf(buf, sizeof(buf), KL_EPOCH_META "%" PRIu64, epoch);
  void *meta = malloc((size_t)len);
  if (!meta)
    return; /* the commit goes without: the next one carries it */
  memcpy(meta, buf, (size_t)len);
  free(tp->metadata);
  tp->metadata = meta;
  tp->metadata_size = (size_t)len;
}

uint64_t kl__kafka_epoch_get(const rd_kafka_topic_partition_t *tp) {
  size_t prefix = sizeof(KL_EPOCH_META) - 1;
  char buf[48];
  if (!tp->metadata || tp->metadata_size <= prefix ||
      tp->metadata_size >= sizeof(buf) ||
      memcmp(tp->metadata, KL_EPOCH_META, prefix) != 0)
    return 0;
  memcpy(buf, tp->metadata, tp->metadata_size);
  buf[tp->metadata_size] = '\0';
  return strtoull(buf + prefix, NULL, 10);
}

kl_err_t kl__kafka_committed_epochs(rd_kafka_t *rk, const char *topic,
                                    const int32_t *partitions, size_t n,
                                    uint64_t *epochs, int64_t *offsets,
                                    int timeout_ms) {
  memset(epochs, 0, n * sizeof(*epochs));
  for (size_t i = 0; offsets && i < n; i++)
    offsets[i] = RD_KAFKA_OFFSET_INVALID;
  rd_kafka_topic_partition_list_t *l =
      rd_kafka_topic_partition_list_new((int)n);
  for (size_t i = 0; i < n; i++)
    rd_kafka_topic_partition_list_add(l, topic, partitions[i]);
  rd_kafka_resp_err_t kerr = rd_kafka_committed(rk, l, timeout_ms);
  for (int i = 0; !kerr && i < l->cnt; i++)
    for (size_t j = 0; j < n && !l->elems[i].err; j++)
      if (partitions[j] == l->elems[i].partition) {
        epochs[j] = kl__kafka_epoch_get(&l->elems[i]);
        if (offsets)
          offsets[j] = l->elems[i].offset;
      }
  rd_kafka_topic_partition_list_destroy(l);
  if (kerr)
    return kl__err(KL_EKAFKA_TRANSIENT,
                   "read the owner epochs committed for topic %s: %s", topic,
                   rd_kafka_err2str(kerr));
  return KL_OK;
}

kl_err_t kl__kafka_group_epochs(const kl_conf_t *conf, const char *group,
                                const char *topic, const int32_t *partitions,
                                size_t n, uint64_t *epochs, int64_t *offsets,
                                int timeout_ms) {
  memset(epochs, 0, n * sizeof(*epochs));
  for (size_t i = 0; offsets && i < n; i++)
    offsets[i] = RD_KAFKA_OFFSET_INVALID;
  rd_kafka_t *rk;
  kl_err_t err = kl__kafka_reader_new(conf, group, "earliest", &rk);
  if (err)
    return err;
  err = kl__kafka_committed_epochs(rk, topic, partitions, n, epochs, offsets,
                                   timeout_ms);
  rd_kafka_destroy(rk);
  return err;
}
