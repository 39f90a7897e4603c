/* keylane worker: one worker process of the fleet. */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/internal.h"
#include "common/log.h"
#include "keylane/worker.h"
#include "handlers/handler.h"
#include "handlers/exec.h"
#include "cli/metrics_server.h"
#include "worker/worker_internal.h"

#define SUB "worker"
#define KL_HANDLER_TIMEOUT_MAX_MS 86400000 /* a day */

static const char kl_worker_usage[] =
    "usage: keylane worker -b BOOTSTRAP -t TOPIC -g GROUP --store STORE\n"
    "                      --handler HANDLER [options]\n\n"
    "Runs one worker of the fleet: owns the partitions the group gives it,\n"
    "applies their events once each, fenced by an owner epoch.\n\n"
    "  -b, --bootstrap HOST:PORT   Kafka bootstrap servers\n"
    "  -t, --topic TOPIC           topic to consume\n"
    "  -g, --group GROUP           consumer group (default keylane)\n"
    "      --store STORE           LMDB directory or postgresql://... URI\n"
    "      --handler HANDLER       ledger | so:PATH[:SYMBOL] | exec:COMMAND\n"
    "      --handler-timeout-ms MS longest handler call, at most half of\n"
    "                              kafka.max.poll.interval.ms (300000);\n"
    "                              exec: the answer timeout (30000;\n"
    "                              30s, 2m: other units)\n"
    "      --metrics-listen ADDR:PORT  serve GET /metrics and /healthz there\n"
    "                              (off by default; e.g. 127.0.0.1:9464);\n"
    "                              /healthz?format=json: Burrow-style\n"
    "                              status per partition\n"
    "      --session-timeout-ms MS group session timeout (default 10000)\n"
    "      --partitions N          refuse to run unless TOPIC has N\n"
    "                              partitions (default: the count at start);\n"
    "                              a change while running stops taking it\n"
    "      --misrouted POLICY      a record whose key routes (murmur2) to\n"
    "                              another partition: dlq (dead-letter it,\n"
    "                              reason misrouted; default) | forward\n"
    "                              (re-publish it to its key's partition) |\n"
    "                              apply (apply it here: producers that all\n"
    "                              use one custom partitioner)\n"
    "      --batch-max N           events per store commit (default 1000)\n"
    "      --durability MODE       full | meta | none (default full)\n"
    "      --dedup-retention DUR   keep idempotency keys DUR (default 7d);\n"
    "                              the worker refuses to run when TOPIC or\n"
    "                              its dead-letter topic keeps records longer\n"
    "                              (retention.ms, read at start); -X\n"
    "                              worker.retention.check=warn runs anyway\n"
    "      --concurrency N         handler threads; one key's events stay in\n"
    "                              order (default 1: the polling thread);\n"
    "                              exec: N children, each with up to\n"
    "                              worker.exec.window (1) events in flight\n"
    "      --retry-initial-ms MS   first backoff after RETRY (default 100)\n"
    "      --retry-max-ms MS       largest backoff (default 10000)\n"
    "      --max-attempts N        handler runs before a dead letter (5)\n"
    "      --dlq-topic TOPIC       dead-letter topic (default TOPIC.dlq)\n"
    "      --kafka-wait DUR        at start, wait this long, with backoff,\n"
    "                              for Kafka to answer for TOPIC (5m; 0:\n"
    "                              try once); /healthz is 503 meanwhile\n"
    "  -X, --set NAME=VALUE        keylane or librdkafka (kafka.NAME) setting\n"
    "  -h, --help                  this text\n\n"
    "Testing:\n"
    "      --pause-on-sigusr1      on SIGUSR1, hold the next batch between\n"
    "                              its handlers and its commit until SIGUSR2\n"
    "                              (at most 60 s): the paused-worker failure,\n"
    "                              on demand\n\n"
    "A partition whose log went backwards (a recreated topic) or lost\n"
    "records to retention before they were applied stops, with an ERROR\n"
    "and /healthz 503; `keylane store reset` starts it again from the log's\n"
    "beginning, and -X worker.on.gap=skip goes on past a retention gap,\n"
    "counting the records lost.\n\n"
    "SIGINT or SIGTERM finish the batch in flight, commit and exit 0.\n\n"
    "example:\n"
    "  keylane worker -b 127.0.0.1:9092 -t events -g ledger \\\n"
    "      --store /var/lib/keylane --handler ledger\n";

