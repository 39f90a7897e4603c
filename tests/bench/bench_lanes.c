/*
 * keylane-bench lanes: how close key-parallel lanes come to the ideal
 * speed-up on slow handlers.
 *
 * The shape of Confluent Parallel Consumer's published benchmark: one
 * partition, 10,000 events over 1,000 keys, a handler that sleeps a
 * uniform 0-5 ms (mean 2.5 ms, seeded, so every run sleeps the same), 16
 * threads. Ideal = 10,000 x 2.5 ms / 16 = 1.5625 s; the run is timed from
 * the first event handled to the last one committed (the worker's applied
 * counter, which moves after each group commit), on an embedded cluster
 * with a durable LMDB store. ratio = ideal / elapsed; ratio_actual uses the
 * sum of the sleeps actually drawn instead of the mean.
 *
 * Two more runs show the bounds: concurrency 1 and a single key, where
 * per-key order makes the work serial (ideal = the sum of the sleeps).
 */
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "support/support.h"

#define KL_BL_NAME "lanes"
#define KL_BL_TOPIC "lanes"
#define KL_BL_MEAN_S 0.0025

typedef struct kl_bl_run {
  const char *name;
  int concurrency, keys;
  double elapsed_s, ideal_s, ideal_actual_s;
  int ok;
} kl_bl_run_t;

typedef struct kl_bl_handler {
  _Atomic int64_t first_ns;
} kl_bl_handler_t;

static int64_t kl_bl_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The payload is the sleep, in microseconds (4 bytes, big-endian). */
static kl_handler_result_t kl_bl_handler(void *opaque, const kl_event_t *event,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *errbuf, size_t errbuf_size) {
  (void)fence, (void)txn, (void)errbuf, (void)errbuf_size;
  kl_bl_handler_t *h = opaque;
  int64_t expected = 0;
  atomic_compare_exchange_strong(&h->first_ns, &expected, kl_bl_mono_ns());
  const unsigned char *p = event->payload;
  long us = event->payload_len == 4
                ? (long)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]
                : 0;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
  return KL_HANDLER_OK;
}

static uint64_t kl_bl_next(uint64_t *state) { /* xorshift64* */
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return *state * 2685821657736338717ULL;
}

/* Publishes @p events over @p keys; @returns the sum of the sleeps, s. */
static double kl_bl_publish(const char *boot, int64_t events, int keys) {
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", boot);
  kl_producer_t *producer = NULL;
  if (kl_producer_new(conf, NULL, NULL, &producer)) {
    kl_conf_destroy(conf);
    return -1;
  }
  kl_conf_destroy(conf);
  uint64_t rng = 42;
  double sum = 0;
  for (int64_t i = 0; i < events; i++) {
    char key[16];
    uint32_t us = (uint32_t)(kl_bl_next(&rng) % 5001);
    unsigned char payload[4] = {(unsigned char)(us >> 24),
                                (unsigned char)(us >> 16),
                                (unsigned char)(us >> 8), (unsigned char)us};
    snprintf(key, sizeof(key), "k-%04d", (int)(i % keys));
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "sleep",
                     .type_len = 5,
                     .payload = payload,
                     .payload_len = 4};
    if (kl_publish(producer, KL_BL_TOPIC, &ev, NULL)) {
      kl_producer_destroy(producer);
      return -1;
    }
    sum += us / 1e6;
  }
  kl_err_t err = kl_flush(producer, 60000);
  kl_producer_destroy(producer);
  return err ? -1 : sum;
}

typedef struct kl_bl_worker {
  kl_worker_t *worker;
  kl_err_t result;
} kl_bl_worker_t;

static void *kl_bl_worker_main(void *opaque) {
  kl_bl_worker_t *w = opaque;
  w->result = kl_worker_run(w->worker);
  return NULL;
}

static kl_worker_t *kl_bl_worker_new(const char *boot, kl_store_t *store,
                                     int concurrency, kl_bl_handler_t *h) {
  kl_conf_t *conf = kl_conf_new();
  char c[16];
  snprintf(c, sizeof(c), "%d", concurrency);
  kl_conf_set(conf, "kafka.bootstrap.servers", boot);
  kl_conf_set(conf, "worker.group", "bench-lanes");
  kl_conf_set(conf, "worker.concurrency", c);
  kl_worker_t *worker = NULL;
  if (kl_worker_new(conf, KL_BL_TOPIC, store, kl_bl_handler, h, &worker))
    fprintf(stderr, "keylane-bench lanes: %s\n", kl_err_detail());
  kl_conf_destroy(conf);
  return worker;
}

