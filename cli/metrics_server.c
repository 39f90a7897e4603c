#include "cli/metrics_server.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/http.h"
#include "common/internal.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/units.h"
#include "common/metrics.h"
#include "common/strbuf.h"
#include "cli/health_json.h"
#include "cli/worker_api.h"
#include "worker/log_guard.h"
#include "store/cache.h"
#include "store/store_internal.h"
#include "worker/worker_internal.h"

#define COMP "metrics"
#define KL_MS_CONNS_MAX 32
#define KL_MS_HEAD_MAX 8192
#define KL_MS_TARGET_MAX 4096 /* /v1/keys/KEY: 9 + 3 * KL_KEY_MAX, and more */
#define KL_MS_BODY_MAX 8192   /* none of its routes reads a body */
#define KL_MS_IDLE_MS 10000
#define KL_MS_SWEEP_MS 1000
#define KL_MS_STOPS_MAX 256  /* partitions listed by the log guard's series */
#define KL_MS_PARTS_MAX 4096 /* partitions in /healthz's JSON, at most */
#define KL_MS_LIVE_MS 300000 /* /livez without worker.stall.ms: 5 min */
#define KL_MS_LIVE_MIN_MS 10000 /* /livez's bound at least: above a try */

struct kl__metrics_server {
  uv_loop_t loop;
  kl__http_server_t http; /* the connections (common/http.h) */
  uv_async_t stop;
  uv_timer_t sweep; /* the HTTP layer's timeouts, every second */
  pthread_t thread;
  char *topic;
  kl_worker_t *worker;
  kl_store_t *store;
  char *group;      /* worker.group: kafka_consumergroup_lag's label */
  int64_t stall_ms; /* worker.stall.ms: /livez's bound, and the
                       JSON's WARN at half of it */
};

/* ---- the documents (on the loop thread) ---- */

typedef struct kl_ms_scrape {
  kl__metrics_server_t *server;
  kl__metric_t *watermark, *epoch, *lag;
  kl__metric_t *exporter_lag; /* kafka_consumergroup_lag */
} kl_ms_scrape_t;

/* kafka_exporter's series, beside keylane's own: dashboards and alerts
 * built on kafka_exporter (and kafka-lag-exporter) find the group's lag
 * under the name and labels they already query. keylane commits Kafka
 * offsets after the store, so the store's watermark is the group's
 * committed position and the value equals keylane_worker_partition_lag. */
static kl__metric_t *ms_exporter_lag_family(kl__metrics_t *m) {
  return kl__metrics_gauge(
      m, "kafka_consumergroup_lag",
      "kafka_exporter-compatible: an owned partition's high watermark minus "
      "the group's position (the store's watermark).",
      "consumergroup,topic,partition");
}

static void ms_exporter_lag(kl_ms_scrape_t *scrape, const char *partition,
                            int64_t lag) {
  const char *labels[] = {scrape->server->group, scrape->server->topic,
                          partition};
  kl__metric_set(scrape->exporter_lag, labels, (double)lag);
}

static void ms_counter(kl__metrics_t *m, const char *name, const char *help,
                       uint64_t v) {
  kl__metric_add(kl__metrics_counter(m, name, help, NULL), NULL, (double)v);
}

static void ms_gauge(kl__metrics_t *m, const char *name, const char *help,
                     double v) {
  kl__metric_set(kl__metrics_gauge(m, name, help, NULL), NULL, v);
}

/* A partition's watermark and epoch in the store. */
static void ms_partition(kl_ms_scrape_t *scrape, const kl__store_part_t *part) {
  char p[16];
  snprintf(p, sizeof(p), "%" PRId32, part->partition);
  const char *labels[] = {p};
  kl__metric_set(scrape->watermark, labels, (double)part->state.watermark);
  kl__metric_set(scrape->epoch, labels, (double)part->state.epoch);
}

/* The store's partitions of the topic, from the worker's cached store
 * reader (worker/store_read.h): the server's first read waits 2 s at
 * most, and every later one answers at once with the last read's outcome
 * while a fresh read runs in the background; the age of the read under
 * way is a series of its own. */
