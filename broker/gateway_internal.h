/*
 * The gateway's parts and what they share. Not installed.
 *
 * gateway.c        the loop, the listener, connection lifetimes, timeouts,
 *                  Kafka wake-ups and the health probe
 * gateway_http.c   one connection: http-parser callbacks, the request FIFO
 *                  that keeps pipelined responses in order, writes and
 *                  back-pressure
 * gateway_routes.c what each route answers, the publish path included
 * gateway_body.c   a request body (JSON or msgpack) to a batch of events
 * gateway_chunked.c  RFC 9112's chunked framing, checked beside http-parser
 *
 * Everything here runs on the loop thread.
 *
 * Lifetimes: a connection owns its FIFO of requests. A request waiting for
 * Kafka when its connection closes is orphaned (conn = NULL) and freed by
 * its last delivery report; a request whose response is being written is
 * freed by its write callback, which libuv also calls (with UV_ECANCELED)
 * when the connection closes first.
 */
#ifndef KEYLANE_BROKER_GATEWAY_INTERNAL_H
#define KEYLANE_BROKER_GATEWAY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <http_parser.h>
#include <librdkafka/rdkafka.h>
#include <uv.h>

#include "event/event_json.h"
#include "broker/gateway.h"
#include "common/metrics.h"
#include "common/strbuf.h"
#include "common/token.h"
#include "keylane/event.h"
#include "keylane/producer.h"

/** Bytes read from a socket per read callback: one buffer for the loop. */
#define KL_GW_READ_CHUNK (64 * 1024)
/** Kafka's longest topic name. */
#define KL_GW_TOPIC_MAX 249

typedef enum kl_gw_route {
  KL_GW_ROUTE_EVENTS,
  KL_GW_ROUTE_ROUTE,
  KL_GW_ROUTE_HEALTHZ,
  KL_GW_ROUTE_METRICS,
  KL_GW_ROUTE_OTHER, /**< 404s, and errors before a route is known */
  KL_GW_ROUTE__COUNT
} kl__gw_route_t;

/** Which limit refused something, for keylane_gateway_rejected_total. */
typedef enum kl_gw_limit {
  KL_GW_LIMIT_CONNECTIONS,
  KL_GW_LIMIT_HEADER,
  KL_GW_LIMIT_BODY,
  KL_GW_LIMIT_INFLIGHT,
  KL_GW_LIMIT_PIPELINE,
  KL_GW_LIMIT_OUTPUT,
  KL_GW_LIMIT_IDLE,
  KL_GW_LIMIT_REQUEST_TIMEOUT,
  KL_GW_LIMIT__COUNT
} kl__gw_limit_t;

typedef struct kl__gw_conn kl__gw_conn_t;
typedef struct kl__gw_req kl__gw_req_t;

/** One event of a publish request, and its delivery. */
typedef struct kl__gw_slot {
  kl__gw_req_t *req;
  char *id; /**< the event's id (the client's, or one the gateway made) */
  int32_t partition;
  int64_t offset;
} kl__gw_slot_t;

/** One request, from its parsed head to its written response. */
struct kl__gw_req {
  kl__gw_req_t *next;  /**< the connection's FIFO */
  kl__gw_conn_t *conn; /**< NULL once the connection is gone */
  kl__gateway_t *gw;
  uv_write_t write;
  kl__gw_route_t route;
  int status; /**< 0 while waiting for Kafka */
  bool close; /**< answer with Connection: close, then close */
  char *out;  /**< the whole response once status != 0 */
  size_t out_len;
  int64_t start_ns; /**< head parsed, for the request latency */
  /* publish */
  char topic[KL_GW_TOPIC_MAX + 1];
  kl__gw_slot_t *slots;
  size_t nslots;
  size_t outstanding;  /**< deliveries to come (+1 while producing) */
  size_t failed;       /**< events Kafka did not acknowledge */
  int64_t bytes;       /**< counted in the in-flight byte budget */
  int64_t produced_ns; /**< when the events were handed to the producer */
  kl_err_t kafka_err;  /**< the first failure */
  char kafka_errmsg[512];
};

/** A chunked body's framing as RFC 9112 has it, checked beside
 * http-parser (gateway_chunked.c says why). */
typedef struct kl__gw_chunked {
  uint8_t state;
  uint64_t size;   /**< the size being read, then the data bytes to come */
  size_t line;     /**< bytes of the chunk-size line so far */
  const char *why; /**< once malformed: how (a static string) */
} kl__gw_chunked_t;

