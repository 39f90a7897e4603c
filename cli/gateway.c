/*
 * keylane broker --listen: the HTTP publish gateway (broker/gateway.h).
 *
 * broker.c hands the subcommand here when --listen or -b is given. With
 * --embedded as well, the gateway publishes to an embedded cluster started
 * in the same process (demos, tests, laptops).
 *
 * stdout: "bootstrap=HOST:PORT,..." first when --embedded, then
 * "listening=HOST:PORT" once the socket is bound, so a script or test that
 * asked for port 0 learns the port. Logs go to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/gateway.h"
#include "broker/gateway.h"
#include "cli/cli.h"
#include "common/log.h"
#include "keylane/embedded.h"

#define KL_GW_SUB "broker"

typedef struct kl__gw_cli {
  kl__gateway_opts_t opts;
  const char *bootstrap;
  int embedded;
  const char *topic;
  long partitions;
  long brokers;
  kl_conf_t *conf;
} kl__gw_cli_t;

static void gw_help(void) {
  printf(
      "usage: keylane broker --listen ADDR:PORT -b BOOTSTRAP [flags]\n"
      "       keylane broker --listen ADDR:PORT --embedded [-t TOPIC]\n"
      "                      [--partitions N] [--brokers N] [flags]\n"
      "\n"
      "The HTTP publish gateway: services in any language publish events\n"
      "with one HTTP call whose 200 means \"acknowledged by Kafka with\n"
      "acks=all, on the partition kl_partition() names for the key\".\n"
      "\n"
      "  POST /v1/topics/{topic}/events      Content-Type application/json\n"
      "                                      (one event or an array) or\n"
      "                                      application/msgpack; each event:\n"
      "                                      key, type, id?, payload? or\n"
      "                                      payload_b64?, headers?;\n"
      "                                      traceparent/tracestate headers\n"
      "                                      go into every event's headers\n"
      "     200 [{\"partition\",\"offset\",\"id\"}] in request order\n"
      "     400 {\"error\",\"index\"} first bad event; nothing was produced\n"
      "     401 no valid bearer token (with --tokens-file)\n"
      "     403 an Origin header not in --allow-origin (a web page)\n"
      "     409 the topic's partition count changed since the gateway first\n"
      "         served it (or differs from producer.expect.partitions)\n"
      "     415 a Content-Type other than JSON or msgpack\n"
      "     413 body over --max-body     429 in-flight budget full "
      "(Retry-After)\n"
      "     503 Kafka did not acknowledge in --produce-timeout: retry with\n"
      "         the SAME ids (listed in the answer); workers apply an id once\n"
      "  GET  /v1/topics/{topic}/route?key=K {\"partition\",\"partitions\"}\n"
      "  GET  /healthz                       200 when Kafka answers and the\n"
      "                                      budget has room, else 503\n"
      "  GET  /metrics                       Prometheus text\n"
      "\n"
      "flags (limits bound memory whatever clients do; each has a metric,\n"
      "keylane_gateway_limit and keylane_gateway_rejected_total):\n"
      "  --listen ADDR:PORT       address to serve (default 127.0.0.1:8080,\n"
      "                           loopback; port 0 picks a free one)\n"
      "  -b, --bootstrap SERVERS  Kafka brokers HOST:PORT[,...]\n"
      "  --embedded               start an embedded cluster instead of -b\n"
      "  -t, --topic TOPIC        with --embedded: topic to create (events)\n"
      "  --partitions N           with --embedded: its partitions (8)\n"
      "  --brokers N              with --embedded: brokers (3)\n"
      "  --tokens-file F          bearer tokens, one per line; without it\n"
      "                           no token is asked for. Never logged\n"
      "  --max-connections N      open connections (1024); more get 503\n"
      "  --max-header SIZE        request line + headers (16K); more: 431\n"
      "  --max-body SIZE          request body (1M); more: 413\n"
      "  --max-inflight N         events waiting for Kafka (10000); 429\n"
      "  --max-inflight-bytes SIZE  their request bytes (64M); 429\n"
      "  --max-pipeline N         pipelined requests queued per connection\n"
      "                           (32); past it the connection is not read\n"
      "  --max-output SIZE        unsent response bytes per connection (1M);\n"
      "                           past it the connection is not read\n"
      "  --max-topics N           distinct topics served (1024); past it\n"
      "                           403, unless one was idle --topic-idle.\n"
      "                           The gateway creates no topic (-X\n"
      "                           allow.auto.create.topics=true would)\n"
      "  --topic-idle DUR         a topic unused this long gives its place\n"
      "                           to a new one when full (60s)\n"
      "  --allow-topics LIST      topics clients may use: names or patterns\n"
      "                           (orders-*), comma-separated; others 403\n"
      "                           (default: any)\n"
      "  --allow-internal-topics  also TOPIC.dlq and __* (403 otherwise)\n"
      "  --idle-timeout DUR       close idle or non-reading clients (30s)\n"
      "  --request-timeout DUR    a request must arrive whole in it (30s); "
      "408\n"
      "  --produce-timeout DUR    Kafka's acknowledgement (10s); 503\n"
      "  --drain-timeout DUR      at SIGINT/SIGTERM, wait this long for\n"
      "                           acknowledgements before closing (10s)\n"
      "  --allow-origin LIST      browser origins (scheme://host[:port],\n"
      "                           comma-separated) whose requests are\n"
      "                           served; any other Origin header gets\n"
      "                           403 (default: none)\n"
      "  -X name=value            a keylane key or librdkafka property\n"
      "  -h, --help               this text\n"
      "SIZE is bytes, or takes K, M, G (powers of 1024; KiB... too);\n"
      "DUR takes a unit: ms, s, m, h or d (at most 1d).\n"
      "\n"
      "examples:\n"
      "  keylane broker --listen 127.0.0.1:8080 -b kafka1:9092,kafka2:9092 \\\n"
      "      --tokens-file /etc/keylane/tokens\n"
      "  curl -H 'Authorization: Bearer $TOKEN' \\\n"
      "      -H 'Content-Type: application/json' \\\n"
      "      -d '{\"key\":\"acct-1\",\"type\":\"credit\",\"payload\":"
      "{\"amount\":5}}' \\\n"
      "      http://127.0.0.1:8080/v1/topics/events/events\n");
}

/* Sizes and durations of the gateway; the parser is common/units.h. */
#define KL_GW_SIZE_MAX (INT64_MAX / 2)
#define KL_GW_DURATION_MAX 86400000 /* a day */