static kl_worker_t *kl_the_worker;
static volatile sig_atomic_t kl_pause_armed, kl_pause_resume;

static void worker_on_stop(int sig) {
  (void)sig;
  if (kl_the_worker)
    kl_worker_stop(kl_the_worker);
}

static void on_usr1(int sig) {
  (void)sig;
  kl_pause_armed = 1;
}

static void on_usr2(int sig) {
  (void)sig;
  kl_pause_resume = 1;
}

/* The seed's failure on demand: a batch held between its handlers and its
 * commit, as a GC pause or a frozen VM holds it, until SIGUSR2 arrives (60 s
 * at most). Whoever sends SIGUSR2 decides when the pause ends: the demo and
 * the tests send it once they have seen a newer owner commit the partition.
 * The hook reads nothing itself: while it holds the batch, this process may
 * be unable to open another store transaction (LMDB cannot adopt a map that
 * another process grew while a snapshot of this one is open), and a paused
 * process learns nothing anyway. */
static void pause_hook(void *opaque, const char *topic, int32_t partition,
                       uint64_t epoch) {
  (void)opaque, (void)topic;
  if (!kl_pause_armed)
    return;
  kl_pause_armed = 0;
  kl_pause_resume = 0;
  KL_LOG_W("worker",
           "pausing partition=%" PRId32 " epoch=%" PRIu64
           " between handler and commit, until SIGUSR2 (60 s at most)",
           partition, epoch);
  for (int i = 0; i < 600 && !kl_pause_resume; i++)
    kl__sleep_ms(100);
  KL_LOG_W("worker",
           "resuming partition=%" PRId32 " epoch=%" PRIu64 " after the pause%s",
           partition, epoch, kl_pause_resume ? "" : " (60 s without SIGUSR2)");
}

/* The test hook of KEYLANE_TEST_EXIT_AFTER_COMMIT=CODE: the process ends
 * with CODE right after its first store commit that wrote follow-ups,
 * before any is published, as a crash there would end it. */
static void exit_after_commit(void *opaque, const char *topic,
                              int32_t partition, uint64_t epoch) {
  KL_LOG_W("worker",
           "exiting after the commit of partition=%" PRId32 " epoch=%" PRIu64
           " topic=%s, before its follow-ups are "
           "published (KEYLANE_TEST_EXIT_AFTER_COMMIT)",
           partition, epoch, topic);
  _exit(*(const int *)opaque);
}

typedef struct kl_worker_opts {
  const char *metrics_listen; /* NULL: no metrics server */
  int handler_timeout_ms;     /* 0: the exec handler's default */
  int pause_on_usr1;
} kl_worker_opts_t;

