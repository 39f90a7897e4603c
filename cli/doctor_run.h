/*
 * keylane doctor: runs every check of the environment keylane's
 * guarantees rest on (worker/checks.h, worker/checks_log.h) against one
 * topic, and prints one line per check, "OK|WARN|FAIL CHECK: message"
 * (the message names the fix), or one JSON object. The command line is
 * cli/doctor.c; this is its run, callable from a test.
 *
 * Checks, in order: partitions, routing (a sample of each partition's
 * last records), dlq (the dead-letter topic exists), retention and
 * dlq-retention, timer-retention, replication and dlq-replication; with
 * a store:
 * store-version (or the store's open error), log, epochs, and for
 * PostgreSQL clock. A check that needs what an earlier one could not read
 * (the topic's partition count, the dead-letter topic) is left out.
 *
 * Internal, not installed. Caveats: blocks on Kafka and the store, each
 * check for up to 10 s; it joins no group and commits nothing. The store
 * is opened with @p conf: set store.create=no there so that a typo is an
 * error, not a new store.
 */
#ifndef KEYLANE_CLI_DOCTOR_RUN_H
#define KEYLANE_CLI_DOCTOR_RUN_H

#include <stddef.h>
#include <stdio.h>

#include "keylane/conf.h"
#include "keylane/error.h"
#include "worker/checks.h"

/** Records read per partition by the routing check when none is given. */
#define KL__DOCTOR_SAMPLE 1000

typedef struct kl__doctor_opts {
  /** kafka.* (bootstrap), worker.group, worker.expect.partitions,
   *  store.dedup.retention, worker.dlq.topic and store.* */
  const kl_conf_t *conf;
  const char *topic;
  const char *location; /**< the store; NULL: no store checks */
  size_t sample;        /**< 0: KL__DOCTOR_SAMPLE */
  int json;             /**< one JSON object instead of lines */
  volatile int *stop;   /**< set: the sample stops reading; may be NULL */
} kl__doctor_opts_t;

/**
 * Runs the checks, writing to @p out as they finish (JSON: at the end).
 * @param worst  receives the worst status
 * @returns KL_OK; KL_ECONF or KL_EKAFKA when no Kafka client can be made
 *          (nothing was checked).
 */
kl_err_t kl__doctor_run(const kl__doctor_opts_t *opts, FILE *out,
                        kl__check_status_t *worst);

#endif
