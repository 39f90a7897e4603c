/**
 * @file conf.h
 * @brief Configuration: string keys and values, validated when set.
 *
 * keylane's own keys are listed in docs/configuration.md, which
 * `keylane config` prints.
 * Keys beginning with "kafka." are passed through to librdkafka with the
 * prefix removed ("kafka.linger.ms" sets librdkafka's "linger.ms"); they
 * are validated by librdkafka when a client is created from the conf.
 *
 * Ownership: the conf is owned by whoever created it; kl_producer_new()
 * and friends copy what they need, so a conf may be destroyed right after.
 *
 * Caveats:
 * - A conf is not thread safe: set it up on one thread, then share it
 *   read-only.
 */
#ifndef KEYLANE_CONF_H
#define KEYLANE_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_conf kl_conf_t;

/** @returns a new conf holding the defaults, or NULL when out of memory. */
KL_EXPORT kl_conf_t *kl_conf_new(void);

/** @returns a deep copy of @p conf, or NULL when out of memory. */
KL_EXPORT kl_conf_t *kl_conf_dup(const kl_conf_t *conf);

/** Frees @p conf; accepts NULL. */
KL_EXPORT void kl_conf_destroy(kl_conf_t *conf);

/**
 * Sets @p key to @p value, replacing an earlier value.
 *
 * @returns KL_OK, or KL_ECONF for an unknown key or a value out of range,
 *          with kl_err_detail() naming the key, the value and the fix
 *          (KL_EINVAL for a NULL argument).
 */
KL_EXPORT kl_err_t kl_conf_set(kl_conf_t *conf, const char *key,
                               const char *value);

/**
 * @returns the value of @p key (the default when unset), or NULL for a key
 *          that is neither set nor known.
 * @remark  Borrowed: valid until the key is set again or the conf destroyed.
 */
KL_EXPORT const char *kl_conf_get(const kl_conf_t *conf, const char *key);

/**
 * Calls @p fn for every "kafka." key that was set, with the prefix removed,
 * in the order they were set. Stops at, and returns, the first non-OK.
 */
KL_EXPORT kl_err_t kl_conf_foreach_kafka(const kl_conf_t *conf,
                                         kl_err_t (*fn)(void *opaque,
                                                        const char *name,
                                                        const char *value),
                                         void *opaque);

#ifdef __cplusplus
}
#endif
#endif
