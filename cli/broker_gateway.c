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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/broker_gateway.h"
#include "broker/gateway.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "common/log.h"
#include "keylane/embedded.h"

#define KL_GW_SUB "broker"

typedef struct kl__gw_cli {
  kl__broker_embedded_t e; /* --embedded, -t, --partitions, --brokers */
  kl_conf_t *conf;         /* the gateway.* keys its flags set, and -X */
  kl__gateway_opts_t opts; /* from conf, once parsed */
} kl__gw_cli_t;

/* Most flags are a gateway.* key: the key's description is their help. */
#define KEYED(flag, conf_key)                                                  \
  { .name = (flag), .key = (conf_key) }

static const kl__opt_t gw_opts[] = {
    {.name = "listen", .meta = "ADDR:PORT", .key = "gateway.listen"},
    KL__OPT_BOOTSTRAP(NULL),
    KL__BROKER_EMBEDDED_OPTS(kl__gw_cli_t, e, "with --embedded: "),
    {.name = "tokens-file", .meta = "FILE", .key = "gateway.tokens.file"},
    KEYED("max-connections", "gateway.max.connections"),
    KEYED("max-header", "gateway.max.header"),
    KEYED("max-body", "gateway.max.body"),
    KEYED("max-inflight", "gateway.max.inflight"),
    KEYED("max-inflight-bytes", "gateway.max.inflight.bytes"),
    KEYED("max-pipeline", "gateway.max.pipeline"),
    KEYED("max-output", "gateway.max.output"),
    KEYED("max-topics", "gateway.max.topics"),
    KEYED("topic-idle", "gateway.topic.idle"),
    {.name = "allow-topics",
     .kind = KL__OPT_LIST,
     .key = "gateway.allow.topics",
     .shown = "any"},
    {.name = "allow-internal-topics",
     .kind = KL__OPT_FLAG,
     .key = "gateway.allow.internal.topics",
     .help = "also TOPIC.dlq and __* (403 otherwise)"},
    KEYED("idle-timeout", "gateway.idle.timeout"),
    KEYED("request-timeout", "gateway.request.timeout"),
    KEYED("produce-timeout", "gateway.produce.timeout"),
    KEYED("drain-timeout", "gateway.drain.timeout"),
    {.name = "allow-origin",
     .kind = KL__OPT_LIST,
     .key = "gateway.allow.origins",
     .shown = "none"},
    {0}};

static const kl__cmd_t gw_cmd = {
    .name = KL_GW_SUB,
    .usage = "--listen ADDR:PORT -b BOOTSTRAP [options]\n"
             "--listen ADDR:PORT --embedded [-t TOPIC] [--partitions N] "
             "[--brokers N] [options]",
    .about =
        "The HTTP publish gateway: services in any language publish events\n"
        "with one HTTP call whose 200 means \"acknowledged by Kafka with\n"
        "acks=all, on the partition kl_partition() names for the key\".\n"
        "\n"
        "  POST /v1/topics/{topic}/events      Content-Type "
        "application/json\n"
        "                                      (one event or an array) or\n"
        "                                      application/msgpack; each "
        "event:\n"
        "                                      key, type, id?, payload? or\n"
        "                                      payload_b64?, headers?,\n"
        "                                      not_before? (ms since the\n"
        "                                      epoch) or delay? (\"15m\");\n"
        "                                      traceparent/tracestate "
        "headers\n"
        "                                      go into every event's "
        "headers\n"
        "     200 [{\"partition\",\"offset\",\"id\"}] in request order\n"
        "     400 {\"error\",\"index\"} first bad event (no index: the "
        "body as\n"
        "         a whole); nothing was produced\n"
        "     401 no valid bearer token (with --tokens-file)\n"
        "     403 an Origin header not in --allow-origin (a web page)\n"
        "     409 the topic's partition count changed since the gateway "
        "first\n"
        "         served it (or differs from producer.expect.partitions)\n"
        "     415 a Content-Type other than JSON or msgpack\n"
        "     413 body over --max-body, or its events as stored over\n"
        "         --max-inflight-bytes     429 in-flight budget full "
        "(Retry-After)\n"
        "     503 Kafka did not acknowledge in --produce-timeout: retry with\n"
        "         the SAME ids (listed in the answer); workers apply an id "
        "once\n"
        "  GET  /v1/topics/{topic}/route?key=K {\"partition\",\"partitions\"}\n"
        "  GET  /healthz                       200 when Kafka answers and the\n"
        "                                      budget has room, else 503\n"
        "  GET  /metrics                       Prometheus text\n",
    .opts = gw_opts,
    .notes =
        "The limits bound memory whatever clients do; each has a metric,\n"
        "keylane_gateway_limit and keylane_gateway_rejected_total. Each flag\n"
        "but -b and the embedded cluster's is a gateway.* key, which -X sets "
        "too\n"
        "(`keylane config` lists them). The gateway creates no topic (-X\n"
        "allow.auto.create.topics=true would).\n",
    .examples =
        "  keylane broker --listen 127.0.0.1:8080 -b kafka1:9092,kafka2:9092 "
        "\\\n"
        "      --tokens-file /etc/keylane/tokens\n"
        "  curl -H 'Authorization: Bearer $TOKEN' \\\n"
        "      -H 'Content-Type: application/json' \\\n"
        "      -d '{\"key\":\"acct-1\",\"type\":\"credit\",\"payload\":"
        "{\"amount\":5}}' \\\n"
        "      http://127.0.0.1:8080/v1/topics/events/events\n",
    .conf = true};

static int gw_serve(kl__gw_cli_t *cli, const char *bootstrap) {
  kl__gateway_t *gw;
  if (kl__cli_conf_set(KL_GW_SUB, cli->conf, "kafka.bootstrap.servers",
                       bootstrap))
    return KL_EXIT_USAGE;
  kl__gateway_opts_from_conf(&cli->opts, cli->conf);
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
  if (!cli->e.embedded)
    return gw_serve(cli, kl_conf_get(cli->conf, "kafka.bootstrap.servers"));
  kl_embedded_t *embedded;
  if (kl_embedded_new((int)cli->e.brokers, cli->e.topic,
                      (int32_t)cli->e.partitions, &embedded))
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
  kl__gw_cli_t cli = {.conf = kl_conf_new()};
  if (!cli.conf)
    return kl__cli_fail(KL_GW_SUB, "out of memory");
  int first;
  int rc = kl__opts_parse(&gw_cmd, argc, argv, &cli, cli.conf, &first);
  if (rc < 0 &&
      !kl_conf_get(cli.conf, "kafka.bootstrap.servers") == !cli.e.embedded)
    rc = kl__cli_usage(KL_GW_SUB, "give the Kafka cluster: -b HOST:PORT "
                                  "or --embedded (not both)");
  if (rc < 0)
    rc = gw_run(&cli);
  kl_conf_destroy(cli.conf);
  return rc;
}
