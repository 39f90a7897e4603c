/*
 * keylane-bench failover: how long keys wait while the workers of a fleet
 * restart, die or freeze, with dynamic and with static group membership
 * (worker.instance.id, KIP-345).
 *
 * Each scenario gets a fresh topic of --partitions partitions, a fresh
 * LMDB store, --workers `keylane worker` processes (the ledger handler,
 * --session-timeout-ms; --keylane names the program, by default the
 * keylane beside this one) and a publisher of ledger events at --rate
 * events/s. After --warmup s (not measured) and --steady s of steady
 * state, one disturbance:
 *   roll          each worker in turn: SIGTERM, started again once it
 *                 exited, the next --gap s after it owns partitions again
 *   kill-restart  one worker SIGKILLed, started again 1 s later
 *   kill          one worker SIGKILLed for good
 *   stop          one worker SIGSTOPped past the session timeout (the
 *                 others take its partitions under newer epochs), then
 *                 SIGCONTed: a zombie, which the fence must stop
 * each with dynamic members ("-dynamic") and static ones ("-static");
 * kill-static only when asked (--scenarios kill or all), since a member
 * that never comes back costs the session timeout whatever its membership.
 * Publishing goes on for the session timeout + 3 s after a SIGKILL (3 s
 * after a rolling restart or a zombie's return); then every event must be
 * applied.
 *
 * Each event's wait is exact, not a histogram's: its id is a UUIDv7 whose
 * first 48 bits are its publish time in ms, and the store keeps the time
 * of the commit that applied it (kl__store_ids_walk()). Printed per
 * scenario: p99 and the longest wait of the events published in the
 * steady state and of those published from 1 s before the disturbance on
 * (the last second's are in flight when it strikes); whether
 * every event was applied once with every balance as published (nothing
 * applied twice); the commits a fence refused ("fenced partition=" in the
 * workers' logs); and the target issue 28 set, met or not.
 *
 * The cluster: --bootstrap B, or a real single-node Apache Kafka started
 * with deploy/kafka/kafka.sh on --kafka-port (stopped and deleted at the
 * end), which accepts sessions from 1 s. --quick: 2 workers, 4
 * partitions, 200 events/s, 3 s sessions, short windows and four
 * scenarios, for a smoke test.
 */
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "store/store_internal.h"
#include "support/cluster.h"
#include "support/spawn.h"
#include "support/support.h"

#define FO_NAME "failover"
#define FO_WORKERS_MAX 16
#define FO_PARTS_MAX 256
/* Events published this long before a disturbance count as during it:
 * they are in flight when it strikes. */
#define FO_IN_FLIGHT_MS 1000

typedef enum { FO_ROLL, FO_KILL_RESTART, FO_KILL, FO_STOP } fo_kind_t;

typedef struct fo_scenario {
  const char *name;
  fo_kind_t kind;
  int statics; /* static members */
  const char *what;
} fo_scenario_t;

static const fo_scenario_t fo_scenarios[] = {
    {"roll-dynamic", FO_ROLL, 0, "rolling restart"},
    {"roll-static", FO_ROLL, 1, "rolling restart"},
    {"kill-restart-dynamic", FO_KILL_RESTART, 0, "SIGKILL, back after 1 s"},
    {"kill-restart-static", FO_KILL_RESTART, 1, "SIGKILL, back after 1 s"},
    {"kill-dynamic", FO_KILL, 0, "SIGKILL, not restarted"},
    {"kill-static", FO_KILL, 1, "SIGKILL, not restarted"},
    {"stop-dynamic", FO_STOP, 0, "SIGSTOP past the session"},
    {"stop-static", FO_STOP, 1, "SIGSTOP past the session"},
};
#define FO_NSCENARIOS (sizeof(fo_scenarios) / sizeof(fo_scenarios[0]))
static const char fo_quick_list[] =
    "roll-static,kill-restart-static,kill-dynamic,stop-dynamic";
/* kill-static left out: a member that never comes back costs the session
 * timeout whatever its membership. */
static const char fo_default_list[] = "roll,kill-restart,kill-dynamic,stop";

typedef struct fo_opts {
  int64_t workers, partitions, rate, session_ms, warmup, steady, gap;
  int64_t kafka_port;
  const char *bootstrap, *scenarios, *keylane;
  int quick, json;
} fo_opts_t;

/* Waits in ms of the events of one window. */
typedef struct fo_waits {
  int64_t *ms;
  size_t n, cap;
} fo_waits_t;

