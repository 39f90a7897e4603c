/*
 * A strict checker of the Prometheus text exposition format (0.0.4), for
 * tests of /metrics: HELP and TYPE lines (at most one each per family,
 * TYPE before the family's samples), metric and label name grammar, label
 * value escapes, numeric values, families not interleaved, counters not
 * negative, and per histogram series: le buckets increasing with
 * non-decreasing counts, a +Inf bucket equal to _count, and a _sum.
 */
#ifndef KEYLANE_TESTS_PROM_H
#define KEYLANE_TESTS_PROM_H

#include <stddef.h>

/** @returns 0 when @p text parses, else -1 with the line and reason in
 *          @p err. */
int kl_t_prom_check(const char *text, char *err, size_t size);

#endif
