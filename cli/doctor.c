/*
 * keylane doctor: every check of the environment keylane's guarantees rest
 * on (worker/checks.h, worker/checks_log.h), run on demand, one line each,
 * with the fix. It only reads: no group is joined, nothing is committed.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/doctor_run.h"

#define SUB "doctor"

typedef struct kl_doctor_cli {
  kl_conf_t *conf;
  kl__doctor_opts_t opts;
  int64_t sample;
} kl_doctor_cli_t;

_Static_assert(KL__DOCTOR_SAMPLE == 1000, "--sample's .def is 1000");

static const kl__opt_t doctor_opts[] = {
    KL__OPT_BOOTSTRAP(""),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl_doctor_cli_t, opts.topic),
     .required = "",
     .help = "the fleet's topic"},
    {.name = "group",
     .letter = 'g',
     .meta = "GROUP",
     .key = "worker.group",
     .help = "the fleet's consumer group, for the epochs and the owner"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(kl_doctor_cli_t, opts.location),
     .help = "LMDB directory or postgresql://... URI (never created)"},
    {.name = "partitions",
     .key = "worker.expect.partitions",
     .shown = "any",
     .help = "the partition count the fleet expects"},
    {.name = "dedup-retention",
     .key = "store.dedup.retention",
     .help = "the fleet's store.dedup.retention"},
    {.name = "dlq-topic",
     .meta = "TOPIC",
     .key = "worker.dlq.topic",
     .shown = "TOPIC.dlq",
     .help = "dead-letter topic"},
    {.name = "sample",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 100000,
     .def = "1000",
     .off = offsetof(kl_doctor_cli_t, sample),
     .help = "records read per partition"},
    {.name = "json",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_doctor_cli_t, opts.json),
     .help = "one JSON object: {\"topic\", \"status\", \"checks\": "
             "[{\"check\", \"status\", \"message\"}]}"},
    {0}};

static const kl__cmd_t doctor_cmd = {
    .name = SUB,
    .usage = "-b BOOTSTRAP -t TOPIC [--store STORE] [--json] [--sample N] "
             "[options]",
    .about =
        "Checks, before a fleet starts or while it runs, what keylane's\n"
        "guarantees rest on, and prints one line per check:\n"
        "  OK|WARN|FAIL CHECK: what was found, and for WARN and FAIL the fix\n"
        "WARN: it could not tell, or it holds but is fragile; FAIL: it does "
        "not\n"
        "hold. The checks:\n"
        "  partitions       TOPIC's partition count against --partitions\n"
        "  routing          the last --sample records of each partition: is\n"
        "                   each key on the partition murmur2 routes it to?\n"
        "                   If not, which partitioner put it there, and the "
        "fix\n"
        "  dlq              the dead-letter topic exists\n"
        "  retention        TOPIC's retention.ms within "
        "store.dedup.retention\n"
        "  dlq-retention    the same for the dead-letter topic\n"
        "  timer-retention  TOPIC keeps records at least timer.max.delay "
        "(else\n"
        "                   `store rebuild` loses the timers that wait "
        "longer)\n"
        "  replication      replication factor and min.insync.replicas "
        "(acks=all\n"
        "                   with min.insync.replicas below 2 is not durable)\n"
        "  dlq-replication  the same for the dead-letter topic\n"
        "with --store:\n"
        "  store-version    the store's format or schema version\n"
        "  owner            the Kafka cluster and group the store records as\n"
        "                   TOPIC's owner against -b's cluster and -g\n"
        "  log              each partition's log holds the store's "
        "watermark:\n"
        "                   it did not go backwards, lost nothing to "
        "retention\n"
        "  epochs           the store's owner epochs against those the group\n"
        "                   committed with its offsets (keylane.epoch=E)\n"
        "  clock            PostgreSQL: this host's clock within 1 s of the\n"
        "                   server's\n",
    .opts = doctor_opts,
    .notes = "Exit 0 when no check FAILs (WARNs included), 1 when one does, 2 "
             "on bad\nusage.\n",
    .examples =
        "  keylane doctor -b kafka:9092 -t events\n"
        "  keylane doctor -b kafka:9092 -t events -g ledger --partitions 12 "
        "\\\n"
        "      --store postgresql://kl@db/kl --json\n",
    .conf = true};

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
  kl_doctor_cli_t d = {.conf = kl_conf_new()};
  int first;
  int rc = d.conf ? kl__opts_parse(&doctor_cmd, argc, argv, &d, d.conf, &first)
                  : kl__cli_fail(SUB, "out of memory");
  if (rc < 0 && kl__cli_conf_set(SUB, d.conf, "store.create", "no"))
    rc = KL_EXIT_FAIL;
  if (rc < 0)
    rc = doctor_main(&d);
  kl_conf_destroy(d.conf);
  return rc;
}
