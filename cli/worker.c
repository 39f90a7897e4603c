/* keylane worker: one worker process of the fleet. */
#include <stddef.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/log.h"
#include "keylane/worker.h"
#include "handlers/handler.h"
#include "handlers/exec.h"
#include "handlers/exec_spawn.h"
#include "cli/metrics_server.h"
#include "cli/stop_guard.h"
#include "worker/worker_internal.h"
#include "store/location.h"
#include "store/store_internal.h"

#define SUB "worker"
#define KL_HANDLER_TIMEOUT_MAX_MS 86400000 /* a day */

static kl_worker_t *kl_the_worker;
static kl__stop_guard_t *the_guard;
static volatile sig_atomic_t kl_pause_armed, kl_pause_resume;

/* A stop asked for before the worker exists: it stops as it starts. */
static volatile sig_atomic_t kl_stop_pending;

static void worker_on_stop(int sig) {
  kl_stop_pending = 1;
  if (kl_the_worker)
    kl_worker_stop(kl_the_worker);
  if (the_guard)
    kl__stop_guard_signal(the_guard, sig);
}

/* SIGINT and SIGTERM: @p fn, or ignored once the run is over. */
static void on_stop_signals(void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = fn ? fn : SIG_IGN;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
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
  kl__exec_spawn_kill_all();
  _exit(*(const int *)opaque);
}

/* Whether a failure to open @p location is worth another try: a
 * PostgreSQL server may come up, or its role be granted, while the worker
 * waits; a location libpq cannot read, a store of another format and an
 * LMDB directory stay as they are. */
static int store_may_heal(const char *location, kl_err_t err) {
  return err != KL_ENOMEM && err != KL_ESTORE_VERSION && err != KL_ECONF &&
         kl__location_is_pg(location) &&
         kl__pg_location_check(location) == KL_OK;
}

/* A fleet whose PostgreSQL starts after its workers (a host's boot, a
 * compose file) must not crash-loop: the store is opened again with
 * backoff (0.5 s doubling to 30 s) for worker.store.wait, each failure
 * logged with its cause, and a SIGTERM ends the wait (KL_ESTOPPED).
 * @returns kl_store_open()'s result, its detail saying how long it waited. */
static kl_err_t worker_store_open(const char *location, const kl_conf_t *conf,
                                  kl_store_t **store) {
  int64_t wait_ms = kl__conf_int(conf, "worker.store.wait");
  int64_t deadline = kl__mono_ns() + wait_ms * 1000000;
  char shown[KL__LOCATION_MAX], detail[1024];
  kl__location_redact(location, shown, sizeof(shown));
  kl_err_t err;
  for (int backoff_ms = 500, tries = 1;;
       backoff_ms = backoff_ms < 15000 ? backoff_ms * 2 : 30000, tries++) {
    if ((err = kl_store_open(location, conf, store)) == KL_OK)
      return KL_OK;
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    if (kl_stop_pending)
      return KL_ESTOPPED;
    if (!store_may_heal(location, err) || wait_ms == 0)
      return kl__err(err, "%s", detail);
    if (left_ms <= 0)
      return kl__err(err,
                     "%s; tried %d times in %" PRId64 " ms "
                     "(worker.store.wait, --store-wait)",
                     detail, tries, wait_ms);
    int sleep_ms = backoff_ms < left_ms ? backoff_ms : (int)left_ms;
    KL_LOG_W(SUB,
             "cannot open the store %s (try %d): %s; next try in %d ms, "
             "giving up in %" PRId64 " s (worker.store.wait, --store-wait)",
             shown, tries, detail, sleep_ms, left_ms / 1000);
    for (int slept = 0; slept < sleep_ms && !kl_stop_pending; slept += 100)
      kl__sleep_ms(sleep_ms - slept < 100 ? sleep_ms - slept : 100);
  }
}

