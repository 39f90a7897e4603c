/*
 * keylane-bench produce: what kl_publish costs over the librdkafka loop a
 * service would write without keylane.
 *
 * Both sides run against the same embedded cluster with the same producer
 * settings (idempotence, acks=all, librdkafka's default linger and batch
 * sizes, the same queue.buffering.max.messages), the same keys and values
 * of the same size (keylane's: a 100-byte payload in its envelope), and
 * both serve delivery reports after every produce.
 * The bare loop lets librdkafka route (murmur2_random, the Java-compatible
 * partitioner) and copies the payload (F_COPY); kl_publish routes itself,
 * makes an idempotency key, stamps the time and encodes the envelope.
 * Each run ends when every event has its delivery report.
 *
 * Besides the rates, each run reports the CPU time per event of the
 * publishing thread and of the whole process: on a shared machine the
 * rates move with the other work on it, the CPU times much less.
 *
 * Runs alternate (K B, B K, K B, ...) so that drift in the machine affects
 * both sides alike; each round gets a fresh cluster, since the mock keeps
 * every record in memory. The figures reported are the medians.
 *
 * Checked for fairness (librdkafka 2.0.2): rd_kafka_conf_dump() of the two
 * producers differs only in the callbacks (keylane also sets an error and
 * a log callback, neither called per message) and the opaque, since the
 * bare loop sets kl_producer's message.max.bytes (KL_MESSAGE_MAX) too; the
 * topic partitioner differs but keylane sets every partition itself, with
 * the same murmur2 result. What keylane does beyond the bare loop is its own
 * work: an id, a clock read, the checks, the encoding, and reading the id
 * back in each delivery report; the ratio prices that (issue 37: "a bare
 * producer sending the same bytes"). What the envelope's bytes cost on top
 * of a bare 100-byte payload is a separate question: --raw-payload 100
 * answers it (the ratio then counts the envelope's 70 bytes too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "bench.h"
#include "keylane/embedded.h"
#include "keylane/producer.h"

#define KL_BP_NAME "produce"
#define KL_BP_PAYLOAD 100
#define KL_BP_RAW_PAYLOAD_MAX 4096
#define KL_BP_KEYS 10000
#define KL_BP_ROUNDS_MAX 50
#define KL_BP_TOPIC "bench"

typedef struct kl_bp_opts {
  int64_t events;
  int64_t rounds;
  int64_t brokers;
  int64_t partitions;
  int64_t raw_payload; /* the bare loop's payload size */
  const char *only;    /* "keylane" or "raw": one side, for perf record */
  int json;
} kl_bp_opts_t;

typedef struct kl_bp_data {
  char keys[KL_BP_KEYS][16];
  size_t key_lens[KL_BP_KEYS];
  unsigned char payload[KL_BP_RAW_PAYLOAD_MAX]; /* keylane uses 100 bytes */
  size_t raw_len;
  char queue_max[32];   /* queue.buffering.max.messages, the same for both */
  char message_max[32]; /* message.max.bytes: kl_producer's, for both */
} kl_bp_data_t;

typedef struct kl_bp_count {
  int64_t delivered;
  int64_t failed;
  size_t value_bytes; /* the size of one message value, as sent */
} kl_bp_count_t;

/* One run of one side: its rate, and the CPU it took per event, on the
 * publishing thread and in the whole process (librdkafka's threads and
 * the embedded brokers too). On this shared 2-core machine the rates move
 * by a third between runs with the other work on it; CPU time moves much
 * less, so it says what keylane adds where the rates cannot. */
typedef struct kl_bp_run {
  double eps;
  double thread_ns; /* per event */
  double process_ns;
} kl_bp_run_t;

typedef struct kl_bp_clock {
  double t0, thread0, process0;
} kl_bp_clock_t;