static void ms_partitions(kl_ms_scrape_t *scrape, kl__metrics_t *m) {
  kl__store_read_t *reader = kl__worker_reader(scrape->server->worker);
  ms_gauge(m, "keylane_worker_store_read_age_seconds",
           "How long the store has not answered the read under way of "
           "/healthz and /metrics; 0 when none waits. Past 2 s /healthz "
           "fails naming it.",
           (double)kl__store_read_age_ms(reader) / 1000.0);
  kl__store_part_t *parts =
      malloc(KL__STORE_READ_PARTS_MAX * sizeof(kl__store_part_t));
  size_t n = 0;
  if (parts)
    kl__store_read(reader, parts, KL__STORE_READ_PARTS_MAX, &n);
  for (size_t i = 0; i < n; i++)
    ms_partition(scrape, &parts[i]);
  free(parts);
}

/* The store's owner cache (PostgreSQL; zeroes when it has none). */
static void ms_store_cache(kl__metrics_server_t *server, kl__metrics_t *m) {
  kl__cache_stats_t c;
  kl__store_cache_stats(server->store, &c);
  ms_gauge(m, "keylane_store_cache_bytes",
           "Bytes the owner cache holds (store.cache.max bounds them).",
           (double)c.bytes);
  ms_gauge(m, "keylane_store_cache_entries",
           "Handler keys the owner cache holds.", (double)c.entries);
  ms_counter(m, "keylane_store_cache_hits_total",
             "kl_txn_get() calls the owner cache answered.", c.hits);
  ms_counter(m, "keylane_store_cache_misses_total",
             "kl_txn_get() calls that read the server.", c.misses);
  ms_counter(m, "keylane_store_cache_drops_total",
             "Partitions dropped from the owner cache (fence, failed "
             "commit, epoch change, revoke).",
             c.drops);
}

/* Partitions the log guard stopped (the log went backwards or lost
 * records) and records it skipped by worker.on.gap=skip. */
static void ms_log_stops(kl__metrics_server_t *server, kl__metrics_t *m) {
  kl__metric_t *stopped = kl__metrics_gauge(
      m, "keylane_worker_partition_stopped",
      "1 for a partition stopped because its log went backwards "
      "(reason=went_backwards), lost records (reason=retention_gap) or was "
      "replaced (reason=log_replaced), because the store never saw the "
      "owner the group committed (reason=store_unknown), or because the "
      "store records another Kafka cluster (reason=cluster_mismatch) or "
      "group (reason=group_mismatch) as the topic's owner.",
      "topic,partition,reason");
  kl__metric_t *gap = kl__metrics_counter(
      m, "keylane_worker_gap_records_total",
      "Records retention deleted before they were applied, skipped by "
      "worker.on.gap=skip.",
      "topic,partition");
  kl__log_guard_stop_t stops[KL_MS_STOPS_MAX];
  size_t n = kl__log_guard_stops(kl__worker_log_guard(server->worker), stops,
                                 KL_MS_STOPS_MAX);
  for (size_t i = 0; i < n; i++) {
    char p[16];
    snprintf(p, sizeof(p), "%" PRId32, stops[i].partition);
    const char *labels[] = {
        server->topic, p, kl__checks_log_verdict_name(stops[i].check.verdict)};
    if (stops[i].stopped)
      kl__metric_set(stopped, labels, 1);
    if (stops[i].gap_records)
      kl__metric_add(gap, labels, (double)stops[i].gap_records);
  }
}

/* Misrouted records by partition, forwards, and the partition count. */
static void ms_routing(kl__metrics_server_t *server, kl__metrics_t *m,
                       const kl_worker_stats_t *st) {
  kl__metric_t *misrouted = kl__metrics_counter(
      m, "keylane_worker_misrouted_total",
      "Records whose key routes (murmur2) to another partition than the one "
      "they arrived on: dead-lettered or forwarded, never applied.",
      "topic,partition");
  uint64_t by_partition[4096];
  size_t n = kl__worker_misrouted(server->worker, by_partition, 4096);
  for (size_t p = 0; p < n; p++) {
    char part[24];
    snprintf(part, sizeof(part), "%zu", p);
    if (by_partition[p])
      kl__metric_add(misrouted, (const char *[]){server->topic, part},
                     (double)by_partition[p]);
  }
  ms_counter(m, "keylane_worker_misrouted_forwarded_total",
             "Misrouted records re-published to their key's partition "
             "(worker.misrouted=forward) and acknowledged.",
             st->forwarded);
  ms_gauge(m, "keylane_worker_topic_partitions",
           "The topic's partition count as last read.", st->partitions_live);
  ms_gauge(m, "keylane_worker_partition_count_mismatch",
           "1 when the topic's partition count differs from the expected "
           "one: the worker stopped taking it.",
           st->partitions_live &&
               st->partitions_live != st->partitions_expected);
}

