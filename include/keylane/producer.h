/**
 * @file producer.h
 * @brief Publishing events: route by key, produce with acks=all.
 *
 * The producer is a librdkafka idempotent producer (enable.idempotence=true,
 * acks=all). It computes every event's partition itself with
 * kl_partition() (event.h), byte-identical to the Java client's default
 * partitioner, and sets it explicitly.
 *
 * In-flight budget: at most "producer.inflight.max" events (default
 * 100000) are waiting for their delivery report. kl_publish() on a full
 * budget serves delivery reports for up to "producer.enqueue.timeout.ms"
 * (default 5000) waiting for room, then returns KL_EQUEUE_FULL and the
 * event is not produced.
 *
 * Caveats:
 * - A producer is used from one thread at a time. The delivery callback
 *   runs on that thread, from inside kl_publish(), kl_producer_poll() or
 *   kl_flush().
 * - Each producer runs one thread of its own that reads its topics'
 *   partition counts on a timer; it calls no callback.
 */
#ifndef KEYLANE_PRODUCER_H
#define KEYLANE_PRODUCER_H

#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/event.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_delivery {
  kl_err_t err;       /**< KL_OK when Kafka acknowledged the event */
  const char *errmsg; /**< librdkafka's reason when err != KL_OK */
  const char *topic;
  int32_t partition;
  int64_t offset; /**< -1 unless delivered */
  const char *id; /**< the event's idempotency key (NUL terminated) */
  size_t id_len;
  void *opaque; /**< what the caller passed to kl_publish() */
} kl_delivery_t;

/** Delivery report; @p delivery and its strings live for the call only. */
typedef void(kl_delivery_cb_t)(void *cb_opaque, const kl_delivery_t *delivery);

typedef struct kl_producer kl_producer_t;

/**
 * Creates a producer from @p conf (borrowed; copied). "kafka.*" keys reach
 * librdkafka; keylane forces enable.idempotence=true and acks=all.
 *
 * @param cb  delivery callback; may be NULL.
 * @returns KL_OK and *out, or KL_ECONF/KL_EKAFKA with kl_err_detail().
 */
KL_EXPORT kl_err_t kl_producer_new(const kl_conf_t *conf, kl_delivery_cb_t *cb,
                                   void *cb_opaque, kl_producer_t **out);

/**
 * Publishes @p event to @p topic. The event's bytes are copied; when it has
 * no id, a UUIDv7 is made and reported in the delivery. The first publish to
 * a topic reads its partition count; when "producer.expect.partitions" is
 * set and differs, it returns KL_EPARTITIONS and the detail says why keys
 * would move. Without it, that first count is the expected one. The count
 * is read again every "producer.partitions.check.ms" (on a thread of the
 * producer's own); once it differs, every publish to the topic returns
 * KL_EPARTITIONS with both counts and the fix, and nothing is queued.
 *
 * @returns KL_OK once queued (the delivery callback says whether Kafka
 *          acknowledged it), or an error and the event was not queued.
 */
KL_EXPORT kl_err_t kl_publish(kl_producer_t *producer, const char *topic,
                              const kl_event_t *event, void *opaque);

/** Serves delivery reports for up to @p timeout_ms. @returns reports served. */
KL_EXPORT int kl_producer_poll(kl_producer_t *producer, int timeout_ms);

/**
 * Waits up to @p timeout_ms until every queued event has its delivery report.
 * @returns KL_OK, or KL_ETIMEOUT with events still in flight.
 */
KL_EXPORT kl_err_t kl_flush(kl_producer_t *producer, int timeout_ms);

/** @returns the number of events waiting for a delivery report. */
KL_EXPORT int64_t kl_producer_inflight(const kl_producer_t *producer);

/**
 * Reads the live partition count of @p topic (from Kafka on first use, then
 * every producer.partitions.check.ms), also when it differs from the
 * expected one.
 * @param count  set to the count on KL_OK, to 0 on failure.
 * @returns KL_OK, or the failure to read it (KL_ENOTFOUND for a topic that
 *          does not exist; a retriable code when Kafka did not answer),
 *          with kl_err_detail() saying which.
 */
KL_EXPORT kl_err_t kl_producer_partitions(kl_producer_t *producer,
                                          const char *topic, int32_t *count);

/** Flushes for up to 10 s, then frees @p producer; accepts NULL. */
KL_EXPORT void kl_producer_destroy(kl_producer_t *producer);

#ifdef __cplusplus
}
#endif
#endif
