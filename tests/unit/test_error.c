/*
 * The error channel: kl_err_detail() describes the failure of the last
 * kl_err_t call on this thread, and is "" after a call that succeeded, not
 * the text of some earlier failure (include/keylane/error.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "keylane/conf.h"
#include "keylane/event.h"
#include "keylane/store.h"
#include "support/support.h"

/* Leaves a failure's text in kl_err_detail(), as an earlier call would. */
static void kl_t_fail_first(void) {
  assert_int_equal(kl_event_validate(NULL, 0), KL_EINVAL);
  assert_string_not_equal(kl_err_detail(), "");
}

#define KL_T_CLEARS(call)                                                      \
  do {                                                                         \
    kl_t_fail_first();                                                         \
    assert_int_equal((call), KL_OK);                                           \
    assert_string_equal(kl_err_detail(), "");                                  \
  } while (0)

static void test_event_and_conf_calls_clear(void **state) {
  (void)state;
  kl_conf_t *conf = kl_conf_new();
  KL_T_CLEARS(kl_conf_set(conf, "kafka.acks", "all"));
  kl_event_t ev = {.key = "k",
                   .key_len = 1,
                   .id = "id-1",
                   .id_len = 4,
                   .type = "t",
                   .type_len = 1};
  KL_T_CLEARS(kl_event_validate(&ev, 1));
  void *buf = NULL;
  size_t len = 0;
  KL_T_CLEARS(kl_event_encode(&ev, &buf, &len));
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t out;
  KL_T_CLEARS(kl_event_decode(decoder, "k", 1, buf, len, &out));
  kl_decoder_destroy(decoder);
  free(buf);
  kl_conf_destroy(conf);
}

static int kl_t_count_partition(void *opaque, const char *topic,
                                int32_t partition,
                                const kl_partition_state_t *st) {
  (void)topic, (void)partition, (void)st;
  (*(int *)opaque)++;
  return 0;
}

static int kl_t_count_key(void *opaque, const void *key, size_t key_len,
                          const void *val, size_t val_len) {
  (void)key, (void)key_len, (void)val, (void)val_len;
  (*(int *)opaque)++;
  return 0;
}

static void test_store_calls_clear(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store = NULL;
  KL_T_CLEARS(kl_store_open(dir, NULL, &store));
  kl_partition_state_t st;
  KL_T_CLEARS(kl_store_acquire(store, "events", 0, &st));
  KL_T_CLEARS(kl_store_partition(store, "events", 0, &st));
  kl_txn_t *txn = NULL;
  KL_T_CLEARS(kl_store_begin(store, "events", 0, st.epoch, &txn));
  KL_T_CLEARS(kl_txn_put(txn, "a", 1, "1", 1));
  const void *val = NULL;
  size_t val_len = 0;
  KL_T_CLEARS(kl_txn_get(txn, "a", 1, &val, &val_len));
  KL_T_CLEARS(kl_txn_del(txn, "a", 1));
  kl_mark_t mark;
  KL_T_CLEARS(kl_txn_seen(txn, "k", 1, "id-1", 4, &mark));
  KL_T_CLEARS(kl_txn_mark(txn, "k", 1, "id-1", 4, KL_MARK_APPLIED));
  const void *keys[] = {"k"};
  const char *id_list[] = {"id-1"};
  size_t key_lens[] = {1}, id_lens[] = {4};
  KL_T_CLEARS(kl_txn_prefetch(txn, keys, key_lens, id_list, id_lens, 1));
  KL_T_CLEARS(kl_store_commit(txn, 1));
  size_t removed = 0;
  KL_T_CLEARS(kl_store_sweep(store, 10, &removed));
  int seen = 0;
  KL_T_CLEARS(kl_store_scan(store, "a", 1, kl_t_count_key, &seen));
  KL_T_CLEARS(kl_store_foreach_partition(store, kl_t_count_partition, &seen));
  uint64_t ids = 0;
  KL_T_CLEARS(kl_store_id_count(store, &ids));
  assert_int_equal(ids, 1);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* A detail built from the detail before it, as a caller adds context
 * (kl_txn_emit did): the old text is read whole, not overwritten while it
 * is read (it came out "kl_txn_emit: kl_txn_emit: s 1100 bytes"). */
static void test_detail_wraps_itself(void **state) {
  (void)state;
  kl__err(KL_EINVAL, "key is %d bytes", 1100);
  assert_int_equal(kl__err(KL_EINVAL, "kl_txn_emit: %s", kl_err_detail()),
                   KL_EINVAL);
  assert_string_equal(kl_err_detail(), "kl_txn_emit: key is 1100 bytes");
  kl__err(KL_EINVAL, "%s, then %s", kl_err_detail(), kl_err_detail());
  assert_string_equal(kl_err_detail(), "kl_txn_emit: key is 1100 bytes, then "
                                       "kl_txn_emit: key is 1100 bytes");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_and_conf_calls_clear),
      cmocka_unit_test(test_store_calls_clear),
      cmocka_unit_test(test_detail_wraps_itself),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
