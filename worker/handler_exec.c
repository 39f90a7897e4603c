#include "worker/handler_exec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/internal.h"
#include "common/json_msgpack.h"
#include "common/log.h"

#define COMP "exec"

struct kl__exec {
  char *command;
  int timeout_ms;
  pthread_mutex_t mu; /* serializes events: one child, one at a time */
  pid_t pid;          /* 0: no child */
  int in_fd;          /* socket to the child's stdin */
  int out_fd;         /* pipe from the child's stdout */
  char *buf;          /* answer bytes read, KL_EXEC_LINE_MAX */
  size_t buf_len;
  unsigned starts;
};

/* The stderr reader owns its fd and frees itself at EOF. */
typedef struct kl_exec_errlog {
  int fd;
  pid_t pid;
} kl_exec_errlog_t;

static void *kl_exec_errlog_main(void *opaque) {
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
      KL_LOG_W(COMP, "exec[%d]: %.*s", (int)log->pid, (int)(nl - start), start);
      start = nl + 1;
    }
    len -= (size_t)(start - line);
    memmove(line, start, len);
    if (len == sizeof(line) - 1) { /* a long line goes out in pieces */
      KL_LOG_W(COMP, "exec[%d]: %.*s", (int)log->pid, (int)len, line);
      len = 0;
    }
  }
  if (len)
    KL_LOG_W(COMP, "exec[%d]: %.*s", (int)log->pid, (int)len, line);
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
  exec->buf = malloc(KL_EXEC_LINE_MAX);
  if (!exec->command || !exec->buf) {
    free(exec->command);
    free(exec->buf);
    free(exec);
    return KL_ENOMEM;
  }
  exec->timeout_ms = KL_EXEC_TIMEOUT_MS;
  exec->in_fd = exec->out_fd = -1;
  pthread_mutex_init(&exec->mu, NULL);
  *out = exec;
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

/* Kills the child's process group and reaps it. Holds exec->mu. */
static void kl_exec_kill(kl__exec_t *exec, const char *why) {
  if (!exec->pid)
    return;
  if (why)
    KL_LOG_W(COMP, "killing exec handler pid=%d (%s); it restarts with the "
             "next event", (int)exec->pid, why);
  kill(-exec->pid, SIGKILL);
  kill(exec->pid, SIGKILL);
  while (waitpid(exec->pid, NULL, 0) < 0 && errno == EINTR)
    ;
  close(exec->in_fd);
  close(exec->out_fd);
  exec->in_fd = exec->out_fd = -1;
  exec->pid = 0;
  exec->buf_len = 0;
}

static void kl_exec_child(const char *command, int in, int out, int err) {
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
    _exit(127);
  execl("/bin/sh", "sh", "-c", command, (char *)NULL);
  _exit(127);
}

/* Starts the child. Holds exec->mu. */
static kl_err_t kl_exec_start(kl__exec_t *exec) {
  int in[2], out[2], err[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, in) < 0)
    return kl__err(KL_EIO, "exec handler: socketpair: %s", strerror(errno));
  if (pipe(out) < 0 || pipe(err) < 0) {
    close(in[0]);
    close(in[1]);
    return kl__err(KL_EIO, "exec handler: pipe: %s", strerror(errno));
  }
  /* Other threads' children must not hold these ends open. */
  int fds[] = {in[0], in[1], out[0], out[1], err[0], err[1]};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
    fcntl(fds[i], F_SETFD, FD_CLOEXEC);
  pid_t pid = fork();
  if (pid == 0)
    kl_exec_child(exec->command, in[1], out[1], err[1]);
  close(in[1]);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(in[0]);
    close(out[0]);
    close(err[0]);
    return kl__err(KL_EIO, "exec handler: fork: %s", strerror(errno));
  }
  setpgid(pid, pid); /* also in the child: whichever runs first */
  exec->pid = pid;
  exec->in_fd = in[0];
  exec->out_fd = out[0];
  exec->buf_len = 0;
  exec->starts++;
  kl_exec_errlog_t *log = malloc(sizeof(*log));
  pthread_t thread;
  if (log) {
    log->fd = err[0];
    log->pid = pid;
    if (pthread_create(&thread, NULL, kl_exec_errlog_main, log) == 0) {
      pthread_detach(thread);
      log = NULL;
      err[0] = -1;
    }
  }
  free(log);
  if (err[0] >= 0)
    close(err[0]);
  KL_LOG_I(COMP, "started exec handler pid=%d: %s", (int)pid, exec->command);
  return KL_OK;
}