typedef struct fo_stats {
  size_t n;
  int64_t p50, p99, max; /* ms */
} fo_stats_t;

typedef struct fo_result {
  const fo_scenario_t *scn;
  fo_stats_t steady, during;
  uint64_t published, applied, duplicates;
  int nothing_twice; /* the ledger verified, each event applied once */
  int fenced;        /* commits refused by a fence */
  int exits_failed;  /* workers that exited non-zero at a SIGTERM */
  int met;
  char target[64];
  char error[256]; /* empty: ran */
} fo_result_t;

/* One scenario's fleet. */
typedef struct fo_run {
  const fo_opts_t *o;
  const fo_scenario_t *scn;
  const char *boot, *topic, *dlq, *group;
  char dir[64], session[24];
  pid_t pid[FO_WORKERS_MAX]; /* 0: gone */
  int log[FO_WORKERS_MAX];   /* each one's worker-<log>.log */
  int logs;
  kl_store_t *store;
} fo_run_t;

static void fo_fail(fo_result_t *res, const char *fmt, ...) KL__PRINTF(2, 3);
static void fo_fail(fo_result_t *res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!res->error[0])
    vsnprintf(res->error, sizeof(res->error), fmt, ap);
  va_end(ap);
}

/* ---- the workers ------------------------------------------------------ */

static void fo_spawn(fo_run_t *r, int slot) {
  char instance[16];
  snprintf(instance, sizeof(instance), "w%d", slot);
  const char *argv[32] = {r->o->keylane,
                          "worker",
                          "-b",
                          r->boot,
                          "-t",
                          r->topic,
                          "-g",
                          r->group,
                          "--store",
                          r->dir,
                          "--handler",
                          "ledger",
                          "--session-timeout-ms",
                          r->session,
                          "--dlq-topic",
                          r->dlq,
                          "-X",
                          "worker.retention.check=warn"};
  int n = 18;
  if (r->scn->statics) {
    argv[n++] = "--instance-id";
    argv[n++] = instance;
  }
  argv[n] = NULL;
  r->log[slot] = r->logs++;
  r->pid[slot] = kl_t_spawn_worker(r->dir, r->log[slot], argv);
}

/* Partitions worker @p slot owns now, by its log; @p changes receives how
 * often its assignment changed. */
static int fo_owned(const fo_run_t *r, int slot, int *changes) {
  uint64_t epochs[FO_PARTS_MAX];
  int c = kl_t_log_owned(r->dir, r->log[slot], epochs, (int)r->o->partitions);
  if (changes)
    *changes += c;
  int n = 0;
  for (int p = 0; p < r->o->partitions; p++)
    n += epochs[p] != 0;
  return n;
}

/* Waits until the live workers own every partition between them, and no
 * assignment changed for a second (60 s at most). */
static int fo_await_settled(const fo_run_t *r) {
  int last = -1;
  for (int t = 0, quiet = 0; t < 600; t++) {
    int owned = 0, changes = 0;
    for (int s = 0; s < r->o->workers; s++)
      if (r->pid[s])
        owned += fo_owned(r, s, &changes);
    quiet = owned == r->o->partitions && changes == last ? quiet + 1 : 0;
    if (quiet >= 10)
      return 0;
    last = changes;
    kl_t_sleep_ms(100);
  }
  return -1;
}

/* Waits for worker @p slot to exit (@p ms at most, then SIGKILL).
 * @returns its exit status, or -1 when it did not exit by itself. */
