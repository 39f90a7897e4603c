/*
 * The gateway's loop: its HTTP server (common/http.h, gateway_http.c),
 * Kafka wake-ups, the Kafka health probe, and stopping.
 *
 * Delivery reports: librdkafka's main queue (where a producer's delivery
 * reports wait for rd_kafka_poll) calls back on one of its threads when a
 * report lands in an empty queue; that callback only does uv_async_send(),
 * which is thread safe, and the loop thread then serves every waiting
 * report with kl_producer_poll(). A 100 ms tick polls as well, as a floor.
 *
 * Health: a metadata request (rd_kafka_metadata, thread safe) runs on the
 * libuv thread pool every second; /healthz calls Kafka reachable while one
 * succeeded in the last KL_GW_PROBE_FRESH_MS.
 *
 * Stopping: stop listening; answer the requests in flight (each answer now
 * says Connection: close) until none waits for Kafka or drain_timeout_ms
 * passed; close every connection; close the loop's handles; return.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "broker/gateway_internal.h"
#include "broker/producer_internal.h"
#include "common/internal.h"
#include "common/kafka.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/units.h"

#define KL_GW_TICK_MS 100
#define KL_GW_SWEEP_MS 1000
#define KL_GW_PROBE_TIMEOUT_MS 1000
#define KL_GW_PROBE_FRESH_MS 3000
#define KL_GW_LINGER_MS "0.5"

/* A string key; "" is NULL, the option's "none". */
static const char *opt_text(const kl_conf_t *conf, const char *key) {
  const char *v = kl_conf_get(conf, key);
  return v && *v ? v : NULL;
}

void kl__gateway_opts_from_conf(kl__gateway_opts_t *o, const kl_conf_t *conf) {
  memset(o, 0, sizeof(*o));
  o->listen = kl_conf_get(conf, "gateway.listen");
  o->tokens_file = opt_text(conf, "gateway.tokens.file");
  o->max_connections = (size_t)kl__conf_int(conf, "gateway.max.connections");
  o->max_header = (size_t)kl__conf_int(conf, "gateway.max.header");
  o->max_body = (size_t)kl__conf_int(conf, "gateway.max.body");
  o->max_inflight = kl__conf_int(conf, "gateway.max.inflight");
  o->max_inflight_bytes = kl__conf_int(conf, "gateway.max.inflight.bytes");
  o->max_pipeline = (size_t)kl__conf_int(conf, "gateway.max.pipeline");
  o->max_output = (size_t)kl__conf_int(conf, "gateway.max.output");
  o->idle_timeout_ms = (int)kl__conf_int(conf, "gateway.idle.timeout");
  o->request_timeout_ms = (int)kl__conf_int(conf, "gateway.request.timeout");
  o->produce_timeout_ms = (int)kl__conf_int(conf, "gateway.produce.timeout");
  o->retry_after_s =
      (int)((kl__conf_int(conf, "gateway.retry.after") + 999) / 1000);
  o->drain_timeout_ms = (int)kl__conf_int(conf, "gateway.drain.timeout");
  o->max_topics = (size_t)kl__conf_int(conf, "gateway.max.topics");
  o->topic_idle_ms = (int)kl__conf_int(conf, "gateway.topic.idle");
  o->allow_origins = opt_text(conf, "gateway.allow.origins");
  o->allow_topics = kl_conf_get(conf, "gateway.allow.topics");
  o->allow_internal_topics =
      strcmp(kl_conf_get(conf, "gateway.allow.internal.topics"), "true") == 0;
}

void kl__gateway_opts_default(kl__gateway_opts_t *opts) {
  kl__gateway_opts_from_conf(opts, NULL);
}

/* Everything checkable before anything starts, so a typo costs no
 * connection attempts. */
