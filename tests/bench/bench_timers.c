/*
 * keylane-bench timers: delayed events (docs/design.md, "Timers") on an
 * embedded cluster with an LMDB store and one worker whose handler counts:
 *   pending   N events delayed by an hour are read and kept as timers:
 *             the rate, and the process's memory at N/2 and N pending
 *             (it must not grow with the timers pending);
 *   firing    the store's clock moves past their time: the rate at which
 *             they run, each once;
 *   lateness  on the real clock, R timers a second fall due for S
 *             seconds, while L events a second without a delay flow
 *             (--load): how late each ran after its not_before (p50, p99,
 *             max).
 *
 * The embedded cluster is librdkafka's mock, which keeps at most 5 MiB of
 * each partition's log and drops the oldest records past it, also those
 * no consumer read yet: the worker, whose auto.offset.reset is "error",
 * would then stop at an offset that is gone. So the N events are
 * published a chunk at a time (KL_BT_CHUNK per partition, about 2 MiB),
 * each read and kept before the next, and only the keeping is timed.
 */
#include <inttypes.h>
#include <jansson.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "common/internal.h"
#include "keylane/embedded.h"
#include "keylane/worker.h"
#include "store/store_internal.h"
#include "store/timers.h"
#include "support/store_contract.h"
#include "support/support.h"

#define KL_BT_NAME "timers"
#define KL_BT_TOPIC "timers"
#define KL_BT_LATE_MAX 1000000
/* Events published per partition before the worker must keep them (see
 * the top): ~100 bytes each, 2 MiB of the mock's 5 MiB per partition. */
#define KL_BT_CHUNK 20000

typedef struct kl_bt {
  _Atomic uint64_t ran;
  _Atomic int64_t late_n;
  int64_t *late_ms; /* KL_BT_LATE_MAX; lateness phase only */
  _Atomic int measuring;
} kl_bt_t;

static kl_handler_result_t kl_bt_handler(void *opaque, const kl_event_t *event,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *errbuf, size_t errbuf_size) {
  (void)fence, (void)txn, (void)errbuf, (void)errbuf_size;
  kl_bt_t *bt = opaque;
  bt->ran++;
  if (bt->measuring && event->not_before > 0) {
    int64_t i = bt->late_n++;
    if (i < KL_BT_LATE_MAX)
      bt->late_ms[i] = kl__now_ms() - event->not_before;
  }
  return KL_HANDLER_OK;
}

/* The process's memory: its anonymous resident pages (the heap, the
 * stacks, librdkafka's and LMDB's malloc) apart from the resident pages
 * of mapped files (LMDB's map: the store's data, which the kernel may
 * drop), and the heap in use by malloc. MiB. */
typedef struct kl_bt_mem {
  double anon, file, heap;
} kl_bt_mem_t;

static kl_bt_mem_t kl_bt_mem(void) {
  kl_bt_mem_t m = {0};
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kib;
  while (f && fgets(line, sizeof(line), f)) {
    if (sscanf(line, "RssAnon: %lf", &kib) == 1)
      m.anon = kib / 1024;
    else if (sscanf(line, "RssFile: %lf", &kib) == 1)
      m.file = kib / 1024;
  }
  if (f)
    fclose(f);
  struct mallinfo2 mi = mallinfo2();
  m.heap = (double)mi.uordblks / (1024.0 * 1024.0);
  return m;
}

/* Publishes @p n events over @p keys keys, not before @p at(i). */
static int kl_bt_publish(kl_producer_t *producer, int64_t from, int64_t n,
                         int64_t keys, int64_t first, int64_t step_ms,
                         int64_t per_step) {
  kl_err_t err = KL_OK;
  for (int64_t i = from; !err && i < from + n; i++) {
    char key[32];
    snprintf(key, sizeof(key), "key-%07" PRId64, i % keys);
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "tick",
                     .type_len = 4,
                     .payload = "x",
                     .payload_len = 1,
                     .not_before = first + ((i - from) / per_step) * step_ms};
    while ((err = kl_publish(producer, KL_BT_TOPIC, &ev, NULL)) ==
           KL_EQUEUE_FULL)
      kl_producer_poll(producer, 10);
  }
  if (!err)
    err = kl_flush(producer, 300000);
  if (err)
    fprintf(stderr, "keylane-bench timers: publish: %s\n", kl_err_detail());
  return err ? -1 : 0;
}

/* Waits until @p done says so (10 minutes at most), printing progress;
 * @returns the seconds it took, or -1. */
