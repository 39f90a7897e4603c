/*
 * What each gateway route answers, and the publish path from a decoded
 * body to the 200 that says "durably in Kafka".
 *
 * Publish: decode and validate the whole body, with what kl_publish()
 * checks beyond the envelope's rules (a delayed event's time under the
 * producer's timer.max.delay, one record's size) (400 with the first bad
 * event's index: nothing produced); reserve the request's events and bytes
 * in the in-flight budget (429 when they do not fit); look up the topic's
 * partition count (first use only, on this thread, and only while Kafka is
 * reachable, so a dead cluster costs a 503, not a stalled loop); then
 * kl_publish() every event with its slot as the opaque. The request waits
 * in its connection's FIFO until the last delivery report, which answers
 * it: 200 with every (partition, offset, id) in request order, or 503 with
 * the ids to retry with.
 *
 * req->outstanding counts one extra while the events are being handed to
 * the producer: kl_publish() serves delivery reports as it goes, and the
 * request must not be answered before its last event is even queued.
 *
 * All of this runs on the loop thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broker/gateway_internal.h"
#include "broker/producer_internal.h"
#include "event/envelope.h"
#include "common/bytes.h"
#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/strbuf.h"

#define KL_GW_PREFIX "/v1/topics/"
/* How old the list of the cluster's topics may be when a topic not served
 * yet is not in it: a topic created since is found within this, and a
 * client that names missing topics costs Kafka one request per this. */
#define KL_GW_TOPICS_MAX_AGE_MS 1000
#define KL_GW_TOPICS_TIMEOUT_MS 5000

/* ---- metrics ---- */

static double m_connections(void *gw) {
  return (double)((kl__gateway_t *)gw)->http.nconns;
}
static double m_paused(void *gw) {
  return (double)((kl__gateway_t *)gw)->http.npaused;
}
static double m_inflight(void *gw) {
  return (double)((kl__gateway_t *)gw)->inflight_events;
}
static double m_inflight_bytes(void *gw) {
  return (double)((kl__gateway_t *)gw)->inflight_bytes;
}
static double m_kafka_up(void *gw) {
  const char *why;
  return kl__gw_kafka_up(gw, &why) ? 1 : 0;
}

static const char *const kl_limit_names[KL_GW_LIMIT__COUNT] = {
    "connections", "header_bytes", "body_bytes",   "inflight",
    "pipeline",    "output_bytes", "idle_timeout", "request_timeout"};

void kl__gw_reject(kl__gateway_t *gw, kl__gw_limit_t limit) {
  kl__metric_add(gw->m.rejected, (const char *[]){kl_limit_names[limit]}, 1);
}

static void metrics_limits(kl__gateway_t *gw) {
  const kl__gateway_opts_t *o = &gw->opts;
  const struct {
    const char *name;
    double value;
  } limits[] = {
      {"connections", (double)o->max_connections},
      {"header_bytes", (double)o->max_header},
      {"body_bytes", (double)o->max_body},
      {"inflight_events", (double)o->max_inflight},
      {"inflight_bytes", (double)o->max_inflight_bytes},
      {"pipeline", (double)o->max_pipeline},
      {"output_bytes", (double)o->max_output},
      {"idle_timeout_seconds", o->idle_timeout_ms / 1000.0},
      {"request_timeout_seconds", o->request_timeout_ms / 1000.0},
      {"produce_timeout_seconds", o->produce_timeout_ms / 1000.0},
      {"topics", (double)o->max_topics},
  };
  for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++)
    kl__metric_set(gw->m.limits, (const char *[]){limits[i].name},
                   limits[i].value);
  for (int i = 0; i < KL_GW_LIMIT__COUNT; i++) /* so that they show as 0 */
    kl__metric_series(gw->m.rejected, (const char *[]){kl_limit_names[i]});
}

