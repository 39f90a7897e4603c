/*
 * keylane's HTTP/1.1 server (http.h): connections, http-parser callbacks,
 * a FIFO of requests, responses out in request order, limits, timeouts.
 *
 * Pipelining: every request is appended to the connection's FIFO when its
 * head is parsed; responses are written only from the head of the FIFO, so
 * a fast answer (a 400) waits behind a slow one (a publish waiting for
 * Kafka) and the client reads them in the order it sent the requests.
 *
 * Back-pressure: the parser is paused (http_parser_pause) and reading
 * stopped while the FIFO holds max_pipeline requests or more than
 * max_output bytes wait in the socket's write queue. The unparsed rest of
 * the last read is stashed and parsed when the client catches up. So a
 * client that sends and never reads holds at most max_pipeline requests,
 * max_output response bytes and one read chunk.
 *
 * Errors that leave the byte stream unusable (a malformed request, a head
 * or body over its limit) queue one final response with Connection: close;
 * the connection is shut down once it is written.
 *
 * All of this runs on the loop thread.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <netinet/in.h>

#include "common/http.h"
#include "common/bytes.h"
#include "common/listen.h"
#include "common/log.h"

enum {
  KL_HDR_NONE,
  KL_HDR_ACCEPT,
  KL_HDR_AUTH,
  KL_HDR_CTYPE,
  KL_HDR_EXPECT,
  KL_HDR_HOST,
  KL_HDR_ORIGIN,
  KL_HDR_TE,
  KL_HDR_TRACEPARENT,
  KL_HDR_TRACESTATE
};

static const char kl_continue[] = "HTTP/1.1 100 Continue\r\n\r\n";

static void conn_flow(kl__http_conn_t *conn);
static void conn_close(kl__http_conn_t *conn);

static void server_reject(kl__http_server_t *server, kl__http_limit_t limit) {
  if (server->hooks.reject)
    server->hooks.reject(server->opaque, limit);
}

/* ---- requests ---- */

static kl__http_req_t *req_new(kl__http_conn_t *conn) {
  kl__http_req_t *req = calloc(1, conn->server->hooks.req_size);
  if (!req)
    return NULL;
  req->conn = conn;
  req->server = conn->server;
  req->start_ns = conn->parse.start_ns ? conn->parse.start_ns : kl__mono_ns();
  return req;
}

static void req_free(kl__http_req_t *req) {
  if (!req)
    return;
  if (req->server->hooks.release)
    req->server->hooks.release(req);
  free(req->out);
  free(req);
}

static void fifo_push(kl__http_conn_t *conn, kl__http_req_t *req) {
  if (conn->tail)
    conn->tail->next = req;
  else
    conn->head = req;
  conn->tail = req;
  conn->queued++;
}

static kl__http_req_t *fifo_pop(kl__http_conn_t *conn) {
  kl__http_req_t *req = conn->head;
  conn->head = req->next;
  if (!conn->head)
    conn->tail = NULL;
  req->next = NULL;
  conn->queued--;
  return req;
}

/* Lets go of a request leaving its FIFO unanswered: one its user waits on
 * is orphaned (kl__http_req_answered() frees it), any other is freed. */
static void req_drop(kl__http_req_t *req) {
  const kl__http_hooks_t *hooks = &req->server->hooks;
  if (req->status == 0 && hooks->pending && hooks->pending(req))
    req->conn = NULL;
  else
    req_free(req);
}

/* Removes the request being parsed (the FIFO's tail) when the client went
 * away before finishing it. */
static void fifo_drop_partial(kl__http_conn_t *conn) {
  kl__http_req_t *req = conn->parse.req;
  conn->parse.req = NULL;
  if (!req)
    return;
  kl__http_req_t **p = &conn->head;
  while (*p && *p != req)
    p = &(*p)->next;
  if (!*p)
    return;
  *p = req->next;
  if (conn->tail == req) {
    conn->tail = NULL;
    for (kl__http_req_t *r = conn->head; r; r = r->next)
      conn->tail = r;
  }
  conn->queued--;
  req_drop(req);
}

/* ---- responses ---- */

const char *kl__http_reason(int status) {
  switch (status) {
  case 200:
    return "OK";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 409:
    return "Conflict";
  case 413:
    return "Content Too Large";
  case 415:
    return "Unsupported Media Type";
  case 505:
    return "HTTP Version Not Supported";
  case 429:
    return "Too Many Requests";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  case 501:
    return "Not Implemented";
  case 503:
    return "Service Unavailable";
  default:
    return "Unknown";
  }
}

