/*
 * keylane-bench timers: delayed events (docs/design.md, "Timers") on an
 * embedded cluster with an LMDB store and one worker whose handler counts:
 *   pending   N events delayed by an hour are read and kept as timers:
 *             the rate, and the process's RSS and heap in use before and
 *             after (memory must not grow with the timers pending);
 *   firing    the store's clock moves past their time: the rate at which
 *             they run, each once;
 *   lateness  on the real clock, R timers a second fall due for S
 *             seconds: how late each ran after its not_before (p50, p99,
 *             max).
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
#include "support/store_contract.h"
#include "support/support.h"

#define KL_BT_NAME "timers"
#define KL_BT_TOPIC "timers"
#define KL_BT_LATE_MAX 1000000

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

/* VmRSS of this process in MiB, from /proc. */
static double kl_bt_rss_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kib = 0;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %lf", &kib) == 1)
      break;
  if (f)
    fclose(f);
  return kib / 1024;
}

static double kl_bt_heap_mib(void) {
  struct mallinfo2 mi = mallinfo2();
  return (double)mi.uordblks / (1024.0 * 1024.0);
}

/* Publishes @p n events over @p keys keys, not before @p at(i). */
static int kl_bt_publish(kl_producer_t *producer, int64_t n, int64_t keys,
                         int64_t first, int64_t step_ms, int64_t per_step) {
  kl_err_t err = KL_OK;
  for (int64_t i = 0; !err && i < n; i++) {
    char key[24];
    snprintf(key, sizeof(key), "key-%07" PRId64, i % keys);
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "tick",
                     .type_len = 4,
                     .payload = "x",
                     .payload_len = 1,
                     .not_before = first + (i / per_step) * step_ms};
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
    "                            [--rate N] [--seconds N] [--json]\n\n"
    "Delayed events on an embedded cluster, an LMDB store and one worker:\n"
    "N timers pending (their rate, RSS and heap before and after), then\n"
    "all due at once (the firing rate), then on the real clock R timers a\n"
    "second due for S seconds (lateness p50, p99, max).\n\n"
    "      --timers N      timers pending (default 1000000)\n"
    "      --keys N        keys they are spread over (default 10000)\n"
    "      --partitions N  topic partitions (default 8)\n"
    "      --rate N        timers due a second, lateness phase (default 1000)\n"
    "      --seconds N     its length (default 10)\n"
    "      --json          one JSON object on stdout\n";

static void kl_bt_help(void) {
  fputs(kl_bt_usage, stdout);
}

int kl_bench_timers(int argc, char **argv) {
  int64_t timers = 1000000, keys = 10000, partitions = 8, rate = 1000,
          seconds = 10;
  int json = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "timers", .max = 100000000, .out = &timers},
      {.name = "keys", .max = 10000000, .out = &keys},
      {.name = "partitions", .max = 1000, .out = &partitions},
      {.name = "rate", .max = 1000000, .out = &rate},
      {.name = "seconds", .max = 3600, .out = &seconds},
      {0}};
  int rc = kl_bench_flags(KL_BT_NAME, argc, argv, flags, &json, kl_bt_help);
  if (rc)
    return rc < 0 ? 0 : rc;
  if (rate * seconds > KL_BT_LATE_MAX) {
    fprintf(stderr, "keylane-bench timers: --rate x --seconds is at most %d\n",
            KL_BT_LATE_MAX);
    return 2;
  }
  char dir[64];
  kl_t_tmpdir(dir);
  kl_embedded_t *cluster = NULL;
  kl_store_t *store = NULL;
  kl_producer_t *producer = NULL;
  kl_t_worker_t *w = NULL;
  kl_bt_t bt = {.late_ms = calloc(KL_BT_LATE_MAX, sizeof(int64_t))};
  rc = 1;
  kl_conf_t *pconf = kl_conf_new();
  if (!bt.late_ms ||
      kl_embedded_new(1, KL_BT_TOPIC, (int)partitions, &cluster) ||
      kl_store_open(dir, NULL, &store) ||
      kl_conf_set(pconf, "kafka.bootstrap.servers",
                  kl_embedded_bootstrap(cluster)) ||
      kl_producer_new(pconf, NULL, NULL, &producer)) {
    fprintf(stderr, "keylane-bench timers: %s\n", kl_err_detail());
    goto out;
  }
  const char *boot = kl_embedded_bootstrap(cluster);
  int64_t t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  double rss0 = kl_bt_rss_mib(), heap0 = kl_bt_heap_mib();
  fprintf(stderr, "keylane-bench timers: publishing %" PRId64 " events...\n",
          timers);
  if (kl_bt_publish(producer, timers, keys, t0 + 3600000, 0, timers))
    goto out;
  w = kl_t_worker_new_with(boot, KL_BT_TOPIC, "bench-timers", store, NULL,
                           kl_bt_handler, &bt);
  kl_t_worker_go(w);
  double pend_s = kl_bt_wait(w, "pending", (uint64_t)timers, 0);
  if (pend_s < 0)
    goto out;
  double rss1 = kl_bt_rss_mib(), heap1 = kl_bt_heap_mib();
  kl_t_store_clock_set(t0 + 3600000);
  double fire_s = kl_bt_wait(w, "ran", (uint64_t)timers, 1);
  if (fire_s < 0)
    goto out;
  double rss2 = kl_bt_rss_mib(), heap2 = kl_bt_heap_mib();
  /* lateness, on the real clock: timers due from 2 s on, rate a second */
  kl__store_set_clock(NULL);
  bt.measuring = 1;
  int64_t late_n = rate * seconds, start = kl__now_ms() + 2000;
  if (kl_bt_publish(producer, late_n, keys, start, 1000, rate))
    goto out;
  if (kl_bt_wait(w, "ran", (uint64_t)(timers + late_n), 1) < 0)
    goto out;
  int64_t n = bt.late_n < KL_BT_LATE_MAX ? bt.late_n : KL_BT_LATE_MAX;
  qsort(bt.late_ms, (size_t)n, sizeof(int64_t), kl_bt_cmp);
  int64_t p50 = bt.late_ms[n / 2], p99 = bt.late_ms[n * 99 / 100],
          lmax = bt.late_ms[n - 1];
  if (json) {
    json_t *o = json_pack(
        "{ss sI sI sI sf sf sf sf sf sf sf sf sI sI sI sI sI}", "bench",
        KL_BT_NAME, "timers", (json_int_t)timers, "keys", (json_int_t)keys,
        "partitions", (json_int_t)partitions, "pending_per_s",
        (double)timers / pend_s, "fired_per_s", (double)timers / fire_s,
        "rss_mib_before", rss0, "rss_mib_pending", rss1, "rss_mib_fired", rss2,
        "heap_mib_before", heap0, "heap_mib_pending", heap1, "heap_mib_fired",
        heap2, "late_rate", (json_int_t)rate, "late_timers", (json_int_t)n,
        "late_p50_ms", (json_int_t)p50, "late_p99_ms", (json_int_t)p99,
        "late_max_ms", (json_int_t)lmax);
    char *s = json_dumps(o, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(o);
  } else {
    printf("keylane-bench timers: %" PRId64 " timers over %" PRId64
           " keys, %" PRId64 " partitions, LMDB\n\n",
           timers, keys, partitions);
    printf("%-9s %12s %10s %10s\n", "phase", "timers/s", "RSS MiB", "heap MiB");
    printf("%-9s %12s %10.0f %10.1f\n", "before", "", rss0, heap0);
    printf("%-9s %12.0f %10.0f %10.1f\n", "pending", (double)timers / pend_s,
           rss1, heap1);
    printf("%-9s %12.0f %10.0f %10.1f\n", "fired", (double)timers / fire_s,
           rss2, heap2);
    printf("\nlateness, %" PRId64 " timers due at %" PRId64 "/s: p50 %" PRId64
           " ms, p99 %" PRId64 " ms, max %" PRId64 " ms\n",
           n, rate, p50, p99, lmax);
  }
  rc = bt.ran == (uint64_t)(timers + late_n) ? 0 : 1;
  if (rc)
    fprintf(stderr,
            "keylane-bench timers: the handler ran %" PRIu64
            " times, not %" PRId64 "\n",
            (uint64_t)bt.ran, timers + late_n);
out:
  kl__store_set_clock(NULL);
  if (w)
    kl_t_worker_stop(w);
  kl_producer_destroy(producer);
  kl_conf_destroy(pconf);
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  kl_t_rmrf(dir);
  free(bt.late_ms);
  return rc;
}