static kl_err_t metrics_fns(kl__gateway_t *gw) {
  kl__metrics_t *r = gw->m.registry;
  bool ok =
      kl__metrics_gauge_fn(r, "keylane_gateway_connections",
                           "open client connections", m_connections, gw) &&
      kl__metrics_gauge_fn(r, "keylane_gateway_connections_paused",
                           "connections not read because their client does "
                           "not read its responses",
                           m_paused, gw) &&
      kl__metrics_gauge_fn(r, "keylane_gateway_inflight_events",
                           "events produced and not yet acknowledged by Kafka",
                           m_inflight, gw) &&
      kl__metrics_gauge_fn(r, "keylane_gateway_inflight_bytes",
                           "request bytes of events not yet acknowledged",
                           m_inflight_bytes, gw) &&
      kl__metrics_gauge_fn(r, "keylane_gateway_kafka_up",
                           "1 when a Kafka broker answered recently",
                           m_kafka_up, gw);
  return ok ? KL_OK : KL_ENOMEM;
}

kl_err_t kl__gw_metrics_init(kl__gateway_t *gw) {
  kl__gw_metrics_t *m = &gw->m;
  kl__metrics_t *r = m->registry = kl__metrics_new();
  const double *lb = kl__metrics_latency_buckets;
  size_t nlb = kl__metrics_latency_buckets_count;
  if (!r)
    return KL_ENOMEM;
  m->requests = kl__metrics_counter(r, "keylane_gateway_requests_total",
                                    "HTTP requests answered, by route and "
                                    "status code",
                                    "route,code");
  m->latency = kl__metrics_histogram(
      r, "keylane_gateway_request_duration_seconds",
      "from a request's first byte to its answer", "route", lb, nlb);
  kl__metric_t *delivery = kl__metrics_histogram(
      r, "keylane_gateway_delivery_latency_seconds",
      "from handing an event to the producer to Kafka's acknowledgement", NULL,
      lb, nlb);
  kl__metric_t *produced =
      kl__metrics_counter(r, "keylane_gateway_events_produced_total",
                          "events Kafka acknowledged (acks=all)", NULL);
  kl__metric_t *failed = kl__metrics_counter(
      r, "keylane_gateway_events_failed_total",
      "events Kafka did not acknowledge (their request got 503)", NULL);
  m->kafka_errors =
      kl__metrics_counter(r, "keylane_gateway_kafka_errors_total",
                          "failed events by keylane error", "error");
  m->rejected = kl__metrics_counter(r, "keylane_gateway_rejected_total",
                                    "times a limit refused or held back a "
                                    "client",
                                    "limit");
  m->limits = kl__metrics_gauge(r, "keylane_gateway_limit",
                                "the configured limits", "limit");
  kl__metric_t *accepted =
      kl__metrics_counter(r, "keylane_gateway_connections_accepted_total",
                          "client connections accepted", NULL);
  m->delivery = kl__metric_series(delivery, NULL);
  m->produced = kl__metric_series(produced, NULL);
  m->failed = kl__metric_series(failed, NULL);
  m->accepted = kl__metric_series(accepted, NULL);
  if (!m->requests || !m->latency || !m->delivery || !m->produced ||
      !m->failed || !m->kafka_errors || !m->rejected || !m->limits ||
      !m->accepted || metrics_fns(gw))
    return kl__err(KL_ENOMEM, "cannot register the gateway's metrics");
  metrics_limits(gw);
  return KL_OK;
}

/* ---- heads ---- */

/* Kafka's rule: [a-zA-Z0-9._-]{1,249}, not "." or "..". */
static bool topic_ok(const char *s, size_t len) {
  if (len == 0 || len > KL_GW_TOPIC_MAX || (len == 1 && s[0] == '.') ||
      (len == 2 && s[0] == '.' && s[1] == '.'))
    return false;
  for (size_t i = 0; i < len; i++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                "0123456789._-",
                s[i]) ||
        s[i] == '\0')
      return false;
  return true;
}

/* Sets req->route (and req->topic) from the path; @returns the one method
 * it takes, or NULL for an unknown path. */
