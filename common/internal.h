/* Internal helpers shared by both sides. Not installed. */
#ifndef KEYLANE_COMMON_INTERNAL_H
#define KEYLANE_COMMON_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/error.h"

#if defined(__GNUC__)
#define KL__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KL__PRINTF(f, a)
#endif

/**
 * Sets this thread's error detail and returns @p err, so that a failure
 * reads `return kl__err(KL_EINVAL, "key is %zu bytes, the limit is %d", ...)`.
 */
kl_err_t kl__err(kl_err_t err, const char *fmt, ...) KL__PRINTF(2, 3);
void kl__err_clear(void);

/** Integer value of a conf key (validated at set time, so it parses). */
int64_t kl__conf_int(const kl_conf_t *conf, const char *key);

/**
 * The bound between timer.max.delay and store.dedup.retention in @p conf,
 * kept by every side that schedules timers (a worker at start, `keylane
 * replay` and its --from-dlq redrive): a timer that waited longer than its
 * id's copies are known would let a copy run early.
 * @returns KL_OK, or KL_ECONF naming both values and the fix.
 */
kl_err_t kl__conf_timer_check(const kl_conf_t *conf);

/** Milliseconds since the Unix epoch, and a monotonic clock in ns. */
int64_t kl__now_ms(void);
int64_t kl__mono_ns(void);

/** Initialises @p cond so that kl__mono_cond_wait() counts on the
 *  monotonic clock, kl__mono_ns()'s: a wall clock stepped back does not
 *  stretch a wait. */
void kl__mono_cond_init(pthread_cond_t *cond);

/** Waits on @p cond, @p mu held, until it is signalled or kl__mono_ns()
 *  reaches @p deadline_ns. @returns pthread_cond_timedwait()'s result
 *  (ETIMEDOUT once the deadline passed). */
int kl__mono_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mu,
                       int64_t deadline_ns);

/**
 * Sleeps @p ms milliseconds (nothing when <= 0), or less when a signal
 * arrives: a loop that sleeps in steps checks its stop flag sooner.
 */
void kl__sleep_ms(int64_t ms);

/** Replaces this host's wall clock (kl__now_ms()); NULL restores it.
 *  Process wide; for tests of a host whose clock jumps. */
void kl__set_now_ms(int64_t (*now_ms)(void));

#endif
