#include "support/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "keylane/embedded.h"

#define KL_T_NAMES_MAX 32
#define KL_T_ADMIN_MS 30000

struct kl_t_cluster {
  kl_embedded_t *embedded; /* NULL on a real cluster */
  rd_kafka_t *admin;       /* real cluster: admin requests and metadata */
  char bootstrap[512];
  char run[32];
  int rf;
  /* Names handed out by kl_t_name(), "base\0name" pairs. */
  char *bases[KL_T_NAMES_MAX], *names[KL_T_NAMES_MAX];
  int created[KL_T_NAMES_MAX]; /* topics this run created */
  int count;
  const char *topic;
};

static kl_err_t kl_t_fail(kl_err_t err, const char *what, const char *why) {
  kl__err(err, "test cluster: %s: %s", what, why);
  fprintf(stderr, "%s\n", kl_err_detail());
  return err;
}

const char *kl_t_name(kl_t_cluster_t *cluster, const char *name) {
  if (cluster->embedded)
    return name;
  for (int i = 0; i < cluster->count; i++)
    if (strcmp(cluster->bases[i], name) == 0)
      return cluster->names[i];
  if (cluster->count == KL_T_NAMES_MAX)
    abort(); /* a test with more names than this is mistaken */
  size_t len = strlen(name) + strlen(cluster->run) + 2;
  char *full = malloc(len);
  if (!full)
    abort();
  snprintf(full, len, "%s-%s", name, cluster->run);
  cluster->bases[cluster->count] = strdup(name);
  cluster->names[cluster->count] = full;
  cluster->created[cluster->count] = 0;
  cluster->count++;
  return full;
}

static int kl_t_index(const kl_t_cluster_t *cluster, const char *full) {
  for (int i = 0; i < cluster->count; i++)
    if (strcmp(cluster->names[i], full) == 0)
      return i;
  return -1;
}

/* Waits for one admin result event of @p type on @p queue. */
static rd_kafka_event_t *kl_t_admin_wait(rd_kafka_queue_t *queue, int type) {
  for (int t = 0; t < KL_T_ADMIN_MS; t += 100) {
    rd_kafka_event_t *ev = rd_kafka_queue_poll(queue, 100);
    if (ev && rd_kafka_event_type(ev) == type)
      return ev;
    if (ev)
      rd_kafka_event_destroy(ev);
  }
  return NULL;
}

/* Metadata of @p topic: 1 when it has @p partitions partitions that all
 * have a leader. With @p partition >= 0 returns that partition's leader. */
static int32_t kl_t_meta(kl_t_cluster_t *cluster, const char *topic,
                         int partitions, int32_t partition) {
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(cluster->admin, topic, NULL);
  const struct rd_kafka_metadata *md = NULL;
  int32_t answer = -1;
  if (rkt && !rd_kafka_metadata(cluster->admin, 0, rkt, &md, 5000) &&
      md->topic_cnt == 1 && !md->topics[0].err) {
    const rd_kafka_metadata_topic_t *mt = &md->topics[0];
    if (partition >= 0) {
      for (int i = 0; i < mt->partition_cnt; i++)
        if (mt->partitions[i].id == partition && !mt->partitions[i].err)
          answer = mt->partitions[i].leader;
    } else if (mt->partition_cnt == partitions) {
      answer = 1;
      for (int i = 0; i < mt->partition_cnt; i++)
        if (mt->partitions[i].leader < 0)
          answer = 0;
    } else {
      answer = 0;
    }
  }
  if (md)
    rd_kafka_metadata_destroy(md);
  if (rkt)
    rd_kafka_topic_destroy(rkt);
  return answer;
}

/* Waits until @p full has @p partitions partitions, each with a leader. */
static kl_err_t kl_t_await_leaders(kl_t_cluster_t *cluster, const char *full,
                                   int partitions) {
  for (int t = 0; kl_t_meta(cluster, full, partitions, -1) != 1; t += 200) {
    if (t >= KL_T_ADMIN_MS)
      return kl_t_fail(KL_ETIMEOUT, full,
                       "partitions without a leader after 30 s");
    struct timespec tick = {0, 200000000L};
    nanosleep(&tick, NULL);
  }
  return KL_OK;
}

