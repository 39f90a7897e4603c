/* librdkafka glue shared by the producer, the worker and the tools. */
#ifndef KEYLANE_COMMON_KAFKA_H
#define KEYLANE_COMMON_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "common/internal.h"

/**
 * Sets one librdkafka property on the rd_kafka_conf_t @p rkconf; the shape
 * of kl_conf_foreach_kafka()'s callback. Errors name kafka.NAME=VALUE.
 */
kl_err_t kl__kafka_set(void *rkconf, const char *name, const char *value);

/**
 * Applies keylane's defaults (pairs of name, value; NULL-terminated), then
 * every "kafka.*" key of @p conf, which may override them. Installs
 * kl__kafka_log. On failure @p rkconf is left to the caller to destroy.
 */
kl_err_t kl__kafka_conf_apply(rd_kafka_conf_t *rkconf, const kl_conf_t *conf,
                              const char *const *defaults);

/** fetch.wait.max.ms of a consumer of an embedded cluster (keylane/
 *  embedded.h: it holds a fetch that finds nothing for that long). */
#define KL_EMBEDDED_FETCH_WAIT_MS "10"

/**
 * @returns 1 when @p bootstrap (may be NULL) is the bootstrap string of an
 *          embedded cluster running in this process (broker/embedded.c);
 *          0 otherwise. Any thread.
 */
int kl__embedded_local(const char *bootstrap);

/**
 * librdkafka's log callback, into keylane's log as component "rdkafka".
 * Runs on librdkafka's threads. Lost connections (LOG_ERR, retried) become
 * warnings; offset commits refused during a rebalance become debug lines,
 * since keylane's Kafka offsets serve lag monitoring only.
 */
void kl__kafka_log(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf);

/**
 * librdkafka's error callback, installed by kl__kafka_conf_apply(): logs
 * the error and notes a broker's refusal of this process's credentials or
 * TLS handshake (kl__kafka_refusal_note()). A handle that installs its own
 * callback calls kl__kafka_refusal_note() from it.
 */
void kl__kafka_error(rd_kafka_t *rk, int err, const char *reason, void *opaque);

/** Notes @p reason when @p err is a refusal of credentials (SASL) or of a
 *  TLS handshake, for kl__kafka_metadata(). Any thread. */
void kl__kafka_refusal_note(rd_kafka_t *rk, int err, const char *reason);

/**
 * The one mapping of librdkafka's error codes to kl_err_t: queue full,
 * stopped, unknown topic (KL_ENOTFOUND), the transient ones (timeouts, lost
 * brokers, no leader yet: KL_EKAFKA_TRANSIENT), and everything else,
 * authorization and authentication failures among them, KL_EKAFKA.
 */
kl_err_t kl__kafka_err(rd_kafka_resp_err_t err);

/** Whether Kafka refused a record for what it is (too large, invalid), so
 *  that producing it again cannot succeed whatever the cluster does. */
bool kl__kafka_record_refused(rd_kafka_resp_err_t err);

/**
 * The one metadata request: of @p topic, or with NULL of every topic the
 * handle @p rk knows, waiting at most @p timeout_ms.
 * @param md  on KL_OK, the metadata; the caller rd_kafka_metadata_destroy()s
 *            it. A topic-level error is in md->topics[i].err.
 * @returns KL_OK, or the request's failure through kl__kafka_err() with a
 *          detail naming the topic, the timeout and librdkafka's reason;
 *          KL_EKAFKA, not transient, when a broker refused this process's
 *          credentials or TLS handshake meanwhile: the detail says which
 *          and what to check, so that a wrong password or CA fails at
 *          once instead of being waited out.
 */
kl_err_t kl__kafka_metadata(rd_kafka_t *rk, const char *topic, int timeout_ms,
                            const struct rd_kafka_metadata **md);

/**
 * The metadata of every topic in the cluster. A request that names a
 * topic makes a cluster that creates topics on first use create it
 * (librdkafka's mock cluster, the embedded one, does whatever the client
 * asks; Kafka with auto.create.topics.enable for a producer): this one
 * names none, so it can tell that a topic does not exist. Heavier than one
 * topic's on a cluster of many topics: ask it once, not per record.
 * @param md  as kl__kafka_metadata()'s.
 */
kl_err_t kl__kafka_metadata_all(rd_kafka_t *rk, int timeout_ms,
                                const struct rd_kafka_metadata **md);

/** @returns @p topic's entry in @p md when it has partitions and no error,
 *  else NULL; borrowed from @p md. */
const rd_kafka_metadata_topic_t *
kl__kafka_metadata_find(const struct rd_kafka_metadata *md, const char *topic);

/**
 * Whether the cluster can answer the Admin API requests that librdkafka
 * sends to the controller (DescribeConfigs, in 2.0.2): its metadata names
 * a controller among its brokers. librdkafka's mock cluster (the embedded
 * one) names broker 0, which is none of its brokers, and a request sent
 * there would wait for it until its timeout.
 * @returns 1 or 0; -1 when the metadata could not be read within
 *          @p timeout_ms (kl_err_detail() says why).
 */
int kl__kafka_has_controller(rd_kafka_t *rk, int timeout_ms);

/**
 * Reads the configuration entries @p names (@p n of them) of @p topic
 * through the Admin API (DescribeConfigs), on any handle @p rk.
 * @param values  receives @p n malloc()ed values, the caller's to free;
 *                NULL for an entry the broker did not list or has no value.
 * @returns KL_OK; KL_EKAFKA_TRANSIENT when the cluster did not answer in
 *          @p timeout_ms; KL_EKAFKA when it refused (the detail names the
 *          topic and the broker's error). On failure every value is NULL.
 */
kl_err_t kl__kafka_topic_configs(rd_kafka_t *rk, const char *topic,
                                 const char *const *names, size_t n,
                                 char **values, int timeout_ms);

/*
 * Owner epochs in Kafka: every offset commit of a worker carries its
 * partition's epoch in the commit's metadata ("keylane.epoch=E"), so that
 * the highest epoch the fleet used outlives its store. A new or rebuilt
 * store starts above it (kl__store_acquire_above()).
 */

/** Sets @p tp's commit metadata to @p epoch (freed with its list). */
void kl__kafka_epoch_set(rd_kafka_topic_partition_t *tp, uint64_t epoch);

/** @returns the epoch in @p tp's commit metadata; 0 when it holds none. */
uint64_t kl__kafka_epoch_get(const rd_kafka_topic_partition_t *tp);

/**
 * Reads the epochs the consumer group of @p rk committed for @p n
 * partitions of @p topic (rd_kafka_committed(): one request to the group
 * coordinator) into @p epochs, 0 for a partition without one, and the
 * committed offsets into @p offsets (may be NULL), RD_KAFKA_OFFSET_INVALID
 * for a partition the group never committed.
 * @returns KL_OK; KL_EKAFKA_TRANSIENT with the detail when the coordinator
 *          did not answer in @p timeout_ms (every epoch is then 0, every
 *          offset RD_KAFKA_OFFSET_INVALID).
 */
kl_err_t kl__kafka_committed_epochs(rd_kafka_t *rk, const char *topic,
                                    const int32_t *partitions, size_t n,
                                    uint64_t *epochs, int64_t *offsets,
                                    int timeout_ms);

/**
 * The same for the consumer group @p group, through a consumer of its own
 * made from the "kafka.*" keys of @p conf; it does not join the group.
 */
kl_err_t kl__kafka_group_epochs(const kl_conf_t *conf, const char *group,
                                const char *topic, const int32_t *partitions,
                                size_t n, uint64_t *epochs, int64_t *offsets,
                                int timeout_ms);

#endif
