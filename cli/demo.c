/*
 * keylane demo: the whole system on one machine, no Kafka installed.
 *
 * An embedded cluster (3 brokers, topic "events" with 8 partitions), an
 * LMDB store in a temporary directory, 3 worker processes running the
 * ledger handler, and a publisher that re-publishes a share of its events
 * with the same idempotency key. While it runs, the demo makes the seed's
 * failure happen: one worker pauses between its handlers and its commit
 * until another owner has taken and committed its partition, and another
 * worker is SIGKILLed and restarted. Every 40th event is a scheduled
 * transfer, which reserves its amount at once and settles 1 to 5 s later
 * (a delayed follow-up): while the workers apply, the demo looks twice a
 * second that none settled before its time. Then it verifies every
 * balance.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/kafka.h"
#include "keylane/embedded.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "cli/ledger_gen.h"

#define SUB "demo"
#define KL_DEMO_WORKERS 3
#define KL_DEMO_PARTITIONS 8
#define KL_DEMO_TOPIC "events"

/* The paused worker (worker 0), driven from this process: SIGUSR1 arms its
 * pause, its log says which batch it holds, the store says when a newer
 * owner has taken and committed that partition, and SIGUSR2 wakes it to
 * meet its fence. This process holds no snapshot while it reads the
 * store; the paused one does, which is why it is not asked. */
typedef enum {
  KL_PAUSE_IDLE,
  KL_PAUSE_ARMED, /* SIGUSR1 sent */
  KL_PAUSE_HELD,  /* its log says "pausing partition=P epoch=E" */
  KL_PAUSE_WOKEN  /* a newer owner committed P; SIGUSR2 sent */
} kl_demo_pause_state_t;

typedef struct kl_demo_pause {
  kl_demo_pause_state_t state;
  int32_t partition;
  uint64_t epoch;
  int64_t watermark; /* P's, when the pause was seen */
  int64_t next_ns;   /* when to look again */
} kl_demo_pause_t;

typedef struct kl_demo {
  char dir[64];
  const char *bootstrap;
  pid_t pids[KL_DEMO_WORKERS];
  int events, keys;
  kl__ledger_gen_t *gen;
  double elapsed_s;
  kl_demo_pause_t pause;
  int64_t next_due_ns; /* the next look that no settle ran early */
} kl_demo_t;

static pid_t demo_spawn(kl_demo_t *demo, int i) {
  char log[128], group_arg[] = "demo", name[16];
  snprintf(log, sizeof(log), "%s/worker-%d.log", demo->dir, i);
  snprintf(name, sizeof(name), "%d", i);
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  /* A worker must not outlive a demo that was interrupted or crashed. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  char *argv[32];
  int n = 0;
  argv[n++] = (char *)"keylane";
  argv[n++] = (char *)"worker";
  argv[n++] = (char *)"-b";
  argv[n++] = (char *)demo->bootstrap;
  argv[n++] = (char *)"-t";
  argv[n++] = (char *)KL_DEMO_TOPIC;
  argv[n++] = (char *)"-g";
  argv[n++] = group_arg;
  argv[n++] = (char *)"--store";
  argv[n++] = demo->dir;
  argv[n++] = (char *)"--handler";
  argv[n++] = (char *)"ledger";
  argv[n++] = (char *)"--session-timeout-ms";
  argv[n++] = (char *)"6000";
  argv[n++] = (char *)"--partitions";
  argv[n++] = (char *)"8";
  /* The embedded cluster holds an empty fetch for all of it (embedded.h) */
  argv[n++] = (char *)"-X";
  argv[n++] = (char *)"kafka.fetch.wait.max.ms=" KL_EMBEDDED_FETCH_WAIT_MS;
  if (i == 0) {
    /* Its application thread stalls; the group notices through the
     * poll interval, as it would a GC pause or a frozen VM. */
    argv[n++] = (char *)"--pause-on-sigusr1";
    argv[n++] = (char *)"-X";
    argv[n++] = (char *)"kafka.max.poll.interval.ms=6000";
  }
  argv[n] = NULL;
  execv(kl__cli_self(), argv);
  _exit(127);
}

static void demo_stop_workers(kl_demo_t *demo, int sig) {
  for (int i = 0; i < KL_DEMO_WORKERS; i++)
    if (demo->pids[i] > 0)
      kill(demo->pids[i], sig);
}