static double kl_bp_cpu(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void kl_bp_clock_start(kl_bp_clock_t *c) {
  c->thread0 = kl_bp_cpu(CLOCK_THREAD_CPUTIME_ID);
  c->process0 = kl_bp_cpu(CLOCK_PROCESS_CPUTIME_ID);
  c->t0 = kl_bench_now();
}

static kl_bp_run_t kl_bp_clock_stop(const kl_bp_clock_t *c, int64_t events) {
  double secs = kl_bench_now() - c->t0;
  double n = (double)events;
  return (kl_bp_run_t){
      .eps = n / secs,
      .thread_ns = (kl_bp_cpu(CLOCK_THREAD_CPUTIME_ID) - c->thread0) * 1e9 / n,
      .process_ns =
          (kl_bp_cpu(CLOCK_PROCESS_CPUTIME_ID) - c->process0) * 1e9 / n,
  };
}

/* ---- keylane ---- */

static void kl_bp_kl_dr(void *opaque, const kl_delivery_t *d) {
  kl_bp_count_t *count = opaque;
  if (d->err)
    count->failed++;
  else
    count->delivered++;
}

static kl_producer_t *kl_bp_kl_new(const char *bootstrap,
                                   const kl_bp_data_t *data,
                                   kl_bp_count_t *count) {
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap);
  kl_conf_set(conf, "kafka.queue.buffering.max.messages", data->queue_max);
  kl_producer_t *producer = NULL;
  if (kl_producer_new(conf, kl_bp_kl_dr, count, &producer) != KL_OK)
    fprintf(stderr, "keylane-bench produce: %s\n", kl_err_detail());
  kl_conf_destroy(conf);
  return producer;
}

/* @returns the run; its eps is negative on failure. */
static kl_bp_run_t kl_bp_run_keylane(const char *bootstrap,
                                     const kl_bp_data_t *data, int64_t events) {
  kl_bp_run_t failed = {.eps = -1};
  kl_bp_count_t count = {0};
  kl_producer_t *producer = kl_bp_kl_new(bootstrap, data, &count);
  if (!producer)
    return failed;
  /* The first publish reads metadata; keep it out of the timing. */
  int32_t parts = 0;
  if (kl_producer_partitions(producer, KL_BP_TOPIC, &parts) != KL_OK) {
    kl_producer_destroy(producer);
    return failed;
  }
  kl_event_t ev = {.type = "credit",
                   .type_len = 6,
                   .payload = data->payload,
                   .payload_len = KL_BP_PAYLOAD};
  kl_bp_clock_t clock;
  kl_bp_clock_start(&clock);
  for (int64_t i = 0; i < events; i++) {
    ev.key = data->keys[i % KL_BP_KEYS];
    ev.key_len = data->key_lens[i % KL_BP_KEYS];
    if (kl_publish(producer, KL_BP_TOPIC, &ev, NULL) != KL_OK) {
      fprintf(stderr, "keylane-bench produce: kl_publish: %s\n",
              kl_err_detail());
      kl_producer_destroy(producer);
      return failed;
    }
  }
  kl_err_t err = kl_flush(producer, 120000);
  kl_bp_run_t run = kl_bp_clock_stop(&clock, events);
  kl_producer_destroy(producer);
  if (err || count.failed || count.delivered != events)
    return failed;
  return run;
}

/* ---- bare librdkafka ---- */

static void kl_bp_raw_dr(rd_kafka_t *rk, const rd_kafka_message_t *m,
                         void *opaque) {
  (void)rk;
  kl_bp_count_t *count = opaque;
  if (m->err)
    count->failed++;
  else
    count->delivered++;
}

static rd_kafka_t *kl_bp_raw_new(const char *bootstrap,
                                 const kl_bp_data_t *data,
                                 kl_bp_count_t *count) {
  const char *props[][2] = {
      {"bootstrap.servers", bootstrap},
      {"enable.idempotence", "true"},
      {"acks", "all"},
      {"partitioner", "murmur2_random"},
      {"queue.buffering.max.messages", data->queue_max},
      {"message.max.bytes", data->message_max},
  };
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++)
    if (rd_kafka_conf_set(conf, props[i][0], props[i][1], errstr,
                          sizeof(errstr)) != RD_KAFKA_CONF_OK) {
      fprintf(stderr, "keylane-bench produce: %s\n", errstr);
      rd_kafka_conf_destroy(conf);
      return NULL;
    }
  rd_kafka_conf_set_dr_msg_cb(conf, kl_bp_raw_dr);
  rd_kafka_conf_set_opaque(conf, count);
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  if (!rk)
    rd_kafka_conf_destroy(conf);
  return rk;
}

