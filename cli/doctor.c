/*
 * keylane doctor: every check of the environment keylane's guarantees rest
 * on (worker/checks.h, worker/checks_log.h), run on demand, one line each,
 * with the fix. It only reads: no group is joined, nothing is committed.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/doctor_run.h"

#define SUB "doctor"

static const char kl_doctor_usage[] =
    "usage: keylane doctor -b BOOTSTRAP -t TOPIC [--store STORE] [--json]\n"
    "                      [--sample N] [options]\n\n"
    "Checks, before a fleet starts or while it runs, what keylane's\n"
    "guarantees rest on, and prints one line per check:\n"
    "  OK|WARN|FAIL CHECK: what was found, and for WARN and FAIL the fix\n"
    "WARN: it could not tell, or it holds but is fragile; FAIL: it does not\n"
    "hold. The checks:\n"
    "  partitions       TOPIC's partition count against --partitions\n"
    "  routing          the last --sample records of each partition: is\n"
    "                   each key on the partition murmur2 routes it to?\n"
    "                   If not, which partitioner put it there, and the fix\n"
    "  dlq              the dead-letter topic exists\n"
    "  retention        TOPIC's retention.ms within store.dedup.retention\n"
    "  dlq-retention    the same for the dead-letter topic\n"
    "  replication      replication factor and min.insync.replicas (acks=all\n"
    "                   with min.insync.replicas below 2 is not durable)\n"
    "  dlq-replication  the same for the dead-letter topic\n"
    "with --store:\n"
    "  store-version    the store's format or schema version\n"
    "  log              each partition's log holds the store's watermark:\n"
    "                   it did not go backwards, lost nothing to retention\n"
    "  epochs           the store's owner epochs against those the group\n"
    "                   committed with its offsets (keylane.epoch=E)\n"
    "  clock            PostgreSQL: this host's clock within 1 s of the\n"
    "                   server's\n\n"
    "  -b, --bootstrap HOST:PORT   Kafka bootstrap servers\n"
    "  -t, --topic TOPIC           the fleet's topic\n"
    "  -g, --group GROUP           the fleet's consumer group (default\n"
    "                              keylane), for the epochs\n"
    "      --store STORE           LMDB directory or postgresql://... URI\n"
    "                              (never created)\n"
    "      --partitions N          the partition count the fleet expects\n"
    "                              (default: any)\n"
    "      --dedup-retention DUR   the fleet's store.dedup.retention (7d)\n"
    "      --dlq-topic TOPIC       dead-letter topic (default TOPIC.dlq)\n"
    "      --sample N              records read per partition (1000)\n"
    "      --json                  one JSON object: {\"topic\", \"status\",\n"
    "                              \"checks\": [{\"check\", \"status\",\n"
    "                              \"message\"}]}\n"
    "  -X, --set NAME=VALUE        keylane or librdkafka (kafka.NAME) setting\n"
    "  -h, --help                  this text\n\n"
    "Exit 0 when no check FAILs (WARNs included), 1 when one does, 2 on bad\n"
    "usage.\n\n"
    "examples:\n"
    "  keylane doctor -b kafka:9092 -t events\n"
    "  keylane doctor -b kafka:9092 -t events -g ledger --partitions 12 \\\n"
    "      --store postgresql://kl@db/kl --json\n";

typedef struct kl_doctor_cli {
  kl_conf_t *conf;
  kl__doctor_opts_t opts;
  int64_t sample;
} kl_doctor_cli_t;

/* One option; @returns -1 to go on, else the exit code. */
static int doctor_opt(kl_doctor_cli_t *d, int c) {
  static const struct {
    int opt;
    const char *flag, *key;
  } keyed[] = {{'b', "-b", "kafka.bootstrap.servers"},
               {'g', "--group", "worker.group"},
               {'P', "--partitions", "worker.expect.partitions"},
               {'R', "--dedup-retention", "store.dedup.retention"},
               {'Q', "--dlq-topic", "worker.dlq.topic"}};
  for (size_t i = 0; i < sizeof(keyed) / sizeof(keyed[0]); i++)
    if (keyed[i].opt == c)
      return kl__cli_conf_flag(SUB, d->conf, keyed[i].flag, keyed[i].key,
                               optarg)
                 ? KL_EXIT_USAGE
                 : -1;
  switch (c) {
  case 't':
    d->opts.topic = optarg;
    return -1;
  case 's':
    d->opts.location = optarg;
    return -1;
  case 'j':
    d->opts.json = 1;
    return -1;
  case 'n':
    return kl__cli_units(SUB, "--sample", optarg, KL__UNITS_COUNT, 1, 100000,
                         &d->sample)
               ? KL_EXIT_USAGE
               : -1;
  case 'X':
    return kl__cli_conf_x(SUB, d->conf, optarg) ? KL_EXIT_USAGE : -1;
  case 'h':
    fputs(kl_doctor_usage, stdout);
    return KL_EXIT_OK;
  default:
    return kl__cli_usage(SUB, "unknown option; see --help");
  }
}

static int doctor_main(kl_doctor_cli_t *d) {
  kl__check_status_t worst;
  d->opts.conf = d->conf;
  d->opts.sample = (size_t)d->sample;
  d->opts.stop = &kl__cli_stop;
  kl__cli_on_signals();
  if (kl__doctor_run(&d->opts, stdout, &worst))
    return kl__cli_fail(SUB, "%s", kl_err_detail());
  return worst == KL__CHECK_FAIL ? KL_EXIT_FAIL : KL_EXIT_OK;
}

int kl__cmd_doctor(int argc, char **argv) {
  static const struct option opts[] = {
      {"bootstrap", required_argument, NULL, 'b'},
      {"topic", required_argument, NULL, 't'},
      {"group", required_argument, NULL, 'g'},
      {"store", required_argument, NULL, 's'},
      {"partitions", required_argument, NULL, 'P'},
      {"dedup-retention", required_argument, NULL, 'R'},
      {"dlq-topic", required_argument, NULL, 'Q'},
      {"sample", required_argument, NULL, 'n'},
      {"json", no_argument, NULL, 'j'},
      {"set", required_argument, NULL, 'X'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  kl_doctor_cli_t d = {.conf = kl_conf_new(), .sample = KL__DOCTOR_SAMPLE};
  int c, rc = d.conf ? -1 : kl__cli_fail(SUB, "out of memory");
  optind = 1;
  while (rc < 0 && (c = getopt_long(argc, argv, "b:t:g:X:h", opts, NULL)) != -1)
    rc = doctor_opt(&d, c);
  if (rc < 0 && kl__cli_conf_set(SUB, d.conf, "store.create", "no"))
    rc = KL_EXIT_FAIL;
  if (rc < 0) {
    if (optind < argc)
      rc = kl__cli_usage(SUB, "unexpected argument \"%s\"", argv[optind]);
    else if (!kl_conf_get(d.conf, "kafka.bootstrap.servers"))
      rc = kl__cli_usage(SUB, "-b BOOTSTRAP is required");
    else if (!d.opts.topic)
      rc = kl__cli_usage(SUB, "-t TOPIC is required");
    else
      rc = doctor_main(&d);
  }
  kl_conf_destroy(d.conf);
  return rc;
}
