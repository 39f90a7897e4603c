/*
 * The store contract's cases of fencing, watermarks, owners and counters
 * (store_contract.h): the last record kept with its watermark, a fenced
 * commit applies nothing, the watermark never goes back, a reset rewinds
 * and fences, the owner recorded with the first epoch, counters, and beats
 * that need the current epoch.
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

/* The identity of the record at watermark - 1 is kept with the watermark
 * it belongs to: by a commit that sets it, not by one that does not (the
 * watermark then tells it is stale), never by a fenced one. */
void kl_t_contract_last_record_kept_with_its_watermark(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 1);
  char ident[KL__SID_MAX];
  size_t len = 1;
  int64_t wm = -1;
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 1, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(len, 0); /* none yet */
  kl_txn_t *txn = kl_t_store_begin(store, 1, epoch);
  assert_int_equal(kl__txn_set_last(txn, "\0\0\1k-9", 6), KL_OK);
  kl_t_store_commit(txn, 10);
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 1, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(wm, 10);
  assert_int_equal(len, 6);
  assert_memory_equal(ident, "\0\0\1k-9", 6);
  txn = kl_t_store_begin(store, 1, epoch); /* no last: the old one stays */
  kl_t_store_commit(txn, 12);
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 1, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(wm, 10);
  assert_int_equal(kl_t_store_partition(store, 1).watermark, 12);
  txn = kl_t_store_begin(store, 1, epoch);
  assert_int_equal(kl__txn_set_last(txn, "other", 5), KL_OK);
  uint64_t newer = kl_t_store_acquire(store, 1);
  assert_int_equal(kl_store_commit(txn, 20), KL_EFENCED);
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 1, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(wm, 10); /* the fenced batch wrote nothing */
  txn = kl_t_store_begin(store, 1, newer);
  assert_int_equal(kl__txn_set_last(txn, "\1abc", 4), KL_OK);
  kl_t_store_commit(txn, 21);
  assert_int_equal(kl__store_last(store, KL_T_TOPIC, 1, &wm, ident, &len),
                   KL_OK);
  assert_int_equal(wm, 21);
  assert_memory_equal(ident, "\1abc", 4);
  assert_int_equal(
      kl__txn_set_last(txn = kl_t_store_begin(store, 1, newer), "", 0),
      KL_EINVAL);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

void kl_t_contract_fenced_commit_applies_nothing(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t old = kl_t_store_acquire(store, 2);
  kl_txn_t *txn = kl_t_store_begin(store, 2, old);
  kl_t_txn_put(txn, "acct/9", "1");
  kl_t_txn_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);

  /* A new owner takes over while the old batch is open: the fence takes
   * no lock before the commit, so this does not wait for the old owner. */
  uint64_t now = kl_t_store_acquire(store, 2);
  assert_int_equal(kl_store_commit(txn, 50), KL_EFENCED);
  assert_non_null(
      strstr(kl_err_detail(), "fenced partition=2 my_epoch=1 current_epoch=2"));

  kl_partition_state_t ps = kl_t_store_partition(store, 2);
  assert_int_equal(ps.epoch, now);
  assert_int_equal(ps.watermark, 0);
  assert_int_equal(ps.applied + ps.duplicates + ps.dead_letters, 0);
  txn = kl_t_store_begin(store, 2, now);
  assert_null(kl_t_txn_get(txn, "acct/9"));
  assert_int_equal(kl_t_txn_seen(txn, "id-1"), KL_MARK_NONE);
  kl_store_abort(txn);

  /* A stale owner is refused at begin, before its handlers run. */
  kl_txn_t *stale = NULL;
  assert_int_equal(kl_store_begin(store, KL_T_TOPIC, 2, old, &stale),
                   KL_EFENCED);
  assert_null(stale);
  kl_store_destroy(store);
}

void kl_t_contract_watermark_never_goes_back(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_t_store_commit(kl_t_store_begin(store, 0, epoch), 100);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 100);
  kl_t_store_commit(kl_t_store_begin(store, 0, epoch), 50);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 100);
  kl_t_store_commit(kl_t_store_begin(store, 0, epoch), 101);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 101);
  /* A new owner resumes from it. */
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, KL_T_TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.watermark, 101);
  kl_store_destroy(store);
}

/* `keylane store reset`: a new epoch fences the owner, the watermark goes
 * back to 0, the ids and counters stay; an unknown partition is refused
 * and left unknown. */