static const char *route_match(kl__gw_req_t *req, const char *path, size_t len,
                               bool *bad_topic) {
  static const struct {
    const char *path;
    kl__gw_route_t route;
    const char *method;
  } fixed[] = {{"/healthz", KL_GW_ROUTE_HEALTHZ, "GET"},
               {"/metrics", KL_GW_ROUTE_METRICS, "GET"}};
  for (size_t i = 0; i < 2; i++)
    if (len == strlen(fixed[i].path) && !memcmp(path, fixed[i].path, len)) {
      req->route = fixed[i].route;
      return fixed[i].method;
    }
  size_t plen = strlen(KL_GW_PREFIX);
  if (len <= plen || memcmp(path, KL_GW_PREFIX, plen) != 0)
    return NULL;
  const char *topic = path + plen;
  const char *slash = memchr(topic, '/', len - plen);
  if (!slash)
    return NULL;
  size_t tlen = (size_t)(slash - topic), rest = len - plen - tlen - 1;
  if (rest == 6 && !memcmp(slash + 1, "events", 6))
    req->route = KL_GW_ROUTE_EVENTS;
  else if (rest == 5 && !memcmp(slash + 1, "route", 5))
    req->route = KL_GW_ROUTE_ROUTE;
  else
    return NULL;
  *bad_topic = !topic_ok(topic, tlen);
  if (!*bad_topic) {
    memcpy(req->topic, topic, tlen);
    req->topic[tlen] = '\0';
  }
  return req->route == KL_GW_ROUTE_EVENTS ? "POST" : "GET";
}

void kl__gw_route_head(kl__http_conn_t *conn, kl__gw_req_t *req, int method,
                       const char *url, size_t url_len) {
  struct http_parser_url u;
  http_parser_url_init(&u);
  if (http_parser_parse_url(url, url_len, method == HTTP_CONNECT, &u) != 0 ||
      !(u.field_set & (1 << UF_PATH))) {
    kl__gw_respond_error(req, 400, NULL, "the request target is not a path");
    return;
  }
  bool bad_topic = false;
  const char *path = url + u.field_data[UF_PATH].off;
  const char *allow =
      route_match(req, path, u.field_data[UF_PATH].len, &bad_topic);
  char extra[64], why[512];
  if (!allow) {
    kl__gw_respond_error(req, 404, NULL,
                         "no such route; the routes are POST " KL_GW_PREFIX
                         "{topic}/events, GET " KL_GW_PREFIX
                         "{topic}/route?key=K, GET /healthz, GET /metrics");
  } else if (strcmp(http_method_str(method), allow) != 0) {
    snprintf(extra, sizeof(extra), "Allow: %s\r\n", allow);
    kl__gw_respond_error(req, 405, extra, "this route takes %s", allow);
  } else if (!kl__gw_origin_ok(conn)) {
    kl__gw_respond_error(
        req, 403, NULL,
        "Origin \"%.*s\" is not allowed: a web page may not "
        "publish through this gateway; to let one, start it "
        "with --allow-origin ORIGIN",
        (int)(conn->parse.origin_len > 200 ? 200 : conn->parse.origin_len),
        conn->parse.origin);
  } else if (req->route <= KL_GW_ROUTE_ROUTE &&
             kl__gw_http_gateway(conn)->tokens &&
             !kl__http_bearer_ok(conn, kl__gw_http_gateway(conn)->tokens)) {
    kl__gw_respond_error(req, 401, "WWW-Authenticate: Bearer\r\n",
                         "a valid \"Authorization: Bearer TOKEN\" header is "
                         "required");
  } else if (bad_topic) {
    kl__gw_respond_error(req, 400, NULL,
                         "the topic name is not 1..249 of "
                         "[a-zA-Z0-9._-] (Kafka's rule)");
  } else if (req->route <= KL_GW_ROUTE_ROUTE &&
             !kl__gw_topic_allowed(&kl__gw_http_gateway(conn)->opts, req->topic,
                                   why, sizeof(why))) {
    kl__gw_respond_error(req, 403, NULL, "%s", why);
  } else if (req->route == KL_GW_ROUTE_EVENTS &&
             !kl__gw_ctype_ok(conn->parse.ctype)) {
    kl__gw_respond_error(req, 415, NULL,
                         "Content-Type \"%.64s\" is neither application/json "
                         "nor application/msgpack; send -H 'Content-Type: "
                         "application/json'",
                         conn->parse.ctype);
  }
}

/* ---- topics ---- */

