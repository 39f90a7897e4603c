#include "http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <http_parser.h>

#include "keylane/conf.h"
#include "support/support.h"

struct kl_t_http {
  int fd;
  http_parser parser;
  char buf[64 * 1024]; /* bytes read, not yet parsed */
  size_t len;
  size_t off;
  kl_t_http_resp_t *resp; /* being filled */
  char field[128];
  size_t field_len;
  bool in_value;
  size_t hlen;
  bool done;
};

kl_t_http_t *kl_t_http_open(int port) {
  kl_t_http_t *http = calloc(1, sizeof(*http));
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  http->fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(http->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (http->fd < 0 ||
      connect(http->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
    if (http->fd >= 0)
      close(http->fd);
    free(http);
    return NULL;
  }
  http_parser_init(&http->parser, HTTP_RESPONSE);
  http->parser.data = http;
  return http;
}

void kl_t_http_close(kl_t_http_t *http) {
  if (!http)
    return;
  close(http->fd);
  free(http);
}

int kl_t_http_fd(const kl_t_http_t *http) {
  return http->fd;
}

int kl_t_http_send(kl_t_http_t *http, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = send(http->fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

char *kl_t_http_format(const char *method, const char *path, const char *extra,
                       const void *body, size_t body_len, size_t *len) {
  char head[4096];
  int n = snprintf(head, sizeof(head),
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s"
                   "Content-Length: %zu\r\n\r\n",
                   method, path, extra ? extra : "", body_len);
  char *req = malloc((size_t)n + body_len + 1);
  memcpy(req, head, (size_t)n);
  if (body_len)
    memcpy(req + n, body, body_len);
  req[(size_t)n + body_len] = '\0';
  *len = (size_t)n + body_len;
  return req;
}

int kl_t_http_request(kl_t_http_t *http, const char *method, const char *path,
                      const char *extra, const void *body, size_t body_len) {
  size_t len;
  char *req = kl_t_http_format(method, path, extra, body, body_len, &len);
  int rc = kl_t_http_send(http, req, len);
  free(req);
  return rc;
}

/* ---- response parsing ---- */

static int kl_t_on_field(http_parser *p, const char *at, size_t len) {
  kl_t_http_t *h = p->data;
  if (h->in_value) {
    h->in_value = false;
    h->field_len = 0;
  }
  for (size_t i = 0; i < len && h->field_len < sizeof(h->field) - 1; i++)
    h->field[h->field_len++] = (char)tolower((unsigned char)at[i]);
  return 0;
}

static int kl_t_on_value(http_parser *p, const char *at, size_t len) {
  kl_t_http_t *h = p->data;
  kl_t_http_resp_t *r = h->resp;
  size_t cap = sizeof(r->headers) - 1;
  if (!h->in_value) {
    h->in_value = true;
    if (h->hlen && h->hlen < cap)
      r->headers[h->hlen++] = '\n';
    int n = snprintf(r->headers + h->hlen, cap - h->hlen,
                     "%.*s: ", (int)h->field_len, h->field);
    h->hlen += n > 0 && (size_t)n < cap - h->hlen ? (size_t)n : 0;
  }
  size_t room = cap - h->hlen;
  memcpy(r->headers + h->hlen, at, len < room ? len : room);
  h->hlen += len < room ? len : room;
  r->headers[h->hlen] = '\0';
  return 0;
}

static int kl_t_on_body(http_parser *p, const char *at, size_t len) {
  kl_t_http_resp_t *r = ((kl_t_http_t *)p->data)->resp;
  r->body = realloc(r->body, r->body_len + len + 1);
  memcpy(r->body + r->body_len, at, len);
  r->body_len += len;
  r->body[r->body_len] = '\0';
  return 0;
}

static int kl_t_on_headers(http_parser *p) {
  kl_t_http_t *h = p->data;
  h->resp->status = (int)p->status_code;
  h->resp->keep_alive = http_should_keep_alive(p);
  return 0;
}

static int kl_t_on_complete(http_parser *p) {
  kl_t_http_t *h = p->data;
  h->done = true;
  http_parser_pause(p, 1); /* the next response stays in the buffer */
  return 0;
}

static const http_parser_settings kl_t_settings = {
    .on_header_field = kl_t_on_field,
    .on_header_value = kl_t_on_value,
    .on_headers_complete = kl_t_on_headers,
    .on_body = kl_t_on_body,
    .on_message_complete = kl_t_on_complete,
};

/* Parses what is buffered; @returns 1 done, 0 more needed, -1 error. */
static int kl_t_parse(kl_t_http_t *h) {
  if (HTTP_PARSER_ERRNO(&h->parser) == HPE_PAUSED)
    http_parser_pause(&h->parser, 0);
  size_t n = http_parser_execute(&h->parser, &kl_t_settings, h->buf + h->off,
                                 h->len - h->off);
  h->off += n;
  enum http_errno e = HTTP_PARSER_ERRNO(&h->parser);
  if (e != HPE_OK && e != HPE_PAUSED)
    return -1;
  if (h->off == h->len)
    h->off = h->len = 0;
  return h->done ? 1 : 0;
}

static int kl_t_fill(kl_t_http_t *h, int timeout_ms) {
  if (h->off > 0) {
    memmove(h->buf, h->buf + h->off, h->len - h->off);
    h->len -= h->off;
    h->off = 0;
  }
  struct pollfd pfd = {.fd = h->fd, .events = POLLIN};
  if (poll(&pfd, 1, timeout_ms) <= 0)
    return -1;
  ssize_t n = recv(h->fd, h->buf + h->len, sizeof(h->buf) - h->len, 0);
  if (n <= 0)
    return -1;
  h->len += (size_t)n;
  return 0;
}

int kl_t_http_recv(kl_t_http_t *h, kl_t_http_resp_t *resp, int timeout_ms) {
  memset(resp, 0, sizeof(*resp));
  h->resp = resp;
  h->done = false;
  h->in_value = false;
  h->field_len = 0;
  h->hlen = 0;
  for (;;) {
    int rc = h->len > h->off ? kl_t_parse(h) : 0;
    if (rc != 0)
      return rc > 0 ? 0 : -1;
    if (kl_t_fill(h, timeout_ms) != 0)
      return -1;
  }
}

const char *kl_t_http_header(const kl_t_http_resp_t *resp, const char *name,
                             char *out, size_t size) {
  size_t n = strlen(name);
  for (const char *p = resp->headers; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (len > n + 2 && !strncmp(p, name, n) && p[n] == ':') {
      snprintf(out, size, "%.*s", (int)(len - n - 2), p + n + 2);
      return out;
    }
    p = nl ? nl + 1 : NULL;
  }
  return NULL;
}

void kl_t_http_resp_free(kl_t_http_resp_t *resp) {
  free(resp->body);
  resp->body = NULL;
}

int kl_t_http_once(int port, const char *method, const char *path,
                   const char *extra, const char *body,
                   kl_t_http_resp_t *resp) {
  kl_t_http_t *http = kl_t_http_open(port);
  if (!http)
    return -1;
  int rc = kl_t_http_request(http, method, path, extra, body,
                             body ? strlen(body) : 0);
  if (rc == 0)
    rc = kl_t_http_recv(http, resp, 20000);
  kl_t_http_close(http);
  return rc;
}

void kl_t_http_wait_up(int port) {
  for (int i = 0; i < 200; i++) {
    kl_t_http_resp_t r;
    int rc = kl_t_http_once(port, "GET", "/healthz", NULL, NULL, &r);
    int status = rc == 0 ? r.status : 0;
    if (rc == 0)
      kl_t_http_resp_free(&r);
    if (status == 200)
      return;
    kl_t_sleep_ms(50);
  }
  fail_msg("the gateway's /healthz never answered 200 in 10 s");
}

/* ---- the gateway on a thread ---- */

static void *kl_t_gateway_main(void *opaque) {
  kl_t_gateway_t *tg = opaque;
  prctl(PR_SET_NAME, "kl-gateway"); /* to tell it apart in perf and top */
  kl__gateway_run(tg->gateway);
  return NULL;
}

kl_t_gateway_t *kl_t_gateway_start(const char *bootstrap,
                                   const kl__gateway_opts_t *opts,
                                   const char *const *extra) {
  kl__gateway_opts_t o;
  if (opts)
    o = *opts;
  else
    kl__gateway_opts_default(&o);
  o.listen = "127.0.0.1:0";
  kl_conf_t *conf = kl_conf_new();
  int bad = kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap);
  for (size_t i = 0; !bad && extra && extra[i]; i++) {
    char key[128];
    const char *eq = strchr(extra[i], '=');
    snprintf(key, sizeof(key), "%.*s", (int)(eq - extra[i]), extra[i]);
    bad = kl_conf_set(conf, key, eq + 1) != KL_OK;
  }
  kl_t_gateway_t *tg = calloc(1, sizeof(*tg));
  if (bad || kl__gateway_new(conf, &o, &tg->gateway) != KL_OK) {
    fprintf(stderr, "gateway: %s\n", kl_err_detail());
    abort();
  }
  kl_conf_destroy(conf);
  tg->port = kl__gateway_port(tg->gateway);
  pthread_create(&tg->thread, NULL, kl_t_gateway_main, tg);
  return tg;
}

void kl_t_gateway_stop(kl_t_gateway_t *tg) {
  if (!tg)
    return;
  kl__gateway_stop(tg->gateway);
  pthread_join(tg->thread, NULL);
  kl__gateway_destroy(tg->gateway);
  free(tg);
}
