/*
 * The gateway on keylane's HTTP layer (common/http.h): its limits, from
 * the gateway.* options, and its hooks: requests carry the publish state
 * (kl__gw_req_t), errors are JSON, every response is counted by route and
 * status, every refusal by limit, and a request waiting for Kafka is
 * orphaned, not freed, when its client leaves.
 *
 * All of this runs on the loop thread.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/gateway_internal.h"

static const char kl_busy_body[] =
    "{\"error\":\"the gateway is at its connection limit "
    "(--max-connections)\"}\n";

kl__gateway_t *kl__gw_http_gateway(const kl__http_conn_t *conn) {
  return conn->server->opaque;
}

void kl__gw_respond(kl__gw_req_t *req, int status, const char *ctype,
                    const char *extra, const char *body, size_t body_len) {
  kl__http_respond(&req->http, status, ctype, extra, body, body_len);
}

void kl__gw_respond_error(kl__gw_req_t *req, int status, const char *extra,
                          const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  kl__strbuf_t sb = KL__STRBUF_INIT;
  kl__strbuf_puts(&sb, "{\"error\":");
  kl__strbuf_json_str(&sb, msg, strlen(msg));
  kl__strbuf_puts(&sb, "}\n");
  size_t len = 0;
  char *body = kl__strbuf_take(&sb, &len);
  kl__gw_respond(req, status, "application/json", extra, body ? body : "",
                 body ? len : 0);
  free(body);
}

/* ---- the hooks ---- */

static void gw_head(kl__http_conn_t *conn, kl__http_req_t *http, int method,
                    const char *url, size_t url_len) {
  kl__gw_req_t *req = (kl__gw_req_t *)http;
  req->gw = kl__gw_http_gateway(conn);
  req->route = KL_GW_ROUTE_OTHER; /* until the route is known */
  kl__gw_route_head(conn, req, method, url, url_len);
}

static void gw_body(kl__http_conn_t *conn, kl__http_req_t *http,
                    const char *body, size_t body_len) {
  kl__gw_route_body(conn, (kl__gw_req_t *)http, body, body_len);
}

static void gw_error(kl__http_req_t *http, int status, const char *msg) {
  kl__gw_respond_error((kl__gw_req_t *)http, status, NULL, "%s", msg);
}

static void gw_responded(kl__http_req_t *http) {
  kl__gw_req_t *req = (kl__gw_req_t *)http;
  kl__gateway_t *gw = http->server->opaque;
  static const char *const routes[] = {"events", "route", "healthz", "metrics",
                                       "other"};
  char code[8];
  snprintf(code, sizeof(code), "%d", http->status);
  /* A request refused before its head was read has no route yet. */
  const char *route = routes[req->gw ? req->route : KL_GW_ROUTE_OTHER];
  kl__metric_add(gw->m.requests, (const char *[]){route, code}, 1);
  kl__metric_observe(gw->m.latency, (const char *[]){route},
                     (double)(kl__mono_ns() - http->start_ns) / 1e9);
}

static void gw_accepted(void *opaque) {
  kl__series_add(((kl__gateway_t *)opaque)->m.accepted, 1);
}

static void gw_http_reject(void *opaque, kl__http_limit_t limit) {
  static const kl__gw_limit_t by_http[KL__HTTP_LIMIT__COUNT] = {
      [KL__HTTP_LIMIT_CONNECTIONS] = KL_GW_LIMIT_CONNECTIONS,
      [KL__HTTP_LIMIT_HEADER] = KL_GW_LIMIT_HEADER,
      [KL__HTTP_LIMIT_BODY] = KL_GW_LIMIT_BODY,
      [KL__HTTP_LIMIT_PIPELINE] = KL_GW_LIMIT_PIPELINE,
      [KL__HTTP_LIMIT_OUTPUT] = KL_GW_LIMIT_OUTPUT,
      [KL__HTTP_LIMIT_IDLE] = KL_GW_LIMIT_IDLE,
      [KL__HTTP_LIMIT_REQUEST_TIMEOUT] = KL_GW_LIMIT_REQUEST_TIMEOUT};
  kl__gw_reject(opaque, by_http[limit]);
}

/* Waiting for Kafka: its last delivery report frees it. */
static bool gw_pending(const kl__http_req_t *http) {
  return ((const kl__gw_req_t *)http)->outstanding > 0;
}

static void gw_release(kl__http_req_t *http) {
  kl__gw_req_t *req = (kl__gw_req_t *)http;
  free(req->ids);
  free(req->slots);
  req->ids = NULL;
  req->slots = NULL;
  req->nslots = 0;
}

kl_err_t kl__gw_http_init(kl__gateway_t *gw) {
  const kl__gateway_opts_t *o = &gw->opts;
  kl__http_opts_t opts = {.component = "gateway",
                          .max_connections = o->max_connections,
                          .busy_body = kl_busy_body,
                          .retry_after_s = o->retry_after_s,
                          .max_header = o->max_header,
                          .max_body = o->max_body,
                          .max_pipeline = o->max_pipeline,
                          .max_output = o->max_output,
                          .idle_timeout_ms = o->idle_timeout_ms,
                          .request_timeout_ms = o->request_timeout_ms,
                          .timeout_hint = "--request-timeout",
                          .header_hint = "--max-header",
                          .body_hint = "--max-body"};
  kl__http_hooks_t hooks = {.req_size = sizeof(kl__gw_req_t),
                            .head = gw_head,
                            .body = gw_body,
                            .error = gw_error,
                            .responded = gw_responded,
                            .accepted = gw_accepted,
                            .reject = gw_http_reject,
                            .pending = gw_pending,
                            .release = gw_release};
  return kl__http_server_init(&gw->http, &gw->loop, &opts, &hooks, gw,
                              "--listen", o->listen, 511);
}