static kl_err_t opts_check(const kl__gateway_opts_t *o) {
  struct sockaddr_storage addr;
  kl_err_t err = kl__listen_addr("--listen", o->listen, &addr);
  if (!err && o->allow_origins)
    err = kl__gw_origins_check(o->allow_origins);
  if (!err && o->allow_topics)
    err = kl__gw_topics_check(o->allow_topics);
  if (err)
    return err;
  if (o->max_connections < 1 || o->max_header < 256 || o->max_body < 1 ||
      o->max_inflight < 1 || o->max_pipeline < 1 || o->max_output < 1 ||
      o->max_topics < 1)
    return kl__err(KL_ECONF, "gateway limits must be positive (the head "
                             "limit at least 256 bytes)");
  if (o->max_inflight_bytes < (int64_t)o->max_body)
    return kl__err(KL_ECONF,
                   "--max-inflight-bytes (%lld) is below --max-body "
                   "(%zu): a full-size request could never be "
                   "taken; raise it or lower --max-body",
                   (long long)o->max_inflight_bytes, o->max_body);
  if (o->idle_timeout_ms < 1 || o->request_timeout_ms < 1 ||
      o->produce_timeout_ms < 1 || o->retry_after_s < 0 ||
      o->topic_idle_ms < 0 || o->drain_timeout_ms < 0)
    return kl__err(KL_ECONF, "gateway timeouts must be positive");
  return KL_OK;
}

/* ---- Kafka ---- */

static void kafka_serve(kl__gateway_t *gw) {
  /* One clock reading for the reports of this poll (their delivery
   * latency), not one per event. */
  gw->serving_ns = kl__mono_ns();
  /* Bounded, so that a flood of reports cannot starve the sockets. */
  for (int i = 0; i < 64 && kl_producer_poll(gw->producer, 0) > 0; i++)
    ;
  gw->serving_ns = 0;
}

static void on_kafka_async(uv_async_t *async) {
  kafka_serve(async->data);
}

/* On a librdkafka thread: nothing but the wake-up. */
static void on_kafka_event(rd_kafka_t *rk, void *opaque) {
  (void)rk;
  kl__gateway_t *gw = opaque;
  uv_async_send(&gw->kafka_async);
}

static void probe_work(uv_work_t *work) {
  kl__gateway_t *gw = work->data;
  const struct rd_kafka_metadata *md = NULL;
  kl_err_t err = kl__kafka_metadata(kl__producer_rk(gw->producer), NULL,
                                    KL_GW_PROBE_TIMEOUT_MS, &md);
  gw->probe_result = err;
  snprintf(gw->probe_detail, sizeof(gw->probe_detail), "%s",
           err ? kl_err_detail() : "no brokers in the answer");
  if (!err) {
    gw->probe_brokers = md->broker_cnt;
    rd_kafka_metadata_destroy(md);
  }
}

static void probe_done(uv_work_t *work, int status) {
  kl__gateway_t *gw = work->data;
  gw->probing = false;
  bool ok = status == 0 && gw->probe_result == 0 && gw->probe_brokers > 0;
  if (ok)
    gw->probe_ok_ns = kl__mono_ns();
  else
    snprintf(gw->probe_err, sizeof(gw->probe_err),
             "no Kafka broker answered a metadata request: %s",
             gw->probe_detail);
  if (ok != gw->probe_ok)
    KL_LOG_I("gateway", "Kafka is %s", ok ? "reachable" : gw->probe_err);
  gw->probe_ok = ok;
}

static void probe_start(kl__gateway_t *gw) {
  if (gw->probing || gw->stopping)
    return;
  gw->probe.data = gw;
  if (uv_queue_work(&gw->loop, &gw->probe, probe_work, probe_done) == 0)
    gw->probing = true;
}

bool kl__gw_kafka_up(kl__gateway_t *gw, const char **why) {
  int64_t age = kl__mono_ns() - gw->probe_ok_ns;
  if (gw->probe_ok_ns && age <= (int64_t)KL_GW_PROBE_FRESH_MS * 1000000)
    return true;
  *why = gw->probe_err[0] ? gw->probe_err : "no Kafka broker has answered yet";
  return false;
}

/* ---- stopping ---- */

static void close_handle(uv_handle_t *handle) {
  if (!uv_is_closing(handle))
    uv_close(handle, NULL);
}

static void close_all(kl__gateway_t *gw) {
  kl__http_server_close(&gw->http);
  if (gw->kafka_queue) {
    rd_kafka_queue_cb_event_enable(gw->kafka_queue, NULL, NULL);
    rd_kafka_queue_destroy(gw->kafka_queue);
    gw->kafka_queue = NULL;
  }
  close_handle((uv_handle_t *)&gw->stop_async);
  close_handle((uv_handle_t *)&gw->kafka_async);
  close_handle((uv_handle_t *)&gw->tick);
  close_handle((uv_handle_t *)&gw->sweep);
}

