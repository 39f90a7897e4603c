#include "support/history.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "keylane/producer.h"

#define KL_T_PAD (120 * 1000)

static void kl_t_pad(unsigned char *p, size_t n, uint64_t *rnd) {
  for (size_t i = 0; i < n; i++) {
    uint64_t x = *rnd; /* xorshift64 */
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    *rnd = x;
    p[i] = (unsigned char)x;
  }
}

static void kl_t_send(kl_producer_t *producer, const char *topic,
                      const char *key, int seq, unsigned char *pad,
                      uint64_t *rnd) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  msgpack_pack_str_with_body(&pk, "amount", 6);
  msgpack_pack_int64(&pk, 1);
  msgpack_pack_str_with_body(&pk, "seq", 3);
  msgpack_pack_int64(&pk, seq);
  msgpack_pack_str_with_body(&pk, "pad", 3);
  kl_t_pad(pad, KL_T_PAD, rnd);
  msgpack_pack_bin_with_body(&pk, pad, KL_T_PAD);
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .type = "credit",
                   .type_len = 6,
                   .payload = sb.data,
                   .payload_len = sb.size};
  char id[37];
  kl_event_make_id(id);
  ev.id = id;
  ev.id_len = 36;
  if (kl_publish(producer, topic, &ev, NULL) != KL_OK) {
    fprintf(stderr, "publish: %s\n", kl_err_detail());
    abort();
  }
  msgpack_sbuffer_destroy(&sb);
}

static int64_t kl_t_low(const char *bootstrap, const char *topic) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                    sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  int64_t low = -1, high = -1;
  if (!rk ||
      rd_kafka_query_watermark_offsets(rk, topic, 0, &low, &high, 10000)) {
    fprintf(stderr, "watermarks of %s: %s\n", topic, errstr);
    abort();
  }
  rd_kafka_destroy(rk);
  return low;
}

int64_t kl_t_publish_truncated(const char *bootstrap, const char *topic,
                               const char *key, int count) {
  kl_conf_t *conf = kl_conf_new();
  kl_producer_t *producer = NULL;
  if (kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap) ||
      kl_producer_new(conf, NULL, NULL, &producer)) {
    fprintf(stderr, "producer: %s\n", kl_err_detail());
    abort();
  }
  kl_conf_destroy(conf);
  unsigned char *pad = malloc(KL_T_PAD);
  uint64_t rnd = 0x9E3779B97F4A7C15ULL;
  for (int seq = 1; seq <= count; seq++) {
    kl_t_send(producer, topic, key, seq, pad, &rnd);
    /* One message set each, so that the mock drops whole early ones. */
    if (kl_flush(producer, 30000) != KL_OK)
      abort();
  }
  free(pad);
  kl_producer_destroy(producer);
  return kl_t_low(bootstrap, topic);
}