void kl_t_contract_reset_rewinds_and_fences(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "a", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 40);
  kl_partition_state_t ps;
  assert_int_equal(kl__store_reset(store, KL_T_TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.epoch, epoch + 1);
  assert_int_equal(ps.watermark, 0);
  assert_int_equal(ps.applied, 1);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 0);
  kl_err_t err = kl_store_begin(store, KL_T_TOPIC, 0, epoch, &txn);
  if (!err) /* the owner before: fenced at its begin or its commit */
    err = kl_store_commit(txn, 41);
  assert_int_equal(err, KL_EFENCED);
  txn = kl_t_store_begin(store, 0, kl_t_store_acquire(store, 0));
  assert_int_equal(kl_t_txn_seen(txn, "a"), KL_MARK_APPLIED);
  kl_t_store_commit(txn, 3);
  assert_int_equal(kl_t_store_partition(store, 0).watermark, 3);
  assert_int_equal(kl__store_reset(store, KL_T_TOPIC, 7, &ps), KL_ENOTFOUND);
  assert_int_equal(kl_t_store_partition(store, 7).epoch, 0);
  kl_store_destroy(store);
}

/* Takes partition @p p of KL_T_TOPIC as a worker of @p cluster and
 * @p group (kl__store_acquire_owned()). @returns 1 when refused, with the
 * recorded owner in @p recorded; else 0, with the new state in @p ps. */
static int kl_t_owned_acquire(kl_store_t *store, int32_t p, const char *cluster,
                              const char *group, kl__store_owner_t *recorded,
                              kl_partition_state_t *ps) {
  kl__store_owner_t mine;
  int refused = -1;
  assert_int_equal(kl__store_owner_make(&mine, cluster, group), KL_OK);
  assert_int_equal(kl__store_acquire_owned(store, KL_T_TOPIC, p, 0, &mine,
                                           recorded, &refused, ps),
                   KL_OK);
  return refused;
}

/* Issue 39, second attack (HIGH-2, LOW-7): the first epoch a worker takes
 * for a topic records its Kafka cluster and group in the same write; a
 * worker of another cluster or group is refused and moves no epoch, also
 * on a partition nothing was applied of (watermark 0, where the log check
 * has nothing to compare); kl__store_bind() adopts a new owner. */
void kl_t_contract_owner_recorded_with_the_first_epoch(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  kl__store_owner_t rec;
  kl_partition_state_t ps;
  assert_int_equal(kl__store_owner(store, KL_T_TOPIC, &rec), KL_ENOTFOUND);
  assert_int_equal(kl_t_owned_acquire(store, 0, "c1", "fleet", &rec, &ps), 0);
  assert_int_equal(ps.epoch, 1);
  assert_int_equal(kl__store_owner(store, KL_T_TOPIC, &rec), KL_OK);
  assert_string_equal(rec.cluster, "c1");
  assert_string_equal(rec.group, "fleet");
  /* Its own fleet takes any partition of the topic. */
  assert_int_equal(kl_t_owned_acquire(store, 1, "c1", "fleet", &rec, &ps), 0);
  assert_int_equal(ps.epoch, 1);
  /* Another cluster, another group: refused, nothing written. */
  assert_int_equal(kl_t_owned_acquire(store, 1, "c2", "fleet", &rec, &ps), 1);
  assert_string_equal(rec.cluster, "c1");
  assert_int_equal(kl_t_owned_acquire(store, 2, "c1", "flete", &rec, &ps), 1);
  assert_string_equal(rec.group, "fleet");
  assert_int_equal(kl_t_store_partition(store, 1).epoch, 1);
  assert_int_equal(kl_t_store_partition(store, 2).epoch, 0);
  /* Unchecked takes (tools) neither check nor record. */
  assert_int_equal(kl_t_store_acquire(store, 1), 2);
  /* The record is the topic's: another topic records its own. */
  kl__store_owner_t mine;
  int refused = -1;
  assert_int_equal(kl__store_owner_make(&mine, "c2", "other"), KL_OK);
  assert_int_equal(
      kl__store_acquire_owned(store, "audit", 0, 0, &mine, &rec, &refused, &ps),
      KL_OK);
  assert_int_equal(refused, 0);
  /* Adopted on purpose: the new owner runs, the old one is refused. */
  assert_int_equal(kl__store_bind(store, KL_T_TOPIC, &mine), KL_OK);
  assert_int_equal(kl_t_owned_acquire(store, 1, "c2", "other", &rec, &ps), 0);
  assert_int_equal(ps.epoch, 3);
  assert_int_equal(kl_t_owned_acquire(store, 1, "c1", "fleet", &rec, &ps), 1);
  assert_string_equal(rec.cluster, "c2");
  kl_store_destroy(store);
  /* It persists. */
  store = kl_t_store_open(where, NULL);
  assert_int_equal(kl__store_owner(store, KL_T_TOPIC, &rec), KL_OK);
  assert_string_equal(rec.group, "other");
  assert_int_equal(kl__store_owner_make(&mine, "", "g"), KL_EINVAL);
  kl_store_destroy(store);
}