static double kl_bt_wait(kl_t_worker_t *w, const char *what, uint64_t want,
                         int fired) {
  double t0 = kl_bench_now();
  kl_worker_stats_t st = {0};
  uint64_t got = 0, said = UINT64_MAX;
  while (kl_bench_now() - t0 < 600) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    got = fired ? st.applied : st.timers_scheduled;
    if (got != said)
      fprintf(stderr,
              "\rkeylane-bench timers: %s %" PRIu64 " of %" PRIu64
              " (timers kept %" PRIu64 ", fired %" PRIu64 ", early %" PRIu64
              ", duplicates %" PRIu64 ", waiting %" PRIu64 ")",
              what, got, want, st.timers_scheduled, st.timers_fired,
              st.timers_early, st.duplicates, st.waiting_keys);
    said = got;
    if (got >= want)
      break;
    kl_t_sleep_ms(200);
  }
  fprintf(stderr, "\n");
  return got >= want ? kl_bench_now() - t0 : -1;
}

static int kl_bt_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static const char kl_bt_usage[] =
    "usage: keylane-bench timers [--timers N] [--keys N] [--partitions N]\n"
    "                            [--rate N] [--seconds N] [--load N]\n"
    "                            [--map-mib N] [--lateness-only] [--json]\n\n"
    "Delayed events on an embedded cluster, an LMDB store and one worker:\n"
    "N timers pending (their rate; memory at N/2 and N pending), then all\n"
    "due at once (the firing rate), then on the real clock R timers a\n"
    "second due for S seconds while L events a second without a delay\n"
    "flow (lateness p50, p99, max).\n\n"
    "      --timers N      timers pending (default 1000000)\n"
    "      --keys N        keys they are spread over (default 10000)\n"
    "      --partitions N  topic partitions (default 8)\n"
    "      --rate N        timers due a second, lateness phase (default 1000)\n"
    "      --seconds N     its length (default 10)\n"
    "      --load N        events a second without a delay meanwhile\n"
    "                      (default none)\n"
    "      --map-mib N     the store's first map size (store.map.size) in\n"
    "                      MiB (default the store's, 256): big enough, the\n"
    "                      map never grows during the run\n"
    "      --lateness-only the lateness phase alone, no timers pending\n"
    "      --json          one JSON object on stdout\n";

static void kl_bt_help(void) {
  fputs(kl_bt_usage, stdout);
}

typedef struct kl_bt_run {
  kl_producer_t *producer;
  kl_t_worker_t *w;
  int64_t timers, keys, partitions, rate, seconds, load, map_mib;
  double pend_s, fire_s;
  double count_ms; /* kl__timers_count() of every partition, as takes do */
  kl_bt_mem_t before, half, pending, fired;
} kl_bt_run_t;

/* The pending phase, a chunk at a time (the top says why); the memory at
 * the chunk that reaches N/2, and at N. @returns 0, or -1. */
static int kl_bt_pending(kl_bt_run_t *r, int64_t due) {
  int64_t chunk = KL_BT_CHUNK * r->partitions;
  r->half = r->before;
  for (int64_t done = 0; done < r->timers; done += chunk) {
    int64_t n = r->timers - done < chunk ? r->timers - done : chunk;
    if (kl_bt_publish(r->producer, done, n, r->keys, due, 0, n))
      return -1;
    double s = kl_bt_wait(r->w, "pending", (uint64_t)(done + n), 0);
    if (s < 0)
      return -1;
    r->pend_s += s;
    if (done < r->timers / 2 && done + n >= r->timers / 2)
      r->half = kl_bt_mem();
  }
  r->pending = kl_bt_mem();
  return 0;
}

/* What a worker's takes of every partition spend counting its timers
 * (worker/fire.h); @returns 0, or -1 when the count is not N. */
static int kl_bt_count(kl_bt_run_t *r, kl_store_t *store) {
  uint64_t all = 0, n;
  double t = kl_bench_now();
  for (int32_t p = 0; p < (int32_t)r->partitions; p++) {
    if (kl__timers_count(store, KL_BT_TOPIC, p, &n))
      return -1;
    all += n;
  }
  r->count_ms = (kl_bench_now() - t) * 1000;
  return all == (uint64_t)r->timers ? 0 : -1;
}

/* The lateness phase: R timers a second due from 2 s on for S seconds,
 * published ahead; meanwhile L events a second without a delay, paced in
 * 10 ms steps. @returns the events published, or -1. */