/** The request being parsed on a connection. */
typedef struct kl__gw_parse {
  kl__strbuf_t url;
  char field[32]; /**< the header name being read, lowercased */
  size_t field_len;
  bool in_value; /**< the last callback was a header value */
  int header;    /**< which of the headers below is being read */
  char auth[KL_TOKEN_MAX + 32];
  size_t auth_len;
  bool auth_long; /**< longer than any token, or given twice: no match */
  bool auth_seen;
  char ctype[64];
  size_t ctype_len;
  char origin[256]; /**< the Origin header, when there is one */
  size_t origin_len;
  bool origin_seen;
  bool origin_bad; /**< longer than the buffer, or given twice */
  char te[32];     /**< Transfer-Encoding, every header's value joined */
  size_t te_len;
  bool te_seen;
  bool te_long;
  char traceparent[128];  /**< W3C trace context headers, carried into */
  size_t traceparent_len; /**< every event of the request (gateway_trace.c) */
  bool traceparent_bad;   /**< too long for the buffer, or given twice */
  char tracestate[KL_TRACESTATE_MAX + 1];
  size_t tracestate_len; /**< several headers joined by ',' (W3C) */
  bool tracestate_long;
  int hosts;     /**< Host headers: RFC 9112 wants one (HTTP/1.1) */
  bool host_bad; /**< a byte no host[:port] holds */
  bool host_ws;  /**< whitespace seen in it: only more may follow */
  bool head_end; /**< headers_complete paused the parser there */
  bool chunked;  /**< the body is chunked: its framing is checked */
  kl__gw_chunked_t framing;
  const char *mark;   /**< end of the last field or value callback, when
                           in the buffer being parsed */
  bool nl_after_mark; /**< a line ended after it, in an earlier buffer */
  bool expect_continue;
  size_t header_bytes;
  kl__strbuf_t body;
  size_t body_len;
  bool discard_body; /**< the answer is known; count the body, keep none */
  kl__gw_req_t *req; /**< made at headers complete */
  int64_t start_ns;  /**< first byte of the request */
  bool active;       /**< between message begin and complete */
} kl__gw_parse_t;

