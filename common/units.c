/* The one parser of numbers, durations and sizes; see units.h. */
#include "common/units.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "common/strbuf.h"

typedef struct kl_unit {
  const char *name;
  int64_t mul;
} kl_unit_t;

/* Largest first: kl__units_format picks the first that divides exactly. */
static const kl_unit_t kl_durations[] = {
    {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}};
static const kl_unit_t kl_sizes[] = {
    {"T", 1LL << 40}, {"TiB", 1LL << 40}, {"G", 1LL << 30}, {"GiB", 1LL << 30},
    {"M", 1LL << 20}, {"MiB", 1LL << 20}, {"K", 1LL << 10}, {"KiB", 1LL << 10}};
#define KL_NUNITS(a) (sizeof(a) / sizeof((a)[0]))

int kl__units_digits(const char *s, size_t len, int64_t *out) {
  int64_t v = 0;
  if (!s || len == 0)
    return -1;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    int64_t d = s[i] - '0';
    if (v > (INT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

static int units_lookup(const kl_unit_t *units, size_t n, const char *name,
                        int64_t *mul) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(units[i].name, name) == 0) {
      *mul = units[i].mul;
      return 0;
    }
  return -1;
}

/* The multiplier of @p unit (what follows the digits), or -1. */
static int units_mul(kl__units_kind_t kind, const char *unit, int64_t v,
                     int64_t *mul) {
  *mul = 1;
  switch (kind) {
  case KL__UNITS_COUNT:
    return *unit ? -1 : 0;
  case KL__UNITS_MS:
    return *unit
               ? units_lookup(kl_durations, KL_NUNITS(kl_durations), unit, mul)
               : 0;
  case KL__UNITS_DURATION:
    if (!*unit)
      return v == 0 ? 0 : -1;
    return units_lookup(kl_durations, KL_NUNITS(kl_durations), unit, mul);
  case KL__UNITS_SIZE:
    return *unit ? units_lookup(kl_sizes, KL_NUNITS(kl_sizes), unit, mul) : 0;
  }
  return -1;
}

const char *kl__units_format(kl__units_kind_t kind, int64_t v, char *buf,
                             size_t size) {
  const kl_unit_t *units = kind == KL__UNITS_SIZE ? kl_sizes : kl_durations;
  size_t n = kind == KL__UNITS_SIZE    ? KL_NUNITS(kl_sizes)
             : kind == KL__UNITS_COUNT ? 0
                                       : KL_NUNITS(kl_durations);
  for (size_t i = 0; v > 0 && i < n; i++)
    if (v % units[i].mul == 0) {
      snprintf(buf, size, "%" PRId64 "%s", v / units[i].mul, units[i].name);
      return buf;
    }
  snprintf(buf, size, "%" PRId64 "%s", v,
           kind == KL__UNITS_COUNT || kind == KL__UNITS_SIZE || v == 0 ? ""
                                                                       : "ms");
  return buf;
}

/* The usual durations that lie in [@p min, @p max], as a person would
 * type them ("30s, 2m, 1h or 1d"), so that no example is one the range
 * refuses (timer.max.delay, at least 1s, was offered "500ms"); @p min
 * itself when none does. */
static const char *units_examples(kl__units_kind_t kind, int64_t min,
                                  int64_t max, char *buf, size_t size) {
  static const int64_t usual[] = {500, 1000, 30000, 120000, 3600000, 86400000};
  char one[32];
  size_t n = 0, len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof(usual) / sizeof(usual[0]); i++)
    if (usual[i] >= min && usual[i] <= max)
      n++;
  for (size_t i = 0, k = 0; k < n; i++) {
    if (usual[i] < min || usual[i] > max)
      continue;
    kl__units_format(kind, usual[i], one, sizeof(one));
    k++;
    len += (size_t)snprintf(buf + len, size - len, "%s%s", k == 1 ? "" : ", ",
                            one);
  }
  return n ? buf : kl__units_format(kind, min, buf, size);
}

static kl_err_t units_fail(const char *what, const char *text,
                           kl__units_kind_t kind, int64_t min, int64_t max) {
  static const char *const forms[] = {
      [KL__UNITS_COUNT] = "a whole number such as 100 (digits only)",
      [KL__UNITS_MS] = "a duration (a bare number is milliseconds, or a "
                       "unit ms, s, m, h or d), such as ",
      [KL__UNITS_DURATION] = "a duration with a unit, ms, s, m, h or d, "
                             "such as ",
      [KL__UNITS_SIZE] = "a size in bytes, optionally with K, M, G or T "
                         "(powers of 1024; KiB, MiB... too), such as 4096, "
                         "16K or 64MiB",
  };
  char lo[32], hi[32], range[80], examples[64] = "";
  kl__units_format(kind, min, lo, sizeof(lo));
  kl__units_format(kind, max, hi, sizeof(hi));
  if (max == INT64_MAX)
    snprintf(range, sizeof(range), "at least %s", lo);
  else
    snprintf(range, sizeof(range), "from %s to %s", lo, hi);
  if (kind == KL__UNITS_MS || kind == KL__UNITS_DURATION)
    units_examples(kind, min, max, examples, sizeof(examples));
  /* Escaped: what a person typed may hold a newline or a terminal's
   * control sequence, and this message goes to a terminal or a log. */
  char got[KL__ESCAPED_SIZE(64)];
  size_t len = text ? strlen(text) : 0;
  return kl__err(
      KL_EINVAL, "%s takes %s%s, %s; got \"%s%s\"", what, forms[kind], examples,
      range,
      kl__escape(got, sizeof(got), text ? text : "", len > 64 ? 64 : len),
      len > 64 ? "..." : "");
}

kl_err_t kl__units_parse(const char *what, const char *text,
                         kl__units_kind_t kind, int64_t min, int64_t max,
                         int64_t *out) {
  int64_t v, mul;
  size_t n = text ? strspn(text, "0123456789") : 0;
  if (!text || kl__units_digits(text, n, &v) != 0 ||
      units_mul(kind, text + n, v, &mul) != 0 || v > INT64_MAX / mul ||
      v * mul < min || v * mul > max)
    return units_fail(what, text, kind, min, max);
  *out = v * mul;
  return KL_OK;
}
