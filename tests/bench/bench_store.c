/*
 * keylane-bench store: the store's cost per event, two ways.
 *
 * 1. Commits: batches of 1, 100 and 1,000 events through the worker's
 *    steps (prefetch the batch's ids; per event seen, get, put, mark;
 *    commit), on the LMDB store with store.durability=full and on a
 *    PostgreSQL server with fsync and synchronous_commit on (the server's
 *    setting is printed): events/s, the p50 and p99 of kl_store_commit(),
 *    and the owner cache's hit ratio (PostgreSQL). Target: PostgreSQL at
 *    batch 1000 >= 0.25 x LMDB's rate in the same run.
 * 2. Dedup lookups on LMDB as the stored idempotency keys grow from 10
 *    thousand to 1 million (10 million with --full): kl_txn_seen() rate,
 *    half hits and half misses, and the bytes each stored key takes
 *    (scoped by an entity key of 6 to 8 bytes, as a worker's are).
 *    Targets: the rate at the largest size >= 0.5 x the rate at 10 k, and
 *    <= 100 bytes per key.
 *
 * The PostgreSQL server is a throwaway one (tests/support/pg.c) unless
 * --pg URI names one (its database must be empty or keylane's); without
 * PostgreSQL installed that part is skipped and says so.
 */
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "keylane/store.h"
#include "support/pg.h"
#include "store/cache.h"
#include "store/store_internal.h"

#define NAME "store"
#define TOPIC "bench"
#define KEYS 1000 /* entity keys the commit runs spread over */

static const char kl_store_usage[] =
    "usage: keylane-bench store [--json] [--full] [--seconds S] [--pg URI]\n\n"
    "Commit throughput and p99 commit latency, LMDB vs PostgreSQL, for\n"
    "batches of 1, 100 and 1000 events (the two take turns: a warm-up slice\n"
    "each, printed apart, then 8 counted, so that both see the same\n"
    "machine); then the LMDB dedup lookup rate and bytes per key as stored\n"
    "keys grow 10k -> 1M (--full: -> 10M).\n\n"
    "      --json         one JSON object on stdout\n"
    "      --full         grow the dedup store to 10 million keys\n"
    "      --seconds S    time per backend and batch size (default 3)\n"
    "      --pg URI       an existing PostgreSQL database instead of a\n"
    "                     throwaway server\n"
    "      --skip-pg      LMDB only\n"
    "      --batch N      only batches of N (1, 100 or 1000), no dedup runs\n";

typedef struct kl_bench_opts {
  int json, full, skip_pg, batch;
  double seconds;
  const char *pg_uri;
} kl_bench_opts_t;

/* ---- ids ------------------------------------------------------------- */

static uint64_t kl_mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The @p n-th id of a run: a canonical UUIDv7 whose time part grows with
 * n, like the producer's, so a store fills in roughly key order. */
static void kl_bench_id(uint64_t run, uint64_t n, char out[37]) {
  uint64_t ms = 1700000000000ULL + n / 64;
  uint64_t r = kl_mix(run * 0x100000000ULL + n);
  char buf[64];
  snprintf(buf, sizeof(buf),
           "%08" PRIx64 "-%04" PRIx64 "-7%03" PRIx64 "-%04" PRIx64
           "-%012" PRIx64,
           (uint64_t)(ms >> 16) & 0xffffffffu, (uint64_t)(ms & 0xffff),
           (uint64_t)(r & 0xfff), (uint64_t)(0x8000 | ((r >> 12) & 0x3fff)),
           (uint64_t)((r >> 26) & 0xffffffffffffULL));
  memcpy(out, buf, 36);
  out[36] = '\0';
}

/* The entity key of the @p n-th event of a run, 1..KEYS: its id is scoped
 * by it (kl_txn_seen()), as a worker's are. @returns its length. */
static size_t kl_bench_key(uint64_t n, char out[32]) {
  return (size_t)snprintf(out, 32, "acct/%" PRIu64, kl_mix(n) % KEYS);
}

/* ---- 1. commits ------------------------------------------------------ */

typedef struct kl_commit_run {
  const char *backend;
  int batch;
  uint64_t events, batches;
  double events_per_s, p50_ms, p99_ms;
  double cache_hit_ratio; /* -1: the backend has no owner cache */
  double warmup_per_s;    /* events/s of the warm-up slice, not counted */
  /* Where a batch's time goes, mean ms: begin, prefetch, the events'
   * calls (seen, get, put, mark), commit. */
  double begin_ms, prefetch_ms, events_ms, commit_ms;
} kl_commit_run_t;

