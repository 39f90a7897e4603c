/*
 * The console's outbox view (GET /api/outbox, cli/console_api.c) on a
 * store whose follow-ups wait to be published: each partition of the
 * console's topic with its pending follow-ups (destination, key, id,
 * type), at most `limit` per partition, and no other topic's. The browser
 * tests see it only empty: no worker there leaves a follow-up unpublished.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "keylane/store.h"
#include "support/support.h"
#include "cli/console.h"
#include "store/store_internal.h"

/* Commits a batch of @p topic's @p partition whose event at offset 0
 * emitted @p n credits to key "k". */
static void t_emit(kl_store_t *store, const char *topic, int32_t partition,
                   int n) {
  kl_partition_state_t st;
  kl_txn_t *txn;
  assert_int_equal(kl_store_acquire(store, topic, partition, &st), KL_OK);
  assert_int_equal(kl_store_begin(store, topic, partition, st.epoch, &txn),
                   KL_OK);
  kl__txn_source(txn, topic, partition, 0);
  for (int i = 0; i < n; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "credit", "p", 1), KL_OK);
  kl__txn_source(txn, NULL, 0, 0);
  assert_int_equal(kl_store_commit(txn, 1), KL_OK);
}

/* The pending rows of @p partition in @p doc's "partitions", or NULL. */
static json_t *t_pending(json_t *doc, int partition) {
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(doc, "partitions"), i, p) {
    if (json_integer_value(json_object_get(p, "partition")) == partition)
      return json_object_get(p, "pending");
  }
  return NULL;
}

static void test_outbox_lists_pending_follow_ups(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  t_emit(store, "t", 0, 3);
  t_emit(store, "t", 1, 1);
  t_emit(store, "other", 0, 2);
  kl__console_t c = {.topic = "t", .store = store};

  json_t *doc = NULL;
  assert_int_equal(kl__console_api(&c, "/api/outbox", "", &doc), 200);
  json_t *p0 = t_pending(doc, 0), *p1 = t_pending(doc, 1);
  assert_non_null(p0);
  assert_non_null(p1);
  assert_int_equal(json_array_size(json_object_get(doc, "partitions")), 2);
  assert_int_equal(json_array_size(p0), 3);
  assert_int_equal(json_array_size(p1), 1);
  json_t *row = json_array_get(p0, 0);
  assert_string_equal(json_string_value(json_object_get(row, "key")), "k");
  assert_string_equal(json_string_value(json_object_get(row, "type")),
                      "credit");
  assert_int_equal(
      strncmp(json_string_value(json_object_get(row, "id")), "~t/0/0/0", 8), 0);
  json_decref(doc);

  /* limit: per partition */
  assert_int_equal(kl__console_api(&c, "/api/outbox", "limit=2", &doc), 200);
  assert_int_equal(json_array_size(t_pending(doc, 0)), 2);
  assert_int_equal(json_array_size(t_pending(doc, 1)), 1);
  json_decref(doc);

  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outbox_lists_pending_follow_ups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
