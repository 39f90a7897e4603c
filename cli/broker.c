/*
 * keylane broker: the publish side as a service.
 *
 * Modes (one per run):
 * - --embedded: an embedded Kafka-protocol cluster (librdkafka's mock
 *   cluster) in the foreground, for `keylane demo`, tests and laptops.
 * - the HTTP publish gateway (--listen or -b): cli/broker_gateway.c, which
 *   has its own flags and help; with --embedded too it starts both.
 * Each mode has its own options struct and run function; main() parses
 * flags into kl_broker_opts_t and dispatches.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/broker_gateway.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "common/log.h"
#include "keylane/embedded.h"

#define KL_BROKER_SUB "broker"

typedef struct kl_broker_opts {
  kl__broker_embedded_t e;    /* --embedded, -t, --partitions, --brokers */
  const char *bootstrap_file; /* --bootstrap-file */
} kl_broker_opts_t;

static const kl__opt_t broker_opts[] = {
    KL__BROKER_EMBEDDED_OPTS(kl_broker_opts_t, e, ""),
    {.name = "bootstrap-file",
     .kind = KL__OPT_STRING,
     .meta = "F",
     .off = offsetof(kl_broker_opts_t, bootstrap_file),
     .help = "also write the bootstrap= line to F, atomically (written "
             "whole or not at all); removed at exit"},
    {0}};

static const kl__cmd_t broker_cmd = {
    .name = KL_BROKER_SUB,
    .usage = "--embedded [-t TOPIC] [--partitions N] [--brokers N] "
             "[--bootstrap-file F]",
    .about = "--embedded runs an embedded Kafka-protocol cluster (librdkafka's "
             "mock\n"
             "cluster) in the foreground: TCP listeners on 127.0.0.1 that any "
             "Kafka\n"
             "client can use, with topics, consumer groups and offsets in "
             "memory.\n"
             "Nothing survives the process. Not for production.\n"
             "\n"
             "The first stdout line is bootstrap=HOST:PORT[,HOST:PORT...]; it "
             "serves\n"
             "until SIGINT or SIGTERM, then exits 0.\n",
    .opts = broker_opts,
    .notes =
        "With --listen ADDR:PORT (and -b BOOTSTRAP or --embedded) it is the\n"
        "HTTP publish gateway; 'keylane broker --listen 127.0.0.1:8080 "
        "--help'\n"
        "describes it.\n"
        "\n"
        "Other topics are created on first use by a producer, with 4\n"
        "partitions (the mock cluster's default).\n",
    .examples = "  keylane broker --embedded\n"
                "  keylane broker --embedded -t orders --partitions 12 \\\n"
                "      --bootstrap-file /tmp/keylane.bootstrap &\n"
                "  keylane publish -b \"$(sed 's/^bootstrap=//' "
                "/tmp/keylane.bootstrap)\" -t orders\n"};

/* Write-then-rename, so a reader polling for the file never sees half. */
static int broker_write_file(const char *path, const char *line) {
  char tmp[4096];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >=
      (int)sizeof(tmp))
    return kl__cli_usage(KL_BROKER_SUB, "--bootstrap-file path is too long");
  FILE *f = fopen(tmp, "w");
  if (!f)
    return kl__cli_fail(KL_BROKER_SUB, "cannot write %s: %s", tmp,
                        strerror(errno));
  int ok = fputs(line, f) >= 0;
  ok = (fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return kl__cli_fail(KL_BROKER_SUB, "cannot write %s: %s", path,
                        strerror(e));
  }
  return KL_EXIT_OK;
}

static void broker_wait_for_signal(void) {
  while (!kl__cli_stop)
    poll(NULL, 0, 200); /* a signal cuts the wait short */
}

static int broker_run_embedded(const kl_broker_opts_t *opts) {
  kl_embedded_t *embedded;
  kl__cli_on_signals(); /* before the cluster exists: no early-signal race */
  kl_err_t err = kl_embedded_new((int)opts->e.brokers, opts->e.topic,
                                 (int32_t)opts->e.partitions, &embedded);
  if (err == KL_EINVAL) /* a flag's value: say so as a usage error */
    return kl__cli_usage(KL_BROKER_SUB, "%s", kl_err_detail());
  if (err)
    return kl__cli_fail(KL_BROKER_SUB,
                        "cannot start the embedded cluster: "
                        "%s",
                        kl_err_detail());
  char line[4096];
  snprintf(line, sizeof(line), "bootstrap=%s\n",
           kl_embedded_bootstrap(embedded));
  int rc = KL_EXIT_OK;
  if (opts->bootstrap_file)
    rc = broker_write_file(opts->bootstrap_file, line);
  if (rc == KL_EXIT_OK) {
    fputs(line, stdout);
    fflush(stdout);
    KL_LOG_I("broker",
             "embedded cluster up: %d brokers, topic %s with %d "
             "partitions; stop with SIGINT or SIGTERM",
             (int)opts->e.brokers, opts->e.topic, (int)opts->e.partitions);
    broker_wait_for_signal();
    KL_LOG_I("broker", "stopping the embedded cluster");
    if (opts->bootstrap_file)
      unlink(opts->bootstrap_file);
  }
  kl_embedded_destroy(embedded);
  return rc;
}

int kl__cmd_broker(int argc, char **argv) {
  if (kl__broker_gateway_wanted(argc, argv)) /* --listen or -b */
    return kl__cmd_broker_gateway(argc, argv);
  kl_broker_opts_t opts = {0};
  int first;
  int rc = kl__opts_parse(&broker_cmd, argc, argv, &opts, NULL, &first);
  if (rc >= 0)
    return rc;
  if (!opts.e.embedded)
    return kl__cli_usage(KL_BROKER_SUB,
                         "pass --embedded to run the embedded cluster, or "
                         "--listen ADDR:PORT -b BOOTSTRAP for the HTTP "
                         "publish gateway");
  return broker_run_embedded(&opts);
}