static int kl_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One round trip for the batch's ids, as a worker does before its
 * handlers run. */
static kl_err_t kl_bench_prefetch(kl_txn_t *txn, uint64_t run, uint64_t from,
                                  int batch) {
  char(*ids)[37] = malloc((size_t)batch * sizeof(*ids));
  char(*keys)[32] = malloc((size_t)batch * sizeof(*keys));
  const char **ptrs = malloc((size_t)batch * sizeof(*ptrs));
  const void **key_ptrs = malloc((size_t)batch * sizeof(*key_ptrs));
  size_t *lens = malloc((size_t)batch * sizeof(*lens));
  size_t *key_lens = malloc((size_t)batch * sizeof(*key_lens));
  kl_err_t err =
      ids && keys && ptrs && key_ptrs && lens && key_lens ? KL_OK : KL_ENOMEM;
  for (int i = 0; !err && i < batch; i++) {
    kl_bench_id(run, from + (uint64_t)i, ids[i]);
    ptrs[i] = ids[i];
    lens[i] = 36;
    key_lens[i] = kl_bench_key(from + (uint64_t)i, keys[i]);
    key_ptrs[i] = keys[i];
  }
  if (!err)
    err = kl_txn_prefetch(txn, key_ptrs, key_lens, ptrs, lens, (size_t)batch);
  free(ids);
  free(keys);
  free(ptrs);
  free(key_ptrs);
  free(lens);
  free(key_lens);
  return err;
}

static kl_err_t kl_bench_event(kl_txn_t *txn, uint64_t run, uint64_t n) {
  char id[37], key[32];
  kl_bench_id(run, n, id);
  size_t key_len = kl_bench_key(n, key);
  kl_mark_t mark;
  const void *val;
  size_t len;
  int64_t balance = 0;
  kl_err_t err = kl_txn_seen(txn, key, key_len, id, 36, &mark);
  if (!err && (err = kl_txn_get(txn, key, key_len, &val, &len)) == KL_OK &&
      len == sizeof(balance))
    memcpy(&balance, val, sizeof(balance));
  if (err == KL_ENOTFOUND)
    err = KL_OK;
  balance++;
  if (!err)
    err = kl_txn_put(txn, key, key_len, &balance, sizeof(balance));
  return err ? err : kl_txn_mark(txn, key, key_len, id, 36, KL_MARK_APPLIED);
}

/* One backend's commit run, measured in slices (kl_bench_slice()) that
 * take turns with the other backend's, so that both see the same machine:
 * on a shared 2-core VM a few seconds of a neighbour's load moved one
 * backend's rate by a third between runs. */
typedef struct kl_commit_acc {
  kl_store_t *store;
  uint64_t epoch, run;
  uint64_t next;   /* the next event's number, warm-up included */
  uint64_t events; /* events measured */
  double *lat;     /* each commit's ms */
  size_t n, cap;
  double elapsed, stage[4]; /* seconds, summed */
  kl__cache_stats_t c0;
  double warmup_per_s;
} kl_commit_acc_t;

static kl_err_t kl_acc_start(kl_commit_acc_t *acc, kl_store_t *store,
                             uint64_t run) {
  *acc = (kl_commit_acc_t){.store = store, .run = run, .cap = 1024};
  kl__store_cache_stats(store, &acc->c0);
  kl_partition_state_t ps;
  kl_err_t err = kl_store_acquire(store, TOPIC, (int32_t)run, &ps);
  acc->epoch = ps.epoch;
  if (!err && !(acc->lat = malloc(acc->cap * sizeof(*acc->lat))))
    err = KL_ENOMEM;
  return err;
}

