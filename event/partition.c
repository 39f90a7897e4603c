/*
 * Java-compatible routing: Kafka's murmur2 and the default partitioner's
 * toPositive(murmur2(key)) % partitions.
 *
 * This must stay byte-identical to org.apache.kafka.common.utils.Utils
 * .murmur2 and to librdkafka's rd_murmur2, or a key published from Java
 * and the same key published by keylane land on different partitions, and
 * two workers would write the same entity. tests/unit/test_murmur2.c pins
 * the reference vectors; tests/mock/test_partitioner.c cross-checks
 * librdkafka's murmur2_random partitioner on 10,000 random keys.
 */
#include "keylane/event.h"

#define KL_MURMUR2_SEED 0x9747b28cu
#define KL_MURMUR2_M 0x5bd1e995u
#define KL_MURMUR2_R 24

/* Little-endian load from any alignment: Java reads the bytes one by one,
 * and compilers turn this into a single load on little-endian targets. */
static inline uint32_t murmur2_load(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

uint32_t kl_murmur2(const void *key, size_t len) {
  const unsigned char *data = key;
  /* Java's length is an int: the seed mixes in its low 32 bits. */
  uint32_t h = KL_MURMUR2_SEED ^ (uint32_t)len;
  size_t words = len / 4;
  for (size_t i = 0; i < words; i++) {
    uint32_t k = murmur2_load(data + i * 4);
    k *= KL_MURMUR2_M;
    k ^= k >> KL_MURMUR2_R;
    k *= KL_MURMUR2_M;
    h *= KL_MURMUR2_M;
    h ^= k;
  }
  const unsigned char *tail = data + words * 4;
  switch (len & 3) {
  case 3:
    h ^= (uint32_t)tail[2] << 16;
    /* fall through */
  case 2:
    h ^= (uint32_t)tail[1] << 8;
    /* fall through */
  case 1:
    h ^= tail[0];
    h *= KL_MURMUR2_M;
  }
  h ^= h >> 13;
  h *= KL_MURMUR2_M;
  h ^= h >> 15;
  return h;
}

int32_t kl_partition(const void *key, size_t len, int32_t partitions) {
  if (partitions < 1)
    return -1;
  /* Java's toPositive() masks the sign bit; it is not Math.abs(). */
  return (int32_t)((kl_murmur2(key, len) & 0x7fffffffu) % (uint32_t)partitions);
}