static kl_err_t kl_t_create(kl_t_cluster_t *cluster, const char *full,
                            int partitions) {
  char errstr[256];
  rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(full, partitions, cluster->rf,
                                                  errstr, sizeof(errstr));
  if (!nt)
    return kl_t_fail(KL_EINVAL, full, errstr);
  rd_kafka_queue_t *queue = rd_kafka_queue_new(cluster->admin);
  rd_kafka_CreateTopics(cluster->admin, &nt, 1, NULL, queue);
  rd_kafka_NewTopic_destroy(nt);
  rd_kafka_event_t *ev =
      kl_t_admin_wait(queue, RD_KAFKA_EVENT_CREATETOPICS_RESULT);
  kl_err_t err = KL_OK;
  if (!ev) {
    err = kl_t_fail(KL_ETIMEOUT, full, "CreateTopics got no answer in 30 s");
  } else if (rd_kafka_event_error(ev)) {
    err = kl_t_fail(KL_EKAFKA, full, rd_kafka_event_error_string(ev));
  } else {
    size_t n;
    const rd_kafka_topic_result_t **res = rd_kafka_CreateTopics_result_topics(
        rd_kafka_event_CreateTopics_result(ev), &n);
    if (n == 1 && rd_kafka_topic_result_error(res[0])) {
      snprintf(errstr, sizeof(errstr),
               "%s (replication factor %d: set "
               "KEYLANE_TEST_RF to at most the cluster's broker count)",
               rd_kafka_topic_result_error_string(res[0]), cluster->rf);
      err = kl_t_fail(KL_EKAFKA, full, errstr);
    }
  }
  if (ev)
    rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(queue);
  if (!err)
    err = kl_t_await_leaders(cluster, full, partitions);
  if (!err)
    cluster->created[kl_t_index(cluster, full)] = 1;
  return err;
}

/* A worker checks at start that its dead-letter topic, "<topic>.dlq",
 * exists; the broker creates none (auto.create.topics.enable=false). The
 * name is the topic's full name plus ".dlq", as the worker derives it. */
static kl_err_t kl_t_create_dlq(kl_t_cluster_t *cluster, const char *full) {
  if (cluster->count == KL_T_NAMES_MAX)
    abort();
  size_t len = strlen(full) + 5;
  char *name = malloc(len);
  if (!name)
    abort();
  snprintf(name, len, "%s.dlq", full);
  cluster->bases[cluster->count] = strdup(name);
  cluster->names[cluster->count] = name;
  cluster->created[cluster->count++] = 0;
  return kl_t_create(cluster, name, 1);
}

kl_err_t kl_t_cluster_grow(kl_t_cluster_t *cluster, const char *topic,
                           int partitions) {
  if (cluster->embedded)
    return kl_t_fail(KL_EINVAL, topic,
                     "the embedded cluster (librdkafka's "
                     "mock) cannot add partitions: run on a real cluster");
  char errstr[256];
  rd_kafka_NewPartitions_t *np = rd_kafka_NewPartitions_new(
      topic, (size_t)partitions, errstr, sizeof(errstr));
  if (!np)
    return kl_t_fail(KL_EINVAL, topic, errstr);
  rd_kafka_queue_t *queue = rd_kafka_queue_new(cluster->admin);
  rd_kafka_CreatePartitions(cluster->admin, &np, 1, NULL, queue);
  rd_kafka_NewPartitions_destroy(np);
  rd_kafka_event_t *ev =
      kl_t_admin_wait(queue, RD_KAFKA_EVENT_CREATEPARTITIONS_RESULT);
  kl_err_t err = KL_OK;
  if (!ev) {
    err = kl_t_fail(KL_ETIMEOUT, topic, "CreatePartitions got no answer");
  } else {
    size_t n;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreatePartitions_result_topics(
            rd_kafka_event_CreatePartitions_result(ev), &n);
    if (rd_kafka_event_error(ev))
      err = kl_t_fail(KL_EKAFKA, topic, rd_kafka_event_error_string(ev));
    else if (n == 1 && rd_kafka_topic_result_error(res[0]))
      err = kl_t_fail(KL_EKAFKA, topic,
                      rd_kafka_topic_result_error_string(res[0]));
  }
  if (ev)
    rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(queue);
  return err ? err : kl_t_await_leaders(cluster, topic, partitions);
}

kl_err_t kl_t_cluster_topic_create(kl_t_cluster_t *cluster, const char *topic,
                                   int partitions) {
  if (cluster->embedded)
    return kl_embedded_topic_create(cluster->embedded, topic, partitions);
  const char *full = kl_t_name(cluster, topic);
  kl_err_t err = kl_t_create(cluster, full, partitions);
  return err ? err : kl_t_create_dlq(cluster, full);
}

static kl_err_t kl_t_real_new(kl_t_cluster_t *cluster, const char *bootstrap) {
  snprintf(cluster->bootstrap, sizeof(cluster->bootstrap), "%s", bootstrap);
  const char *rf = getenv("KEYLANE_TEST_RF");
  cluster->rf = rf && *rf ? atoi(rf) : 1;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  snprintf(
      cluster->run, sizeof(cluster->run), "%lx%04x", (unsigned long)now.tv_sec,
      (unsigned)(getpid() & 0xffff) ^ (unsigned)(now.tv_nsec >> 10 & 0xffff));
  char errstr[256];
  rd_kafka_conf_t *rkconf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(rkconf, "bootstrap.servers", bootstrap, errstr,
                        sizeof(errstr)) != RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(rkconf);
    return kl_t_fail(KL_ECONF, bootstrap, errstr);
  }
  rd_kafka_conf_set(rkconf, "log_level", "3", NULL, 0);
  cluster->admin =
      rd_kafka_new(RD_KAFKA_PRODUCER, rkconf, errstr, sizeof(errstr));
  if (!cluster->admin) {
    rd_kafka_conf_destroy(rkconf);
    return kl_t_fail(KL_EKAFKA, bootstrap, errstr);
  }
  return KL_OK;
}

