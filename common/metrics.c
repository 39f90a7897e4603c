/*
 * The metrics registry; see metrics.h.
 *
 * Series live in a per-family list in creation order and are looked up by a
 * linear scan: families are capped at a few hundred series, and hot paths
 * keep their kl__series_t. Histogram buckets are stored per bucket and made
 * cumulative when rendered, so an observation touches one counter.
 */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"

typedef enum { KL_MT_COUNTER, KL_MT_GAUGE, KL_MT_HISTOGRAM } kl_mtype_t;

static const char *const kl_mtype_names[] = {"counter", "gauge", "histogram"};

struct kl__series {
  kl__series_t *next;
  kl__metric_t *metric;
  char **values; /* metric->nlabels copies; NULL for a label-less family */
  double value;  /* counter or gauge */
  double sum;    /* histogram */
  uint64_t count;
  uint64_t buckets[]; /* histogram: nbounds + 1 (the last is +Inf) */
};

struct kl__metric {
  kl__metric_t *next;
  kl__metrics_t *metrics;
  kl_mtype_t type;
  char *name;
  char *help;
  size_t nlabels;
  char *labels[KL_METRICS_LABELS_MAX];
  size_t nbounds;
  double bounds[KL_METRICS_BUCKETS_MAX];
  kl__metric_fn_t *fn; /* a gauge read when rendering */
  void *opaque;
  size_t max_series;
  size_t nseries;
  kl__series_t *series;
  kl__series_t *overflow;
  pthread_mutex_t lock; /* guards the series list and every value */
};

struct kl__metrics {
  pthread_mutex_t lock; /* guards the family list */
  kl__metric_t *families;
  kl__metric_t **tail;
  kl__metric_t *overflows; /* keylane_metrics_overflow_total */
};

const double kl__metrics_latency_buckets[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,  0.5,    1,     2.5,  5,     10};
const size_t kl__metrics_latency_buckets_count =
    sizeof(kl__metrics_latency_buckets) / sizeof(double);

/* ---- names ---- */

static bool name_ok(const char *s, bool colon) {
  if (!s || !*s || (*s >= '0' && *s <= '9'))
    return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '_' || (colon && *s == ':')))
      return false;
  return true;
}

/* Splits "a,b" into metric->labels; false for a bad or reserved name. */
static bool labels_parse(kl__metric_t *metric, const char *labels) {
  for (const char *p = labels; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (metric->nlabels == KL_METRICS_LABELS_MAX)
      return false;
    char *label = strndup(p, len);
    if (!label)
      return false;
    metric->labels[metric->nlabels++] = label;
    bool reserved = strncmp(label, "__", 2) == 0 ||
                    (metric->type == KL_MT_HISTOGRAM && !strcmp(label, "le"));
    if (!name_ok(label, false) || reserved)
      return false;
    p = comma ? comma + 1 : NULL;
  }
  return true;
}

/* ---- families ---- */

static void series_free(kl__series_t *series, size_t nlabels) {
  if (!series)
    return;
  for (size_t i = 0; series->values && i < nlabels; i++)
    free(series->values[i]);
  free(series->values);
  free(series);
}

static void metric_free(kl__metric_t *metric) {
  if (!metric)
    return;
  for (kl__series_t *s = metric->series, *next; s; s = next) {
    next = s->next;
    series_free(s, metric->nlabels);
  }
  series_free(metric->overflow, metric->nlabels);
  for (size_t i = 0; i < metric->nlabels; i++)
    free(metric->labels[i]);
  free(metric->name);
  free(metric->help);
  pthread_mutex_destroy(&metric->lock);
  free(metric);
}

static kl__metric_t *metric_find(kl__metrics_t *metrics, const char *name) {
  for (kl__metric_t *m = metrics->families; m; m = m->next)
    if (strcmp(m->name, name) == 0)
      return m;
  return NULL;
}

static kl__metric_t *metric_alloc(kl_mtype_t type, const char *name,
                                  const char *help) {
  kl__metric_t *metric = calloc(1, sizeof(*metric));
  if (!metric)
    return NULL;
  pthread_mutex_init(&metric->lock, NULL);
  metric->type = type;
  metric->max_series = KL_METRICS_SERIES_MAX;
  metric->name = strdup(name);
  metric->help = strdup(help ? help : "");
  if (!metric->name || !metric->help) {
    metric_free(metric);
    return NULL;
  }
  return metric;
}