void kl_t_contract_counters(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 1);
  kl_txn_t *txn = kl_t_store_begin(store, 1, epoch);
  kl_t_txn_mark(txn, "a", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "b", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "c", KL_MARK_DEAD_LETTER);
  kl_t_txn_mark(txn, "a", KL_MARK_APPLIED); /* once per id */
  kl_txn_count_duplicate(txn);
  kl_txn_count_duplicate(txn);
  kl_t_store_commit(txn, 5);
  txn = kl_t_store_begin(store, 1, epoch);
  kl_t_txn_mark(txn, "d", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);
  kl_t_store_commit(txn, 6);
  kl_txn_t *aborted = kl_t_store_begin(store, 1, epoch);
  kl_t_txn_mark(aborted, "e", KL_MARK_APPLIED);
  kl_store_abort(aborted);

  kl_partition_state_t ps = kl_t_store_partition(store, 1);
  assert_int_equal(ps.applied, 3);
  assert_int_equal(ps.dead_letters, 1);
  assert_int_equal(ps.duplicates, 3);
  kl_store_destroy(store);
}

/* A heartbeat of an owner outside the group counts only while that owner
 * holds the partition, survives its commits and a new epoch, and shows in
 * kl_store_partition() and kl_store_foreach_partition() alike. */
static int kl_t_beats_cb(void *opaque, const char *topic, int32_t partition,
                         const kl_partition_state_t *state) {
  if (strcmp(topic, KL_T_TOPIC) == 0 && partition == 3)
    *(uint64_t *)opaque = state->beats;
  return 0;
}

/* Beats @p n partitions (partition, epoch pairs); @returns a bit per
 * partition that was refused as fenced. */
static unsigned kl_t_beat(kl_store_t *store, const uint64_t (*pe)[2],
                          size_t n) {
  kl__beat_t beats[8];
  for (size_t i = 0; i < n; i++)
    beats[i] = (kl__beat_t){(int32_t)pe[i][0], pe[i][1], KL_ESTORE};
  assert_int_equal(kl__store_beat(store, KL_T_TOPIC, beats, n), KL_OK);
  unsigned fenced = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(beats[i].err == KL_OK || beats[i].err == KL_EFENCED);
    fenced |= (beats[i].err == KL_EFENCED) << i;
  }
  return fenced;
}

void kl_t_contract_beats_need_the_current_epoch(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  assert_int_equal(kl_t_beat(store, (const uint64_t[][2]){{3, 1}}, 1), 1);
  uint64_t epoch = kl_t_store_acquire(store, 3);
  uint64_t other = kl_t_store_acquire(store, 4);
  assert_int_equal(kl_t_store_partition(store, 3).beats, 0);
  assert_int_equal(
      kl_t_beat(store, (const uint64_t[][2]){{3, epoch}, {4, other}}, 2), 0);
  assert_int_equal(kl_t_beat(store, (const uint64_t[][2]){{3, epoch}}, 1), 0);
  kl_t_store_commit(kl_t_store_begin(store, 3, epoch), 10);
  kl_partition_state_t ps = kl_t_store_partition(store, 3);
  assert_int_equal(ps.beats, 2);
  assert_int_equal(ps.watermark, 10);
  assert_int_equal(kl_t_store_partition(store, 4).beats, 1);

  /* A newer owner of 3: its old holder's beat is refused, 4's is not. */
  uint64_t now = kl_t_store_acquire(store, 3);
  assert_int_equal(
      kl_t_beat(store, (const uint64_t[][2]){{4, other}, {3, epoch}}, 2), 2);
  assert_int_equal(kl_t_store_partition(store, 3).beats, 2);
  assert_int_equal(kl_t_store_partition(store, 4).beats, 2);
  assert_int_equal(kl_t_beat(store, (const uint64_t[][2]){{3, now}}, 1), 0);
  assert_int_equal(kl__store_beat(store, KL_T_TOPIC, NULL, 0), KL_OK);
  uint64_t listed = 0;
  assert_int_equal(kl_store_foreach_partition(store, kl_t_beats_cb, &listed),
                   KL_OK);
  assert_int_equal(listed, 3);
  assert_int_equal(kl_t_store_partition(store, 2).beats, 0);
  kl_store_destroy(store);
}
