/* What the benchmarks share around their runs: flags, the load, the JSON
 * line, and a real Kafka to run on. */
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define KL_BENCH_FLAGS_MAX 16

#ifndef KL_KAFKA_SH
#define KL_KAFKA_SH "deploy/kafka/kafka.sh"
#endif

int kl_bench_count(const char *bench, const char *flag, const char *arg,
                   int64_t max, int64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(arg, &end);
  if (errno || end == arg || *end || v < 1 || v > (double)max ||
      v != (double)(int64_t)v) {
    fprintf(stderr,
            "keylane-bench %s: %s takes a whole number from 1 to "
            "%lld, got \"%s\"\n",
            bench, flag, (long long)max, arg);
    return 2;
  }
  *out = (int64_t)v;
  return 0;
}

/* Takes --NAME [ARG] of @p flag: @returns 0, or 2 for a bad count. */
static int kl_bench_flag_take(const char *bench, const kl_bench_flag_t *flag,
                              const char *arg) {
  if (flag->on) {
    *flag->on = 1;
    return 0;
  }
  if (flag->text) {
    *flag->text = arg;
    return 0;
  }
  char name[64];
  snprintf(name, sizeof(name), "--%s", flag->name);
  return kl_bench_count(bench, name, arg, flag->max, flag->out);
}

int kl_bench_flags(const char *bench, int argc, char **argv,
                   const kl_bench_flag_t *flags, int *json,
                   void (*help)(void)) {
  struct option opts[KL_BENCH_FLAGS_MAX + 3];
  int n = 0;
  for (; flags[n].name && n < KL_BENCH_FLAGS_MAX; n++)
    opts[n] = (struct option){
        flags[n].name, flags[n].on ? no_argument : required_argument, NULL, n};
  opts[n] = (struct option){"json", no_argument, NULL, 'j'};
  opts[n + 1] = (struct option){"help", no_argument, NULL, 'h'};
  opts[n + 2] = (struct option){NULL, 0, NULL, 0};
  int c, rc = 0;
  optind = 1;
  while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c >= 0 && c < n) {
      rc = kl_bench_flag_take(bench, &flags[c], optarg);
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

json_t *kl_bench_ratios(const double *num, const double *den, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_real(num[i] / den[i]));
  return a;
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

char *kl_bench_kafka_start(const char *bench, const char *dir, int64_t port,
                           const char *const *configs) {
  const char *sh = getenv("KEYLANE_KAFKA_SH");
  char cmd[2048], line[512], last[512] = "";
  int n = snprintf(cmd, sizeof(cmd),
                   "'%s' start --nodes 1 --dir '%s' --base-port %" PRId64,
                   sh && *sh ? sh : KL_KAFKA_SH, dir, port);
  for (int i = 0; configs && configs[i] && n < (int)sizeof(cmd); i++)
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " --config '%s'",
                  configs[i]);
  FILE *out = popen(cmd, "r");
  if (!out)
    return NULL;
  while (fgets(line, sizeof(line), out))
    snprintf(last, sizeof(last), "%s", line);
  if (pclose(out) != 0 || !*last) {
    fprintf(stderr,
            "keylane-bench %s: %s failed; pass --bootstrap to measure "
            "elsewhere\n",
            bench, cmd);
    return NULL;
  }
  last[strcspn(last, "\r\n")] = '\0';
  return strdup(last);
}

void kl_bench_kafka_stop(const char *bench, const char *dir) {
  const char *sh = getenv("KEYLANE_KAFKA_SH");
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "'%s' clean --dir '%s' >&2",
           sh && *sh ? sh : KL_KAFKA_SH, dir);
  if (system(cmd) != 0)
    fprintf(stderr, "keylane-bench %s: %s failed\n", bench, cmd);
}
