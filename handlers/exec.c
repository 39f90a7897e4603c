#define _GNU_SOURCE /* pipe2() */
#include "handlers/exec.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "handlers/exec_line.h"
#include "handlers/exec_spawn.h"

extern char **environ; /* for posix_spawn() */

/* A timeout's reason, with the timeout in ms: it names the setting to
 * raise, since the dead letter it may end as is read by a person. */
#define KL_EXEC_TIMED_OUT(what)                                                \
  what " within %d ms (the handler timeout: --handler-timeout-ms, or -X "      \
       "worker.handler.timeout.ms; raise it if a call needs longer)"

#define COMP "exec"
/* Answers parsed per read, at most; the rest waits in the buffer. */
#define KL_EXEC_BATCH 64

/* One event in flight: the caller waits on it, the reader completes it. */
typedef struct kl_exec_call {
  struct kl_exec_call *next;
  pthread_cond_t cond; /* done, or its turn to read */
  uint64_t seq;
  int done;
  int waiting; /* asleep on cond in exec_await() */
  kl_handler_result_t result;
  json_t *emit;   /* the answer's "emit", for the caller to apply */
  json_t *cancel; /* its "cancel", likewise */
  char *errbuf;
  size_t errbuf_size;
  int64_t deadline_ns;
} kl_exec_call_t;

/* One child process. A caller whose event is in flight reads its stdout
 * for everyone (`reading`), another writes its stdin (`writing`); both run
 * without exec->mu, so a killed child is reaped only once neither does. */
typedef struct kl_exec_child {
  pid_t pid;  /* 0: not running */
  int in_fd;  /* socket to the child's stdin */
  int out_fd; /* pipe from the child's stdout */
  int dead;   /* killed, not yet reaped */
  int reading, writing;
  int echoes; /* has echoed "seq": may have the whole window in flight */
  size_t inflight;
  kl_exec_call_t *calls; /* in flight */
  uint64_t next_seq;
  char *buf; /* answer bytes read, KL_EXEC_LINE_MAX */
  size_t buf_len;
} kl_exec_child_t;

struct kl__exec {
  char *command;
  char *dlq_topic; /* worker.dlq.topic, or NULL: an emit may not go there */
  int timeout_ms;
  int window;
  pthread_mutex_t mu;  /* guards every child but its reader's buffer */
  pthread_cond_t cond; /* a child's writer finished, or it was killed */
  pthread_cond_t room; /* a child has room for one more event */
  unsigned starts;
  int nchildren;
  kl_exec_child_t *children;
};

/* The stderr reader owns its fd and frees itself at EOF. */
typedef struct kl_exec_errlog {
  int fd;
  pid_t pid;
} kl_exec_errlog_t;

/* One line of the child's stderr, escaped: it must not forge lines of
 * the worker's log nor drive the terminal of whoever reads it. */
static void errlog_put(pid_t pid, const char *s, size_t len) {
  char text[KL__ESCAPED_SIZE(480)];
  KL_LOG_W(COMP, "exec[%d]: %s", (int)pid,
           kl__escape(text, sizeof(text), s, len));
}

static void *exec_errlog_main(void *opaque) {
  kl_exec_errlog_t *log = opaque;
  char line[4096];
  size_t len = 0;
  for (;;) {
    ssize_t n = read(log->fd, line + len, sizeof(line) - 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    len += (size_t)n;
    char *start = line, *nl;
    while ((nl = memchr(start, '\n', len - (size_t)(start - line)))) {
      errlog_put(log->pid, start, (size_t)(nl - start));
      start = nl + 1;
    }
    len -= (size_t)(start - line);
    memmove(line, start, len);
    if (len == sizeof(line) - 1) { /* a long line goes out in pieces */
      errlog_put(log->pid, line, len);
      len = 0;
    }
  }
  if (len)
    errlog_put(log->pid, line, len);
  close(log->fd);
  free(log);
  return NULL;
}

kl_err_t kl__exec_new(const char *command, kl__exec_t **out) {
  if (!command || !*command)
    return kl__err(KL_ECONF, "--handler exec: needs a command, e.g. "
                             "exec:'python3 handler.py'");
  kl__exec_t *exec = calloc(1, sizeof(*exec));
  if (!exec)
    return KL_ENOMEM;
  exec->command = strdup(command);
  kl__mono_cond_init(&exec->cond);
  kl__mono_cond_init(&exec->room);
  pthread_mutex_init(&exec->mu, NULL);
  exec->timeout_ms = KL_EXEC_TIMEOUT_MS;
  if (!exec->command || kl__exec_set_children(exec, 1, 1) != KL_OK) {
    kl__exec_destroy(exec);
    return KL_ENOMEM;
  }
  *out = exec;
  return KL_OK;
}

/* @returns nonzero when `command -v WORD` succeeds in /bin/sh. */
static int shell_knows(const char *word) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {"sh", "-c", "command -v -- \"$1\"", "sh", (char *)word, NULL};
  pid_t pid;
  int status = -1;
  if (posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ) == 0)
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
      ;
  posix_spawn_file_actions_destroy(&fa);
  /* A shell that could not run at all says nothing of the word. */
  return status == -1 || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

