/*
 * A strict checker of the Prometheus text exposition format (0.0.4), for
 * tests of /metrics: HELP and TYPE lines (at most one each per family,
 * TYPE before the family's samples), metric and label name grammar, label
 * value escapes, numeric values, families not interleaved, counters not
 * negative, and per histogram series: le buckets increasing with
 * non-decreasing counts, a +Inf bucket equal to _count, and a _sum.
 */
#ifndef KEYLANE_TESTS_SUPPORT_PROM_H
#define KEYLANE_TESTS_SUPPORT_PROM_H

#include <stddef.h>

/** @returns 0 when @p text parses, else -1 with the line and reason in
 *          @p err. */
int kl_t_prom_check(const char *text, char *err, size_t size);

/**
 * Checks the metric names of @p text (rendered exposition text) against
 * Prometheus' naming conventions: lower snake case with the keylane_
 * prefix (or a compatibility name other exporters made: kafka_consumergroup_
 * lag), a HELP line for each, counters ending in _total and nothing else
 * ending in it, no family named like a histogram's own series (_count,
 * _sum, _bucket), base units only (seconds, bytes: never ms, minutes or
 * kilobytes), and a unit, if any, last (before _total).
 * @returns 0, or -1 with the first offending name and the rule in @p err.
 */
int kl_t_prom_conventions(const char *text, char *err, size_t size);

#endif