static int gw_size(const char *flag, const char *arg, int64_t *out) {
  return kl__cli_units(KL_GW_SUB, flag, arg, KL__UNITS_SIZE, 1, KL_GW_SIZE_MAX,
                       out);
}

static int gw_duration(const char *flag, const char *arg, int *out) {
  int64_t ms = 0;
  int rc = kl__cli_units(KL_GW_SUB, flag, arg, KL__UNITS_DURATION, 1,
                         KL_GW_DURATION_MAX, &ms);
  *out = rc ? *out : (int)ms;
  return rc;
}

static int gw_count(const char *flag, const char *arg, long max, long *out) {
  int64_t n = 0;
  int rc = kl__cli_units(KL_GW_SUB, flag, arg, KL__UNITS_COUNT, 1, max, &n);
  *out = rc ? *out : (long)n;
  return rc;
}

enum {
  KL_O_LISTEN = 256,
  KL_O_EMBEDDED,
  KL_O_PARTITIONS,
  KL_O_BROKERS,
  KL_O_TOKENS,
  KL_O_CONNS,
  KL_O_HEADER,
  KL_O_BODY,
  KL_O_INFLIGHT,
  KL_O_INFLIGHT_BYTES,
  KL_O_PIPELINE,
  KL_O_OUTPUT,
  KL_O_TOPICS,
  KL_O_IDLE,
  KL_O_REQUEST,
  KL_O_PRODUCE,
  KL_O_DRAIN,
  KL_O_ORIGIN,
  KL_O_TOPICS_ALLOWED,
  KL_O_INTERNAL,
  KL_O_TOPIC_IDLE
};