static int64_t kl_bt_lateness(kl_bt_run_t *r, int64_t from) {
  int64_t late_n = r->rate * r->seconds, start = kl__now_ms() + 2000;
  if (kl_bt_publish(r->producer, from, late_n, r->keys, start, 1000, r->rate))
    return -1;
  int64_t sent = 0, end = start + r->seconds * 1000 + 500;
  for (int64_t now = kl__now_ms(); r->load > 0 && now < end;
       now = kl__now_ms()) {
    int64_t want = (now - (start - 2000)) * r->load / 1000;
    if (want > sent) {
      if (kl_bt_publish(r->producer, from + late_n + sent, want - sent, r->keys,
                        0, 0, 1))
        return -1;
      sent = want;
    }
    kl_t_sleep_ms(10);
  }
  return late_n + sent;
}

static void kl_bt_print(const kl_bt_run_t *r, int json, int64_t n, int64_t p50,
                        int64_t p99, int64_t lmax) {
  const kl_bt_mem_t *m[] = {&r->before, &r->half, &r->pending, &r->fired};
  const char *names[] = {"before", "half", "pending", "fired"};
  double rates[] = {0, 0, r->pend_s > 0 ? (double)r->timers / r->pend_s : 0,
                    r->fire_s > 0 ? (double)r->timers / r->fire_s : 0};
  if (json) {
    json_t *o = json_pack(
        "{ss sI sI sI sf sf sI sI sI sI sI sI}", "bench", KL_BT_NAME, "timers",
        (json_int_t)r->timers, "keys", (json_int_t)r->keys, "partitions",
        (json_int_t)r->partitions, "pending_per_s", rates[2], "fired_per_s",
        rates[3], "late_rate", (json_int_t)r->rate, "load_per_s",
        (json_int_t)r->load, "late_timers", (json_int_t)n, "late_p50_ms",
        (json_int_t)p50, "late_p99_ms", (json_int_t)p99, "late_max_ms",
        (json_int_t)lmax);
    json_object_set_new(o, "count_ms", json_real(r->count_ms));
    for (size_t i = 0; i < 4; i++) {
      char k[48];
      snprintf(k, sizeof(k), "anon_mib_%s", names[i]);
      json_object_set_new(o, k, json_real(m[i]->anon));
      snprintf(k, sizeof(k), "file_mib_%s", names[i]);
      json_object_set_new(o, k, json_real(m[i]->file));
      snprintf(k, sizeof(k), "heap_mib_%s", names[i]);
      json_object_set_new(o, k, json_real(m[i]->heap));
    }
    char *text = json_dumps(o, JSON_COMPACT);
    puts(text);
    free(text);
    json_decref(o);
    return;
  }
  printf("keylane-bench timers: %" PRId64 " timers over %" PRId64
         " keys, %" PRId64 " partitions, LMDB\n\n",
         r->timers, r->keys, r->partitions);
  if (r->timers) {
    printf("%-8s %10s %14s %14s %9s\n", "phase", "timers/s", "RSS anon MiB",
           "RSS file MiB", "heap MiB");
    for (size_t i = 0; i < 4; i++) {
      char rate[24] = "";
      if (rates[i] > 0)
        snprintf(rate, sizeof(rate), "%.0f", rates[i]);
      printf("%-8s %10s %14.0f %14.0f %9.1f\n", names[i], rate, m[i]->anon,
             m[i]->file, m[i]->heap);
    }
    printf("\ncounting the %" PRId64 " pending as the takes do: %.0f ms\n\n",
           r->timers, r->count_ms);
  }
  printf("lateness, %" PRId64 " timers due at %" PRId64 "/s with %" PRId64
         " events/s without a delay: p50 %" PRId64 " ms, p99 %" PRId64
         " ms, max %" PRId64 " ms\n",
         n, r->rate, r->load, p50, p99, lmax);
}

