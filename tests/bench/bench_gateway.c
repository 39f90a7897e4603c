/*
 * keylane-bench gateway: what the HTTP hop costs. Events per second through
 * the gateway (POSTs of 100 events over 16 keep-alive connections, each
 * answered only once Kafka acknowledged every event) against kl_publish
 * straight to the same cluster, with the same keys and payloads.
 *
 * The gateway runs in this process on its own thread (its loop serves HTTP
 * and its producer); 16 client threads each keep one request in flight on
 * their own connection, as a service's connection pool would. The direct
 * side is one thread publishing and serving delivery reports, flushed at
 * the end. The payload is the same JSON value on both sides: the gateway
 * packs it as msgpack per event, the direct side gets it packed once.
 * With --body msgpack the requests are application/msgpack, each event's
 * payload a bin of those packed bytes, which the gateway takes as they
 * are: the same records reach Kafka.
 *
 * Runs alternate (G D, D G, ...) so machine drift affects both alike; each
 * round gets a fresh embedded cluster (the mock keeps every record in
 * memory); the medians are reported.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <msgpack.h>

#include "bench.h"
#include "common/json_msgpack.h"
#include "keylane/embedded.h"
#include "keylane/producer.h"
#include "support/http.h"

#define KL_BG_NAME "gateway"
#define KL_BG_TOPIC "bench"
#define KL_BG_BATCH 100
#define KL_BG_CONNS 16
#define KL_BG_KEYS 10000
#define KL_BG_ROUNDS_MAX 50
#define KL_BG_PAYLOAD "{\"amount\":5,\"note\":\"0123456789abcdef0123456789\"}"

typedef struct kl_bg_opts {
  int64_t events;
  int64_t rounds;
  int64_t partitions;
  const char *body; /* "json" (the default) or "msgpack" */
  int json;
} kl_bg_opts_t;

/* The payload, packed as msgpack once: the direct side's, and a msgpack
 * body's bin "payload" (taken as the payload's bytes). */
typedef struct kl_bg_payload {
  void *bytes;
  size_t len;
} kl_bg_payload_t;

static int kl_bg_payload_pack(kl_bg_payload_t *p) {
  json_t *pj = json_loads(KL_BG_PAYLOAD, 0, NULL);
  kl_err_t err = kl__json_to_msgpack(pj, KL_PAYLOAD_MAX, &p->bytes, &p->len);
  json_decref(pj);
  return err ? -1 : 0;
}

/* ---- direct kl_publish ---- */

static void kl_bg_dr(void *opaque, const kl_delivery_t *d) {
  int64_t *failed = opaque;
  if (d->err)
    (*failed)++;
}

static double kl_bg_direct(const char *bootstrap, int64_t events,
                           const kl_bg_payload_t *payload) {
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap);
  kl_producer_t *producer = NULL;
  int64_t failed = 0;
  int32_t parts = 0;
  if (kl_producer_new(conf, kl_bg_dr, &failed, &producer) != KL_OK ||
      kl_producer_partitions(producer, KL_BG_TOPIC, &parts) != KL_OK) {
    fprintf(stderr, "keylane-bench gateway: %s\n", kl_err_detail());
    kl_producer_destroy(producer);
    kl_conf_destroy(conf);
    return -1;
  }
  kl_conf_destroy(conf);
  kl_event_t ev = {.type = "credit",
                   .type_len = 6,
                   .payload = payload->bytes,
                   .payload_len = payload->len};
  char key[32];
  double t0 = kl_bench_now();
  for (int64_t i = 0; i < events; i++) {
    ev.key = key;
    ev.key_len =
        (size_t)snprintf(key, sizeof(key), "acct-%d", (int)(i % KL_BG_KEYS));
    if (kl_publish(producer, KL_BG_TOPIC, &ev, NULL) != KL_OK)
      failed++;
  }
  kl_err_t err = kl_flush(producer, 120000);
  double secs = kl_bench_now() - t0;
  kl_producer_destroy(producer);
  return err || failed ? -1 : (double)events / secs;
}

/* ---- through the gateway ---- */

typedef struct kl_bg_client {
  pthread_t thread;
  int port;
  int64_t requests;
  int index;
  const kl_bg_payload_t *msgpack; /* msgpack bodies with this payload */
  int64_t failed;
} kl_bg_client_t;

/* The key of event @p i of request @p r: keys spread like the direct
 * side's. */
static int kl_bg_key(const kl_bg_client_t *c, int64_t r, int i) {
  return (int)((r * KL_BG_BATCH + i) * KL_BG_CONNS + c->index) % KL_BG_KEYS;
}

/* One JSON request body of KL_BG_BATCH events. */
static char *kl_bg_body_json(const kl_bg_client_t *c, int64_t r, size_t *len) {
  size_t cap = KL_BG_BATCH * 128 + 16, n = 0;
  char *body = malloc(cap);
  body[n++] = '[';
  for (int i = 0; i < KL_BG_BATCH; i++)
    n += (size_t)snprintf(body + n, cap - n,
                          "%s{\"key\":\"acct-%d\","
                          "\"type\":\"credit\",\"payload\":" KL_BG_PAYLOAD "}",
                          i ? "," : "", kl_bg_key(c, r, i));
  body[n++] = ']';
  *len = n;
  return body;
}