/* @returns the served topic named @p topic, marked as used now, or NULL. */
static kl__gw_topic_t *topic_known(kl__gateway_t *gw, const char *topic) {
  for (size_t i = 0; i < gw->ntopics; i++)
    if (strcmp(gw->topics[i].name, topic) == 0) {
      gw->topics[i].used_ns = kl__mono_ns();
      return &gw->topics[i];
    }
  return NULL;
}

static void topic_remember(kl__gateway_t *gw, const char *topic) {
  kl__gw_topic_t *topics =
      kl__grow(gw->topics, &gw->topics_cap, gw->ntopics, sizeof(*topics), 8);
  if (!topics)
    return;
  gw->topics = topics;
  if ((topics[gw->ntopics].name = strdup(topic)))
    topics[gw->ntopics++].used_ns = kl__mono_ns();
}

/* Makes room for one more topic when max_topics are served: the least
 * recently used one goes, if no request used it for topic_idle_ms (its
 * producer handle too). @returns whether there is room. */
static bool topic_room(kl__gateway_t *gw) {
  if (gw->ntopics < gw->opts.max_topics)
    return true;
  size_t lru = 0;
  for (size_t i = 1; i < gw->ntopics; i++)
    if (gw->topics[i].used_ns < gw->topics[lru].used_ns)
      lru = i;
  int64_t idle_ns = kl__mono_ns() - gw->topics[lru].used_ns;
  if (idle_ns < (int64_t)gw->opts.topic_idle_ms * 1000000)
    return false;
  KL_LOG_I("gateway",
           "topic %s was not used for %lld ms: it gives its "
           "place (--max-topics %zu) to another",
           gw->topics[lru].name, (long long)(idle_ns / 1000000),
           gw->opts.max_topics);
  kl__producer_forget(gw->producer, gw->topics[lru].name);
  free(gw->topics[lru].name);
  gw->topics[lru] = gw->topics[--gw->ntopics];
  return true;
}

/* Whether @p topic exists, for a topic not served yet, from the metadata
 * of every topic: a request that names the topic would make a cluster that
 * creates topics on first use create it, the embedded one whatever the
 * producer's allow.auto.create.topics says. The list is read again when
 * older than KL_GW_TOPICS_MAX_AGE_MS and the topic is not in it; a served
 * topic never asks. @returns 1, 0, or -1 when Kafka did not answer (the
 * producer's own lookup then decides). */
static int topic_exists(kl__gateway_t *gw, const char *topic) {
  rd_kafka_t *rk = kl__producer_rk(gw->producer);
  char create[8];
  size_t size = sizeof(create);
  if (rd_kafka_conf_get(rd_kafka_conf(rk), "allow.auto.create.topics", create,
                        &size) == RD_KAFKA_CONF_OK &&
      strcmp(create, "true") == 0)
    return 1; /* -X allow.auto.create.topics=true: Kafka may create it */
  int64_t now = kl__mono_ns();
  if (gw->kafka_topics && kl__kafka_metadata_find(gw->kafka_topics, topic))
    return 1;
  if (!gw->kafka_topics ||
      now - gw->kafka_topics_ns > KL_GW_TOPICS_MAX_AGE_MS * 1000000LL) {
    const struct rd_kafka_metadata *md = NULL;
    if (kl__kafka_metadata_all(rk, KL_GW_TOPICS_TIMEOUT_MS, &md))
      return -1;
    if (gw->kafka_topics)
      rd_kafka_metadata_destroy(gw->kafka_topics);
    gw->kafka_topics = md;
    gw->kafka_topics_ns = now;
  }
  return kl__kafka_metadata_find(gw->kafka_topics, topic) != NULL;
}