int kl_bench_timers(int argc, char **argv) {
  kl_bt_run_t r = {.timers = 1000000,
                   .keys = 10000,
                   .partitions = 8,
                   .rate = 1000,
                   .seconds = 10};
  int json = 0, lateness_only = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "timers", .max = 100000000, .out = &r.timers},
      {.name = "keys", .max = 10000000, .out = &r.keys},
      {.name = "partitions", .max = 1000, .out = &r.partitions},
      {.name = "rate", .max = 1000000, .out = &r.rate},
      {.name = "seconds", .max = 3600, .out = &r.seconds},
      {.name = "load", .max = 1000000, .out = &r.load},
      {.name = "map-mib", .max = 65536, .out = &r.map_mib},
      {.name = "lateness-only", .on = &lateness_only},
      {0}};
  int rc = kl_bench_flags(KL_BT_NAME, argc, argv, flags, &json, kl_bt_help);
  if (rc)
    return rc < 0 ? 0 : rc;
  if (lateness_only)
    r.timers = 0;
  if (r.rate * r.seconds > KL_BT_LATE_MAX) {
    fprintf(stderr, "keylane-bench timers: --rate x --seconds is at most %d\n",
            KL_BT_LATE_MAX);
    return 2;
  }
  char dir[64];
  kl_t_tmpdir(dir);
  kl_embedded_t *cluster = NULL;
  kl_store_t *store = NULL;
  kl_bt_t bt = {.late_ms = calloc(KL_BT_LATE_MAX, sizeof(int64_t))};
  rc = 1;
  kl_conf_t *pconf = kl_conf_new(), *sconf = kl_conf_new();
  char map[32];
  snprintf(map, sizeof(map), "%" PRId64 "M", r.map_mib);
  if (!bt.late_ms ||
      kl_embedded_new(1, KL_BT_TOPIC, (int)r.partitions, &cluster) ||
      (r.map_mib && kl_conf_set(sconf, "store.map.size", map)) ||
      kl_store_open(dir, sconf, &store) ||
      kl_conf_set(pconf, "kafka.bootstrap.servers",
                  kl_embedded_bootstrap(cluster)) ||
      kl_producer_new(pconf, NULL, NULL, &r.producer)) {
    fprintf(stderr, "keylane-bench timers: %s\n", kl_err_detail());
    goto out;
  }
  int64_t t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  r.before = kl_bt_mem();
  r.w = kl_t_worker_new_with(kl_embedded_bootstrap(cluster), KL_BT_TOPIC,
                             "bench-timers", store, NULL, kl_bt_handler, &bt);
  kl_t_worker_go(r.w);
  /* every partition owned first: the lateness phase measures timers, not
   * the group's join */
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && st.owned < (int32_t)r.partitions; i++) {
    kl_t_sleep_ms(100);
    kl_worker_stats(r.w->worker, &st, sizeof(st));
  }
  if (r.timers) {
    if (kl_bt_pending(&r, t0 + 3600000) || kl_bt_count(&r, store))
      goto out;
    kl_t_store_clock_set(t0 + 3600000);
    if ((r.fire_s = kl_bt_wait(r.w, "ran", (uint64_t)r.timers, 1)) < 0)
      goto out;
    r.fired = kl_bt_mem();
  }
  /* lateness, on the real clock; without timers before, one fires first:
   * a worker's first firing record waits for its producer to learn the
   * topic (~0.9 s here), once, and that is not lateness under load */
  kl__store_set_clock(NULL);
  int64_t ran = r.timers ? r.timers : 1;
  if (!r.timers &&
      (kl_bt_publish(r.producer, 0, 1, r.keys, kl__now_ms(), 0, 1) ||
       kl_bt_wait(r.w, "ran", 1, 1) < 0))
    goto out;
  bt.measuring = 1;
  int64_t more = kl_bt_lateness(&r, ran);
  if (more < 0 || kl_bt_wait(r.w, "ran", (uint64_t)(ran + more), 1) < 0)
    goto out;
  int64_t n = bt.late_n < KL_BT_LATE_MAX ? bt.late_n : KL_BT_LATE_MAX;
  qsort(bt.late_ms, (size_t)n, sizeof(int64_t), kl_bt_cmp);
  kl_bt_print(&r, json, n, n ? bt.late_ms[n / 2] : 0,
              n ? bt.late_ms[n * 99 / 100] : 0, n ? bt.late_ms[n - 1] : 0);
  rc = bt.ran == (uint64_t)(ran + more) ? 0 : 1;
  if (rc)
    fprintf(stderr,
            "keylane-bench timers: the handler ran %" PRIu64
            " times, not %" PRId64 "\n",
            (uint64_t)bt.ran, ran + more);
out:
  kl__store_set_clock(NULL);
  if (r.w)
    kl_t_worker_stop(r.w);
  kl_producer_destroy(r.producer);
  kl_conf_destroy(pconf);
  kl_conf_destroy(sconf);
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  kl_t_rmrf(dir);
  free(bt.late_ms);
  return rc;
}