/* Batches of @p batch events for @p seconds (at least 3 batches). */
static kl_err_t kl_bench_slice(kl_commit_acc_t *acc, int batch,
                               double seconds) {
  kl_err_t err = KL_OK;
  double start = kl_bench_now();
  for (int done = 0; !err && (kl_bench_now() - start < seconds || done < 3);
       done++) {
    kl_txn_t *txn;
    double t[5];
    t[0] = kl_bench_now();
    if ((err = kl_store_begin(acc->store, TOPIC, (int32_t)acc->run, acc->epoch,
                              &txn)))
      break;
    t[1] = kl_bench_now();
    err = kl_bench_prefetch(txn, acc->run, acc->next, batch);
    t[2] = kl_bench_now();
    for (int i = 0; !err && i < batch; i++)
      err = kl_bench_event(txn, acc->run, acc->next++);
    if (err) {
      kl_store_abort(txn);
      break;
    }
    t[3] = kl_bench_now();
    err = kl_store_commit(txn, (int64_t)acc->next);
    acc->events += (uint64_t)batch;
    t[4] = kl_bench_now();
    double *lat = acc->n < acc->cap
                      ? acc->lat
                      : realloc(acc->lat, (acc->cap *= 2) * sizeof(*lat));
    if (!lat)
      return KL_ENOMEM;
    acc->lat = lat;
    lat[acc->n++] = (t[4] - t[3]) * 1e3;
    for (int i = 0; i < 4; i++)
      acc->stage[i] += t[i + 1] - t[i];
  }
  acc->elapsed += kl_bench_now() - start;
  return err;
}

/* Ends the warm-up slice: its rate is kept apart and the run starts
 * counting. */
static void kl_acc_warmed(kl_commit_acc_t *acc) {
  acc->warmup_per_s = acc->events / acc->elapsed;
  acc->events = acc->n = 0;
  acc->elapsed = 0;
  memset(acc->stage, 0, sizeof(acc->stage));
  kl__store_cache_stats(acc->store, &acc->c0);
}

static void kl_acc_end(kl_commit_acc_t *acc, const char *backend, int batch,
                       kl_commit_run_t *out) {
  kl__cache_stats_t c1;
  kl__store_cache_stats(acc->store, &c1);
  double lookups =
      (double)(c1.hits - acc->c0.hits + c1.misses - acc->c0.misses);
  size_t n = acc->n;
  qsort(acc->lat, n, sizeof(*acc->lat), kl_cmp_double);
  *out = (kl_commit_run_t){backend,
                           batch,
                           acc->events,
                           n,
                           acc->events / acc->elapsed,
                           acc->lat[n / 2],
                           acc->lat[(size_t)((double)(n - 1) * 0.99)],
                           c1.max_bytes && lookups > 0
                               ? (double)(c1.hits - acc->c0.hits) / lookups
                               : -1,
                           acc->warmup_per_s,
                           acc->stage[0] * 1e3 / n,
                           acc->stage[1] * 1e3 / n,
                           acc->stage[2] * 1e3 / n,
                           acc->stage[3] * 1e3 / n};
}

/* ---- 2. dedup lookups ------------------------------------------------ */

typedef struct kl_dedup_run {
  uint64_t keys;
  double random_per_s, recent_per_s, bytes_per_key;
} kl_dedup_run_t;

static kl_err_t kl_bench_fill(kl_store_t *store, uint64_t epoch, uint64_t from,
                              uint64_t to) {
  char id[37], key[32];
  for (uint64_t n = from; n < to;) {
    kl_txn_t *txn;
    kl_err_t err = kl_store_begin(store, TOPIC, 0, epoch, &txn);
    for (int i = 0; !err && i < 10000 && n < to; i++, n++) {
      kl_bench_id(0, n, id);
      size_t key_len = kl_bench_key(n, key);
      err = kl_txn_mark(txn, key, key_len, id, 36, KL_MARK_APPLIED);
    }
    if (err) {
      kl_store_abort(txn);
      return err;
    }
    if ((err = kl_store_commit(txn, (int64_t)n)))
      return err;
  }
  return KL_OK;
}

/* Lookups for about a second over a prepared set of ids, so only
 * kl_txn_seen() is timed. Half hit a stored key, half miss. Two patterns:
 * random, over every stored key (the worst case: each lookup may miss the
 * CPU caches), and recent, as a worker sees them (new events carry ids
 * newer than any stored, and re-published ones are of the last minutes). */