/* @returns the topic's partition count, or 0 after answering @p req. */
static int32_t topic_partitions(kl__gateway_t *gw, kl__gw_req_t *req) {
  const char *why = NULL;
  bool known = topic_known(gw, req->topic) != NULL;
  if (!known && !kl__gw_kafka_up(gw, &why)) {
    kl__gw_respond_error(req, 503, NULL, "%s", why);
    return 0;
  }
  if (!known && topic_exists(gw, req->topic) == 0) {
    kl__gw_respond_error(req, 404, NULL,
                         "topic %s does not exist: the gateway creates no "
                         "topic; create it in Kafka, or check the name",
                         req->topic);
    return 0;
  }
  if (!known && !topic_room(gw)) {
    char extra[48];
    snprintf(extra, sizeof(extra), "Retry-After: %d\r\n",
             gw->opts.topic_idle_ms / 1000 + 1);
    kl__gw_respond_error(req, 403, extra,
                         "the gateway serves at most %zu topics "
                         "(--max-topics), each used within the last %d ms; "
                         "retry later or raise --max-topics",
                         gw->opts.max_topics, gw->opts.topic_idle_ms);
    return 0;
  }
  int32_t parts = 0;
  kl_err_t err = kl_producer_partitions(gw->producer, req->topic, &parts);
  if (!err && parts < 1)
    err = kl__err(KL_EKAFKA, "topic %s: Kafka reported no partitions",
                  req->topic);
  if (err) {
    kl__gw_respond_error(req, err == KL_ENOTFOUND ? 404 : 503, NULL, "%s",
                         kl_err_detail());
    return 0;
  }
  if (!known)
    topic_remember(gw, req->topic);
  /* Its count is not the fleet's: a partition computed now would send the
   * key to another owner, so nothing is published or answered. */
  if (kl__producer_topic_check(gw->producer, req->topic) == KL_EPARTITIONS) {
    kl__gw_respond_error(req, 409, NULL, "%s", kl_err_detail());
    return 0;
  }
  return parts;
}

/* ---- publish ---- */

static void respond_bad(kl__gw_req_t *req, const kl__gw_bad_t *bad) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  kl__strbuf_puts(&sb, "{\"error\":");
  kl__strbuf_json_str(&sb, bad->msg, strlen(bad->msg));
  if (bad->index >= 0)
    kl__strbuf_printf(&sb, ",\"index\":%ld", bad->index);
  kl__strbuf_puts(&sb, "}\n");
  size_t len = 0;
  char *body = kl__strbuf_take(&sb, &len);
  kl__gw_respond(req, bad->status, "application/json", NULL, body ? body : "",
                 len);
  free(body);
}

/* Appends the decimal text of @p v: a printf per event was 2 % of the
 * loop thread. */
static void append_int(kl__strbuf_t *sb, int64_t v) {
  char text[24], *p = text + sizeof(text);
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do
    *--p = (char)('0' + u % 10);
  while (u /= 10);
  if (v < 0)
    *--p = '-';
  kl__strbuf_add(sb, p, (size_t)(text + sizeof(text) - p));
}

static void respond_ok(kl__gw_req_t *req) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  /* Sized up front (the ids need no escaping as a rule): one allocation,
   * not one per doubling. */
  size_t size = 4;
  for (size_t i = 0; i < req->nslots; i++)
    size += 64 + strlen(req->slots[i].id);
  sb.data = kl__reserve(NULL, &sb.cap, size, 1, 256);
  sb.failed = !sb.data;
  kl__strbuf_puts(&sb, "[");
  for (size_t i = 0; i < req->nslots; i++) {
    const kl__gw_slot_t *s = &req->slots[i];
    kl__strbuf_puts(&sb, i ? ",{\"partition\":" : "{\"partition\":");
    append_int(&sb, s->partition);
    kl__strbuf_puts(&sb, ",\"offset\":");
    append_int(&sb, s->offset);
    kl__strbuf_puts(&sb, ",\"id\":");
    kl__strbuf_json_str(&sb, s->id, strlen(s->id));
    kl__strbuf_puts(&sb, "}");
  }
  kl__strbuf_puts(&sb, "]\n");
  size_t len = 0;
  char *body = kl__strbuf_take(&sb, &len);
  if (body)
    kl__gw_respond(req, 200, "application/json", NULL, body, len);
  else
    kl__gw_respond_error(req, 503, NULL, "out of memory for the answer");
  free(body);
}

/* Some events were not acknowledged: the client retries all of them with
 * these ids; the workers apply each id once. */