/* Links @p metric into the registry, or frees it when its name is taken. */
static kl__metric_t *metric_link(kl__metrics_t *metrics, kl__metric_t *metric) {
  pthread_mutex_lock(&metrics->lock);
  bool taken = metric_find(metrics, metric->name) != NULL;
  if (!taken) {
    *metrics->tail = metric;
    metrics->tail = &metric->next;
  }
  pthread_mutex_unlock(&metrics->lock);
  if (taken) {
    kl__err(KL_EINVAL, "metric %s is registered twice", metric->name);
    metric_free(metric);
    return NULL;
  }
  metric->metrics = metrics;
  return metric;
}

/* What a registration asks for; bounds only for histograms. */
typedef struct kl_spec {
  kl_mtype_t type;
  const char *name;
  const char *help;
  const char *labels;
  const double *bounds;
  size_t nbounds;
} kl_spec_t;

static bool bounds_ok(const double *bounds, size_t nbounds) {
  if (nbounds > KL_METRICS_BUCKETS_MAX || (nbounds > 0 && !bounds))
    return false;
  for (size_t i = 0; i < nbounds; i++)
    if (!isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1]))
      return false;
  return true;
}

static kl__metric_t *metric_register(kl__metrics_t *metrics,
                                     const kl_spec_t *spec) {
  const char *name = spec->name ? spec->name : "(null)";
  if (!metrics || !name_ok(spec->name, true)) {
    kl__err(KL_EINVAL, "metric name \"%s\" is not [a-zA-Z_:][a-zA-Z0-9_:]*",
            name);
    return NULL;
  }
  if (!bounds_ok(spec->bounds, spec->nbounds)) {
    kl__err(KL_EINVAL,
            "histogram %s: bounds must be finite, increasing and "
            "at most %d",
            name, KL_METRICS_BUCKETS_MAX);
    return NULL;
  }
  kl__metric_t *metric = metric_alloc(spec->type, spec->name, spec->help);
  if (!metric)
    return NULL;
  metric->nbounds = spec->nbounds;
  if (spec->nbounds)
    memcpy(metric->bounds, spec->bounds, spec->nbounds * sizeof(double));
  if (!labels_parse(metric, spec->labels)) {
    kl__err(KL_EINVAL, "metric %s: bad label names \"%s\"", name,
            spec->labels ? spec->labels : "");
    metric_free(metric);
    return NULL;
  }
  /* A label-less family has exactly one series: make it now so that it
   * renders as 0 before its first update. */
  if (metric->nlabels == 0 && !kl__metric_series(metric, NULL)) {
    metric_free(metric);
    return NULL;
  }
  return metric_link(metrics, metric);
}

kl__metrics_t *kl__metrics_new(void) {
  kl__metrics_t *metrics = calloc(1, sizeof(*metrics));
  if (!metrics)
    return NULL;
  pthread_mutex_init(&metrics->lock, NULL);
  metrics->tail = &metrics->families;
  metrics->overflows = kl__metrics_counter(
      metrics, "keylane_metrics_overflow_total",
      "series lookups that found their family full and used its _overflow "
      "series",
      NULL);
  if (!metrics->overflows) {
    kl__metrics_destroy(metrics);
    return NULL;
  }
  return metrics;
}

void kl__metrics_destroy(kl__metrics_t *metrics) {
  if (!metrics)
    return;
  for (kl__metric_t *m = metrics->families, *next; m; m = next) {
    next = m->next;
    metric_free(m);
  }
  pthread_mutex_destroy(&metrics->lock);
  free(metrics);
}

kl__metric_t *kl__metrics_counter(kl__metrics_t *metrics, const char *name,
                                  const char *help, const char *labels) {
  kl_spec_t spec = {KL_MT_COUNTER, name, help, labels, NULL, 0};
  return metric_register(metrics, &spec);
}

kl__metric_t *kl__metrics_gauge(kl__metrics_t *metrics, const char *name,
                                const char *help, const char *labels) {
  kl_spec_t spec = {KL_MT_GAUGE, name, help, labels, NULL, 0};
  return metric_register(metrics, &spec);
}

