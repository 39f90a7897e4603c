#include <stdatomic.h>
#include <time.h>

#include "common/internal.h"

static int64_t (*_Atomic kl_host_clock)(void);

void kl__set_now_ms(int64_t (*now_ms)(void)) {
  atomic_store(&kl_host_clock, now_ms);
}

int64_t kl__now_ms(void) {
  int64_t (*now_ms)(void) = atomic_load(&kl_host_clock);
  if (now_ms)
    return now_ms();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t kl__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kl__mono_cond_init(pthread_cond_t *cond) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &attr);
  pthread_condattr_destroy(&attr);
}

int kl__mono_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mu,
                       int64_t deadline_ns) {
  struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000),
                        .tv_nsec = (long)(deadline_ns % 1000000000)};
  return pthread_cond_timedwait(cond, mu, &ts);
}

void kl__sleep_ms(int64_t ms) {
  if (ms <= 0)
    return;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
