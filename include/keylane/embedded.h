/**
 * @file embedded.h
 * @brief An embedded Kafka-protocol cluster for demos and tests.
 *
 * It is librdkafka's mock cluster: real TCP listeners on 127.0.0.1 that
 * speak the Kafka protocol, with topics, consumer groups and offsets kept in
 * memory. Nothing survives kl_embedded_destroy(). Not a replacement for
 * Apache Kafka in production.
 *
 * Caveats:
 * - The cluster runs on its own threads; the handle may be used from any
 *   one thread at a time.
 */
#ifndef KEYLANE_EMBEDDED_H
#define KEYLANE_EMBEDDED_H

#include <stdint.h>

#include "keylane/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_embedded kl_embedded_t;

/**
 * Starts a cluster of @p brokers brokers (1..16) and, when @p topic is not
 * NULL, creates it with @p partitions partitions (replication factor
 * min(3, brokers)).
 */
KL_EXPORT kl_err_t kl_embedded_new(int brokers, const char *topic,
                                   int32_t partitions, kl_embedded_t **out);

/** Creates another topic. */
KL_EXPORT kl_err_t kl_embedded_topic_create(kl_embedded_t *embedded,
                                            const char *topic,
                                            int32_t partitions);

/**
 * @returns "HOST:PORT[,HOST:PORT...]".
 * @remark  Borrowed: valid until kl_embedded_destroy().
 */
KL_EXPORT const char *kl_embedded_bootstrap(const kl_embedded_t *embedded);

/** Stops the cluster and frees @p embedded; accepts NULL. */
KL_EXPORT void kl_embedded_destroy(kl_embedded_t *embedded);

#ifdef __cplusplus
}
#endif
#endif
