/*
 * keylane-bench latency: how soon a published event takes effect.
 *
 * Publishes ledger events with kl_publish at a fixed rate (--rate) for
 * --seconds to a topic of --partitions partitions, and one worker (ledger
 * handler, or an exec handler) with a durable LMDB store applies them.
 * Publishing starts once the worker owns every partition, so the group
 * join is not measured, and the first --warmup seconds are not measured
 * either: a broker just started runs its JVM cold, and on a 2-core machine
 * its tail stays at hundreds of ms for 5-10 s (the warm-up's own publish
 * -> applied is printed, to tell a run it leaked into). --drain-ms after the
 * last publish it reads the worker's own histograms, the ones /metrics serves:
 *   keylane_worker_event_latency_seconds         envelope ts -> commit
 *   keylane_worker_event_commit_latency_seconds  taken from the consumer
 *                                                -> commit
 *   keylane_worker_store_commit_seconds          each group commit's store
 *                                                write (its fsyncs)
 * and prints p50/p99/p999 of each (interpolated within the histogram's
 * buckets; the ts has millisecond resolution) and the backlog: events
 * published but not applied by then.
 *
 * The cluster: --bootstrap B uses B; --embedded an embedded cluster; with
 * neither it starts a real single-node Apache Kafka with
 * deploy/kafka/kafka.sh (KEYLANE_KAFKA_SH overrides the path) in a fresh
 * directory on --kafka-port, and stops and deletes it at the end: the
 * embedded cluster's fetch timing is not Kafka's.
 *
 * --handler none runs no worker and no store: a bare librdkafka consumer
 * with the worker's consumer settings (bench_bare.c) takes the records,
 * and publish -> applied is then publish -> received, read through the
 * same histogram buckets: what Kafka and this machine cost without
 * keylane.
 */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "common/metrics.h"
#include "support/cluster.h"
#include "support/support.h"
#include "handlers/exec.h"
#include "worker/worker_internal.h"
#include "keylane/handlers.h"

#define KL_BL_NAME "latency"
#define KL_BL_SETS_MAX 32
#define KL_BL_BUCKETS_MAX 64

typedef struct kl_bl_opts {
  int64_t rate, seconds, warmup, partitions, drain_ms, kafka_port;
  const char *handler, *bootstrap;
  int embedded, json;
  const char *worker_sets[KL_BL_SETS_MAX];   /* -X key=value */
  const char *producer_sets[KL_BL_SETS_MAX]; /* -P key=value */
  const char *store_sets[KL_BL_SETS_MAX];    /* -S key=value */
  int nworker_sets, nproducer_sets, nstore_sets;
} kl_bl_opts_t;

/* Percentiles of one histogram, from its rendered buckets. */
typedef struct kl_bl_hist {
  double le[KL_BL_BUCKETS_MAX];    /* upper bounds; the last is +Inf */
  double count[KL_BL_BUCKETS_MAX]; /* cumulative */
  int n;
} kl_bl_hist_t;

/* Reads `name_bucket{topic="..",le="X"} N` lines of @p text. */
static void kl_bl_hist_parse(const char *text, const char *name,
                             kl_bl_hist_t *h) {
  char prefix[128];
  int plen = snprintf(prefix, sizeof(prefix), "%s_bucket{", name);
  h->n = 0;
  for (const char *p = strstr(text, prefix); p && h->n < KL_BL_BUCKETS_MAX;
       p = strstr(p + plen, prefix)) {
    const char *le = strstr(p, "le=\"");
    const char *close = le ? strstr(le, "\"} ") : NULL;
    if (!close)
      break;
    h->le[h->n] =
        strncmp(le + 4, "+Inf", 4) == 0 ? INFINITY : strtod(le + 4, NULL);
    h->count[h->n] = strtod(close + 3, NULL);
    h->n++;
  }
}

/* The @p q quantile in seconds, linear within its bucket; INFINITY past the
 * last finite bound; NAN without observations. */
static double kl_bl_quantile(const kl_bl_hist_t *h, double q) {
  double total = h->n ? h->count[h->n - 1] : 0;
  if (total <= 0)
    return NAN;
  double rank = q * total;
  for (int i = 0; i < h->n; i++) {
    if (h->count[i] < rank)
      continue;
    double lo = i ? h->le[i - 1] : 0, below = i ? h->count[i - 1] : 0;
    if (isinf(h->le[i]))
      return INFINITY;
    double in = h->count[i] - below;
    return lo + (h->le[i] - lo) * (in > 0 ? (rank - below) / in : 1);
  }
  return INFINITY;
}