kl_err_t kl__exec_check_command(const char *command) {
  const char *s = command + strspn(command, " \t\n");
  size_t n = strcspn(s, " \t\n;&|<>()");
  char word[4096];
  if (n == 0 || n >= sizeof(word))
    return KL_OK;
  memcpy(word, s, n);
  word[n] = '\0';
  if (strpbrk(word, "\"'\\$`=*?[~{}!#"))
    return KL_OK;
  struct stat st;
  if (!strchr(word, '/')) {
    if (shell_knows(word))
      return KL_OK;
    const char *path = getenv("PATH");
    return kl__err(KL_ECONF,
                   "--handler exec:%s: the shell knows no command \"%s\" "
                   "(not on PATH=%s, nor a builtin): install it, or give "
                   "its path",
                   command, word, path ? path : "");
  }
  if (stat(word, &st) != 0)
    return kl__err(KL_ECONF,
                   "--handler exec:%s: %s: %s; give the path of the "
                   "handler's program",
                   command, word, strerror(errno));
  if (!S_ISREG(st.st_mode) || access(word, X_OK) != 0)
    return kl__err(KL_ECONF,
                   "--handler exec:%s: %s is not an executable file; "
                   "chmod +x it, or run it with its interpreter (e.g. "
                   "exec:'python3 %s')",
                   command, word, word);
  return KL_OK;
}

void kl__exec_set_timeout_ms(kl__exec_t *exec, int timeout_ms) {
  if (timeout_ms > 0)
    exec->timeout_ms = timeout_ms;
}

unsigned kl__exec_starts(kl__exec_t *exec) {
  pthread_mutex_lock(&exec->mu);
  unsigned starts = exec->starts;
  pthread_mutex_unlock(&exec->mu);
  return starts;
}

/* ---- children: start, kill, reap (exec->mu held) --------------------- */

/* Closes a dead child's pipes once nobody reads or writes them; callers
 * waiting for room may then start a new one. */
static void exec_reap_idle(kl__exec_t *exec, kl_exec_child_t *child) {
  if (!child->dead || child->reading || child->writing)
    return;
  pthread_cond_broadcast(&exec->room);
  while (waitpid(child->pid, NULL, 0) < 0 && errno == EINTR)
    ;
  kl__exec_spawn_reaped(child->pid);
  close(child->in_fd);
  close(child->out_fd);
  child->in_fd = child->out_fd = -1;
  child->pid = 0;
  child->dead = 0;
  child->echoes = 0;
  child->buf_len = 0;
}

static void exec_complete(kl_exec_child_t *child, kl_exec_call_t *call,
                          kl_handler_result_t result, const char *error) {
  kl_exec_call_t **p = &child->calls;
  while (*p != call)
    p = &(*p)->next;
  *p = call->next;
  child->inflight--;
  call->done = 1;
  call->result = result;
  if (result != KL_HANDLER_OK)
    snprintf(call->errbuf, call->errbuf_size, "%s", error);
  pthread_cond_signal(&call->cond);
}

/* One event less in flight to @p child: one caller waiting for room may
 * go (waking one, not all, spares a herd per answer). */
static void exec_room(kl__exec_t *exec) {
  pthread_cond_signal(&exec->room);
}

/* Kills @p child's process group: every event in flight to it is retried,
 * and the next event starts a new child. */