typedef struct worker_args {
  const char *topic, *location, *handler;
  const char *metrics_listen; /* NULL: no metrics server */
  int64_t handler_timeout_ms; /* -1: not given; 0: none declared */
  int pause_on_usr1;
} worker_args_t;

/* Refuses a handler that would fail every event on @p store: the wrong
 * backend, or (inventory) what its SQL needs, checked on a batch begun
 * for it and aborted. */
static kl_err_t check_handler(const kl_handler_ref_t *handler, const char *spec,
                              kl_store_t *store, const char *topic,
                              const kl_conf_t *conf) {
  kl_txn_t *txn;
  kl_err_t err = kl__handler_check_store(handler, spec, store);
  if (err || !handler->needs_pg ||
      (err = kl__store_begin_check(store, topic, &txn)))
    return err;
  err = kl__handler_check_batch(handler, txn, topic, conf);
  kl_store_abort(txn);
  return err;
}

static int worker_main(kl_conf_t *conf, const worker_args_t *opts) {
  const char *topic = opts->topic, *location = opts->location;
  const char *handler_spec = opts->handler;
  kl_handler_ref_t handler;
  on_stop_signals(worker_on_stop); /* a SIGTERM during start-up counts */
  if (kl__handler_resolve(handler_spec, &handler))
    return kl__cli_usage(SUB, "%s", kl_err_detail());
  /* One timeout, --handler-timeout-ms being -X worker.handler.timeout.ms:
   * the bound kl_worker_new() checks against kafka.max.poll.interval.ms
   * and store.pg.idle.timeout (for any handler), and for an exec handler
   * how long it waits for the child's answer. 0 declares none; an exec
   * handler still waits KL_EXEC_TIMEOUT_MS at most, and declares that. */
  int64_t timeout_ms = opts->handler_timeout_ms >= 0
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
  const char *instance = kl_conf_get(conf, "worker.instance.id");
  if (instance && *instance)
    kl__pg_set_application("worker", instance);
  kl_err_t err = worker_store_open(location, conf, &store);
  if (err) {
    char shown[KL__LOCATION_MAX];
    kl__handler_release(&handler);
    if (err == KL_ESTOPPED) /* a stop while it waited: nothing to finish */
      return KL_EXIT_OK;
    return kl__cli_fail(SUB, "cannot open the store %s: %s",
                        kl__location_redact(location, shown, sizeof(shown)),
                        kl_err_detail());
  }
  if ((err = check_handler(&handler, handler_spec, store, topic, conf))) {
    int rc = err == KL_ECONF ? kl__cli_usage(SUB, "%s", kl_err_detail())
                             : kl__cli_fail(SUB, "%s", kl_err_detail());
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
    if (kl_stop_pending)
      kl_worker_stop(worker);
    if (kl__stop_guard_new(
            worker, kl__conf_int(conf, "worker.shutdown.timeout"), &the_guard))
      KL_LOG_W("worker", "%s; a stop is not bounded", kl_err_detail());
    err = kl_worker_run(worker);
    /* kl_worker_stats() clears the thread's detail, as every call does */
    char why[1024];
    snprintf(why, sizeof(why), "%s", err ? kl_err_detail() : "");
    kl_worker_stats_t st;
    kl_worker_stats(worker, &st, sizeof(st));
    KL_LOG_I("worker",
             "stopped: applied=%" PRIu64 " duplicates=%" PRIu64
             " redelivered=%" PRIu64 " batches=%" PRIu64 " fenced=%" PRIu64,
             st.applied, st.duplicates, st.redelivered, st.batches, st.fenced);
    if (err)
      rc = kl__cli_fail(SUB, "%s", why);
    if (err && kl__worker_unowned(worker))
      rc = KL_EXIT_UNOWNED;
    kl__metrics_server_stop(metrics);
    on_stop_signals(NULL);
    kl_the_worker = NULL;
    kl_worker_destroy(worker);
    kl__stop_guard_destroy(the_guard);
    the_guard = NULL;
  }
  kl_store_destroy(store);
  kl__handler_release(&handler);
  return rc;
}