void kl__http_respond(kl__http_req_t *req, int status, const char *ctype,
                      const char *extra, const char *body, size_t body_len) {
  if (req->server->stopping || req->server->opts.one_request)
    req->close = true; /* draining: let clients reconnect elsewhere */
  char date[64];
  time_t now = time(NULL);
  struct tm tm;
  strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT",
           gmtime_r(&now, &tm));
  kl__strbuf_t sb = KL__STRBUF_INIT;
  /* Sized for the head and the body at once: one allocation per answer. */
  size_t size = 256 + (ctype ? strlen(ctype) : 0) +
                (extra ? strlen(extra) : 0) + body_len;
  sb.data = kl__reserve(NULL, &sb.cap, size, 1, 256);
  sb.failed = !sb.data;
  kl__strbuf_printf(&sb,
                    "HTTP/1.1 %d %s\r\nServer: keylane\r\nDate: %s\r\n"
                    "Content-Type: %s\r\nContent-Length: %zu\r\n%s"
                    "Connection: %s\r\n\r\n",
                    status, kl__http_reason(status), date, ctype, body_len,
                    extra ? extra : "", req->close ? "close" : "keep-alive");
  kl__strbuf_add(&sb, body, body_len);
  free(req->out);
  req->out = kl__strbuf_take(&sb, &req->out_len);
  req->status = req->out ? status : 500;
  if (!req->out) { /* no memory for the answer: end the connection */
    req->close = true;
    req->out = strdup("HTTP/1.1 500 Internal Server Error\r\n"
                      "Content-Length: 0\r\nConnection: close\r\n\r\n");
    req->out_len = req->out ? strlen(req->out) : 0;
  }
  if (req->server->hooks.responded)
    req->server->hooks.responded(req);
}

/* ---- writing ---- */

static void on_shutdown(uv_shutdown_t *shutdown, int status) {
  kl__http_conn_t *conn = shutdown->data;
  (void)status;
  free(shutdown);
  conn_close(conn);
}

/* Once everything is written (libuv's shutdown waits for the write queue),
 * half-close and then close, so the last response is not cut off. */
static void conn_finish(kl__http_conn_t *conn) {
  if (conn->closing || conn->head || conn->shutting_down)
    return;
  uv_shutdown_t *shutdown = malloc(sizeof(*shutdown));
  if (!shutdown) {
    conn_close(conn);
    return;
  }
  shutdown->data = conn;
  conn->shutting_down = true;
  if (uv_shutdown(shutdown, (uv_stream_t *)&conn->tcp, on_shutdown) != 0) {
    free(shutdown);
    conn_close(conn);
  }
}

static void on_write(uv_write_t *write, int status) {
  kl__http_req_t *req = write->data;
  kl__http_conn_t *conn = req->conn;
  req_free(req);
  if (!conn || conn->closing)
    return; /* libuv cancels queued writes when a connection closes */
  conn->writes--;
  conn->last_write_ns = kl__mono_ns();
  if (status < 0) {
    KL_LOG_D(conn->server->opts.component, "%s: write failed: %s", conn->peer,
             uv_strerror(status));
    conn_close(conn);
    return;
  }
  conn_flow(conn);
}

static void conn_flush(kl__http_conn_t *conn) {
  uv_stream_t *stream = (uv_stream_t *)&conn->tcp;
  /* Not the request being parsed, answered at its head or not: the parser
   * holds it until its body was read (a written request is freed). */
  while (!conn->closing && conn->head && conn->head->status &&
         conn->head != conn->parse.req) {
    kl__http_req_t *req = fifo_pop(conn);
    if (req->close) {
      conn->close_after = true;
      /* Nothing after a Connection: close response is answered, nor
       * read: the request being parsed is let go of too. */
      while (conn->head) {
        kl__http_req_t *rest = fifo_pop(conn);
        if (rest == conn->parse.req) {
          conn->parse.req = NULL;
          conn->parse.active = false;
        }
        req_drop(rest);
      }
    }
    if (uv_stream_get_write_queue_size(stream) == 0)
      conn->last_write_ns = kl__mono_ns(); /* a stall is timed from here */
    uv_buf_t buf = uv_buf_init(req->out, (unsigned)req->out_len);
    req->write.data = req;
    if (uv_write(&req->write, stream, &buf, 1, on_write) != 0) {
      req_free(req);
      conn_close(conn);
      return;
    }
    conn->writes++;
  }
  if (!conn->closing && conn->close_after)
    conn_finish(conn);
  conn_flow(conn);
}

void kl__http_req_answered(kl__http_req_t *req) {
  if (!req->conn) {
    req_free(req); /* its client left while it waited */
    return;
  }
  conn_flush(req->conn);
}

/* ---- fatal errors ---- */

/* Queues a final response for the request being parsed (or a new one) and
 * ends the connection after it. @returns -1, to stop http-parser. */
static int conn_fatal(kl__http_conn_t *conn, int status, kl__http_limit_t limit,
                      const char *msg) {
  kl__http_parse_t *parse = &conn->parse;
  kl__http_req_t *req = parse->req;
  if (!req && (req = req_new(conn)))
    fifo_push(conn, req);
  parse->req = NULL;
  parse->active = false;
  conn->close_after = true;
  if (limit != KL__HTTP_LIMIT__COUNT)
    server_reject(conn->server, limit);
  if (!req) {
    conn_close(conn);
    return -1;
  }
  req->close = true;
  conn->server->hooks.error(req, status, msg);
  conn_flush(conn);
  return -1;
}

static void conn_timeout(kl__http_conn_t *conn) {
  char msg[128];
  snprintf(
      msg, sizeof(msg), "the request did not arrive whole within %d ms (%s)",
      conn->server->opts.request_timeout_ms, conn->server->opts.timeout_hint);
  conn_fatal(conn, 408, KL__HTTP_LIMIT__COUNT, msg);
}

/* ---- parser callbacks ---- */

