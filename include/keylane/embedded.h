/**
 * @file embedded.h
 * @brief An embedded Kafka-protocol cluster for demos and tests.
 *
 * It is librdkafka's mock cluster: real TCP listeners on 127.0.0.1 that
 * speak the Kafka protocol, with topics, consumer groups and offsets kept in
 * memory. Nothing survives kl_embedded_destroy(). Not a replacement for
 * Apache Kafka in production.
 *
 * Behaviour of librdkafka 2.0.2's mock cluster, checked by the tests:
 * - Topics are created on first use: any client's Metadata request that
 *   names a missing topic (a producer's first produce, a consumer's
 *   subscribe) creates it with 4 partitions and replication min(3,
 *   brokers). The mock ignores allow.auto.create.topics. So producing to
 *   `<topic>.dlq` just works, and a misspelled topic is silently created:
 *   create topics whose partition count matters with
 *   kl_embedded_topic_create() first, and keep the partition checks
 *   (producer.expect.partitions, worker.expect.partitions) on.
 * - Consumer groups (classic protocol, eager and cooperative-sticky) work
 *   across processes that connect over TCP. The first join of a group
 *   waits about 3 s (the mock's initial rebalance delay): members that
 *   start within it get one assignment together. A later join or leave
 *   makes the mock wait about session.timeout.ms - 1 s for every member
 *   to rejoin (9 s at the 10 s default), and meanwhile it holds back the
 *   members' heartbeats on the coordinator connection: with
 *   session.timeout.ms = 3000 members time out and rebalances never
 *   settle; 10000 works. cooperative-sticky moves a partition in two
 *   rebalances, so about twice as long. Start a fleet's processes
 *   together.
 * - Idempotent producers work (InitProducerId is served).
 * - A fetch that finds no record is answered only after the consumer's
 *   fetch.wait.max.ms (500 ms by default), even when records arrive
 *   meanwhile; Kafka answers as soon as they do. So a worker in this
 *   process that fetches from it waits at most 10 ms instead; a worker in
 *   another process wants -X kafka.fetch.wait.max.ms=10 (`keylane demo`
 *   passes it), or its events wait about 250 ms on average.
 * - Member ids are reused: the mock names a new member by the address of
 *   its struct, usually that of the member it dropped last. A process
 *   frozen (SIGSTOP, a debugger) past session.timeout.ms that resumes
 *   while its consumer waits for a JoinGroup or SyncGroup response or an
 *   assign call keeps its old id; when a member that joined meanwhile got
 *   that id, the mock aborts the process hosting the cluster
 *   (rdkafka_mock_cgrp.c:567, "Assertion `!member->resp' failed"). Start no
 *   member while one that the group dropped may come back.
 *
 * Caveats:
 * - The cluster runs on its own threads; the handle may be used from any
 *   one thread at a time.
 * - Records are kept in memory until kl_embedded_destroy().
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
 * min(3, brokers)). The listeners are on 127.0.0.1, on ports the kernel
 * picks; read them with kl_embedded_bootstrap().
 *
 * @param out  receives the cluster, freed with kl_embedded_destroy().
 * @returns KL_OK; KL_EINVAL (brokers, topic or partitions out of range);
 *          KL_EKAFKA when the cluster cannot start; details in
 *          kl_err_detail().
 */
KL_EXPORT kl_err_t kl_embedded_new(int brokers, const char *topic,
                                   int32_t partitions, kl_embedded_t **out);

/**
 * Creates another topic with @p partitions partitions (replication factor
 * min(3, brokers)).
 * @returns KL_OK; KL_EINVAL for a name Kafka would refuse, a count out of
 *          1..100000, or a topic that exists already (the detail says which).
 */
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