#define KEYED(flag, conf_key)                                                  \
  { .name = (flag), .key = (conf_key) }

static const kl__opt_t worker_opts[] = {
    KL__OPT_BOOTSTRAP(""),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(worker_args_t, topic),
     .required = "",
     .help = "topic to consume"},
    {.name = "group",
     .letter = 'g',
     .meta = "GROUP",
     .key = "worker.group",
     .help = "consumer group"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(worker_args_t, location),
     .required = "",
     .help = "LMDB directory or postgresql://... URI"},
    {.name = "handler",
     .kind = KL__OPT_STRING,
     .meta = "HANDLER",
     .off = offsetof(worker_args_t, handler),
     .required = "ledger, inventory, so:PATH[:SYMBOL] or exec:COMMAND",
     .help = "ledger | inventory | so:PATH[:SYMBOL] | exec:COMMAND"},
    {.name = "handler-timeout-ms",
     .kind = KL__OPT_MS,
     .min = 0,
     .max = KL_HANDLER_TIMEOUT_MAX_MS,
     .off = offsetof(worker_args_t, handler_timeout_ms),
     .shown = "",
     .help = "-X worker.handler.timeout.ms: the longest one handler call "
             "takes, declared (at most half of kafka.max.poll.interval.ms, "
             "below store.pg.idle.timeout on PostgreSQL; 0: none); for exec "
             "also the answer timeout, after which the child is killed and "
             "the event retried (0 or unset: 30000)"},
    {.name = "metrics-listen",
     .kind = KL__OPT_STRING,
     .meta = "ADDR:PORT",
     .off = offsetof(worker_args_t, metrics_listen),
     .help = "serve GET /metrics, /healthz (readiness) and /livez "
             "(liveness) there (off by default; e.g. 127.0.0.1:9464); "
             "/healthz?format=json: Burrow-style status per partition"},
    KEYED("session-timeout-ms", "worker.session.timeout.ms"),
    {.name = "instance-id",
     .meta = "ID",
     .key = "worker.instance.id",
     .shown = "none: dynamic membership",
     .help = "static group membership (KIP-345): a name unique in the "
             "group and kept across restarts (a StatefulSet's pod name, "
             "worker-%i in a systemd unit); restarted within the session "
             "timeout, the worker gets its partitions back without a "
             "rebalance"},
    {.name = "shutdown-timeout",
     .meta = "DUR",
     .key = "worker.shutdown.timeout",
     .help = "at SIGTERM, finish and commit the events in flight within "
             "DUR, else (or at a second SIGTERM) abort them and exit 1"},
    {.name = "partitions",
     .key = "worker.expect.partitions",
     .shown = "the count at start",
     .help = "refuse to run unless TOPIC has N partitions; a change while "
             "running stops taking it"},
    {.name = "misrouted",
     .meta = "POLICY",
     .key = "worker.misrouted",
     .help = "a record whose key routes (murmur2) to another partition: dlq "
             "(dead-letter it, reason misrouted) | forward (re-publish it to "
             "its key's partition) | apply (apply it here: producers that "
             "all use one custom partitioner)"},
    KEYED("batch-max", "worker.batch.max"),
    KEYED("durability", "store.durability"),
    {.name = "dedup-retention",
     .key = "store.dedup.retention",
     .help = "keep idempotency keys DUR; the worker refuses to run when "
             "TOPIC or its dead-letter topic keeps records longer "
             "(retention.ms, read at start); -X "
             "worker.retention.check=warn runs anyway"},
    {.name = "concurrency",
     .key = "worker.concurrency",
     .help = "handler threads; one key's events stay in order (1: the "
             "polling thread); exec: N children, each with up to "
             "worker.exec.window events in flight"},
    {.name = "retry-initial-ms",
     .key = "worker.retry.initial.ms",
     .help = "first backoff after RETRY"},
    KEYED("retry-max-ms", "worker.retry.max.ms"),
    {.name = "max-attempts",
     .key = "worker.max.attempts",
     .help = "handler runs before a dead letter"},
    {.name = "dlq-topic",
     .meta = "TOPIC",
     .key = "worker.dlq.topic",
     .shown = "TOPIC.dlq",
     .help = "dead-letter topic"},
    {.name = "kafka-wait", .key = "worker.kafka.wait"},
    {.name = "store-wait", .key = "worker.store.wait"},
    {.kind = KL__OPT_TEXT, .help = "Testing:\n"},
    {.name = "pause-on-sigusr1",
     .kind = KL__OPT_FLAG,
     .off = offsetof(worker_args_t, pause_on_usr1),
     .help = "on SIGUSR1, hold the next batch between its handlers and its "
             "commit until SIGUSR2 (60s at most): the paused-worker "
             "failure, on demand"},
    {0}};

