/*
 * keylane-bench exec: events/s through the exec handler, end to end.
 *
 * N ledger events (1,000 keys) are loaded once into an embedded cluster.
 * Each run is a fresh kl_worker (LMDB store, durability none: the handler
 * is what is measured) whose handler is a trivial Python child
 * (json.loads, json.dumps, flush) that answers "ok", run as the CLI runs
 * it (kl__exec_configure()). Runs, each named by its key in --json's
 * object (NAME_eps), so no two names are alike:
 *   lockstep      the child does not echo "seq": one event at a time, the
 *                 old protocol, at --concurrency 1 with window 1 (inline)
 *   old-child     the same child with the window set: an old handler
 *                 under a worker configured for pipelining
 *   c1            echoes "seq", --concurrency 1 (one child, pipelined)
 *   c4-window1    echoes "seq", --concurrency 4 with window 1: four
 *                 children, one event each
 *   c4-pipelined  echoes "seq", --concurrency 4 with the window set: four
 *                 children, pipelined
 * Each is timed from the worker's first assignment until every partition's
 * watermark reached its end (the group's first join is a fixed cost).
 */
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "support/support.h"
#include "handlers/exec.h"

#define KL_BX_NAME "exec"
#define KL_BX_TOPIC "bench"
#define KL_BX_PARTS 16

const char kl_bench_echo_py[] =
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    r = json.loads(line)\n"
    "    sys.stdout.write(json.dumps({'seq': r['seq'], 'status': 'ok'}) + "
    "'\\n')\n"
    "    sys.stdout.flush()\n";
static const char kl_bx_lockstep[] =
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    r = json.loads(line)\n"
    "    sys.stdout.write(json.dumps({'status': 'ok'}) + '\\n')\n"
    "    sys.stdout.flush()\n";

typedef struct kl_bx_run {
  const char *name;
  const char *script;
  const char *concurrency;
  const char *window; /* NULL: --window */
  double eps;
} kl_bx_run_t;

typedef struct kl_bx_caught {
  const kl__ledger_gen_t *gen;
  int32_t parts;
} kl_bx_caught_t;

static int kl_bx_part(void *opaque, const char *topic, int32_t partition,
                      const kl_partition_state_t *state) {
  kl_bx_caught_t *c = opaque;
  if (strcmp(topic, KL_BX_TOPIC) == 0 &&
      state->watermark >= kl__ledger_gen_end(c->gen, partition))
    c->parts++;
  return 0;
}

static void *kl_bx_main(void *opaque) {
  kl_worker_run(opaque);
  return NULL;
}

static kl_conf_t *kl_bx_conf(const char *boot, const char *group,
                             const kl_bx_run_t *run) {
  kl_conf_t *conf = kl_conf_new();
  const char *kv[][2] = {{"kafka.bootstrap.servers", boot},
                         {"worker.group", group},
                         {"worker.concurrency", run->concurrency},
                         {"worker.exec.window", run->window},
                         {"store.durability", "none"}};
  for (size_t i = 0; conf && i < sizeof(kv) / sizeof(kv[0]); i++)
    if (kl_conf_set(conf, kv[i][0], kv[i][1])) {
      kl_conf_destroy(conf);
      return NULL;
    }
  return conf;
}