/* Delayed events (docs/design.md, "Timers"). */
static void ms_timers(kl__metrics_t *m, const kl_worker_stats_t *st) {
  ms_counter(m, "keylane_worker_timers_scheduled_total",
             "Delayed events (not_before) read and kept as timers, to run "
             "once due.",
             st->timers_scheduled);
  ms_counter(m, "keylane_worker_timers_fired_total",
             "Due timers' firing records written and acknowledged.",
             st->timers_fired);
  ms_counter(m, "keylane_worker_timers_early_total",
             "Firing records stamped before their timer's time (another "
             "producer, or a clock stepped back): their timers wait on.",
             st->timers_early);
  ms_gauge(m, "keylane_worker_timers_pending",
           "Timers waiting in the partitions owned: each one's count in the "
           "store at take, kept by the worker's commits since.",
           (double)st->timers_pending);
  ms_counter(m, "keylane_worker_timers_late_total",
             "Fired timers whose run committed more than 1 s after their "
             "time (keylane_worker_timer_lateness_seconds has them all).",
             st->timers_late);
}

/* Follow-up events (kl_txn_emit()): held in the outbox, and published. */
static void ms_outbox(kl__metrics_t *m, const kl_worker_stats_t *st) {
  ms_gauge(m, "keylane_worker_outbox_pending",
           "Follow-up events committed and not yet acknowledged by Kafka "
           "(owned partitions); a partition pauses at worker.outbox.max.",
           (double)st->outbox_pending);
  ms_counter(m, "keylane_worker_outbox_published_total",
             "Follow-up events published and acknowledged.",
             st->outbox_published);
  ms_counter(m, "keylane_worker_outbox_aside_total",
             "Follow-up events Kafka refused for good, set aside as dead "
             "letters of reason outbox.",
             st->outbox_aside);
  ms_gauge(m, "keylane_worker_outbox_kept",
           "Follow-up events Kafka refused, and their dead letters too, "
           "kept in the store's outbox (keylane store outbox lists them) "
           "until an operator drops them or the limits let them through; "
           "/healthz answers 200 \"degraded: ...\" while any is.",
           (double)st->outbox_kept);
  ms_gauge(m, "keylane_worker_outbox_stalled_seconds",
           "The longest time an owned partition's outbox has held "
           "follow-ups without one acknowledged; /healthz fails past "
           "worker.outbox.stall.ms.",
           (double)st->outbox_stalled_ms / 1000.0);
}

/* keylane_worker_lag_seconds{topic,partition}: from the envelope ts of
 * each owned partition's oldest unapplied record. */
static kl__metric_t *ms_lag_seconds_family(kl__metrics_t *m) {
  return kl__metrics_gauge(
      m, "keylane_worker_lag_seconds",
      "Age of the partition's oldest unapplied event taken in (now minus its "
      "envelope ts); 0 when none waits.",
      "topic,partition");
}

typedef struct kl_ms_stalls {
  kl_ms_scrape_t *scrape;
  kl__metric_t *stalled, *lag_seconds;
} kl_ms_stalls_t;

static int ms_stall(void *opaque, const kl_worker_partition_t *part) {
  kl_ms_stalls_t *each = opaque;
  if (!(part->flags & KL_WORKER_PARTITION_OWNED))
    return 0;
  char p[16];
  snprintf(p, sizeof(p), "%" PRId32, part->partition);
  kl__metric_set(each->stalled, (const char *[]){p},
                 (part->flags & KL_WORKER_PARTITION_STALLED) != 0);
  kl__metric_set(each->lag_seconds,
                 (const char *[]){each->scrape->server->topic, p},
                 part->lag_seconds);
  if (part->lag >= 0) {
    kl__metric_set(each->scrape->lag, (const char *[]){p}, (double)part->lag);
    ms_exporter_lag(each->scrape, p, part->lag);
  }
  return 0;
}

/* Owned partitions: stalled (1) or not (0), their lag in seconds, and
 * their lag in records from the high watermark the worker's consumer last
 * fetched. No request to Kafka: librdkafka 2.0.2's
 * rd_kafka_query_watermark_offsets() can wait past its timeout while the
 * cluster does not answer (librdkafka #2588, fixed in 2.3.0), and a scrape
 * that waited held /livez with it. */