static void parse_reset(kl__http_parse_t *parse) {
  kl__strbuf_free(&parse->url);
  kl__strbuf_free(&parse->body);
  kl__http_req_t *req = parse->req;
  memset(parse, 0, sizeof(*parse));
  parse->req = req;
}

static int count_head(kl__http_conn_t *conn, size_t len) {
  kl__http_parse_t *parse = &conn->parse;
  parse->header_bytes += len;
  if (parse->header_bytes <= conn->server->opts.max_header)
    return 0;
  char msg[160];
  snprintf(msg, sizeof(msg),
           "the request line and headers exceed %zu bytes (%s)",
           conn->server->opts.max_header, conn->server->opts.header_hint);
  return conn_fatal(conn, 431, KL__HTTP_LIMIT_HEADER, msg);
}

static int http_on_message_begin(http_parser *p) {
  kl__http_conn_t *conn = p->data;
  parse_reset(&conn->parse);
  conn->parse.active = true;
  conn->parse.start_ns = kl__mono_ns();
  return 0;
}

static int http_on_url(http_parser *p, const char *at, size_t len) {
  kl__http_conn_t *conn = p->data;
  if (count_head(conn, len))
    return -1;
  kl__strbuf_add(&conn->parse.url, at, len);
  return 0;
}

static int header_kind(const kl__http_parse_t *parse) {
  static const struct {
    const char *name;
    int kind;
  } names[] = {{"accept", KL_HDR_ACCEPT},
               {"authorization", KL_HDR_AUTH},
               {"content-type", KL_HDR_CTYPE},
               {"expect", KL_HDR_EXPECT},
               {"host", KL_HDR_HOST},
               {"origin", KL_HDR_ORIGIN},
               {"transfer-encoding", KL_HDR_TE},
               {"traceparent", KL_HDR_TRACEPARENT},
               {"tracestate", KL_HDR_TRACESTATE}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (parse->field_len == strlen(names[i].name) &&
        strncasecmp(parse->field, names[i].name, parse->field_len) == 0)
      return names[i].kind;
  return KL_HDR_NONE;
}

/* RFC 9110's tchar: what a field name is made of. http-parser 2.9 also
 * takes a space ("Content-Length : 5" is read as Content-Length), which a
 * proxy in front may read differently: a request smuggled past it. */
bool kl__http_tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

long kl__http_pct_decode(const char *in, size_t len, char *out) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (in[i] != '%') {
      out[n++] = in[i];
      continue;
    }
    int hi = i + 2 < len ? kl__hex_value((unsigned char)in[i + 1]) : -1;
    int lo = hi >= 0 ? kl__hex_value((unsigned char)in[i + 2]) : -1;
    if (lo < 0)
      return -1;
    out[n++] = (char)(hi << 4 | lo);
    i += 2;
  }
  return (long)n;
}

const char *kl__http_query(const char *query, const char *name, size_t *len) {
  size_t name_len = strlen(name);
  for (const char *q = query; q && *q;) {
    size_t n = strcspn(q, "&");
    if (n > name_len && strncmp(q, name, name_len) == 0 && q[name_len] == '=') {
      *len = n - name_len - 1;
      return q + name_len + 1;
    }
    q += n;
    q += *q == '&';
  }
  return NULL;
}

/* A value that starts on a line of its own: obs-fold ("X: a\r\n b"), which
 * http-parser 2.9 joins to the line before. @p at is where the value
 * callback's bytes start; a line ending between the last field or value
 * callback and it is a fold. */
static bool http_folded(const kl__http_conn_t *conn, const char *at) {
  const kl__http_parse_t *parse = &conn->parse;
  const char *from = parse->mark ? parse->mark : conn->feed;
  return parse->nl_after_mark ||
         (from && at > from && memchr(from, '\n', (size_t)(at - from)));
}

static void http_mark(kl__http_parse_t *parse, const char *end) {
  parse->mark = end;
  parse->nl_after_mark = false;
}

static int http_on_header_field(http_parser *p, const char *at, size_t len) {
  kl__http_conn_t *conn = p->data;
  kl__http_parse_t *parse = &conn->parse;
  if (count_head(conn, len))
    return -1;
  http_mark(parse, at + len);
  for (size_t i = 0; i < len; i++)
    if (!kl__http_tchar((unsigned char)at[i]))
      return conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT,
                        "a header name holds a space or another "
                        "character names may not hold (no whitespace "
                        "before the colon: RFC 9112)");
  if (parse->in_value) { /* a new header starts */
    parse->in_value = false;
    parse->field_len = 0;
  }
  /* Names longer than the buffer are none we care about: keep them
   * unmatched by counting past the buffer (and copying nothing more: a
   * long name arriving in pieces once wrote past it). */
  if (parse->field_len < sizeof(parse->field)) {
    size_t room = sizeof(parse->field) - parse->field_len;
    memcpy(parse->field + parse->field_len, at, len < room ? len : room);
  }
  parse->field_len += len;
  return 0;
}

/* Appends to a fixed buffer; @returns false when it does not fit. */
static bool http_append(char *buf, size_t cap, size_t *len, const char *at,
                        size_t n) {
  if (*len + n > cap)
    return false;
  memcpy(buf + *len, at, n);
  *len += n;
  return true;
}