/* One run on a fresh cluster and store. */
static void kl_bl_run(kl_bl_run_t *run, int64_t events) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_embedded_t *cluster = NULL;
  kl_store_t *store = NULL;
  kl_bl_handler_t h = {0};
  run->ok = 0;
  if (kl_embedded_new(1, KL_BL_TOPIC, 1, &cluster) ||
      kl_store_open(dir, NULL, &store)) {
    fprintf(stderr, "keylane-bench lanes: %s\n", kl_err_detail());
    goto out;
  }
  const char *boot = kl_embedded_bootstrap(cluster);
  double sum = kl_bl_publish(boot, events, run->keys);
  int lanes = run->keys < run->concurrency ? run->keys : run->concurrency;
  run->ideal_s = (double)events * KL_BL_MEAN_S / lanes;
  run->ideal_actual_s = sum / lanes;
  kl_bl_worker_t w = {kl_bl_worker_new(boot, store, run->concurrency, &h), 0};
  if (sum < 0 || !w.worker)
    goto out;
  pthread_t thread;
  pthread_create(&thread, NULL, kl_bl_worker_main, &w);
  int64_t deadline =
      kl_bl_mono_ns() + (int64_t)(run->ideal_s * 4 + 60) * 1000000000;
  kl_worker_stats_t st = {0};
  while (st.applied < (uint64_t)events && kl_bl_mono_ns() < deadline) {
    struct timespec tick = {0, 200000};
    nanosleep(&tick, NULL);
    kl_worker_stats(w.worker, &st, sizeof(st));
  }
  int64_t end = kl_bl_mono_ns();
  run->elapsed_s = (double)(end - h.first_ns) / 1e9;
  run->ok = st.applied == (uint64_t)events;
  kl_worker_stop(w.worker);
  pthread_join(thread, NULL);
  kl_worker_destroy(w.worker);
out:
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  kl_t_rmrf(dir);
}

static void kl_bl_print(const kl_bl_run_t *runs, int n, int64_t events) {
  printf("keylane-bench lanes: %" PRId64 " events, 1 partition, handler "
         "sleeps uniform 0-5 ms (seeded)\n\n",
         events);
  printf("%-22s %9s %10s %9s %9s %7s %12s\n", "run", "elapsed", "events/s",
         "ideal", "ideal(*)", "ratio", "ratio(*)");
  for (int i = 0; i < n; i++) {
    const kl_bl_run_t *r = &runs[i];
    printf("%-22s %8.3fs %10.0f %8.3fs %8.3fs %7.3f %12.3f%s\n", r->name,
           r->elapsed_s, (double)events / r->elapsed_s, r->ideal_s,
           r->ideal_actual_s, r->ideal_s / r->elapsed_s,
           r->ideal_actual_s / r->elapsed_s, r->ok ? "" : "  INCOMPLETE");
  }
  printf("\n(*) from the sleeps actually drawn. Target: ratio >= 0.90 at "
         "concurrency 16 over 1,000 keys\n(<= 1.74 s); Confluent Parallel "
         "Consumer documents 2.06 s (0.76) on this shape.\n");
}

static void kl_bl_json(const kl_bl_run_t *runs, int n, int64_t events) {
  json_t *arr = json_array();
  for (int i = 0; i < n; i++) {
    const kl_bl_run_t *r = &runs[i];
    json_array_append_new(
        arr,
        json_pack("{sssisisfsfsfsfsfsfsb}", "name", r->name, "concurrency",
                  r->concurrency, "keys", r->keys, "elapsed_s", r->elapsed_s,
                  "events_per_s", (double)events / r->elapsed_s, "ideal_s",
                  r->ideal_s, "ideal_actual_s", r->ideal_actual_s, "ratio",
                  r->ideal_s / r->elapsed_s, "ratio_actual",
                  r->ideal_actual_s / r->elapsed_s, "ok", r->ok));
  }
  json_t *o =
      json_pack("{sssIsfso}", "bench", KL_BL_NAME, "events", (json_int_t)events,
                "ratio", runs[0].ideal_s / runs[0].elapsed_s, "runs", arr);
  char *s = json_dumps(o, JSON_COMPACT);
  puts(s);
  free(s);
  json_decref(o);
}

static const char kl_bl_usage[] =
    "usage: keylane-bench lanes [--events N] [--json]\n\n"
    "Key-parallel lanes against the ideal speed-up: 1 partition, 1,000 keys,\n"
    "a handler sleeping a seeded uniform 0-5 ms, concurrency 16; then\n"
    "concurrency 1 and a single key (serial by per-key order).\n\n"
    "      --events N   events per run (default 10000)\n"
    "      --json       one JSON object on stdout\n";

static void kl_bl_help(void) {
  fputs(kl_bl_usage, stdout);
}

int kl_bench_lanes(int argc, char **argv) {
  int64_t events = 10000;
  int json = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "events", .max = 1000000, .out = &events}, {0}};
  int parsed = kl_bench_flags(KL_BL_NAME, argc, argv, flags, &json, kl_bl_help);
  if (parsed)
    return parsed < 0 ? 0 : parsed;
  kl_bl_run_t runs[] = {{"concurrency 16, 1000 keys", 16, 1000, 0, 0, 0, 0},
                        {"concurrency 1, 1000 keys", 1, 1000, 0, 0, 0, 0},
                        {"concurrency 16, 1 key", 16, 1, 0, 0, 0, 0}};
  int n = (int)(sizeof(runs) / sizeof(runs[0])), ok = 1;
  for (int i = 0; i < n; i++) {
    kl_bl_run(&runs[i], events);
    ok &= runs[i].ok;
  }
  if (json)
    kl_bl_json(runs, n, events);
  else
    kl_bl_print(runs, n, events);
  return ok ? 0 : 1;
}
