/*
 * The gateway's parts and what they share. Not installed.
 *
 * gateway.c        the loop, Kafka wake-ups, the health probe, stopping
 * gateway_http.c   the gateway on common/http.h (connections, framing,
 *                  limits, timeouts, responses): its hooks and limits
 * gateway_routes.c what each route answers, the publish path included
 * gateway_body.c   a request body (JSON or msgpack) to a batch of events,
 *                  its JSON document in the gateway's arena
 *
 * Everything here runs on the loop thread.
 *
 * Lifetimes (common/http.h): a request waiting for Kafka when its
 * connection closes is orphaned (http.conn = NULL) and freed by its last
 * delivery report, through kl__http_req_answered().
 */
#ifndef KEYLANE_BROKER_GATEWAY_INTERNAL_H
#define KEYLANE_BROKER_GATEWAY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>
#include <uv.h>

#include "event/event_json.h"
#include "broker/gateway.h"
#include "common/http.h"
#include "common/metrics.h"
#include "common/strbuf.h"
#include "common/token.h"
#include "keylane/event.h"
#include "keylane/producer.h"

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

typedef struct kl__gw_req kl__gw_req_t;

/** Where a request's JSON document lives (gateway_body.c): bump-allocated
 * chunks, rewound when the request's events are produced. */
typedef struct kl__gw_arena {
  struct kl__gw_chunk *chunks; /**< newest first; the last is kept */
  char *p, *end;               /**< the newest chunk's free bytes */
  int depth;                   /**< kl__gw_arena_begin()s not ended */
} kl__gw_arena_t;

/** One event of a publish request, and its delivery. */
typedef struct kl__gw_slot {
  kl__gw_req_t *req;
  const char *id; /**< the event's id (the client's, or one the gateway
                   made), in its request's ids */
  int32_t partition;
  int64_t offset;
} kl__gw_slot_t;

/** One request, from its parsed head to its written response. */
struct kl__gw_req {
  kl__http_req_t http; /**< first: status 0 while waiting for Kafka */
  kl__gateway_t *gw;
  kl__gw_route_t route;
  /* publish */
  char topic[KL_GW_TOPIC_MAX + 1];
  kl__gw_slot_t *slots;
  char *ids; /**< every slot's id, NUL-terminated, one after the other */
  size_t nslots;
  size_t outstanding;  /**< deliveries to come (+1 while producing) */
  size_t failed;       /**< events Kafka did not acknowledge */
  int64_t bytes;       /**< counted in the in-flight byte budget */
  int64_t produced_ns; /**< when the events were handed to the producer */
  kl_err_t kafka_err;  /**< the first failure */
  char kafka_errmsg[512];
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
  kl__series_t *delivery;     /**< delivery latency histogram */
  kl__series_t *produced;     /**< events acknowledged */
  kl__series_t *failed;       /**< events not acknowledged */
  kl__metric_t *kafka_errors; /**< error */
  kl__metric_t *rejected;     /**< limit */
  kl__metric_t *limits;       /**< limit: the configured value */
  kl__series_t *accepted;     /**< connections accepted */
} kl__gw_metrics_t;

struct kl__gateway {
  uv_loop_t loop;
  kl__http_server_t http; /**< the connections, on loop */
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
  int64_t inflight_events;
  int64_t inflight_bytes;
  /** The clock read once for the delivery reports of one poll; 0 outside. */
  int64_t serving_ns;
  kl__gw_arena_t arena;
  bool stopping;
  int64_t stop_ns;
};

/* ---- gateway.c ---- */

/** @returns whether a Kafka broker answered recently; *why when not. */
bool kl__gw_kafka_up(kl__gateway_t *gw, const char **why);

/* ---- gateway_http.c ---- */

/** Sets up the gateway's HTTP server (its limits from gw->opts) on gw->loop
 *  and listens. */
kl_err_t kl__gw_http_init(kl__gateway_t *gw);
/** The gateway a connection belongs to. */
kl__gateway_t *kl__gw_http_gateway(const kl__http_conn_t *conn);
/** kl__http_respond() of @p req. */
void kl__gw_respond(kl__gw_req_t *req, int status, const char *ctype,
                    const char *extra, const char *body, size_t body_len);