/* ---- the worker ------------------------------------------------------- */

/* The worker, or with --handler none the bare consumer. */
typedef struct kl_bl_worker {
  kl_worker_t *worker;
  kl__exec_t *exec;
  pthread_t thread;
  kl_bench_bare_t *bare;
} kl_bl_worker_t;

static void *kl_bl_worker_main(void *opaque) {
  kl_worker_run(opaque);
  return NULL;
}

static kl_err_t kl_bl_conf_sets(kl_conf_t *conf, const char *const *sets,
                                int n) {
  for (int i = 0; i < n; i++) {
    char key[128];
    const char *eq = strchr(sets[i], '=');
    if (!eq || (size_t)(eq - sets[i]) >= sizeof(key))
      return kl__err(KL_ECONF, "\"%s\": expected KEY=VALUE", sets[i]);
    snprintf(key, sizeof(key), "%.*s", (int)(eq - sets[i]), sets[i]);
    if (kl_conf_set(conf, key, eq + 1))
      return kl__err(KL_ECONF, "%s", kl_err_detail());
  }
  return KL_OK;
}

/* The handler: the ledger, or exec:CMD (exec:trivial writes the trivial
 * python3 one into @p dir); kl_bl_opts() checked the name. */
static kl_err_t kl_bl_handler(const kl_bl_opts_t *o, kl_conf_t *conf,
                              const char *dir, kl_bl_worker_t *w) {
  if (strcmp(o->handler, "ledger") == 0)
    return KL_OK;
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "%s", o->handler + 5);
  if (strcmp(cmd, "trivial") == 0) {
    char path[128];
    snprintf(path, sizeof(path), "%s/handler.py", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(kl_bench_echo_py, f) < 0 || fclose(f))
      return kl__err(KL_EIO, "cannot write %s", path);
    snprintf(cmd, sizeof(cmd), "exec python3 %s", path);
  }
  kl_err_t err = kl__exec_new(cmd, &w->exec);
  return err ? err : kl__exec_configure(w->exec, conf);
}

/* The worker's configuration, the -X settings included, into @p conf. */
static kl_err_t kl_bl_worker_conf(const kl_bl_opts_t *o, const char *boot,
                                  kl_t_cluster_t *cluster, kl_conf_t **conf) {
  const char *kv[][2] = {
      {"kafka.bootstrap.servers", boot},
      {"worker.group", kl_t_group(cluster, "latency")},
      {"worker.dlq.topic", kl_t_name(cluster, "latency-dlq")},
      {"worker.retention.check", "warn"}};
  kl_err_t err = (*conf = kl_conf_new()) ? KL_OK : KL_ENOMEM;
  for (size_t i = 0; !err && i < sizeof(kv) / sizeof(kv[0]); i++)
    err = kl_conf_set(*conf, kv[i][0], kv[i][1]);
  return err ? err : kl_bl_conf_sets(*conf, o->worker_sets, o->nworker_sets);
}

/* The worker, on a thread of its own; with --handler none a bare consumer
 * with the worker's consumer settings instead. */
static kl_err_t kl_bl_worker_start(const kl_bl_opts_t *o, const char *boot,
                                   kl_t_cluster_t *cluster, kl_store_t *store,
                                   const char *dir, kl_bl_worker_t *w) {
  kl_conf_t *conf = NULL;
  kl_err_t err = kl_bl_worker_conf(o, boot, cluster, &conf);
  if (!err && strcmp(o->handler, "none") == 0) {
    err = kl_bench_bare_start(conf, kl_t_topic(cluster), (int32_t)o->partitions,
                              &w->bare);
    kl_conf_destroy(conf);
    return err;
  }
  if (!err)
    err = kl_bl_handler(o, conf, dir, w);
  if (!err)
    err = kl_worker_new(conf, kl_t_topic(cluster), store,
                        w->exec ? kl__exec_handler : kl_ledger_handler, w->exec,
                        &w->worker);
  kl_conf_destroy(conf);
  if (!err)
    pthread_create(&w->thread, NULL, kl_bl_worker_main, w->worker);
  return err;
}

