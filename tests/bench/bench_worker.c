/*
 * keylane-bench worker: what the worker's guarantees cost over a bare
 * librdkafka consume loop.
 *
 * The same ledger events (1,000 keys, 100-ish byte envelopes) are loaded
 * once into an embedded cluster. The bare side assigns itself every
 * partition from the beginning (no group join) and polls until it has seen
 * every event. The keylane side is one kl_worker with the ledger handler
 * and a durable LMDB store (fsync on every commit) in a fresh directory.
 * It joins a consumer group, and the coordinator holds a group's first
 * join for about 3 s (like Kafka's group.initial.rebalance.delay.ms): a
 * one-off cost that says nothing about throughput. So its rate is timed
 * from the worker's first assignment (kl_worker_stats().owned > 0) until
 * every partition's store watermark reached the end; the join time and
 * the end-to-end rate, join included, are printed beside it. Rounds
 * alternate (keylane, bare, keylane, ...); medians reported.
 *
 * --store pg: the worker's store is a fresh database on a throwaway
 * PostgreSQL server (fsync and synchronous_commit on) instead of LMDB;
 * target ratio >= 0.35 (KL_BENCH_TARGET_WORKER_PG).
 */
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "support/pg.h"
#include "support/support.h"
#include "store/cache.h"
#include "store/store_internal.h"

#define KL_BW_NAME "worker"
#define KL_BW_TOPIC "bench"
/* The embedded cluster keeps at most 5 MiB of records per partition (the
 * mock's retention); 64 partitions hold 1,000,000 ledger events. */
#define KL_BW_PARTS 64
#define KL_BW_EVENTS_PER_PART 15625 /* 1,000,000 / 64 */
/* PostgreSQL: a lane holds a pooled connection while its group transaction
 * is open, so the pool (at most 64, and the throwaway server takes 60
 * connections) has one per partition. 16 partitions hold 250,000 events. */
#define KL_BW_PARTS_PG 16
static int32_t kl_bw_parts = KL_BW_PARTS;
#define KL_BW_ROUNDS_MAX 9

typedef struct kl_bw_round {
  double keylane_s; /* first assignment to caught up */
  double join_s;    /* start to first assignment */
  double raw_s;
  uint64_t batches; /* per-partition batches (kl_worker_stats) */
  uint64_t txns;    /* store write transactions: what the fsyncs pay for */
  kl__cache_stats_t cache; /* PostgreSQL's owner cache and id lookups */
  double wal_bytes;        /* PostgreSQL: WAL written while the worker ran */
} kl_bw_round_t;

typedef struct kl_bw_caught {
  const kl__ledger_gen_t *gen;
  int32_t parts;
  uint64_t applied;
} kl_bw_caught_t;

static int kl_bw_part(void *opaque, const char *topic, int32_t partition,
                      const kl_partition_state_t *state) {
  kl_bw_caught_t *c = opaque;
  if (strcmp(topic, KL_BW_TOPIC) != 0)
    return 0;
  c->parts += state->watermark >= kl__ledger_gen_end(c->gen, partition);
  c->applied += state->applied;
  return 0;
}

/* Waits until every partition's watermark in the store reached its end.
 * The worker's own counters (memory) are polled first: a store query
 * every few ms would take server time and a pooled connection from the
 * worker it measures (on PostgreSQL, about a tenth of the server's
 * time). The store, the truth, is read once they say all is applied. */
static int kl_bw_wait_caught_up(const kl__ledger_gen_t *gen, kl_worker_t *w,
                                kl_store_t *store, double t0, double limit_s) {
  /* Transfers' credits (follow-ups) land after the events it published. */
  uint64_t want = kl__ledger_gen_published(gen) + kl__ledger_gen_transfers(gen);
  while (kl_bench_now() - t0 < limit_s) {
    kl_worker_stats_t st;
    kl_worker_stats(w, &st, sizeof(st));
    if (st.applied + st.duplicates < want) {
      kl_t_sleep_ms(1);
      continue;
    }
    kl_bw_caught_t c = {gen, 0, 0};
    if (kl_store_foreach_partition(store, kl_bw_part, &c) == KL_OK &&
        c.parts == kl_bw_parts && c.applied >= want)
      return 0;
    kl_t_sleep_ms(2);
  }
  return -1;
}