/** kl__gw_respond() with {"error": @p msg} as JSON, printf-style. */
void kl__gw_respond_error(kl__gw_req_t *req, int status, const char *extra,
                          const char *fmt, ...) KL__PRINTF(4, 5);

/* ---- gateway_body.c ---- */

/** Until the matching kl__gw_arena_end(), jansson's allocations on this
 * thread come from @p arena and its frees of them cost nothing; outside
 * one, jansson allocates as it did before (the hook is installed for the
 * process by the first call). Nests. */
void kl__gw_arena_begin(kl__gw_arena_t *arena);
/** Ends kl__gw_arena_begin(); the outermost end rewinds the arena: no
 * JSON value made in it may be used after that. */
void kl__gw_arena_end(kl__gw_arena_t *arena);
void kl__gw_arena_destroy(kl__gw_arena_t *arena);
/** A kl__alloc_fn_t: @p size bytes of the arena @p ctx, or NULL. */
void *kl__gw_arena_alloc(void *ctx, size_t size);

/** A decoded publish body: its JSON document (a JSON body's) and the
 * events borrowing it, or borrowing the body (a msgpack body's). */
typedef struct kl__gw_batch {
  json_t *doc;
  kl__jevent_t *events;
  size_t n;
  /** Where the events, their payloads and headers live when decoded in
   * kl__gw_arena_begin(), or in own; NULL: malloc()ed, the events' own. */
  kl__gw_arena_t *arena;
  /** A msgpack body's arena outside kl__gw_arena_begin(). */
  kl__gw_arena_t own;
  /** The events' size as librdkafka holds them (keys and envelopes), set
   * by kl__gw_batch_publishable(): a body can stand for more than its own
   * bytes (a 2-byte msgpack bin in a payload is stored as a 10-byte map). */
  size_t stored;
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
/**
 * Checks every event as kl_publish() will beyond the envelope's rules
 * (kl__producer_event_check(): its not_before under @p producer's
 * timer.max.delay, its size as one Kafka record), so that no request is
 * refused halfway through publishing it.
 * @returns 0, or 400 with @p bad naming the first bad event's index.
 */
int kl__gw_batch_publishable(kl__gw_batch_t *batch,
                             const kl_producer_t *producer, kl__gw_bad_t *bad);
void kl__gw_batch_free(kl__gw_batch_t *batch);

/* ---- gateway_trace.c ---- */

/**
 * Carries the request's traceparent and tracestate headers (@p parse) into
 * every event of @p batch that has no traceparent of its own.
 * @returns 0, or the HTTP status with @p bad filled: 400 for a malformed
 *          header, naming it and the format; 503 out of memory.
 */
int kl__gw_batch_trace(kl__gw_batch_t *batch, const kl__http_parse_t *parse,
                       kl__gw_bad_t *bad);

/* ---- gateway_policy.c ---- */

/** Checks the --allow-origin list; KL_ECONF naming a malformed entry. */
kl_err_t kl__gw_origins_check(const char *list);
/** @returns whether the request being parsed may be served: it has no
 * Origin header, or one on the allow list. */
bool kl__gw_origin_ok(const kl__http_conn_t *conn);
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
void kl__gw_route_head(kl__http_conn_t *conn, kl__gw_req_t *req, int method,
                       const char *url, size_t url_len);
/** Answers (or starts answering) a request whose body is complete. */
void kl__gw_route_body(kl__http_conn_t *conn, kl__gw_req_t *req,
                       const char *body, size_t body_len);
/** Registers the gateway's metrics. */
kl_err_t kl__gw_metrics_init(kl__gateway_t *gw);
/** Counts a refusal by @p limit. */
void kl__gw_reject(kl__gateway_t *gw, kl__gw_limit_t limit);
/** The delivery callback for the gateway's producer. */
void kl__gw_on_delivery(void *opaque, const kl_delivery_t *delivery);

#endif
