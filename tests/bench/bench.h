/*
 * keylane-bench: benchmark programs (not timed tests), one per subcommand,
 * dispatched by main.c from one table.
 *
 * A benchmark prints a human summary, or with --json exactly one JSON
 * object on stdout (logs go to stderr), so CI and scripts can read it.
 * Exit codes follow the keylane CLI: 0 ran, 1 failed, 2 bad usage.
 */
#ifndef KEYLANE_TESTS_BENCH_H
#define KEYLANE_TESTS_BENCH_H

#include <jansson.h>
#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/producer.h"
#include "cli/ledger_gen.h"

/* Targets of the worker's ratios (issue 37), which `keylane-bench worker`
 * prints beside its figure and `keylane-bench all` judges by. */
#define KL_BENCH_TARGET_WORKER 0.50
#define KL_BENCH_TARGET_WORKER_PG 0.35

/** A benchmark; argv[0] is its name, argv also holds --json if given. */
typedef int(kl_bench_fn)(int argc, char **argv);

/* One line per benchmark, and a row in main.c's table. */
int kl_bench_produce(int argc, char **argv);
int kl_bench_store(int argc, char **argv);
int kl_bench_worker(int argc, char **argv);
int kl_bench_gateway(int argc, char **argv);
int kl_bench_lanes(int argc, char **argv);
int kl_bench_exec(int argc, char **argv);
int kl_bench_latency(int argc, char **argv);
int kl_bench_fsync(int argc, char **argv);
int kl_bench_failover(int argc, char **argv);
int kl_bench_state(int argc, char **argv);
int kl_bench_timers(int argc, char **argv);
int kl_bench_all(int argc, char **argv);

/** A trivial python3 exec handler: answers ok to each event, pipelined
 *  (bench_exec.c). */
extern const char kl_bench_echo_py[];

/** Monotonic seconds, for timing runs. */
double kl_bench_now(void);

/** @returns the median of @p n values (sorts @p v in place). */
double kl_bench_median(double *v, int n);

/**
 * Parses a positive count for @p flag into *out, accepting 1e6-style and
 * 1000000; prints the problem and returns nonzero when it is not one.
 */
int kl_bench_count(const char *bench, const char *flag, const char *arg,
                   int64_t max, int64_t *out);

/**
 * A flag of a benchmark, of the kind its one pointer set says (written
 * with designated initializers, {0} ends a list):
 *   out   a count: --name N, 1 <= N <= max, into *out;
 *   on    a switch: --name sets *on to 1;
 *   text  --name VALUE points *text at VALUE, which the benchmark checks.
 */
typedef struct kl_bench_flag {
  const char *name; /* without the dashes; NULL ends a list */
  int64_t max;
  int64_t *out;
  int *on;
  const char **text;
} kl_bench_flag_t;

/**
 * Parses a benchmark's flags (bench_shared.c): those of @p flags (a
 * count is checked by kl_bench_count()), --json into *json, and
 * -h/--help, which calls @p help.
 * @returns 0 to run, -1 after the help, 2 for bad usage (printed).
 */
int kl_bench_flags(const char *bench, int argc, char **argv,
                   const kl_bench_flag_t *flags, int *json, void (*help)(void));

/**
 * Publishes @p events ledger events to @p topic through @p producer,
 * @p transfers of every 100 transfers between accounts and the rest
 * credits and debits, waiting for room when the producer is full, then
 * flushes (2 minutes at most).
 * @returns 0, or -1 (said on stderr).
 */
int kl_bench_load(kl_producer_t *producer, kl__ledger_gen_t *gen,
                  const char *topic, int64_t events, int64_t transfers);

/* ---- keylane-bench latency --handler none (bench_bare.c) ------------- */

/** A bare librdkafka consumer: Kafka's share of the latency. */
typedef struct kl_bench_bare kl_bench_bare_t;

/**
 * Starts a consumer with the settings a worker run with @p conf would use
 * (kl__worker_kafka_conf()), assigned every one of the @p partitions
 * partitions of @p topic from the beginning, on a thread of its own that
 * records each record's envelope ts -> received.
 * @param out  on KL_OK, the consumer, stopped with kl_bench_bare_stop().
 * @returns KL_OK, or the error kl_err_detail() explains.
 */
