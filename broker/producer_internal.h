/*
 * What the gateway needs of a producer beyond producer.h. Not installed.
 */
#ifndef KEYLANE_BROKER_PRODUCER_INTERNAL_H
#define KEYLANE_BROKER_PRODUCER_INTERNAL_H

#include <librdkafka/rdkafka.h>

#include "keylane/event.h"
#include "keylane/producer.h"

/**
 * @returns the producer's librdkafka handle, borrowed for the producer's
 *          life. For what librdkafka allows from any thread (metadata
 *          requests, queue wake-ups); producing and polling stay with
 *          kl_publish() and kl_producer_poll() on the producer's thread.
 */
rd_kafka_t *kl__producer_rk(kl_producer_t *producer);

/**
 * Drops the producer's cached handle and partition count of @p topic, so
 * that a long-lived producer fed topic names by clients (the gateway) keeps
 * only those in use. A later publish reads them again. Events in flight to
 * the topic are not affected (librdkafka keeps its own reference).
 * On the producer's thread.
 */
void kl__producer_forget(kl_producer_t *producer, const char *topic);

/**
 * Whether @p topic may be published to: its partition count read on
 * first use, then watched (producer.partitions.check.ms).
 * @returns KL_OK; KL_EPARTITIONS when its count is not the expected one
 *          (the detail names both and the fix); or the error of reading it.
 *          On the producer's thread.
 */
kl_err_t kl__producer_topic_check(kl_producer_t *producer, const char *topic);

/**
 * What kl_publish() checks of a valid event beyond the envelope's rules,
 * by this host's clock: its not_before under the producer's
 * timer.max.delay (kl__not_before_check()), and that it fits one
 * Kafka record (kl__record_check(), counting the 36-byte id kl_publish()
 * makes for an event without one). For a caller that must refuse a batch
 * before publishing any of it (the gateway). Any thread.
 * @param envelope_size  receives the envelope's size (kl__envelope_size());
 *                       may be NULL.
 * @returns KL_OK, KL_EINVAL for a time out of bounds, or
 *          KL_EDECODE_OVERSIZE, naming the problem and the fix.
 */
kl_err_t kl__producer_event_check(const kl_producer_t *producer,
                                  const kl_event_t *event,
                                  size_t *envelope_size);

#endif
