/*
 * The conf table's keys, for what lists or reads them by name: the command
 * line's option parser (a flag that sets a key takes the key's type and
 * range) and `keylane config`, which prints the configuration reference.
 * kl_conf_set() (keylane/conf.h) is the way to set them.
 */
#ifndef KEYLANE_COMMON_CONF_H
#define KEYLANE_COMMON_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/units.h"

/* INT, MS (a duration whose name ends in .ms), DURATION and SIZE are parsed
 * by common/units.h; their values are those of kl__units_kind_t. */
typedef enum {
  KL__CONF_INT = KL__UNITS_COUNT,
  KL__CONF_MS = KL__UNITS_MS,
  KL__CONF_DURATION = KL__UNITS_DURATION,
  KL__CONF_SIZE = KL__UNITS_SIZE,
  KL__CONF_ENUM = 100,
  KL__CONF_STR,
} kl__conf_type_t;

typedef struct kl__conf_key {
  const char *name;
  kl__conf_type_t type;
  const char *def;
  int64_t min, max;   /**< INT, MS, DURATION (ms) and SIZE (bytes) */
  const char *values; /**< ENUM: "a|b|c" */
  const char *doc;    /**< what it does, for the reference */
} kl__conf_key_t;

/** @returns the key at @p i in the table's order, or NULL past the last.
 *  Static: valid for the life of the process. */
const kl__conf_key_t *kl__conf_key_at(size_t i);

/** @returns the key named @p name, or NULL (also for every kafka.* name). */
const kl__conf_key_t *kl__conf_key_find(const char *name);

/** @returns whether @p name is a secret, whose value is never shown: a
 *  librdkafka password, secret, token, private key or SASL credential
 *  (any name holding pass, secret, token, private, credential or jaas,
 *  misspelt ones included; kafka.sasl.oauthbearer.*, kafka.ssl.key.*,
 *  kafka.https.client.key.*). */
bool kl__conf_is_secret(const char *name);

/** @returns whether @p name begins with the prefix of one of the table's
 *  keys ("worker.", "store.", ...): such a name is keylane's, never a
 *  librdkafka property, though it may be misspelled. */
bool kl__conf_keylane_prefix(const char *name);

/** @returns the table's key nearest @p name, when it is near enough to be
 *  a typo of it (a fifth of its length, plus one, edits), or NULL. */
const char *kl__conf_key_nearest(const char *name);

/** @returns whether @p value is one of @p values ("a|b|c"). */
bool kl__conf_enum_has(const char *values, const char *value);

#endif