static const struct option kl_gw_longopts[] = {
    {"listen", required_argument, NULL, KL_O_LISTEN},
    {"bootstrap", required_argument, NULL, 'b'},
    {"embedded", no_argument, NULL, KL_O_EMBEDDED},
    {"topic", required_argument, NULL, 't'},
    {"partitions", required_argument, NULL, KL_O_PARTITIONS},
    {"brokers", required_argument, NULL, KL_O_BROKERS},
    {"tokens-file", required_argument, NULL, KL_O_TOKENS},
    {"max-connections", required_argument, NULL, KL_O_CONNS},
    {"max-header", required_argument, NULL, KL_O_HEADER},
    {"max-body", required_argument, NULL, KL_O_BODY},
    {"max-inflight", required_argument, NULL, KL_O_INFLIGHT},
    {"max-inflight-bytes", required_argument, NULL, KL_O_INFLIGHT_BYTES},
    {"max-pipeline", required_argument, NULL, KL_O_PIPELINE},
    {"max-output", required_argument, NULL, KL_O_OUTPUT},
    {"max-topics", required_argument, NULL, KL_O_TOPICS},
    {"idle-timeout", required_argument, NULL, KL_O_IDLE},
    {"request-timeout", required_argument, NULL, KL_O_REQUEST},
    {"produce-timeout", required_argument, NULL, KL_O_PRODUCE},
    {"drain-timeout", required_argument, NULL, KL_O_DRAIN},
    {"allow-origin", required_argument, NULL, KL_O_ORIGIN},
    {"allow-topics", required_argument, NULL, KL_O_TOPICS_ALLOWED},
    {"allow-internal-topics", no_argument, NULL, KL_O_INTERNAL},
    {"topic-idle", required_argument, NULL, KL_O_TOPIC_IDLE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* One flag's value into cli; @returns a usage exit code, or 0. */
static int gw_flag(kl__gw_cli_t *cli, int c, const char *arg) {
  kl__gateway_opts_t *o = &cli->opts;
  int64_t size = 0;
  long n = 0;
  int rc = 0;
  switch (c) {
  case KL_O_LISTEN:
    o->listen = arg;
    break;
  case 'b':
    cli->bootstrap = arg;
    break;
  case KL_O_EMBEDDED:
    cli->embedded = 1;
    break;
  case 't':
    cli->topic = arg;
    break;
  case KL_O_PARTITIONS:
    rc = gw_count("--partitions", arg, 100000, &cli->partitions);
    break;
  case KL_O_BROKERS:
    rc = gw_count("--brokers", arg, 16, &cli->brokers);
    break;
  case KL_O_TOKENS:
    o->tokens_file = arg;
    break;
  case KL_O_CONNS:
    rc = gw_count("--max-connections", arg, 1000000, &n);
    o->max_connections = (size_t)n;
    break;
  case KL_O_HEADER:
    rc = gw_size("--max-header", arg, &size);
    o->max_header = (size_t)size;
    break;
  case KL_O_BODY:
    rc = gw_size("--max-body", arg, &size);
    o->max_body = (size_t)size;
    break;
  case KL_O_INFLIGHT:
    rc = gw_count("--max-inflight", arg, 10000000, &n);
    o->max_inflight = n;
    break;
  case KL_O_INFLIGHT_BYTES:
    rc = gw_size("--max-inflight-bytes", arg, &o->max_inflight_bytes);
    break;
  case KL_O_PIPELINE:
    rc = gw_count("--max-pipeline", arg, 100000, &n);
    o->max_pipeline = (size_t)n;
    break;
  case KL_O_OUTPUT:
    rc = gw_size("--max-output", arg, &size);
    o->max_output = (size_t)size;
    break;
  case KL_O_TOPICS:
    rc = gw_count("--max-topics", arg, 100000, &n);
    o->max_topics = (size_t)n;
    break;
  case KL_O_IDLE:
    rc = gw_duration("--idle-timeout", arg, &o->idle_timeout_ms);
    break;
  case KL_O_REQUEST:
    rc = gw_duration("--request-timeout", arg, &o->request_timeout_ms);
    break;
  case KL_O_PRODUCE:
    rc = gw_duration("--produce-timeout", arg, &o->produce_timeout_ms);
    break;
  case KL_O_DRAIN:
    rc = gw_duration("--drain-timeout", arg, &o->drain_timeout_ms);
    break;
  case KL_O_ORIGIN:
    o->allow_origins = arg;
    break;
  case KL_O_TOPICS_ALLOWED:
    o->allow_topics = arg;
    break;
  case KL_O_INTERNAL:
    o->allow_internal_topics = true;
    break;
  case KL_O_TOPIC_IDLE:
    rc = gw_duration("--topic-idle", arg, &o->topic_idle_ms);
    break;
  case 'X':
    rc = kl__cli_conf_x(KL_GW_SUB, cli->conf, arg) ? KL_EXIT_USAGE : 0;
    break;
  default:
    rc = kl__cli_usage(KL_GW_SUB, "unknown flag");
  }
  return rc;
}

/* @returns KL_EXIT_OK to run, -1 after --help, or a usage exit code. */
static int gw_parse(int argc, char **argv, kl__gw_cli_t *cli) {
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "b:t:X:h", kl_gw_longopts, NULL)) != -1) {
    if (c == 'h') {
      gw_help();
      return -1;
    }
    int rc = gw_flag(cli, c, optarg);
    if (rc)
      return rc;
  }
  if (optind < argc)
    return kl__cli_usage(KL_GW_SUB, "unexpected argument \"%s\"", argv[optind]);
  if (!cli->bootstrap == !cli->embedded)
    return kl__cli_usage(KL_GW_SUB, "give the Kafka cluster: -b HOST:PORT "
                                    "or --embedded (not both)");
  return KL_EXIT_OK;
}