/* W3C trace context: one traceparent (a second one makes it invalid);
 * tracestate headers join into one list. */
static void trace_header_begins(kl__http_parse_t *parse) {
  if (parse->header == KL_HDR_TRACEPARENT && parse->traceparent_len)
    parse->traceparent_bad = true;
  if (parse->header == KL_HDR_TRACESTATE && parse->tracestate_len)
    parse->tracestate_long |= !http_append(parse->tracestate, KL_TRACESTATE_MAX,
                                           &parse->tracestate_len, ",", 1);
}

static void trace_header_value(kl__http_parse_t *parse, const char *at,
                               size_t len) {
  if (parse->header == KL_HDR_TRACEPARENT &&
      !http_append(parse->traceparent, sizeof(parse->traceparent),
                   &parse->traceparent_len, at, len))
    parse->traceparent_bad = true;
  else if (parse->header == KL_HDR_TRACESTATE &&
           !http_append(parse->tracestate, KL_TRACESTATE_MAX,
                        &parse->tracestate_len, at, len))
    parse->tracestate_long = true;
}

/* A header's first value callback: which header it is, and what a second
 * one of a kind means. */
static void header_begins(kl__http_parse_t *parse) {
  parse->in_value = true;
  parse->header = header_kind(parse);
  if (parse->header == KL_HDR_AUTH) /* two (one empty, say): no match */
    parse->auth_long |= parse->auth_seen;
  parse->auth_seen |= parse->header == KL_HDR_AUTH;
  if (parse->header == KL_HDR_ORIGIN)
    parse->origin_bad |= parse->origin_seen; /* two: not on any list */
  parse->origin_seen |= parse->header == KL_HDR_ORIGIN;
  if (parse->header == KL_HDR_TE && parse->te_seen) /* one list */
    parse->te_long |=
        !http_append(parse->te, sizeof(parse->te) - 1, &parse->te_len, ",", 1);
  parse->te_seen |= parse->header == KL_HDR_TE;
  parse->hosts += parse->header == KL_HDR_HOST;
  trace_header_begins(parse);
}

/* Host is uri-host [":" port] (RFC 9112 3.2): reg-name, IPv4 or an IP
 * literal in brackets; http-parser leaves trailing whitespace in a value. */
static void host_value(kl__http_parse_t *parse, const char *at, size_t len) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)at[i];
    bool ws = c == ' ' || c == '\t';
    if (parse->host_ws
            ? !ws
            : !ws && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') ||
                       (c && strchr("-._~%!$&'()*+,;=:[]", c))))
      parse->host_bad = true;
    parse->host_ws |= ws;
    if (!ws)
      parse->host_long |= !http_append(parse->host, sizeof(parse->host) - 1,
                                       &parse->host_len, at + i, 1);
  }
}

static int http_on_header_value(http_parser *p, const char *at, size_t len) {
  kl__http_conn_t *conn = p->data;
  kl__http_parse_t *parse = &conn->parse;
  if (count_head(conn, len))
    return -1;
  if (len == 0) { /* an empty value (http-parser points past its line's
                     end), or a piece at the edge of a read */
    if (!parse->in_value)
      header_begins(parse); /* else the next name joins this one's */
    return 0;
  }
  if (http_folded(conn, at))
    return conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT,
                      "a header value continues on the next line "
                      "(obs-fold, refused by RFC 9112): send it on one "
                      "line");
  http_mark(parse, at + len);
  if (!parse->in_value)
    header_begins(parse);
  if (parse->header == KL_HDR_AUTH &&
      !http_append(parse->auth, sizeof(parse->auth), &parse->auth_len, at, len))
    parse->auth_long = true;
  else if (parse->header == KL_HDR_ACCEPT)
    http_append(parse->accept, sizeof(parse->accept) - 1, &parse->accept_len,
                at,
                len < sizeof(parse->accept) - 1 - parse->accept_len
                    ? len
                    : sizeof(parse->accept) - 1 - parse->accept_len);
  else if (parse->header == KL_HDR_CTYPE)
    http_append(parse->ctype, sizeof(parse->ctype) - 1, &parse->ctype_len, at,
                len);
  else if (parse->header == KL_HDR_ORIGIN &&
           !http_append(parse->origin, sizeof(parse->origin),
                        &parse->origin_len, at, len))
    parse->origin_bad = true;
  else if (parse->header == KL_HDR_TE &&
           !http_append(parse->te, sizeof(parse->te) - 1, &parse->te_len, at,
                        len))
    parse->te_long = true;
  else if (parse->header == KL_HDR_EXPECT)
    parse->expect_continue =
        len >= 12 && strncasecmp(at, "100-continue", 12) == 0;
  else if (parse->header == KL_HDR_HOST)
    host_value(parse, at, len);
  else
    trace_header_value(parse, at, len);
  return 0;
}

/* An interim 100 only when nothing is queued before this request: a 1xx
 * must not overtake the final responses of earlier requests. */
static void maybe_continue(kl__http_conn_t *conn) {
  if (!conn->parse.expect_continue || conn->head != conn->parse.req)
    return;
  uv_buf_t buf = uv_buf_init((char *)kl_continue, sizeof(kl_continue) - 1);
  uv_try_write((uv_stream_t *)&conn->tcp, &buf, 1); /* best effort: the
    client sends the body anyway after a second */
}