static void kl_bl_worker_stop(kl_bl_worker_t *w) {
  kl_bench_bare_stop(w->bare);
  if (w->worker) {
    kl_worker_stop(w->worker);
    pthread_join(w->thread, NULL);
  }
  kl_worker_destroy(w->worker);
  kl__exec_destroy(w->exec);
}

/* ---- publishing ------------------------------------------------------- */

static kl_producer_t *kl_bl_producer(const kl_bl_opts_t *o, const char *boot,
                                     kl__ledger_gen_t *gen) {
  kl_conf_t *conf = kl_conf_new();
  kl_producer_t *producer = NULL;
  if (kl_conf_set(conf, "kafka.bootstrap.servers", boot) ||
      kl_bl_conf_sets(conf, o->producer_sets, o->nproducer_sets) ||
      kl_producer_new(conf, kl__ledger_gen_on_delivery, gen, &producer))
    fprintf(stderr, "keylane-bench latency: producer: %s\n", kl_err_detail());
  kl_conf_destroy(conf);
  return producer;
}

/* Event i at start + i / rate, on an absolute clock so that a late one
 * does not delay the rest. @returns the events published. */
static int64_t kl_bl_publish(const kl_bl_opts_t *o, int64_t seconds,
                             kl_producer_t *producer, kl__ledger_gen_t *gen,
                             const char *topic) {
  int64_t total = o->rate * seconds;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int64_t i = 0; i < total; i++) {
    int64_t at_ns = (int64_t)start.tv_nsec + i * 1000000000LL / o->rate;
    struct timespec at = {start.tv_sec + (time_t)(at_ns / 1000000000LL),
                          (long)(at_ns % 1000000000LL)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
    kl_err_t err;
    while ((err = kl__ledger_gen_publish(gen, producer, topic)) ==
           KL_EQUEUE_FULL)
      kl_producer_poll(producer, 1);
    if (err) {
      fprintf(stderr, "keylane-bench latency: publish: %s\n", kl_err_detail());
      return i;
    }
    kl_producer_poll(producer, 0);
  }
  return total;
}

/* ---- the run ---------------------------------------------------------- */

typedef struct kl_bl_result {
  int64_t published;
  uint64_t applied;
  kl_bl_hist_t e2e, local, store; /* store: each group commit's duration */
  kl_bl_hist_t warm_e2e;          /* e2e in the warm-up, not measured */
} kl_bl_result_t;

/* The bare consumer is assigned its partitions when it starts. */
static int kl_bl_wait_owned(kl_worker_t *worker, int32_t partitions) {
  kl_worker_stats_t st = {0};
  if (!worker)
    return 0;
  for (double t0 = kl_bench_now(); kl_bench_now() - t0 < 120;) {
    kl_worker_stats(worker, &st, sizeof(st));
    if (st.owned == partitions)
      return 0;
    kl_t_sleep_ms(10);
  }
  fprintf(stderr,
          "keylane-bench latency: the worker owns %" PRId32 " of %" PRId32
          " partitions after 120 s\n",
          st.owned, partitions);
  return -1;
}

/* The worker's applied count and histograms so far; the bare consumer's
 * received count and its one histogram. */
static void kl_bl_read(const kl_bl_worker_t *w, kl_bl_result_t *r) {
  struct kl__metrics *metrics;
  if (w->bare) {
    r->applied = kl_bench_bare_received(w->bare);
    metrics = kl_bench_bare_metrics(w->bare);
  } else {
    kl_worker_stats_t st;
    kl_worker_stats(w->worker, &st, sizeof(st));
    r->applied = st.applied;
    metrics = kl__worker_metrics(w->worker);
  }
  size_t len;
  char *text = kl__metrics_render(metrics, &len);
  kl_bl_hist_parse(text ? text : "", "keylane_worker_event_latency_seconds",
                   &r->e2e);
  kl_bl_hist_parse(text ? text : "",
                   "keylane_worker_event_commit_latency_seconds", &r->local);
  kl_bl_hist_parse(text ? text : "", "keylane_worker_store_commit_seconds",
                   &r->store);
  free(text);
}

/* Leaves in @p h what was observed after @p before (its earlier copy). */
static void kl_bl_hist_minus(kl_bl_hist_t *h, const kl_bl_hist_t *before) {
  for (int i = 0; i < h->n && i < before->n; i++)
    h->count[i] -= before->count[i];
}