static int gw_serve(kl__gw_cli_t *cli, const char *bootstrap) {
  kl__gateway_t *gw;
  if (kl__cli_conf_set(KL_GW_SUB, cli->conf, "kafka.bootstrap.servers",
                       bootstrap))
    return KL_EXIT_USAGE;
  cli->opts.stop_flag = &kl__cli_stop;
  kl_err_t err = kl__gateway_new(cli->conf, &cli->opts, &gw);
  if (err)
    return err == KL_ECONF ? kl__cli_usage(KL_GW_SUB, "%s", kl_err_detail())
                           : kl__cli_fail(KL_GW_SUB, "%s", kl_err_detail());
  const char *colon = strrchr(cli->opts.listen, ':');
  printf("listening=%.*s:%d\n", (int)(colon - cli->opts.listen),
         cli->opts.listen, kl__gateway_port(gw));
  fflush(stdout);
  err = kl__gateway_run(gw);
  kl__gateway_destroy(gw);
  KL_LOG_I("gateway", "stopped");
  return err ? KL_EXIT_FAIL : KL_EXIT_OK;
}

static int gw_run(kl__gw_cli_t *cli) {
  kl__cli_on_signals(); /* before anything starts: no early-signal race */
  if (!cli->embedded)
    return gw_serve(cli, cli->bootstrap);
  kl_embedded_t *embedded;
  if (kl_embedded_new((int)cli->brokers, cli->topic, (int32_t)cli->partitions,
                      &embedded))
    return kl__cli_fail(KL_GW_SUB, "cannot start the embedded cluster: %s",
                        kl_err_detail());
  printf("bootstrap=%s\n", kl_embedded_bootstrap(embedded));
  int rc = gw_serve(cli, kl_embedded_bootstrap(embedded));
  kl_embedded_destroy(embedded);
  return rc;
}

bool kl__broker_gateway_wanted(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--"))
      break;
    const char *a = argv[i];
    if (!strcmp(a, "--listen") || !strncmp(a, "--listen=", 9) ||
        !strcmp(a, "--bootstrap") || !strncmp(a, "--bootstrap=", 12) ||
        !strncmp(a, "-b", 2))
      return true;
  }
  return false;
}

int kl__cmd_broker_gateway(int argc, char **argv) {
  kl__gw_cli_t cli = {.topic = "events", .partitions = 8, .brokers = 3};
  kl__gateway_opts_default(&cli.opts);
  if (!(cli.conf = kl_conf_new()))
    return kl__cli_fail(KL_GW_SUB, "out of memory");
  int rc = gw_parse(argc, argv, &cli);
  if (rc == KL_EXIT_OK)
    rc = gw_run(&cli);
  kl_conf_destroy(cli.conf);
  return rc < 0 ? KL_EXIT_OK : rc;
}