/* Transfer-Encoding: only "chunked", once. http-parser 2.9 reads any list
 * ending in chunked ("gzip, chunked") as chunked, bytes it cannot decode.
 * @returns 0, or the status to answer (RFC 9112: 501 for a coding it does
 * not implement, 400 for chunked twice) with @p msg. */
static int te_check(kl__http_parse_t *parse, char *msg, size_t size) {
  if (!parse->te_seen)
    return 0;
  parse->te[parse->te_len] = '\0';
  int chunked = 0, other = parse->te_long;
  for (const char *s = parse->te; *s;) {
    size_t n = strcspn(s, ","), skip = n;
    while (n && (*s == ' ' || *s == '\t'))
      s++, n--, skip--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
      n--;
    if (n == 7 && strncasecmp(s, "chunked", 7) == 0)
      chunked++;
    else
      other = 1;
    s += skip;
    s += *s == ',';
  }
  snprintf(msg, size,
           "Transfer-Encoding \"%s%s\": this server implements chunked "
           "alone; send the body with Content-Length or chunked",
           parse->te, parse->te_long ? "..." : "");
  return other ? 501 : chunked != 1 ? 400 : 0;
}

/* One Host header, of host[:port] bytes; none only before HTTP/1.1 (RFC
 * 9112 3.2). @returns NULL, or why not. */
static const char *host_check(const kl__http_parse_t *parse,
                              const http_parser *p) {
  if (parse->hosts > 1)
    return "more than one Host header: a request carries one (RFC 9112)";
  if (parse->hosts == 0 && p->http_minor >= 1)
    return "no Host header: an HTTP/1.1 request carries one (RFC 9112)";
  if (parse->host_bad)
    return "the Host header is not host[:port] (RFC 9112)";
  return NULL;
}

static int http_on_headers_complete(http_parser *p) {
  kl__http_conn_t *conn = p->data;
  kl__http_parse_t *parse = &conn->parse;
  char why[160];
  int status = te_check(parse, why, sizeof(why));
  if (status)
    return conn_fatal(conn, status, KL__HTTP_LIMIT__COUNT, why);
  if (p->http_major != 1) {
    snprintf(why, sizeof(why),
             "HTTP/%u.%u is not supported: this server speaks HTTP/1.1",
             p->http_major, p->http_minor);
    return conn_fatal(conn, 505, KL__HTTP_LIMIT__COUNT, why);
  }
  const char *host = host_check(parse, p);
  if (host)
    return conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT, host);
  kl__http_req_t *req = req_new(conn);
  if (!req)
    return conn_fatal(conn, 503, KL__HTTP_LIMIT__COUNT, "out of memory");
  parse->req = req;
  fifo_push(conn, req);
  req->close = !http_should_keep_alive(p);
  parse->ctype[parse->ctype_len] = '\0';
  parse->accept[parse->accept_len] = '\0';
  conn->server->hooks.head(conn, req, p->method,
                           parse->url.data ? parse->url.data : "",
                           parse->url.len);
  parse->discard_body = req->status != 0;
  bool known = !(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX;
  if (known && p->content_length > conn->server->opts.max_body) {
    char msg[160];
    snprintf(msg, sizeof(msg), "the body is %llu bytes, the limit is %zu (%s)",
             (unsigned long long)p->content_length, conn->server->opts.max_body,
             conn->server->opts.body_hint);
    return conn_fatal(conn, 413, KL__HTTP_LIMIT_BODY, msg);
  }
  if (!parse->discard_body)
    maybe_continue(conn);
  /* conn_feed() learns where the head ends (the parser stops on its
   * last byte), checks that byte and a chunked body's framing, and goes
   * on. */
  parse->chunked = p->flags & F_CHUNKED;
  parse->head_end = true;
  http_parser_pause(p, 1);
  return 0;
}

static int http_on_body(http_parser *p, const char *at, size_t len) {
  kl__http_conn_t *conn = p->data;
  kl__http_parse_t *parse = &conn->parse;
  parse->body_len += len;
  if (parse->body_len > conn->server->opts.max_body) {
    char msg[160];
    snprintf(msg, sizeof(msg), "the body exceeds %zu bytes (%s)",
             conn->server->opts.max_body, conn->server->opts.body_hint);
    return conn_fatal(conn, 413, KL__HTTP_LIMIT_BODY, msg);
  }
  if (!parse->discard_body)
    kl__strbuf_add(&parse->body, at, len);
  return 0;
}

static int http_on_message_complete(http_parser *p) {
  kl__http_conn_t *conn = p->data;
  kl__http_parse_t *parse = &conn->parse;
  if (parse->chunked && !kl__http_chunked_done(&parse->framing))
    return conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT,
                      "malformed chunked body: it ends before its last "
                      "chunk and CRLF (RFC 9112)");
  kl__http_req_t *req = parse->req;
  parse->req = NULL;
  parse->active = false;
  if (!kl__strbuf_ok(&parse->body))
    conn->server->hooks.error(req, 503, "out of memory for the body");
  if (!req->status)
    conn->server->hooks.body(
        conn, req, parse->body.data ? parse->body.data : "", parse->body.len);
  if (conn->closing)
    return -1; /* another answer's failed write closed it; req may be gone */
  parse_reset(parse); /* the body is not needed any more */
  if (req->close || p->upgrade)
    conn->close_after = true;
  if (conn->close_after || conn->queued >= conn->server->opts.max_pipeline)
    http_parser_pause(p, 1); /* the rest of this read waits in the stash */
  conn_flush(conn);
  return 0;
}

