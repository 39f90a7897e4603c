/*
 * The LMDB store's outbox: kl_txn_emit() is part of the batch (rolled
 * back by an abort and by a fenced commit, written by a commit under seqs
 * that only grow), ids derive from the source id and the emit's index,
 * and the limits are refused with a reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/store.h"
#include "support/support.h"
#include "worker/outbox_rec.h"
#include "worker/store_internal.h"

typedef struct kl_seen {
  size_t n;
  uint64_t seqs[128];
  char ids[128][KL_ID_MAX + 1];
} kl_seen_t;

static int kl_seen_cb(void *opaque, uint64_t seq, const void *rec, size_t len) {
  kl_seen_t *s = opaque;
  kl__outbox_rec_t r;
  assert_int_equal(kl__outbox_rec_decode(rec, len, &r), 0);
  s->seqs[s->n] = seq;
  memcpy(s->ids[s->n], r.event.id, r.event.id_len);
  s->ids[s->n][r.event.id_len] = '\0';
  s->n++;
  return 0;
}

static void kl_list(kl_store_t *store, kl_seen_t *s) {
  memset(s, 0, sizeof(*s));
  assert_int_equal(kl__store_outbox_list(store, "t", 0, 0, 128, kl_seen_cb, s),
                   KL_OK);
}

static kl_txn_t *kl_begin_emit(kl_store_t *store, uint64_t epoch,
                               const char *src, int n) {
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, epoch, &txn), KL_OK);
  kl__txn_source(txn, src, strlen(src));
  for (int i = 0; i < n; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "credit", "p", 1), KL_OK);
  kl__txn_source(txn, NULL, 0);
  return txn;
}

static void test_emit_is_part_of_the_batch(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(store, "t", 0, &st), KL_OK);
  kl_seen_t s;

  kl_store_abort(kl_begin_emit(store, st.epoch, "a", 2)); /* rolled back */
  kl_list(store, &s);
  assert_int_equal(s.n, 0);

  assert_int_equal(kl_store_commit(kl_begin_emit(store, st.epoch, "b", 2), 1),
                   KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 2);
  assert_string_equal(s.ids[0], "b/0");
  assert_string_equal(s.ids[1], "b/1");
  assert_true(s.seqs[0] < s.seqs[1]);
  uint64_t last = s.seqs[1];

  /* A fenced commit writes none of its follow-ups. */
  kl_txn_t *stale = kl_begin_emit(store, st.epoch, "c", 1);
  kl_partition_state_t newer;
  assert_int_equal(kl_store_acquire(store, "t", 0, &newer), KL_OK);
  assert_int_equal(kl_store_commit(stale, 2), KL_EFENCED);
  kl_list(store, &s);
  assert_int_equal(s.n, 2);

  /* Removed once published; later seqs still grow past the removed. */
  kl__outbox_ack_t acks[3] = {{0, s.seqs[0]}, {0, s.seqs[1]}, {1, 99}};
  assert_int_equal(kl__store_outbox_del(store, "t", acks, 3), KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 0);
  assert_int_equal(
      kl_store_commit(kl_begin_emit(store, newer.epoch, "d", 1), 3), KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 1);
  assert_true(s.seqs[0] > last);
  assert_string_equal(s.ids[0], "d/0");
  /* Listing from a seq on. */
  memset(&s, 0, sizeof(s));
  assert_int_equal(kl__store_outbox_list(store, "t", 0, s.seqs[0] + 1000, 128,
                                         kl_seen_cb, &s),
                   KL_OK);
  assert_int_equal(s.n, 0);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_emit_limits(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(store, "t", 0, &st), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, st.epoch, &txn), KL_OK);
  /* Outside a handler there is no source id to derive from. */
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_EINVAL);
  kl__txn_source(txn, "s", 1);
  for (int i = 0; i < KL__EMIT_MAX; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_OK);
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "at most 64"));
  /* The next event counts from 0 again. */
  kl__txn_source(txn, "s2", 2);
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_OK);
  assert_int_not_equal(kl_txn_emit(txn, NULL, NULL, 0, "t", NULL, 0), KL_OK);
  assert_int_not_equal(kl_txn_emit(txn, NULL, "k", 1, "", NULL, 0), KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_emit_ids(void **state) {
  (void)state;
  char out[KL_ID_MAX + 1];
  assert_int_equal(kl__emit_id("abc", 3, 7, out), 5);
  assert_string_equal(out, "abc/7");
  char long_id[KL_ID_MAX];
  memset(long_id, 'x', sizeof(long_id));
  size_t n = kl__emit_id(long_id, sizeof(long_id), 12, out);
  assert_true(n <= KL_ID_MAX);
  assert_int_equal(strlen(out), n);
  assert_non_null(strchr(out, '~'));
  assert_string_equal(out + n - 3, "/12");
  char other[KL_ID_MAX + 1];
  long_id[KL_ID_MAX - 1] = 'y'; /* differs past the bytes kept */
  kl__emit_id(long_id, sizeof(long_id), 12, other);
  assert_string_not_equal(out, other);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emit_is_part_of_the_batch),
      cmocka_unit_test(test_emit_limits),
      cmocka_unit_test(test_emit_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
