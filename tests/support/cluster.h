/*
 * The cluster a test runs on: the embedded cluster by default, or any
 * Kafka cluster named by KEYLANE_TEST_BOOTSTRAP, so that one test body
 * serves both the mock and the kafka suites.
 *
 * Environment:
 *   KEYLANE_TEST_BOOTSTRAP  HOST:PORT[,...] of a real cluster; unset or
 *                           empty: start an embedded cluster.
 *   KEYLANE_TEST_RF         replication factor of the topics created on a
 *                           real cluster (default 1).
 *   KEYLANE_TEST_KEEP       set: keep the topics created on a real cluster.
 *
 * On a real cluster every topic and group name gets a suffix unique to the
 * run ("<name>-<run id>"), so runs never see each other's records or group
 * members; read the names back with kl_t_topic() and kl_t_group().
 *
 * Caveats: a cluster handle is used from one thread at a time.
 */
#ifndef KEYLANE_TESTS_SUPPORT_CLUSTER_H
#define KEYLANE_TESTS_SUPPORT_CLUSTER_H

#include <stdint.h>

#include "keylane/error.h"

typedef struct kl_t_cluster kl_t_cluster_t;

/**
 * Starts an embedded cluster of @p brokers brokers with @p topic of
 * @p partitions partitions or, with KEYLANE_TEST_BOOTSTRAP set, creates the
 * topic on that cluster (CreateTopics) and waits until every partition has
 * a leader. @p brokers is ignored on a real cluster.
 * @param out  receives the cluster, freed with kl_t_cluster_destroy().
 * @returns KL_OK, or an error with kl_err_detail() (also printed).
 */
kl_err_t kl_t_cluster_new(int brokers, const char *topic, int partitions,
                          kl_t_cluster_t **out);

/** Creates another topic; its name on this cluster is kl_t_name(topic). */
kl_err_t kl_t_cluster_topic_create(kl_t_cluster_t *cluster, const char *topic,
                                   int partitions);

/**
 * Deletes @p topic (a name as passed to kl_t_cluster_new()) and creates it
 * again, empty, under the same name, with @p partitions partitions: a log
 * that starts over at offset 0 under a store that remembers the old one.
 * librdkafka's mock cluster cannot delete a topic, so an embedded cluster
 * is replaced by a new one holding only @p topic: read kl_t_bootstrap()
 * again after.
 */
kl_err_t kl_t_cluster_topic_recreate(kl_t_cluster_t **cluster,
                                     const char *topic, int partitions);

/**
 * Grows @p topic (a name as on the cluster) to @p partitions partitions
 * (CreatePartitions) and waits until each has a leader. Real clusters only:
 * librdkafka 2.0.2's mock cannot add partitions (KL_EINVAL says so).
 */
kl_err_t kl_t_cluster_grow(kl_t_cluster_t *cluster, const char *topic,
                           int partitions);

/** @returns the bootstrap string; borrowed, valid until destroy. */
const char *kl_t_bootstrap(const kl_t_cluster_t *cluster);

/** @returns the name of the topic given to kl_t_cluster_new(). */
const char *kl_t_topic(const kl_t_cluster_t *cluster);

/**
 * @returns @p name as it is on this cluster: unchanged on the embedded
 *          cluster, "<name>-<run id>" on a real one. Borrowed, valid until
 *          destroy. Use it for topics and consumer groups.
 */
const char *kl_t_name(kl_t_cluster_t *cluster, const char *name);
#define kl_t_group kl_t_name

/** @returns 1 on a real cluster (KEYLANE_TEST_BOOTSTRAP), 0 embedded. */
int kl_t_cluster_is_real(const kl_t_cluster_t *cluster);

/**
 * @returns the broker id of the leader of @p partition of @p topic (a name
 *          as on the cluster), from a fresh Metadata request; -1 when it has
 *          none or the request failed.
 */
int32_t kl_t_leader(kl_t_cluster_t *cluster, const char *topic,
                    int32_t partition);

/** Deletes the topics it created on a real cluster (unless
 *  KEYLANE_TEST_KEEP), stops an embedded one; accepts NULL. */
void kl_t_cluster_destroy(kl_t_cluster_t *cluster);

#endif