static const http_parser_settings kl_settings = {
    .on_message_begin = http_on_message_begin,
    .on_url = http_on_url,
    .on_header_field = http_on_header_field,
    .on_header_value = http_on_header_value,
    .on_headers_complete = http_on_headers_complete,
    .on_body = http_on_body,
    .on_message_complete = http_on_message_complete,
};

/* ---- reading ---- */

static void conn_stash(kl__http_conn_t *conn, const char *data, size_t len) {
  char *stash = malloc(len);
  if (!stash) {
    conn_close(conn);
    return;
  }
  memcpy(stash, data, len);
  conn->stash = stash;
  conn->stash_len = len;
}

static void conn_parse_error(kl__http_conn_t *conn) {
  enum http_errno e = HTTP_PARSER_ERRNO(&conn->parser);
  char msg[256];
  snprintf(msg, sizeof(msg), "malformed HTTP request: %s",
           http_errno_description(e));
  if (e == HPE_HEADER_OVERFLOW)
    conn_fatal(conn, 431, KL__HTTP_LIMIT_HEADER, msg);
  else
    conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT, msg);
}

/* The buffer [@p begin, @p end) was parsed: the mark points into it no
 * more, so remember whether a line ended after the mark. */
static void feed_done(kl__http_parse_t *parse, const char *begin,
                      const char *end) {
  const char *from = parse->mark ? parse->mark : begin;
  if (parse->active && end > from && memchr(from, '\n', (size_t)(end - from)))
    parse->nl_after_mark = true;
  parse->mark = NULL;
}

/* Checks the next @p len bytes of a chunked body being read, ahead of
 * http-parser, so that malformed framing is refused before the request is
 * acted on. @returns false once it refused the request. */
static bool http_framing(kl__http_conn_t *conn, const char *at, size_t len) {
  kl__http_parse_t *parse = &conn->parse;
  if (!parse->chunked || kl__http_chunked_scan(&parse->framing, at, len) == 0)
    return true;
  char msg[256];
  snprintf(msg, sizeof(msg), "malformed chunked body: %s (RFC 9112)",
           parse->framing.why);
  conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT, msg);
  return false;
}

/* The parser stopped on the last byte of a head, at @p at (before
 * @p end): http-parser takes any byte after the blank line's CR for its
 * LF. A chunked body is checked from there on. @returns false once it
 * refused the request. */
static bool http_head_end(kl__http_conn_t *conn, const char *at,
                          const char *end) {
  kl__http_parse_t *parse = &conn->parse;
  parse->head_end = false;
  if (at >= end || *at != '\n') {
    conn_fatal(conn, 400, KL__HTTP_LIMIT__COUNT,
               "malformed HTTP request: the blank line that ends the "
               "head is not CRLF");
    return false;
  }
  kl__http_chunked_init(&parse->framing);
  return http_framing(conn, at + 1, (size_t)(end - at - 1));
}

/* Runs the parser over @p data; keeps what a pause left unparsed. */
static void conn_feed(kl__http_conn_t *conn, const char *data, size_t len) {
  if (HTTP_PARSER_ERRNO(&conn->parser) == HPE_PAUSED)
    http_parser_pause(&conn->parser, 0);
  conn->in_parse = true;
  conn->feed = data;
  size_t n = 0;
  bool go = http_framing(conn, data, len); /* a body begun in a past read */
  while (go) {
    n += http_parser_execute(&conn->parser, &kl_settings, data + n, len - n);
    if (!conn->parse.head_end)
      break;
    if ((go = http_head_end(conn, data + n, data + len)))
      http_parser_pause(&conn->parser, 0);
  }
  conn->in_parse = false;
  feed_done(&conn->parse, conn->feed, data + n);
  conn->feed = NULL;
  if (conn->closing || conn->close_after) {
    conn_flow(conn); /* what follows a final response is dropped */
    return;
  }
  enum http_errno e = HTTP_PARSER_ERRNO(&conn->parser);
  if (e == HPE_PAUSED && n < len)
    conn_stash(conn, data + n, len - n);
  else if (e != HPE_OK && e != HPE_PAUSED)
    conn_parse_error(conn);
  if (!conn->closing)
    conn_flow(conn);
}

static bool conn_hold(const kl__http_conn_t *conn) {
  const kl__http_opts_t *o = &conn->server->opts;
  return conn->queued >= o->max_pipeline ||
         uv_stream_get_write_queue_size((uv_stream_t *)&conn->tcp) >
             o->max_output;
}

static void set_paused(kl__http_conn_t *conn, bool paused) {
  if (conn->paused == paused)
    return;
  conn->paused = paused;
  if (paused) {
    conn->server->npaused++;
    server_reject(conn->server, conn->queued >= conn->server->opts.max_pipeline
                                    ? KL__HTTP_LIMIT_PIPELINE
                                    : KL__HTTP_LIMIT_OUTPUT);
  } else {
    conn->server->npaused--;
  }
}