static void respond_failed(kl__gw_req_t *req) {
  kl__gateway_t *gw = req->gw;
  char extra[48], msg[768];
  snprintf(extra, sizeof(extra), "Retry-After: %d\r\n", gw->opts.retry_after_s);
  snprintf(msg, sizeof(msg),
           "Kafka did not acknowledge %zu of %zu events "
           "within %d ms (%s); retry the request with the same ids",
           req->failed, req->nslots, gw->opts.produce_timeout_ms,
           req->kafka_errmsg);
  kl__strbuf_t sb = KL__STRBUF_INIT;
  kl__strbuf_puts(&sb, "{\"error\":");
  kl__strbuf_json_str(&sb, msg, strlen(msg));
  kl__strbuf_printf(&sb, ",\"failed\":%zu,\"ids\":[", req->failed);
  for (size_t i = 0; i < req->nslots; i++) {
    kl__strbuf_puts(&sb, i ? "," : "");
    kl__strbuf_json_str(&sb, req->slots[i].id, strlen(req->slots[i].id));
  }
  kl__strbuf_puts(&sb, "]}\n");
  size_t len = 0;
  char *body = kl__strbuf_take(&sb, &len);
  kl__gw_respond(req, 503, "application/json", extra, body ? body : "", len);
  free(body);
}

static void publish_done(kl__gw_req_t *req) {
  req->gw->inflight_bytes -= req->bytes;
  /* Counted here, once per request: a lock per event was not free. */
  kl__series_add(req->gw->m.produced, (double)(req->nslots - req->failed));
  if (req->failed && req->kafka_err == KL_EPARTITIONS) /* changed meanwhile */
    kl__gw_respond_error(req, 409, NULL,
                         "%zu of %zu events were not "
                         "published: %s",
                         req->failed, req->nslots, req->kafka_errmsg);
  else if (req->failed)
    respond_failed(req);
  else
    respond_ok(req);
  kl__http_req_answered(&req->http);
}

static void slot_failed(kl__gw_req_t *req, kl_err_t err, const char *msg) {
  kl__gateway_t *gw = req->gw;
  if (!req->failed++) {
    req->kafka_err = err;
    snprintf(req->kafka_errmsg, sizeof(req->kafka_errmsg), "%s", msg);
  }
  kl__series_add(gw->m.failed, 1);
  kl__metric_add(gw->m.kafka_errors, (const char *[]){kl_err_name(err)}, 1);
}

void kl__gw_on_delivery(void *opaque, const kl_delivery_t *d) {
  kl__gw_slot_t *slot = d->opaque;
  kl__gw_req_t *req = slot->req;
  kl__gateway_t *gw = req->gw;
  gw->inflight_events--;
  /* The reports of one poll share its clock reading (gateway.c). */
  int64_t now = gw->serving_ns ? gw->serving_ns : kl__mono_ns();
  kl__series_observe(gw->m.delivery, (double)(now - req->produced_ns) / 1e9);
  if (d->err) {
    slot_failed(req, d->err, d->errmsg ? d->errmsg : kl_strerror(d->err));
  } else {
    slot->partition = d->partition;
    slot->offset = d->offset;
  }
  if (--req->outstanding == 0)
    publish_done(req);
}

/* Gives every event its id now, so that a 503 can list them all; the ids
 * outlive the body, so they are copied, all into one buffer. The ids made
 * here and every event's ts come from one clock read per request, not two
 * per event (kl_event_make_id() and kl_publish() each read it). */
static bool slots_make(kl__gw_req_t *req, kl__gw_batch_t *batch) {
  int64_t now_ms = kl__now_ms();
  size_t ids_len = 0;
  for (size_t i = 0; i < batch->n; i++)
    ids_len +=
        (batch->events[i].ev.id_len ? batch->events[i].ev.id_len : 36) + 1;
  req->slots = calloc(batch->n, sizeof(kl__gw_slot_t));
  req->ids = malloc(ids_len);
  if (!req->slots || !req->ids)
    return false;
  req->nslots = batch->n;
  char *at = req->ids;
  for (size_t i = 0; i < batch->n; i++) {
    kl_event_t *ev = &batch->events[i].ev;
    kl__gw_slot_t *slot = &req->slots[i];
    slot->req = req;
    slot->partition = -1;
    slot->offset = -1;
    slot->id = at;
    if (ev->id_len) {
      memcpy(at, ev->id, ev->id_len);
      at[ev->id_len] = '\0';
    } else {
      kl__event_make_id_at(at, now_ms);
    }
    if (ev->ts == 0)
      ev->ts = now_ms;
    ev->id = at;
    ev->id_len = strlen(at);
    at += ev->id_len + 1;
  }
  return true;
}