static void exec_kill(kl__exec_t *exec, kl_exec_child_t *child,
                      const char *why) {
  if (!child->pid || child->dead)
    return;
  char text[KL__ESCAPED_SIZE(256)]; /* @p why may quote the child's line */
  if (why)
    KL_LOG_W(COMP,
             "killing exec handler pid=%d (%s); it restarts with the "
             "next event",
             (int)child->pid, kl__escape(text, sizeof(text), why, strlen(why)));
  kill(-child->pid, SIGKILL);
  kill(child->pid, SIGKILL);
  child->dead = 1;
  char error[512];
  snprintf(error, sizeof(error),
           "exec handler pid=%d %s; restarted, the "
           "event is retried",
           (int)child->pid, why ? why : "stopped");
  while (child->calls)
    exec_complete(child, child->calls, KL_HANDLER_RETRY, error);
  exec_reap_idle(exec, child);
  pthread_cond_broadcast(&exec->cond);
}

/* Logs the child's stderr from a thread that owns @p fd. */
static void exec_errlog_start(pid_t pid, int fd) {
  kl_exec_errlog_t *log = malloc(sizeof(*log));
  pthread_t thread;
  if (log) {
    log->fd = fd;
    log->pid = pid;
    if (pthread_create(&thread, NULL, exec_errlog_main, log) == 0) {
      pthread_detach(thread);
      return;
    }
  }
  free(log);
  close(fd);
}

/* Starts @p child. Every end is close-on-exec from its creation: another
 * exec handler's child forked meanwhile inherits none. */
static kl_err_t exec_start(kl__exec_t *exec, kl_exec_child_t *child) {
  if (!child->buf && !(child->buf = malloc(KL_EXEC_LINE_MAX)))
    return kl__err(KL_ENOMEM, "exec handler: no memory for its answers");
  int in[2], out[2], err[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) < 0)
    return kl__err(KL_EIO, "exec handler: socketpair: %s", strerror(errno));
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
    close(in[0]);
    close(in[1]);
    return kl__err(KL_EIO, "exec handler: pipe: %s", strerror(errno));
  }
  pid_t pid = kl__exec_spawn(exec->command, in[1], out[1], err[1]);
  int fork_errno = errno;
  close(in[1]);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(in[0]);
    close(out[0]);
    close(err[0]);
    return kl__err(KL_EIO, "exec handler: fork: %s", strerror(fork_errno));
  }
  child->pid = pid;
  child->in_fd = in[0];
  child->out_fd = out[0];
  child->buf_len = 0;
  child->next_seq = 0;
  exec->starts++;
  exec_errlog_start(pid, err[0]);
  KL_LOG_I(COMP, "started exec handler pid=%d: %s", (int)pid, exec->command);
  return KL_OK;
}

kl_err_t kl__exec_set_children(kl__exec_t *exec, int children, int window) {
  kl_exec_child_t *v =
      calloc((size_t)(children > 1 ? children : 1), sizeof(*v));
  if (!v)
    return KL_ENOMEM;
  pthread_mutex_lock(&exec->mu);
  for (int i = 0; i < exec->nchildren; i++) {
    exec_kill(exec, &exec->children[i], NULL);
    free(exec->children[i].buf);
  }
  free(exec->children);
  exec->children = v;
  exec->nchildren = children > 1 ? children : 1;
  exec->window = window > 1 ? window : 1;
  for (int i = 0; i < exec->nchildren; i++)
    v[i].in_fd = v[i].out_fd = -1;
  pthread_mutex_unlock(&exec->mu);
  return KL_OK;
}

kl_err_t kl__exec_configure(kl__exec_t *exec, kl_conf_t *conf) {
  const char *dlq = kl_conf_get(conf, "worker.dlq.topic");
  free(exec->dlq_topic);
  exec->dlq_topic = NULL;
  if (dlq && *dlq && !(exec->dlq_topic = strdup(dlq)))
    return KL_ENOMEM;
  int64_t children = kl__conf_int(conf, "worker.concurrency");
  int64_t window = kl__conf_int(conf, "worker.exec.window");
  kl_err_t err = kl__exec_set_children(exec, (int)children, (int)window);
  if (err)
    return err;
  int64_t threads = children * window;
  char value[24];
  snprintf(value, sizeof(value), "%" PRId64, threads > 1024 ? 1024 : threads);
  if (kl_conf_set(conf, "worker.concurrency", value))
    return kl__err(KL_ECONF, "exec handler: %s", kl_err_detail());
  return KL_OK;
}

/* ---- one event: pick a child, send, await the answer ----------------- */

static int exec_left_ms(int64_t deadline_ns) {
  int64_t left = (deadline_ns - kl__mono_ns()) / 1000000;
  return left < 0 ? 0 : (int)left;
}

/* Writes @p len bytes to @p fd by @p deadline_ns. @returns 0, or -1 with
 * the reason in @p why. Runs without exec->mu. */
