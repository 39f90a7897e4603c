/* What the benchmarks share around their runs: flags, the load, and the
 * JSON line. */
#include <getopt.h>
#include <stdio.h>

#include "bench.h"

#define KL_BENCH_FLAGS_MAX 16

int kl_bench_flags(const char *bench, int argc, char **argv,
                   const kl_bench_flag_t *flags, int *json,
                   void (*help)(void)) {
  struct option opts[KL_BENCH_FLAGS_MAX + 3];
  int n = 0;
  for (; flags[n].name && n < KL_BENCH_FLAGS_MAX; n++)
    opts[n] = (struct option){flags[n].name, required_argument, NULL, n};
  opts[n] = (struct option){"json", no_argument, NULL, 'j'};
  opts[n + 1] = (struct option){"help", no_argument, NULL, 'h'};
  opts[n + 2] = (struct option){NULL, 0, NULL, 0};
  int c, rc = 0;
  optind = 1;
  while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c >= 0 && c < n) {
      char flag[64];
      snprintf(flag, sizeof(flag), "--%s", flags[c].name);
      rc = kl_bench_count(bench, flag, optarg, flags[c].max, flags[c].out);
    } else if (c == 'j') {
      *json = 1;
    } else if (c == 'h') {
      help();
      return -1;
    } else {
      rc = 2;
    }
  }
  return rc;
}

void kl_bench_json(json_t *o) {
  json_dumpf(o, stdout, JSON_COMPACT);
  putchar('\n');
  json_decref(o);
}

int kl_bench_load(kl_producer_t *producer, kl__ledger_gen_t *gen,
                  const char *topic, int64_t events, int64_t transfers) {
  for (int64_t i = 0; i < events; i++) {
    kl_err_t err;
    while ((err = i % 100 < transfers
                      ? kl__ledger_gen_transfer(gen, producer, topic)
                      : kl__ledger_gen_publish(gen, producer, topic)) ==
           KL_EQUEUE_FULL)
      kl_producer_poll(producer, 10);
    if (err) {
      fprintf(stderr, "load: %s\n", kl_err_detail());
      return -1;
    }
  }
  return kl_flush(producer, 120000) == KL_OK ? 0 : -1;
}
