/* Reading a topic back in a test: a consumer from the start, and the
 * headers of what it reads (dead letters, say). */
#ifndef KEYLANE_TESTS_SUPPORT_KAFKA_READ_H
#define KEYLANE_TESTS_SUPPORT_KAFKA_READ_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* A consumer in @p group subscribed to @p topic from its earliest offset;
 * NULL (said on stderr) when librdkafka refuses one. The caller ends it
 * with kl_t_consumer_destroy(). */
rd_kafka_t *kl_t_consumer(const char *bootstrap, const char *group,
                          const char *topic);

/* Polls @p rk until @p want records arrived or @p ms passed, calling @p fn
 * with each record (not errors) and its number from 0. @returns how many
 * arrived. */
int kl_t_consume(rd_kafka_t *rk, int want, int ms,
                 void (*fn)(void *opaque, const rd_kafka_message_t *m, int i),
                 void *opaque);

/* Closes and destroys @p rk; NULL is a no-op. */
void kl_t_consumer_destroy(rd_kafka_t *rk);

/* The offset @p group committed for @p partition of @p topic, or -1 when
 * it committed none (or Kafka did not answer in 5 s). */
int64_t kl_t_committed(const char *bootstrap, const char *group,
                       const char *topic, int32_t partition);

/* The last header @p name of @p h (may be NULL) as text in @p out; ""
 * when there is none. */
void kl_t_header(const rd_kafka_headers_t *h, const char *name, char *out,
                 size_t size);

/* The last header @p name of @p h as a decimal number; -1 when absent. */
int64_t kl_t_header_i64(const rd_kafka_headers_t *h, const char *name);

#endif
