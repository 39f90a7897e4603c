/*
 * kl_murmur2 and kl_partition against the reference vectors of Kafka's
 * UtilsTest.testMurmur2 and librdkafka's rdmurmur2.c unit test, and against
 * librdkafka's own partitioner function on random keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "keylane/producer.h"

typedef struct kl_vector {
  const char *key;
  int32_t java; /* Java's signed int result */
} kl_vector_t;

/* org.apache.kafka.common.utils.UtilsTest#testMurmur2. */
static const kl_vector_t kl_kafka_vectors[] = {
    {"21", -973932308},
    {"foobar", -790332482},
    {"a-little-bit-long-string", -985981536},
    {"a-little-bit-longer-string", -1486304829},
    {"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
    {"abc", 479470107},
};

/* librdkafka src/rdmurmur2.c unittest_murmur2 (and the older
 * unittest_murmurhashneutral2 for "amqp"); the suffixes of "1234" and of
 * the long string exercise every tail length and misalignment there. */
static const kl_vector_t kl_rdkafka_vectors[] = {
    {"kafka", (int32_t)0xd067cf64},
    {"giberish123456789", (int32_t)0x8f552b0c},
    {"1234", (int32_t)0x9fc97b14},
    {"234", (int32_t)0xe7c009ca},
    {"34", (int32_t)0x873930da},
    {"4", (int32_t)0x5a4b5ca1},
    {"PreAmbleWillBeRemoved,ThePrePartThatIs", (int32_t)0x78424f1c},
    {"reAmbleWillBeRemoved,ThePrePartThatIs", (int32_t)0x4a62b377},
    {"eAmbleWillBeRemoved,ThePrePartThatIs", (int32_t)0xe0e4e09e},
    {"AmbleWillBeRemoved,ThePrePartThatIs", (int32_t)0x62b8b43f},
    {"", (int32_t)0x106e08d9},
    {"amqp", 767747138},
};

#define KL_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void kl_check_vectors(const kl_vector_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int32_t got = (int32_t)kl_murmur2(v[i].key, strlen(v[i].key));
    if (got != v[i].java)
      fail_msg("murmur2(\"%s\") = %d, Java says %d", v[i].key, got, v[i].java);
  }
}

static void test_kafka_utils_vectors(void **state) {
  (void)state;
  kl_check_vectors(kl_kafka_vectors, KL_COUNT(kl_kafka_vectors));
}

static void test_rdkafka_vectors(void **state) {
  (void)state;
  kl_check_vectors(kl_rdkafka_vectors, KL_COUNT(kl_rdkafka_vectors));
}

static void test_null_key_is_empty(void **state) {
  (void)state;
  assert_int_equal(kl_murmur2(NULL, 0), 0x106e08d9u);
}

/* The hash must not depend on where the key sits in memory. */
static void test_alignment_independent(void **state) {
  (void)state;
  const char *key = "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8";
  size_t len = strlen(key);
  char buf[128];
  for (size_t off = 0; off < 8; off++) {
    memcpy(buf + off, key, len);
    assert_int_equal((int32_t)kl_murmur2(buf + off, len), -58897971);
  }
}

/* Java: Utils.toPositive(murmur2(key)) % n, i.e. the sign bit masked. */
static void test_partition_to_positive(void **state) {
  (void)state;
  for (size_t i = 0; i < KL_COUNT(kl_kafka_vectors); i++) {
    const char *key = kl_kafka_vectors[i].key;
    uint32_t positive = (uint32_t)kl_kafka_vectors[i].java & 0x7fffffffu;
    for (int32_t n = 1; n <= 64; n++)
      assert_int_equal(kl_partition(key, strlen(key), n),
                       (int32_t)(positive % (uint32_t)n));
  }
  /* Hand-checked: "foobar" over 50 partitions (a Python port's test). */
  assert_int_equal(kl_partition("foobar", 6, 50), 16);
}

static void test_partition_rejects_no_partitions(void **state) {
  (void)state;
  assert_int_equal(kl_partition("k", 1, 0), -1);
  assert_int_equal(kl_partition("k", 1, -3), -1);
  assert_int_equal(kl_partition("k", 1, 1), 0);
}

/* librdkafka's exported murmur2 partitioner on random keys, every length
 * 1..200 and partition counts up to 1000 (it ignores rkt and opaques). */
static void test_matches_rdkafka_partitioner(void **state) {
  (void)state;
  unsigned char key[200];
  srand(12345);
  for (int round = 0; round < 20000; round++) {
    size_t len = 1 + (size_t)round % sizeof(key);
    for (size_t i = 0; i < len; i++)
      key[i] = (unsigned char)rand();
    int32_t n = 1 + rand() % 1000;
    int32_t want =
        rd_kafka_msg_partitioner_murmur2(NULL, key, len, n, NULL, NULL);
    assert_int_equal(kl_partition(key, len, n), want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kafka_utils_vectors),
      cmocka_unit_test(test_rdkafka_vectors),
      cmocka_unit_test(test_null_key_is_empty),
      cmocka_unit_test(test_alignment_independent),
      cmocka_unit_test(test_partition_to_positive),
      cmocka_unit_test(test_partition_rejects_no_partitions),
      cmocka_unit_test(test_matches_rdkafka_partitioner),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