kl_err_t kl_bench_bare_start(const kl_conf_t *conf, const char *topic,
                             int32_t partitions, kl_bench_bare_t **out);

/** Records received so far (decoded ones). Any thread. */
uint64_t kl_bench_bare_received(kl_bench_bare_t *bare);

/** Its histogram, named like the worker's
 *  keylane_worker_event_latency_seconds: borrowed until the stop. */
struct kl__metrics *kl_bench_bare_metrics(kl_bench_bare_t *bare);

/** Stops @p bare's thread and consumer and frees it; accepts NULL. */
void kl_bench_bare_stop(kl_bench_bare_t *bare);

/**
 * Starts a real single-node Apache Kafka with deploy/kafka/kafka.sh
 * (KEYLANE_KAFKA_SH overrides the path) in @p dir on @p port, with the
 * broker settings @p configs ("KEY=VALUE", NULL-terminated; may be NULL).
 * @returns its bootstrap string (malloc()ed), or NULL (said on stderr,
 *          naming @p bench).
 */
char *kl_bench_kafka_start(const char *bench, const char *dir, int64_t port,
                           const char *const *configs);

/** Stops the Kafka of kl_bench_kafka_start() and deletes @p dir's data. */
void kl_bench_kafka_stop(const char *bench, const char *dir);

/** @returns a JSON array of num[i] / den[i] for the @p n rounds: each
 *  round's ratio, so a reader sees the spread around the median. */
json_t *kl_bench_ratios(const double *num, const double *den, int n);

/* ---- keylane-bench worker --breakdown (bench_steps.c) ----------------- */

/** What one event costs on the apply path, step by step, in ns. */
typedef struct kl_bench_steps {
  int64_t events, batch;
  double decode_ns;  /* kl_event_decode() */
  double checks_ns;  /* the id rules, routing, dedup lookup and mark */
  double handler_ns; /* the ledger's get and put */
  double commit_ns;  /* the durable store commit's share */
  double apply_ns;   /* all of the above: the apply path */
} kl_bench_steps_t;

/**
 * Times the apply path (kl__apply_batch() on a durable LMDB store) over
 * @p events ledger credits in memory, @p batch per store commit.
 * @returns 0, or -1 (said on stderr).
 */
int kl_bench_steps(int64_t events, int64_t batch, kl_bench_steps_t *out);

/* ---- keylane-bench all --compare (bench_compare.c) -------------------- */

/** Rounds of one figure read at most. */
#define KL_BENCH_ROUNDS_MAX 64
/** A change below this fraction is noise whatever the rounds' spread:
 *  three rounds can agree by chance. */
#define KL_BENCH_NOISE_MIN 0.05

/** One ratio of a run: its median and how far its rounds spread. */
typedef struct kl_bench_figure {
  double value;  /* the median of the rounds */
  double spread; /* (max - min) / median of the rounds: the run's noise */
} kl_bench_figure_t;

typedef enum {
  KL_BENCH_SAME,
  KL_BENCH_IMPROVED,
  KL_BENCH_REGRESSED,
} kl_bench_verdict_t;

/** (max - min) / median of @p n rounds; 0 for fewer than two (or more
 *  than KL_BENCH_ROUNDS_MAX). */
double kl_bench_spread(const double *rounds, int n);

/**
 * Compares @p now with @p before: *change is now / before - 1, *noise the
 * larger of the two spreads (at least KL_BENCH_NOISE_MIN). A change beyond
 * the noise either way is a verdict; within it, KL_BENCH_SAME.
 */
kl_bench_verdict_t kl_bench_compare(const kl_bench_figure_t *before,
                                    const kl_bench_figure_t *now,
                                    double *change, double *noise);

/** "same", "improved" or "regressed". */
const char *kl_bench_verdict_name(kl_bench_verdict_t v);

/** Prints @p o as the benchmark's one JSON line on stdout, and frees it. */
void kl_bench_json(json_t *o);

#endif
