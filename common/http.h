/*
 * keylane's one HTTP/1.1 server layer, under the publish gateway
 * (broker/gateway.c) and the worker's metrics server
 * (cli/metrics_server.c): connections, strict framing, limits, timeouts,
 * bearer tokens and responses. Its user says what each route answers
 * (kl__http_hooks_t); everything else is here, once.
 *
 * Parsing: http-parser 2.9, checked where it is lax (common/http.c says
 * where: header names, obs-fold, Transfer-Encoding, Host, the head's last
 * line end; common/http_chunked.c the chunked framing), so that a proxy in
 * front and this server read the same requests. A request that breaks
 * the framing gets 400 (505 for another HTTP version, 501 for a transfer
 * coding other than chunked) and the connection is closed after it.
 *
 * Limits, every size a client controls: connections (beyond it a canned
 * 503, or, with evict_idle, the oldest connection that waits for its
 * request is closed for the new one), the request line and headers (431),
 * the body (413), pipelined requests and unsent response bytes per
 * connection (past either the connection is not read until its client
 * reads), the request's time to arrive whole (408), idle connections and
 * a client that reads nothing (closed). Each refusal is counted through
 * hooks.reject.
 *
 * Pipelining: requests are answered in the order they came, whatever order
 * their answers are made in (a request may wait for Kafka).
 *
 * Lifetimes: a connection owns its FIFO of requests. A request whose user
 * says it is pending (hooks.pending) when its connection closes is
 * orphaned (conn = NULL): its user frees it with kl__http_req_answered();
 * a request being written is freed by its write callback, which libuv also
 * calls (with UV_ECANCELED) when the connection closes first.
 *
 * Caveats: everything here runs on the thread of the server's loop.
 */
#ifndef KEYLANE_COMMON_HTTP_H
#define KEYLANE_COMMON_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <http_parser.h>
#include <uv.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "common/token.h"
#include "keylane/event.h"
#include "keylane/error.h"

/** Bytes read from a socket per read callback: one buffer per server. */
#define KL__HTTP_READ_CHUNK (64 * 1024)

/** Which limit refused something (hooks.reject). */
typedef enum kl__http_limit {
  KL__HTTP_LIMIT_CONNECTIONS,
  KL__HTTP_LIMIT_HEADER,
  KL__HTTP_LIMIT_BODY,
  KL__HTTP_LIMIT_PIPELINE,
  KL__HTTP_LIMIT_OUTPUT,
  KL__HTTP_LIMIT_IDLE,
  KL__HTTP_LIMIT_REQUEST_TIMEOUT,
  KL__HTTP_LIMIT__COUNT
} kl__http_limit_t;

typedef struct kl__http_server kl__http_server_t;
typedef struct kl__http_conn kl__http_conn_t;
typedef struct kl__http_req kl__http_req_t;

/** One request, from its parsed head to its written response. A user's
 *  request struct starts with one (hooks.req_size is the whole). */
struct kl__http_req {
  kl__http_req_t *next;  /**< the connection's FIFO */
  kl__http_conn_t *conn; /**< NULL once the connection is gone */
  kl__http_server_t *server;
  uv_write_t write;
  int status; /**< 0 while the answer is not made */
  bool close; /**< answer with Connection: close, then close */
  char *out;  /**< the whole response once status != 0 */
  size_t out_len;
  int64_t start_ns; /**< first byte of the request, for its latency */
};

/** A chunked body's framing as RFC 9112 has it, checked beside
 * http-parser (http_chunked.c says why). */
typedef struct kl__http_chunked {
  uint8_t state;
  uint64_t size;   /**< the size being read, then the data bytes to come */
  size_t line;     /**< bytes of the chunk-size line so far */
  const char *why; /**< once malformed: how (a static string) */
} kl__http_chunked_t;

/** The request being parsed on a connection, and the headers keylane's
 *  servers read (a second one of a kind makes most of them invalid). */
