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

#endif