static int kl_exec_left_ms(int64_t deadline_ns) {
  int64_t left = (deadline_ns - kl__mono_ns()) / 1000000;
  return left < 0 ? 0 : (int)left;
}

/* Writes the request line. @returns 0, or -1 with the reason in @p why. */
static int kl_exec_write(kl__exec_t *exec, const char *line, size_t len,
                         int64_t deadline_ns, char *why, size_t size) {
  while (len) {
    struct pollfd pfd = {exec->in_fd, POLLOUT, 0};
    int rc = poll(&pfd, 1, kl_exec_left_ms(deadline_ns));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0) {
      snprintf(why, size, "did not read its stdin within %d ms",
               exec->timeout_ms);
      return -1;
    }
    ssize_t n = send(exec->in_fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
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

/* Reads one answer line into exec->buf (NUL for the newline).
 * @returns its length, or -1 with the reason in @p why. */
static ssize_t kl_exec_read_line(kl__exec_t *exec, int64_t deadline_ns,
                                 char *why, size_t size) {
  for (;;) {
    char *nl = memchr(exec->buf, '\n', exec->buf_len);
    if (nl) {
      *nl = '\0';
      return nl - exec->buf;
    }
    if (exec->buf_len == KL_EXEC_LINE_MAX) {
      snprintf(why, size, "answered a line over %d bytes (the limit)",
               KL_EXEC_LINE_MAX);
      return -1;
    }
    struct pollfd pfd = {exec->out_fd, POLLIN, 0};
    int rc = poll(&pfd, 1, kl_exec_left_ms(deadline_ns));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0) {
      snprintf(why, size, "did not answer within %d ms", exec->timeout_ms);
      return -1;
    }
    ssize_t n = read(exec->out_fd, exec->buf + exec->buf_len,
                     KL_EXEC_LINE_MAX - exec->buf_len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf(why, size, "closed its stdout: it exited");
      return -1;
    }
    exec->buf_len += (size_t)n;
  }
}

/* Drops the answer line just read from exec->buf. */
static void kl_exec_consume(kl__exec_t *exec, size_t line_len) {
  size_t used = line_len + 1;
  exec->buf_len -= used;
  memmove(exec->buf, exec->buf + used, exec->buf_len);
}

static int kl_exec_set_b64(json_t *obj, const char *name, const void *data,
                           size_t len) {
  char *b64 = malloc(kl__base64_encoded_len(len) + 1);
  if (!b64)
    return -1;
  kl__base64_encode(data, len, b64);
  int rc = json_object_set_new(obj, name, json_string(b64));
  free(b64);
  return rc;
}

/* The request line, malloc()ed and newline-terminated, or NULL. */
static char *kl_exec_request(const kl_event_t *event, const kl_fence_t *fence,
                             size_t *len) {
  json_t *obj = json_object();
  json_t *payload = NULL;
  int bad = !obj;
  if (!bad) {
    json_object_set_new(obj, "topic", json_string(fence->topic));
    json_t *key = json_stringn(event->key, event->key_len); /* NULL: not UTF-8 */
    if (key)
      json_object_set_new(obj, "key", key);
    else
      bad |= kl_exec_set_b64(obj, "key_b64", event->key, event->key_len);
    json_object_set_new(obj, "id", json_stringn(event->id, event->id_len));
    json_object_set_new(obj, "type", json_stringn(event->type, event->type_len));
    json_object_set_new(obj, "ts", json_integer(event->ts));
    json_object_set_new(obj, "partition", json_integer(fence->partition));
    json_object_set_new(obj, "offset", json_integer(fence->offset));
    json_object_set_new(obj, "epoch", json_integer((json_int_t)fence->epoch));
    if (event->payload_len &&
        kl__msgpack_to_json(event->payload, event->payload_len, &payload) ==
            KL_OK)
      json_object_set_new(obj, "payload", payload);
    else
      bad |= kl_exec_set_b64(obj, "payload_b64", event->payload,
                             event->payload_len);
  }
  char *text = bad ? NULL : json_dumps(obj, JSON_COMPACT);
  json_decref(obj);
  if (!text)
    return NULL;
  size_t n = strlen(text);
  char *line = realloc(text, n + 2);
  if (!line) {
    free(text);
    return NULL;
  }
  line[n] = '\n';
  line[n + 1] = '\0';
  *len = n + 1;
  return line;
}

/* Reads the verdict from an answer line; -1 when it is not one. */
static int kl_exec_verdict(const char *line, size_t len,
                           kl_handler_result_t *result, char *errbuf,
                           size_t errbuf_size) {
  json_error_t jerr;
  json_t *obj = json_loadb(line, len, 0, &jerr);
  const char *status = json_string_value(json_object_get(obj, "status"));
  int rc = 0;
  if (status && strcmp(status, "ok") == 0)
    *result = KL_HANDLER_OK;
  else if (status && strcmp(status, "retry") == 0)
    *result = KL_HANDLER_RETRY;
  else if (status && strcmp(status, "fail") == 0)
    *result = KL_HANDLER_FAIL;
  else
    rc = -1;
  if (rc == 0 && *result != KL_HANDLER_OK) {
    json_t *error = json_object_get(obj, "error");
    const char *text = json_string_value(error);
    char *dumped = text || !error ? NULL : json_dumps(error, JSON_COMPACT);
    snprintf(errbuf, errbuf_size, "exec handler: %s",
             text ? text : dumped ? dumped : "no error given");
    free(dumped);
  }
  json_decref(obj);
  return rc;
}

/* One event through the child. Holds exec->mu. */
static kl_handler_result_t kl_exec_call(kl__exec_t *exec, const char *line,
                                        size_t len, char *errbuf,
                                        size_t errbuf_size) {
  if (!exec->pid && kl_exec_start(exec) != KL_OK) {
    snprintf(errbuf, errbuf_size, "%s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  char why[256];
  int64_t deadline = kl__mono_ns() + (int64_t)exec->timeout_ms * 1000000;
  ssize_t n = -1;
  if (kl_exec_write(exec, line, len, deadline, why, sizeof(why)) == 0)
    n = kl_exec_read_line(exec, deadline, why, sizeof(why));
  kl_handler_result_t result = KL_HANDLER_RETRY;
  if (n >= 0) {
    if (kl_exec_verdict(exec->buf, (size_t)n, &result, errbuf, errbuf_size) ==
        0) {
      kl_exec_consume(exec, (size_t)n);
      return result;
    }
    snprintf(why, sizeof(why), "answered garbage: \"%.60s\" is not "
             "{\"status\":\"ok\"|\"retry\"|\"fail\"}", exec->buf);
  }
  snprintf(errbuf, errbuf_size, "exec handler pid=%d %s; restarted, the "
           "event is retried", (int)exec->pid, why);
  kl_exec_kill(exec, why);
  return KL_HANDLER_RETRY;
}

kl_handler_result_t kl__exec_handler(void *opaque, const kl_event_t *event,
                                     const kl_fence_t *fence, kl_txn_t *txn,
                                     char *errbuf, size_t errbuf_size) {
  kl__exec_t *exec = opaque;
  size_t len;
  char *line = kl_exec_request(event, fence, &len);
  if (!line) {
    snprintf(errbuf, errbuf_size, "exec handler: out of memory for the "
             "event's JSON line");
    return KL_HANDLER_RETRY;
  }
  pthread_mutex_lock(&exec->mu);
  kl_handler_result_t result = kl_exec_call(exec, line, len, errbuf,
                                            errbuf_size);
  pthread_mutex_unlock(&exec->mu);
  free(line);
  return result;
}

void kl__exec_destroy(kl__exec_t *exec) {
  if (!exec)
    return;
  pthread_mutex_lock(&exec->mu);
  kl_exec_kill(exec, NULL);
  pthread_mutex_unlock(&exec->mu);
  pthread_mutex_destroy(&exec->mu);
  free(exec->command);
  free(exec->buf);
  free(exec);
}