static void begin_stop(kl__gateway_t *gw) {
  if (gw->stopping)
    return;
  gw->stopping = true;
  gw->stop_ns = kl__mono_ns();
  KL_LOG_I("gateway", "stopping: %lld events wait for Kafka, %zu connections",
           (long long)gw->inflight_events, gw->http.nconns);
  kl__http_server_drain(&gw->http); /* closes the idle ones now */
}

static void on_stop(uv_async_t *async) {
  begin_stop(async->data);
}

static void on_tick(uv_timer_t *timer) {
  kl__gateway_t *gw = timer->data;
  if (gw->opts.stop_flag && *gw->opts.stop_flag)
    begin_stop(gw);
  if (gw->inflight_events > 0)
    kafka_serve(gw);
  if (!gw->stopping)
    return;
  /* Answered connections close after their Connection: close answer and
   * idle ones here; what is left at the deadline is cut. */
  kl__http_server_sweep(&gw->http);
  int64_t waited_ms = (kl__mono_ns() - gw->stop_ns) / 1000000;
  if (gw->http.nconns > 0 && waited_ms < gw->opts.drain_timeout_ms)
    return;
  if (gw->inflight_events > 0 || gw->http.nconns > 0)
    KL_LOG_W("gateway",
             "after %d ms, %lld events still wait for Kafka and "
             "%zu connections are open; closing them (clients retry with "
             "the same ids)",
             gw->opts.drain_timeout_ms, (long long)gw->inflight_events,
             gw->http.nconns);
  close_all(gw);
}

static void on_sweep(uv_timer_t *timer) {
  kl__gateway_t *gw = timer->data;
  kl__http_server_sweep(&gw->http);
  probe_start(gw);
}

/* ---- life cycle ---- */

static kl_err_t gw_producer(kl__gateway_t *gw, const kl_conf_t *conf) {
  kl_conf_t *own = kl_conf_dup(conf);
  char v[32];
  kl_err_t err = own ? KL_OK : KL_ENOMEM;
  /* The gateway's own budget is checked first; the producer must never
   * wait on the loop thread, so its wait is 0. */
  snprintf(v, sizeof(v), "%lld", (long long)gw->opts.max_inflight);
  if (!err)
    err = kl_conf_set(own, "producer.inflight.max", v);
  if (!err)
    err = kl_conf_set(own, "producer.enqueue.timeout.ms", "0");
  snprintf(v, sizeof(v), "%d", gw->opts.produce_timeout_ms);
  if (!err && !kl_conf_get(own, "kafka.message.timeout.ms"))
    err = kl_conf_set(own, "kafka.message.timeout.ms", v);
  /* Every request waits for its acknowledgement, so a linger is paid in
   * latency by each request, and a client's connection carries the fewer
   * requests the longer it lingers: keylane-bench gateway --body msgpack,
   * 16 connections, gave about 410k events/s at 2 ms, 700k at 1 ms and
   * 820k to 980k at 0.5 and 0.2 ms (0 sends each request's events alone:
   * 670k). 2 ms gave ~1.8x the events/s of librdkafka's 5 ms. */
  if (!err && !kl_conf_get(own, "kafka.linger.ms") &&
      !kl_conf_get(own, "kafka.queue.buffering.max.ms"))
    err = kl_conf_set(own, "kafka.linger.ms", KL_GW_LINGER_MS);
  /* A client naming a topic must not create it: junk names would become
   * topics, and fill --max-topics until a restart. */
  if (!err && !kl_conf_get(own, "kafka.allow.auto.create.topics"))
    err = kl_conf_set(own, "kafka.allow.auto.create.topics", "false");
  if (!err)
    err = kl_producer_new(own, kl__gw_on_delivery, gw, &gw->producer);
  kl_conf_destroy(own);
  return err;
}

static void gw_handles(kl__gateway_t *gw) {
  uv_async_init(&gw->loop, &gw->stop_async, on_stop);
  uv_async_init(&gw->loop, &gw->kafka_async, on_kafka_async);
  uv_timer_init(&gw->loop, &gw->tick);
  uv_timer_init(&gw->loop, &gw->sweep);
  gw->stop_async.data = gw->kafka_async.data = gw;
  gw->tick.data = gw->sweep.data = gw;
  gw->kafka_queue = rd_kafka_queue_get_main(kl__producer_rk(gw->producer));
  rd_kafka_queue_cb_event_enable(gw->kafka_queue, on_kafka_event, gw);
}

