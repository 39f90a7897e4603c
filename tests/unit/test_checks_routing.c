/*
 * keylane doctor's routing judgement over a sample of records
 * (worker/checks.h): OK when every key is on its murmur2 partition; FAIL
 * naming the count, an example and the partitioner that explains them all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "event/partitioners.h"
#include "keylane/producer.h"
#include "worker/checks.h"

#define KL_PARTS 8
#define KL_N 40

static char kl_keys[KL_N][16];

/* A sample of KL_N keys, each put where @p which puts it. */
static void kl_sample(kl__partitioner_t which, kl__routed_t *out) {
  for (int i = 0; i < KL_N; i++) {
    snprintf(kl_keys[i], sizeof(kl_keys[i]), "acct-%d", i);
    size_t len = strlen(kl_keys[i]);
    out[i] =
        (kl__routed_t){kl_keys[i], len,
                       kl__partitioners_pick(which, kl_keys[i], len, KL_PARTS)};
  }
}

/* Judges a sample placed by @p which. */
static kl__check_t kl_judge(kl__partitioner_t which) {
  kl__routed_t sample[KL_N];
  kl_sample(which, sample);
  kl__check_t c;
  kl__check_routing_judge("events", sample, KL_N, KL_PARTS, &c);
  return c;
}

static void test_routed_sample_is_ok(void **state) {
  (void)state;
  kl__check_t c = kl_judge(KL__PARTITIONER_MURMUR2);
  assert_int_equal(c.status, KL__CHECK_OK);
  assert_non_null(strstr(c.msg, "all 40 sampled keys"));
}

static void test_crc32_sample_is_named(void **state) {
  (void)state;
  kl__check_t c = kl_judge(KL__PARTITIONER_CRC32);
  assert_int_equal(c.status, KL__CHECK_FAIL);
  assert_non_null(strstr(c.msg, "CRC32"));
  assert_non_null(strstr(c.msg, "partitioner=murmur2_random"));
  assert_null(strstr(c.msg, "FNV-1a:")); /* 40 keys tell them apart */
}

static void test_sarama_sample_is_named(void **state) {
  (void)state;
  kl__check_t c = kl_judge(KL__PARTITIONER_FNV1A);
  assert_int_equal(c.status, KL__CHECK_FAIL);
  assert_non_null(strstr(c.msg, "Sarama"));
  assert_null(strstr(c.msg, "CRC32"));
}

static void test_keyless_sample_warns(void **state) {
  (void)state;
  kl__routed_t sample[2] = {{NULL, 0, 1}, {"", 0, 2}};
  kl__check_t c;
  kl__check_routing_judge("events", sample, 2, KL_PARTS, &c);
  assert_int_equal(c.status, KL__CHECK_WARN);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_routed_sample_is_ok),
      cmocka_unit_test(test_crc32_sample_is_named),
      cmocka_unit_test(test_sarama_sample_is_named),
      cmocka_unit_test(test_keyless_sample_warns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
