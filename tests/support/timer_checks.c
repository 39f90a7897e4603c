#include "support/timer_checks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

/* The counters of @p st in kl_t_timers_want_t's order. */
static void counters(const kl_worker_stats_t *st, uint64_t c[7]) {
  c[0] = st->applied;
  c[1] = st->timers_scheduled;
  c[2] = st->duplicates;
  c[3] = st->dead_letters;
  c[4] = st->timers_early;
  c[5] = st->timers_fired;
  c[6] = st->failed;
}

void kl_t_timers_wait(kl_t_worker_t *w, kl_t_timers_want_t want) {
  static const char *const names[7] = {
      "applied",      "timers_scheduled", "duplicates", "dead_letters",
      "timers_early", "timers_fired",     "failed"};
  const uint64_t v[7] = {want.applied, want.scheduled, want.duplicates,
                         want.dead,    want.early,     want.fired,
                         want.failed};
  uint64_t c[7] = {0};
  for (int i = 0; i < 600; i++) {
    kl_worker_stats_t st = {0};
    kl_worker_stats(w->worker, &st, sizeof(st));
    counters(&st, c);
    int reached = 1;
    for (int k = 0; k < 7; k++)
      reached &= v[k] == KL_T_ANY || c[k] >= v[k];
    if (reached)
      break;
    kl_t_sleep_ms(50);
  }
  for (int k = 0; k < 7; k++)
    if (v[k] != KL_T_ANY && c[k] != v[k])
      fail_msg("the worker's %s is %llu, not %llu", names[k],
               (unsigned long long)c[k], (unsigned long long)v[k]);
}

void kl_t_timers_amount(uint8_t p[9], int n) {
  memcpy(p,
         "\x81\xa6"
         "amount",
         8);
  p[8] = (uint8_t)n;
}

void kl_t_timers_publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                         const char *type, const void *payload, size_t len,
                         int64_t not_before) {
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = type,
                   .type_len = strlen(type),
                   .payload = payload,
                   .payload_len = len,
                   .not_before = not_before};
  assert_int_equal(kl_publish(fx->producer, fx->topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(fx->producer, 10000), KL_OK);
}
