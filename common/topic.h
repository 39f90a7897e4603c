/*
 * Topic names: Kafka's rule for a valid one, and the names a client may
 * not publish to (Kafka's internal topics and dead-letter topics), asked
 * the same way wherever a name comes from outside: a follow-up an exec
 * handler emits, a topic the embedded cluster creates. Not installed.
 *
 * Thread safety: pure.
 */
#ifndef KEYLANE_COMMON_TOPIC_H
#define KEYLANE_COMMON_TOPIC_H

#include <stddef.h>

#include "keylane/error.h"

/** Kafka's longest topic name. */
#define KL__TOPIC_NAME_MAX 249

/**
 * Kafka's rule (kafka.common.internals.Topic): 1..KL__TOPIC_NAME_MAX of
 * [a-zA-Z0-9._-], and not "." or "..".
 * @returns KL_OK, or KL_EINVAL with a detail naming the topic and the rule.
 */
kl_err_t kl__topic_check(const char *topic, size_t len);

/**
 * @returns why clients may not publish to @p topic, for a message ("a
 *          dead-letter topic (*.dlq)", "internal to Kafka (__*)"), or NULL
 *          when they may. A client that may publish to "<topic>.dlq" can
 *          forge dead letters that `keylane replay --from-dlq` would apply,
 *          and "__*" are Kafka's own (__consumer_offsets).
 */
const char *kl__topic_reserved(const char *topic);

#endif