/* One run: @returns events/s from the first assignment, or -1. */
static double kl_bx_once(const char *boot, kl__ledger_gen_t *gen,
                         int64_t events, const kl_bx_run_t *run, int i) {
  char dir[64], path[96], cmd[160], group[32];
  kl_t_tmpdir(dir);
  snprintf(path, sizeof(path), "%s/handler.py", dir);
  snprintf(cmd, sizeof(cmd), "exec python3 %s", path);
  snprintf(group, sizeof(group), "exec-%d", i);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(run->script, f);
    fclose(f);
  }
  kl_conf_t *conf = kl_bx_conf(boot, group, run);
  kl__exec_t *exec = NULL;
  kl_store_t *store = NULL;
  kl_worker_t *worker = NULL;
  double eps = -1;
  if (f && conf && kl__exec_new(cmd, &exec) == KL_OK &&
      kl__exec_configure(exec, conf) == KL_OK &&
      kl_store_open(dir, conf, &store) == KL_OK &&
      kl_worker_new(conf, KL_BX_TOPIC, store, kl__exec_handler, exec,
                    &worker) == KL_OK) {
    pthread_t thread;
    pthread_create(&thread, NULL, kl_bx_main, worker);
    kl_worker_stats_t st = {0};
    double t0 = kl_bench_now();
    while (st.owned == 0 && kl_bench_now() - t0 < 60) {
      kl_t_sleep_ms(1);
      kl_worker_stats(worker, &st, sizeof(st));
    }
    double t1 = kl_bench_now();
    kl_bx_caught_t c = {gen, 0};
    while (c.parts < KL_BX_PARTS && kl_bench_now() - t1 < 300) {
      kl_t_sleep_ms(2);
      c.parts = 0;
      kl_store_foreach_partition(store, kl_bx_part, &c);
    }
    double s = kl_bench_now() - t1;
    kl_worker_stop(worker);
    pthread_join(thread, NULL);
    kl_worker_stats(worker, &st, sizeof(st));
    if (c.parts == KL_BX_PARTS && st.applied == (uint64_t)events)
      eps = (double)events / s;
    else
      fprintf(stderr,
              "keylane-bench exec: %s applied %" PRIu64 " of %" PRId64
              " events\n",
              run->name, st.applied, events);
  } else {
    fprintf(stderr, "keylane-bench exec: %s: %s\n", run->name, kl_err_detail());
  }
  kl_worker_destroy(worker);
  kl__exec_destroy(exec);
  kl_store_destroy(store);
  kl_conf_destroy(conf);
  kl_t_rmrf(dir);
  return eps;
}

static void kl_bx_print(const kl_bx_run_t *runs, size_t n, int64_t events,
                        int json) {
  double base = runs[0].eps;
  if (json) {
    json_t *o = json_pack("{sI}", "events", (json_int_t)events);
    for (size_t i = 0; i < n; i++) {
      char name[32];
      snprintf(name, sizeof(name), "%s_eps", runs[i].name);
      json_object_set_new(o, name, json_real(runs[i].eps));
    }
    kl_bench_json(o);
    return;
  }
  printf("exec handler (python3, trivial), %" PRId64 " events, %d "
         "partitions, from the first assignment\n",
         events, KL_BX_PARTS);
  for (size_t i = 0; i < n; i++)
    printf("  %-12s --concurrency %s, window %4s: %10.0f events/s (x%.1f)\n",
           runs[i].name, runs[i].concurrency, runs[i].window, runs[i].eps,
           runs[i].eps / base);
}

static void kl_bx_help(void) {
  printf("usage: keylane-bench exec [--events N] [--window N] [--json]\n\n"
         "A worker with a trivial python3 exec handler over N events\n"
         "(default 100000) on an embedded cluster: the old one-at-a-time\n"
         "protocol, then seq-echoing children at --concurrency 1 and 4\n"
         "(worker.exec.window N each, default 8).\n");
}

int kl_bench_exec(int argc, char **argv) {
  int64_t events = 100000, window = 8;
  int json = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "events", .max = 10000000, .out = &events},
      {.name = "window", .max = 1024, .out = &window},
      {0}};
  int parsed = kl_bench_flags(KL_BX_NAME, argc, argv, flags, &json, kl_bx_help);
  if (parsed)
    return parsed < 0 ? 0 : parsed;
  kl_embedded_t *cluster;
  if (kl_embedded_new(1, KL_BX_TOPIC, KL_BX_PARTS, &cluster)) {
    fprintf(stderr, "cluster: %s\n", kl_err_detail());
    return 1;
  }
  const char *boot = kl_embedded_bootstrap(cluster);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(1000, KL_BX_PARTS, 1);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  int rc = producer && kl_bench_load(producer, gen, KL_BX_TOPIC, events, 0) == 0
               ? 0
               : 1;
  char w[24];
  snprintf(w, sizeof(w), "%" PRId64, window);
  kl_bx_run_t runs[] = {{"lockstep", kl_bx_lockstep, "1", "1", 0},
                        {"old-child", kl_bx_lockstep, "1", w, 0},
                        {"c1", kl_bench_echo_py, "1", w, 0},
                        {"c4-window1", kl_bench_echo_py, "4", "1", 0},
                        {"c4-pipelined", kl_bench_echo_py, "4", w, 0}};
  size_t n = sizeof(runs) / sizeof(runs[0]);
  for (size_t i = 0; rc == 0 && i < n; i++)
    if ((runs[i].eps = kl_bx_once(boot, gen, events, &runs[i], (int)i)) < 0)
      rc = 1;
  if (rc == 0)
    kl_bx_print(runs, n, events, json);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_embedded_destroy(cluster);
  return rc;
}