#define KL_LOOKUP_SET 65536
static kl_err_t kl_bench_lookups(kl_store_t *store, uint64_t epoch,
                                 uint64_t keys, int recent, double *rate) {
  char(*ids)[37] = malloc(KL_LOOKUP_SET * sizeof(*ids));
  char(*names)[32] = malloc(KL_LOOKUP_SET * sizeof(*names));
  size_t *name_lens = malloc(KL_LOOKUP_SET * sizeof(*name_lens));
  uint64_t window = keys < 10000 ? keys : 10000;
  for (uint64_t i = 0; ids && names && name_lens && i < KL_LOOKUP_SET; i++) {
    uint64_t r = kl_mix(i ^ 0xabcdef);
    uint64_t n = !recent ? r % keys
                 : i & 1 ? keys + r % 100000 /* newer than any */
                         : keys - 1 - r % window;
    kl_bench_id(!recent && (i & 1), n, ids[i]); /* run 1: never stored */
    name_lens[i] = kl_bench_key(n, names[i]);
  }
  kl_txn_t *txn = NULL;
  kl_err_t err = ids && names && name_lens
                     ? kl_store_begin(store, TOPIC, 0, epoch, &txn)
                     : KL_ENOMEM;
  uint64_t done = 0, hits = 0;
  double start = kl_bench_now(), elapsed = 0;
  while (!err && elapsed < 1.0) {
    for (uint64_t i = 0; !err && i < KL_LOOKUP_SET; i++, done++) {
      kl_mark_t mark;
      err = kl_txn_seen(txn, names[i], name_lens[i], ids[i], 36, &mark);
      hits += mark != KL_MARK_NONE;
    }
    elapsed = kl_bench_now() - start;
  }
  if (txn)
    kl_store_abort(txn);
  free(ids);
  free(names);
  free(name_lens);
  if (!err && hits != done / 2)
    fprintf(stderr,
            "keylane-bench store: %" PRIu64 " hits of %" PRIu64
            " lookups, expected half\n",
            hits, done);
  *rate = done / elapsed;
  return err;
}

static kl_err_t kl_bench_dedup(const char *dir, int full, kl_dedup_run_t *runs,
                               int *nruns) {
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "store.durability", "none");
  kl_conf_set(conf, "store.map.size", "1G");
  kl_store_t *store;
  kl_err_t err = kl_store_open(dir, conf, &store);
  kl_conf_destroy(conf);
  if (err)
    return err;
  kl_partition_state_t ps;
  err = kl_store_acquire(store, TOPIC, 0, &ps);
  const uint64_t sizes[] = {10000, 100000, 1000000, 10000000};
  uint64_t have = 0;
  *nruns = 0;
  for (int i = 0; !err && i < (full ? 4 : 3); i++) {
    fprintf(stderr, "keylane-bench store: dedup: %" PRIu64 " keys\n", sizes[i]);
    err = kl_bench_fill(store, ps.epoch, have, sizes[i]);
    have = sizes[i];
    kl_dedup_run_t *run = &runs[(*nruns)++];
    run->keys = have;
    kl__store_usage_t usage;
    if (!err)
      err = kl_bench_lookups(store, ps.epoch, have, 0, &run->random_per_s);
    if (!err)
      err = kl_bench_lookups(store, ps.epoch, have, 1, &run->recent_per_s);
    if (!err && !(err = kl__store_lmdb_usage(store, &usage)))
      run->bytes_per_key = (double)(usage.ids_pages * usage.page_size) /
                           (double)(usage.ids ? usage.ids : 1);
  }
  kl_store_destroy(store);
  return err;
}

/* ---- the report ------------------------------------------------------ */

#define KL_PG_TARGET 0.25 /* PostgreSQL / LMDB at batch 1000 */

/* PostgreSQL's rate over LMDB's at @p batch in the same run; -1 when that
 * batch size was not run (--batch), so that no target reads as missed. */
static double kl_pg_ratio(const kl_commit_run_t *c, int nc, int batch) {
  double lmdb = 0, pg = 0;
  for (int i = 0; i < nc; i++)
    if (c[i].batch == batch)
      *(strcmp(c[i].backend, "lmdb") == 0 ? &lmdb : &pg) = c[i].events_per_s;
  return lmdb > 0 ? pg / lmdb : -1;
}

/* The ratio at @p batch as text: "not run" when it was not. */
static const char *kl_pg_ratio_text(const kl_commit_run_t *c, int nc, int batch,
                                    char *buf, size_t size) {
  double r = kl_pg_ratio(c, nc, batch);
  if (r < 0)
    return "not run";
  snprintf(buf, size, "%.3f", r);
  return buf;
}

/* The target's verdict, NULL when batch 1000 was not run. */
static const char *kl_pg_target(const kl_commit_run_t *c, int nc) {
  double r = kl_pg_ratio(c, nc, 1000);
  return r < 0 ? NULL : r >= KL_PG_TARGET ? "met" : "MISSED";
}