static void ms_stalls(kl_ms_scrape_t *scrape, kl__metrics_t *m) {
  kl_ms_stalls_t each = {
      scrape,
      kl__metrics_gauge(
          m, "keylane_worker_partition_stalled",
          "1 while an owned partition holds records and its watermark has "
          "not moved for worker.stall.ms.",
          "partition"),
      ms_lag_seconds_family(m)};
  kl_worker_foreach_partition(scrape->server->worker, ms_stall, &each);
}

/* A scrape's registry: every family the worker exports but the ones it
 * keeps across scrapes (kl__worker_metrics()). */
static kl__metrics_t *ms_scrape(kl__metrics_server_t *server) {
  kl_worker_stats_t st;
  kl_worker_stats(server->worker, &st, sizeof(st));
  kl__metrics_t *m = kl__metrics_new();
  if (!m)
    return NULL;
  ms_counter(m, "keylane_worker_events_applied_total",
             "Events whose effects were committed.", st.applied);
  ms_counter(m, "keylane_worker_events_suppressed_total",
             "Events skipped because their idempotency key was seen.",
             st.duplicates);
  ms_counter(m, "keylane_worker_events_redelivered_total",
             "Events skipped because their offset is below the watermark.",
             st.redelivered);
  ms_counter(m, "keylane_worker_events_failed_total",
             "Events dead-lettered by the handler's verdict.", st.failed);
  ms_counter(m, "keylane_worker_dead_letters_total",
             "Records acknowledged by the dead-letter topic.", st.dead_letters);
  ms_counter(m, "keylane_worker_batches_total", "Partition batches committed.",
             st.batches);
  ms_counter(m, "keylane_worker_fenced_batches_total",
             "Group commits rejected by the epoch check.", st.fenced);
  ms_counter(m, "keylane_worker_batches_begun_ahead_total",
             "Partition batches begun, their ids looked up, while another "
             "partition's handlers ran (PostgreSQL, concurrency 1).",
             kl__worker_ahead(server->worker));
  ms_gauge(m, "keylane_worker_owned_partitions", "Partitions owned now.",
           st.owned);
  ms_gauge(m, "keylane_worker_paused_partitions",
           "Partitions paused by a bound.", st.paused);
  ms_gauge(m, "keylane_worker_waiting_keys", "Keys waiting in retry backoff.",
           (double)st.waiting_keys);
  ms_gauge(m, "keylane_worker_oldest_wait_seconds",
           "How long the longest-waiting key has waited.",
           (double)st.oldest_wait_ms / 1000.0);
  ms_gauge(m, "keylane_worker_window_events",
           "Records held in the lanes' windows.", (double)st.window_events);
  ms_gauge(m, "keylane_worker_retention_override",
           "1: a topic keeps records longer than store.dedup.retention "
           "and worker.retention.check=warn runs anyway.",
           st.retention_override);
  ms_gauge(m, "keylane_worker_retention_unchecked",
           "1: the cluster could not tell a topic's retention.",
           st.retention_unchecked);
  ms_routing(server, m, &st);
  ms_store_cache(server, m);
  ms_outbox(m, &st);
  ms_timers(m, &st);
  kl_ms_scrape_t scrape = {
      server,
      kl__metrics_gauge(m, "keylane_worker_partition_watermark",
                        "The store's watermark: next offset to apply.",
                        "partition"),
      kl__metrics_gauge(m, "keylane_worker_partition_epoch",
                        "The partition's owner epoch in the store.",
                        "partition"),
      kl__metrics_gauge(m, "keylane_worker_partition_lag",
                        "An owned partition's high watermark, as the "
                        "worker's consumer last fetched it, minus the "
                        "store's watermark.",
                        "partition"),
      ms_exporter_lag_family(m)};
  ms_partitions(&scrape, m);
  ms_log_stops(server, m);
  ms_stalls(&scrape, m);
  return m;
}

static char *ms_metrics(kl__metrics_server_t *server, size_t *len) {
  kl__metrics_t *m = ms_scrape(server);
  if (!m)
    return NULL;
  /* The latency histograms are kept across scrapes by the worker. */
  char *text =
      kl__metrics_render_with(m, kl__worker_metrics(server->worker), len);
  kl__metrics_destroy(m);
  return text;
}

