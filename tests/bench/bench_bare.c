/*
 * keylane-bench latency --handler none: what Kafka and this machine cost
 * without keylane. A plain librdkafka consumer, made with the worker's
 * own consumer settings (kl__worker_kafka_conf()), assigned every
 * partition, records for each record the time from its envelope's ts to
 * the moment rd_kafka_consumer_poll() returned it, in a histogram with
 * the worker's latency buckets, rendered under the worker's name so that
 * the benchmark reads both the same way.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <librdkafka/rdkafka.h>

#include "bench.h"
#include "common/metrics.h"
#include "worker/lanes.h"
#include "worker/worker_internal.h"

struct kl_bench_bare {
  rd_kafka_t *rk;
  kl_decoder_t *decoder;
  kl__metrics_t *metrics;
  kl__series_t *latency;
  atomic_uint_fast64_t received;
  atomic_int stop;
  int started;
  pthread_t thread;
};

static void kl_bare_observe(kl_bench_bare_t *bare,
                            const rd_kafka_message_t *m) {
  kl_event_t event;
  if (m->err || kl_event_decode(bare->decoder, m->key, m->key_len, m->payload,
                                m->len, &event) != KL_OK)
    return;
  /* Negative when the producer's clock runs ahead, as in the worker. */
  int64_t since_ts = kl__now_ms() - event.ts;
  kl__series_observe(bare->latency, since_ts > 0 ? (double)since_ts / 1e3 : 0);
  atomic_fetch_add(&bare->received, 1);
}

static void *kl_bare_main(void *opaque) {
  kl_bench_bare_t *bare = opaque;
  while (!atomic_load(&bare->stop)) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(bare->rk, 100);
    if (m) {
      kl_bare_observe(bare, m);
      rd_kafka_message_destroy(m);
    }
  }
  return NULL;
}

static kl_err_t kl_bare_histogram(kl_bench_bare_t *bare, const char *topic) {
  const char *labels[] = {topic};
  if (!(bare->metrics = kl__metrics_new()))
    return KL_ENOMEM;
  bare->latency = kl__metric_series(
      kl__metrics_histogram(
          bare->metrics, "keylane_worker_event_latency_seconds",
          "From the event's envelope ts to a bare consumer's poll.", "topic",
          kl__lanes_latency_buckets, kl__lanes_latency_buckets_count),
      labels);
  return bare->latency && (bare->decoder = kl_decoder_new()) ? KL_OK
                                                             : KL_ENOMEM;
}

/* Assigns every partition from its beginning: the topic is new, and the
 * worker's auto.offset.reset=error refuses any other start. */
static kl_err_t kl_bare_assign(kl_bench_bare_t *bare, const char *topic,
                               int32_t partitions) {
  rd_kafka_topic_partition_list_t *list =
      rd_kafka_topic_partition_list_new(partitions);
  for (int32_t p = 0; p < partitions; p++)
    rd_kafka_topic_partition_list_add(list, topic, p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_resp_err_t kerr = rd_kafka_assign(bare->rk, list);
  rd_kafka_topic_partition_list_destroy(list);
  return kerr ? kl__err(KL_EKAFKA, "bare consumer: assign %s: %s", topic,
                        rd_kafka_err2str(kerr))
              : KL_OK;
}

static kl_err_t kl_bare_consumer(kl_bench_bare_t *bare, const kl_conf_t *conf) {
  rd_kafka_conf_t *kconf;
  kl_err_t err = kl__worker_kafka_conf(conf, &kconf);
  if (err)
    return err;
  char errstr[512];
  if (!(bare->rk =
            rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr)))) {
    rd_kafka_conf_destroy(kconf);
    return kl__err(KL_EKAFKA, "bare consumer: %s", errstr);
  }
  rd_kafka_poll_set_consumer(bare->rk);
  return KL_OK;
}

kl_err_t kl_bench_bare_start(const kl_conf_t *conf, const char *topic,
                             int32_t partitions, kl_bench_bare_t **out) {
  kl_bench_bare_t *bare = calloc(1, sizeof(*bare));
  if (!bare)
    return KL_ENOMEM;
  kl_err_t err = kl_bare_histogram(bare, topic);
  if (!err)
    err = kl_bare_consumer(bare, conf);
  if (!err)
    err = kl_bare_assign(bare, topic, partitions);
  if (!err && pthread_create(&bare->thread, NULL, kl_bare_main, bare) != 0)
    err = kl__err(KL_EIO, "bare consumer: cannot start its thread");
  bare->started = !err;
  if (err) {
    kl_bench_bare_stop(bare);
    return err;
  }
  *out = bare;
  return KL_OK;
}

uint64_t kl_bench_bare_received(kl_bench_bare_t *bare) {
  return atomic_load(&bare->received);
}

struct kl__metrics *kl_bench_bare_metrics(kl_bench_bare_t *bare) {
  return bare->metrics;
}

void kl_bench_bare_stop(kl_bench_bare_t *bare) {
  if (!bare)
    return;
  atomic_store(&bare->stop, 1);
  if (bare->started)
    pthread_join(bare->thread, NULL);
  if (bare->rk) {
    rd_kafka_consumer_close(bare->rk);
    rd_kafka_destroy(bare->rk);
  }
  kl_decoder_destroy(bare->decoder);
  kl__metrics_destroy(bare->metrics);
  free(bare);
}
