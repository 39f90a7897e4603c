/*
 * What the timer tests (tests/mock/test_timers*.c, test_ledger_scheduled.c)
 * wait for and check: a worker's counters.
 */
#ifndef KEYLANE_TESTS_SUPPORT_TIMER_CHECKS_H
#define KEYLANE_TESTS_SUPPORT_TIMER_CHECKS_H

#include <stdint.h>

#include "support/ledger_checks.h"
#include "support/support.h"

/* Writes a ledger amount payload, {"amount": @p n} (0..127), into @p p:
 * 9 bytes of msgpack. */
void kl_t_timers_amount(uint8_t p[9], int n);

/* Publishes, through @p fx's producer to its topic, the event @p type of
 * @p key with id @p id and @p payload (@p len bytes, may be NULL), due at
 * @p not_before (0: now), and waits for Kafka's acknowledgement. */
void kl_t_timers_publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                         const char *type, const void *payload, size_t len,
                         int64_t not_before);

/* A counter kl_t_timers_wait() does not check. */
#define KL_T_ANY UINT64_MAX

/* A worker's counters as kl_t_timers_wait() wants them: each exactly its
 * value (0 when left out of an initializer), or KL_T_ANY. */
typedef struct kl_t_timers_want {
  uint64_t applied;    /* kl_worker_stats_t.applied */
  uint64_t scheduled;  /* .timers_scheduled */
  uint64_t duplicates; /* .duplicates */
  uint64_t dead;       /* .dead_letters */
  uint64_t early;      /* .timers_early */
  uint64_t fired;      /* .timers_fired */
  uint64_t failed;     /* .failed */
} kl_t_timers_want_t;

/* Waits (30 s at most) until @p w's counters reach @p want, then checks
 * they are exactly that. */
void kl_t_timers_wait(kl_t_worker_t *w, kl_t_timers_want_t want);

#endif