void kl__metrics_server_describe(kl__metrics_server_t *server,
                                 kl__strbuf_t *sb) {
  kl__metrics_t *m = ms_scrape(server);
  if (!m) {
    sb->failed = true;
    return;
  }
  kl__metrics_describe(m, sb);
  kl__metrics_describe(kl__worker_metrics(server->worker), sb);
  kl__metrics_destroy(m);
}

/* @returns the HTTP status of kl_worker_health()'s verdict; @p reason
 * receives the body. */
static int ms_health(kl__metrics_server_t *server, char *reason, size_t size) {
  kl_worker_health_t health = {.size = sizeof(health)};
  if (kl_worker_health(server->worker, &health) != KL_OK) {
    snprintf(reason, size, "unhealthy: %s\n", kl_err_detail());
    return 503;
  }
  snprintf(reason, size, "%s", health.reason);
  return health.status == KL_WORKER_HEALTH_FAILING ? 503 : 200;
}

/* /livez, for a liveness probe: whether the worker's loop still turns.
 * Unlike /healthz it says nothing of the partitions, the store or Kafka,
 * whose problems a restart does not fix; only a loop stuck for
 * worker.stall.ms (5 min by default) is, and restarting is the fix. */
static int ms_live(kl__metrics_server_t *server, char *reason, size_t size) {
  int64_t age = kl__worker_loop_age_ms(server->worker);
  /* A start that waits for Kafka turns the loop only between metadata
   * requests of up to 5 s: never less than 10 s, and waiting is alive. */
  char why[512];
  if (kl__worker_waiting(server->worker, why, sizeof(why))) {
    snprintf(reason, size, "ok: the loop waits for Kafka\n");
    return 200;
  }
  int64_t bound = server->stall_ms > KL_MS_LIVE_MIN_MS ? server->stall_ms
                  : server->stall_ms > 0               ? KL_MS_LIVE_MIN_MS
                                                       : KL_MS_LIVE_MS;
  if (age > bound) {
    snprintf(reason, size,
             "not live: the worker's loop has not turned for %" PRId64
             " ms (bound %" PRId64 " ms, worker.stall.ms, 10 s at least): "
             "it is stuck; "
             "restart it\n",
             age, bound);
    return 503;
  }
  snprintf(reason, size, "ok: the loop turned %" PRId64 " ms ago\n",
           age < 0 ? 0 : age);
  return 200;
}

/* ---- answers ---- */

static void ms_respond(kl__http_req_t *req, int status, const char *ctype,
                       const char *body, size_t len) {
  kl__http_respond(req, status, ctype, NULL, body, len);
}

static void ms_text(kl__http_req_t *req, int status, const char *body) {
  ms_respond(req, status, "text/plain; charset=utf-8", body, strlen(body));
}

/* A request the HTTP layer refused (framing, limits): the reason, as
 * text like every other answer of this server. */
static void ms_error(kl__http_req_t *req, int status, const char *msg) {
  char text[1024];
  snprintf(text, sizeof(text), "%s\n", msg);
  ms_text(req, status, text);
}

/* ---- /healthz as JSON (cli/health_json.h) ---- */

/* @returns 1 for JSON, 0 for text, -1 for a format= it does not know. */
static int ms_wants_json(const kl__http_conn_t *conn, const char *query) {
  for (const char *q = query; q && *q; q = strchr(q, '&'), q = q ? q + 1 : q) {
    if (strncmp(q, "format=", 7) != 0)
      continue;
    size_t n = strcspn(q + 7, "&");
    if (n == 4 && strncmp(q + 7, "json", 4) == 0)
      return 1;
    if (n == 4 && strncmp(q + 7, "text", 4) == 0)
      return 0;
    return -1;
  }
  return strstr(conn->parse.accept, "application/json") != NULL;
}

/* The partitions of kl_worker_foreach_partition(), as health_json.h
 * takes them. */
typedef struct kl_ms_parts {
  kl__stall_t *owned;
  int32_t *stopped;
  size_t nowned, nstopped, cap;
} kl_ms_parts_t;

