/**
 * @file error.h
 * @brief keylane's one error channel: every function returns a kl_err_t.
 *
 * The codes come from one X-macro table, KL_ERR_MAP, which also generates
 * kl_strerror() and kl_err_name(). Errors from LMDB, libpq, libuv and
 * librdkafka are mapped to these codes where keylane calls them; the
 * original cause is kept as a human-readable detail, kl_err_detail().
 *
 * Caveats:
 * - kl_err_detail() is per thread. Every exported call that returns a
 *   kl_err_t clears it when it starts, so after a call that returned KL_OK
 *   it is "", and after a failure it describes that failure.
 */
#ifndef KEYLANE_ERROR_H
#define KEYLANE_ERROR_H

#include <stdbool.h>
#include <stddef.h>

#include "keylane/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, retriable, description) */
#define KL_ERR_MAP(X)                                                          \
  X(OK, false, "success")                                                      \
  X(EINVAL, false, "invalid argument")                                         \
  X(ENOMEM, false, "out of memory")                                            \
  X(ECONF, false, "invalid configuration")                                     \
  X(EIO, false, "input/output error")                                          \
  X(ENOTFOUND, false, "not found")                                             \
  X(ETIMEOUT, true, "timed out")                                               \
  X(EQUEUE_FULL, true, "in-flight budget is full")                             \
  X(EKAFKA, false, "Kafka error")                                              \
  X(EKAFKA_TRANSIENT, true, "transient Kafka error")                           \
  X(EPARTITIONS, false, "partition count differs from the expected one")       \
  X(EDECODE_TRUNCATED, false, "envelope is truncated")                         \
  X(EDECODE_NOT_MAP, false, "envelope is not a msgpack map")                   \
  X(EDECODE_VERSION, false, "envelope has an unknown schema version")          \
  X(EDECODE_MISSING, false, "envelope lacks a required field")                 \
  X(EDECODE_TYPE, false, "envelope field has the wrong type")                  \
  X(EDECODE_OVERSIZE, false, "envelope field exceeds its limit")               \
  X(EDECODE_EMPTY, false, "envelope field is empty")                           \
  X(EDECODE_DUPLICATE, false, "envelope field appears twice")                  \
  X(EDECODE_UNKNOWN, false, "envelope has a field this version does not know") \
  X(EDECODE_TRAILING, false, "envelope is followed by trailing bytes")         \
  X(EDECODE_KEY, false, "message key is missing or exceeds its limit")         \
  X(ESTORE, false, "store error")                                              \
  X(ESTORE_BUSY, true, "store is temporarily unavailable")                     \
  X(ESTORE_FULL, false, "store is full")                                       \
  X(ESTORE_VERSION, false, "store format is not supported by this build")      \
  X(ESTORE_READONLY, true, "store is not writable")                            \
  X(EFENCED, false, "fenced: a newer owner holds the partition")               \
  X(EHANDLER, false, "handler failed")                                         \
  X(ERETRY, true, "handler asked to retry")                                    \
  X(ESTOPPED, false, "stopped")

typedef enum kl_err {
#define KL__ERR_ENUM(name, retriable, desc) KL_##name,
  KL_ERR_MAP(KL__ERR_ENUM)
#undef KL__ERR_ENUM
      KL_ERR__COUNT
} kl_err_t;

/** @returns a static description of @p err ("invalid argument"). */
KL_EXPORT const char *kl_strerror(kl_err_t err);

/** @returns the static symbolic name of @p err ("KL_EINVAL"). */
KL_EXPORT const char *kl_err_name(kl_err_t err);

/** @returns true when retrying the same call later may succeed. */
KL_EXPORT bool kl_err_is_retriable(kl_err_t err);

/**
 * @returns the detail of the error that the last kl_err_t call on this
 *          thread returned: what failed, the value, and the fix. Never NULL:
 *          "" after a call that returned KL_OK, or when the failure had none.
 * @remark  Valid until the next keylane call on this thread: copy it out.
 */
KL_EXPORT const char *kl_err_detail(void);

#ifdef __cplusplus
}
#endif
#endif
