/*
 * The store contract's cases of timers (store_contract.h): kl_txn_cancel()
 * deletes a pending timer in the batch, on every backend, from a batch's
 * txn and from a key-parallel lane's child txn alike (counted in the
 * child's timers); kl__timer_find() tells the event a timer holds from a
 * copy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "support/store_contract.h"
#include "keylane/worker.h"
#include "common/internal.h"
#include "store/child.h"
#include "store/store_internal.h"
#include "store/timers.h"

#define KEY "acct-1"

/* Commits a timer of (KEY, @p id) in partition 0, as a delayed event read
 * at @p offset would be scheduled. */
static void timer_commit(kl_store_t *store, uint64_t epoch, const char *id,
                         int64_t offset) {
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl__timer_t t = {kl__now_ms() + 60000, offset, 0};
  assert_int_equal(kl__timer_put(txn, KL_T_TOPIC, 0, KEY, strlen(KEY), id,
                                 strlen(id), &t, "env", 3),
                   KL_OK);
  kl_t_store_commit(txn, offset + 1);
}

static int timer_count_one(void *opaque, const kl__timer_t *t, const void *key,
                           size_t key_len, const void *env, size_t env_len) {
  (void)t, (void)key, (void)key_len, (void)env, (void)env_len;
  (*(size_t *)opaque)++;
  return 0;
}

static size_t timer_count(kl_store_t *store) {
  size_t n = 0, bad = 0;
  assert_int_equal(
      kl__timers_scan(store, KL_T_TOPIC, 0, timer_count_one, &n, &bad), KL_OK);
  assert_int_equal(bad, 0);
  return n;
}

static kl_err_t cancel(kl_txn_t *txn, const char *key, const char *id) {
  return kl_txn_cancel(txn, key, strlen(key), id, strlen(id));
}

