/*
 * The publish gateway: HTTP/1.1 in, Kafka (acks=all) out.
 *
 * One libuv loop thread runs the HTTP server (http-parser 2.9 parses every
 * request) and the keylane producer; delivery reports wake the loop through
 * librdkafka's queue callback and a uv_async. A request is answered only
 * once Kafka acknowledged every event in it, or once it cannot be.
 *
 * Routes:
 * - POST /v1/topics/{topic}/events: a JSON body (one event object or an
 *   array of them) or an application/msgpack body of the same shape. Each
 *   event: "key" (string), "type" (string), optional "id" (string; a
 *   UUIDv7 is made when absent), "payload" (any value, stored as msgpack)
 *   or "payload_b64" (base64 of the raw payload bytes), optional "headers"
 *   (an object of strings), optional "not_before" (ms since the epoch)
 *   or "delay" (a duration such as "15m"): event/event_json.h. The whole
 *   body is validated before anything is produced, each not_before under
 *   the producer's timer.max.delay and each record's size too
 *   (kl__gw_batch_publishable()). 200
 *   [{"partition":P,"offset":O,"id":ID}, ...] in request order once every
 *   event is acknowledged; 400 {"error","index"} naming the first bad event
 *   (nothing produced); 401 without a valid bearer token when tokens are
 *   configured; 413 over --max-body; 429 with Retry-After when the
 *   in-flight budget cannot take the request; 503 with Retry-After and the
 *   events' ids when Kafka did not acknowledge every event within
 *   --produce-timeout.
 * - GET /v1/topics/{topic}/route?key=K: {"partition":P,"partitions":N}.
 * - GET /healthz: 200 when a Kafka broker answered within the last few
 *   seconds and the in-flight budget is not exhausted, else 503 with why.
 * - GET /metrics: Prometheus text.
 * /healthz and /metrics need no token, so that probes and scrapers work.
 *
 * Retrying is safe: a client that got a 503, or lost its connection before
 * the response, resends the same events WITH THE SAME ids (the 503 body
 * lists the ids the gateway made for events that had none). Some events may
 * then be in Kafka twice; the workers apply each id once, so nothing
 * downstream happens twice. A client that sends no ids and retries makes
 * new ids, so it must not retry blindly.
 *
 * Limits (memory is bounded by them whatever clients do; the CLI flag and
 * its default are in brackets; each is a gateway.* key of the conf table,
 * which `keylane config` lists; every limit has a metric):
 * - connections                [--max-connections, 1024]: beyond it a new
 *   connection gets 503 and is closed.
 * - request line plus headers  [--max-header, 16 KiB]: 431 and close.
 * - body                       [--max-body, 1 MiB]: 413 and close.
 * - in-flight events and bytes [--max-inflight 10000,
 *   --max-inflight-bytes 64 MiB]: events produced and not yet acknowledged;
 *   a request that does not fit gets 429 and Retry-After.
 * - pipelined requests per connection [--max-pipeline, 32] and unsent
 *   response bytes per connection [--max-output, 1 MiB]: past either the
 *   gateway stops reading that connection until its client reads, so a
 *   client that does not read holds only its own memory.
 * - idle connections [--idle-timeout, 30 s]: closed; a request whose head
 *   and body take longer than --request-timeout (30 s) gets 408; a client
 *   that reads nothing for --idle-timeout while responses wait is closed.
 * - topics [--max-topics, 1024]: distinct topics the gateway publishes to
 *   (each costs a librdkafka topic handle); another gets 403. Only topics
 *   that exist count: the gateway's producer does not create topics
 *   (allow.auto.create.topics=false unless -X says otherwise), so a name
 *   that does not exist is 404 and takes no place. Whether it exists is
 *   read from the metadata of every topic (one naming it would make the
 *   embedded cluster create it), on a topic's first request, at most once
 *   a second: a topic created since is served within a second. Dead-letter
 * topics
 *   ("<topic>.dlq") and internal ones ("__*") are 403 unless
 *   allow_internal_topics; with allow_topics, so is any other not listed.
 * Browsers (CSRF): a web page can make a browser send a "simple" cross-
 * origin POST without asking first, but only with a form or text
 * Content-Type, or none. The events route therefore takes only
 * application/json and application/msgpack (415 otherwise), and any
 * request carrying an Origin header not in allow_origins [--allow-origin,
 * none] gets 403.
 * Worst case memory is about max-connections * (max-header + max-body +
 * 64 KiB) + max-inflight-bytes, plus librdkafka's own buffers.
 *
 * Caveats:
 * - kl__gateway_run() runs the loop on the calling thread; everything
 *   else in the gateway runs there too. kl__gateway_stop() may be called
 *   from any thread or a signal handler.
 */