kl__metric_t *kl__metrics_histogram(kl__metrics_t *metrics, const char *name,
                                    const char *help, const char *labels,
                                    const double *bounds, size_t nbounds) {
  kl_spec_t spec = {KL_MT_HISTOGRAM, name, help, labels, bounds, nbounds};
  return metric_register(metrics, &spec);
}

kl__metric_t *kl__metrics_gauge_fn(kl__metrics_t *metrics, const char *name,
                                   const char *help, kl__metric_fn_t *fn,
                                   void *opaque) {
  kl__metric_t *metric = kl__metrics_gauge(metrics, name, help, NULL);
  if (metric) {
    pthread_mutex_lock(&metric->lock);
    metric->fn = fn;
    metric->opaque = opaque;
    pthread_mutex_unlock(&metric->lock);
  }
  return metric;
}

void kl__metric_set_max_series(kl__metric_t *metric, size_t max_series) {
  if (!metric)
    return;
  pthread_mutex_lock(&metric->lock);
  metric->max_series = max_series;
  pthread_mutex_unlock(&metric->lock);
}

/* ---- series ---- */

static bool values_equal(const kl__series_t *s, const char *const *values,
                         size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s->values[i], values[i] ? values[i] : "") != 0)
      return false;
  return true;
}

/* Makes a series; @p values NULL fills every label with "_overflow". */
static kl__series_t *series_new(kl__metric_t *metric,
                                const char *const *values) {
  size_t nb = metric->type == KL_MT_HISTOGRAM ? metric->nbounds + 1 : 0;
  kl__series_t *s = calloc(1, sizeof(*s) + nb * sizeof(uint64_t));
  if (!s)
    return NULL;
  s->metric = metric;
  if (metric->nlabels &&
      !(s->values = calloc(metric->nlabels, sizeof(char *)))) {
    free(s);
    return NULL;
  }
  for (size_t i = 0; i < metric->nlabels; i++) {
    const char *v = values ? (values[i] ? values[i] : "") : "_overflow";
    if (!(s->values[i] = strdup(v))) {
      series_free(s, metric->nlabels);
      return NULL;
    }
  }
  return s;
}

/* Under metric->lock. */
static kl__series_t *series_find(kl__metric_t *metric,
                                 const char *const *values,
                                 kl__series_t ***link) {
  kl__series_t **p = &metric->series;
  for (; *p; p = &(*p)->next)
    if (values_equal(*p, values, metric->nlabels))
      break;
  *link = p;
  return *p;
}

/* Under metric->lock. */
static kl__series_t *series_overflow(kl__metric_t *metric, bool *counted) {
  if (!metric->overflow)
    metric->overflow = series_new(metric, NULL);
  *counted = true;
  return metric->overflow;
}

kl__series_t *kl__metric_series(kl__metric_t *metric,
                                const char *const *values) {
  if (!metric || (metric->nlabels && !values))
    return NULL;
  bool overflowed = false;
  kl__series_t **link;
  pthread_mutex_lock(&metric->lock);
  kl__series_t *s = series_find(metric, values, &link);
  if (!s && metric->nseries >= metric->max_series && metric->nlabels) {
    s = series_overflow(metric, &overflowed);
  } else if (!s && (s = series_new(metric, values))) {
    *link = s;
    metric->nseries++;
  }
  pthread_mutex_unlock(&metric->lock);
  /* Outside the lock: the overflow counter is a family of its own. */
  if (overflowed && metric->metrics)
    kl__metric_add(metric->metrics->overflows, NULL, 1);
  return s;
}

void kl__series_add(kl__series_t *series, double v) {
  if (!series || (series->metric->type == KL_MT_COUNTER && !(v >= 0)))
    return;
  pthread_mutex_lock(&series->metric->lock);
  series->value += v;
  pthread_mutex_unlock(&series->metric->lock);
}

void kl__series_set(kl__series_t *series, double v) {
  if (!series || series->metric->type != KL_MT_GAUGE)
    return;
  pthread_mutex_lock(&series->metric->lock);
  series->value = v;
  pthread_mutex_unlock(&series->metric->lock);
}