static int fo_reap(fo_run_t *r, int slot, int ms) {
  int status = 0;
  for (int t = 0; t < ms; t += 20) {
    if (waitpid(r->pid[slot], &status, WNOHANG) == r->pid[slot]) {
      r->pid[slot] = 0;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    kl_t_sleep_ms(20);
  }
  kill(r->pid[slot], SIGKILL);
  waitpid(r->pid[slot], &status, 0);
  r->pid[slot] = 0;
  return -1;
}

/* ---- the publisher ---------------------------------------------------- */

typedef struct fo_pub {
  kl_producer_t *producer;
  kl__ledger_gen_t *gen;
  const char *topic;
  int64_t rate;
  atomic_int stop;
  int failed;
  pthread_t thread;
} fo_pub_t;

/* Event i at start + i / rate, on an absolute clock, until stopped. */
static void *fo_pub_main(void *opaque) {
  fo_pub_t *pub = opaque;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int64_t i = 0; !atomic_load(&pub->stop); i++) {
    int64_t at_ns = (int64_t)start.tv_nsec + i * 1000000000LL / pub->rate;
    struct timespec at = {start.tv_sec + (time_t)(at_ns / 1000000000LL),
                          (long)(at_ns % 1000000000LL)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
    kl_err_t err;
    while ((err = kl__ledger_gen_publish(pub->gen, pub->producer,
                                         pub->topic)) == KL_EQUEUE_FULL)
      kl_producer_poll(pub->producer, 1);
    if (err) {
      fprintf(stderr, "keylane-bench %s: publish: %s\n", FO_NAME,
              kl_err_detail());
      pub->failed = 1;
      return NULL;
    }
    kl_producer_poll(pub->producer, 0);
  }
  return NULL;
}

/* ---- the waits -------------------------------------------------------- */

typedef struct fo_walk {
  int64_t steady_from, during_from, until; /* publish ms */
  fo_waits_t steady, during;
  int oom;
} fo_walk_t;

static void fo_waits_add(fo_waits_t *w, int64_t ms, int *oom) {
  int64_t *v = kl__grow(w->ms, &w->cap, w->n, sizeof(*v), 4096);
  if (!v) {
    *oom = 1;
    return;
  }
  w->ms = v;
  w->ms[w->n++] = ms;
}

/* The publish time of a UUIDv7 id: its first 48 bits; -1 for another id. */
static int64_t fo_id_ms(const char *id, size_t len) {
  if (len != 36 || id[8] != '-' || id[14] != '7')
    return -1;
  char hex[13];
  memcpy(hex, id, 8);
  memcpy(hex + 8, id + 9, 4);
  hex[12] = '\0';
  return (int64_t)strtoll(hex, NULL, 16);
}

static int fo_walk_id(void *opaque, const char *topic, const void *key,
                      size_t key_len, const char *id, size_t id_len,
                      int64_t time_ms, kl_mark_t mark) {
  (void)topic, (void)key, (void)key_len;
  fo_walk_t *w = opaque;
  int64_t at = fo_id_ms(id, id_len);
  if (mark != KL_MARK_APPLIED || at < 0)
    return 0;
  if (at >= w->steady_from && at < w->during_from)
    fo_waits_add(&w->steady, time_ms - at, &w->oom);
  else if (at >= w->during_from && at <= w->until)
    fo_waits_add(&w->during, time_ms - at, &w->oom);
  return 0;
}

static int fo_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentiles; frees the waits. */
static fo_stats_t fo_stats(fo_waits_t *w) {
  fo_stats_t st = {w->n, -1, -1, -1};
  if (w->n) {
    qsort(w->ms, w->n, sizeof(*w->ms), fo_cmp);
    st.p50 = w->ms[(w->n - 1) / 2];
    st.p99 = w->ms[(w->n * 99 + 99) / 100 - 1];
    st.max = w->ms[w->n - 1];
  }
  free(w->ms);
  return st;
}

/* Lines holding "fenced partition=" in every log of the run. */
static int fo_fenced(const fo_run_t *r) {
  int n = 0;
  for (int i = 0; i < r->logs; i++) {
    char path[128], line[1024];
    snprintf(path, sizeof(path), "%s/worker-%d.log", r->dir, i);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f))
      n += strstr(line, "fenced partition=") != NULL;
    if (f)
      fclose(f);
  }
  return n;
}

/* ---- one scenario ----------------------------------------------------- */

/* The disturbance; @returns 0, or -1 with res->error set. */
static int fo_disturb(fo_run_t *r, fo_result_t *res) {
  const fo_opts_t *o = r->o;
  switch (r->scn->kind) {
  case FO_ROLL:
    for (int s = 0; s < o->workers; s++) {
      kill(r->pid[s], SIGTERM);
      if (fo_reap(r, s, 60000) != 0)
        res->exits_failed++;
      fo_spawn(r, s);
      int t = 0;
      while (fo_owned(r, s, NULL) == 0 && t++ < 600)
        kl_t_sleep_ms(50);
      if (s + 1 < o->workers)
        kl_t_sleep_ms((int)o->gap * 1000);
    }
    return 0;
  case FO_KILL_RESTART:
  case FO_KILL:
    kill(r->pid[0], SIGKILL);
    fo_reap(r, 0, 10000);
    if (r->scn->kind == FO_KILL)
      return 0;
    kl_t_sleep_ms(1000);
    fo_spawn(r, 0);
    return 0;
  case FO_STOP:
    kill(r->pid[0], SIGSTOP);
    kl_t_sleep_ms((int)o->session_ms + 3000);
    kill(r->pid[0], SIGCONT);
    return 0;
  }
  fo_fail(res, "unknown scenario");
  return -1;
}