#ifndef KEYLANE_BROKER_GATEWAY_H
#define KEYLANE_BROKER_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/error.h"

typedef struct kl__gateway kl__gateway_t;

/** The gateway's limits and settings; kl__gateway_opts_default() fills it. */
typedef struct kl__gateway_opts {
  const char *listen;      /**< "ADDR:PORT" or "[V6]:PORT"; port 0 = any */
  const char *tokens_file; /**< one bearer token per line; NULL: no auth */
  size_t max_connections;
  size_t max_header;          /**< request line and headers, bytes */
  size_t max_body;            /**< bytes */
  int64_t max_inflight;       /**< events */
  int64_t max_inflight_bytes; /**< request bytes of unacknowledged events */
  size_t max_pipeline;        /**< requests queued per connection */
  size_t max_output;          /**< unsent response bytes per connection */
  int idle_timeout_ms;
  int request_timeout_ms;
  int produce_timeout_ms; /**< Kafka's acknowledgement, per event */
  int retry_after_s;      /**< the Retry-After of 429 and 503 */
  int drain_timeout_ms;   /**< how long a stop waits for acknowledgements */
  size_t max_topics;      /**< distinct topics served */
  /** A topic no request used for this long gives its place to a new one
   * once max_topics are served, so names a client made up do not hold
   * them until a restart. */
  int topic_idle_ms;
  /** Comma-separated origins ("https://app.example.com") whose browser
   * requests are served; a request with any other Origin header gets 403.
   * NULL or "": none, so no web page can publish through the gateway. */
  const char *allow_origins;
  /** Comma-separated topic names or fnmatch patterns ("orders-*") clients
   * may publish to and route on; NULL: any. A list without an entry ("",
   * ",") is refused by kl__gateway_new(), not read as "any". */
  const char *allow_topics;
  /** Also dead-letter topics ("<topic>.dlq") and Kafka's internal ones
   * ("__*"), refused (403) otherwise. */
  bool allow_internal_topics;
  /** When not NULL, the loop stops once *stop_flag is nonzero (checked
   * every 100 ms), so a CLI can stop it from a plain signal handler. */
  const volatile int *stop_flag;
} kl__gateway_opts_t;

/**
 * Fills @p opts from the gateway.* keys of @p conf (common/conf.c's table,
 * where their defaults are; `keylane config` lists them). Its strings are
 * @p conf's: valid until a key is set again or the conf destroyed.
 * stop_flag is NULL.
 */
void kl__gateway_opts_from_conf(kl__gateway_opts_t *opts,
                                const kl_conf_t *conf);

/** kl__gateway_opts_from_conf() of the defaults. */
void kl__gateway_opts_default(kl__gateway_opts_t *opts);

/**
 * Creates the gateway: reads the tokens file, creates the producer from
 * @p conf (borrowed; "kafka.bootstrap.servers" is required; unless given,
 * kafka.message.timeout.ms is produce_timeout_ms and kafka.linger.ms is 2,
 * since every request waits for its acknowledgement) and binds
 * the listening socket, so the port is known when this returns.
 *
 * @param opts  copied; its strings must stay valid until destroy.
 * @returns KL_OK and *out; KL_ECONF for a bad option; KL_EIO when the
 *          address cannot be bound; the producer's errors. The detail names
 *          the problem.
 */
kl_err_t kl__gateway_new(const kl_conf_t *conf, const kl__gateway_opts_t *opts,
                         kl__gateway_t **out);

/** @returns the port the gateway listens on. */
int kl__gateway_port(const kl__gateway_t *gateway);

/**
 * Serves until kl__gateway_stop() or the stop flag; then stops accepting,
 * answers what is in flight (up to drain_timeout_ms), closes every
 * connection and returns KL_OK.
 */
kl_err_t kl__gateway_run(kl__gateway_t *gateway);

/** Asks kl__gateway_run() to drain and return. Any thread; signal safe. */
void kl__gateway_stop(kl__gateway_t *gateway);

/** Frees @p gateway (after kl__gateway_run() returned); accepts NULL. */
void kl__gateway_destroy(kl__gateway_t *gateway);

#endif