static double kl_bw_raw(const char *boot, int64_t events, int round) {
  char group[32], errstr[256];
  snprintf(group, sizeof(group), "raw-%d", round);
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", boot, errstr, sizeof(errstr));
  rd_kafka_conf_set(c, "group.id", group, errstr, sizeof(errstr));
  rd_kafka_conf_set(c, "auto.offset.reset", "earliest", errstr, sizeof(errstr));
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, errstr, sizeof(errstr));
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t *t =
      rd_kafka_topic_partition_list_new(kl_bw_parts);
  for (int p = 0; p < kl_bw_parts; p++)
    rd_kafka_topic_partition_list_add(t, KL_BW_TOPIC, p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  double t0 = kl_bench_now();
  rd_kafka_assign(rk, t);
  rd_kafka_topic_partition_list_destroy(t);
  int64_t seen = 0;
  size_t bytes = 0;
  while (seen < events && kl_bench_now() - t0 < 60) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m)
      continue;
    if (!m->err) {
      seen++;
      bytes += m->len; /* touch the message, as any consumer would */
    }
    rd_kafka_message_destroy(m);
  }
  double s = kl_bench_now() - t0;
  if (seen != events)
    fprintf(stderr,
            "keylane-bench worker: the bare consumer saw %" PRId64
            " of %" PRId64 " events in %.0f s\n",
            seen, events, s);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return seen == events && bytes ? s : -1;
}

/* The round's store: an LMDB directory, or a fresh database of @p pg. */
static kl_err_t kl_bw_store(kl_t_pg_t *pg, int round, char *where, size_t size,
                            kl_store_t **store) {
  char name[32];
  snprintf(name, sizeof(name), "worker%d", round);
  if (!pg)
    kl_t_tmpdir(where);
  else if (kl_t_pg_createdb(pg, name, where, size))
    return KL_ESTORE; /* kl_t_pg_createdb() said why */
  kl_conf_t *conf = kl_conf_new();
  char pool[16];
  snprintf(pool, sizeof(pool), "%d", (int)kl_bw_parts);
  kl_conf_set(conf, "store.pg.pool", pool);
  kl_err_t err = kl_store_open(where, conf, store);
  kl_conf_destroy(conf);
  return err;
}

/* The server's WAL position in bytes (pg_current_wal_lsn()), -1 when it
 * cannot be read: what a round's commits wrote is the difference. */
