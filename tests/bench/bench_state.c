/*
 * keylane-bench state: what the worker's state API (cli/worker_api.h)
 * costs on a large fleet's worker: by default 1,000 partitions and
 * 100,000 keys, each with one event whose handler keeps asking to retry
 * (backoff 10 minutes), so that every key is in a window, retrying, when
 * the requests come. On an embedded cluster with an LMDB store, the
 * worker's metrics listener answers, 20 times each:
 *   /v1/partitions                         every partition
 *   /v1/keys?state=retrying&limit=1000     the first page
 *   /v1/keys?...&from=P:0                  a page from the middle
 *   /v1/keys/KEY                           one key
 * and it prints each answer's bytes and time (median, max), with the
 * time the worker took to take the events in.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli/metrics_server.h"
#include "keylane/embedded.h"
#include "keylane/worker.h"
#include "support/http.h"
#include "support/support.h"

#define KL_BS_NAME "state"
#define KL_BS_TOPIC "state"
#define KL_BS_REPEAT 20

static kl_handler_result_t kl_bs_handler(void *opaque, const kl_event_t *event,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)event, (void)fence, (void)txn;
  snprintf(errbuf, errbuf_size, "bench: this key waits on purpose");
  return KL_HANDLER_RETRY;
}

static int kl_bs_count_only(void *opaque, const kl_worker_key_t *key) {
  (void)opaque, (void)key;
  return 1;
}

static int kl_bs_publish(const char *boot, int64_t keys) {
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", boot);
  kl_producer_t *producer = NULL;
  kl_err_t err = kl_producer_new(conf, NULL, NULL, &producer);
  kl_conf_destroy(conf);
  for (int64_t i = 0; !err && i < keys; i++) {
    char key[24];
    snprintf(key, sizeof(key), "key-%07" PRId64, i);
    kl_event_t ev = {.key = key,
                     .key_len = strlen(key),
                     .type = "wait",
                     .type_len = 4,
                     .payload = "x",
                     .payload_len = 1};
    while ((err = kl_publish(producer, KL_BS_TOPIC, &ev, NULL)) ==
           KL_EQUEUE_FULL)
      kl_producer_poll(producer, 10);
  }
  if (!err)
    err = kl_flush(producer, 120000);
  if (err)
    fprintf(stderr, "keylane-bench state: publish: %s\n", kl_err_detail());
  kl_producer_destroy(producer);
  return err ? -1 : 0;
}

typedef struct kl_bs_req {
  const char *name;
  char path[128];
  double ms[KL_BS_REPEAT];
  double median_ms, max_ms;
  size_t bytes;
  int status;
} kl_bs_req_t;

static void kl_bs_measure(int port, kl_bs_req_t *r) {
  for (int i = 0; i < KL_BS_REPEAT; i++) {
    kl_t_http_resp_t resp = {0};
    double t0 = kl_bench_now();
    int rc = kl_t_http_once(port, "GET", r->path, NULL, NULL, &resp);
    r->ms[i] = (kl_bench_now() - t0) * 1e3;
    r->status = rc ? -1 : resp.status;
    r->bytes = resp.body_len;
    kl_t_http_resp_free(&resp);
  }
  r->max_ms = 0;
  for (int i = 0; i < KL_BS_REPEAT; i++)
    r->max_ms = r->ms[i] > r->max_ms ? r->ms[i] : r->max_ms;
  r->median_ms = kl_bench_median(r->ms, KL_BS_REPEAT);
}

static const char kl_bs_usage[] =
    "usage: keylane-bench state [--partitions N] [--keys N] [--json]\n\n"
    "The worker's state API on a large worker: N keys (one event each, a\n"
    "handler that keeps asking to retry) over the partitions; each of\n"
    "/v1/partitions, the first and a middle page of /v1/keys (1,000 keys)\n"
    "and /v1/keys/KEY is asked 20 times: bytes, median and max ms.\n\n"
    "      --partitions N  topic partitions (default 1000)\n"
    "      --keys N        keys, one event each (default 100000)\n"
    "      --json          one JSON object on stdout\n";

static void kl_bs_help(void) {
  fputs(kl_bs_usage, stdout);
}

int kl_bench_state(int argc, char **argv) {
  int64_t partitions = 1000, keys = 100000;
  int json = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "partitions", .max = 10000, .out = &partitions},
      {.name = "keys", .max = 10000000, .out = &keys},
      {0}};
  int rc = kl_bench_flags(KL_BS_NAME, argc, argv, flags, &json, kl_bs_help);
  if (rc)
    return rc < 0 ? 0 : rc;
  char dir[64], waiting[64], window[64];
  kl_t_tmpdir(dir);
  kl_embedded_t *cluster = NULL;
  kl_store_t *store = NULL;
  kl_t_worker_t *w = NULL;
  kl__metrics_server_t *server = NULL;
  int started = 0;
  rc = 1;
  if (kl_embedded_new(1, KL_BS_TOPIC, (int)partitions, &cluster) ||
      kl_store_open(dir, NULL, &store)) {
    fprintf(stderr, "keylane-bench state: %s\n", kl_err_detail());
    goto out;
  }
  const char *boot = kl_embedded_bootstrap(cluster);
  fprintf(stderr, "keylane-bench state: publishing %" PRId64 " events...\n",
          keys);
  if (kl_bs_publish(boot, keys))
    goto out;
  snprintf(waiting, sizeof(waiting), "worker.waiting.max=%" PRId64, keys + 1);
  snprintf(window, sizeof(window), "worker.window.max=%" PRId64,
           keys / partitions * 2 + 16);
  const char *const conf[] = {"worker.retry.initial.ms=600000",
                              "worker.retry.max.ms=600000",
                              "worker.max.attempts=1000",
                              waiting,
                              window,
                              NULL};
  w = kl_t_worker_new_with(boot, KL_BS_TOPIC, "bench-state", store, conf,
                           kl_bs_handler, NULL);
  if (kl__metrics_server_start("127.0.0.1:0", NULL, KL_BS_TOPIC, w->worker,
                               store, &server)) {
    fprintf(stderr, "keylane-bench state: %s\n", kl_err_detail());
    goto out;
  }
  double t0 = kl_bench_now();
  kl_t_worker_go(w);
  started = 1;
  kl_worker_keys_query_t q = {
      .size = sizeof(q), .states = KL_WORKER_KEY_RETRYING, .limit = 1};
  size_t total = 0;
  while (total < (size_t)keys && kl_bench_now() - t0 < 600) {
    kl_t_sleep_ms(500);
    kl_worker_foreach_key(w->worker, &q, kl_bs_count_only, NULL, &total);
    fprintf(stderr, "\rkeylane-bench state: %zu of %" PRId64 " keys retrying",
            total, keys);
  }
  fprintf(stderr, "\n");
  double taken_s = kl_bench_now() - t0;
  if (total < (size_t)keys) {
    fprintf(stderr,
            "keylane-bench state: only %zu keys retrying after %.0f s\n", total,
            taken_s);
    goto out;
  }
  int port = kl__metrics_server_port(server);
  kl_bs_req_t reqs[4] = {{.name = "partitions"},
                         {.name = "keys_first_page"},
                         {.name = "keys_middle_page"},
                         {.name = "one_key"}};
  snprintf(reqs[0].path, sizeof(reqs[0].path), "/v1/partitions");
  snprintf(reqs[1].path, sizeof(reqs[1].path),
           "/v1/keys?state=retrying&limit=1000");
  snprintf(reqs[2].path, sizeof(reqs[2].path),
           "/v1/keys?state=retrying&limit=1000&from=%" PRId64 ":0",
           partitions / 2);
  snprintf(reqs[3].path, sizeof(reqs[3].path), "/v1/keys/key-%07" PRId64,
           keys / 2);
  for (int i = 0; i < 4; i++)
    kl_bs_measure(port, &reqs[i]);
  if (json) {
    json_t *arr = json_array();
    for (int i = 0; i < 4; i++)
      json_array_append_new(
          arr, json_pack("{ss ss si sI sf sf}", "name", reqs[i].name, "path",
                         reqs[i].path, "status", reqs[i].status, "bytes",
                         (json_int_t)reqs[i].bytes, "median_ms",
                         reqs[i].median_ms, "max_ms", reqs[i].max_ms));
    json_t *o = json_pack("{ss sI sI sf so}", "bench", KL_BS_NAME, "partitions",
                          (json_int_t)partitions, "keys", (json_int_t)keys,
                          "taken_in_s", taken_s, "requests", arr);
    char *s = json_dumps(o, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(o);
  } else {
    printf("keylane-bench state: %" PRId64 " partitions, %" PRId64
           " keys retrying (taken in %.1f s)\n\n",
           partitions, keys, taken_s);
    printf("%-18s %6s %10s %10s %9s\n", "request", "status", "bytes",
           "median ms", "max ms");
    for (int i = 0; i < 4; i++)
      printf("%-18s %6d %10zu %10.2f %9.2f\n", reqs[i].name, reqs[i].status,
             reqs[i].bytes, reqs[i].median_ms, reqs[i].max_ms);
  }
  rc = 0;
  for (int i = 0; i < 4; i++)
    rc |= reqs[i].status != 200;
out:
  if (server)
    kl__metrics_server_stop(server);
  if (w && started) {
    kl_t_worker_stop(w);
  } else if (w) {
    kl_worker_destroy(w->worker);
    free(w);
  }
  kl_store_destroy(store);
  kl_embedded_destroy(cluster);
  kl_t_rmrf(dir);
  return rc;
}