/* The LMDB store in @p dir, with the -S settings. */
static kl_err_t kl_bl_store_open(const kl_bl_opts_t *o, const char *dir,
                                 kl_store_t **store) {
  kl_conf_t *conf = kl_conf_new();
  kl_err_t err =
      conf ? kl_bl_conf_sets(conf, o->store_sets, o->nstore_sets) : KL_ENOMEM;
  if (!err)
    err = kl_store_open(dir, conf, store);
  kl_conf_destroy(conf);
  return err;
}

static int kl_bl_measure(const kl_bl_opts_t *o, const char *boot,
                         kl_t_cluster_t *cluster, kl_bl_result_t *r) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store = NULL;
  kl_bl_worker_t w = {0};
  kl__ledger_gen_t *gen = kl__ledger_gen_new(1000, (int32_t)o->partitions, 1);
  kl_producer_t *producer = kl_bl_producer(o, boot, gen);
  kl_err_t err =
      strcmp(o->handler, "none") ? kl_bl_store_open(o, dir, &store) : KL_OK;
  if (!err && producer)
    err = kl_bl_worker_start(o, boot, cluster, store, dir, &w);
  int rc = err || !producer ? -1 : 0;
  if (err)
    fprintf(stderr, "keylane-bench latency: %s\n", kl_err_detail());
  if (!rc)
    rc = kl_bl_wait_owned(w.worker, (int32_t)o->partitions);
  kl_bl_result_t warm = {0};
  if (!rc) {
    warm.published =
        kl_bl_publish(o, o->warmup, producer, gen, kl_t_topic(cluster));
    kl_t_sleep_ms((int)o->drain_ms);
    kl_bl_read(&w, &warm);
  }
  if (!rc) {
    r->published = warm.published + kl_bl_publish(o, o->seconds, producer, gen,
                                                  kl_t_topic(cluster));
    kl_t_sleep_ms((int)o->drain_ms);
    kl_bl_read(&w, r);
    kl_bl_hist_minus(&r->e2e, &warm.e2e);
    kl_bl_hist_minus(&r->local, &warm.local);
    kl_bl_hist_minus(&r->store, &warm.store);
    r->warm_e2e = warm.e2e;
    kl_flush(producer, 10000);
  }
  kl_bl_worker_stop(&w);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
  return rc;
}

static json_t *kl_bl_json_hist(const kl_bl_hist_t *h) {
  const double q[] = {0.5, 0.99, 0.999};
  const char *k[] = {"p50_ms", "p99_ms", "p999_ms"};
  json_t *o = json_object();
  for (int i = 0; i < 3; i++) {
    double v = kl_bl_quantile(h, q[i]);
    json_object_set_new(o, k[i],
                        isfinite(v) ? json_real(v * 1e3) : json_null());
  }
  return o;
}

static void kl_bl_print_hist(const char *what, const kl_bl_hist_t *h) {
  printf("  %-36s", what);
  const double q[] = {0.5, 0.99, 0.999};
  const char *k[] = {"p50", "p99", "p999"};
  for (int i = 0; i < 3; i++) {
    double v = kl_bl_quantile(h, q[i]);
    if (isfinite(v))
      printf(" %s %7.2f ms", k[i], v * 1e3);
    else
      printf(" %s %10s", k[i], isnan(v) ? "-" : "> last");
  }
  printf("\n");
}