kl_err_t kl_t_cluster_new(int brokers, const char *topic, int partitions,
                          kl_t_cluster_t **out) {
  kl_t_cluster_t *cluster = calloc(1, sizeof(*cluster));
  if (!cluster)
    return KL_ENOMEM;
  const char *bootstrap = getenv("KEYLANE_TEST_BOOTSTRAP");
  kl_err_t err;
  if (bootstrap && *bootstrap) {
    err = kl_t_real_new(cluster, bootstrap);
    if (!err && topic)
      err = kl_t_cluster_topic_create(cluster, topic, partitions);
  } else {
    err = kl_embedded_new(brokers, topic, partitions, &cluster->embedded);
    if (!err)
      snprintf(cluster->bootstrap, sizeof(cluster->bootstrap), "%s",
               kl_embedded_bootstrap(cluster->embedded));
  }
  if (err) {
    kl_t_cluster_destroy(cluster);
    return err;
  }
  cluster->topic = topic ? kl_t_name(cluster, topic) : NULL;
  *out = cluster;
  return KL_OK;
}

const char *kl_t_bootstrap(const kl_t_cluster_t *cluster) {
  return cluster->bootstrap;
}

const char *kl_t_topic(const kl_t_cluster_t *cluster) {
  return cluster->topic;
}

int kl_t_cluster_is_real(const kl_t_cluster_t *cluster) {
  return cluster->embedded == NULL;
}

int32_t kl_t_leader(kl_t_cluster_t *cluster, const char *topic,
                    int32_t partition) {
  return cluster->admin ? kl_t_meta(cluster, topic, 0, partition) : -1;
}

/* Deletes the topics this run created, or only @p only when not NULL;
 * 0 when the broker answered. */
static int kl_t_delete_topics(kl_t_cluster_t *cluster, const char *only) {
  rd_kafka_DeleteTopic_t *del[KL_T_NAMES_MAX];
  size_t n = 0;
  for (int i = 0; i < cluster->count; i++)
    if (cluster->created[i] && (!only || strcmp(only, cluster->names[i]) == 0))
      del[n++] = rd_kafka_DeleteTopic_new(cluster->names[i]);
  if (n == 0)
    return 0;
  rd_kafka_queue_t *queue = rd_kafka_queue_new(cluster->admin);
  rd_kafka_DeleteTopics(cluster->admin, del, n, NULL, queue);
  rd_kafka_event_t *ev =
      kl_t_admin_wait(queue, RD_KAFKA_EVENT_DELETETOPICS_RESULT);
  if (ev)
    rd_kafka_event_destroy(ev);
  else
    fprintf(stderr,
            "test cluster: DeleteTopics got no answer; topics of run "
            "%s stay on %s\n",
            cluster->run, cluster->bootstrap);
  rd_kafka_queue_destroy(queue);
  rd_kafka_DeleteTopic_destroy_array(del, n);
  return ev ? 0 : -1;
}

kl_err_t kl_t_cluster_topic_recreate(kl_t_cluster_t **cluster,
                                     const char *topic, int partitions) {
  kl_t_cluster_t *c = *cluster;
  if (c->embedded) {
    kl_t_cluster_destroy(c);
    *cluster = NULL;
    return kl_t_cluster_new(1, topic, partitions, cluster);
  }
  const char *full = kl_t_name(c, topic);
  if (kl_t_delete_topics(c, full) != 0)
    return kl_t_fail(KL_ETIMEOUT, full, "DeleteTopics got no answer in 30 s");
  /* The broker answers before every node forgot the topic; until then a
   * CreateTopics of the name fails with TOPIC_ALREADY_EXISTS. */
  for (int t = 0; kl_t_meta(c, full, 0, -1) >= 0; t += 200) {
    if (t >= KL_T_ADMIN_MS)
      return kl_t_fail(KL_ETIMEOUT, full,
                       "still in the metadata 30 s after "
                       "DeleteTopics");
    struct timespec tick = {0, 200000000L};
    nanosleep(&tick, NULL);
  }
  return kl_t_create(c, full, partitions);
}

void kl_t_cluster_destroy(kl_t_cluster_t *cluster) {
  if (!cluster)
    return;
  if (cluster->admin) {
    if (!getenv("KEYLANE_TEST_KEEP"))
      kl_t_delete_topics(cluster, NULL);
    rd_kafka_destroy(cluster->admin);
  }
  kl_embedded_destroy(cluster->embedded);
  for (int i = 0; i < cluster->count; i++) {
    free(cluster->bases[i]);
    free(cluster->names[i]);
  }
  free(cluster);
}