/* A ratio for the JSON: null when that batch size was not run. */
static json_t *kl_pg_ratio_json(const kl_commit_run_t *c, int nc, int batch) {
  double r = kl_pg_ratio(c, nc, batch);
  return r < 0 ? json_null() : json_real(r);
}

static void kl_report_text(const kl_commit_run_t *c, int nc,
                           const kl_dedup_run_t *d, int nd, const char *pg,
                           const char *sync_commit) {
  printf("commits (per batch: prefetch ids; per event: seen, get, put, "
         "mark)\n");
  printf("  %-10s %6s %12s %12s %10s %10s %10s  %s\n", "backend", "batch",
         "events/s", "warm-up", "p50 ms", "p99 ms", "cache hit",
         "mean ms per batch: begin, prefetch, events, commit");
  for (int i = 0; i < nc; i++)
    printf("  %-10s %6d %12.0f %12.0f %10.3f %10.3f %10.3f  %.3f %.3f %.3f "
           "%.3f\n",
           c[i].backend, c[i].batch, c[i].events_per_s, c[i].warmup_per_s,
           c[i].p50_ms, c[i].p99_ms, c[i].cache_hit_ratio, c[i].begin_ms,
           c[i].prefetch_ms, c[i].events_ms, c[i].commit_ms);
  if (pg)
    printf("  postgresql: skipped: %s\n", pg);
  else {
    char r100[16], r1000[16];
    const char *target = kl_pg_target(c, nc);
    printf("  postgresql synchronous_commit=%s; postgresql/lmdb: batch 100 "
           "%s, batch 1000 %s (target >= %.2f at batch 1000: %s)\n",
           sync_commit, kl_pg_ratio_text(c, nc, 100, r100, sizeof(r100)),
           kl_pg_ratio_text(c, nc, 1000, r1000, sizeof(r1000)), KL_PG_TARGET,
           target ? target : "not run");
  }
  if (nd) {
    printf("LMDB dedup lookups/s (kl_txn_seen, half hits, half misses)\n");
    printf("  %10s %12s %8s %12s %8s %10s\n", "keys", "recent", "vs 10k",
           "random", "vs 10k", "bytes/key");
  }
  for (int i = 0; i < nd; i++)
    printf("  %10" PRIu64 " %12.0f %7.2fx %12.0f %7.2fx %10.1f\n", d[i].keys,
           d[i].recent_per_s, d[i].recent_per_s / d[0].recent_per_s,
           d[i].random_per_s, d[i].random_per_s / d[0].random_per_s,
           d[i].bytes_per_key);
  if (nd) {
    const kl_dedup_run_t *last = &d[nd - 1];
    printf("targets at %" PRIu64 " keys: rate >= 0.5 x at 10k: recent %s, "
           "random %s; bytes per key <= 100: %s\n",
           last->keys,
           last->recent_per_s >= 0.5 * d[0].recent_per_s ? "met" : "MISSED",
           last->random_per_s >= 0.5 * d[0].random_per_s ? "met" : "MISSED",
           last->bytes_per_key <= 100 ? "met" : "MISSED");
  }
}