static void http_alloc(uv_handle_t *handle, size_t hint, uv_buf_t *buf) {
  kl__http_conn_t *conn = (kl__http_conn_t *)handle;
  (void)hint;
  /* Parsing is synchronous in the read callback, so one buffer serves all
   * connections; a pause copies what is left into the stash. */
  *buf = uv_buf_init(conn->server->read_buf, sizeof(conn->server->read_buf));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  kl__http_conn_t *conn = (kl__http_conn_t *)stream;
  if (nread == 0)
    return;
  if (nread < 0) {
    conn->reading = false;
    uv_read_stop(stream);
    if (nread != UV_EOF) {
      conn_close(conn);
      return;
    }
    conn->eof = true; /* answer what was sent, then close */
    conn->close_after = true;
    conn->parse.active = false;
    fifo_drop_partial(conn);
    conn_flush(conn);
    return;
  }
  conn->last_read_ns = kl__mono_ns();
  conn_feed(conn, buf->base, (size_t)nread);
}

/* Reads when the connection may take more, stops when it may not, and
 * parses the stash once the client caught up. Never inside the parser. */
static void conn_flow(kl__http_conn_t *conn) {
  if (conn->closing || conn->in_parse)
    return;
  bool done = conn->close_after || conn->eof;
  bool hold = done || conn_hold(conn);
  if (hold) {
    if (conn->reading)
      uv_read_stop((uv_stream_t *)&conn->tcp);
    conn->reading = false;
    set_paused(conn, !done);
    return;
  }
  set_paused(conn, false);
  if (conn->stash) {
    char *stash = conn->stash;
    size_t len = conn->stash_len;
    conn->stash = NULL;
    conn->stash_len = 0;
    conn_feed(conn, stash, len); /* ends with conn_flow() again */
    free(stash);
    return;
  }
  if (!conn->reading &&
      uv_read_start((uv_stream_t *)&conn->tcp, http_alloc, on_read) == 0)
    conn->reading = true;
}

static void conn_start(kl__http_conn_t *conn) {
  http_parser_init(&conn->parser, HTTP_REQUEST);
  conn->parser.data = conn;
  conn->last_read_ns = conn->last_write_ns = kl__mono_ns();
  conn_flow(conn);
}

static void conn_release(kl__http_conn_t *conn) {
  kl__http_parse_t *parse = &conn->parse;
  parse->req = NULL; /* it is in the FIFO, dropped below */
  parse_reset(parse);
  while (conn->head)
    req_drop(fifo_pop(conn));
  free(conn->stash);
  conn->stash = NULL;
  set_paused(conn, false);
}

/* ---- connections ---- */

static void on_conn_closed(uv_handle_t *handle) {
  kl__http_conn_t *conn = (kl__http_conn_t *)handle;
  kl__http_server_t *server = conn->server;
  if (conn->prev)
    conn->prev->next = conn->next;
  else
    server->conns = conn->next;
  if (conn->next)
    conn->next->prev = conn->prev;
  server->nconns--;
  free(conn);
}

/* Closes @p conn now; its waiting requests are orphaned. */
static void conn_close(kl__http_conn_t *conn) {
  if (conn->closing)
    return;
  conn_release(conn);
  conn->closing = true;
  uv_close((uv_handle_t *)&conn->tcp, on_conn_closed);
}

static void on_reject_closed(uv_handle_t *handle) {
  free(handle);
}

/* Over the connection cap: a canned 503 (no allocation beyond the handle,
 * freed on the next loop turn) tells the client why, instead of leaving it
 * in the kernel's backlog; without a busy_body, the connection is closed. */
static void reject_connection(kl__http_server_t *server) {
  uv_tcp_t *tcp = malloc(sizeof(*tcp));
  if (!tcp || uv_tcp_init(server->loop, tcp) != 0) {
    free(tcp);
    return;
  }
  const char *body = server->opts.busy_body;
  if (uv_accept((uv_stream_t *)&server->listener, (uv_stream_t *)tcp) == 0 &&
      body) {
    char head[192];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n"
                     "Retry-After: %d\r\nConnection: close\r\n\r\n",
                     strlen(body), server->opts.retry_after_s);
    uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)n),
                        uv_buf_init((char *)body, (unsigned)strlen(body))};
    uv_try_write((uv_stream_t *)tcp, bufs, 2);
  }
  server_reject(server, KL__HTTP_LIMIT_CONNECTIONS);
  uv_close((uv_handle_t *)tcp, on_reject_closed);
}

/* With evict_idle, past the cap: closes the oldest connection that waits
 * for its request (none answered or being answered), so that idle clients
 * cannot lock a probe out. @returns whether the new one may be taken. */
static bool evict_oldest(kl__http_server_t *server) {
  size_t open = 0;
  kl__http_conn_t *oldest = NULL;
  for (kl__http_conn_t *c = server->conns; c; c = c->next) {
    if (c->closing)
      continue;
    open++;
    if (!c->head && !c->parse.req)
      oldest = c; /* the list is newest first: the last one is oldest */
  }
  if (open < server->opts.max_connections)
    return true;
  if (oldest) {
    KL_LOG_D(server->opts.component,
             "%zu connections: closing the oldest idle one", open);
    server_reject(server, KL__HTTP_LIMIT_CONNECTIONS);
    conn_close(oldest);
    return true;
  }
  /* Closing ones are freed within a loop turn; answered ones within a
   * write: twice the cap bounds what a burst can hold. */
  return server->nconns < 2 * server->opts.max_connections;
}

