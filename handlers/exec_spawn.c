/* The exec handler's children: forked by one long-lived thread, killed
 * with their worker (exec_spawn.h). */
#define _GNU_SOURCE /* close_range() */
#include "handlers/exec_spawn.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <unistd.h>

/* The children not reaped yet; a slot holds a pid or 0. Beyond this many a
 * child is not registered, and only PR_SET_PDEATHSIG ends it. */
#define KL_SPAWN_LIVE_MAX 1024

static _Atomic pid_t kl_spawn_live[KL_SPAWN_LIVE_MAX];

/* One request to the forking thread. */
typedef struct kl_spawn_req {
  const char *command;
  int in, out, err;
  pid_t pid;
  int errnum, done;
} kl_spawn_req_t;

static pthread_once_t kl_spawn_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t kl_spawn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kl_spawn_cond = PTHREAD_COND_INITIALIZER;
static kl_spawn_req_t *kl_spawn_req; /* the one being served, or NULL */
static int kl_spawn_threaded;        /* the thread runs */

/* In the child: only async-signal-safe calls until execl(). */
static void spawn_child(const kl_spawn_req_t *req, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) /* it ended before the line above */
    _exit(127);
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  if (dup2(req->in, 0) < 0 || dup2(req->out, 1) < 0 || dup2(req->err, 2) < 0)
    _exit(127);
  /* Nothing else of the worker's: its store's files, librdkafka's
   * sockets and pipes are none of a handler's business. */
  close_range(3, ~0U, 0);
  execl("/bin/sh", "sh", "-c", req->command, (char *)NULL);
  _exit(127);
}

static void spawn_fork(kl_spawn_req_t *req) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0)
    spawn_child(req, parent);
  req->errnum = errno;
  if (pid > 0) {
    setpgid(pid, pid); /* also in the child: whichever runs first */
    for (int i = 0; i < KL_SPAWN_LIVE_MAX; i++) {
      pid_t none = 0;
      if (atomic_compare_exchange_strong(&kl_spawn_live[i], &none, pid))
        break;
    }
  }
  req->pid = pid;
}

static void *spawn_main(void *opaque) {
  (void)opaque;
  sigset_t all; /* the process's signals are the other threads' business */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, NULL);
  pthread_mutex_lock(&kl_spawn_mu);
  for (;;) {
    while (!kl_spawn_req || kl_spawn_req->done)
      pthread_cond_wait(&kl_spawn_cond, &kl_spawn_mu);
    spawn_fork(kl_spawn_req);
    kl_spawn_req->done = 1;
    pthread_cond_broadcast(&kl_spawn_cond);
  }
  return NULL;
}

static void spawn_start(void) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, spawn_main, NULL) == 0) {
    pthread_detach(thread);
    kl_spawn_threaded = 1;
  }
}

pid_t kl__exec_spawn(const char *command, int in, int out, int err) {
  kl_spawn_req_t req = {command, in, out, err, -1, 0, 0};
  pthread_once(&kl_spawn_once, spawn_start);
  pthread_mutex_lock(&kl_spawn_mu);
  if (!kl_spawn_threaded) { /* no thread to fork from: the caller's */
    spawn_fork(&req);
  } else {
    while (kl_spawn_req)
      pthread_cond_wait(&kl_spawn_cond, &kl_spawn_mu);
    kl_spawn_req = &req;
    pthread_cond_broadcast(&kl_spawn_cond);
    while (!req.done)
      pthread_cond_wait(&kl_spawn_cond, &kl_spawn_mu);
    kl_spawn_req = NULL;
    pthread_cond_broadcast(&kl_spawn_cond);
  }
  pthread_mutex_unlock(&kl_spawn_mu);
  errno = req.errnum;
  return req.pid;
}

void kl__exec_spawn_reaped(pid_t pid) {
  for (int i = 0; i < KL_SPAWN_LIVE_MAX; i++) {
    pid_t was = pid;
    if (atomic_compare_exchange_strong(&kl_spawn_live[i], &was, 0))
      return;
  }
}

void kl__exec_spawn_kill_all(void) {
  for (int i = 0; i < KL_SPAWN_LIVE_MAX; i++) {
    pid_t pid = atomic_load(&kl_spawn_live[i]);
    if (pid > 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
    }
  }
}
