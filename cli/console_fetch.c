#include "cli/console_fetch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"

#define KL_FETCH_MAX 256 /* workers fetched at once: --worker's cap */

kl_err_t kl__console_fetch_url(const char *url, kl__fetch_addr_t *out) {
  memset(out, 0, sizeof(*out));
  const char *form = "give http://HOST:PORT with HOST an IPv4 address, "
                     "[IPv6] or localhost (e.g. http://127.0.0.1:9464)";
  size_t len = strlen(url);
  while (len > 0 && url[len - 1] == '/')
    len--;
  if (strncmp(url, "http://", 7) != 0 || len <= 7 || len >= sizeof(out->url))
    return kl__err(KL_ECONF, "--worker \"%s\" is not a worker URL: %s", url,
                   form);
  memcpy(out->url, url, len);
  const char *hp = out->url + 7;
  if (strlen(hp) >= sizeof(out->host) || strchr(hp, '/'))
    return kl__err(KL_ECONF,
                   "--worker \"%s\": a worker URL has no path (the console "
                   "adds /v1/...): %s",
                   url, form);
  snprintf(out->host, sizeof(out->host), "%s", hp);
  const char *colon = strrchr(hp, ':');
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : 0;
  if (!colon || end == colon + 1 || *end || port < 1 || port > 65535)
    return kl__err(KL_ECONF, "--worker \"%s\" has no port 1..65535: %s", url,
                   form);
  char host[128];
  snprintf(host, sizeof(host), "%.*s", (int)(colon - hp), hp);
  struct sockaddr_in *v4 = (struct sockaddr_in *)&out->addr;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&out->addr;
  size_t hl = strlen(host);
  if (strcmp(host, "localhost") == 0)
    snprintf(host, sizeof(host), "127.0.0.1");
  if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
    host[hl - 1] = '\0';
    if (inet_pton(AF_INET6, host + 1, &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons((uint16_t)port);
      return KL_OK;
    }
  } else if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    return KL_OK;
  }
  return kl__err(KL_ECONF,
                 "--worker \"%s\": \"%s\" is not an IP address (names are "
                 "not resolved, so that no lookup holds the page): %s",
                 url, host, form);
}

static int64_t fetch_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct fetch_conn {
  int fd;
  char req[512];
  size_t req_len, sent;
  char *in;
  size_t in_len, in_cap;
  int done;
} fetch_conn_t;

static void fetch_fail(kl__fetch_t *f, fetch_conn_t *c, const char *how,
                       const char *what) {
  snprintf(f->error, sizeof(f->error), "%s: %s", how, what);
  c->done = 1;
}

static void fetch_start(kl__fetch_t *f, fetch_conn_t *c) {
  c->fd = socket(f->to->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int n = snprintf(c->req, sizeof(c->req),
                   "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: application/json"
                   "\r\nConnection: close\r\n\r\n",
                   f->path, f->to->host);
  c->req_len = n > 0 && (size_t)n < sizeof(c->req) ? (size_t)n : 0;
  socklen_t alen = f->to->addr.ss_family == AF_INET6
                       ? sizeof(struct sockaddr_in6)
                       : sizeof(struct sockaddr_in);
  if (c->fd < 0 || !c->req_len)
    fetch_fail(f, c, "cannot make the request", strerror(errno));
  else if (connect(c->fd, (const struct sockaddr *)&f->to->addr, alen) != 0 &&
           errno != EINPROGRESS)
    fetch_fail(f, c, "cannot connect", strerror(errno));
}

/* Splits the answer read into status and body. */
static void fetch_parse(kl__fetch_t *f, fetch_conn_t *c) {
  c->done = 1;
  int status = 0;
  char *head_end = c->in ? strstr(c->in, "\r\n\r\n") : NULL;
  if (!head_end || sscanf(c->in, "HTTP/1.%*[01] %3d", &status) != 1 ||
      status < 100) {
    snprintf(f->error, sizeof(f->error), "not an HTTP answer");
    return;
  }
  f->status = status;
  f->body_len = c->in_len - (size_t)(head_end + 4 - c->in);
  memmove(c->in, head_end + 4, f->body_len + 1);
  f->body = c->in;
  c->in = NULL;
}

static void fetch_read(kl__fetch_t *f, fetch_conn_t *c) {
  if (c->in_cap - c->in_len < 4097) {
    size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
    char *in = cap <= KL__FETCH_BODY_MAX + 8192 ? realloc(c->in, cap) : NULL;
    if (!in) {
      fetch_fail(f, c, "its answer is too long", "over 4 MiB");
      return;
    }
    c->in = in, c->in_cap = cap;
  }
  ssize_t n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (n < 0) {
    fetch_fail(f, c, "cannot read", strerror(errno));
    return;
  }
  c->in_len += (size_t)n;
  c->in[c->in_len] = '\0';
  if (n == 0)
    fetch_parse(f, c);
}

static void fetch_write(kl__fetch_t *f, fetch_conn_t *c) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (c->sent == 0 &&
      (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err)) {
    fetch_fail(f, c, "cannot connect", strerror(err ? err : errno));
    return;
  }
  ssize_t n = send(c->fd, c->req + c->sent, c->req_len - c->sent, MSG_NOSIGNAL);
  if (n < 0 && errno != EAGAIN && errno != EINTR)
    fetch_fail(f, c, "cannot send", strerror(errno));
  else if (n > 0)
    c->sent += (size_t)n;
}

void kl__console_fetch(kl__fetch_t *fetches, size_t n, int timeout_ms) {
  if (n > KL_FETCH_MAX)
    n = KL_FETCH_MAX;
  fetch_conn_t conns[KL_FETCH_MAX];
  struct pollfd pfd[KL_FETCH_MAX];
  memset(conns, 0, sizeof(conns[0]) * n);
  for (size_t i = 0; i < n; i++) {
    fetches[i].status = 0, fetches[i].body = NULL, fetches[i].body_len = 0;
    fetches[i].error[0] = '\0';
    fetch_start(&fetches[i], &conns[i]);
  }
  int64_t deadline = fetch_now_ms() + timeout_ms;
  for (;;) {
    size_t open = 0;
    for (size_t i = 0; i < n; i++) {
      pfd[i].fd = conns[i].done ? -1 : conns[i].fd;
      pfd[i].events = conns[i].sent < conns[i].req_len ? POLLOUT : POLLIN;
      pfd[i].revents = 0;
      open += !conns[i].done;
    }
    int64_t left = deadline - fetch_now_ms();
    if (!open || left <= 0 || poll(pfd, n, (int)left) < 0)
      break;
    for (size_t i = 0; i < n; i++) {
      if (conns[i].done || !pfd[i].revents)
        continue;
      if (conns[i].sent < conns[i].req_len)
        fetch_write(&fetches[i], &conns[i]);
      else
        fetch_read(&fetches[i], &conns[i]);
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (!conns[i].done)
      snprintf(fetches[i].error, sizeof(fetches[i].error),
               "no answer within %d ms", timeout_ms);
    if (conns[i].fd >= 0)
      close(conns[i].fd);
    free(conns[i].in);
  }
}

void kl__console_fetch_free(kl__fetch_t *fetches, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(fetches[i].body);
    fetches[i].body = NULL;
  }
}
