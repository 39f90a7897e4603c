/*
 * The partitioners of other Kafka clients, for diagnosis only: keylane
 * routes with murmur2 alone. tests/mock/test_partitioner.c cross-checks
 * CRC32 and FNV-1a against librdkafka's consistent and fnv1a partitioners.
 */
#include "event/partitioners.h"

#include <stdio.h>
#include <string.h>

#include "keylane/event.h"

/* zlib's CRC-32 (reflected 0xedb88320), librdkafka's rd_crc32. Bit by
 * bit: it runs for misrouted records, not on the hot path. */
static uint32_t parts_crc32(const unsigned char *p, size_t len) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < len; i++) {
    crc ^= p[i];
    for (int b = 0; b < 8; b++)
      crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

/* 32-bit FNV-1a, Go's hash/fnv New32a. */
static uint32_t parts_fnv1a(const unsigned char *p, size_t len) {
  uint32_t h = 0x811c9dc5u;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x01000193u;
  return h;
}

/* Sarama's NewHashPartitioner: int32(h) % n, then its absolute value.
 * Computed on the magnitude, which gives the same for every h (C's and
 * Go's % truncate towards zero) without negating INT32_MIN. */
static int32_t sarama_mod(uint32_t h, int32_t n) {
  uint32_t magnitude = h & 0x80000000u ? 0u - h : h;
  return (int32_t)(magnitude % (uint32_t)n);
}

int32_t kl__partitioners_pick(kl__partitioner_t which, const void *key,
                              size_t len, int32_t partitions) {
  if (partitions < 1)
    return -1;
  const unsigned char *p = key;
  uint32_t n = (uint32_t)partitions;
  switch (which) {
  case KL__PARTITIONER_MURMUR2:
    return kl_partition(key, len, partitions);
  case KL__PARTITIONER_CRC32:
    return (int32_t)(parts_crc32(p, len) % n);
  case KL__PARTITIONER_FNV1A:
    return sarama_mod(parts_fnv1a(p, len), partitions);
  case KL__PARTITIONER_FNV1A_REF:
    return (int32_t)((parts_fnv1a(p, len) & 0x7fffffffu) % n);
  case KL__PARTITIONER_COUNT:
    break;
  }
  return -1;
}

kl__partitioners_t kl__partitioners_explaining(const void *key, size_t len,
                                               int32_t partitions,
                                               int32_t partition) {
  kl__partitioners_t set = 0;
  for (int i = 0; i < KL__PARTITIONER_COUNT; i++)
    if (kl__partitioners_pick((kl__partitioner_t)i, key, len, partitions) ==
        partition)
      set |= 1u << i;
  return set;
}

const char *kl__partitioner_name(kl__partitioner_t which) {
  static const char *const names[] = {"murmur2", "CRC32", "FNV-1a",
                                      "FNV-1a/ref"};
  return which < KL__PARTITIONER_COUNT ? names[which] : "unknown";
}

/* Who uses it, and the setting that makes them use murmur2 instead. */
static const char *const kl_fixes[] = {
    "murmur2: the Java client's default partitioner, as keylane routes",
    "CRC32: librdkafka's consistent/consistent_random partitioner, the "
    "default of confluent-kafka (Python, Go, .NET) and other "
    "librdkafka-based clients: set partitioner=murmur2_random; kafka-go's "
    "CRC32Balancer: use kafka.Murmur2Balancer",
    "FNV-1a: Sarama's default NewHashPartitioner (or librdkafka's fnv1a, "
    "kafka-go's Hash): in Sarama set Config.Producer.Partitioner = "
    "sarama.NewCustomPartitioner(sarama.WithAbsFirst(), "
    "sarama.WithCustomHashFunction(<a Java-compatible murmur2 "
    "hash.Hash32>)); librdkafka: partitioner=murmur2_random; kafka-go: "
    "kafka.Murmur2Balancer",
    "FNV-1a/ref: Sarama's NewReferenceHashPartitioner, which is FNV-1a and "
    "not murmur2: use sarama.NewCustomPartitioner(sarama.WithAbsFirst(), "
    "sarama.WithCustomHashFunction(<a Java-compatible murmur2 "
    "hash.Hash32>))",
};

const char *kl__partitioners_explain(kl__partitioners_t set, char *buf,
                                     size_t size) {
  if (!size)
    return buf;
  buf[0] = '\0';
  size_t used = 0;
  for (int i = 0; i < KL__PARTITIONER_COUNT && used < size; i++)
    if (set & (1u << i)) {
      int n = snprintf(buf + used, size - used, "%s%s", used ? "; or " : "",
                       kl_fixes[i]);
      used += n > 0 ? (size_t)n : 0;
    }
  if (!set)
    snprintf(buf, size,
             "unknown: no murmur2, CRC32 or FNV-1a partitioner puts the key "
             "there (a random or round-robin partitioner such as kafka-go's "
             "default, a custom one, or another partition count): publish "
             "with the Java default partitioner (murmur2; kafka-go: "
             "kafka.Murmur2Balancer), or through keylane publish or the "
             "gateway");
  return buf;
}
