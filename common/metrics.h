/*
 * Metrics: a small registry of counters, gauges and histograms with labels,
 * rendered in the Prometheus text exposition format (version 0.0.4).
 *
 * A family (kl__metric_t) has a name, a help text and a fixed list of label
 * names; each distinct list of label values is one series (kl__series_t).
 * The registry is HTTP-agnostic: kl__metrics_render() returns the text and
 * whoever serves /metrics (the gateway, the worker) sends it with
 * KL_METRICS_CONTENT_TYPE.
 *
 * Bounded: a family holds at most its max_series series (default
 * KL_METRICS_SERIES_MAX). Past that, updates for new label values go to
 * one overflow series whose every label value is "_overflow", so a caller
 * that labels by something unbounded (a topic name from a request) costs
 * memory for max_series series, not one per value. Every overflowed update
 * also counts in keylane_metrics_overflow_total.
 *
 * Ownership: the registry owns its families and series. Family and series
 * pointers stay valid until kl__metrics_destroy(), except a series passed to
 * kl__metric_remove(), which is freed there.
 *
 * Caveats:
 * - Thread safe: families may be registered, updated and rendered from any
 *   thread. Updates take the family's mutex (a few ns uncontended); hot
 *   paths keep the kl__series_t instead of looking it up each time.
 * - Registration is for start-up: a name registered twice, or an invalid
 *   name, returns NULL with kl_err_detail() (a programming error), and the
 *   update functions accept a NULL family or series and do nothing, so a
 *   mistake costs a metric, never a crash.
 */
#ifndef KEYLANE_COMMON_METRICS_H
#define KEYLANE_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"

/** The Content-Type to serve kl__metrics_render()'s text with. */
#define KL_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/** Default cap on series per family. */
#define KL_METRICS_SERIES_MAX 256
/** Label names per family at most. */
#define KL_METRICS_LABELS_MAX 8
/** Histogram buckets (finite upper bounds) at most. */
#define KL_METRICS_BUCKETS_MAX 32

typedef struct kl__metrics kl__metrics_t;
struct kl__strbuf;
typedef struct kl__metric kl__metric_t;
typedef struct kl__series kl__series_t;

/** Seconds buckets from 0.5 ms to 10 s, for latencies. */
extern const double kl__metrics_latency_buckets[];
extern const size_t kl__metrics_latency_buckets_count;

/** @returns an empty registry, or NULL when out of memory. */
kl__metrics_t *kl__metrics_new(void);

/** Frees @p metrics, its families and series; accepts NULL. */
void kl__metrics_destroy(kl__metrics_t *metrics);

/**
 * Registers a counter (a value that only grows).
 *
 * @param name    [a-zA-Z_:][a-zA-Z0-9_:]*, e.g.
 * "keylane_gateway_requests_total"
 * @param help    one line; copied
 * @param labels  comma-separated label names ("route,code"), or NULL/"" for
 *                none; each [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"
 * @returns the family, or NULL (invalid or duplicate name, out of memory).
 */
kl__metric_t *kl__metrics_counter(kl__metrics_t *metrics, const char *name,
                                  const char *help, const char *labels);

/** Registers a gauge (a value that goes up and down); see the counter. */
kl__metric_t *kl__metrics_gauge(kl__metrics_t *metrics, const char *name,
                                const char *help, const char *labels);

/**
 * Registers a histogram with the finite, strictly increasing upper bounds
 * @p bounds (copied; at most KL_METRICS_BUCKETS_MAX); "+Inf" is implied.
 * The label name "le" is reserved for the buckets.
 */
kl__metric_t *kl__metrics_histogram(kl__metrics_t *metrics, const char *name,
                                    const char *help, const char *labels,
                                    const double *bounds, size_t nbounds);

/** Reads a gauge's value when rendering; runs on the rendering thread. */
typedef double(kl__metric_fn_t)(void *opaque);

/**
 * Registers a label-less gauge whose value is @p fn(@p opaque), called
 * from kl__metrics_render() (so @p opaque must outlive the registry or
 * the rendering).
 */