/* The bucket of @p v: the first bound at or above it, or +Inf. */
static size_t series_bucket(const kl__metric_t *metric, double v) {
  size_t i = 0;
  while (i < metric->nbounds && v > metric->bounds[i])
    i++;
  return i;
}

void kl__series_observe(kl__series_t *series, double v) {
  if (!series || series->metric->type != KL_MT_HISTOGRAM || isnan(v))
    return;
  kl__metric_t *metric = series->metric;
  size_t i = series_bucket(metric, v);
  pthread_mutex_lock(&metric->lock);
  series->buckets[i]++;
  series->count++;
  series->sum += v;
  pthread_mutex_unlock(&metric->lock);
}

void kl__observed_init(kl__observed_t *o, kl__series_t *series) {
  memset(o, 0, sizeof(*o));
  if (series && series->metric->type == KL_MT_HISTOGRAM)
    o->series = series;
}

void kl__observed_add(kl__observed_t *o, double v) {
  if (!o->series || isnan(v))
    return;
  o->buckets[series_bucket(o->series->metric, v)]++;
  o->count++;
  o->sum += v;
}

void kl__observed_flush(kl__observed_t *o) {
  if (!o->series || !o->count)
    return;
  kl__metric_t *metric = o->series->metric;
  pthread_mutex_lock(&metric->lock);
  for (size_t i = 0; i <= metric->nbounds; i++)
    o->series->buckets[i] += o->buckets[i];
  o->series->count += o->count;
  o->series->sum += o->sum;
  pthread_mutex_unlock(&metric->lock);
  kl__observed_init(o, o->series);
}

double kl__series_value(kl__series_t *series) {
  if (!series)
    return 0;
  pthread_mutex_lock(&series->metric->lock);
  double v = series->metric->type == KL_MT_HISTOGRAM ? (double)series->count
                                                     : series->value;
  pthread_mutex_unlock(&series->metric->lock);
  return v;
}

void kl__metric_add(kl__metric_t *metric, const char *const *values, double v) {
  kl__series_add(kl__metric_series(metric, values), v);
}

void kl__metric_set(kl__metric_t *metric, const char *const *values, double v) {
  kl__series_set(kl__metric_series(metric, values), v);
}

void kl__metric_observe(kl__metric_t *metric, const char *const *values,
                        double v) {
  kl__series_observe(kl__metric_series(metric, values), v);
}

void kl__metric_remove(kl__metric_t *metric, const char *const *values) {
  if (!metric || !metric->nlabels || !values)
    return;
  kl__series_t **link;
  pthread_mutex_lock(&metric->lock);
  kl__series_t *s = series_find(metric, values, &link);
  if (s) {
    *link = s->next;
    metric->nseries--;
  }
  pthread_mutex_unlock(&metric->lock);
  series_free(s, metric->nlabels);
}

/* ---- rendering ---- */

/* The shortest text that reads back as @p v; Prometheus spells infinities
 * and NaN as +Inf, -Inf and NaN. */
