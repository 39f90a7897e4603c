/*
 * The store contract's cases of epochs and batches (store_contract.h): an
 * acquire increments and persists the epoch, above a floor; what a batch
 * sees, that it starts empty, and batches of several partitions on threads
 * at once.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/store_contract.h"
#include "handlers/ledger.h"
#include "support/ledger_checks.h"
#include "keylane/handlers.h"
#include "keylane/worker.h"
#include "store/child.h"
#include "store/store_internal.h"

/* ---- epochs ---------------------------------------------------------- */

void kl_t_contract_acquire_increments_and_persists(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  assert_int_equal(kl_t_store_partition(store, 3).epoch, 0);
  assert_int_equal(kl_t_store_acquire(store, 3), 1);
  assert_int_equal(kl_t_store_acquire(store, 3), 2);
  assert_int_equal(kl_t_store_acquire(store, 4), 1);
  kl_store_destroy(store);

  store = kl_t_store_open(where, NULL);
  assert_int_equal(kl_t_store_partition(store, 3).epoch, 2);
  assert_int_equal(kl_t_store_acquire(store, 3), 3);
  assert_int_equal(kl_t_store_partition(store, 4).epoch, 1);
  kl_store_destroy(store);
}

/* A new store for a topic the fleet used starts above the fleet's epochs;
 * a floor below the store's own epoch changes nothing. */
void kl_t_contract_acquire_above_a_floor(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  kl_partition_state_t st;
  assert_int_equal(kl__store_acquire_above(store, KL_T_TOPIC, 5, 41, &st),
                   KL_OK);
  assert_int_equal(st.epoch, 42);
  assert_int_equal(kl__store_acquire_above(store, KL_T_TOPIC, 5, 10, &st),
                   KL_OK);
  assert_int_equal(st.epoch, 43);
  assert_int_equal(kl_t_store_acquire(store, 5), 44);
  assert_int_equal(kl__store_acquire_above(store, KL_T_TOPIC, 5, 44, &st),
                   KL_OK);
  assert_int_equal(st.epoch, 45);
  kl_store_destroy(store);
}

/* ---- batches --------------------------------------------------------- */

void kl_t_contract_batch_visibility(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);

  kl_txn_t *a = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_put(a, "acct/1", "100");
  assert_string_equal(kl_t_txn_get(a, "acct/1"), "100"); /* own write */
  kl_t_txn_put(a, "acct/1", "150");
  assert_string_equal(kl_t_txn_get(a, "acct/1"), "150");
  kl_t_txn_put(a, "acct/2", "7");
  assert_int_equal(kl_txn_del(a, "acct/2", 6), KL_OK);
  assert_null(kl_t_txn_get(a, "acct/2")); /* own delete shadows own put */

  kl_txn_t *b = kl_t_store_begin(store, 0, epoch);
  assert_null(kl_t_txn_get(b, "acct/1")); /* not committed yet */
  kl_t_store_commit(a, 10);
  assert_null(kl_t_txn_get(b, "acct/1")); /* b's snapshot predates it */
  kl_store_abort(b);

  kl_txn_t *c = kl_t_store_begin(store, 0, epoch);
  assert_string_equal(kl_t_txn_get(c, "acct/1"), "150");
  assert_null(kl_t_txn_get(c, "acct/2"));
  assert_int_equal(kl_txn_del(c, "acct/1", 6), KL_OK);
  assert_null(kl_t_txn_get(c, "acct/1")); /* hides the snapshot's value */
  kl_t_store_commit(c, 11);
  kl_store_destroy(store);

  store = kl_t_store_open(where, NULL);
  kl_txn_t *d = kl_t_store_begin(store, 0, epoch);
  assert_null(kl_t_txn_get(d, "acct/1"));
  kl_store_abort(d);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 11);

  /* Binary keys and values come back byte for byte. */
  d = kl_t_store_begin(store, 0, epoch);
  const unsigned char key[3] = {0, 0xff, 1}, val[4] = {0, 1, 0, 0xfe};
  assert_int_equal(kl_txn_put(d, key, 3, val, 4), KL_OK);
  kl_t_store_commit(d, 12);
  d = kl_t_store_begin(store, 0, epoch);
  const void *got;
  size_t len;
  assert_int_equal(kl_txn_get(d, key, 3, &got, &len), KL_OK);
  assert_int_equal(len, 4);
  assert_memory_equal(got, val, 4);
  kl_store_abort(d);
  kl_store_destroy(store);
}

/* A batch starts empty whatever the batch before it left (a store reuses a
 * finished batch's buffers, store/txn_buffer.h): nothing of an aborted
 * one's writes, marks, duplicates or last ident, nor of one so large that
 * its buffers are freed rather than kept. */