/* Without tokens anyone who reaches the port publishes: the default
 * (loopback) keeps that to this host; any other address is said once. */
static void gw_warn_open(const kl__gateway_opts_t *o) {
  struct sockaddr_storage addr;
  if (o->tokens_file || kl__listen_addr("--listen", o->listen, &addr) ||
      kl__listen_loopback(&addr))
    return;
  KL_LOG_W("gateway",
           "--listen %s is not a loopback address and no bearer tokens are "
           "set: anyone who can reach it may publish; give --tokens-file "
           "FILE (one token per line; clients send Authorization: Bearer "
           "TOKEN), or listen on 127.0.0.1",
           o->listen);
}

static kl_err_t gw_open(kl__gateway_t *gw, const kl_conf_t *conf) {
  kl_err_t err = opts_check(&gw->opts);
  if (!err && gw->opts.tokens_file)
    err = kl__tokens_load(gw->opts.tokens_file, &gw->tokens);
  if (!err && kl__tokens_warning(gw->tokens))
    KL_LOG_W("gateway", "%s", kl__tokens_warning(gw->tokens));
  if (!err)
    gw_warn_open(&gw->opts);
  if (!err)
    err = kl__gw_metrics_init(gw);
  if (!err)
    err = gw_producer(gw, conf);
  if (!err && uv_loop_init(&gw->loop) != 0)
    err = kl__err(KL_EIO, "cannot create the event loop");
  if (err)
    return err;
  gw->loop_ok = true;
  gw_handles(gw);
  return kl__gw_http_init(gw);
}

kl_err_t kl__gateway_new(const kl_conf_t *conf, const kl__gateway_opts_t *opts,
                         kl__gateway_t **out) {
  if (!conf || !opts || !out)
    return kl__err(KL_EINVAL, "kl__gateway_new: conf, opts and out are "
                              "required");
  kl__gateway_t *gw = calloc(1, sizeof(*gw));
  if (!gw)
    return kl__err(KL_ENOMEM, "out of memory for the gateway");
  gw->opts = *opts;
  kl_err_t err = gw_open(gw, conf);
  if (err) {
    char detail[1024];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    kl__gateway_destroy(gw);
    return kl__err(err, "%s", detail);
  }
  *out = gw;
  return KL_OK;
}

int kl__gateway_port(const kl__gateway_t *gateway) {
  return gateway ? gateway->http.port : -1;
}

kl_err_t kl__gateway_run(kl__gateway_t *gw) {
  if (!gw || gw->ran)
    return kl__err(KL_EINVAL, "kl__gateway_run: runs once per gateway");
  gw->ran = true;
  uv_timer_start(&gw->tick, on_tick, KL_GW_TICK_MS, KL_GW_TICK_MS);
  uv_timer_start(&gw->sweep, on_sweep, KL_GW_SWEEP_MS, KL_GW_SWEEP_MS);
  probe_start(gw);
  KL_LOG_I("gateway", "listening on %s (port %d)", gw->opts.listen,
           gw->http.port);
  uv_run(&gw->loop, UV_RUN_DEFAULT);
  return KL_OK;
}

void kl__gateway_stop(kl__gateway_t *gw) {
  if (gw)
    uv_async_send(&gw->stop_async);
}

void kl__gateway_destroy(kl__gateway_t *gw) {
  if (!gw)
    return;
  if (gw->loop_ok) {
    if (!gw->ran)
      close_all(gw);
    uv_run(&gw->loop, UV_RUN_DEFAULT); /* close callbacks, a last probe */
    uv_loop_close(&gw->loop);
  }
  /* Reports served here go to orphaned requests: counted, then freed. */
  kl_producer_destroy(gw->producer);
  kl__tokens_destroy(gw->tokens);
  kl__gw_arena_destroy(&gw->arena);
  for (size_t i = 0; i < gw->ntopics; i++)
    free(gw->topics[i].name);
  free(gw->topics);
  if (gw->kafka_topics)
    rd_kafka_metadata_destroy(gw->kafka_topics);
  kl__metrics_destroy(gw->m.registry);
  free(gw);
}