static void kl_bg_pack_str(msgpack_packer *pk, const char *s, size_t len) {
  msgpack_pack_str(pk, len);
  msgpack_pack_str_body(pk, s, len);
}

/* The same events as a msgpack body: the payload as a bin, its bytes. */
static char *kl_bg_body_msgpack(const kl_bg_client_t *c, int64_t r,
                                size_t *len) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, KL_BG_BATCH);
  for (int i = 0; i < KL_BG_BATCH; i++) {
    char key[32];
    int n = snprintf(key, sizeof(key), "acct-%d", kl_bg_key(c, r, i));
    msgpack_pack_map(&pk, 3);
    kl_bg_pack_str(&pk, "key", 3);
    kl_bg_pack_str(&pk, key, (size_t)n);
    kl_bg_pack_str(&pk, "type", 4);
    kl_bg_pack_str(&pk, "credit", 6);
    kl_bg_pack_str(&pk, "payload", 7);
    msgpack_pack_bin(&pk, c->msgpack->len);
    msgpack_pack_bin_body(&pk, c->msgpack->bytes, c->msgpack->len);
  }
  *len = sb.size;
  return sb.data; /* msgpack_sbuffer's buffer is malloc()ed */
}

static void *kl_bg_client_main(void *opaque) {
  kl_bg_client_t *c = opaque;
  kl_t_http_t *http = kl_t_http_open(c->port);
  for (int64_t r = 0; http && r < c->requests; r++) {
    size_t len;
    char *body = c->msgpack ? kl_bg_body_msgpack(c, r, &len)
                            : kl_bg_body_json(c, r, &len);
    kl_t_http_resp_t resp;
    int rc =
        kl_t_http_request(http, "POST", "/v1/topics/" KL_BG_TOPIC "/events",
                          c->msgpack ? "Content-Type: application/msgpack\r\n"
                                     : "Content-Type: application/json\r\n",
                          body, len);
    free(body);
    if (rc == 0)
      rc = kl_t_http_recv(http, &resp, 60000);
    if (rc || resp.status != 200) {
      fprintf(stderr, "keylane-bench gateway: request failed: %d %.200s\n",
              rc ? -1 : resp.status, rc ? "" : resp.body);
      c->failed++;
    }
    if (rc == 0)
      kl_t_http_resp_free(&resp);
  }
  if (!http)
    c->failed++;
  kl_t_http_close(http);
  return NULL;
}

/* Waits until the gateway has seen Kafka and read the topic's partition
 * count, so that neither is timed. */
static int kl_bg_ready(int port) {
  for (int i = 0; i < 200; i++) {
    kl_t_http_resp_t r;
    int status = 0;
    if (kl_t_http_once(port, "GET", "/v1/topics/" KL_BG_TOPIC "/route?key=k",
                       NULL, NULL, &r) == 0) {
      status = r.status;
      kl_t_http_resp_free(&r);
    }
    if (status == 200)
      return 0;
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "keylane-bench gateway: the gateway never saw Kafka\n");
  return -1;
}

static double kl_bg_gateway(const char *bootstrap, int64_t events,
                            const kl_bg_payload_t *msgpack) {
  kl_t_gateway_t *tg = kl_t_gateway_start(bootstrap, NULL, NULL);
  if (kl_bg_ready(tg->port)) {
    kl_t_gateway_stop(tg);
    return -1;
  }
  kl_bg_client_t clients[KL_BG_CONNS];
  int64_t per =
      (events + KL_BG_BATCH * KL_BG_CONNS - 1) / (KL_BG_BATCH * KL_BG_CONNS);
  double t0 = kl_bench_now();
  for (int i = 0; i < KL_BG_CONNS; i++) {
    clients[i] = (kl_bg_client_t){
        .port = tg->port, .requests = per, .index = i, .msgpack = msgpack};
    pthread_create(&clients[i].thread, NULL, kl_bg_client_main, &clients[i]);
  }
  int64_t failed = 0;
  for (int i = 0; i < KL_BG_CONNS; i++) {
    pthread_join(clients[i].thread, NULL);
    failed += clients[i].failed;
  }
  double secs = kl_bench_now() - t0;
  kl_t_gateway_stop(tg);
  return failed ? -1 : (double)(per * KL_BG_BATCH * KL_BG_CONNS) / secs;
}

/* ---- rounds and report ---- */