static int ms_part(void *opaque, const kl_worker_partition_t *part) {
  kl_ms_parts_t *parts = opaque;
  if (parts->nowned == parts->cap || parts->nstopped == parts->cap)
    return 1;
  if (part->flags & KL_WORKER_PARTITION_STOPPED)
    parts->stopped[parts->nstopped++] = part->partition;
  if (part->flags & KL_WORKER_PARTITION_OWNED)
    parts->owned[parts->nowned++] = (kl__stall_t){
        .partition = part->partition,
        .stalled = (part->flags & KL_WORKER_PARTITION_STALLED) != 0,
        .for_ms = part->unmoved_ms,
        .records = (size_t)part->records,
        .watermark = part->watermark,
        .oldest_ts_ms = part->oldest_ts_ms,
        .waiting = (size_t)part->waiting};
  return 0;
}

static void ms_health_json(kl__metrics_server_t *server, kl__http_req_t *req,
                           int status, const char *reason) {
  kl_ms_parts_t parts = {malloc(KL_MS_PARTS_MAX * sizeof(kl__stall_t)),
                         malloc(KL_MS_PARTS_MAX * sizeof(int32_t)), 0, 0,
                         KL_MS_PARTS_MAX};
  if (parts.owned && parts.stopped)
    kl_worker_foreach_partition(server->worker, ms_part, &parts);
  kl__health_t health = {status,        reason,         server->topic,
                         server->group, parts.owned,    parts.nowned,
                         parts.stopped, parts.nstopped, server->stall_ms,
                         kl__now_ms()};
  size_t len = 0;
  char *json = kl__health_json(&health, &len);
  free(parts.owned);
  free(parts.stopped);
  if (!json) {
    ms_text(req, 503, "out of memory\n");
    return;
  }
  ms_respond(req, status, "application/json", json, len);
  free(json);
}

/* Every route answers at its head: none reads a body. */
static void ms_route(kl__http_conn_t *conn, kl__http_req_t *req, int method,
                     const char *target, size_t target_len) {
  kl__metrics_server_t *server = conn->server->opaque;
  char url[KL_MS_TARGET_MAX];
  if (target_len >= sizeof(url)) {
    ms_text(req, 400,
            "the request target is over 4095 bytes (a key of /v1/keys/KEY "
            "is 1024 bytes at most, 3072 percent-encoded)\n");
    return;
  }
  memcpy(url, target, target_len);
  url[target_len] = '\0';
  char *query = strchr(url, '?');
  if (query)
    *query++ = '\0';
  int is_get = method == HTTP_GET;
  if (kl__worker_api(req, server->worker, server->topic, server->group, is_get,
                     url, query ? query : "")) {
    return;
  } else if (strcmp(url, "/metrics") == 0 && is_get) {
    size_t len;
    char *text = ms_metrics(server, &len);
    if (!text) {
      ms_text(req, 503, "out of memory\n");
      return;
    }
    ms_respond(req, 200, KL_METRICS_CONTENT_TYPE, text, len);
    free(text);
  } else if (strcmp(url, "/healthz") == 0 && is_get) {
    int json = ms_wants_json(conn, query);
    if (json < 0) {
      ms_text(req, 400,
              "/healthz takes format=text (the default) or "
              "format=json\n");
      return;
    }
    char reason[1536];
    int status = ms_health(server, reason, sizeof(reason));
    if (json)
      ms_health_json(server, req, status, reason);
    else
      ms_text(req, status, reason);
  } else if (strcmp(url, "/livez") == 0 && is_get) {
    char reason[512];
    ms_text(req, ms_live(server, reason, sizeof(reason)), reason);
  } else if (strcmp(url, "/metrics") == 0 || strcmp(url, "/healthz") == 0 ||
             strcmp(url, "/livez") == 0) {
    ms_text(req, 405, "use GET\n");
  } else {
    ms_text(req, 404,
            "not found: GET /metrics, /healthz, /livez, /v1/partitions, "
            "/v1/keys or /v1/keys/KEY\n");
  }
}

static void ms_body(kl__http_conn_t *conn, kl__http_req_t *req,
                    const char *body, size_t len) {
  (void)conn, (void)req, (void)body, (void)len; /* answered at the head */
}

static void ms_sweep(uv_timer_t *timer) {
  kl__metrics_server_t *server = timer->data;
  kl__http_server_sweep(&server->http);
}

/* ---- the thread ---- */

/* Closes every handle of the loop, so that uv_run() returns. */
static void ms_close(kl__metrics_server_t *server) {
  kl__http_server_close(&server->http);
  uv_close((uv_handle_t *)&server->stop, NULL);
  uv_close((uv_handle_t *)&server->sweep, NULL);
}