static int exec_write(int fd, const char *line, size_t len, int64_t deadline_ns,
                      int timeout_ms, char *why, size_t size) {
  while (len) {
    struct pollfd pfd = {fd, POLLOUT, 0};
    int rc = poll(&pfd, 1, exec_left_ms(deadline_ns));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0) {
      snprintf(why, size, KL_EXEC_TIMED_OUT("did not read its stdin"),
               timeout_ms);
      return -1;
    }
    ssize_t n = send(fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n < 0) {
      snprintf(why, size, "its stdin is closed (%s): it exited",
               strerror(errno));
      return -1;
    }
    line += n;
    len -= (size_t)n;
  }
  return 0;
}

/* A child with no event in flight must be silent. @returns 0, or -1 when
 * it wrote something (it is then killed; @p why says what). */
static int exec_check_quiet(kl__exec_t *exec, kl_exec_child_t *child, char *why,
                            size_t size) {
  if (!child->pid || child->inflight)
    return 0;
  struct pollfd pfd = {child->out_fd, POLLIN, 0};
  if (!child->buf_len && poll(&pfd, 1, 0) <= 0)
    return 0;
  if (!child->buf_len) {
    ssize_t n = read(child->out_fd, child->buf, KL_EXEC_LINE_MAX - 1);
    if (n <= 0) { /* it exited while idle: start a new one */
      child->dead = 1;
      exec_reap_idle(exec, child);
      return 0;
    }
    child->buf_len = (size_t)n;
  }
  char *nl = memchr(child->buf, '\n', child->buf_len);
  int shown = nl ? (int)(nl - child->buf) : (int)child->buf_len;
  snprintf(why, size,
           "wrote \"%.*s\" while no event was in flight: every "
           "answer must belong to an event (echo its \"seq\")",
           shown > 60 ? 60 : shown, child->buf);
  pid_t pid = child->pid;
  exec_kill(exec, child, why);
  char text[384];
  snprintf(text, sizeof(text),
           "exec handler pid=%d %s; restarted, the event "
           "is retried",
           (int)pid, why);
  snprintf(why, size, "%s", text);
  return -1;
}

/* The child with room and the fewest events in flight, or NULL. */
static kl_exec_child_t *exec_pick(kl__exec_t *exec) {
  kl_exec_child_t *best = NULL;
  for (int i = 0; i < exec->nchildren; i++) {
    kl_exec_child_t *child = &exec->children[i];
    exec_reap_idle(exec, child);
    size_t room = child->echoes ? (size_t)exec->window : 1;
    if (!child->dead && child->inflight < room &&
        (!best || child->inflight < best->inflight))
      best = child;
  }
  return best;
}

/* Registers @p call with a child, started if need be. @returns the child,
 * or NULL with the reason in the call's errbuf. */
static kl_exec_child_t *exec_enter(kl__exec_t *exec, kl_exec_call_t *call) {
  kl_exec_child_t *child;
  while (!(child = exec_pick(exec)))
    pthread_cond_wait(&exec->room, &exec->mu);
  if (exec_check_quiet(exec, child, call->errbuf, call->errbuf_size))
    return NULL;
  if (!child->pid && exec_start(exec, child) != KL_OK) {
    snprintf(call->errbuf, call->errbuf_size, "%s", kl_err_detail());
    return NULL;
  }
  call->seq = ++child->next_seq;
  call->deadline_ns = kl__mono_ns() + (int64_t)exec->timeout_ms * 1000000;
  call->next = child->calls;
  child->calls = call;
  child->inflight++;
  return child;
}

/* Sends @p call's request, one writer per child at a time. */
static void exec_send(kl__exec_t *exec, kl_exec_child_t *child,
                      kl_exec_call_t *call, char *line, size_t len) {
  while (child->writing && !call->done)
    pthread_cond_wait(&exec->cond, &exec->mu);
  if (call->done) /* the child was killed meanwhile */
    return;
  size_t n = kl__exec_request_seq(line, call->seq);
  child->writing = 1;
  int fd = child->in_fd;
  pthread_mutex_unlock(&exec->mu);
  char why[256];
  int rc = exec_write(fd, line + KL__EXEC_SEQ_ROOM - n, len + n,
                      call->deadline_ns, exec->timeout_ms, why, sizeof(why));
  pthread_mutex_lock(&exec->mu);
  child->writing = 0;
  if (rc < 0)
    exec_kill(exec, child, why);
  exec_reap_idle(exec, child);
  pthread_cond_broadcast(&exec->cond);
}

