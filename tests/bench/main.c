/* keylane-bench SUBCOMMAND [--json] [ARGS]: one table of benchmarks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static const struct {
  const char *name;
  kl_bench_fn *fn;
  const char *summary;
} kl_benches[] = {
    /* {"name", kl_bench_name, "one-line summary"}, one per benchmark */
    {"produce", kl_bench_produce,
     "kl_publish against a bare librdkafka loop (target ratio >= 0.90)"},
    {"store", kl_bench_store,
     "store commits LMDB vs PostgreSQL, and LMDB dedup lookups 10k -> 10M"},
    {"worker", kl_bench_worker,
     "one ledger worker against a bare consume loop (target ratio >= 0.50)"},
    {"gateway", kl_bench_gateway,
     "events/s through the HTTP gateway against direct kl_publish"},
    {"lanes", kl_bench_lanes,
     "key-parallel lanes on a 0-5 ms handler vs the ideal (target >= 0.90)"},
    {"exec", kl_bench_exec,
     "a python3 exec handler end to end: one at a time vs pipelined, c1, c4"},
    {"latency", kl_bench_latency,
     "publish -> applied p50/p99/p999 at a fixed rate, on a real broker"},
    {"fsync", kl_bench_fsync,
     "write+fdatasync p50/p99/p999: the floor under a durable store commit"},
    {"failover", kl_bench_failover,
     "key waits while workers restart, die or freeze, dynamic vs static"},
    {"state", kl_bench_state,
     "the worker's state API: 1,000 partitions, 100,000 keys retrying"},
    {"timers", kl_bench_timers,
     "1,000,000 timers pending: memory, firing rate, lateness p50/p99"},
    {"all", kl_bench_all,
     "produce, worker, gateway, worker --store pg: every ratio with its "
     "target; --compare FILE"},
};
#define KL_NBENCHES (sizeof(kl_benches) / sizeof(kl_benches[0]))

double kl_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void kl_bench_usage(FILE *out) {
  fprintf(out, "usage: keylane-bench SUBCOMMAND [--json] [ARGS]\n\n"
               "benchmarks:\n");
  for (size_t i = 0; i < KL_NBENCHES; i++)
    fprintf(out, "  %-10s %s\n", kl_benches[i].name, kl_benches[i].summary);
  fprintf(out, "\n'keylane-bench SUBCOMMAND --help' describes one; --json "
               "prints one JSON object.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    kl_bench_usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    kl_bench_usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < KL_NBENCHES; i++)
    if (strcmp(argv[1], kl_benches[i].name) == 0)
      return kl_benches[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "keylane-bench: unknown benchmark \"%s\"\n", argv[1]);
  kl_bench_usage(stderr);
  return 2;
}
