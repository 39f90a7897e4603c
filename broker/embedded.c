/*
 * The embedded cluster: librdkafka's mock cluster on a dedicated rd_kafka_t
 * that exists only to own it. Its listeners are plain TCP on 127.0.0.1, so
 * other processes (workers, `keylane publish`) reach it like any broker.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/topic.h"
#include "keylane/embedded.h"

#define KL_EMBEDDED_BROKERS_MAX 16
#define KL_TOPIC_PARTITIONS_MAX 100000

struct kl_embedded {
  rd_kafka_t *rk; /* owns the mock cluster; never connects anywhere */
  rd_kafka_mock_cluster_t *mcluster;
  int brokers;
  char *bootstrap;
  struct kl_embedded *next; /* the process's running clusters */
};

/* The clusters of this process, for kl__embedded_local(). */
static pthread_mutex_t kl_running_mu = PTHREAD_MUTEX_INITIALIZER;
static kl_embedded_t *kl_running;

static void running_link(kl_embedded_t *embedded, int link) {
  pthread_mutex_lock(&kl_running_mu);
  kl_embedded_t **p = &kl_running;
  while (*p && *p != embedded)
    p = &(*p)->next;
  if (link && !*p) {
    embedded->next = kl_running;
    kl_running = embedded;
  } else if (!link && *p) {
    *p = embedded->next;
  }
  pthread_mutex_unlock(&kl_running_mu);
}

int kl__embedded_local(const char *bootstrap) {
  int found = 0;
  pthread_mutex_lock(&kl_running_mu);
  for (kl_embedded_t *e = kl_running; e && bootstrap && !found; e = e->next)
    found = strcmp(e->bootstrap, bootstrap) == 0;
  pthread_mutex_unlock(&kl_running_mu);
  return found;
}

/* librdkafka's internal threads call this; kl__log writes one line with
 * one write(2), so it is safe from any thread. The owning handle has no
 * bootstrap servers and says so at WARN: that is expected, keep it quiet. */
static void embedded_log(const rd_kafka_t *rk, int level, const char *fac,
                         const char *buf) {
  (void)rk;
  if (level <= 3)
    KL_LOG_E("embedded", "%s: %s", fac, buf);
  else
    KL_LOG_D("embedded", "%s: %s", fac, buf);
}

static kl_err_t embedded_check_topic(const char *topic, int32_t partitions) {
  kl_err_t err = kl__topic_check(topic, topic ? strlen(topic) : 0);
  if (err)
    return err;
  if (partitions < 1 || partitions > KL_TOPIC_PARTITIONS_MAX)
    return kl__err(KL_EINVAL, "topic %s: %d partitions, expected 1..%d", topic,
                   (int)partitions, KL_TOPIC_PARTITIONS_MAX);
  return KL_OK;
}

static rd_kafka_t *embedded_handle(void) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(conf, embedded_log);
  /* The mock brokers' connections take this handle's Nagle setting
   * (librdkafka sets TCP_NODELAY on an accepted socket when it is on).
   * Left on, a response written while the client has not yet acknowledged
   * the one before waits for its delayed ACK: a produce to three
   * partitions or more took 44 ms to be acknowledged, not 0.1 ms. */
  rd_kafka_conf_set(conf, "socket.nagle.disable", "true", errstr,
                    sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    kl__err(KL_EKAFKA, "embedded cluster: cannot create its handle: %s",
            errstr);
  }
  return rk;
}

kl_err_t kl_embedded_topic_create(kl_embedded_t *embedded, const char *topic,
                                  int32_t partitions) {
  kl__err_clear();
  if (!embedded)
    return kl__err(KL_EINVAL, "kl_embedded_topic_create: embedded is NULL");
  kl_err_t err = embedded_check_topic(topic, partitions);
  if (err)
    return err;
  int replicas = embedded->brokers < 3 ? embedded->brokers : 3;
  rd_kafka_resp_err_t rerr = rd_kafka_mock_topic_create(
      embedded->mcluster, topic, (int)partitions, replicas);
  if (rerr == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
    return kl__err(KL_EINVAL,
                   "topic %s already exists on the embedded "
                   "cluster",
                   topic);
  if (rerr)
    return kl__err(KL_EKAFKA, "embedded cluster: cannot create topic %s: %s",
                   topic, rd_kafka_err2str(rerr));
  KL_LOG_D("embedded", "created topic %s with %d partitions", topic,
           (int)partitions);
  return KL_OK;
}

static kl_err_t embedded_start(kl_embedded_t *embedded, int brokers) {
  if (!(embedded->rk = embedded_handle()))
    return KL_EKAFKA;
  embedded->mcluster = rd_kafka_mock_cluster_new(embedded->rk, brokers);
  if (!embedded->mcluster)
    return kl__err(KL_EKAFKA,
                   "embedded cluster: cannot start %d brokers "
                   "(no free ports on 127.0.0.1?)",
                   brokers);
  embedded->brokers = brokers;
  embedded->bootstrap =
      strdup(rd_kafka_mock_cluster_bootstraps(embedded->mcluster));
  if (!embedded->bootstrap)
    return KL_ENOMEM;
  running_link(embedded, 1);
  return KL_OK;
}

kl_err_t kl_embedded_new(int brokers, const char *topic, int32_t partitions,
                         kl_embedded_t **out) {
  kl__err_clear();
  if (!out)
    return kl__err(KL_EINVAL, "kl_embedded_new: out is NULL");
  if (brokers < 1 || brokers > KL_EMBEDDED_BROKERS_MAX)
    return kl__err(KL_EINVAL, "embedded cluster: %d brokers, expected 1..%d",
                   brokers, KL_EMBEDDED_BROKERS_MAX);
  kl_err_t err = topic ? embedded_check_topic(topic, partitions) : KL_OK;
  if (err)
    return err;
  kl_embedded_t *embedded = calloc(1, sizeof(*embedded));
  if (!embedded)
    return KL_ENOMEM;
  err = embedded_start(embedded, brokers);
  if (!err && topic)
    err = kl_embedded_topic_create(embedded, topic, partitions);
  if (err) {
    kl_embedded_destroy(embedded);
    return err;
  }
  *out = embedded;
  return KL_OK;
}

const char *kl_embedded_bootstrap(const kl_embedded_t *embedded) {
  return embedded ? embedded->bootstrap : "";
}

void kl_embedded_destroy(kl_embedded_t *embedded) {
  if (!embedded)
    return;
  running_link(embedded, 0);
  if (embedded->mcluster)
    rd_kafka_mock_cluster_destroy(embedded->mcluster);
  if (embedded->rk)
    rd_kafka_destroy(embedded->rk);
  free(embedded->bootstrap);
  free(embedded);
}