static double kl_bw_wal(kl_t_pg_t *pg) {
  char uri[512];
  kl_t_pg_admin_uri(pg, uri, sizeof(uri));
  PGconn *conn = PQconnectdb(uri);
  PGresult *res = PQexec(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn");
  double lsn = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1
                   ? strtod(PQgetvalue(res, 0, 0), NULL)
                   : -1;
  PQclear(res);
  PQfinish(conn);
  return lsn;
}

static double kl_bw_keylane(const char *boot, kl__ledger_gen_t *gen,
                            kl_t_pg_t *pg, int round, kl_bw_round_t *r) {
  char dir[256], group[32];
  snprintf(group, sizeof(group), "kl-%d", round);
  kl_store_t *store;
  if (kl_bw_store(pg, round, dir, sizeof(dir), &store)) {
    fprintf(stderr, "store: %s\n", kl_err_detail());
    return -1;
  }
  kl__store_usage_t u0 = {0}, u1 = {0}; /* zeroes on PostgreSQL */
  kl__store_lmdb_usage(store, &u0);
  double wal0 = pg ? kl_bw_wal(pg) : -1;
  double t0 = kl_bench_now();
  kl_t_worker_t *w = kl_t_worker_start(boot, KL_BW_TOPIC, group, store, NULL);
  kl_worker_stats_t st = {0};
  while (st.owned == 0 && kl_bench_now() - t0 < 60) {
    kl_t_sleep_ms(1);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  double t1 = kl_bench_now();
  int done =
      st.owned ? kl_bw_wait_caught_up(gen, w->worker, store, t1, 300) : -1;
  double s = kl_bench_now() - t1;
  r->join_s = t1 - t0;
  kl_worker_stats(w->worker, &st, sizeof(st));
  kl__store_lmdb_usage(store, &u1);
  double wal1 = pg ? kl_bw_wal(pg) : -1;
  r->wal_bytes = wal0 >= 0 && wal1 >= wal0 ? wal1 - wal0 : -1;
  r->batches = st.batches;
  r->txns = u1.txns - u0.txns;
  kl__store_cache_stats(store, &r->cache);
  kl_t_worker_stop(w);
  kl__ledger_verdict_t v;
  kl__ledger_gen_verify(gen, store, KL_BW_TOPIC, &v);
  kl_store_destroy(store);
  if (!pg)
    kl_t_rmrf(dir);
  return done == 0 && v.ok ? s : -1;
}

/* The per-event budget beside the worker's figures (--breakdown). */
static json_t *kl_bw_steps(const kl_bench_steps_t *s, double keps, double reps,
                           int json) {
  double worker_ns = 1e9 / keps, bare_ns = 1e9 / reps;
  if (json)
    return json_pack(
        "{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "events",
        (json_int_t)s->events, "batch", (json_int_t)s->batch, "decode_ns",
        s->decode_ns, "checks_ns", s->checks_ns, "handler_ns", s->handler_ns,
        "commit_ns", s->commit_ns, "apply_ns", s->apply_ns, "worker_ns",
        worker_ns, "bare_ns", bare_ns, "rest_ns", worker_ns - s->apply_ns);
  printf("  per event (ns), the apply path in memory, %" PRId64
         " events, a store commit per %" PRId64 " as the worker's:\n",
         s->events, s->batch);
  printf("    decode (kl_event_decode)                  %8.0f\n", s->decode_ns);
  printf("    id rules, routing, dedup lookup, mark     %8.0f\n", s->checks_ns);
  printf("    handler (the ledger's get and put)        %8.0f\n",
         s->handler_ns);
  printf("    store commit, durable, its share          %8.0f\n", s->commit_ns);
  printf("    = the apply path                          %8.0f\n", s->apply_ns);
  printf("    the worker, end to end, from this run     %8.0f\n", worker_ns);
  printf("    left: Kafka's consume, lanes, threads     %8.0f\n",
         worker_ns - s->apply_ns);
  printf("    the bare consume loop                     %8.0f\n", bare_ns);
  return NULL;
}

static void kl_bw_print(const kl_bw_round_t *rounds, int n, int64_t events,
                        int64_t transfers, int json, int pg,
                        const kl_bench_steps_t *steps) {
  double k[KL_BW_ROUNDS_MAX], b[KL_BW_ROUNDS_MAX], j[KL_BW_ROUNDS_MAX],
      e[KL_BW_ROUNDS_MAX];
  uint64_t batches = 0, txns = 0, hits = 0, gets = 0, id_queries = 0;
  uint64_t commits = 0, commit_batches = 0;
  double wal = 0, commit_s = 0, keylane_s = 0;
  for (int i = 0; i < n; i++) {
    wal = wal < 0 || rounds[i].wal_bytes < 0 ? -1 : wal + rounds[i].wal_bytes;
    hits += rounds[i].cache.hits;
    gets += rounds[i].cache.hits + rounds[i].cache.misses;
    id_queries += rounds[i].cache.id_queries;
    commits += rounds[i].cache.commits;
    commit_batches += rounds[i].cache.commit_batches;
    commit_s += (double)rounds[i].cache.commit_ns / 1e9;
    keylane_s += rounds[i].keylane_s;
    k[i] = rounds[i].keylane_s;
    b[i] = rounds[i].raw_s;
    j[i] = rounds[i].join_s;
    e[i] = rounds[i].join_s + rounds[i].keylane_s;
    batches += rounds[i].batches;
    txns += rounds[i].txns;
  }
  /* A round's ratio of events/s is raw seconds over keylane's. */
  json_t *ratios = kl_bench_ratios(b, k, n),
         *ratios_e2e = kl_bench_ratios(b, e, n);
  double ks = kl_bench_median(k, n), bs = kl_bench_median(b, n);
  double js = kl_bench_median(j, n), es = kl_bench_median(e, n);
  double keps = (double)events / ks, reps = (double)events / bs;
  double e2e = (double)events / es;
  double thousands = (double)events / 1000.0;
  double per_k = (double)txns / n / thousands;
  double batches_k = (double)batches / n / thousands;
  /* WAL bytes per event: the ids, the handler's rows, the fences */
  double wal_event = wal < 0 ? -1 : wal / n / (double)events;
  /* PostgreSQL: the partition batches a commit held, and the share of the
   * worker's time a commit waited for the server's answers (the store
   * counts; LMDB's commits are not): the committer thread's, which the
   * poll thread's handlers overlap (docs/design.md, "A commit in flight") */
  double per_commit = commits ? (double)commit_batches / (double)commits : 0;
  double wait_share = keylane_s > 0 ? commit_s / keylane_s : 0;
  /* A store commit is one LMDB write transaction (the worker commits the
   * batches of several partitions in one; the epoch acquires and expiry
   * sweeps are counted too). LMDB syncs twice per durable one: the data
   * pages, then the meta page (neither MDB_NOSYNC nor MDB_NOMETASYNC). */
  if (json) {
    json_t *o = json_pack(
        "{sIsisfsfsfsfsfsfsfsfsfsf}", "events", (json_int_t)events, "rounds", n,
        "keylane_eps", keps, "raw_eps", reps, "ratio", keps / reps,
        "commits_per_1000_events", per_k, "fsyncs_per_1000_events", 2 * per_k,
        "partition_batches_per_1000_events", batches_k, "keylane_s", ks,
        "join_s", js, "keylane_e2e_eps", e2e, "ratio_e2e", e2e / reps);
    json_object_set_new(o, "store", json_string(pg ? "postgresql" : "lmdb"));
    json_object_set_new(o, "ratio_rounds", ratios);
    json_object_set_new(o, "ratio_e2e_rounds", ratios_e2e);
    if (pg) { /* LMDB's write transactions: PostgreSQL's are not counted */
      json_object_set_new(o, "commits_per_1000_events", json_null());
      json_object_set_new(o, "fsyncs_per_1000_events", json_null());
      json_object_set_new(o, "cache_hit_ratio",
                          json_real(gets ? (double)hits / (double)gets : 0));
      json_object_set_new(o, "id_queries_per_1000_events",
                          json_real((double)id_queries / n / thousands));
      json_object_set_new(o, "wal_bytes_per_event",
                          wal_event < 0 ? json_null() : json_real(wal_event));
      json_object_set_new(o, "batches_per_commit", json_real(per_commit));
      json_object_set_new(o, "commit_wait_share", json_real(wait_share));
    }
    json_object_set_new(o, "transfers_percent", json_integer(transfers));
    if (steps)
      json_object_set_new(o, "breakdown", kl_bw_steps(steps, keps, reps, 1));
    kl_bench_json(o);
    return;
  }
  json_decref(ratios);
  json_decref(ratios_e2e);
  printf("worker, %" PRId64 " ledger events, %d partitions, median of %d "
         "rounds\n",
         events, kl_bw_parts, n);
  if (transfers)
    printf("  %" PRId64 " %% of them transfers: each applies twice, its "
           "debit, then its credit published through the outbox\n",
           transfers);
  printf("  keylane (ledger, durable %s): %10.0f events/s, from the first "
         "assignment\n",
         pg ? "PostgreSQL" : "LMDB", keps);
  printf("  bare librdkafka consume loop:   %10.0f events/s\n", reps);
  printf("  ratio %.2f (target >= %.2f)\n", keps / reps,
         pg ? KL_BENCH_TARGET_WORKER_PG : KL_BENCH_TARGET_WORKER);
  printf("  group join: %.2f s; end to end, join included: %.0f events/s "
         "(ratio %.2f)\n",
         js, e2e, e2e / reps);
  if (pg) /* a handler's get the cache missed, an id not prefetched: a
             round trip each */
    printf("  owner cache hit ratio %.3f; ids looked up one by one per 1000 "
           "events: %.2f\n",
           gets ? (double)hits / (double)gets : 0,
           (double)id_queries / n / thousands);
  if (pg && wal_event >= 0)
    printf("  WAL written per event: %.0f bytes\n", wal_event);
  if (pg)
    printf("  commits: %.1f partition batches each; a commit waited for "
           "its answers %.0f %% of the worker's time (on the committer "
           "thread, beside the handlers)\n",
           per_commit, 100 * wait_share);
  if (!pg) /* LMDB's write transactions; PostgreSQL's are not counted */
    printf("  store commits per 1000 events: %.2f (fsyncs: %.2f), holding "
           "%.2f partition batches\n",
           per_k, 2 * per_k, batches_k);
  if (steps)
    kl_bw_steps(steps, keps, reps, 0);
}

static void kl_bw_help(void) {
  printf("usage: keylane-bench worker [--events N] [--rounds N] "
         "[--store lmdb|pg] [--transfers PCT] [--breakdown] [--json]\n\n"
         "One worker (ledger handler, durable LMDB store) against a bare\n"
         "librdkafka consume loop over the same events on an embedded\n"
         "cluster. Default 1000000 events, 3 rounds each, medians.\n"
         "--store pg: a throwaway durable PostgreSQL server instead\n"
         "(target ratio >= %.2f); 16 partitions, one per pooled\n"
         "connection, which hold 250000 events (the default then).\n"
         "--transfers PCT makes PCT %% of the events transfers, whose\n"
         "credits go through the outbox; one round then (a second would\n"
         "read the first's credits).\n"
         "--breakdown also times the apply path's steps in memory (decode;\n"
         "id rules, routing, dedup lookup and mark; the handler; the\n"
         "durable commit's share) over as many events, in ns per event,\n"
         "beside the worker's own figure: the rest is Kafka's consume,\n"
         "the lanes and the threads.\n",
         KL_BENCH_TARGET_WORKER_PG);
}

int kl_bench_worker(int argc, char **argv) {
  int64_t events = -1, rounds = 3, transfers = 0;
  const char *backend = "lmdb";
  int json = 0, breakdown = 0;
  const kl_bench_flag_t flags[] = {
      {.name = "events", .max = 10000000, .out = &events},
      {.name = "breakdown", .on = &breakdown},
      {.name = "store", .text = &backend},
      {.name = "rounds", .max = KL_BW_ROUNDS_MAX, .out = &rounds},
      {.name = "transfers", .max = 100, .out = &transfers},
      {0}};
  int parsed = kl_bench_flags(KL_BW_NAME, argc, argv, flags, &json, kl_bw_help);
  if (parsed)
    return parsed < 0 ? 0 : parsed;
  int pg = strcmp(backend, "pg") == 0;
  if (!pg && strcmp(backend, "lmdb") != 0) {
    fprintf(stderr,
            "keylane-bench worker: --store takes lmdb or pg, got \"%s\"\n",
            backend);
    return 2;
  }
  kl_bw_parts = pg ? KL_BW_PARTS_PG : KL_BW_PARTS;
  /* Transfers' credits are records of the topic too. */
  int64_t room = (int64_t)kl_bw_parts * KL_BW_EVENTS_PER_PART;
  if (events < 0)
    events = room * 100 / (100 + transfers);
  if (events * (100 + transfers) / 100 > room) {
    fprintf(stderr,
            "keylane-bench worker: --events %" PRId64 " with --transfers "
            "%" PRId64 " is more than the embedded cluster's %" PRId32
            " partitions hold (%" PRId64 " records, the mock's retention); "
            "give at most --events %" PRId64 "\n",
            events, transfers, kl_bw_parts, room,
            room * 100 / (100 + transfers));
    return 2;
  }
  char why[512];
  kl_t_pg_t *server = pg ? kl_t_pg_start(1, why, sizeof(why)) : NULL;
  if (pg && !server) {
    fprintf(stderr, "keylane-bench worker: no PostgreSQL server: %s\n", why);
    return 1;
  }
  kl_embedded_t *cluster;
  if (kl_embedded_new(1, KL_BW_TOPIC, kl_bw_parts, &cluster)) {
    fprintf(stderr, "cluster: %s\n", kl_err_detail());
    return 1;
  }
  const char *boot = kl_embedded_bootstrap(cluster);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(1000, kl_bw_parts, 1);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  if (transfers)
    rounds = 1;
  int rc = producer && kl_bench_load(producer, gen, KL_BW_TOPIC, events,
                                     transfers) == 0
               ? 0
               : 1;
  kl_bw_round_t r[KL_BW_ROUNDS_MAX];
  for (int i = 0; rc == 0 && i < rounds; i++) {
    r[i].keylane_s = kl_bw_keylane(boot, gen, server, i, &r[i]);
    r[i].raw_s = kl_bw_raw(boot, events, i);
    if (r[i].keylane_s < 0 || r[i].raw_s < 0) {
      fprintf(stderr, "keylane-bench worker: round %d did not complete\n", i);
      rc = 1;
    }
  }
  /* The steps commit as often as the worker did: one store commit per
   * this many events (it commits several partitions' batches in one). */
  uint64_t txns = 0;
  for (int i = 0; rc == 0 && i < rounds; i++)
    txns += r[i].txns;
  int64_t per_commit = txns ? events * rounds / (int64_t)txns : 1000;
  kl_bench_steps_t steps;
  if (rc == 0 && breakdown &&
      kl_bench_steps(events, per_commit < 1 ? 1 : per_commit, &steps))
    rc = 1;
  if (rc == 0)
    kl_bw_print(r, (int)rounds, events, transfers, json, pg,
                breakdown ? &steps : NULL);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_embedded_destroy(cluster);
  kl_t_pg_stop(server);
  return rc;
}
