/* keylane worker's bounded stop: see stop_guard.h. */
#define _GNU_SOURCE /* pipe2() */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/stop_guard.h"
#include "common/internal.h"
#include "common/log.h"
#include "handlers/exec_spawn.h"

#define COMP "worker"

struct kl__stop_guard {
  kl_worker_t *worker;
  int64_t timeout_ms;
  int fds[2]; /* the signal handler writes the signal's number */
  pthread_t thread;
};

/* Ends the process with the batch in flight uncommitted. */
static void guard_abort(const kl__stop_guard_t *guard, const char *why) {
  KL_LOG_E(COMP,
           "aborting the stop: %s; the events in flight are not committed "
           "and the partitions' next owner applies them from the store "
           "(its epoch and ids keep each applied once); exiting 1. Handlers "
           "that need longer to finish want a longer worker.shutdown.timeout "
           "(--shutdown-timeout, now %" PRId64 " ms) and a supervisor grace "
           "period above it",
           why, guard->timeout_ms);
  fflush(stderr);
  kl__exec_spawn_kill_all(); /* _exit() skips the handler's own end */
  _exit(KL_EXIT_FAIL);
}

static const char *sig_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : strsignal(sig);
}

/* The next signal's number, 0 at the pipe's end (quit), or -1 when
 * @p wait_ms passed (-1: no bound). */
static int guard_next(kl__stop_guard_t *guard, int64_t wait_ms) {
  struct pollfd p = {.fd = guard->fds[0], .events = POLLIN};
  int rc = poll(&p, 1, wait_ms < 0 ? -1 : (int)wait_ms);
  if (rc < 0 && errno == EINTR)
    return guard_next(guard, wait_ms < 0 ? -1 : 0);
  unsigned char sig = 0;
  if (rc <= 0)
    return rc == 0 ? -1 : 0;
  return read(guard->fds[0], &sig, 1) == 1 ? sig : 0;
}

static void *guard_main(void *opaque) {
  kl__stop_guard_t *guard = opaque;
  int sig = guard_next(guard, -1);
  if (sig <= 0)
    return NULL;
  kl_worker_stop(guard->worker);
  KL_LOG_I(COMP,
           "%s: stopping: taking no new records, finishing and committing "
           "the events in flight, then handing the partitions over (at most "
           "worker.shutdown.timeout, %" PRId64 " ms; a second signal aborts)",
           sig_name(sig), guard->timeout_ms);
  int64_t deadline = kl__mono_ns() + guard->timeout_ms * 1000000;
  for (;;) {
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    int next = guard_next(guard, left_ms > 0 ? left_ms : 0);
    if (next == 0)
      return NULL;
    char why[160];
    if (next > 0)
      snprintf(why, sizeof(why), "a second signal (%s) arrived",
               sig_name(next));
    else
      snprintf(why, sizeof(why),
               "worker.shutdown.timeout (%" PRId64 " ms) passed",
               guard->timeout_ms);
    guard_abort(guard, why);
  }
}

kl_err_t kl__stop_guard_new(kl_worker_t *worker, int64_t timeout_ms,
                            kl__stop_guard_t **out) {
  kl__stop_guard_t *guard = calloc(1, sizeof(*guard));
  if (!guard)
    return KL_ENOMEM;
  *guard = (kl__stop_guard_t){worker, timeout_ms, {-1, -1}, 0};
  if (pipe2(guard->fds, O_CLOEXEC) != 0) {
    free(guard);
    return kl__err(KL_EIO, "the stop guard's pipe: %s", strerror(errno));
  }
  if (pthread_create(&guard->thread, NULL, guard_main, guard) != 0) {
    close(guard->fds[0]);
    close(guard->fds[1]);
    free(guard);
    return kl__err(KL_ENOMEM, "cannot start the stop guard's thread");
  }
  *out = guard;
  return KL_OK;
}

void kl__stop_guard_signal(kl__stop_guard_t *guard, int sig) {
  int saved = errno; /* a signal handler leaves errno as it found it */
  unsigned char b = (unsigned char)sig;
  if (write(guard->fds[1], &b, 1) < 0)
    (void)0; /* the pipe holds 64 KiB: a full one has signals enough */
  errno = saved;
}

void kl__stop_guard_destroy(kl__stop_guard_t *guard) {
  if (!guard)
    return;
  close(guard->fds[1]); /* the thread reads the end of the pipe: quit */
  pthread_join(guard->thread, NULL);
  close(guard->fds[0]);
  free(guard);
}