static void fo_target(const fo_opts_t *o, fo_result_t *res) {
  const fo_stats_t *d = &res->during;
  switch (res->scn->kind) {
  case FO_ROLL:
    snprintf(res->target, sizeof(res->target),
             "p99 <= 2 x steady, longest <= 1 s");
    res->met = d->p99 <= 2 * res->steady.p99 && d->max <= 1000;
    break;
  case FO_KILL_RESTART:
    snprintf(res->target, sizeof(res->target), "longest <= 3 s");
    res->met = d->max <= 3000;
    break;
  case FO_KILL:
    snprintf(res->target, sizeof(res->target), "longest <= session + 2 s");
    res->met = d->max <= o->session_ms + 2000;
    break;
  case FO_STOP:
    snprintf(res->target, sizeof(res->target),
             "zombie fenced, nothing applied twice");
    res->met = 1;
    break;
  }
  res->met = res->met && res->nothing_twice && d->n > 0;
}

/* Stops the publisher, waits for every event, stops the workers, then
 * reads the waits and checks the ledger. */
static void fo_finish(fo_run_t *r, fo_pub_t *pub, fo_walk_t *walk,
                      fo_result_t *res) {
  atomic_store(&pub->stop, 1);
  pthread_join(pub->thread, NULL);
  walk->until = kl__now_ms();
  if (pub->failed || kl_flush(pub->producer, 30000) != KL_OK)
    fo_fail(res, "publishing failed: %s", kl_err_detail());
  if (kl__ledger_gen_wait(pub->gen, r->store, r->topic, 0, 60000))
    fo_fail(res, "not every event was applied 60 s after the last publish");
  for (int s = 0; s < r->o->workers; s++)
    if (r->pid[s]) {
      kill(r->pid[s], SIGTERM);
      if (fo_reap(r, s, 60000) != 0)
        res->exits_failed++;
    }
  kl__ledger_verdict_t v;
  if (kl__ledger_gen_verify(pub->gen, r->store, r->topic, &v) == KL_OK) {
    res->published = kl__ledger_gen_published(pub->gen);
    res->applied = v.applied, res->duplicates = v.duplicates;
    res->nothing_twice =
        v.ok && v.applied == res->published && v.duplicates == 0;
  }
  if (kl__store_ids_walk(r->store, fo_walk_id, walk) != KL_OK || walk->oom)
    fo_fail(res, "reading the store's ids: %s", kl_err_detail());
  res->steady = fo_stats(&walk->steady);
  res->during = fo_stats(&walk->during);
  res->fenced = fo_fenced(r);
  fo_target(r->o, res);
}

/* Runs @p scn on its own topic (a name of the cluster of
 * KEYLANE_TEST_BOOTSTRAP), deleted at the end. */