struct kl__gw_conn {
  uv_tcp_t tcp; /**< first, so a handle is its connection */
  kl__gateway_t *gw;
  kl__gw_conn_t *prev, *next; /**< the gateway's list */
  http_parser parser;
  kl__gw_parse_t parse;
  kl__gw_req_t *head, *tail; /**< requests whose response is not written */
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

/** A topic the gateway serves: its name, and when a request last used it. */
typedef struct kl__gw_topic {
  char *name;
  int64_t used_ns;
} kl__gw_topic_t;

/** The gateway's metrics. */
typedef struct kl__gw_metrics {
  kl__metrics_t *registry;
  kl__metric_t *requests;     /**< route, code */
  kl__metric_t *latency;      /**< request latency histogram, by route */
  kl__metric_t *delivery;     /**< delivery latency histogram */
  kl__series_t *produced;     /**< events acknowledged */
  kl__series_t *failed;       /**< events not acknowledged */
  kl__metric_t *kafka_errors; /**< error */
  kl__metric_t *rejected;     /**< limit */
  kl__metric_t *limits;       /**< limit: the configured value */
  kl__series_t *accepted;     /**< connections accepted */
} kl__gw_metrics_t;

struct kl__gateway {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop_async;
  uv_async_t kafka_async;        /**< librdkafka says a delivery report waits */
  uv_timer_t tick;               /**< 100 ms: stop flag, Kafka poll fallback */
  uv_timer_t sweep;              /**< 1 s: timeouts */
  uv_work_t probe;               /**< Kafka reachability, on the thread pool */
  rd_kafka_queue_t *kafka_queue; /**< the main queue, for its wake-ups */
  bool loop_ok;                  /**< the loop and its handles exist */
  bool ran;
  bool probing;
  bool probe_ok;
  kl_err_t probe_result; /**< written by the pool thread, as is: */
  char probe_detail[200];
  int probe_brokers;
  int64_t probe_ok_ns; /**< last time a broker answered */
  char probe_err[256];
  kl__gateway_opts_t opts;
  kl_producer_t *producer;
  kl__tokens_t *tokens;
  kl__gw_metrics_t m;
  kl__gw_topic_t *topics; /**< topics whose count was read, <= max_topics */
  size_t ntopics, topics_cap;
  /** Every topic of the cluster, read at kafka_topics_ns: whether a topic
   *  not served yet exists (gateway_routes.c, topic_exists()). */
  const struct rd_kafka_metadata *kafka_topics;
  int64_t kafka_topics_ns;
  kl__gw_conn_t *conns;
  size_t nconns;
  size_t npaused;
  int64_t inflight_events;
  int64_t inflight_bytes;
  bool listening;
  bool stopping;
  int64_t stop_ns;
  int port;
  char read_buf[KL_GW_READ_CHUNK];
};

/* ---- gateway.c ---- */

/** Closes @p conn now; its waiting requests are orphaned. */
void kl__gw_conn_close(kl__gw_conn_t *conn);
/** Counts a refusal by @p limit. */
void kl__gw_reject(kl__gateway_t *gw, kl__gw_limit_t limit);
/** @returns whether a Kafka broker answered recently; *why when not. */
bool kl__gw_kafka_up(kl__gateway_t *gw, const char **why);

/* ---- gateway_http.c ---- */

/** Sets up @p conn's parser and starts reading. */
void kl__gw_conn_start(kl__gw_conn_t *conn);
/** Answers the request being read with 408 and closes after it. */
void kl__gw_conn_timeout(kl__gw_conn_t *conn);
/** Frees what @p conn holds before it is closed; orphans waiting requests. */
void kl__gw_conn_release(kl__gw_conn_t *conn);
/** Writes the answered requests at the head of the FIFO, in order. */
void kl__gw_conn_flush(kl__gw_conn_t *conn);
/** Frees a request that is in no FIFO and has no write in flight. */
void kl__gw_req_free(kl__gw_req_t *req);
/**
 * Makes @p req's response: status line, the standard headers, @p extra
 * (whole header lines, may be NULL) and @p body.
 */
void kl__gw_respond(kl__gw_req_t *req, int status, const char *ctype,
                    const char *extra, const char *body, size_t body_len);
/** kl__gw_respond() with {"error": @p msg} as JSON, printf-style. */
void kl__gw_respond_error(kl__gw_req_t *req, int status, const char *extra,
                          const char *fmt, ...) KL__PRINTF(4, 5);
/** Called when a waiting request got its answer: writes what it can. */
void kl__gw_req_answered(kl__gw_req_t *req);
/** RFC 9110's tchar: whether @p c may be in a token (a field name). */
bool kl__gw_tchar(unsigned char c);

/* ---- gateway_chunked.c ---- */

/** Starts checking a chunked body, at its first byte. */
void kl__gw_chunked_init(kl__gw_chunked_t *c);
/**
 * Reads the next @p len bytes of the body, up to its end at most (bytes
 * after it belong to the next request: they are not looked at).
 * @returns 0, or -1 once the framing is malformed, c->why saying how;
 *          every later call returns -1 too.
 */
int kl__gw_chunked_scan(kl__gw_chunked_t *c, const char *buf, size_t len);
/** Whether the body's last CRLF was read. */
bool kl__gw_chunked_done(const kl__gw_chunked_t *c);

/* ---- gateway_body.c ---- */

/** A decoded publish body: its JSON document and the events borrowing it. */
typedef struct kl__gw_batch {
  json_t *doc;
  kl__jevent_t *events;
  size_t n;
} kl__gw_batch_t;

/** Why a body was refused: the HTTP status, the event index (-1: the body
 * as a whole) and the message. */
typedef struct kl__gw_bad {
  int status;
  long index;
  char msg[512];
} kl__gw_bad_t;

/**
 * Decodes and validates every event of @p body (@p ctype picks JSON or
 * msgpack).
 * @returns 0 and @p batch (freed with kl__gw_batch_free), or the status to
 *          answer (400, 413, 415, 503) with @p bad filled in.
 */
/** Fills @p bad; @returns @p status. */
int kl__gw_bad(kl__gw_bad_t *bad, int status, long index, const char *fmt, ...)
    KL__PRINTF(4, 5);
int kl__gw_batch_decode(kl__gw_batch_t *batch, const char *ctype,
                        const char *body, size_t len, size_t max_events,
                        kl__gw_bad_t *bad);
void kl__gw_batch_free(kl__gw_batch_t *batch);

/* ---- gateway_trace.c ---- */

/**
 * Carries the request's traceparent and tracestate headers (@p parse) into
 * every event of @p batch that has no traceparent of its own.
 * @returns 0, or the HTTP status with @p bad filled: 400 for a malformed
 *          header, naming it and the format; 503 out of memory.
 */
int kl__gw_batch_trace(kl__gw_batch_t *batch, const kl__gw_parse_t *parse,
                       kl__gw_bad_t *bad);

/* ---- gateway_policy.c ---- */

/** Checks the --allow-origin list; KL_ECONF naming a malformed entry. */
kl_err_t kl__gw_origins_check(const char *list);
/** @returns whether the request being parsed may be served: it has no
 * Origin header, or one on the allow list. */
bool kl__gw_origin_ok(const kl__gw_conn_t *conn);
/** @returns whether @p ctype (the Content-Type, parameters and all) is one
 * the events route takes: JSON or msgpack. */
bool kl__gw_ctype_ok(const char *ctype);
/** @returns 1 for msgpack, 0 for JSON, -1 for any other media type. */
int kl__gw_ctype_msgpack(const char *ctype);
/** Checks the --allow-topics list; KL_ECONF naming a malformed entry. */
kl_err_t kl__gw_topics_check(const char *list);
/** @returns whether clients may use @p topic; when not, @p why (@p size
 * bytes) says why and how to allow it. */
bool kl__gw_topic_allowed(const kl__gateway_opts_t *o, const char *topic,
                          char *why, size_t size);

/* ---- gateway_routes.c ---- */

/** Picks the route of a parsed head; may answer at once (404, 405, 401). */
void kl__gw_route_head(kl__gw_conn_t *conn, kl__gw_req_t *req, int method,
                       const char *url, size_t url_len);
/** Answers (or starts answering) a request whose body is complete. */
void kl__gw_route_body(kl__gw_conn_t *conn, kl__gw_req_t *req, const char *body,
                       size_t body_len);
/** Registers the gateway's metrics. */
kl_err_t kl__gw_metrics_init(kl__gateway_t *gw);
/** The delivery callback for the gateway's producer. */
void kl__gw_on_delivery(void *opaque, const kl_delivery_t *delivery);
/** @returns a response's reason phrase ("Too Many Requests"). */
const char *kl__gw_reason(int status);

#endif