/* Waits for every worker to exit, at most @p ms; returns how many exited 0. */
static int demo_reap(kl_demo_t *demo, int ms) {
  int clean = 0;
  for (int t = 0; t < ms; t += 50) {
    int left = 0;
    for (int i = 0; i < KL_DEMO_WORKERS; i++) {
      int status;
      if (demo->pids[i] <= 0)
        continue;
      if (waitpid(demo->pids[i], &status, WNOHANG) == demo->pids[i]) {
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        demo->pids[i] = 0;
      } else {
        left++;
      }
    }
    if (!left)
      return clean;
    kl__sleep_ms(50);
  }
  demo_stop_workers(demo, SIGKILL);
  demo_reap(demo, 5000);
  return clean;
}

/* Finds "pausing partition=P epoch=E" in worker 0's log. */
static int demo_find_pause(const kl_demo_t *demo, int32_t *partition,
                           uint64_t *epoch) {
  char path[128], line[2048];
  snprintf(path, sizeof(path), "%s/worker-0.log", demo->dir);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof(line), f)) {
    const char *at = strstr(line, "pausing partition=");
    found = at && sscanf(at, "pausing partition=%" SCNd32 " epoch=%" SCNu64,
                         partition, epoch) == 2;
  }
  if (f)
    fclose(f);
  return found;
}

/* One step of the paused worker's life, at most every 100 ms. */
static void demo_pause_step(kl_demo_t *demo, kl_store_t *store) {
  kl_demo_pause_t *pause = &demo->pause;
  int64_t now = kl__mono_ns();
  if (pause->state == KL_PAUSE_IDLE || pause->state == KL_PAUSE_WOKEN ||
      now < pause->next_ns)
    return;
  pause->next_ns = now + 100000000;
  kl_partition_state_t st;
  if (pause->state == KL_PAUSE_ARMED &&
      demo_find_pause(demo, &pause->partition, &pause->epoch) &&
      kl_store_partition(store, KL_DEMO_TOPIC, pause->partition, &st) ==
          KL_OK) {
    pause->watermark = st.watermark;
    pause->state = KL_PAUSE_HELD;
  } else if (pause->state == KL_PAUSE_HELD &&
             kl_store_partition(store, KL_DEMO_TOPIC, pause->partition, &st) ==
                 KL_OK &&
             st.epoch > pause->epoch && st.watermark > pause->watermark) {
    kill(demo->pids[0], SIGUSR2);
    pause->state = KL_PAUSE_WOKEN;
  }
}

/* Every 500 ms: no delayed event applied before its time. */
static void demo_due_step(kl_demo_t *demo, kl_store_t *store) {
  int64_t now = kl__mono_ns();
  if (now < demo->next_due_ns)
    return;
  demo->next_due_ns = now + 500000000;
  kl__ledger_gen_check_due(demo->gen, store, KL_DEMO_TOPIC);
}

/* Publishes the unique events paced over about 25 s, every 4th a transfer
 * between two accounts (the bank test: money must be conserved), every
 * 10th of those scheduled 1 to 5 s ahead, re-publishing one earlier event
 * after every 18th (5.5 %), and fires the two faults. */
static kl_err_t demo_publish(kl_demo_t *demo, kl_producer_t *producer,
                             kl_store_t *store) {
  const int64_t t0 = kl__mono_ns();
  const int64_t span_ns = 25LL * 1000000000;
  int killed = 0, restarted = 0;
  for (int i = 0; i < demo->events; i++) {
    kl_err_t err =
        i % 40 == 39
            ? kl__ledger_gen_scheduled(demo->gen, producer, KL_DEMO_TOPIC,
                                       1000 + (i / 40) % 4001)
        : i % 4 == 3
            ? kl__ledger_gen_transfer(demo->gen, producer, KL_DEMO_TOPIC)
            : kl__ledger_gen_publish(demo->gen, producer, KL_DEMO_TOPIC);
    if (!err && i % 18 == 17)
      err = kl__ledger_gen_republish(demo->gen, producer, KL_DEMO_TOPIC);
    if (err)
      return err;
    int64_t due = t0 + span_ns / demo->events * (i + 1);
    while (kl__mono_ns() < due)
      kl_producer_poll(producer, 1);
    double t = (double)(kl__mono_ns() - t0) / 1e9;
    demo_pause_step(demo, store);
    demo_due_step(demo, store);
    if (demo->pause.state == KL_PAUSE_IDLE && t > 6) {
      kill(demo->pids[0], SIGUSR1);
      demo->pause.state = KL_PAUSE_ARMED;
    } else if (!killed && t > 12) {
      kill(demo->pids[2], SIGKILL), killed = 1;
      waitpid(demo->pids[2], NULL, 0);
    } else if (killed && !restarted && t > 14) {
      demo->pids[2] = demo_spawn(demo, 2), restarted = 1;
    }
  }
  return kl_flush(producer, 60000);
}