static void fo_scenario(const fo_opts_t *o, const fo_scenario_t *scn,
                        fo_result_t *res) {
  *res = (fo_result_t){.scn = scn};
  char dlq[64];
  snprintf(dlq, sizeof(dlq), "%s-dlq", scn->name);
  kl_t_cluster_t *cluster = NULL;
  if (kl_t_cluster_new(1, scn->name, (int)o->partitions, &cluster) ||
      kl_t_cluster_topic_create(cluster, dlq, 1)) {
    fo_fail(res, "cannot create its topics: %s", kl_err_detail());
    kl_t_cluster_destroy(cluster);
    return;
  }
  fo_run_t r = {.o = o, .scn = scn, .boot = kl_t_bootstrap(cluster)};
  r.topic = kl_t_topic(cluster);
  r.dlq = kl_t_name(cluster, dlq);
  r.group = kl_t_group(cluster, scn->name);
  snprintf(r.session, sizeof(r.session), "%" PRId64, o->session_ms);
  kl_t_tmpdir(r.dir);
  if (kl_store_open(r.dir, NULL, &r.store) != KL_OK) {
    fo_fail(res, "cannot open the store %s: %s", r.dir, kl_err_detail());
    return;
  }
  fo_pub_t pub = {.topic = r.topic, .rate = o->rate};
  pub.gen = kl__ledger_gen_new(1000, (int32_t)o->partitions, 28);
  pub.producer = kl_t_producer(r.boot, pub.gen);
  for (int s = 0; s < o->workers; s++)
    fo_spawn(&r, s);
  fo_walk_t walk = {0};
  if (!pub.producer || fo_await_settled(&r)) {
    fo_fail(res,
            "the workers did not settle on the partitions in 60 s "
            "(logs in %s)",
            r.dir);
  } else {
    pthread_create(&pub.thread, NULL, fo_pub_main, &pub);
    kl_t_sleep_ms((int)o->warmup * 1000);
    walk.steady_from = kl__now_ms();
    kl_t_sleep_ms((int)o->steady * 1000);
    /* What was published just before is still in flight: it waits too. */
    walk.during_from = kl__now_ms() - (o->steady * 1000 > 2 * FO_IN_FLIGHT_MS
                                           ? FO_IN_FLIGHT_MS
                                           : o->steady * 1000 / 2);
    fo_disturb(&r, res);
    /* Long enough for a takeover after the session timeout; after a
     * rolling restart or a zombie's return, for the group to settle. */
    int64_t settle = scn->kind == FO_ROLL || scn->kind == FO_STOP
                         ? 3000
                         : o->session_ms + 3000;
    kl_t_sleep_ms((int)(o->quick ? settle / 2 : settle));
    fo_finish(&r, &pub, &walk, res);
  }
  for (int s = 0; s < o->workers; s++)
    if (r.pid[s])
      kill(r.pid[s], SIGKILL), fo_reap(&r, s, 10000);
  kl_producer_destroy(pub.producer);
  kl__ledger_gen_destroy(pub.gen);
  kl_store_destroy(r.store);
  if (res->error[0] || !res->nothing_twice || getenv("KEYLANE_TEST_KEEP"))
    fprintf(stderr, "keylane-bench %s: %s: the workers' logs are in %s\n",
            FO_NAME, scn->name, r.dir);
  else
    kl_t_rmrf(r.dir);
  kl_t_cluster_destroy(cluster);
}

/* ---- the report ------------------------------------------------------- */

static json_t *fo_json_stats(const fo_stats_t *st) {
  return json_pack("{sIsIsIsI}", "events", (json_int_t)st->n, "p50_ms",
                   (json_int_t)st->p50, "p99_ms", (json_int_t)st->p99, "max_ms",
                   (json_int_t)st->max);
}

static void fo_print_json(const fo_opts_t *o, const char *where,
                          const fo_result_t *res, size_t n) {
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++) {
    const fo_result_t *x = &res[i];
    json_t *j = json_pack(
        "{sssssssIsIsIsbsisisssb}", "scenario", x->scn->name, "disturbance",
        x->scn->what, "membership", x->scn->statics ? "static" : "dynamic",
        "published", (json_int_t)x->published, "applied",
        (json_int_t)x->applied, "duplicates", (json_int_t)x->duplicates,
        "nothing_applied_twice", x->nothing_twice, "fenced_commits", x->fenced,
        "worker_exits_failed", x->exits_failed, "target", x->target,
        "target_met", x->met);
    json_object_set_new(j, "steady", fo_json_stats(&x->steady));
    json_object_set_new(j, "during", fo_json_stats(&x->during));
    json_object_set_new(j, "error",
                        x->error[0] ? json_string(x->error) : json_null());
    json_array_append_new(list, j);
  }
  json_t *top = json_pack(
      "{sssIsIsIsIsIsI}", "cluster", where, "workers", (json_int_t)o->workers,
      "partitions", (json_int_t)o->partitions, "rate", (json_int_t)o->rate,
      "session_timeout_ms", (json_int_t)o->session_ms, "warmup_s",
      (json_int_t)o->warmup, "steady_s", (json_int_t)o->steady);
  json_object_set_new(top, "scenarios", list);
  kl_bench_json(top);
}