static int worker_main(kl_conf_t *conf, const char *topic, const char *location,
                       const char *handler_spec, const kl_worker_opts_t *opts) {
  kl_handler_ref_t handler;
  if (kl__handler_resolve(handler_spec, &handler))
    return kl__cli_usage(SUB, "%s", kl_err_detail());
  /* One timeout: the exec child's, and the bound kl_worker_new() checks
   * against kafka.max.poll.interval.ms (for any handler it is given to). */
  int64_t timeout_ms = opts->handler_timeout_ms
                           ? opts->handler_timeout_ms
                           : kl__conf_int(conf, "worker.handler.timeout.ms");
  if (!timeout_ms && handler.fn == kl__exec_handler)
    timeout_ms = KL_EXEC_TIMEOUT_MS;
  char timeout[24];
  snprintf(timeout, sizeof(timeout), "%" PRId64, timeout_ms);
  if (kl__cli_conf_set(SUB, conf, "worker.handler.timeout.ms", timeout)) {
    kl__handler_release(&handler);
    return KL_EXIT_USAGE;
  }
  if (handler.fn == kl__exec_handler) {
    kl__exec_set_timeout_ms(handler.opaque, (int)timeout_ms);
    if (kl__exec_configure(handler.opaque, conf)) {
      kl__handler_release(&handler);
      return kl__cli_fail(SUB, "%s", kl_err_detail());
    }
  }
  kl_store_t *store;
  kl_err_t err = kl_store_open(location, conf, &store);
  if (err) {
    kl__handler_release(&handler);
    return kl__cli_fail(SUB, "cannot open the store %s: %s", location,
                        kl_err_detail());
  }
  if (kl__handler_check_store(&handler, handler_spec, store)) {
    int rc = kl__cli_usage(SUB, "%s", kl_err_detail());
    kl_store_destroy(store);
    kl__handler_release(&handler);
    return rc;
  }
  kl_worker_t *worker;
  err = kl_worker_new(conf, topic, store, handler.fn, handler.opaque, &worker);
  int rc = KL_EXIT_OK;
  if (err) {
    rc = kl__cli_fail(SUB, "%s", kl_err_detail());
  } else {
    kl__metrics_server_t *metrics = NULL;
    if (opts->metrics_listen &&
        kl__metrics_server_start(opts->metrics_listen, conf, topic, worker,
                                 store, &metrics) != KL_OK) {
      rc = kl__cli_fail(SUB, "%s", kl_err_detail());
      kl_worker_destroy(worker);
      kl_store_destroy(store);
      kl__handler_release(&handler);
      return rc;
    }
    static int exit_code;
    const char *exit_env = getenv("KEYLANE_TEST_EXIT_AFTER_COMMIT");
    if (exit_env && (exit_code = atoi(exit_env)) > 0)
      kl__worker_set_after_commit(worker, exit_after_commit, &exit_code);
    if (opts->pause_on_usr1) {
      kl__worker_set_before_commit(worker, pause_hook, NULL);
      signal(SIGUSR1, on_usr1);
      signal(SIGUSR2, on_usr2);
    }
    kl_the_worker = worker;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = worker_on_stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    err = kl_worker_run(worker);
    kl_worker_stats_t st;
    kl_worker_stats(worker, &st);
    KL_LOG_I("worker",
             "stopped: applied=%" PRIu64 " duplicates=%" PRIu64
             " redelivered=%" PRIu64 " batches=%" PRIu64 " fenced=%" PRIu64,
             st.applied, st.duplicates, st.redelivered, st.batches, st.fenced);
    if (err)
      rc = kl__cli_fail(SUB, "%s", kl_err_detail());
    kl_the_worker = NULL;
    kl__metrics_server_stop(metrics);
    kl_worker_destroy(worker);
  }
  kl_store_destroy(store);
  kl__handler_release(&handler);
  return rc;
}

/* The long name of option @p c, for messages. */
static const char *worker_flag_name(const struct option *opts, int c) {
  for (; opts->name; opts++)
    if (opts->val == c)
      return opts->name;
  return "?";
}