static uint64_t demo_count_lines(const kl_demo_t *demo, const char *needle) {
  uint64_t n = 0;
  char path[128], line[2048];
  for (int i = 0; i < KL_DEMO_WORKERS; i++) {
    snprintf(path, sizeof(path), "%s/worker-%d.log", demo->dir, i);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
      n += strstr(line, needle) != NULL;
    if (f)
      fclose(f);
  }
  return n;
}

/* Waits, 120 s at most, until every partition caught up, the paused
 * worker was woken after a newer owner committed its partition, and it met
 * its fence. @returns 0 when all three happened. */
static int demo_settle(kl_demo_t *demo, kl_store_t *store) {
  for (int t = 0; t < 120000; t += 100) {
    demo_pause_step(demo, store);
    demo_due_step(demo, store);
    /* one look at the partitions, and 100 ms when they are not there */
    int caught_up =
        kl__ledger_gen_wait(demo->gen, store, KL_DEMO_TOPIC, 0, 100) == 0;
    if (caught_up && demo->pause.state == KL_PAUSE_WOKEN &&
        demo_count_lines(demo, "fenced partition=") > 0)
      return 0;
    if (caught_up)
      kl__sleep_ms(100);
  }
  return -1;
}

static int demo_report(kl_demo_t *demo, kl_store_t *store, int json,
                       int clean_exits) {
  kl__ledger_verdict_t v;
  if (kl__ledger_gen_read_follow_ups(demo->gen, store, demo->bootstrap,
                                     KL_DEMO_TOPIC))
    return kl__cli_fail(SUB, "cannot read the transfers' credits: %s",
                        kl_err_detail());
  if (kl__ledger_gen_verify(demo->gen, store, KL_DEMO_TOPIC, &v))
    return kl__cli_fail(SUB, "cannot read the store: %s", kl_err_detail());
  uint64_t fenced = demo_count_lines(demo, "fenced partition=");
  uint64_t published = kl__ledger_gen_published(demo->gen);
  uint64_t dups = kl__ledger_gen_republished(demo->gen);
  uint64_t acked = kl__ledger_gen_acked(demo->gen);
  int balances_ok = v.keys_bad == 0 && v.keys_ok == v.keys;
  int ok = v.ok && fenced > 0 && clean_exits == KL_DEMO_WORKERS;
  if (json) {
    json_t *o = json_pack(
        "{sIsIsIsIsIsIsIsIsbsIsIsIsfsbsssIsbsIsI}", "published",
        (json_int_t)published, "duplicates_injected", (json_int_t)dups,
        "acknowledged", (json_int_t)acked, "applied", (json_int_t)v.applied,
        "duplicates_suppressed", (json_int_t)v.duplicates, "outbox_copies",
        (json_int_t)v.follow_up_copies, "fenced_batches", (json_int_t)fenced,
        "order_violations", (json_int_t)v.violations, "balances_ok",
        balances_ok, "keys", (json_int_t)v.keys, "workers_killed",
        (json_int_t)1, "workers_exited_cleanly", (json_int_t)clean_exits,
        "elapsed_s", demo->elapsed_s, "ok", ok, "dir", demo->dir, "transfers",
        (json_int_t)v.transfers, "total_ok", v.total_ok, "total",
        (json_int_t)v.total, "total_expected", (json_int_t)v.total_expected);
    json_object_set_new(
        o, "scheduled",
        json_pack("{sIsIsIsIsIsIsI}", "transfers", (json_int_t)v.scheduled,
                  "delayed", (json_int_t)v.delayed, "delayed_applied",
                  (json_int_t)v.delayed_applied, "firing_copies",
                  (json_int_t)v.firing_copies, "due_checks",
                  (json_int_t)v.due_checks, "early", (json_int_t)v.early,
                  "held", (json_int_t)v.held));
    json_dumpf(o, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(o);
    return ok ? KL_EXIT_OK : KL_EXIT_FAIL;
  }
  printf("published %" PRIu64 " events over %" PRIu64 " keys, plus %" PRIu64
         " re-published with the same idempotency key; %" PRIu64
         " acknowledged by Kafka\n",
         published, v.keys, dups, acked);
  printf("applied %" PRIu64 " (each once), suppressed %" PRIu64
         " duplicates (%" PRIu64 " of them follow-ups an outbox published "
         "again after the kill, %" PRIu64 " timers' firing records written "
         "again)\n",
         v.applied, v.duplicates, v.follow_up_copies, v.firing_copies);
  printf("the paused worker woke up late and was fenced: %" PRIu64
         " batch(es) rejected by the epoch check\n",
         fenced);
  printf("one worker was SIGKILLed and restarted; %d of %d workers drained "
         "and exited cleanly\n",
         clean_exits, KL_DEMO_WORKERS);
  printf("balances: %" PRIu64 " of %" PRIu64 " keys verified, %" PRIu64
         " order violations\n",
         v.keys_ok, v.keys, v.violations);
  printf("transfers: %" PRIu64 " between accounts, each credit emitted "
         "through the outbox; money %s: total %" PRId64 ", credits less "
         "debits published %" PRId64 "\n",
         v.transfers, v.total_ok ? "conserved" : "NOT conserved", v.total,
         v.total_expected);
  printf("scheduled transfers: %" PRIu64 " of them reserved at once and "
         "settled 1 to 5 s later; %" PRIu64 " of %" PRIu64
         " settles applied, %" PRIu64 " before their time in %" PRIu64
         " looks; held at the end %" PRId64 "\n",
         v.scheduled, v.delayed_applied, v.delayed, v.early, v.due_checks,
         v.held);
  printf("%s in %.1f s\n", ok ? "OK: every balance verifies" : "FAILED",
         demo->elapsed_s);
  return ok ? KL_EXIT_OK : KL_EXIT_FAIL;
}

static void demo_rmdir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "keylane demo: could not remove %s\n", dir);
}

