/*
 * The one parser of the numbers people type: every numeric, duration and
 * size flag, conf key and environment variable goes through it, so that
 * "30s", "1e3", " 5" or "16KB" mean the same thing (or are refused the same
 * way) wherever they are given.
 *
 * The rules, for all kinds:
 * - a whole decimal number: digits only; no sign, no spaces, no exponent,
 *   no fraction, nothing after the unit; at most INT64_MAX after the unit;
 * - KL__UNITS_COUNT: no unit;
 * - KL__UNITS_MS: a duration whose name says milliseconds (--handler-
 *   timeout-ms, worker.retry.max.ms): a bare number is milliseconds, a unit
 *   ms, s, m, h or d is honoured ("30s" is 30000 ms, never 30 ms);
 * - KL__UNITS_DURATION: a duration whose name gives no unit
 *   (--idle-timeout, store.dedup.retention): the unit is required, since a
 *   bare "30" could mean seconds or milliseconds; "0" alone is allowed;
 * - KL__UNITS_SIZE: bytes, with an optional K, M, G or T (also KiB, MiB,
 *   GiB, TiB), powers of 1024.
 * Durations come out in milliseconds, sizes in bytes.
 */
#ifndef KEYLANE_COMMON_UNITS_H
#define KEYLANE_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"

typedef enum {
  KL__UNITS_COUNT,
  KL__UNITS_MS,
  KL__UNITS_DURATION,
  KL__UNITS_SIZE,
} kl__units_kind_t;

/**
 * Parses @p text, a value of the flag or key @p what, into @p out.
 *
 * @returns KL_OK, or KL_EINVAL with a detail naming @p what, the text, the
 *          forms accepted and the range [@p min, @p max] (in ms or bytes).
 * @remark  @p out is left alone on failure.
 */
kl_err_t kl__units_parse(const char *what, const char *text,
                         kl__units_kind_t kind, int64_t min, int64_t max,
                         int64_t *out);

/**
 * Reads exactly @p len bytes of @p s as decimal digits (no sign, no
 * spaces, at least one digit, at most INT64_MAX): for numbers in data,
 * such as record headers, where no person needs a message.
 * @returns 0, or -1 (and @p out untouched).
 */
int kl__units_digits(const char *s, size_t len, int64_t *out);

/**
 * Writes @p v of @p kind the way a person would type it ("30s", "16K",
 * "1000") into @p buf. @returns @p buf.
 */
const char *kl__units_format(kl__units_kind_t kind, int64_t v, char *buf,
                             size_t size);

#endif