static const char *metrics_num(double v, char buf[40]) {
  if (isnan(v))
    return "NaN";
  if (isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  if (v == (double)(int64_t)v && fabs(v) < 1e15) { /* counts, "10" not 1e+01 */
    snprintf(buf, 40, "%lld", (long long)v);
    return buf;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, 40, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  return buf;
}

static void metrics_escaped(kl__strbuf_t *sb, const char *s, bool quote) {
  for (; *s; s++) {
    if (*s == '\\')
      kl__strbuf_puts(sb, "\\\\");
    else if (*s == '\n')
      kl__strbuf_puts(sb, "\\n");
    else if (quote && *s == '"')
      kl__strbuf_puts(sb, "\\\"");
    else
      kl__strbuf_add(sb, s, 1);
  }
}

/* name{a="x",le="0.5"} for one sample; @p le may be NULL. */
static void sample_head(kl__strbuf_t *sb, const kl__metric_t *metric,
                        const char *suffix, const kl__series_t *s,
                        const char *le) {
  kl__strbuf_printf(sb, "%s%s", metric->name, suffix);
  if (metric->nlabels == 0 && !le)
    return;
  kl__strbuf_puts(sb, "{");
  for (size_t i = 0; i < metric->nlabels; i++) {
    kl__strbuf_printf(sb, "%s%s=\"", i ? "," : "", metric->labels[i]);
    metrics_escaped(sb, s->values[i], true);
    kl__strbuf_puts(sb, "\"");
  }
  if (le)
    kl__strbuf_printf(sb, "%sle=\"%s\"", metric->nlabels ? "," : "", le);
  kl__strbuf_puts(sb, "}");
}

static void metrics_sample(kl__strbuf_t *sb, const kl__metric_t *metric,
                           const char *suffix, const kl__series_t *s,
                           const char *le, double v) {
  char num[40];
  sample_head(sb, metric, suffix, s, le);
  kl__strbuf_printf(sb, " %s\n", metrics_num(v, num));
}

static void render_histogram(kl__strbuf_t *sb, const kl__metric_t *metric,
                             const kl__series_t *s) {
  char le[40];
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= metric->nbounds; i++) {
    cumulative += s->buckets[i];
    const char *bound =
        i < metric->nbounds ? metrics_num(metric->bounds[i], le) : "+Inf";
    metrics_sample(sb, metric, "_bucket", s, bound, (double)cumulative);
  }
  metrics_sample(sb, metric, "_sum", s, NULL, s->sum);
  metrics_sample(sb, metric, "_count", s, NULL, (double)s->count);
}

static void render_series(kl__strbuf_t *sb, kl__metric_t *metric,
                          const kl__series_t *s) {
  if (metric->type == KL_MT_HISTOGRAM)
    render_histogram(sb, metric, s);
  else
    metrics_sample(sb, metric, "", s, NULL,
                   metric->fn ? metric->fn(metric->opaque) : s->value);
}

static void render_family(kl__strbuf_t *sb, kl__metric_t *metric) {
  kl__strbuf_printf(sb, "# HELP %s ", metric->name);
  metrics_escaped(sb, metric->help, false);
  kl__strbuf_printf(sb, "\n# TYPE %s %s\n", metric->name,
                    kl_mtype_names[metric->type]);
  pthread_mutex_lock(&metric->lock);
  for (const kl__series_t *s = metric->series; s; s = s->next)
    render_series(sb, metric, s);
  if (metric->overflow)
    render_series(sb, metric, metric->overflow);
  pthread_mutex_unlock(&metric->lock);
}

/* @p metrics's families but its overflow counter into @p sb. */
static void render_families(kl__strbuf_t *sb, kl__metrics_t *metrics) {
  pthread_mutex_lock(&metrics->lock);
  for (kl__metric_t *m = metrics->families; m; m = m->next)
    if (m != metrics->overflows)
      render_family(sb, m);
  pthread_mutex_unlock(&metrics->lock);
}

char *kl__metrics_render(kl__metrics_t *metrics, size_t *len) {
  return kl__metrics_render_with(metrics, NULL, len);
}

char *kl__metrics_render_with(kl__metrics_t *metrics, kl__metrics_t *more,
                              size_t *len) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  if (!metrics)
    return NULL;
  kl__series_t *overflows = kl__metric_series(metrics->overflows, NULL);
  if (more)
    kl__series_add(overflows,
                   kl__series_value(kl__metric_series(more->overflows, NULL)));
  render_family(&sb, metrics->overflows);
  render_families(&sb, metrics);
  if (more)
    render_families(&sb, more);
  return kl__strbuf_take(&sb, len);
}

void kl__metrics_describe(kl__metrics_t *metrics, kl__strbuf_t *sb) {
  pthread_mutex_lock(&metrics->lock);
  for (kl__metric_t *m = metrics->families; m; m = m->next) {
    char row[256];
    snprintf(row, sizeof(row), "| `%s` |", m->name);
    if (sb->len && strstr(sb->data, row))
      continue;
    kl__strbuf_printf(sb, "%s %s | ", row, kl_mtype_names[m->type]);
    for (size_t i = 0; i < m->nlabels; i++)
      kl__strbuf_printf(sb, "%s`%s`", i ? ", " : "", m->labels[i]);
    kl__strbuf_printf(sb, " | %s |\n", m->help);
  }
  pthread_mutex_unlock(&metrics->lock);
}
