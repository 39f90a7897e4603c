/*
 * Which partitioner put a key on a partition: the default partitioners of
 * the Kafka clients a polyglot company uses, so that a misrouted record
 * (worker/lanes.c) and `keylane doctor`'s sample can name the client
 * setting that caused it. Not installed.
 *
 * keylane routes with murmur2 (kl_partition(), partition.c). The others:
 *   CRC32      librdkafka `consistent` and `consistent_random`, the default
 *              of confluent-kafka (Python, Go, .NET) and every other
 *              librdkafka-based client; kafka-go's CRC32Balancer.
 *   FNV-1a     Sarama's NewHashPartitioner, its default; librdkafka
 *              `fnv1a`/`fnv1a_random`; kafka-go's Hash balancer.
 *   FNV-1a/ref Sarama's NewReferenceHashPartitioner: FNV-1a still, with the
 *              Java client's sign handling; it does not match murmur2.
 * Random and round-robin partitioners (kafka-go's default) explain no key:
 * a record that none of these explains is "unknown".
 *
 * Every function is pure and thread safe.
 */
#ifndef KEYLANE_EVENT_PARTITIONERS_H
#define KEYLANE_EVENT_PARTITIONERS_H

#include <stddef.h>
#include <stdint.h>

typedef enum kl__partitioner {
  KL__PARTITIONER_MURMUR2 = 0,
  KL__PARTITIONER_CRC32,
  KL__PARTITIONER_FNV1A,
  KL__PARTITIONER_FNV1A_REF,
  KL__PARTITIONER_COUNT
} kl__partitioner_t;

/** A set of partitioners: bit (1u << kl__partitioner_t). */
typedef unsigned kl__partitioners_t;

/**
 * @returns the partition @p which picks for @p key among @p partitions, or
 *          -1 when @p partitions < 1.
 */
int32_t kl__partitioners_pick(kl__partitioner_t which, const void *key,
                              size_t len, int32_t partitions);

/**
 * Which partitioners put @p key on @p partition of a topic of
 * @p partitions: the question a misrouted record asks. Over a sample of
 * records, intersect the sets: what is left explains them all.
 * @returns the set; 0 when none does (a custom, random or round-robin
 *          partitioner, or another partition count).
 */
kl__partitioners_t kl__partitioners_explaining(const void *key, size_t len,
                                               int32_t partitions,
                                               int32_t partition);

/** @returns "murmur2", "CRC32", "FNV-1a" or "FNV-1a/ref". */
const char *kl__partitioner_name(kl__partitioner_t which);

/**
 * Writes into @p buf (NUL terminated, truncated to @p size) which client
 * setting produces the partitioners of @p set and how to change it to
 * murmur2, e.g. "CRC32: librdkafka's consistent_random ... set
 * partitioner=murmur2_random". An empty set says "unknown: ...".
 * @returns @p buf.
 */
const char *kl__partitioners_explain(kl__partitioners_t set, char *buf,
                                     size_t size);

#endif