static void kl_report_json(const kl_commit_run_t *c, int nc,
                           const kl_dedup_run_t *d, int nd, const char *pg,
                           const char *sync_commit) {
  json_t *commits = json_array(), *dedup = json_array();
  for (int i = 0; i < nc; i++) {
    json_t *run = json_pack(
        "{sssisIsIsfsfsfsf}", "backend", c[i].backend, "batch", c[i].batch,
        "events", (json_int_t)c[i].events, "batches", (json_int_t)c[i].batches,
        "events_per_s", c[i].events_per_s, "p50_commit_ms", c[i].p50_ms,
        "p99_commit_ms", c[i].p99_ms, "cache_hit_ratio", c[i].cache_hit_ratio);
    json_object_set_new(run, "warmup_events_per_s",
                        json_real(c[i].warmup_per_s));
    json_object_set_new(run, "mean_ms_per_batch",
                        json_pack("{sfsfsfsf}", "begin", c[i].begin_ms,
                                  "prefetch", c[i].prefetch_ms, "events",
                                  c[i].events_ms, "commit", c[i].commit_ms));
    json_array_append_new(commits, run);
  }
  for (int i = 0; i < nd; i++)
    json_array_append_new(
        dedup, json_pack("{sIsfsfsfsfsf}", "keys", (json_int_t)d[i].keys,
                         "recent_per_s", d[i].recent_per_s, "recent_vs_10k",
                         d[i].recent_per_s / d[0].recent_per_s, "random_per_s",
                         d[i].random_per_s, "random_vs_10k",
                         d[i].random_per_s / d[0].random_per_s, "bytes_per_key",
                         d[i].bytes_per_key));
  json_t *out = json_pack("{soso}", "commits", commits, "dedup", dedup);
  if (pg) {
    json_object_set_new(out, "postgresql_skipped", json_string(pg));
  } else {
    json_object_set_new(out, "postgresql_synchronous_commit",
                        json_string(sync_commit));
    const char *target = kl_pg_target(c, nc);
    json_object_set_new(out, "pg_vs_lmdb_batch_100",
                        kl_pg_ratio_json(c, nc, 100));
    json_object_set_new(out, "pg_vs_lmdb_batch_1000",
                        kl_pg_ratio_json(c, nc, 1000));
    json_object_set_new(out, "pg_target_met",
                        target ? json_boolean(strcmp(target, "met") == 0)
                               : json_null());
  }
  if (nd) {
    json_object_set_new(
        out, "dedup_recent_target_met",
        json_boolean(d[nd - 1].recent_per_s >= 0.5 * d[0].recent_per_s));
    json_object_set_new(
        out, "dedup_random_target_met",
        json_boolean(d[nd - 1].random_per_s >= 0.5 * d[0].random_per_s));
    json_object_set_new(out, "bytes_per_key_target_met",
                        json_boolean(d[nd - 1].bytes_per_key <= 100));
  }
  kl_bench_json(out);
}

/* ---- the runs -------------------------------------------------------- */

static const int kl_batches[] = {1, 100, 1000};
static int kl_only_batch; /* --batch: 0 for all of kl_batches */

/* The server's synchronous_commit, read on a batch's connection, into
 * @p out; "" for a store that is not PostgreSQL. */
static kl_err_t kl_bench_sync_commit(kl_store_t *store, char *out,
                                     size_t size) {
  kl_partition_state_t ps;
  kl_txn_t *txn;
  kl_err_t err = kl_store_acquire(store, "bench-settings", 0, &ps);
  if (err || (err = kl_store_begin(store, "bench-settings", 0, ps.epoch, &txn)))
    return err;
  PGconn *pg = kl_txn_pg_conn(txn);
  PGresult *res = pg ? PQexec(pg, "SHOW synchronous_commit") : NULL;
  snprintf(out, size, "%s",
           res && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res)
               ? PQgetvalue(res, 0, 0)
               : "");
  PQclear(res);
  kl_store_abort(txn);
  return KL_OK;
}

static char kl_sync_commit[32] = "?";

#define KL_SLICES 8 /* turns each backend takes in a commit run */

/* The commit runs: per batch size, LMDB and (when @p pg is not NULL)
 * PostgreSQL take turns of seconds / KL_SLICES: one to warm up, whose rate
 * is printed apart (the owner cache's first read of each key is a round
 * trip; LMDB's first pages fault in), then KL_SLICES counted. */
static kl_err_t kl_bench_commit_runs(kl_store_t *lmdb, kl_store_t *pg,
                                     double seconds, kl_commit_run_t *runs,
                                     int *n) {
  kl_err_t err = KL_OK;
  for (int i = 0; !err && i < 3; i++) {
    if (kl_only_batch && kl_batches[i] != kl_only_batch)
      continue;
    fprintf(stderr, "keylane-bench store: batches of %d, %s\n", kl_batches[i],
            pg ? "LMDB and PostgreSQL in turns" : "LMDB");
    kl_commit_acc_t acc[2] = {0};
    kl_store_t *stores[2] = {lmdb, pg};
    int sides = pg ? 2 : 1;
    for (int b = 0; !err && b < sides; b++)
      err = kl_acc_start(&acc[b], stores[b], (uint64_t)i + 1);
    for (int slice = 0; !err && slice <= KL_SLICES; slice++)
      for (int b = 0; !err && b < sides; b++)
        if (!(err = kl_bench_slice(&acc[b], kl_batches[i],
                                   seconds / KL_SLICES)) &&
            slice == 0)
          kl_acc_warmed(&acc[b]);
    for (int b = 0; !err && b < sides; b++)
      kl_acc_end(&acc[b], b ? "postgresql" : "lmdb", kl_batches[i],
                 &runs[(*n)++]);
    for (int b = 0; b < sides; b++)
      free(acc[b].lat);
  }
  if (err)
    fprintf(stderr, "keylane-bench store: commits: %s: %s\n", kl_err_name(err),
            kl_err_detail());
  return err;
}