kl__metric_t *kl__metrics_gauge_fn(kl__metrics_t *metrics, const char *name,
                                   const char *help, kl__metric_fn_t *fn,
                                   void *opaque);

/** Changes the cap on @p metric's series (at start-up, before updates). */
void kl__metric_set_max_series(kl__metric_t *metric, size_t max_series);

/**
 * @returns the series of @p metric for @p values (one per label name, in
 *          order; NULL for a label-less family), creating it when missing;
 *          the overflow series when the family is full; NULL when out of
 *          memory or @p metric is NULL.
 * @remark  The values are copied. The series is valid until
 *          kl__metric_remove() of the same values or kl__metrics_destroy().
 */
kl__series_t *kl__metric_series(kl__metric_t *metric,
                                const char *const *values);

/** Adds @p v (counters: only v >= 0; gauges: any) to @p series. */
void kl__series_add(kl__series_t *series, double v);

/** Sets a gauge series to @p v. */
void kl__series_set(kl__series_t *series, double v);

/** Records one observation of @p v in a histogram series. */
void kl__series_observe(kl__series_t *series, double v);

/**
 * Observations of one histogram series gathered without its lock, then
 * added in one go (kl__observed_flush()): a worker's group commit
 * observes the latencies of thousands of events, and a lock per
 * observation was a twentieth of its bookkeeping (issue 37). On the
 * stack, one thread.
 */
typedef struct kl__observed {
  kl__series_t *series; /* NULL, or not a histogram: nothing is kept */
  uint64_t count;
  double sum;
  uint64_t buckets[KL_METRICS_BUCKETS_MAX + 1];
} kl__observed_t;

/** Starts gathering observations of @p series (which may be NULL). */
void kl__observed_init(kl__observed_t *o, kl__series_t *series);

/** kl__series_observe(), kept in @p o until kl__observed_flush(). */
void kl__observed_add(kl__observed_t *o, double v);

/** Adds what @p o gathered to its series, under one lock; @p o is empty. */
void kl__observed_flush(kl__observed_t *o);

/** @returns a counter's or gauge's value, or a histogram's count. */
double kl__series_value(kl__series_t *series);

/** kl__series_add(kl__metric_series(metric, values), v). */
void kl__metric_add(kl__metric_t *metric, const char *const *values, double v);

/** kl__series_set(kl__metric_series(metric, values), v). */
void kl__metric_set(kl__metric_t *metric, const char *const *values, double v);

/** kl__series_observe(kl__metric_series(metric, values), v). */
void kl__metric_observe(kl__metric_t *metric, const char *const *values,
                        double v);

/**
 * Removes (and frees) the series of @p values, e.g. a partition's gauges
 * once the worker no longer owns it. A no-op when there is none.
 */
void kl__metric_remove(kl__metric_t *metric, const char *const *values);

/**
 * Renders every family, in registration order, as Prometheus text.
 *
 * @param len  receives the length (the text is also NUL terminated).
 * @returns a malloc()ed buffer the caller frees, or NULL when out of memory.
 */
char *kl__metrics_render(kl__metrics_t *metrics, size_t *len);

/**
 * Renders @p metrics's families, then @p more's (may be NULL), as one
 * document: a registry built for one scrape beside one kept across
 * scrapes. The two have no family name in common; their
 * keylane_metrics_overflow_total is rendered once, the sum, and @p
 * metrics's counter keeps it (so render a scrape's registry once).
 */
char *kl__metrics_render_with(kl__metrics_t *metrics, kl__metrics_t *more,
                              size_t *len);

/**
 * Appends a markdown table row per family of @p metrics, in registration
 * order, "| `name` | type | `label`, ... | help |", for the metrics
 * reference (docs/metrics.md); a family whose row @p sb holds already
 * (keylane_metrics_overflow_total, in every registry) is left out.
 */
void kl__metrics_describe(kl__metrics_t *metrics, struct kl__strbuf *sb);

#endif
