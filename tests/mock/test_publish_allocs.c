/*
 * Allocations on kl_publish()'s path: the envelope is written on the
 * stack and librdkafka copies it into the one allocation it makes for
 * every message (broker/producer.c says why), so a publish of an ordinary
 * event, with the delivery reports kl_publish() serves as it goes,
 * allocates nothing of keylane's: no envelope buffer, no copy of the id,
 * no header list.
 *
 * The test program counts (support/alloc_count.h), while armed, the
 * calls to malloc, calloc and realloc the test's own thread makes (the
 * publishing thread; librdkafka's threads allocate per batch on their own),
 * apart for librdkafka's code and for the rest. Not built with a sanitizer,
 * which brings its own malloc.
 */
#include "support/alloc_count.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/producer.h"
#include "support/cluster.h"

enum { LIB_RDKAFKA, LIB_REST };
static kl_t_alloc_lib_t libs[] = {{.name = "librdkafka"}, {.name = "the rest"}};

static unsigned long delivered;

static void on_delivery(void *opaque, const kl_delivery_t *d) {
  (void)opaque;
  assert_int_equal(d->err, KL_OK);
  assert_int_equal(d->id_len, 36); /* read back from the payload */
  delivered++;
}

enum { WARM = 2000, EVENTS = 10000, KEYS = 500 };

/* Publishes @p n events of @p payload_len bytes from event @p from on,
 * serving their reports: a fresh id each, keys spread over KEYS. */
static void publish(kl_producer_t *producer, const char *topic, int from, int n,
                    size_t payload_len) {
  static unsigned char payload[2048];
  memset(payload, 'p', sizeof(payload));
  for (int i = from; i < from + n; i++) {
    char key[16];
    int len = snprintf(key, sizeof(key), "acct-%d", i % KEYS);
    kl_event_t ev = {.key = key,
                     .key_len = (size_t)len,
                     .type = "credit",
                     .type_len = 6,
                     .payload = payload,
                     .payload_len = payload_len};
    kl_err_t err = kl_publish(producer, topic, &ev, NULL);
    if (err)
      fail_msg("event %d: %s", i, kl_err_detail());
  }
}

static void publish_allocates_nothing_of_keylanes(void **state) {
  (void)state;
  assert_true(kl_t_allocs_init_mine(libs, sizeof(libs) / sizeof(libs[0])));
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "publish-allocs", 4, &cluster), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(cluster)),
      KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, on_delivery, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  const char *topic = kl_t_topic(cluster);
  publish(producer, topic, 0, WARM, 100); /* the topic's metadata, caches */
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  kl_t_allocs_arm(true);
  publish(producer, topic, WARM, EVENTS, 100);
  kl_t_allocs_arm(false);
  unsigned long rest = atomic_load(&libs[LIB_REST].calls);
  unsigned long rdkafka = atomic_load(&libs[LIB_RDKAFKA].calls);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  printf("%d publishes: %lu allocations by librdkafka, %lu by the rest\n",
         EVENTS, rdkafka, rest);
  assert_true(delivered == WARM + EVENTS);
  /* librdkafka: one per message, and its ops; keylane: none */
  assert_true(rdkafka >= EVENTS);
  assert_int_equal(rest, 0);

  /* An envelope over the stack's 1 KiB takes one heap buffer, freed in
   * the call: the documented exception, and its only allocation. */
  atomic_store(&libs[LIB_REST].calls, 0);
  kl_t_allocs_arm(true);
  publish(producer, topic, WARM + EVENTS, 100, 2000);
  kl_t_allocs_arm(false);
  assert_int_equal(atomic_load(&libs[LIB_REST].calls), 100);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
  kl_t_cluster_destroy(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(publish_allocates_nothing_of_keylanes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