static void ms_on_stop(uv_async_t *async) {
  ms_close(async->data);
}

static void *ms_main(void *opaque) {
  kl__metrics_server_t *server = opaque;
  uv_run(&server->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* Bounds: 32 connections waiting for their request (a new one past them
 * closes the oldest, so idle clients cannot lock a liveness probe out),
 * 64 held at all; a head of 8 KiB, no body past 8 KiB; 10 s for a request
 * to arrive and for an idle connection; one request per connection. */
static kl_err_t ms_listen(kl__metrics_server_t *server, const char *listen) {
  static const kl__http_opts_t opts = {.component = COMP,
                                       .max_connections = KL_MS_CONNS_MAX,
                                       .evict_idle = true,
                                       .max_header = KL_MS_HEAD_MAX,
                                       .max_body = KL_MS_BODY_MAX,
                                       .max_pipeline = 1,
                                       .max_output = 1,
                                       .idle_timeout_ms = KL_MS_IDLE_MS,
                                       .request_timeout_ms = KL_MS_IDLE_MS,
                                       .timeout_hint = "10 s",
                                       .header_hint = "8 KiB",
                                       .body_hint = "8 KiB",
                                       .one_request = true};
  static const kl__http_hooks_t hooks = {.req_size = sizeof(kl__http_req_t),
                                         .head = ms_route,
                                         .body = ms_body,
                                         .error = ms_error};
  struct sockaddr_storage addr;
  kl_err_t err = kl__listen_addr("--metrics-listen", listen, &addr);
  if (err)
    return err;
  if (uv_loop_init(&server->loop) != 0)
    return kl__err(KL_EIO, "--metrics-listen: cannot start a libuv loop");
  uv_async_init(&server->loop, &server->stop, ms_on_stop);
  uv_timer_init(&server->loop, &server->sweep);
  server->stop.data = server->sweep.data = server;
  err = kl__http_server_init(&server->http, &server->loop, &opts, &hooks,
                             server, "--metrics-listen", listen, 64);
  if (!err) {
    uv_timer_start(&server->sweep, ms_sweep, KL_MS_SWEEP_MS, KL_MS_SWEEP_MS);
    return KL_OK;
  }
  ms_close(server);
  uv_run(&server->loop, UV_RUN_DEFAULT);
  uv_loop_close(&server->loop);
  return err;
}

kl_err_t kl__metrics_server_start(const char *listen, const kl_conf_t *conf,
                                  const char *topic, kl_worker_t *worker,
                                  kl_store_t *store,
                                  kl__metrics_server_t **out) {
  kl__metrics_server_t *server = calloc(1, sizeof(*server));
  if (!server || !(server->topic = strdup(topic))) {
    free(server);
    return KL_ENOMEM;
  }
  server->worker = worker;
  server->store = store;
  /* Its loop answers /livez too: it never waits for the store after the
   * first read (worker/store_read.h). */
  kl__store_read_cached(kl__worker_reader(worker));
  server->stall_ms = kl__conf_int(conf, "worker.stall.ms");
  if (!(server->group = strdup(kl_conf_get(conf, "worker.group")))) {
    free(server->topic);
    free(server);
    return KL_ENOMEM;
  }
  kl_err_t err = ms_listen(server, listen);
  if (!err && pthread_create(&server->thread, NULL, ms_main, server) != 0) {
    err = kl__err(KL_EIO, "--metrics-listen: cannot start its thread");
    ms_close(server);
    uv_run(&server->loop, UV_RUN_DEFAULT);
    uv_loop_close(&server->loop);
  }
  if (err) {
    free(server->group);
    free(server->topic);
    free(server);
    return err;
  }
  KL_LOG_I(COMP, "serving /metrics, /healthz and /livez on %s (port %d)",
           listen, server->http.port);
  *out = server;
  return KL_OK;
}

int kl__metrics_server_port(const kl__metrics_server_t *server) {
  return server->http.port;
}

void kl__metrics_server_stop(kl__metrics_server_t *server) {
  if (!server)
    return;
  uv_async_send(&server->stop);
  pthread_join(server->thread, NULL);
  uv_loop_close(&server->loop);
  free(server->group);
  free(server->topic);
  free(server);
}