static int kl_bp_raw_produce(rd_kafka_t *rk, rd_kafka_topic_t *rkt,
                             const kl_bp_data_t *data, int64_t i) {
  const char *key = data->keys[i % KL_BP_KEYS];
  size_t key_len = data->key_lens[i % KL_BP_KEYS];
  while (rd_kafka_produce(rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY,
                          (void *)data->payload, data->raw_len, key, key_len,
                          NULL) != 0) {
    if (rd_kafka_last_error() != RD_KAFKA_RESP_ERR__QUEUE_FULL)
      return -1;
    rd_kafka_poll(rk, 1);
  }
  rd_kafka_poll(rk, 0);
  return 0;
}

static kl_bp_run_t kl_bp_run_raw(const char *bootstrap,
                                 const kl_bp_data_t *data, int64_t events) {
  kl_bp_run_t failed = {.eps = -1};
  kl_bp_count_t count = {0};
  rd_kafka_t *rk = kl_bp_raw_new(bootstrap, data, &count);
  if (!rk)
    return failed;
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, KL_BP_TOPIC, NULL);
  const struct rd_kafka_metadata *md;
  if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR)
    rd_kafka_metadata_destroy(md); /* as kl_publish's first use, untimed */
  kl_bp_clock_t clock;
  kl_bp_clock_start(&clock);
  int64_t i = 0;
  while (i < events && kl_bp_raw_produce(rk, rkt, data, i) == 0)
    i++;
  rd_kafka_resp_err_t err = rd_kafka_flush(rk, 120000);
  kl_bp_run_t run = kl_bp_clock_stop(&clock, events);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(rk);
  if (i < events || err || count.failed || count.delivered != events)
    return failed;
  return run;
}

/* ---- rounds ---- */

static void kl_bp_data_init(kl_bp_data_t *data, size_t raw_len) {
  for (int i = 0; i < KL_BP_KEYS; i++)
    data->key_lens[i] =
        (size_t)snprintf(data->keys[i], sizeof(data->keys[i]), "acct-%d", i);
  for (int i = 0; i < KL_BP_RAW_PAYLOAD_MAX; i++)
    data->payload[i] = (unsigned char)('a' + i % 26);
  data->raw_len = raw_len;
  /* kl_producer's own default for a budget of 100000: the same for both. */
  snprintf(data->queue_max, sizeof(data->queue_max), "%d", 100000 + 1000);
  snprintf(data->message_max, sizeof(data->message_max), "%d", KL_MESSAGE_MAX);
}

/* One round on a fresh cluster: both sides, in the given order (or the one
 * --only names; the other's run stays as it was, zero). */
static int kl_bp_round(const kl_bp_opts_t *opts, const kl_bp_data_t *data,
                       int keylane_first, kl_bp_run_t *kl_run,
                       kl_bp_run_t *raw_run) {
  kl_embedded_t *embedded;
  if (kl_embedded_new((int)opts->brokers, KL_BP_TOPIC,
                      (int32_t)opts->partitions, &embedded) != KL_OK) {
    fprintf(stderr, "keylane-bench produce: %s\n", kl_err_detail());
    return -1;
  }
  const char *bootstrap = kl_embedded_bootstrap(embedded);
  int run_kl = !opts->only || strcmp(opts->only, "keylane") == 0;
  int run_raw = !opts->only || strcmp(opts->only, "raw") == 0;
  for (int side = 0; side < 2; side++) {
    if ((side == 0) == (keylane_first != 0)) {
      if (run_kl)
        *kl_run = kl_bp_run_keylane(bootstrap, data, opts->events);
    } else if (run_raw) {
      *raw_run = kl_bp_run_raw(bootstrap, data, opts->events);
    }
  }
  kl_embedded_destroy(embedded);
  return kl_run->eps >= 0 && raw_run->eps >= 0 ? 0 : -1;
}

/* The size of one keylane message value: the envelope of a bench event. */
static size_t kl_bp_envelope_size(const kl_bp_data_t *data) {
  char id[37];
  kl_event_make_id(id);
  kl_event_t ev = {.key = "acct-0",
                   .key_len = 6,
                   .id = id,
                   .id_len = 36,
                   .type = "credit",
                   .type_len = 6,
                   .ts = 1700000000000,
                   .payload = data->payload,
                   .payload_len = KL_BP_PAYLOAD};
  void *buf;
  size_t len = 0;
  if (kl_event_encode(&ev, &buf, &len) == KL_OK)
    free(buf);
  return len;
}