static void routes_produce(kl__gw_req_t *req, kl__gw_batch_t *batch) {
  kl__gateway_t *gw = req->gw;
  req->outstanding = 1; /* see the file comment */
  req->produced_ns = kl__mono_ns();
  for (size_t i = 0; i < batch->n; i++) {
    req->outstanding++;
    kl_err_t err = kl_publish(gw->producer, req->topic, &batch->events[i].ev,
                              &req->slots[i]);
    if (err == KL_OK)
      continue;
    /* This one and the rest were never queued: fail them now. */
    req->outstanding--;
    for (size_t j = i; j < batch->n; j++) {
      slot_failed(req, err, kl_err_detail());
      gw->inflight_events--;
    }
    break;
  }
  if (--req->outstanding == 0)
    publish_done(req);
}

static bool budget_fits(kl__gateway_t *gw, size_t events, size_t bytes) {
  return gw->inflight_events + (int64_t)events <= gw->opts.max_inflight &&
         gw->inflight_bytes + (int64_t)bytes <= gw->opts.max_inflight_bytes;
}

static void publish_request(kl__http_conn_t *conn, kl__gw_req_t *req,
                            const char *body, size_t len) {
  kl__gateway_t *gw = req->gw;
  kl__gw_batch_t batch;
  kl__gw_bad_t bad;
  char extra[48];
  snprintf(extra, sizeof(extra), "Retry-After: %d\r\n", gw->opts.retry_after_s);
  if (gw->stopping) {
    kl__gw_respond_error(req, 503, extra, "the gateway is stopping");
    return;
  }
  /* The body's document lives in the arena until its events are produced
   * (gateway_body.c). */
  kl__gw_arena_begin(&gw->arena);
  if (kl__gw_batch_decode(&batch, conn->parse.ctype, body, len,
                          (size_t)gw->opts.max_inflight, &bad)) {
    kl__gw_arena_end(&gw->arena);
    respond_bad(req, &bad);
    return;
  }
  if (kl__gw_batch_trace(&batch, &conn->parse, &bad) ||
      kl__gw_batch_publishable(&batch, gw->producer, &bad)) {
    kl__gw_batch_free(&batch);
    kl__gw_arena_end(&gw->arena);
    respond_bad(req, &bad);
    return;
  }
  /* Held in flight: the body's bytes, or what its events take as
   * librdkafka holds them, the larger. */
  int64_t bytes = (int64_t)(batch.stored > len ? batch.stored : len);
  if (bytes > gw->opts.max_inflight_bytes) {
    kl__gw_reject(gw, KL_GW_LIMIT_INFLIGHT);
    kl__gw_respond_error(req, 413, NULL,
                         "the request's events take %lld bytes as stored "
                         "in Kafka, more than the in-flight budget "
                         "(--max-inflight-bytes %lld) holds; send them in "
                         "smaller requests",
                         (long long)bytes,
                         (long long)gw->opts.max_inflight_bytes);
  } else if (!budget_fits(gw, batch.n, (size_t)bytes)) {
    kl__gw_reject(gw, KL_GW_LIMIT_INFLIGHT);
    kl__gw_respond_error(req, 429, extra,
                         "the in-flight budget is full "
                         "(%lld events, %lld bytes wait for Kafka); retry "
                         "later",
                         (long long)gw->inflight_events,
                         (long long)gw->inflight_bytes);
  } else if (topic_partitions(gw, req) > 0) {
    if (!slots_make(req, &batch)) {
      kl__gw_respond_error(req, 503, extra, "out of memory for the events");
    } else {
      gw->inflight_events += (int64_t)batch.n;
      gw->inflight_bytes += req->bytes = bytes;
      routes_produce(req, &batch);
    }
  }
  kl__gw_batch_free(&batch);
  kl__gw_arena_end(&gw->arena);
}