static void fo_print(const fo_opts_t *o, const char *where,
                     const fo_result_t *res, size_t n) {
  if (o->json) {
    fo_print_json(o, where, res, n);
    return;
  }
  printf("failover, %s: %" PRId64 " workers, %" PRId64 " partitions, %" PRId64
         " events/s, session.timeout.ms %" PRId64 "\n"
         "publish -> applied in ms: steady state (%" PRId64
         " s), and during: from 1 s before the disturbance on\n\n",
         where, o->workers, o->partitions, o->rate, o->session_ms, o->steady);
  printf("  %-25s %-8s %7s %7s %8s %8s %-6s %6s  %s\n", "disturbance",
         "members", "steady", "", "during", "", "once", "fenced", "target");
  printf("  %-25s %-8s %7s %7s %8s %8s\n", "", "", "p99", "max", "p99",
         "longest");
  for (size_t i = 0; i < n; i++) {
    const fo_result_t *x = &res[i];
    if (x->error[0]) {
      printf("  %-25s %-8s failed: %s\n", x->scn->what,
             x->scn->statics ? "static" : "dynamic", x->error);
      continue;
    }
    printf("  %-25s %-8s %7" PRId64 " %7" PRId64 " %8" PRId64 " %8" PRId64
           " %-6s %6d  %s: %s\n",
           x->scn->what, x->scn->statics ? "static" : "dynamic", x->steady.p99,
           x->steady.max, x->during.p99, x->during.max,
           x->nothing_twice ? "yes" : "NO", x->fenced, x->target,
           x->met ? "met" : "NOT met");
  }
  printf("\n  once: every event applied exactly once, every balance as "
         "published;\n  fenced: commits a newer owner's epoch refused "
         "(a zombie's)\n");
}

/* ---- options ---------------------------------------------------------- */

static void fo_usage(void) {
  printf(
      "usage: keylane-bench failover [--workers N] [--partitions P]\n"
      "         [--rate R] [--session-timeout-ms MS] [--warmup S]\n"
      "         [--steady S] [--gap S] [--scenarios LIST] [--quick]\n"
      "         [--bootstrap B | --kafka-port P] [--keylane PATH] [--json]\n\n"
      "Runs N `keylane worker` processes (default 3) on P partitions\n"
      "(default 8) under R events/s (default 1000), sessions of MS ms\n"
      "(default 10000), and disturbs them:\n"
      "  roll          SIGTERM and start again each worker in turn, S s\n"
      "                apart (--gap, default 3)\n"
      "  kill-restart  SIGKILL one, start it again 1 s later\n"
      "  kill          SIGKILL one for good\n"
      "  stop          SIGSTOP one past the session timeout, then SIGCONT\n"
      "each with dynamic and with static members (--instance-id):\n"
      "roll-dynamic, roll-static, ..., stop-static. --scenarios takes a\n"
      "comma-separated list of those names, kinds or all; the default,\n"
      "%s, takes about 4 minutes.\n"
      "Prints per scenario p99 and the longest wait, publish -> applied\n"
      "(exact per event, from the store), in the steady state (S s,\n"
      "--steady, default 5, after --warmup, default 2) and from 1 s before\n"
      "the disturbance on; whether every event was applied exactly once;\n"
      "the commits a fence refused; and issue 28's target, met or not.\n"
      "Without --bootstrap it starts a real single-node Kafka with\n"
      "deploy/kafka/kafka.sh (KEYLANE_KAFKA_SH) on port P (default: from\n"
      "the process id) and deletes it at the end. --keylane: the keylane\n"
      "program (default: the one beside keylane-bench). KEYLANE_TEST_KEEP\n"
      "set: the workers' logs are kept.\n"
      "--quick: 2 workers, 4 partitions, 200 events/s, 3000 ms sessions,\n"
      "1 s windows, and %s\n"
      "(a smoke test; the broker must accept 3 s sessions).\n",
      fo_default_list, fo_quick_list);
}

/* Whether @p scn is in the comma-separated @p list of names, kinds or
 * "all". */