static json_t *kl_bp_array(const double *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_real(v[i]));
  return a;
}

/* The runs of one side, field by field (the medians sort them). */
typedef struct kl_bp_side {
  double eps[KL_BP_ROUNDS_MAX], thread_ns[KL_BP_ROUNDS_MAX],
      process_ns[KL_BP_ROUNDS_MAX];
} kl_bp_side_t;

static void kl_bp_side(const kl_bp_run_t *runs, int n, kl_bp_side_t *side) {
  for (int i = 0; i < n; i++) {
    side->eps[i] = runs[i].eps;
    side->thread_ns[i] = runs[i].thread_ns;
    side->process_ns[i] = runs[i].process_ns;
  }
}

static void kl_bp_report_json(const kl_bp_opts_t *opts,
                              const kl_bp_data_t *data, kl_bp_side_t *kl,
                              kl_bp_side_t *raw) {
  int n = (int)opts->rounds;
  json_t *kl_list = kl_bp_array(kl->eps, n),
         *raw_list = kl_bp_array(raw->eps, n),
         *ratios = kl_bench_ratios(kl->eps, raw->eps, n);
  double kl_eps = kl_bench_median(kl->eps, n);
  double raw_eps = kl_bench_median(raw->eps, n);
  json_t *o = json_pack(
      "{s:s, s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:s, s:s, s:f, s:f, s:f, "
      "s:o, s:o, s:f, s:o}",
      "bench", KL_BP_NAME, "events", (json_int_t)opts->events, "payload_bytes",
      KL_BP_PAYLOAD, "keylane_value_bytes", (int)kl_bp_envelope_size(data),
      "raw_payload_bytes", (json_int_t)opts->raw_payload, "brokers",
      (json_int_t)opts->brokers, "partitions", (json_int_t)opts->partitions,
      "rounds", (json_int_t)opts->rounds, "statistic", "median", "order",
      "alternating", "keylane_eps", kl_eps, "raw_eps", raw_eps, "ratio",
      raw_eps > 0 ? kl_eps / raw_eps : 0.0, "keylane_runs_eps", kl_list,
      "raw_runs_eps", raw_list, "target_ratio", 0.90, "ratio_rounds", ratios);
  json_object_set_new(o, "keylane_thread_ns",
                      json_real(kl_bench_median(kl->thread_ns, n)));
  json_object_set_new(o, "raw_thread_ns",
                      json_real(kl_bench_median(raw->thread_ns, n)));
  json_object_set_new(o, "keylane_process_ns",
                      json_real(kl_bench_median(kl->process_ns, n)));
  json_object_set_new(o, "raw_process_ns",
                      json_real(kl_bench_median(raw->process_ns, n)));
  kl_bench_json(o);
}

static void kl_bp_report(const kl_bp_opts_t *opts, const kl_bp_data_t *data,
                         const kl_bp_run_t *kl_runs,
                         const kl_bp_run_t *raw_runs) {
  int n = (int)opts->rounds;
  kl_bp_side_t kl, raw;
  kl_bp_side(kl_runs, n, &kl);
  kl_bp_side(raw_runs, n, &raw);
  if (opts->json) {
    kl_bp_report_json(opts, data, &kl, &raw);
    return;
  }
  double kl_eps = kl_bench_median(kl.eps, n);
  double raw_eps = kl_bench_median(raw.eps, n);
  printf("produce: %lld events per run, %d-byte payloads (keylane values "
         "%zu bytes with the envelope), %lld brokers, %lld partitions,\n"
         "%lld alternating rounds; medians (CPU: per event, on the "
         "publishing thread / in the whole process):\n",
         (long long)opts->events, KL_BP_PAYLOAD, kl_bp_envelope_size(data),
         (long long)opts->brokers, (long long)opts->partitions,
         (long long)opts->rounds);
  printf("  keylane  kl_publish        %12.0f events/s   CPU %5.0f / %5.0f ns"
         "\n",
         kl_eps, kl_bench_median(kl.thread_ns, n),
         kl_bench_median(kl.process_ns, n));
  printf("  raw      bare librdkafka   %12.0f events/s   CPU %5.0f / %5.0f ns"
         "   (%lld-byte payloads)\n",
         raw_eps, kl_bench_median(raw.thread_ns, n),
         kl_bench_median(raw.process_ns, n), (long long)opts->raw_payload);
  if (opts->only)
    return;
  printf("  ratio    keylane/raw       %12.3f   (target >= 0.90%s)\n",
         kl_eps / raw_eps,
         (size_t)opts->raw_payload == kl_bp_envelope_size(data)
             ? ""
             : "; the target is for the same bytes, the default");
}