/* ---- route, healthz, metrics ---- */

/* Percent-decodes @p s ('+' is a space, as in forms) into @p out.
 * @returns the length, or -1 when malformed or longer than @p cap. */
static long pct_decode(const char *s, size_t len, char *out, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '%') {
      if (len - i < 3 || kl__hex_value(s[i + 1]) < 0 ||
          kl__hex_value(s[i + 2]) < 0)
        return -1;
      c = (char)(kl__hex_value(s[i + 1]) * 16 + kl__hex_value(s[i + 2]));
      i += 2;
    } else if (c == '+') {
      c = ' ';
    }
    if (n == cap)
      return -1;
    out[n++] = c;
  }
  return (long)n;
}

/* @returns the decoded length of the query's "key", or -1. */
static long query_key(const char *q, size_t len, char *out, size_t cap) {
  for (size_t i = 0; i < len;) {
    size_t end = i;
    while (end < len && q[end] != '&')
      end++;
    if (end - i >= 4 && memcmp(q + i, "key=", 4) == 0)
      return pct_decode(q + i + 4, end - i - 4, out, cap);
    i = end + 1;
  }
  return -1;
}

static void route_request(kl__http_conn_t *conn, kl__gw_req_t *req) {
  const char *url = conn->parse.url.data ? conn->parse.url.data : "";
  const char *q = strchr(url, '?');
  char key[KL_KEY_MAX];
  long klen = q ? query_key(q + 1, strlen(q + 1), key, sizeof(key)) : -1;
  if (klen <= 0) {
    kl__gw_respond_error(req, 400, NULL,
                         "give the key as ?key=K, "
                         "percent-encoded, 1..%d bytes",
                         KL_KEY_MAX);
    return;
  }
  int32_t parts = topic_partitions(req->gw, req);
  if (parts <= 0)
    return;
  char body[96];
  int n = snprintf(body, sizeof(body), "{\"partition\":%d,\"partitions\":%d}\n",
                   (int)kl_partition(key, (size_t)klen, parts), (int)parts);
  kl__gw_respond(req, 200, "application/json", NULL, body, (size_t)n);
}

static void healthz_request(kl__gw_req_t *req) {
  kl__gateway_t *gw = req->gw;
  const char *why = NULL;
  if (gw->stopping)
    why = "the gateway is stopping";
  else if (!kl__gw_kafka_up(gw, &why))
    ; /* why says what the probe saw */
  else if (gw->inflight_events >= gw->opts.max_inflight)
    why = "the in-flight event budget (--max-inflight) is exhausted";
  else if (gw->inflight_bytes >= gw->opts.max_inflight_bytes)
    why = "the in-flight byte budget (--max-inflight-bytes) is exhausted";
  if (why) {
    kl__gw_respond_error(req, 503, NULL, "%s", why);
    return;
  }
  char body[128];
  int n = snprintf(body, sizeof(body),
                   "{\"status\":\"ok\",\"inflight\":%lld,"
                   "\"connections\":%zu}\n",
                   (long long)gw->inflight_events, gw->http.nconns);
  kl__gw_respond(req, 200, "application/json", NULL, body, (size_t)n);
}

static void metrics_request(kl__gw_req_t *req) {
  size_t len = 0;
  char *text = kl__metrics_render(req->gw->m.registry, &len);
  if (!text) {
    kl__gw_respond_error(req, 503, NULL, "out of memory");
    return;
  }
  kl__gw_respond(req, 200, KL_METRICS_CONTENT_TYPE, NULL, text, len);
  free(text);
}

void kl__gw_route_body(kl__http_conn_t *conn, kl__gw_req_t *req,
                       const char *body, size_t body_len) {
  switch (req->route) {
  case KL_GW_ROUTE_EVENTS:
    publish_request(conn, req, body, body_len);
    break;
  case KL_GW_ROUTE_ROUTE:
    route_request(conn, req);
    break;
  case KL_GW_ROUTE_HEALTHZ:
    healthz_request(req);
    break;
  case KL_GW_ROUTE_METRICS:
    metrics_request(req);
    break;
  default:
    kl__gw_respond_error(req, 404, NULL, "no such route");
  }
}