void kl_t_contract_a_batch_starts_empty(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 2);
  for (int round = 0; round < 3; round++) {
    kl_txn_t *gone = kl_t_store_begin(store, 2, epoch);
    kl_t_txn_put(gone, "k/aborted", "1");
    assert_int_equal(kl_txn_del(gone, "k/kept", 6), KL_OK);
    kl_t_txn_mark(gone, "id-aborted", KL_MARK_APPLIED);
    kl_txn_count_duplicate(gone);
    assert_int_equal(kl__txn_set_last(gone, "gone", 4), KL_OK);
    kl_store_abort(gone);
    kl_txn_t *txn = kl_t_store_begin(store, 2, epoch);
    assert_null(kl_t_txn_get(txn, "k/aborted"));
    if (round)
      assert_string_equal(kl_t_txn_get(txn, "k/kept"), "v");
    assert_int_equal(kl_t_txn_seen(txn, "id-aborted"), KL_MARK_NONE);
    kl_t_txn_put(txn, "k/kept", "v");
    kl_t_store_commit(txn, 10 + round);
  }
  kl_partition_state_t ps = kl_t_store_partition(store, 2);
  assert_int_equal(ps.applied, 0);
  assert_int_equal(ps.duplicates, 0);
  char ident[KL__SID_MAX];
  size_t len = 1;
  int64_t wm;
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 2, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(len, 0); /* no committed batch set one */

  /* Over KL__BUF_KEEP_MAX (1 MiB) of writes and ids in one batch. */
  enum { BIG = 12000 };
  char key[32], val[100];
  memset(val, 'x', sizeof(val) - 1);
  val[sizeof(val) - 1] = '\0';
  kl_txn_t *big = kl_t_store_begin(store, 2, epoch);
  for (int i = 0; i < BIG; i++) {
    snprintf(key, sizeof(key), "big/%05d", i);
    kl_t_txn_put(big, key, val);
    kl_t_txn_mark(big, key, KL_MARK_APPLIED);
  }
  kl_t_store_commit(big, 20);
  kl_txn_t *after = kl_t_store_begin(store, 2, epoch);
  assert_string_equal(kl_t_txn_get(after, "big/11999"), val);
  assert_int_equal(kl_t_txn_seen(after, "big/00000"), KL_MARK_APPLIED);
  kl_t_txn_put(after, "k/after", "1");
  kl_t_store_commit(after, 21);
  assert_int_equal(kl_t_store_partition(store, 2).applied, BIG);
  kl_store_destroy(store);
}

/* Lanes on threads of their own hold batches of one store at once, and
 * take and give back its spare batches concurrently. */
enum { KL_T_THREADS = 4, KL_T_THREAD_BATCHES = 40 };

typedef struct kl_t_lane {
  kl_store_t *store;
  int32_t partition;
  uint64_t epoch;
  int failures;
} kl_t_lane_t;

/* Adds 1 to the partition's counter per batch, each batch with an id of
 * its own; counts what fails (cmocka's asserts are the main thread's). */
static void *kl_t_lane_run(void *opaque) {
  kl_t_lane_t *lane = opaque;
  for (int i = 0; i < KL_T_THREAD_BATCHES; i++) {
    kl_txn_t *txn;
    if (kl_store_begin(lane->store, KL_T_TOPIC, lane->partition, lane->epoch,
                       &txn)) {
      lane->failures++;
      continue;
    }
    /* Its own key: a key belongs to one partition's lanes. */
    char key[16], buf[32], id[32];
    int klen = snprintf(key, sizeof(key), "count/%d", (int)lane->partition);
    const void *val;
    size_t len;
    long n = 0;
    if (kl_txn_get(txn, key, (size_t)klen, &val, &len) == KL_OK &&
        len < sizeof(buf)) {
      memcpy(buf, val, len);
      buf[len] = '\0';
      n = strtol(buf, NULL, 10);
    }
    int blen = snprintf(buf, sizeof(buf), "%ld", n + 1);
    int ilen = snprintf(id, sizeof(id), "p%d-%d", (int)lane->partition, i);
    kl_mark_t mark = KL_MARK_APPLIED;
    if (kl_txn_put(txn, key, (size_t)klen, buf, (size_t)blen) ||
        kl__txn_seen_sid(txn, id, (size_t)ilen, &mark) ||
        mark != KL_MARK_NONE ||
        kl__txn_mark_sid(txn, id, (size_t)ilen, KL_MARK_APPLIED)) {
      lane->failures++;
      kl_store_abort(txn);
      continue;
    }
    lane->failures += kl_store_commit(txn, i + 1) != KL_OK;
  }
  return NULL;
}

void kl_t_contract_batches_on_threads_at_once(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  kl_t_lane_t lanes[KL_T_THREADS];
  pthread_t threads[KL_T_THREADS];
  for (int i = 0; i < KL_T_THREADS; i++) {
    lanes[i] = (kl_t_lane_t){store, i, kl_t_store_acquire(store, i), 0};
    assert_int_equal(
        pthread_create(&threads[i], NULL, kl_t_lane_run, &lanes[i]), 0);
  }
  for (int i = 0; i < KL_T_THREADS; i++)
    pthread_join(threads[i], NULL);
  for (int i = 0; i < KL_T_THREADS; i++) {
    assert_int_equal(lanes[i].failures, 0);
    kl_partition_state_t ps = kl_t_store_partition(store, i);
    assert_int_equal(ps.applied, KL_T_THREAD_BATCHES);
    assert_int_equal(ps.watermark, KL_T_THREAD_BATCHES);
    kl_txn_t *txn = kl_t_store_begin(store, i, lanes[i].epoch);
    char key[16], want[16];
    snprintf(key, sizeof(key), "count/%d", i);
    snprintf(want, sizeof(want), "%d", KL_T_THREAD_BATCHES);
    assert_string_equal(kl_t_txn_get(txn, key), want);
    kl_store_abort(txn);
  }
  kl_store_destroy(store);
}
