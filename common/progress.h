/*
 * Progress of long work (replay, rebuild), one row per partition.
 *
 * On a terminal it redraws a bar per row in place: events done of the
 * total, rate and ETA, at most ~10 times a second, showing the rows still
 * running first (at most KL__PROGRESS_ROWS_MAX of them) and a total line.
 * Elsewhere (a log file, a pipe, CI) it writes one plain line every
 * interval instead, so a log shows that the work moves without drowning
 * in redraws.
 *
 * Ownership: the progress owns its rows; labels are copied.
 *
 * Caveats:
 * - Not thread safe: one thread updates and draws.
 */
#ifndef KEYLANE_COMMON_PROGRESS_H
#define KEYLANE_COMMON_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Rows drawn on a terminal at most; the others are summed in the total. */
#define KL__PROGRESS_ROWS_MAX 10

typedef struct kl__progress kl__progress_t;

/**
 * @param out      where to draw (stderr); borrowed, outlives the progress.
 * @param label    "replay", "rebuild": the start of every plain line.
 * @param rows     the number of rows (partitions).
 * @param tty      1 draw bars, 0 plain lines, -1 bars iff @p out is a TTY.
 * @param interval_ms  between plain lines (0: 5000).
 * @returns the progress, or NULL when out of memory.
 */
kl__progress_t *kl__progress_new(FILE *out, const char *label, size_t rows,
                                 int tty, int interval_ms);

/** Frees @p progress; accepts NULL. Draws nothing. */
void kl__progress_destroy(kl__progress_t *progress);

/**
 * Sets row @p row: @p done of @p total events, named "p@p partition".
 * @p finished marks it done (its ETA is gone, it sorts last).
 */
void kl__progress_set(kl__progress_t *progress, size_t row, int32_t partition,
                      uint64_t done, uint64_t total, int finished);

/** Draws when it is time to (or always, with @p force). */
void kl__progress_draw(kl__progress_t *progress, int force);

/** Draws the final state; a terminal's bars stay on screen. */
void kl__progress_finish(kl__progress_t *progress);

/**
 * Formats @p seconds as "1h02m", "3m07s" or "12s" into @p buf; "?" when
 * negative (no rate yet). @returns @p buf.
 */
const char *kl__progress_eta(double seconds, char *buf, size_t size);

#endif