static int kl_bg_round(const kl_bg_opts_t *opts, int gateway_first,
                       double *gw_eps, double *direct_eps) {
  kl_embedded_t *embedded;
  if (kl_embedded_new(1, KL_BG_TOPIC, (int32_t)opts->partitions, &embedded) !=
      KL_OK) {
    fprintf(stderr, "keylane-bench gateway: %s\n", kl_err_detail());
    return -1;
  }
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  kl_bg_payload_t payload = {0};
  if (kl_bg_payload_pack(&payload)) {
    fprintf(stderr, "keylane-bench gateway: %s\n", kl_err_detail());
    kl_embedded_destroy(embedded);
    return -1;
  }
  int msgpack = strcmp(opts->body, "msgpack") == 0;
  for (int side = 0; side < 2; side++) {
    if ((side == 0) == (gateway_first != 0))
      *gw_eps =
          kl_bg_gateway(bootstrap, opts->events, msgpack ? &payload : NULL);
    else
      *direct_eps = kl_bg_direct(bootstrap, opts->events, &payload);
  }
  free(payload.bytes);
  kl_embedded_destroy(embedded);
  return *gw_eps > 0 && *direct_eps > 0 ? 0 : -1;
}

static void kl_bg_report(const kl_bg_opts_t *opts, double *gw_runs,
                         double *direct_runs) {
  int n = (int)opts->rounds;
  json_t *ratios = kl_bench_ratios(gw_runs, direct_runs, n);
  double gw = kl_bench_median(gw_runs, n);
  double direct = kl_bench_median(direct_runs, n);
  if (opts->json) {
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:i, s:i, s:I, s:I, s:s, s:f, s:f, s:f}", "bench",
        KL_BG_NAME, "body", opts->body, "events", (json_int_t)opts->events,
        "events_per_request", KL_BG_BATCH, "connections", KL_BG_CONNS,
        "partitions", (json_int_t)opts->partitions, "rounds",
        (json_int_t)opts->rounds, "statistic", "median", "gateway_eps", gw,
        "direct_eps", direct, "ratio", gw / direct);
    json_object_set_new(o, "ratio_rounds", ratios);
    kl_bench_json(o);
    return;
  }
  json_decref(ratios);
  printf("gateway: %lld events per run, %d events per %s request over %d "
         "keep-alive connections,\n1 broker, %lld partitions, %lld "
         "alternating rounds; medians:\n",
         (long long)opts->events, KL_BG_BATCH, opts->body, KL_BG_CONNS,
         (long long)opts->partitions, (long long)opts->rounds);
  printf("  gateway  HTTP POST -> 200    %12.0f events/s\n", gw);
  printf("  direct   kl_publish          %12.0f events/s\n", direct);
  printf("  ratio    gateway/direct      %12.3f\n", gw / direct);
}

static void kl_bg_help(void) {
  printf("usage: keylane-bench gateway [--events N] [--rounds N] "
         "[--partitions N] [--body json|msgpack] [--json]\n\n"
         "Events per second through the HTTP gateway (100 events per POST,\n"
         "16 keep-alive connections, each answered after Kafka's acks=all)\n"
         "against kl_publish straight to the same embedded cluster.\n\n"
         "flags:\n"
         "  --events N      events per run (default 200000)\n"
         "  --rounds N      runs of each side (default 3)\n"
         "  --partitions N  topic partitions (default 8)\n"
         "  --body TYPE     json (default: a JSON payload per event) or\n"
         "                  msgpack (application/msgpack, the payload a\n"
         "                  bin of its msgpack bytes)\n"
         "  --json          one JSON object: gateway_eps, direct_eps, ratio\n");
}

static int kl_bg_parse(int argc, char **argv, kl_bg_opts_t *opts) {
  const kl_bench_flag_t flags[] = {
      {.name = "events", .max = 100000000, .out = &opts->events},
      {.name = "rounds", .max = KL_BG_ROUNDS_MAX, .out = &opts->rounds},
      {.name = "partitions", .max = 1000, .out = &opts->partitions},
      {.name = "body", .text = &opts->body},
      {0},
  };
  int rc =
      kl_bench_flags(KL_BG_NAME, argc, argv, flags, &opts->json, kl_bg_help);
  if (rc == 0 && strcmp(opts->body, "json") != 0 &&
      strcmp(opts->body, "msgpack") != 0) {
    fprintf(stderr,
            "keylane-bench gateway: --body is json or msgpack, not \"%s\"\n",
            opts->body);
    return 2;
  }
  return rc;
}

int kl_bench_gateway(int argc, char **argv) {
  kl_bg_opts_t opts = {
      .events = 200000, .rounds = 3, .partitions = 8, .body = "json"};
  int rc = kl_bg_parse(argc, argv, &opts);
  if (rc)
    return rc < 0 ? 0 : rc;
  double gw_runs[KL_BG_ROUNDS_MAX], direct_runs[KL_BG_ROUNDS_MAX];
  for (int r = 0; r < opts.rounds && rc == 0; r++) {
    rc = kl_bg_round(&opts, r % 2 == 0, &gw_runs[r], &direct_runs[r]) ? 1 : 0;
    fprintf(stderr, "round %d: gateway %.0f/s, direct %.0f/s\n", r + 1,
            gw_runs[r], direct_runs[r]);
  }
  if (rc == 0)
    kl_bg_report(&opts, gw_runs, direct_runs);
  else
    fprintf(stderr, "keylane-bench gateway: a run failed (see above)\n");
  return rc;
}