static void conn_peer(kl__http_conn_t *conn) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (uv_tcp_getpeername(&conn->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    } else {
      uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
      port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
  }
  snprintf(conn->peer, sizeof(conn->peer), "%s:%d", ip, port);
}

static void on_connection(uv_stream_t *listener, int status) {
  kl__http_server_t *server = listener->data;
  if (status < 0 || server->stopping)
    return;
  bool room = server->opts.evict_idle
                  ? evict_oldest(server)
                  : server->nconns < server->opts.max_connections;
  if (!room) {
    reject_connection(server);
    return;
  }
  kl__http_conn_t *conn = calloc(1, sizeof(*conn));
  if (!conn || uv_tcp_init(server->loop, &conn->tcp) != 0) {
    free(conn);
    reject_connection(server);
    return;
  }
  conn->server = server;
  conn->next = server->conns;
  if (server->conns)
    server->conns->prev = conn;
  server->conns = conn;
  server->nconns++;
  if (server->hooks.accepted)
    server->hooks.accepted(server->opaque);
  if (uv_accept(listener, (uv_stream_t *)&conn->tcp) != 0) {
    conn_close(conn);
    return;
  }
  uv_tcp_nodelay(&conn->tcp, 1); /* responses are small and latency-bound */
  conn_peer(conn);
  conn_start(conn);
}

/* ---- timeouts ---- */

static void sweep_conn(kl__http_server_t *server, kl__http_conn_t *conn,
                       int64_t now) {
  const kl__http_opts_t *o = &server->opts;
  int64_t idle_ns = (int64_t)o->idle_timeout_ms * 1000000;
  size_t unsent = uv_stream_get_write_queue_size((uv_stream_t *)&conn->tcp);
  if (conn->parse.active &&
      now - conn->parse.start_ns > (int64_t)o->request_timeout_ms * 1000000) {
    server_reject(server, KL__HTTP_LIMIT_REQUEST_TIMEOUT);
    conn_timeout(conn); /* 408 */
  } else if (unsent > 0 && now - conn->last_write_ns > idle_ns) {
    KL_LOG_D(o->component,
             "%s: reads nothing for %d ms with %zu bytes unsent; "
             "closing",
             conn->peer, o->idle_timeout_ms, unsent);
    server_reject(server, KL__HTTP_LIMIT_IDLE);
    conn_close(conn);
  } else if (!conn->parse.active && !conn->head && conn->writes == 0) {
    int64_t last = conn->last_read_ns > conn->last_write_ns
                       ? conn->last_read_ns
                       : conn->last_write_ns;
    if (now - last > idle_ns || server->stopping) {
      if (!server->stopping)
        server_reject(server, KL__HTTP_LIMIT_IDLE);
      conn_close(conn);
    }
  }
}

void kl__http_server_sweep(kl__http_server_t *server) {
  int64_t now = kl__mono_ns();
  for (kl__http_conn_t *conn = server->conns, *next; conn; conn = next) {
    next = conn->next;
    if (!conn->closing)
      sweep_conn(server, conn, now);
  }
}

/* ---- the server ---- */

static void listener_close(kl__http_server_t *server) {
  uv_handle_t *handle = (uv_handle_t *)&server->listener;
  if (server->listening && !uv_is_closing(handle))
    uv_close(handle, NULL);
}

kl_err_t kl__http_server_init(kl__http_server_t *server, uv_loop_t *loop,
                              const kl__http_opts_t *opts,
                              const kl__http_hooks_t *hooks, void *opaque,
                              const char *flag, const char *listen,
                              int backlog) {
  server->loop = loop;
  server->opts = *opts;
  server->hooks = *hooks;
  server->opaque = opaque;
  uv_tcp_init(loop, &server->listener);
  server->listener.data = server;
  server->listening = true;
  return kl__listen_start(&server->listener, flag, listen, backlog,
                          on_connection, &server->port);
}

void kl__http_server_drain(kl__http_server_t *server) {
  server->stopping = true;
  listener_close(server);
  kl__http_server_sweep(server); /* closes the idle ones now */
}

void kl__http_server_close(kl__http_server_t *server) {
  for (kl__http_conn_t *conn = server->conns; conn; conn = conn->next)
    conn_close(conn);
  listener_close(server);
}

/* "Bearer TOKEN", the scheme in any case (RFC 7235). */
bool kl__http_bearer_ok(const kl__http_conn_t *conn,
                        const kl__tokens_t *tokens) {
  const kl__http_parse_t *parse = &conn->parse;
  const char *a = parse->auth;
  size_t len = parse->auth_len;
  if (!tokens || parse->auth_long || len < 7 ||
      strncasecmp(a, "bearer ", 7) != 0)
    return false;
  a += 7;
  len -= 7;
  while (len && *a == ' ')
    a++, len--;
  while (len && (a[len - 1] == ' ' || a[len - 1] == '\t'))
    len--;
  return kl__tokens_check(tokens, a, len);
}