typedef struct kl__http_parse {
  kl__strbuf_t url;
  char field[32]; /**< the header name being read */
  size_t field_len;
  bool in_value; /**< the last callback was a header value */
  int header;    /**< which of the headers below is being read */
  char auth[KL_TOKEN_MAX + 32];
  size_t auth_len;
  bool auth_long; /**< longer than any token, or given twice: no match */
  bool auth_seen;
  char ctype[64];
  size_t ctype_len;
  char accept[128]; /**< Accept, cut at its size */
  size_t accept_len;
  char origin[256]; /**< the Origin header, when there is one */
  size_t origin_len;
  bool origin_seen;
  bool origin_bad; /**< longer than the buffer, or given twice */
  char te[32];     /**< Transfer-Encoding, every header's value joined */
  size_t te_len;
  bool te_seen;
  bool te_long;
  char traceparent[128];  /**< W3C trace context headers, carried into */
  size_t traceparent_len; /**< every event of a publish (gateway_trace.c) */
  bool traceparent_bad;   /**< too long for the buffer, or given twice */
  char tracestate[KL_TRACESTATE_MAX + 1];
  size_t tracestate_len; /**< several headers joined by ',' (W3C) */
  bool tracestate_long;
  int hosts;      /**< Host headers: RFC 9112 wants one (HTTP/1.1) */
  char host[256]; /**< its value without whitespace, when it fits */
  size_t host_len;
  bool host_long; /**< longer than the buffer: host is not it */
  bool host_bad;  /**< a byte no host[:port] holds */
  bool host_ws;   /**< whitespace seen in it: only more may follow */
  bool head_end;  /**< headers_complete paused the parser there */
  bool chunked;   /**< the body is chunked: its framing is checked */
  kl__http_chunked_t framing;
  const char *mark;   /**< end of the last field or value callback, when
                           in the buffer being parsed */
  bool nl_after_mark; /**< a line ended after it, in an earlier buffer */
  bool expect_continue;
  size_t header_bytes;
  kl__strbuf_t body;
  size_t body_len;
  bool discard_body;   /**< the answer is known; count the body, keep none */
  kl__http_req_t *req; /**< made at headers complete */
  int64_t start_ns;    /**< first byte of the request */
  bool active;         /**< between message begin and complete */
} kl__http_parse_t;

struct kl__http_conn {
  uv_tcp_t tcp; /**< first, so a handle is its connection */
  kl__http_server_t *server;
  kl__http_conn_t *prev, *next; /**< the server's list, newest first */
  http_parser parser;
  kl__http_parse_t parse;
  kl__http_req_t *head, *tail; /**< requests whose response is not written */
  size_t queued;
  char *stash; /**< bytes read but not parsed while paused */
  size_t stash_len;
  size_t writes;      /**< uv_write calls not yet called back */
  bool in_parse;      /**< inside http_parser_execute() */
  const char *feed;   /**< the buffer being parsed, while in_parse */
  bool shutting_down; /**< uv_shutdown was called */
  bool reading;       /**< uv_read_start is on */
  bool paused;        /**< back-pressure: not reading, parser paused */
  bool eof;           /**< the client half-closed */
  bool close_after;   /**< close once the FIFO is written */
  bool closing;       /**< uv_close was called */
  int64_t last_read_ns;
  int64_t last_write_ns;
  char peer[64];
};

/** A server's limits. */
typedef struct kl__http_opts {
  const char *component; /**< for the log ("gateway") */
  size_t max_connections;
  /** Past max_connections, close the oldest connection that waits for its
   *  request (so idle clients cannot lock a probe out) and hold at most
   *  twice as many; else answer the new one busy_body with 503. */
  bool evict_idle;
  const char *busy_body;    /**< its body, JSON; NULL: close unanswered */
  int retry_after_s;        /**< its Retry-After */
  size_t max_header;        /**< request line and headers, bytes */
  size_t max_body;          /**< bytes */
  size_t max_pipeline;      /**< requests queued per connection */
  size_t max_output;        /**< unsent response bytes per connection */
  int idle_timeout_ms;      /**< no request, or nothing read of responses */
  int request_timeout_ms;   /**< a request's head and body, from its first
                                 byte */
  const char *timeout_hint; /**< the option a 408 names ("--request-timeout") */
  const char *header_hint;  /**< ... a 431 ("--max-header") */
  const char *body_hint;    /**< ... a 413 ("--max-body") */
  bool one_request;         /**< answer each with Connection: close */
} kl__http_opts_t;