static void kl_bp_help(void) {
  printf("usage: keylane-bench produce [--events N] [--rounds N] [--brokers N]"
         "\n                             [--partitions N] [--json]\n\n"
         "kl_publish against a bare librdkafka producer loop with the same\n"
         "settings (idempotence, acks=all, default linger and batching), on\n"
         "the same embedded cluster, values of the same size (a 100-byte\n"
         "payload in keylane's envelope). Runs alternate and a\n"
         "fresh cluster serves each round; the medians are reported, with\n"
         "ratio = keylane / raw (target >= 0.90).\n\n"
         "flags:\n"
         "  --events N      events per run (default 1000000)\n"
         "  --rounds N      runs of each side (default 3)\n"
         "  --brokers N     embedded brokers (default 3)\n"
         "  --partitions N  topic partitions (default 8)\n"
         "  --raw-payload N the bare loop's payload bytes (default: keylane's\n"
         "                  value size; 100 counts the envelope's bytes in\n"
         "                  the ratio too)\n"
         "  --only SIDE     run only keylane or raw (to profile one side)\n"
         "  --json          print one JSON object: keylane_eps, raw_eps,\n"
         "                  ratio, the runs and the CPU per event\n");
}

static int kl_bp_parse(int argc, char **argv, kl_bp_opts_t *opts) {
  const kl_bench_flag_t flags[] = {
      {.name = "events", .max = 100000000, .out = &opts->events},
      {.name = "rounds", .max = KL_BP_ROUNDS_MAX, .out = &opts->rounds},
      {.name = "brokers", .max = 16, .out = &opts->brokers},
      {.name = "partitions", .max = 1000, .out = &opts->partitions},
      {.name = "raw-payload",
       .max = KL_BP_RAW_PAYLOAD_MAX,
       .out = &opts->raw_payload},
      {.name = "only", .text = &opts->only},
      {0},
  };
  int rc =
      kl_bench_flags(KL_BP_NAME, argc, argv, flags, &opts->json, kl_bp_help);
  if (rc == 0 && opts->only && strcmp(opts->only, "keylane") != 0 &&
      strcmp(opts->only, "raw") != 0) {
    fprintf(stderr,
            "keylane-bench produce: --only %s: give keylane or raw, the "
            "side to run alone\n",
            opts->only);
    return 2;
  }
  return rc;
}

int kl_bench_produce(int argc, char **argv) {
  kl_bp_opts_t opts = {
      .events = 1000000, .rounds = 3, .brokers = 3, .partitions = 8};
  int rc = kl_bp_parse(argc, argv, &opts);
  if (rc)
    return rc < 0 ? 0 : rc;
  kl_bp_data_t *data = malloc(sizeof(*data));
  if (!data)
    return 1;
  kl_bp_data_init(data, 0);
  if (!opts.raw_payload) /* the same bytes as keylane's values */
    opts.raw_payload = (int64_t)kl_bp_envelope_size(data);
  data->raw_len = (size_t)opts.raw_payload;
  kl_bp_run_t kl_runs[KL_BP_ROUNDS_MAX] = {0}, raw_runs[KL_BP_ROUNDS_MAX] = {0};
  for (int r = 0; r < opts.rounds && rc == 0; r++) {
    rc =
        kl_bp_round(&opts, data, r % 2 == 0, &kl_runs[r], &raw_runs[r]) ? 1 : 0;
    fprintf(stderr,
            "round %d: keylane %.0f/s (CPU %.0f / %.0f ns), raw %.0f/s (CPU "
            "%.0f / %.0f ns)\n",
            r + 1, kl_runs[r].eps, kl_runs[r].thread_ns, kl_runs[r].process_ns,
            raw_runs[r].eps, raw_runs[r].thread_ns, raw_runs[r].process_ns);
  }
  if (rc == 0)
    kl_bp_report(&opts, data, kl_runs, raw_runs);
  else
    fprintf(stderr, "keylane-bench produce: a run failed (see above)\n");
  free(data);
  return rc;
}