static int fo_selected(const char *list, const fo_scenario_t *scn) {
  size_t kind = (size_t)(strrchr(scn->name, '-') - scn->name);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if ((len == strlen(scn->name) && !strncmp(p, scn->name, len)) ||
        (len == kind && !strncmp(p, scn->name, len)) ||
        (len == 3 && !strncmp(p, "all", 3)))
      return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* The keylane beside this program. */
static const char *fo_keylane(char *buf, size_t size) {
  ssize_t n = readlink("/proc/self/exe", buf, size - 16);
  if (n <= 0)
    return "keylane";
  buf[n] = '\0';
  char *dir = dirname(buf);
  memmove(buf, dir, strlen(dir) + 1);
  strcat(buf, "/keylane");
  return buf;
}

static int fo_opts(int argc, char **argv, fo_opts_t *o) {
  static char keylane[1024];
  *o = (fo_opts_t){.workers = 3,
                   .partitions = 8,
                   .rate = 1000,
                   .session_ms = 10000,
                   .warmup = 2,
                   .steady = 5,
                   .gap = 3,
                   .kafka_port = 30000 + 10 * (getpid() % 300)};
  int64_t workers = 0, partitions = 0, rate = 0, session = 0, steady = 0;
  int64_t warmup = 0, gap = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "workers", .max = FO_WORKERS_MAX, .out = &workers},
      {.name = "partitions", .max = FO_PARTS_MAX, .out = &partitions},
      {.name = "rate", .max = 100000, .out = &rate},
      {.name = "session-timeout-ms", .max = 300000, .out = &session},
      {.name = "warmup", .max = 600, .out = &warmup},
      {.name = "steady", .max = 600, .out = &steady},
      {.name = "gap", .max = 600, .out = &gap},
      {.name = "kafka-port", .max = 65000, .out = &o->kafka_port},
      {.name = "scenarios", .text = &o->scenarios},
      {.name = "bootstrap", .text = &o->bootstrap},
      {.name = "keylane", .text = &o->keylane},
      {.name = "quick", .on = &o->quick},
      {0}};
  int rc = kl_bench_flags(FO_NAME, argc, argv, flags, &o->json, fo_usage);
  if (rc)
    return rc;
  if (o->quick) {
    o->workers = 2, o->partitions = 4, o->rate = 200, o->session_ms = 3000;
    o->warmup = 1, o->steady = 1, o->gap = 1;
  }
  o->workers = workers ? workers : o->workers;
  o->partitions = partitions ? partitions : o->partitions;
  o->rate = rate ? rate : o->rate;
  o->session_ms = session ? session : o->session_ms;
  o->warmup = warmup ? warmup : o->warmup;
  o->steady = steady ? steady : o->steady;
  o->gap = gap ? gap : o->gap;
  if (!o->scenarios)
    o->scenarios = o->quick ? fo_quick_list : fo_default_list;
  if (!o->keylane)
    o->keylane = fo_keylane(keylane, sizeof(keylane));
  size_t any = 0;
  for (size_t i = 0; i < FO_NSCENARIOS; i++)
    any += fo_selected(o->scenarios, &fo_scenarios[i]);
  if (!any) {
    fprintf(stderr,
            "keylane-bench %s: --scenarios %s names none of roll, "
            "kill-restart, kill, stop (each -dynamic or -static)\n",
            FO_NAME, o->scenarios);
    return 2;
  }
  if (o->workers > o->partitions || o->workers < 2) {
    fprintf(stderr,
            "keylane-bench %s: --workers %" PRId64 " with --partitions %" PRId64
            ": want 2 or more workers, and a partition for each\n",
            FO_NAME, o->workers, o->partitions);
    return 2;
  }
  return 0;
}

int kl_bench_failover(int argc, char **argv) {
  fo_opts_t o;
  int rc = fo_opts(argc, argv, &o);
  if (rc)
    return rc < 0 ? 0 : rc;
  char kdir[64] = "";
  char *started = NULL;
  const char *boot = o.bootstrap, *where = "given cluster";
  if (!boot) {
    static const char *const configs[] = {"group.min.session.timeout.ms=1000",
                                          NULL};
    kl_t_tmpdir(kdir);
    if (!(started =
              kl_bench_kafka_start(FO_NAME, kdir, o.kafka_port, configs))) {
      kl_t_rmrf(kdir);
      return 1;
    }
    boot = started;
    where = "real Kafka (kafka.sh, 1 node)";
  }
  setenv("KEYLANE_TEST_BOOTSTRAP", boot, 1);
  fo_result_t res[FO_NSCENARIOS];
  size_t n = 0;
  for (size_t i = 0; i < FO_NSCENARIOS; i++) {
    if (!fo_selected(o.scenarios, &fo_scenarios[i]))
      continue;
    fprintf(stderr, "keylane-bench %s: %s...\n", FO_NAME, fo_scenarios[i].name);
    fo_scenario(&o, &fo_scenarios[i], &res[n]);
    rc |= res[n].error[0] || !res[n].nothing_twice;
    n++;
  }
  fo_print(&o, where, res, n);
  if (started) {
    kl_bench_kafka_stop(FO_NAME, kdir);
    kl_t_rmrf(kdir);
    free(started);
  }
  return rc;
}