void kl_t_contract_cancel_deletes_a_pending_timer(void **state) {
  kl_t_store_fixture_t *fx = kl_t_store_fixture(state);
  kl_store_t *store = kl_t_store_open(fx->where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  timer_commit(store, epoch, "later", 0);
  timer_commit(store, epoch, "other", 1);
  assert_int_equal(timer_count(store), 2);

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(cancel(txn, KEY, "later"), KL_EINVAL);
  kl_t_store_detail_has("runs no event");
  kl_event_t ev = {.key = KEY, .key_len = strlen(KEY), .id = "c", .id_len = 1};
  kl_fence_t fence = {KL_T_TOPIC, 0, epoch, 2};
  kl__txn_source_event(txn, &ev, &fence);
  assert_int_equal(cancel(txn, "acct-2", "later"), KL_EINVAL);
  kl_t_store_detail_has("not the running event's");
  assert_int_equal(cancel(txn, KEY, "never"), KL_ENOTFOUND);
  kl_t_store_detail_has("no timer of id \"never\"");
  assert_int_equal(cancel(txn, KEY, "later"), KL_OK);
  kl__timer_t t;
  assert_int_equal(
      kl__timer_get(txn, KL_T_TOPIC, 0, KEY, strlen(KEY), "later", 5, &t),
      KL_ENOTFOUND);
  assert_int_equal(cancel(txn, KEY, "later"), KL_ENOTFOUND); /* once */
  kl_store_abort(txn); /* rolled back with the batch */
  assert_int_equal(timer_count(store), 2);

  txn = kl_t_store_begin(store, 0, epoch);
  kl__txn_source_event(txn, &ev, &fence);
  assert_int_equal(cancel(txn, KEY, "later"), KL_OK);
  kl_t_store_commit(txn, 3);
  assert_int_equal(timer_count(store), 1);
  /* the cancelled event was never applied: its id stays unmarked */
  txn = kl_t_store_begin(store, 0, epoch);
  kl_mark_t mark = KL_MARK_APPLIED;
  assert_int_equal(kl_txn_seen(txn, KEY, strlen(KEY), "later", 5, &mark),
                   KL_OK);
  assert_int_equal(mark, KL_MARK_NONE);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* Key-parallel (worker.concurrency > 1), the handler's txn is a child of
 * the batch's: the cancel reads and deletes through it. */
void kl_t_contract_cancel_from_a_child_txn(void **state) {
  kl_t_store_fixture_t *fx = kl_t_store_fixture(state);
  kl_store_t *store = kl_t_store_open(fx->where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  timer_commit(store, epoch, "later", 0);

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl__overlay_t ov;
  kl__ov_init(&ov);
  kl__child_t child;
  kl__child_init(&child);
  kl__child_begin(&child, txn, NULL, &ov);
  kl_event_t ev = {.key = KEY, .key_len = strlen(KEY), .id = "c", .id_len = 1};
  kl_fence_t fence = {KL_T_TOPIC, 0, epoch, 1};
  kl__txn_source_event(&child.base, &ev, &fence);
  assert_int_equal(cancel(&child.base, KEY, "later"), KL_OK);
  assert_int_equal(cancel(&child.base, KEY, "later"), KL_ENOTFOUND);
  assert_int_equal(child.base.timers, -1); /* the owner's count goes down */
  assert_int_equal(kl__child_apply(&child), KL_OK);
  kl__child_destroy(&child);
  kl__ov_clear(&ov);
  kl_t_store_commit(txn, 2);
  assert_int_equal(timer_count(store), 0);
  kl_store_destroy(store);
}

/* A firing record's run finds the timer and compares the envelope with one
 * read of the due index; anything else is told apart: other contents, an
 * offset or a due time that is not the timer's (a copy: found, not the
 * same), an id without a timer (not found). */
void kl_t_contract_timer_find_reads_a_firing_once(void **state) {
  kl_t_store_fixture_t *fx = kl_t_store_fixture(state);
  kl_store_t *store = kl_t_store_open(fx->where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  int64_t due = kl__now_ms() + 60000;
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl__timer_t t = {due, 7, 0};
  assert_int_equal(
      kl__timer_put(txn, KL_T_TOPIC, 0, KEY, strlen(KEY), "x", 1, &t, "env", 3),
      KL_OK);
  assert_int_equal(txn->timers, 1);
  kl_t_store_commit(txn, 8);

  txn = kl_t_store_begin(store, 0, epoch);
  struct {
    int64_t named, due;
    const char *env;
    kl_err_t err;
    int same;
  } cases[] = {{7, due, "env", KL_OK, 1},       {7, due, "enx", KL_OK, 0},
               {7, due, "envv", KL_OK, 0},      {8, due, "env", KL_OK, 0},
               {7, due + 1, "env", KL_OK, 0},   {-1, due, "env", KL_OK, 0},
               {7, due, "env", KL_ENOTFOUND, 0}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *id = cases[i].err == KL_ENOTFOUND ? "y" : "x";
    kl__timer_t got = {0};
    int same = -1;
    assert_int_equal(kl__timer_find(txn, KL_T_TOPIC, 0, KEY, strlen(KEY), id, 1,
                                    cases[i].named, cases[i].due, cases[i].env,
                                    strlen(cases[i].env), &got, &same),
                     cases[i].err);
    assert_int_equal(same, cases[i].same);
    if (cases[i].err == KL_OK) {
      assert_int_equal(got.due_ms, due);
      assert_int_equal(got.offset, 7);
    }
  }
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* The stored mark of (key "k", @p id), or KL_MARK_NONE when it is gone. */
typedef struct kl_t_raw_mark {
  const char *id;
  kl_mark_t mark;
  int64_t time_ms;
} kl_t_raw_mark_t;

static int kl_t_raw_mark_cb(void *opaque, const char *topic, const void *key,
                            size_t key_len, const char *id, size_t id_len,
                            int64_t time_ms, kl_mark_t mark) {
  kl_t_raw_mark_t *r = opaque;
  (void)topic;
  if (key && key_len == 1 && memcmp(key, "k", 1) == 0 &&
      id_len == strlen(r->id) && memcmp(id, r->id, id_len) == 0)
    r->mark = mark, r->time_ms = time_ms;
  return 0;
}

static kl_t_raw_mark_t kl_t_raw_mark(kl_store_t *store, const char *id) {
  kl_t_raw_mark_t r = {id, KL_MARK_NONE, 0};
  assert_int_equal(kl__store_ids_walk(store, kl_t_raw_mark_cb, &r), KL_OK);
  return r;
}

/* A txn of partition 0 that runs an event of key "k" (kl_txn_cancel()
 * cancels that key's timers). */
static kl_txn_t *kl_t_begin_on_k(kl_store_t *store, uint64_t epoch,
                                 kl_event_t *ev, kl_fence_t *fence) {
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  *ev = (kl_event_t){.key = "k", .key_len = 1, .id = "src", .id_len = 3};
  *fence = (kl_fence_t){KL_T_TOPIC, 0, epoch, 1};
  kl__txn_source_event(txn, ev, fence);
  return txn;
}

/* Issue 36 (H1): the id of a timer that waits outlives the retention, or
 * a copy of it without `nb` would run early and the timer run it again; a
 * cancel's mark ("cancelled", a duplicate's) expires a retention after the
 * cancel, and the firing's applied mark a retention after the firing. */
void kl_t_contract_sweep_keeps_waiting_timer_ids(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *store =
      kl_t_store_open(where, "store.dedup.retention", "1000ms", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_event_t ev;
  kl_fence_t fence;
  kl_txn_t *txn = kl_t_begin_on_k(store, epoch, &ev, &fence);
  kl__timer_t t = {1700000100000LL, 7, 0};
  const char *ids[] = {"waits", "fires", "cancelled", "dead"};
  for (int i = 0; i < 4; i++) {
    t.offset = 7 + i;
    assert_int_equal(kl__timer_put(txn, KL_T_TOPIC, 0, "k", 1, ids[i],
                                   strlen(ids[i]), &t, "env", 3),
                     KL_OK);
  }
  kl_t_txn_mark_key(txn, "k", "plain", KL_MARK_APPLIED);
  /* a dead letter whose timer stayed (as a rebuild may keep it) */
  kl_t_txn_mark_key(txn, "k", "dead", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 1);

  kl_t_store_clock_add(5000); /* five retentions on */
  txn = kl_t_begin_on_k(store, epoch, &ev, &fence);
  assert_int_equal(kl_txn_cancel(txn, "k", 1, "cancelled", 9), KL_OK);
  /* a dead-lettered id's timer no longer waits: none to cancel */
  assert_int_equal(kl_txn_cancel(txn, "k", 1, "dead", 4), KL_ENOTFOUND);
  kl_t_txn_mark_key(txn, "k", "fires", KL_MARK_APPLIED); /* its firing */
  kl_t_store_commit(txn, 2);
  assert_int_equal(kl_t_raw_mark(store, "cancelled").mark, KL__MARK_CANCELLED);
  assert_int_equal(kl_t_raw_mark(store, "fires").time_ms, 1700000005000LL);

  /* a settled id keeps its mark over a cancel */
  assert_int_equal(kl_t_raw_mark(store, "dead").mark, KL_MARK_DEAD_LETTER);
  size_t removed = 9;
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 2); /* "plain" and "dead" */
  txn = kl_t_store_begin(store, 0, epoch);
  kl_mark_t mark = KL_MARK_NONE;
  assert_int_equal(kl__txn_seen(txn, "k", 1, "waits", 5, &mark), KL_OK);
  assert_int_equal(mark, KL__MARK_TIMER);
  /* a cancelled id's copies are duplicates, and it was not applied */
  assert_int_equal(kl__txn_seen(txn, "k", 1, "cancelled", 9, &mark), KL_OK);
  assert_int_equal(mark, KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "cancelled"), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "fires"), KL_MARK_APPLIED);
  kl_store_abort(txn);

  kl_t_store_clock_add(1001); /* a retention after the cancel and firing */
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 2);
  assert_int_equal(kl_t_raw_mark(store, "cancelled").mark, KL_MARK_NONE);
  assert_int_equal(kl_t_raw_mark(store, "fires").mark, KL_MARK_NONE);
  kl_t_store_clock_add(86400000); /* a day on, it still waits */
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(kl_t_raw_mark(store, "waits").mark, KL__MARK_TIMER);
  kl_store_destroy(store);
}