/* What one read of a child's stdout gave. */
typedef struct kl_exec_read {
  kl__exec_answer_t answers[KL_EXEC_BATCH];
  size_t count;
  int bad;       /* the last answer is not one: its error says why */
  char why[256]; /* the read failed (exit, timeout, overlong line) */
} kl_exec_read_t;

/* Reads from @p child's stdout until its buffer holds a line, by
 * @p deadline_ns. @returns 0, or -1 with the reason in @p rd->why.
 * Runs without exec->mu: the reader owns the buffer. */
static int exec_fill(kl__exec_t *exec, kl_exec_child_t *child, int fd,
                     int64_t deadline_ns, kl_exec_read_t *rd) {
  while (!memchr(child->buf, '\n', child->buf_len)) {
    if (child->buf_len == KL_EXEC_LINE_MAX) {
      snprintf(rd->why, sizeof(rd->why),
               "answered a line over %d bytes "
               "(the limit)",
               KL_EXEC_LINE_MAX);
      return -1;
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    int rc = poll(&pfd, 1, exec_left_ms(deadline_ns));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0) {
      snprintf(rd->why, sizeof(rd->why), KL_EXEC_TIMED_OUT("did not answer"),
               exec->timeout_ms);
      return -1;
    }
    ssize_t n = read(fd, child->buf + child->buf_len,
                     KL_EXEC_LINE_MAX - child->buf_len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf(rd->why, sizeof(rd->why), "closed its stdout: it exited");
      return -1;
    }
    child->buf_len += (size_t)n;
  }
  return 0;
}

/* Parses the complete lines in @p child's buffer, KL_EXEC_BATCH at most,
 * up to the first that is not an answer, and drops them from it. */
static void exec_parse(kl_exec_child_t *child, kl_exec_read_t *rd) {
  size_t used = 0;
  char *nl;
  while (rd->count < KL_EXEC_BATCH && !rd->bad &&
         (nl = memchr(child->buf + used, '\n', child->buf_len - used))) {
    char *line = child->buf + used;
    *nl = '\0';
    rd->bad = kl__exec_answer_parse(line, (size_t)(nl - line),
                                    &rd->answers[rd->count++]) < 0;
    used = (size_t)(nl - child->buf) + 1;
  }
  child->buf_len -= used;
  memmove(child->buf, child->buf + used, child->buf_len);
}

static kl_exec_call_t *exec_find(kl_exec_child_t *child, uint64_t seq) {
  kl_exec_call_t *call = child->calls;
  while (call && call->seq != seq)
    call = call->next;
  return call;
}

/* The event @p answer answers, or NULL with the reason in @p why (the
 * child is then killed). */
static kl_exec_call_t *exec_match(kl_exec_child_t *child,
                                  const kl__exec_answer_t *answer, char *why,
                                  size_t size) {
  kl_exec_call_t *call = NULL;
  if (answer->has_seq) {
    child->echoes = 1;
    if (!(call = exec_find(child, answer->seq)))
      snprintf(why, size,
               "answered \"seq\":%" PRIu64 ", which no event in "
               "flight has (a line printed twice?)",
               answer->seq);
  } else if (child->echoes) {
    snprintf(why, size,
             "answered without \"seq\" after echoing it: once a "
             "handler echoes \"seq\", every answer must");
  } else if (child->inflight == 1) {
    call = child->calls;
  } else {
    snprintf(why, size,
             "answered a line without \"seq\" while %zu events "
             "were in flight: an answer must belong to an event (echo its "
             "\"seq\")",
             child->inflight);
  }
  return call;
}

static void exec_dispatch(kl__exec_t *exec, kl_exec_child_t *child,
                          kl_exec_read_t *rd) {
  char why[sizeof(rd->answers[0].error)];
  int echoed = child->echoes;
  for (size_t i = 0; i < rd->count; i++) {
    kl__exec_answer_t *answer = &rd->answers[i];
    kl_exec_call_t *call = NULL;
    if (i + 1 == rd->count && rd->bad)
      snprintf(why, sizeof(why), "%s", answer->error);
    else
      call = exec_match(child, answer, why, sizeof(why));
    if (!call) {
      for (size_t j = i; j < rd->count; j++) {
        json_decref(rd->answers[j].emit);
        json_decref(rd->answers[j].cancel);
      }
      exec_kill(exec, child, why);
      return;
    }
    call->emit = answer->emit; /* the caller's, on its own thread */
    call->cancel = answer->cancel;
    exec_complete(child, call, answer->result, answer->error);
    exec_room(exec);
  }
  if (!echoed && child->echoes) /* its window opens */
    pthread_cond_broadcast(&exec->room);
}

