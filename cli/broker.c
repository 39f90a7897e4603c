/*
 * keylane broker: the publish side as a service.
 *
 * Modes (one per run):
 * - --embedded: an embedded Kafka-protocol cluster (librdkafka's mock
 *   cluster) in the foreground, for `keylane demo`, tests and laptops.
 * - the HTTP publish gateway (--listen or -b): cli/gateway.c, which
 *   has its own flags and help; with --embedded too it starts both.
 * Each mode has its own options struct and run function; main() parses
 * flags into kl_broker_opts_t and dispatches.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gateway.h"
#include "cli/cli.h"
#include "common/log.h"
#include "keylane/embedded.h"

#define KL_BROKER_SUB "broker"

typedef struct kl_broker_opts {
  int embedded;               /* --embedded: run the mock cluster */
  const char *topic;          /* -t */
  int32_t partitions;         /* --partitions */
  int brokers;                /* --brokers */
  const char *bootstrap_file; /* --bootstrap-file */
} kl_broker_opts_t;

static void broker_help(void) {
  printf(
      "usage: keylane broker --embedded [-t TOPIC] [--partitions N]\n"
      "                      [--brokers N] [--bootstrap-file F]\n"
      "\n"
      "--embedded runs an embedded Kafka-protocol cluster (librdkafka's mock\n"
      "cluster) in the foreground: TCP listeners on 127.0.0.1 that any Kafka\n"
      "client can use, with topics, consumer groups and offsets in memory.\n"
      "Nothing survives the process. Not for production.\n"
      "\n"
      "The first stdout line is bootstrap=HOST:PORT[,HOST:PORT...]; it serves\n"
      "until SIGINT or SIGTERM, then exits 0.\n"
      "\n"
      "flags:\n"
      "  --embedded          run the embedded cluster\n"
      "  -t, --topic TOPIC   topic to create (default events)\n"
      "  --partitions N      its partition count, 1..100000 (default 8)\n"
      "  --brokers N         brokers in the cluster, 1..16 (default 3)\n"
      "  --bootstrap-file F  also write the bootstrap= line to F, atomically\n"
      "                      (written whole or not at all); removed at exit\n"
      "  -h, --help          this text\n"
      "\n"
      "With --listen ADDR:PORT (and -b BOOTSTRAP or --embedded) it is the\n"
      "HTTP publish gateway; 'keylane broker --listen 127.0.0.1:8080 --help'\n"
      "describes it.\n"
      "\n"
      "Other topics are created on first use by a producer, with 4\n"
      "partitions (the mock cluster's default).\n"
      "\n"
      "examples:\n"
      "  keylane broker --embedded\n"
      "  keylane broker --embedded -t orders --partitions 12 \\\n"
      "      --bootstrap-file /tmp/keylane.bootstrap &\n"
      "  keylane publish -b \"$(sed 's/^bootstrap=//' /tmp/keylane.bootstrap)\""
      " -t orders\n");
}

static int broker_int(const char *flag, const char *arg, long min, long max,
                      long *out) {
  int64_t v = 0;
  int rc =
      kl__cli_units(KL_BROKER_SUB, flag, arg, KL__UNITS_COUNT, min, max, &v);
  *out = rc ? *out : (long)v;
  return rc;
}

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
  kl_err_t err =
      kl_embedded_new(opts->brokers, opts->topic, opts->partitions, &embedded);
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
             opts->brokers, opts->topic, (int)opts->partitions);
    broker_wait_for_signal();
    KL_LOG_I("broker", "stopping the embedded cluster");
    if (opts->bootstrap_file)
      unlink(opts->bootstrap_file);
  }
  kl_embedded_destroy(embedded);
  return rc;
}

/* Returns KL_EXIT_OK to run, -1 after --help, or a usage exit code. */
static int broker_parse(int argc, char **argv, kl_broker_opts_t *opts) {
  static const struct option longopts[] = {
      {"embedded", no_argument, NULL, 'E'},
      {"topic", required_argument, NULL, 't'},
      {"partitions", required_argument, NULL, 'P'},
      {"brokers", required_argument, NULL, 'B'},
      {"bootstrap-file", required_argument, NULL, 'F'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  long v;
  int c;
  while ((c = getopt_long(argc, argv, "t:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h':
      broker_help();
      return -1;
    case 'E':
      opts->embedded = 1;
      break;
    case 't':
      opts->topic = optarg;
      break;
    case 'P':
      if (broker_int("--partitions", optarg, 1, 100000, &v))
        return KL_EXIT_USAGE;
      opts->partitions = (int32_t)v;
      break;
    case 'B':
      if (broker_int("--brokers", optarg, 1, 16, &v))
        return KL_EXIT_USAGE;
      opts->brokers = (int)v;
      break;
    case 'F':
      opts->bootstrap_file = optarg;
      break;
    default:
      return kl__cli_usage(KL_BROKER_SUB, "unknown flag");
    }
  }
  if (optind < argc)
    return kl__cli_usage(KL_BROKER_SUB, "unexpected argument \"%s\"",
                         argv[optind]);
  return KL_EXIT_OK;
}

int kl__cmd_broker(int argc, char **argv) {
  if (kl__broker_gateway_wanted(argc, argv)) /* --listen or -b */
    return kl__cmd_broker_gateway(argc, argv);
  kl_broker_opts_t opts = {.topic = "events", .partitions = 8, .brokers = 3};
  int rc = broker_parse(argc, argv, &opts);
  if (rc != KL_EXIT_OK)
    return rc < 0 ? KL_EXIT_OK : rc;
  if (!opts.embedded)
    return kl__cli_usage(KL_BROKER_SUB,
                         "pass --embedded to run the embedded cluster, or "
                         "--listen ADDR:PORT -b BOOTSTRAP for the HTTP "
                         "publish gateway");
  return broker_run_embedded(&opts);
}
