/*
 * Logging: one line per event to stderr, "TIME LEVEL component: message",
 * and the trace of the event the thread works on, if any. Control
 * characters of the message are escaped (\xHH, as kl__escape()), so that a
 * message quoting another program's text (libpq's span lines) keeps to
 * its line.
 * The level comes from KEYLANE_LOG (error|warn|info|debug, any case;
 * default info); another value is an error (kl__log_env_check()).
 * KEYLANE_LOG_FORMAT=json writes each line as one JSON object instead
 * (ts, level, pid, component, msg, and trace_id, span_id when traced), for
 * a log shipper; text is the default.
 * Thread safe: each line is written with one write(2).
 */
#ifndef KEYLANE_COMMON_LOG_H
#define KEYLANE_COMMON_LOG_H

#include <stddef.h>

#include "common/internal.h"

typedef enum kl__log_level {
  KL_LOG_ERROR,
  KL_LOG_WARN,
  KL_LOG_INFO,
  KL_LOG_DEBUG,
} kl__log_level_t;

void kl__log(kl__log_level_t level, const char *component, const char *fmt, ...)
    KL__PRINTF(3, 4);

/**
 * Checks KEYLANE_LOG (unset, empty or a level's name, any case) and
 * KEYLANE_LOG_FORMAT (unset, text or json).
 * @returns KL_OK, or KL_ECONF with a detail naming the value and the valid
 *          ones; the executable refuses to start on it (exit 2); a program
 *          using the library gets one WARN line for a bad level and info.
 */
kl_err_t kl__log_env_check(void);
int kl__log_enabled(kl__log_level_t level);

/**
 * Sets this thread's trace context, from a valid W3C @p traceparent (55
 * characters or more; NULL clears it): until cleared, every line the
 * thread logs ends with " trace_id=<32 hex> span_id=<16 hex>" (the
 * OpenTelemetry log fields), so a line about an event joins its trace.
 */
void kl__log_trace_set(const char *traceparent);

/**
 * Ends the process when memory runs out where no caller could take an
 * error back (the worker's bookkeeping of the events in flight): logs
 * "out of memory: exiting; a restarted worker resumes from what the store
 * holds" as @p comp, then aborts. What was committed is in the store.
 */
_Noreturn void kl__oom(const char *comp);

/** calloc(@p n, @p size) (one item at least), or kl__oom(@p comp). */
void *kl__xcalloc(size_t n, size_t size, const char *comp);

#define KL_LOG_E(comp, ...) kl__log(KL_LOG_ERROR, comp, __VA_ARGS__)
#define KL_LOG_W(comp, ...) kl__log(KL_LOG_WARN, comp, __VA_ARGS__)
#define KL_LOG_I(comp, ...) kl__log(KL_LOG_INFO, comp, __VA_ARGS__)
#define KL_LOG_D(comp, ...)                                                    \
  do {                                                                         \
    if (kl__log_enabled(KL_LOG_DEBUG))                                         \
      kl__log(KL_LOG_DEBUG, comp, __VA_ARGS__);                                \
  } while (0)

#endif