/* Reads answers for everyone in flight to @p child, once, until @p call's
 * deadline; then hands the reading to the next event in flight. */
static void exec_read(kl__exec_t *exec, kl_exec_child_t *child,
                      kl_exec_call_t *call) {
  child->reading = 1;
  int fd = child->out_fd;
  pthread_mutex_unlock(&exec->mu);
  kl_exec_read_t *rd = malloc(sizeof(*rd));
  int rc = -1;
  if (rd) {
    rd->count = 0;
    rd->bad = 0;
    rc = exec_fill(exec, child, fd, call->deadline_ns, rd);
    if (rc == 0)
      exec_parse(child, rd);
  }
  pthread_mutex_lock(&exec->mu);
  child->reading = 0;
  if (rc < 0)
    exec_kill(exec, child, rd ? rd->why : "left no memory to read it");
  else
    exec_dispatch(exec, child, rd);
  free(rd);
  exec_reap_idle(exec, child);
  /* One caller asleep in exec_await() takes over the reading; one
   * that is not there yet reads when it comes, if nobody does by then.
   * Waking one, not all, spares a herd per read. */
  kl_exec_call_t *next = call->done ? child->calls : NULL;
  while (next && !next->waiting)
    next = next->next;
  if (next)
    pthread_cond_signal(&next->cond);
}

/* Waits for @p call's answer, reading it when nobody else reads. */
static void exec_await(kl__exec_t *exec, kl_exec_child_t *child,
                       kl_exec_call_t *call) {
  while (!call->done) {
    if (!child->reading) {
      exec_read(exec, child, call);
      continue;
    }
    call->waiting = 1;
    int rc = kl__mono_cond_wait(&call->cond, &exec->mu, call->deadline_ns);
    call->waiting = 0;
    if (rc == ETIMEDOUT && !call->done) {
      char why[256];
      snprintf(why, sizeof(why), KL_EXEC_TIMED_OUT("did not answer"),
               exec->timeout_ms);
      exec_kill(exec, child, why);
    }
  }
}

kl_handler_result_t kl__exec_handler(void *opaque, const kl_event_t *event,
                                     const kl_fence_t *fence, kl_txn_t *txn,
                                     char *errbuf, size_t errbuf_size) {
  kl__exec_t *exec = opaque;
  size_t len;
  char *line = kl__exec_request(event, fence, &len);
  if (!line) {
    snprintf(errbuf, errbuf_size,
             "exec handler: out of memory for the "
             "event's JSON line");
    return KL_HANDLER_RETRY;
  }
  kl_exec_call_t call = {
      .errbuf = errbuf, .errbuf_size = errbuf_size, .result = KL_HANDLER_RETRY};
  kl__mono_cond_init(&call.cond);
  pthread_mutex_lock(&exec->mu);
  kl_exec_child_t *child = exec_enter(exec, &call);
  if (child) {
    exec_send(exec, child, &call, line, len);
    exec_await(exec, child, &call);
  }
  pthread_mutex_unlock(&exec->mu);
  pthread_cond_destroy(&call.cond);
  free(line);
  if (call.emit && call.result == KL_HANDLER_OK)
    call.result =
        kl__exec_emit(call.emit, exec->dlq_topic, txn, errbuf, errbuf_size);
  if (call.cancel && call.result == KL_HANDLER_OK)
    call.result = kl__exec_cancel(call.cancel, event, txn, errbuf, errbuf_size);
  json_decref(call.emit);
  json_decref(call.cancel);
  return call.result;
}

void kl__exec_destroy(kl__exec_t *exec) {
  if (!exec)
    return;
  pthread_mutex_lock(&exec->mu);
  for (int i = 0; i < exec->nchildren; i++) {
    exec_kill(exec, &exec->children[i], NULL);
    free(exec->children[i].buf);
  }
  pthread_mutex_unlock(&exec->mu);
  free(exec->children);
  pthread_cond_destroy(&exec->cond);
  pthread_cond_destroy(&exec->room);
  pthread_mutex_destroy(&exec->mu);
  free(exec->command);
  free(exec->dlq_topic);
  free(exec);
}