static const kl__cmd_t worker_cmd = {
    .name = SUB,
    .about =
        "Runs one worker of the fleet: owns the partitions the group gives "
        "it,\n"
        "applies their events once each, fenced by an owner epoch.\n",
    .opts = worker_opts,
    .notes =
        "A partition whose log went backwards (a recreated topic) or lost\n"
        "records to retention before they were applied stops, with an ERROR\n"
        "and /healthz 503; `keylane store reset` starts it again from the "
        "log's\n"
        "beginning, and -X worker.on.gap=skip goes on past a retention gap,\n"
        "counting the records lost.\n\n"
        "SIGINT or SIGTERM stop taking records, finish the batch in "
        "flight,\n"
        "commit it with the final offsets and leave the group (a static\n"
        "member, --instance-id, stays, for its restart to take its "
        "partitions\n"
        "back), then exit 0; a second signal or --shutdown-timeout aborts "
        "the\n"
        "batch uncommitted (its next owner applies it) and exits 1.\n\n"
        "A partition the store will not let it take (a read-only role, a\n"
        "revoked privilege) is tried for -X worker.acquire.wait (60s); then\n"
        "the worker stops and exits 3, naming the cause.\n\n"
        "A partition the group committed offsets for that the store never\n"
        "saw (a wrong --store, a lost store, deleted partition rows, an old\n"
        "backup) is not taken: it stops (store_unknown), and a worker that\n"
        "owns nothing else exits 3; `keylane store rebuild` or `keylane\n"
        "replay --from watermark` with -X worker.group adopts such a store.\n"
        "\n"
        "A store records the Kafka cluster and group that own each topic (the\n"
        "first worker to take a partition records its own): a worker of\n"
        "another cluster (a wrong -b) or group (a typo'd -g) takes none of\n"
        "its partitions (cluster_mismatch, group_mismatch) and exits 3 when\n"
        "it owns nothing else; `keylane store bind` records a new owner.\n",
    .examples = "  keylane worker -b 127.0.0.1:9092 -t events -g ledger \\\n"
                "      --store /var/lib/keylane --handler ledger\n",
    .conf = true};

int kl__cmd_worker(int argc, char **argv) {
  kl_conf_t *conf = kl_conf_new();
  if (!conf)
    return kl__cli_fail(SUB, "out of memory");
  /* A worker's role creates nothing (docs/production.md): an empty
   * PostgreSQL database is refused unless -X store.pg.migrate=auto (or the
   * config file) says otherwise, which the parse below applies. */
  if (kl_conf_set(conf, "store.pg.migrate", "never") != KL_OK) {
    kl_conf_destroy(conf);
    return kl__cli_fail(SUB, "out of memory");
  }
  worker_args_t a = {0};
  a.handler_timeout_ms = -1; /* not given: worker.handler.timeout.ms */
  int first;
  int rc = kl__opts_parse(&worker_cmd, argc, argv, &a, conf, &first);
  if (rc < 0)
    rc = worker_main(conf, &a);
  kl_conf_destroy(conf);
  return rc;
}
