/*
 * What the gateway needs of a producer beyond producer.h. Not installed.
 */
#ifndef KEYLANE_BROKER_PRODUCER_INTERNAL_H
#define KEYLANE_BROKER_PRODUCER_INTERNAL_H

#include <librdkafka/rdkafka.h>

#include "keylane/producer.h"

/**
 * @returns the producer's librdkafka handle, borrowed for the producer's
 *          life. For what librdkafka allows from any thread (metadata
 *          requests, queue wake-ups); producing and polling stay with
 *          kl_publish() and kl_producer_poll() on the producer's thread.
 */
rd_kafka_t *kl__producer_rk(kl_producer_t *producer);

/**
 * Whether @p topic may be published to: its partition count read on
 * first use, then watched (producer.partitions.check.ms).
 * @returns KL_OK; KL_EPARTITIONS when its count is not the expected one
 *          (the detail names both and the fix); or the error of reading it.
 *          On the producer's thread.
 */
kl_err_t kl__producer_topic_check(kl_producer_t *producer, const char *topic);

#endif
