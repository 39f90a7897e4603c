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

/**
 * librdkafka's log callback, into keylane's log as component "rdkafka".
 * Runs on librdkafka's threads. Lost connections (LOG_ERR, retried) become
 * warnings; offset commits refused during a rebalance become debug lines,
 * since keylane's Kafka offsets serve lag monitoring only.
 */
void kl__kafka_log(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf);

#endif