int kl__cmd_worker(int argc, char **argv) {
  static const struct option opts[] = {
      {"bootstrap", required_argument, NULL, 'b'},
      {"topic", required_argument, NULL, 't'},
      {"group", required_argument, NULL, 'g'},
      {"store", required_argument, NULL, 's'},
      {"handler", required_argument, NULL, 'H'},
      {"session-timeout-ms", required_argument, NULL, 'S'},
      {"partitions", required_argument, NULL, 'P'},
      {"batch-max", required_argument, NULL, 'B'},
      {"durability", required_argument, NULL, 'D'},
      {"dedup-retention", required_argument, NULL, 'R'},
      {"concurrency", required_argument, NULL, 'C'},
      {"retry-initial-ms", required_argument, NULL, 'I'},
      {"retry-max-ms", required_argument, NULL, 'M'},
      {"max-attempts", required_argument, NULL, 'A'},
      {"dlq-topic", required_argument, NULL, 'Q'},
      {"misrouted", required_argument, NULL, 'W'},
      {"set", required_argument, NULL, 'X'},
      {"pause-on-sigusr1", no_argument, NULL, 'U'},
      {"metrics-listen", required_argument, NULL, 'L'},
      {"handler-timeout-ms", required_argument, NULL, 'T'},
      {"kafka-wait", required_argument, NULL, 'K'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  static const struct {
    int opt;
    const char *key;
  } keyed[] = {
      {'b', "kafka.bootstrap.servers"},   {'g', "worker.group"},
      {'S', "worker.session.timeout.ms"}, {'P', "worker.expect.partitions"},
      {'B', "worker.batch.max"},          {'D', "store.durability"},
      {'R', "store.dedup.retention"},     {'C', "worker.concurrency"},
      {'I', "worker.retry.initial.ms"},   {'M', "worker.retry.max.ms"},
      {'A', "worker.max.attempts"},       {'Q', "worker.dlq.topic"},
      {'K', "worker.kafka.wait"},

      {'W', "worker.misrouted"}};
  kl_conf_t *conf = kl_conf_new();
  const char *topic = NULL, *location = NULL, *handler = NULL;
  kl_worker_opts_t wopts = {NULL, 0, 0};
  int c, rc = -1;
  int64_t timeout_ms = 0;
  optind = 1;
  while (rc < 0 &&
         (c = getopt_long(argc, argv, "b:t:g:X:h", opts, NULL)) != -1) {
    size_t i;
    for (i = 0; i < sizeof(keyed) / sizeof(keyed[0]); i++)
      if (keyed[i].opt == c) {
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", worker_flag_name(opts, c));
        if (kl__cli_conf_flag(SUB, conf, flag, keyed[i].key, optarg))
          rc = KL_EXIT_USAGE;
        break;
      }
    if (i < sizeof(keyed) / sizeof(keyed[0]))
      continue;
    switch (c) {
    case 't':
      topic = optarg;
      break;
    case 's':
      location = optarg;
      break;
    case 'H':
      handler = optarg;
      break;
    case 'U':
      wopts.pause_on_usr1 = 1;
      break;
    case 'L':
      wopts.metrics_listen = optarg;
      break;
    case 'T':
      if (kl__cli_units(SUB, "--handler-timeout-ms", optarg, KL__UNITS_MS, 1,
                        KL_HANDLER_TIMEOUT_MAX_MS, &timeout_ms))
        rc = KL_EXIT_USAGE;
      wopts.handler_timeout_ms = (int)timeout_ms;
      break;
    case 'X':
      if (kl__cli_conf_x(SUB, conf, optarg))
        rc = KL_EXIT_USAGE;
      break;
    case 'h':
      fputs(kl_worker_usage, stdout);
      rc = KL_EXIT_OK;
      break;
    default:
      rc = kl__cli_usage(SUB, "unknown option");
      break;
    }
  }
  if (rc < 0) {
    if (optind < argc)
      rc = kl__cli_usage(SUB, "unexpected argument \"%s\"", argv[optind]);
    else if (!kl_conf_get(conf, "kafka.bootstrap.servers"))
      rc = kl__cli_usage(SUB, "-b BOOTSTRAP is required");
    else if (!topic)
      rc = kl__cli_usage(SUB, "-t TOPIC is required");
    else if (!location)
      rc = kl__cli_usage(SUB, "--store STORE is required");
    else if (!handler)
      rc = kl__cli_usage(SUB, "--handler is required (ledger or so:PATH)");
    else
      rc = worker_main(conf, topic, location, handler, &wopts);
  }
  kl_conf_destroy(conf);
  return rc;
}
