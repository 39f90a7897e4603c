/* Prometheus naming conventions for metric names (support/prom.h). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "support/prom.h"

/* Names other exporters made that dashboards query as they are. */
static const char *const kl_compat[] = {"kafka_consumergroup_lag", NULL};

/* Units that are not base units, and what to use instead. */
static const char *const kl_not_base[][2] = {
    {"ms", "seconds"},
    {"millis", "seconds"},
    {"milliseconds", "seconds"},
    {"us", "seconds"},
    {"microseconds", "seconds"},
    {"ns", "seconds"},
    {"nanoseconds", "seconds"},
    {"minutes", "seconds"},
    {"hours", "seconds"},
    {"days", "seconds"},
    {"kb", "bytes"},
    {"kib", "bytes"},
    {"mb", "bytes"},
    {"mib", "bytes"},
    {"gb", "bytes"},
    {"percent", "a ratio 0..1"},
};
static const char *const kl_units[] = {"seconds", "bytes", "ratio", NULL};

static bool kl_ends(const char *name, const char *suffix) {
  size_t n = strlen(name), s = strlen(suffix);
  return n >= s && strcmp(name + n - s, suffix) == 0;
}

static int kl_fail(char *err, size_t size, const char *name, const char *why) {
  snprintf(err, size, "metric %s: %s", name, why);
  return -1;
}

static bool kl_compat_name(const char *name) {
  for (size_t i = 0; kl_compat[i]; i++)
    if (strcmp(name, kl_compat[i]) == 0)
      return true;
  return false;
}

/* Units: only base ones, and a unit is the last word (before _total). */
static int kl_check_units(const char *name, bool counter, char *err,
                          size_t size) {
  char words[256];
  snprintf(words, sizeof(words), "%s", name);
  size_t last = 0, count = 0;
  char *word[64];
  for (char *save, *w = strtok_r(words, "_", &save); w && count < 64;
       w = strtok_r(NULL, "_", &save))
    word[count++] = w;
  last = count - (counter && count > 1 ? 2 : 1);
  for (size_t i = 0; i < count; i++) {
    for (size_t u = 0; u < sizeof(kl_not_base) / sizeof(kl_not_base[0]); u++)
      if (strcmp(word[i], kl_not_base[u][0]) == 0) {
        char why[128];
        snprintf(why, sizeof(why), "\"%s\" is not a base unit: use %s", word[i],
                 kl_not_base[u][1]);
        return kl_fail(err, size, name, why);
      }
    for (size_t u = 0; kl_units[u]; u++)
      if (strcmp(word[i], kl_units[u]) == 0 && i != last)
        return kl_fail(err, size, name, "the unit goes last (before _total)");
  }
  return 0;
}

static int kl_check_name(const char *name, const char *type, char *err,
                         size_t size) {
  if (strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(name))
    return kl_fail(err, size, name, "not lower snake case");
  if (strncmp(name, "keylane_", 8) != 0 && !kl_compat_name(name))
    return kl_fail(err, size, name, "does not start with keylane_");
  bool counter = strcmp(type, "counter") == 0;
  if (counter != kl_ends(name, "_total"))
    return kl_fail(err, size, name,
                   counter ? "a counter ends in _total"
                           : "only counters end in _total");
  if (kl_ends(name, "_count") || kl_ends(name, "_sum") ||
      kl_ends(name, "_bucket"))
    return kl_fail(err, size, name,
                   "_count, _sum and _bucket are the "
                   "series of a histogram, not a family's name");
  return kl_check_units(name, counter, err, size);
}

static bool kl_has_help(const char *text, const char *name) {
  char want[300];
  snprintf(want, sizeof(want), "# HELP %s ", name);
  return strncmp(text, want, strlen(want)) == 0 ||
         (snprintf(want, sizeof(want), "\n# HELP %s ", name) > 0 &&
          strstr(text, want));
}

int kl_t_prom_conventions(const char *text, char *err, size_t size) {
  int families = 0;
  for (const char *line = text; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char name[256], type[32];
    if (len < 300 && strncmp(line, "# TYPE ", 7) == 0 &&
        sscanf(line + 7, "%255s %31s", name, type) == 2) {
      families++;
      if (kl_check_name(name, type, err, size))
        return -1;
      if (!kl_has_help(text, name))
        return kl_fail(err, size, name, "no HELP line");
    }
    line = end ? end + 1 : NULL;
  }
  if (!families) {
    snprintf(err, size, "no metric families (no # TYPE line)");
    return -1;
  }
  return 0;
}