/** What a server's user does; every hook runs on the loop thread. */
typedef struct kl__http_hooks {
  size_t req_size; /**< the user's request struct, kl__http_req_t first */
  /** A request's head was read: answer it now (kl__http_respond()) or
   *  after its body. */
  void (*head)(kl__http_conn_t *conn, kl__http_req_t *req, int method,
               const char *url, size_t url_len);
  /** Its body was read (not called when the head answered). */
  void (*body)(kl__http_conn_t *conn, kl__http_req_t *req, const char *body,
               size_t body_len);
  /** Makes the answer to a refused request (framing, limits):
   *  kl__http_respond() with @p msg in the server's format. */
  void (*error)(kl__http_req_t *req, int status, const char *msg);
  /** A response was made (for the user's metrics); may be NULL. */
  void (*responded)(kl__http_req_t *req);
  /** A connection was accepted; may be NULL. */
  void (*accepted)(void *opaque);
  /** A limit refused something; may be NULL. */
  void (*reject)(void *opaque, kl__http_limit_t limit);
  /** Whether @p req (not answered) waits for the user: orphaned rather
   *  than freed when its connection closes. May be NULL: never. */
  bool (*pending)(const kl__http_req_t *req);
  /** Frees what the user's part of @p req holds; may be NULL. */
  void (*release)(kl__http_req_t *req);
} kl__http_hooks_t;

struct kl__http_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  kl__http_opts_t opts;
  kl__http_hooks_t hooks;
  void *opaque; /**< the user's, for its hooks */
  kl__http_conn_t *conns;
  size_t nconns;
  size_t npaused; /**< connections held by back-pressure */
  bool listening;
  bool stopping; /**< draining: every answer says Connection: close */
  int port;
  char read_buf[KL__HTTP_READ_CHUNK];
};

/**
 * Sets up @p server on @p loop and listens on @p listen (common/listen.h).
 * @param flag  the option that gave @p listen, named in messages.
 * @returns KL_OK, or kl__listen_start()'s errors; on failure the caller
 *          still calls kl__http_server_close() and runs the loop.
 */
kl_err_t kl__http_server_init(kl__http_server_t *server, uv_loop_t *loop,
                              const kl__http_opts_t *opts,
                              const kl__http_hooks_t *hooks, void *opaque,
                              const char *flag, const char *listen,
                              int backlog);

/** Applies the timeouts: 408 for a request slower than
 *  request_timeout_ms, closes idle connections and clients that read
 *  nothing. Call it every second or so. */
void kl__http_server_sweep(kl__http_server_t *server);

/** Stops accepting; answers carry Connection: close; idle connections
 *  close now. */
void kl__http_server_drain(kl__http_server_t *server);

/** Closes every connection and the listener (their handles close on the
 *  loop's next turn). */
void kl__http_server_close(kl__http_server_t *server);

/**
 * Makes @p req's response: status line, Server, Date, Content-Type,
 * Content-Length, @p extra (whole header lines, may be NULL), Connection,
 * then @p body. Writing waits for the requests before it.
 */
void kl__http_respond(kl__http_req_t *req, int status, const char *ctype,
                      const char *extra, const char *body, size_t body_len);

/** Called when a request that waited (hooks.pending) got its answer:
 *  writes what it can, or frees it when its connection is gone. */
void kl__http_req_answered(kl__http_req_t *req);

/**
 * @returns whether the request being parsed carries "Authorization:
 *          Bearer T" with T one of @p tokens (compared in constant time,
 *          common/token.h); false when @p tokens is NULL.
 */
bool kl__http_bearer_ok(const kl__http_conn_t *conn,
                        const kl__tokens_t *tokens);

/** @returns a response's reason phrase ("Too Many Requests"). */
const char *kl__http_reason(int status);

/**
 * Decodes the percent-encoding of @p in (@p len bytes) into @p out, which
 * holds @p len bytes: "%XX" is the byte XX, anything else itself ('+'
 * too: a path's rule).
 * @returns the decoded length; -1 when a '%' is not followed by two hex
 *          digits.
 */
long kl__http_pct_decode(const char *in, size_t len, char *out);

/**
 * Finds parameter @p name in @p query ("a=1&b=2", without the '?').
 * @returns its value, still percent-encoded, with its length in *@p len;
 *          NULL when @p query has no such parameter.
 */
const char *kl__http_query(const char *query, const char *name, size_t *len);

/** RFC 9110's tchar: whether @p c may be in a token (a field name). */
bool kl__http_tchar(unsigned char c);

/* ---- http_chunked.c ---- */

/** Starts checking a chunked body, at its first byte. */
void kl__http_chunked_init(kl__http_chunked_t *c);
/**
 * Reads the next @p len bytes of the body, up to its end at most (bytes
 * after it belong to the next request: they are not looked at).
 * @returns 0, or -1 once the framing is malformed, c->why saying how;
 *          every later call returns -1 too.
 */
int kl__http_chunked_scan(kl__http_chunked_t *c, const char *buf, size_t len);
/** Whether the body's last CRLF was read. */
bool kl__http_chunked_done(const kl__http_chunked_t *c);

#endif