static void kl_bl_print(const kl_bl_opts_t *o, const char *where,
                        const kl_bl_result_t *r) {
  int64_t backlog = r->published - (int64_t)r->applied;
  if (o->json) {
    json_t *j = json_pack(
        "{sssssIsIsIsIsIsIsI}", "cluster", where, "handler", o->handler, "rate",
        (json_int_t)o->rate, "seconds", (json_int_t)o->seconds, "partitions",
        (json_int_t)o->partitions, "published", (json_int_t)r->published,
        "applied", (json_int_t)r->applied, "backlog",
        (json_int_t)(backlog > 0 ? backlog : 0), "drain_ms",
        (json_int_t)o->drain_ms);
    json_object_set_new(j, "warmup_s", json_integer(o->warmup));
    json_object_set_new(j, "publish_to_applied", kl_bl_json_hist(&r->e2e));
    json_object_set_new(j, "taken_to_applied", kl_bl_json_hist(&r->local));
    json_object_set_new(j, "store_commit", kl_bl_json_hist(&r->store));
    json_object_set_new(j, "warmup_publish_to_applied",
                        kl_bl_json_hist(&r->warm_e2e));
    json_dumpf(j, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(j);
    return;
  }
  printf("latency, %s, handler %s, %" PRId64 " events/s for %" PRId64
         " s, %" PRId64 " partitions\n",
         where, o->handler, o->rate, o->seconds, o->partitions);
  kl_bl_print_hist(strcmp(o->handler, "none")
                       ? "publish (envelope ts) -> applied:"
                       : "publish (envelope ts) -> received:",
                   &r->e2e);
  kl_bl_print_hist("taken from the consumer -> applied:", &r->local);
  kl_bl_print_hist("each store commit (group commit):", &r->store);
  kl_bl_print_hist("warm-up (not measured), publish ->", &r->warm_e2e);
  printf("  published %" PRId64 ", applied %" PRIu64 " (warm-up included), "
         "backlog %" PRId64 " events %" PRId64 " ms after the last publish\n",
         r->published, r->applied, backlog > 0 ? backlog : 0, o->drain_ms);
}

/* ---- options ---------------------------------------------------------- */

static void kl_bl_usage(void) {
  printf(
      "usage: keylane-bench latency [--rate R] [--seconds S] [--partitions N]\n"
      "         [--warmup W]\n"
      "         [--handler ledger|exec:trivial|exec:COMMAND|none]\n"
      "         [--bootstrap B | --embedded | --kafka-port P] [--drain-ms MS]\n"
      "         [-X KEY=VALUE]... [-P KEY=VALUE]... [-S KEY=VALUE]...\n"
      "         [--json]\n\n"
      "Publishes ledger events with kl_publish at R events/s (default 2000)\n"
      "for S seconds (default 10) to N partitions (default 8); one worker\n"
      "with a durable LMDB store applies them, after W s (default 10) at\n"
      "the same rate that are not measured: a fresh broker's JVM is cold,\n"
      "and on a 2-core machine its tail stays at hundreds of ms for 5-10 s\n"
      "(the warm-up's own publish -> applied is printed too, to see it).\n"
      "Prints p50/p99/p999 of\n"
      "publish (envelope ts) -> applied and of taken-from-the-consumer ->\n"
      "applied and of each store commit, from the worker's histograms, and\n"
      "the events not applied\n"
      "MS (default 2000) after the last publish.\n"
      "--handler none runs no worker: a bare librdkafka consumer with the\n"
      "worker's consumer settings takes the records, and publish ->\n"
      "applied is then publish -> received: what Kafka and this machine\n"
      "cost without keylane (the other two figures are \"-\", null in\n"
      "JSON).\n"
      "Without --bootstrap or --embedded it starts a real single-node Kafka\n"
      "with deploy/kafka/kafka.sh (KEYLANE_KAFKA_SH) on port P (default:\n"
      "from the process id) and deletes it at the end.\n"
      "-X sets a worker setting (-X worker.batch.wait.ms=5), -P a producer\n"
      "one (-P kafka.linger.ms=1), -S a store one (-S store.durability=meta;\n"
      "the default is full, an fsync per commit: keylane-bench fsync\n"
      "measures that floor).\n");
}

static int kl_bl_set(const char *flag, const char **sets, int *n,
                     const char *arg) {
  if (*n == KL_BL_SETS_MAX) {
    fprintf(stderr, "keylane-bench latency: at most %d %s\n", KL_BL_SETS_MAX,
            flag);
    return 2;
  }
  sets[(*n)++] = arg;
  return 0;
}

static int kl_bl_opts(int argc, char **argv, kl_bl_opts_t *o) {
  static const struct option opts[] = {
      {"rate", required_argument, NULL, 'r'},
      {"seconds", required_argument, NULL, 's'},
      {"warmup", required_argument, NULL, 'w'},
      {"partitions", required_argument, NULL, 'n'},
      {"handler", required_argument, NULL, 'H'},
      {"bootstrap", required_argument, NULL, 'b'},
      {"embedded", no_argument, NULL, 'e'},
      {"kafka-port", required_argument, NULL, 'k'},
      {"drain-ms", required_argument, NULL, 'd'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  *o = (kl_bl_opts_t){.rate = 2000,
                      .seconds = 10,
                      .partitions = 8,
                      .drain_ms = 2000,
                      .warmup = 10,
                      .handler = "ledger",
                      .kafka_port = 30000 + 10 * (getpid() % 300)};
  int c, rc = 0;
  optind = 1;
  while (!rc && (c = getopt_long(argc, argv, "hX:P:S:", opts, NULL)) != -1) {
    switch (c) {
    case 'r':
      rc = kl_bench_count(KL_BL_NAME, "--rate", optarg, 1000000, &o->rate);
      break;
    case 's':
      rc = kl_bench_count(KL_BL_NAME, "--seconds", optarg, 3600, &o->seconds);
      break;
    case 'w':
      rc = kl_bench_count(KL_BL_NAME, "--warmup", optarg, 3600, &o->warmup);
      break;
    case 'n':
      rc = kl_bench_count(KL_BL_NAME, "--partitions", optarg, 1024,
                          &o->partitions);
      break;
    case 'k':
      rc = kl_bench_count(KL_BL_NAME, "--kafka-port", optarg, 65000,
                          &o->kafka_port);
      break;
    case 'd':
      rc = kl_bench_count(KL_BL_NAME, "--drain-ms", optarg, 600000,
                          &o->drain_ms);
      break;
    case 'H':
      o->handler = optarg;
      break;
    case 'b':
      o->bootstrap = optarg;
      break;
    case 'e':
      o->embedded = 1;
      break;
    case 'j':
      o->json = 1;
      break;
    case 'X':
      rc = kl_bl_set("-X", o->worker_sets, &o->nworker_sets, optarg);
      break;
    case 'P':
      rc = kl_bl_set("-P", o->producer_sets, &o->nproducer_sets, optarg);
      break;
    case 'S':
      rc = kl_bl_set("-S", o->store_sets, &o->nstore_sets, optarg);
      break;
    case 'h':
      kl_bl_usage();
      return -1;
    default:
      rc = 2;
    }
  }
  if (!rc && strcmp(o->handler, "none") && strcmp(o->handler, "ledger") &&
      (strncmp(o->handler, "exec:", 5) || !o->handler[5])) {
    fprintf(stderr,
            "keylane-bench latency: --handler %s: expected ledger, "
            "exec:trivial, exec:COMMAND or none\n",
            o->handler);
    rc = 2;
  }
  if (!rc && o->bootstrap && o->embedded) {
    fprintf(stderr, "keylane-bench latency: --bootstrap or --embedded, not "
                    "both\n");
    rc = 2;
  }
  return rc;
}

int kl_bench_latency(int argc, char **argv) {
  kl_bl_opts_t o;
  int rc = kl_bl_opts(argc, argv, &o);
  if (rc)
    return rc < 0 ? 0 : rc;
  char kdir[64] = "";
  char *started = NULL;
  const char *boot = o.bootstrap, *where = "given cluster";
  if (!boot && !o.embedded) {
    kl_t_tmpdir(kdir);
    if (!(started =
              kl_bench_kafka_start(KL_BL_NAME, kdir, o.kafka_port, NULL))) {
      kl_t_rmrf(kdir);
      return 1;
    }
    boot = started;
    where = "real Kafka (kafka.sh, 1 node)";
  }
  if (o.embedded)
    where = "embedded cluster";
  if (boot)
    setenv("KEYLANE_TEST_BOOTSTRAP", boot, 1);
  else
    unsetenv("KEYLANE_TEST_BOOTSTRAP");
  kl_t_cluster_t *cluster = NULL;
  kl_bl_result_t r = {0};
  rc = 1;
  if (kl_t_cluster_new(1, "latency", (int)o.partitions, &cluster) == KL_OK &&
      kl_t_cluster_topic_create(cluster, "latency-dlq", 1) == KL_OK &&
      kl_bl_measure(&o, kl_t_bootstrap(cluster), cluster, &r) == 0) {
    kl_bl_print(&o, where, &r);
    rc = 0;
  }
  kl_t_cluster_destroy(cluster);
  if (started) {
    kl_bench_kafka_stop(KL_BL_NAME, kdir);
    kl_t_rmrf(kdir);
    free(started);
  }
  return rc;
}
