/* Static membership's settings (worker/membership.h): the instance ids a
 * worker accepts, and that worker.instance.id, or a
 * kafka.group.instance.id that overrides it, reaches the consumer's
 * librdkafka configuration as group.instance.id. Without a broker: the
 * behaviour on one is tests/kafka/test_static_membership.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "keylane/handlers.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "support/support.h"
#include "worker/membership.h"
#include "worker/worker_internal.h"

static kl_conf_t *conf_with(const char *key, const char *value) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1"),
                   KL_OK);
  if (key)
    assert_int_equal(kl_conf_set(conf, key, value), KL_OK);
  return conf;
}

/* The group.instance.id of the consumer @p conf configures; "" unset. */
static void instance_of(const kl_conf_t *conf, char *out, size_t size) {
  rd_kafka_conf_t *kconf;
  assert_int_equal(kl__worker_kafka_conf(conf, &kconf), KL_OK);
  kl__membership_instance(kconf, out, size);
  rd_kafka_conf_destroy(kconf);
}

static void test_instance_ids_checked(void **state) {
  (void)state;
  static const char *const good[] = {"keylane-worker-0", "host1-3", "a.b_C",
                                     NULL};
  for (int i = 0; good[i]; i++) {
    kl_conf_t *conf = conf_with("worker.instance.id", good[i]);
    assert_int_equal(kl__membership_check(conf), KL_OK);
    kl_conf_destroy(conf);
  }
  kl_conf_t *conf = conf_with(NULL, NULL);
  assert_int_equal(kl__membership_check(conf), KL_OK); /* dynamic */
  kl_conf_destroy(conf);
  char lng[300];
  memset(lng, 'x', sizeof(lng) - 1);
  lng[sizeof(lng) - 1] = '\0';
  const char *bad[] = {"worker@1", "a b", "ü", lng, NULL};
  for (int i = 0; bad[i]; i++) {
    conf = conf_with("worker.instance.id", bad[i]);
    assert_int_equal(kl__membership_check(conf), KL_ECONF);
    assert_non_null(strstr(kl_err_detail(), "use 1-249 characters of a-z"));
    kl_conf_destroy(conf);
  }
}

/* A control character in an instance id is refused wherever it is set
 * (worker.instance.id, or kafka.group.instance.id, which overrides it),
 * and the message shows it escaped: a newline in it must not make a log
 * line of its own. */
static void test_instance_id_with_a_newline(void **state) {
  (void)state;
  static const char id[] = "w-1\n2026-01-01T00:00:00Z ERROR forged";
  kl_conf_t *conf = conf_with("worker.instance.id", id);
  assert_int_equal(kl__membership_check(conf), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "\"w-1\\x0a2026-01-01"));
  assert_null(strchr(kl_err_detail(), '\n'));
  kl_conf_destroy(conf);

  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  conf = conf_with("kafka.group.instance.id", id);
  kl_worker_t *w = NULL;
  assert_int_equal(kl_worker_new(conf, "t", store, kl_ledger_handler, NULL, &w),
                   KL_ECONF);
  assert_null(w);
  assert_non_null(
      strstr(kl_err_detail(), "kafka.group.instance.id=\"w-1\\x0a"));
  assert_null(strchr(kl_err_detail(), '\n'));
  kl_conf_destroy(conf);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_instance_id_reaches_librdkafka(void **state) {
  (void)state;
  char id[KL__INSTANCE_ID_MAX];
  kl_conf_t *conf = conf_with(NULL, NULL);
  instance_of(conf, id, sizeof(id));
  assert_string_equal(id, "");
  kl_conf_destroy(conf);
  conf = conf_with("worker.instance.id", "keylane-worker-2");
  instance_of(conf, id, sizeof(id));
  assert_string_equal(id, "keylane-worker-2");
  /* kafka.* wins, as everywhere. */
  assert_int_equal(kl_conf_set(conf, "kafka.group.instance.id", "other"),
                   KL_OK);
  instance_of(conf, id, sizeof(id));
  assert_string_equal(id, "other");
  kl_conf_destroy(conf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_instance_ids_checked),
      cmocka_unit_test(test_instance_id_reaches_librdkafka),
      cmocka_unit_test(test_instance_id_with_a_newline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