static int demo_run(kl_demo_t *demo, int json) {
  kl_embedded_t *cluster = NULL;
  kl_producer_t *producer = NULL;
  kl_store_t *store = NULL;
  kl_conf_t *conf = kl_conf_new();
  int rc = KL_EXIT_FAIL;
  const int64_t t0 = kl__mono_ns();
  kl_err_t err =
      kl_embedded_new(3, KL_DEMO_TOPIC, KL_DEMO_PARTITIONS, &cluster);
  if (!err)
    demo->bootstrap = kl_embedded_bootstrap(cluster);
  /* The store's map is 1 GiB from the start, and the workers adopt it at
   * their open. The paused worker holds its batch's snapshot, and LMDB
   * reuses no page freed meanwhile, so the others' commits grow the file
   * (to 348 MiB in a pause of 23 s on a loaded machine); a map grown
   * while that snapshot is open cannot be adopted by its process, whose
   * commit then fails with KL_ESTORE_BUSY instead of meeting its fence. */
  if (!err)
    err = kl_conf_set(conf, "store.map.size", "1G");
  if (!err)
    err = kl_store_open(demo->dir, conf, &store);
  if (!err)
    err = kl_conf_set(conf, "kafka.bootstrap.servers", demo->bootstrap);
  if (!err)
    err = kl_conf_set(conf, "producer.expect.partitions", "8");
  if (!err)
    err =
        kl_producer_new(conf, kl__ledger_gen_on_delivery, demo->gen, &producer);
  if (err) {
    rc = kl__cli_fail(SUB, "setup: %s", kl_err_detail());
    goto out;
  }
  if (!json)
    fprintf(stderr, "embedded cluster at %s; store and logs in %s\n",
            demo->bootstrap, demo->dir);
  for (int i = 0; i < KL_DEMO_WORKERS; i++)
    demo->pids[i] = demo_spawn(demo, i);
  if (kl__ledger_gen_wait(demo->gen, store, KL_DEMO_TOPIC, 1, 60000)) {
    rc = kl__cli_fail(SUB,
                      "the workers did not take all %d partitions "
                      "within 60 s; see %s/worker-*.log",
                      KL_DEMO_PARTITIONS, demo->dir);
    goto out;
  }
  if (!json)
    fprintf(stderr, "workers own all partitions; publishing\n");
  if ((err = demo_publish(demo, producer, store))) {
    rc = kl__cli_fail(SUB, "publish: %s", kl_err_detail());
    goto out;
  }
  if (!json)
    fprintf(stderr, "published; waiting for the workers to apply\n");
  if (demo_settle(demo, store))
    fprintf(stderr, "keylane demo: %s\n",
            demo->pause.state != KL_PAUSE_WOKEN
                ? "no newer owner committed the "
                  "paused worker's partition in "
                  "120 s"
                : "not every partition caught up, "
                  "or the paused worker was not "
                  "fenced, in 120 s");
  demo_stop_workers(demo, SIGTERM);
  int clean = demo_reap(demo, 30000);
  demo->elapsed_s = (double)(kl__mono_ns() - t0) / 1e9;
  rc = demo_report(demo, store, json, clean);
out:
  demo_stop_workers(demo, SIGKILL);
  demo_reap(demo, 5000);
  kl_producer_destroy(producer);
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  kl_conf_destroy(conf);
  return rc;
}