static void kl_store_help(void) {
  fputs(kl_store_usage, stdout);
}

static int kl_bench_parse(int argc, char **argv, kl_bench_opts_t *o) {
  int64_t seconds = 3, batch = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "full", .on = &o->full},
      {.name = "seconds", .max = 600, .out = &seconds},
      {.name = "pg", .text = &o->pg_uri},
      {.name = "skip-pg", .on = &o->skip_pg},
      {.name = "batch", .max = 1000, .out = &batch},
      {0}};
  int rc = kl_bench_flags(NAME, argc, argv, flags, &o->json, kl_store_help);
  if (rc == 2)
    fputs(kl_store_usage, stderr);
  if (rc)
    return rc;
  if (batch && batch != 1 && batch != 100 && batch != 1000) {
    fprintf(stderr,
            "keylane-bench store: --batch takes 1, 100 or 1000, got %" PRId64
            "\n",
            batch);
    return 2;
  }
  o->seconds = (double)seconds;
  kl_only_batch = o->batch = (int)batch;
  return 0;
}

/* The PostgreSQL store: on a throwaway durable server (*@p server) unless
 * --pg names one. @returns 0; -1 with why it is skipped in @p why; -2 on
 * an error (printed). */
static int kl_bench_pg_open(const kl_bench_opts_t *o, kl_t_pg_t **server,
                            kl_store_t **store, char *why, size_t why_size) {
  char uri[256];
  if (o->pg_uri) {
    snprintf(uri, sizeof(uri), "%s", o->pg_uri);
  } else {
    if (!(*server = kl_t_pg_start(1, why, why_size)))
      return -1;
    if (kl_t_pg_createdb(*server, "bench", uri, sizeof(uri)))
      return -2;
  }
  kl_err_t err = kl_store_open(uri, NULL, store);
  if (!err)
    err = kl_bench_sync_commit(*store, kl_sync_commit, sizeof(kl_sync_commit));
  if (err)
    fprintf(stderr, "keylane-bench store: postgresql: %s: %s\n",
            kl_err_name(err), kl_err_detail());
  return err ? -2 : 0;
}

int kl_bench_store(int argc, char **argv) {
  kl_bench_opts_t o = {0};
  int rc = kl_bench_parse(argc, argv, &o);
  if (rc)
    return rc < 0 ? 0 : rc;
  kl_commit_run_t commits[6];
  kl_dedup_run_t dedup[4];
  int nc = 0, nd = 0;
  char dir[] = "/tmp/keylane-bench-XXXXXX", sub[64], why[2048] = "";
  if (!mkdtemp(dir)) {
    perror("keylane-bench store: mkdtemp");
    return 1;
  }
  snprintf(sub, sizeof(sub), "%s/commits", dir);
  kl_store_t *lmdb = NULL, *pgs = NULL;
  kl_t_pg_t *server = NULL;
  kl_err_t err = kl_store_open(sub, NULL, &lmdb);
  if (err)
    fprintf(stderr, "keylane-bench store: lmdb: %s: %s\n", kl_err_name(err),
            kl_err_detail());
  int pg = err || o.skip_pg
               ? -1
               : kl_bench_pg_open(&o, &server, &pgs, why, sizeof(why));
  if (o.skip_pg)
    snprintf(why, sizeof(why), "--skip-pg");
  if (!err && pg != -2 &&
      kl_bench_commit_runs(lmdb, pg ? NULL : pgs, o.seconds, commits, &nc))
    pg = -2;
  kl_store_destroy(pgs);
  kl_store_destroy(lmdb);
  if (server)
    kl_t_pg_stop(server);
  snprintf(sub, sizeof(sub), "%s/dedup", dir);
  if (!err && pg != -2 && !o.batch &&
      (err = kl_bench_dedup(sub, o.full, dedup, &nd)))
    fprintf(stderr, "keylane-bench store: dedup: %s: %s\n", kl_err_name(err),
            kl_err_detail());
  char cmd[96];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "keylane-bench store: could not remove %s\n", dir);
  if (err || pg == -2)
    return 1;
  (o.json ? kl_report_json : kl_report_text)(
      commits, nc, dedup, nd, pg == -1 ? why : NULL, kl_sync_commit);
  return 0;
}
