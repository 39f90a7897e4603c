/*
 * ThreadSanitizer builds only (KEYLANE_TSAN): C11 threads on pthreads.
 *
 * Debian's librdkafka 2.0.2 runs its threads, mutexes and condition
 * variables on glibc's C11 threads (thrd_create, mtx_lock, cnd_wait...),
 * which ThreadSanitizer (gcc 12, clang 14) does not intercept: it never
 * learns of librdkafka's threads, which crash in its allocator at their
 * first malloc, nor of their locks, which would make every hand-over
 * between a librdkafka thread and ours look like a race. Defined in the
 * test executable, these functions take the place of glibc's for
 * librdkafka (the executable's definitions come first in symbol lookup),
 * and forward to the pthread functions ThreadSanitizer intercepts. glibc
 * implements C11 threads the same way: mtx_t, cnd_t, once_flag and thrd_t
 * are a pthread_mutex_t, pthread_cond_t, pthread_once_t and pthread_t.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>
#include <time.h>

_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t), "mtx_t");
_Static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t), "cnd_t");
_Static_assert(sizeof(once_flag) == sizeof(pthread_once_t), "once_flag");
_Static_assert(sizeof(thrd_t) == sizeof(pthread_t), "thrd_t");

static int kl_thrd(int err) {
  return err == 0           ? thrd_success
         : err == ENOMEM    ? thrd_nomem
         : err == ETIMEDOUT ? thrd_timedout
         : err == EBUSY     ? thrd_busy
                            : thrd_error;
}

typedef struct kl_start {
  thrd_start_t fn;
  void *arg;
} kl_start_t;

static void *kl_thrd_main(void *opaque) {
  kl_start_t start = *(kl_start_t *)opaque;
  free(opaque);
  return (void *)(intptr_t)start.fn(start.arg);
}

int thrd_create(thrd_t *thr, thrd_start_t fn, void *arg) {
  kl_start_t *start = malloc(sizeof(*start));
  if (!start)
    return thrd_nomem;
  *start = (kl_start_t){fn, arg};
  int err = pthread_create((pthread_t *)thr, NULL, kl_thrd_main, start);
  if (err)
    free(start);
  return kl_thrd(err);
}

int thrd_join(thrd_t thr, int *res) {
  void *ret;
  int err = pthread_join((pthread_t)thr, &ret);
  if (!err && res)
    *res = (int)(intptr_t)ret;
  return kl_thrd(err);
}

int mtx_init(mtx_t *mtx, int type) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if (type & mtx_recursive)
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  int err = pthread_mutex_init((pthread_mutex_t *)mtx, &attr);
  pthread_mutexattr_destroy(&attr);
  return kl_thrd(err);
}

int mtx_lock(mtx_t *mtx) {
  return kl_thrd(pthread_mutex_lock((pthread_mutex_t *)mtx));
}

int mtx_trylock(mtx_t *mtx) {
  return kl_thrd(pthread_mutex_trylock((pthread_mutex_t *)mtx));
}

int mtx_timedlock(mtx_t *restrict mtx, const struct timespec *restrict ts) {
  return kl_thrd(pthread_mutex_timedlock((pthread_mutex_t *)mtx, ts));
}

int mtx_unlock(mtx_t *mtx) {
  return kl_thrd(pthread_mutex_unlock((pthread_mutex_t *)mtx));
}

void mtx_destroy(mtx_t *mtx) {
  pthread_mutex_destroy((pthread_mutex_t *)mtx);
}

int cnd_init(cnd_t *cnd) {
  return kl_thrd(pthread_cond_init((pthread_cond_t *)cnd, NULL));
}

int cnd_signal(cnd_t *cnd) {
  return kl_thrd(pthread_cond_signal((pthread_cond_t *)cnd));
}

int cnd_broadcast(cnd_t *cnd) {
  return kl_thrd(pthread_cond_broadcast((pthread_cond_t *)cnd));
}

int cnd_wait(cnd_t *cnd, mtx_t *mtx) {
  return kl_thrd(
      pthread_cond_wait((pthread_cond_t *)cnd, (pthread_mutex_t *)mtx));
}

int cnd_timedwait(cnd_t *restrict cnd, mtx_t *restrict mtx,
                  const struct timespec *restrict ts) {
  return kl_thrd(pthread_cond_timedwait((pthread_cond_t *)cnd,
                                        (pthread_mutex_t *)mtx, ts));
}

void cnd_destroy(cnd_t *cnd) {
  pthread_cond_destroy((pthread_cond_t *)cnd);
}

void call_once(once_flag *flag, void (*fn)(void)) {
  pthread_once((pthread_once_t *)flag, fn);
}