typedef struct demo_args {
  int64_t events, keys;
  int json, keep;
} demo_args_t;

static const kl__opt_t demo_opts[] = {
    {.name = "events",
     .kind = KL__OPT_COUNT,
     .min = 100,
     .max = 10000000,
     .def = "100000",
     .off = offsetof(demo_args_t, events),
     .help = "unique events to publish"},
    {.name = "keys",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 100000,
     .def = "1000",
     .off = offsetof(demo_args_t, keys),
     .help = "entity keys"},
    {.name = "json",
     .kind = KL__OPT_FLAG,
     .off = offsetof(demo_args_t, json),
     .help = "print one JSON object with the figures"},
    {.name = "keep",
     .kind = KL__OPT_FLAG,
     .off = offsetof(demo_args_t, keep),
     .help = "keep the temporary directory (store and logs)"},
    {0}};

static const kl__cmd_t demo_cmd = {
    .name = SUB,
    .usage = "[--events N] [--keys N] [--json] [--keep]",
    .about =
        "Runs keylane end to end on an embedded Kafka-protocol cluster: 3 "
        "worker\n"
        "processes apply a ledger while a publisher injects duplicates, one\n"
        "worker is paused between handler and commit until it is fenced, and\n"
        "another is killed and restarted. Every 4th event is a transfer "
        "between\n"
        "two accounts, whose credit goes through the outbox; every 40th is "
        "scheduled:\n"
        "reserved at once, settled 1 to 5 s later by a delayed follow-up. "
        "Then every\n"
        "balance is verified, that money was conserved (a bank test), and "
        "that\n"
        "every scheduled transfer settled once and none before its time.\n",
    .opts = demo_opts,
    .notes = "Exit status 0 only when every balance and seq verifies, the "
             "total\nis conserved and every scheduled transfer settled "
             "once, on time.\n",
    .examples = "  keylane demo\n"
                "  keylane demo --events 20000 --json\n"};

int kl__cmd_demo(int argc, char **argv) {
  demo_args_t a = {0};
  int first;
  int rc = kl__opts_parse(&demo_cmd, argc, argv, &a, NULL, &first);
  if (rc >= 0)
    return rc;
  kl_demo_t demo = {.events = (int)a.events, .keys = (int)a.keys};
  int json = a.json, keep = a.keep;
  demo.gen = kl__ledger_gen_new(demo.keys, KL_DEMO_PARTITIONS, 0);
  snprintf(demo.dir, sizeof(demo.dir), "/tmp/keylane-demo-XXXXXX");
  rc = KL_EXIT_FAIL;
  if (!demo.gen)
    fprintf(stderr, "keylane demo: out of memory\n");
  else if (!mkdtemp(demo.dir))
    fprintf(stderr, "keylane demo: mkdtemp: %s\n", strerror(errno));
  else {
    signal(SIGPIPE, SIG_IGN);
    rc = demo_run(&demo, json);
    if (!keep && rc == KL_EXIT_OK)
      demo_rmdir(demo.dir);
    else
      fprintf(stderr, "store and logs kept in %s\n", demo.dir);
  }
  kl__ledger_gen_destroy(demo.gen);
  return rc;
}
