/*
 * The store contract tests and their helpers (store_contract.h). Where the
 * backends' tests used to differ, each test here checks what either
 * checked; what only one backend does stays in its own program.
 */
#include "support/store_contract.h"

#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <lmdb.h>

#include "handlers/ledger.h"
#include "support/ledger_checks.h"
#include "keylane/handlers.h"
#include "keylane/worker.h"
#include "store/child.h"
#include "store/store_internal.h"
#include "store/timers.h"

/* ---- helpers --------------------------------------------------------- */

kl_t_store_fixture_t *kl_t_store_fixture(void **state) {
  if (!*state) {
    fprintf(stderr, "skipped: no store to test: the program's setup made "
                    "none (why is at the start of its output)\n");
    skip();
  }
  return *state;
}

static kl_err_t kl_t_store_try_open_v(const char *where, kl_store_t **store,
                                      va_list ap) {
  kl_conf_t *conf = kl_conf_new();
  const char *key;
  while ((key = va_arg(ap, const char *)) != NULL) {
    const char *value = va_arg(ap, const char *);
    if (kl_conf_set(conf, key, value) != KL_OK) {
      kl_conf_destroy(conf);
      return KL_ECONF;
    }
  }
  kl_err_t err = kl_store_open(where, conf, store);
  kl_conf_destroy(conf);
  return err;
}

kl_err_t kl_t_store_try_open(const char *where, kl_store_t **store, ...) {
  va_list ap;
  va_start(ap, store);
  kl_err_t err = kl_t_store_try_open_v(where, store, ap);
  va_end(ap);
  return err;
}

kl_store_t *kl_t_store_open(const char *where, ...) {
  kl_store_t *store = NULL;
  va_list ap;
  va_start(ap, where);
  kl_err_t err = kl_t_store_try_open_v(where, &store, ap);
  va_end(ap);
  if (err)
    fail_msg("open %s: %s: %s", where, kl_err_name(err), kl_err_detail());
  return store;
}

uint64_t kl_t_store_acquire(kl_store_t *store, int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, KL_T_TOPIC, partition, &ps), KL_OK);
  return ps.epoch;
}

kl_partition_state_t kl_t_store_partition(kl_store_t *store,
                                          int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(store, KL_T_TOPIC, partition, &ps),
                   KL_OK);
  return ps;
}

kl_txn_t *kl_t_store_begin(kl_store_t *store, int32_t partition,
                           uint64_t epoch) {
  kl_txn_t *txn = NULL;
  kl_err_t err = kl_store_begin(store, KL_T_TOPIC, partition, epoch, &txn);
  if (err)
    fail_msg("begin: %s: %s", kl_err_name(err), kl_err_detail());
  return txn;
}

void kl_t_store_commit(kl_txn_t *txn, int64_t watermark) {
  kl_err_t err = kl_store_commit(txn, watermark);
  if (err)
    fail_msg("commit: %s: %s", kl_err_name(err), kl_err_detail());
}

void kl_t_txn_put(kl_txn_t *txn, const char *key, const char *val) {
  assert_int_equal(kl_txn_put(txn, key, strlen(key), val, strlen(val)), KL_OK);
}

const char *kl_t_txn_get(kl_txn_t *txn, const char *key) {
  static char buf[256];
  const void *val;
  size_t len;
  kl_err_t err = kl_txn_get(txn, key, strlen(key), &val, &len);
  if (err == KL_ENOTFOUND)
    return NULL;
  assert_int_equal(err, KL_OK);
  assert_true(len < sizeof(buf));
  memcpy(buf, val, len);
  buf[len] = '\0';
  return buf;
}

kl_mark_t kl_t_txn_seen(kl_txn_t *txn, const char *id) {
  kl_mark_t mark = (kl_mark_t)-1;
  assert_int_equal(kl__txn_seen_sid(txn, id, strlen(id), &mark), KL_OK);
  return mark;
}

void kl_t_txn_mark(kl_txn_t *txn, const char *id, kl_mark_t mark) {
  assert_int_equal(kl__txn_mark_sid(txn, id, strlen(id), mark), KL_OK);
}

void kl_t_txn_prefetch(kl_txn_t *txn, const char *const *ids, size_t n) {
  size_t lens[16];
  assert_true(n <= 16);
  for (size_t i = 0; i < n; i++)
    lens[i] = strlen(ids[i]);
  assert_int_equal(kl__txn_prefetch_sids(txn, ids, lens, n), KL_OK);
}

static int64_t kl_t_now_ms;

static int64_t kl_t_clock(void) {
  return kl_t_now_ms;
}

void kl_t_store_clock_set(int64_t now_ms) {
  kl_t_now_ms = now_ms;
  kl__store_set_clock(kl_t_clock);
}

void kl_t_store_clock_add(int64_t ms) {
  kl_t_now_ms += ms;
}

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

void kl_t_contract_seen_and_mark(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  const char *upper = "0190F5C4-7D2A-7B3E-9F00-1234567890AB";

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_NONE);
  kl_t_txn_mark(txn, uuid, KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "order-17-created", KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, upper), KL_MARK_NONE); /* another id */
  kl_t_store_commit(txn, 2);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, upper), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen(txn, "order-17"), KL_MARK_NONE);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2);
  kl_store_destroy(store);
}

/* kl_txn_prefetch(): a batch's ids looked up at once answer kl_txn_seen()
 * as the store holds them, and a mark made in the batch afterwards still
 * wins. */
void kl_t_contract_prefetch_answers_seen(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark_key(txn, "k", uuid, KL_MARK_APPLIED);
  kl_t_txn_mark_key(txn, "k", "order-17-created", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);

  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark_key(txn, "k", "marked-first", KL_MARK_APPLIED);
  const char *ids[] = {uuid, "order-17-created", "new-1", uuid, "marked-first"};
  const void *keys[] = {"k", "k", "k", "k", "k"};
  size_t lens[5], key_lens[] = {1, 1, 1, 1, 1};
  for (int i = 0; i < 5; i++)
    lens[i] = strlen(ids[i]);
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, lens, 5), KL_OK);
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, lens, 0), KL_OK);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "order-17-created"),
                   KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "new-1"), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "marked-first"),
                   KL_MARK_APPLIED);
  /* the batch's mark wins */
  kl_t_txn_mark_key(txn, "k", "new-1", KL_MARK_APPLIED);
  kl_t_txn_mark_key(txn, "k", "order-17-created", KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "new-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "order-17-created"),
                   KL_MARK_APPLIED);
  size_t bad = 256;
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, &bad, 1),
                   KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "256 bytes"));
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, NULL, lens, 1),
                   KL_EINVAL);
  kl_t_store_commit(txn, 3);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, lens, 3), KL_OK);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "new-1"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "order-17-created"),
                   KL_MARK_APPLIED);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* An id reused by two events of one partition: whichever order its marks
 * come in, in one batch or in two, an applied mark stays applied and is
 * not counted as a dead letter; a dead letter still becomes applied (a
 * redrive), and one written twice is counted once. */
void kl_t_contract_dead_letter_never_replaces_applied(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "same-batch", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "same-batch", KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, "same-batch"), KL_MARK_APPLIED);
  kl_t_txn_mark(txn, uuid, KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "redriven", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 1);

  txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, uuid, KL_MARK_DEAD_LETTER); /* a later batch */
  kl_t_txn_mark(txn, "redriven", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 2);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, "same-batch"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "redriven"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  /* A dead letter written again (a commit whose answer was lost, whose
   * events ran again) is the same dead letter. */
  for (int i = 0; i < 2; i++) {
    txn = kl_t_store_begin(store, 0, epoch);
    kl_t_txn_mark(txn, "answer-lost", KL_MARK_DEAD_LETTER);
    kl_t_store_commit(txn, 3);
  }
  /* The counters count the marks an id did not have: the dead letter the
   * applied mark kept out is not one, the one written twice is one. */
  kl_partition_state_t ps = kl_t_store_partition(store, 0);
  assert_int_equal(ps.applied, 3);
  assert_int_equal(ps.dead_letters, 2);
  kl_store_destroy(store);
}

/* The mark of an id that waits as a timer (KL__MARK_TIMER, internal):
 * only keylane writes it (kl_txn_mark() refuses it) and kl_txn_seen()
 * reads it as not applied; an applied or a dead-letter mark replaces it,
 * and a dead letter over it counts as one; it never replaces an applied
 * mark, and it replaces a dead letter's (a redrive that waits again). */
void kl_t_contract_timer_mark(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_txn_mark(txn, "k", 1, "w", 1, KL__MARK_TIMER), KL_EINVAL);
  char sid[KL__SID_MAX];
  size_t len = kl__sid_encode("k", 1, "w", 1, sid);
  assert_int_equal(kl__txn_mark_sid(txn, sid, len, KL__MARK_TIMER), KL_OK);
  kl_t_txn_mark(txn, "fires", KL__MARK_TIMER);
  kl_t_txn_mark(txn, "fails", KL__MARK_TIMER);
  kl_t_txn_mark(txn, "applied", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "redriven", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 1);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen_key(txn, "k", "w"), KL_MARK_NONE);
  kl_mark_t mark = KL_MARK_NONE;
  assert_int_equal(kl__txn_seen(txn, "k", 1, "w", 1, &mark), KL_OK);
  assert_int_equal(mark, KL__MARK_TIMER);
  kl_t_txn_mark(txn, "fires", KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "fails", KL_MARK_DEAD_LETTER);
  kl_t_txn_mark(txn, "applied", KL__MARK_TIMER);
  kl_t_txn_mark(txn, "redriven", KL__MARK_TIMER);
  kl_t_store_commit(txn, 2);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, "fires"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "fails"), KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen(txn, "applied"), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "redriven"), KL__MARK_TIMER);
  kl_store_abort(txn);
  kl_partition_state_t ps = kl_t_store_partition(store, 0);
  assert_int_equal(ps.applied, 2);
  assert_int_equal(ps.dead_letters, 2); /* redriven, and fails */
  kl_store_destroy(store);
}

/* Two topics sharing a store may use one id: each applies it once. */
void kl_t_contract_ids_scoped_by_topic(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "payments", 0, &ps), KL_OK);
  uint64_t epoch = kl_t_store_acquire(store, 0);

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, uuid, KL_MARK_APPLIED);
  kl_t_txn_mark(txn, "shared-id", KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 1);

  assert_int_equal(kl_store_begin(store, "payments", 0, ps.epoch, &txn), KL_OK);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen(txn, "shared-id"), KL_MARK_NONE);
  kl_t_txn_mark(txn, uuid, KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen(txn, "shared-id"), KL_MARK_DEAD_LETTER);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 3);
  kl_store_destroy(store);
}

kl_mark_t kl_t_txn_seen_key(kl_txn_t *txn, const char *key, const char *id) {
  kl_mark_t mark = KL_MARK_APPLIED;
  assert_int_equal(kl_txn_seen(txn, key, strlen(key), id, strlen(id), &mark),
                   KL_OK);
  return mark;
}

void kl_t_txn_mark_key(kl_txn_t *txn, const char *key, const char *id,
                       kl_mark_t mark) {
  assert_int_equal(kl_txn_mark(txn, key, strlen(key), id, strlen(id), mark),
                   KL_OK);
}

/* One id on two entity keys names two events; neither key's mark is the
 * other's, nor an unscoped id's; a prefetch answers for each key. */
void kl_t_contract_ids_scoped_by_key(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark_key(txn, "acct-1", "invoice/42", KL_MARK_APPLIED);
  kl_t_txn_mark_key(txn, "acct-1", uuid, KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", "invoice/42"),
                   KL_MARK_NONE);
  kl_t_store_commit(txn, 1);

  txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "invoice/42"),
                   KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", uuid), KL_MARK_DEAD_LETTER);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", "invoice/42"),
                   KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", uuid), KL_MARK_NONE);
  assert_int_equal(kl_t_txn_seen(txn, "invoice/42"), KL_MARK_NONE);
  kl_t_txn_mark_key(txn, "acct-2", "invoice/42", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 2);

  txn = kl_t_store_begin(store, 0, epoch);
  const void *keys[] = {"acct-1", "acct-2", "acct-3"};
  size_t key_lens[] = {6, 6, 6};
  const char *ids[] = {"invoice/42", "invoice/42", "invoice/42"};
  size_t id_lens[] = {10, 10, 10};
  assert_int_equal(kl_txn_prefetch(txn, keys, key_lens, ids, id_lens, 3),
                   KL_OK);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-1", "invoice/42"),
                   KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-2", "invoice/42"),
                   KL_MARK_APPLIED);
  assert_int_equal(kl_t_txn_seen_key(txn, "acct-3", "invoice/42"),
                   KL_MARK_NONE);
  size_t no_key = 0;
  assert_int_equal(kl_txn_prefetch(txn, keys, &no_key, ids, id_lens, 1),
                   KL_EINVAL);
  assert_int_equal(kl_txn_seen(txn, "k", 1, "a\0b", 3, &(kl_mark_t){0}),
                   KL_EINVAL);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 3);
  kl_store_destroy(store);
}

typedef struct kl_t_walked {
  int n, long_keys;
} kl_t_walked_t;

static int kl_t_walk_long(void *opaque, const char *topic, const void *key,
                          size_t key_len, const char *id, size_t id_len,
                          int64_t time_ms, kl_mark_t mark) {
  kl_t_walked_t *w = opaque;
  (void)topic, (void)key, (void)id, (void)id_len, (void)time_ms, (void)mark;
  w->n++;
  w->long_keys += key_len == KL_KEY_MAX;
  return 0;
}

/* The longest entity keys with the longest ids (past LMDB's 511-byte
 * keys): many ids of one key, keys that differ only in their last byte,
 * the dead-letter rule, and a walk that gives each back whole. */
void kl_t_contract_long_keys_and_ids(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  char key[KL_KEY_MAX + 1], other[KL_KEY_MAX + 1], id[KL_ID_MAX + 1];
  memset(key, 'k', KL_KEY_MAX), key[KL_KEY_MAX] = 0;
  memcpy(other, key, sizeof(key));
  other[KL_KEY_MAX - 1] = 'x';
  memset(id, 'i', KL_ID_MAX), id[KL_ID_MAX] = 0;
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  for (int i = 0; i < 20; i++) {
    id[0] = (char)('a' + i);
    kl_t_txn_mark_key(txn, key, id,
                      i % 2 ? KL_MARK_DEAD_LETTER : KL_MARK_APPLIED);
  }
  kl_t_store_commit(txn, 1);
  txn = kl_t_store_begin(store, 0, epoch);
  id[0] = 'a';
  assert_int_equal(kl_t_txn_seen_key(txn, other, id), KL_MARK_NONE);
  kl_t_txn_mark_key(txn, other, id, KL_MARK_DEAD_LETTER);
  id[0] = 'b'; /* a dead letter becomes applied; never the other way */
  kl_t_txn_mark_key(txn, key, id, KL_MARK_APPLIED);
  id[0] = 'c';
  kl_t_txn_mark_key(txn, key, id, KL_MARK_DEAD_LETTER);
  kl_t_store_commit(txn, 2);
  txn = kl_t_store_begin(store, 0, epoch);
  for (int i = 0; i < 20; i++) {
    id[0] = (char)('a' + i);
    assert_int_equal(kl_t_txn_seen_key(txn, key, id),
                     i % 2 && i != 1 ? KL_MARK_DEAD_LETTER : KL_MARK_APPLIED);
  }
  id[0] = 'a';
  assert_int_equal(kl_t_txn_seen_key(txn, other, id), KL_MARK_DEAD_LETTER);
  id[0] = 'z';
  assert_int_equal(kl_t_txn_seen_key(txn, key, id), KL_MARK_NONE);
  kl_store_abort(txn);
  kl_t_walked_t w = {0, 0};
  assert_int_equal(kl__store_ids_walk(store, kl_t_walk_long, &w), KL_OK);
  assert_int_equal(w.n, 21);
  assert_int_equal(w.long_keys, 21);
  kl_store_destroy(store);
}

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

/* ---- scans ----------------------------------------------------------- */

typedef struct kl_t_scan {
  char keys[1200][16];
  int n, stop_after;
} kl_t_scan_t;

static int kl_t_scan_cb(void *opaque, const void *key, size_t key_len,
                        const void *val, size_t val_len) {
  kl_t_scan_t *s = opaque;
  snprintf(s->keys[s->n++], 16, "%.*s=%.*s", (int)key_len, (const char *)key,
           (int)val_len, (const char *)val);
  return s->stop_after && s->n >= s->stop_after;
}

void kl_t_contract_scan_order_and_prefix(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  const char *keys[] = {"b/2", "a/1", "b/1", "b/10", "c", "b", "ba"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    kl_t_txn_put(txn, keys[i], "v");
  kl_t_txn_put(txn, "\xff\xff", "v");
  kl_t_txn_put(txn, "\xff\xff\x01", "w");
  kl_t_store_commit(txn, 1);

  kl_t_scan_t *s = calloc(1, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "b/", 2, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 3);
  assert_string_equal(s->keys[0], "b/1=v");
  assert_string_equal(s->keys[1], "b/10=v");
  assert_string_equal(s->keys[2], "b/2=v");

  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, NULL, 0, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 9);
  assert_string_equal(s->keys[0], "a/1=v");
  assert_string_equal(s->keys[1], "b=v");
  assert_string_equal(s->keys[6], "c=v");

  memset(s, 0, sizeof(*s));
  s->stop_after = 2;
  assert_int_equal(kl_store_scan(store, "b", 1, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 2);

  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "zz", 2, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 0);

  memset(s, 0, sizeof(*s)); /* a prefix with no successor */
  assert_int_equal(kl_store_scan(store, "\xff\xff", 2, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 2);

  /* More rows than one fetch of a cursor. */
  txn = kl_t_store_begin(store, 0, epoch);
  char key[16];
  for (int i = 0; i < 1100; i++) {
    snprintf(key, sizeof(key), "m/%05d", i);
    kl_t_txn_put(txn, key, "x");
  }
  kl_t_store_commit(txn, 2);
  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_store_scan(store, "m/", 2, kl_t_scan_cb, s), KL_OK);
  assert_int_equal(s->n, 1100);
  assert_string_equal(s->keys[1099], "m/01099=x");
  free(s);
  kl_store_destroy(store);
}

typedef struct kl_t_parts {
  char seen[8][64];
  int n;
} kl_t_parts_t;

static int kl_t_parts_cb(void *opaque, const char *topic, int32_t partition,
                         const kl_partition_state_t *ps) {
  kl_t_parts_t *p = opaque;
  snprintf(p->seen[p->n++], 64, "%s/%d@%llu", topic, (int)partition,
           (unsigned long long)ps->epoch);
  return 0;
}

void kl_t_contract_foreach_partition_order(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "b", 0, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 300, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a.b", 0, &ps), KL_OK);
  kl_t_parts_t p = {0};
  assert_int_equal(kl_store_foreach_partition(store, kl_t_parts_cb, &p), KL_OK);
  assert_int_equal(p.n, 4);
  assert_string_equal(p.seen[0], "a/2@2");
  assert_string_equal(p.seen[1], "a/300@1");
  assert_string_equal(p.seen[2], "a.b/0@1");
  assert_string_equal(p.seen[3], "b/0@1");
  kl_store_destroy(store);
}

/* ---- expiry ---------------------------------------------------------- */

/* Id @p n: UUID-shaped, or "raw-<n>" for multiples of 3. */
static void kl_t_id(char out[40], uint64_t n) {
  if (n % 3 == 0)
    snprintf(out, 40, "raw-%llu", (unsigned long long)n);
  else
    snprintf(out, 40, "%08x-%04x-7%03x-8%03x-%012llx",
             (unsigned)(n * 2654435761u), (unsigned)(n & 0xffff),
             (unsigned)(n % 0xfff), (unsigned)((n >> 12) % 0xfff),
             (unsigned long long)(n & 0xffffffffffffULL)); /* 12 digits */
}

/* Marks ids @p from .. @p from + @p n - 1, 1,000 a batch. */
static void kl_t_mark_many(kl_store_t *store, uint64_t epoch, uint64_t from,
                           uint64_t n) {
  char id[40];
  for (uint64_t done = 0; done < n;) {
    kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
    for (int i = 0; i < 1000 && done < n; i++, done++) {
      kl_t_id(id, from + done);
      kl_t_txn_mark(txn, id, KL_MARK_APPLIED);
    }
    kl_t_store_commit(txn, (int64_t)(from + done));
  }
}

static kl_mark_t kl_t_seen_n(kl_txn_t *txn, uint64_t n) {
  char id[40];
  kl_t_id(id, n);
  return kl_t_txn_seen(txn, id);
}

void kl_t_contract_sweep_bounded_and_keeps_young(void **state) {
  kl_t_store_fixture_t *fx = kl_t_store_fixture(state);
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *store =
      kl_t_store_open(fx->where, "store.dedup.retention", "1h", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_t_mark_many(store, epoch, 0, 5000); /* old */
  kl_t_store_clock_add(3600 * 1000 + 1);
  kl_t_mark_many(store, epoch, 5000, 300); /* young */

  size_t removed = 0, total = 0;
  int calls = 0;
  uint64_t count = 0;
  do {
    assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
    assert_true(removed <= 1000);
    total += removed;
    calls++;
    if (calls == 3) { /* a restart continues the cycle */
      kl_store_destroy(store);
      store = kl_t_store_open(fx->where, "store.dedup.retention", "1h", NULL);
      kl_t_store_acquire(store, 1); /* sweeps the topics it owns */
    }
    assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  } while (count > 300 && calls < 20);
  assert_int_equal(total, 5000);
  /* One walk over the 5,300 keys: LMDB visits 1,000 keys a call (6
   * calls); PostgreSQL visits 10 pages of about 107 of these keys and stays
   * on pages where it removed its max (9 calls). */
  assert_true(calls <= 10);
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);

  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  assert_int_equal(kl_t_seen_n(txn, 4998), KL_MARK_NONE); /* raw */
  assert_int_equal(kl_t_seen_n(txn, 4999), KL_MARK_NONE);
  assert_int_equal(kl_t_seen_n(txn, 5000), KL_MARK_APPLIED);
  assert_int_equal(kl_t_seen_n(txn, 5001), KL_MARK_APPLIED); /* raw */
  assert_int_equal(kl_t_seen_n(txn, 5299), KL_MARK_APPLIED);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

void kl_t_contract_sweep_keeps_a_key_for_the_retention(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *store =
      kl_t_store_open(where, "store.dedup.retention", "1000ms", NULL);
  uint64_t epoch = kl_t_store_acquire(store, 0);
  kl_txn_t *txn = kl_t_store_begin(store, 0, epoch);
  kl_t_txn_mark(txn, "k", KL_MARK_APPLIED);
  kl_t_store_commit(txn, 1);
  size_t removed = 9;
  kl_t_store_clock_add(1000); /* exactly the retention: still kept */
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 0);
  kl_t_store_clock_add(1);
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 1);
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
  assert_int_equal(kl_txn_cancel(txn, "k", 1, "dead", 4), KL_OK);
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

uint64_t kl_t_topic_acquire(kl_store_t *store, const char *topic) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, topic, 0, &ps), KL_OK);
  return ps.epoch;
}

void kl_t_topic_mark(kl_store_t *store, const char *topic, uint64_t epoch,
                     int64_t watermark) {
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, topic, 0, epoch, &txn), KL_OK);
  kl_t_txn_mark_key(txn, "acct-1", "credit-1", KL_MARK_APPLIED);
  kl_t_store_commit(txn, watermark);
}

kl_mark_t kl_t_topic_seen(kl_store_t *store, const char *topic,
                          uint64_t epoch) {
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, topic, 0, epoch, &txn), KL_OK);
  kl_mark_t mark = kl_t_txn_seen_key(txn, "acct-1", "credit-1");
  kl_store_abort(txn);
  return mark;
}

/* Opens the store at @p where with @p retention and takes partition 0 of
 * @p topic: @returns the store, *@p epoch the owner's epoch. */
static kl_store_t *kl_t_topic_open(const char *where, const char *retention,
                                   const char *topic, uint64_t *epoch) {
  kl_store_t *store =
      kl_t_store_open(where, "store.dedup.retention", retention, NULL);
  *epoch = kl_t_topic_acquire(store, topic);
  return store;
}

static int kl_t_sweeps_cb(void *opaque, const char *topic, int64_t retention_ms,
                          int64_t at_ms) {
  char *out = opaque;
  size_t len = strlen(out);
  snprintf(out + len, 256 - len, "%s=%" PRId64 "@%" PRId64 " ", topic,
           retention_ms, at_ms);
  return 0;
}

/* Marks the event on @p topic in a store opened for it, at the clock's
 * now, then moves the clock a day on. */
static void kl_t_topic_marked_a_day_ago(const char *where, const char *topic) {
  uint64_t epoch;
  kl_t_store_clock_set(1700000000000LL);
  kl_store_t *store = kl_t_topic_open(where, "7d", topic, &epoch);
  kl_t_topic_mark(store, topic, epoch, 1);
  kl_store_destroy(store);
  kl_t_store_clock_add(86400 * 1000);
}

/* Issue 39: a worker of topic "audit" started with a 1 s retention sweeps
 * a store whose topic "payments" keeps its ids 7 days: it removes its own
 * expired id and never payments' (day-old) one, whose event read again is
 * still a duplicate. A store-wide sweep emptied every topic's ids. */
void kl_t_contract_sweep_keeps_other_topics_ids(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  uint64_t epoch;
  kl_t_topic_marked_a_day_ago(where, "payments");
  kl_store_t *store = kl_t_topic_open(where, "1s", "audit", &epoch);
  kl_t_topic_mark(store, "audit", epoch, 1);
  kl_t_store_clock_add(1001);
  size_t removed = 0, total = 0;
  for (int i = 0; i < 5; i++) {
    assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
    total += removed;
  }
  assert_int_equal(total, 1); /* audit's own id */
  char sweeps[256] = "";
  assert_int_equal(kl__store_sweeps(store, kl_t_sweeps_cb, sweeps), KL_OK);
  assert_string_equal(sweeps, "audit=1000@1700086401001 ");
  kl_store_destroy(store);

  store = kl_t_topic_open(where, "7d", "payments", &epoch);
  assert_int_equal(kl_t_topic_seen(store, "payments", epoch), KL_MARK_APPLIED);
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0); /* a day old: young for payments */
  kl_store_destroy(store);
}

/* A handle that took no partition judges no topic's ids: its sweep
 * removes nothing, however old the store's ids are. */
void kl_t_contract_sweep_needs_an_owned_topic(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_t_topic_marked_a_day_ago(where, "payments");
  kl_store_t *store =
      kl_t_store_open(where, "store.dedup.retention", "1s", NULL);
  size_t removed = 9;
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);
  assert_int_equal(kl__store_sweep_topic(store, "payments", 1000, &removed),
                   KL_OK);
  assert_int_equal(removed, 1);
  kl_store_destroy(store);
}

/* ---- the ledger's state on a store two topics share ------------------ */

/* Runs the ledger handler on a credit of @p amount to @p key (a seq when
 * @p seq > 0) in @p txn of @p topic's partition 0, as the worker does. */
static void kl_t_ledger_credit(kl_txn_t *txn, const char *topic, uint64_t epoch,
                               const char *key, int64_t amount, int64_t seq) {
  kl_ledger_args_t a = {.amount = amount, .seq = seq, .has_seq = seq > 0};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, &a);
  kl_event_t event = {.key = key,
                      .key_len = strlen(key),
                      .id = "id",
                      .id_len = 2,
                      .type = "credit",
                      .type_len = 6,
                      .payload = sb.data,
                      .payload_len = sb.size};
  kl_fence_t fence = {topic, 0, epoch, 0};
  char why[256] = "";
  kl_handler_result_t r =
      kl_ledger_handler(NULL, &event, &fence, txn, why, sizeof(why));
  msgpack_sbuffer_destroy(&sb);
  if (r != KL_HANDLER_OK)
    fail_msg("ledger credit of %s on %s: %s", key, topic, why);
}

/* @p key's entry on @p topic, or summed over the topics (NULL). */
static kl_ledger_entry_t kl_t_ledger_entry(kl_store_t *store, const char *topic,
                                           const char *key) {
  kl_ledger_entry_t e;
  assert_true(kl_t_ledger_find(store, topic, key, &e));
  return e;
}

/* The owners of topics t8 and t9 credit key k0 in batches open at once:
 * each keeps its own entry, so neither overwrites the other's (an entry
 * shared by the two was two writers of one row: the later commit undid
 * the earlier one's credit). */
void kl_t_contract_ledger_topics_keep_their_credits(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  const char *topics[2] = {"t8", "t9"};
  uint64_t epochs[2];
  for (int t = 0; t < 2; t++) {
    kl_partition_state_t ps;
    assert_int_equal(kl_store_acquire(store, topics[t], 0, &ps), KL_OK);
    epochs[t] = ps.epoch;
  }
  for (int round = 1; round <= 3; round++) {
    kl_txn_t *txns[2];
    for (int t = 0; t < 2; t++) {
      assert_int_equal(kl_store_begin(store, topics[t], 0, epochs[t], &txns[t]),
                       KL_OK);
      kl_t_ledger_credit(txns[t], topics[t], epochs[t], "k0", 1, round);
    }
    for (int t = 0; t < 2; t++)
      kl_t_store_commit(txns[t], round);
  }
  assert_int_equal(kl_t_ledger_entry(store, NULL, "k0").balance, 6);
  for (int t = 0; t < 2; t++) {
    kl_ledger_entry_t e = kl_t_ledger_entry(store, topics[t], "k0");
    assert_int_equal(e.balance, 3);
    assert_int_equal(e.last_seq, 3);
    assert_int_equal(e.violations, 0);
  }
  kl_store_destroy(store);
}

/* A store an older keylane wrote holds a key's entry without a topic
 * ("ledger/" KEY): its balance is kept. The first topic to change the key
 * starts from it; a second topic does too, and the sum counts it once. */
void kl_t_contract_ledger_keeps_unscoped_balances(void **state) {
  const char *where = kl_t_store_fixture(state)->where;
  kl_store_t *store = kl_t_store_open(where, NULL);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "t8", 0, &ps), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t8", 0, ps.epoch, &txn), KL_OK);
  unsigned char old[KL_LEDGER_VALUE_LEN] = {0};
  old[7] = 7, old[15] = 3; /* balance 7, last seq 3, no violations */
  assert_int_equal(kl_txn_put(txn, "ledger/k0", 9, old, sizeof(old)), KL_OK);
  assert_int_equal(kl_txn_put(txn, "ledger/k1", 9, old, sizeof(old)), KL_OK);
  kl_t_store_commit(txn, 1);
  assert_int_equal(kl_t_ledger_entry(store, NULL, "k0").balance, 7);

  assert_int_equal(kl_store_begin(store, "t8", 0, ps.epoch, &txn), KL_OK);
  kl_t_ledger_credit(txn, "t8", ps.epoch, "k0", 1, 4);
  kl_t_store_commit(txn, 2);
  kl_ledger_entry_t e = kl_t_ledger_entry(store, "t8", "k0");
  assert_int_equal(e.balance, 8);
  assert_int_equal(e.last_seq, 4);
  assert_int_equal(e.violations, 0); /* its seq follows the old entry's */
  e = kl_t_ledger_entry(store, NULL, "k0");
  assert_int_equal(e.balance, 8);
  assert_int_equal(e.last_seq, 4);
  assert_int_equal(kl_t_ledger_entry(store, NULL, "k1").balance, 7);

  kl_partition_state_t ps9;
  assert_int_equal(kl_store_acquire(store, "t9", 0, &ps9), KL_OK);
  assert_int_equal(kl_store_begin(store, "t9", 0, ps9.epoch, &txn), KL_OK);
  kl_t_ledger_credit(txn, "t9", ps9.epoch, "k0", 2, 0);
  kl_t_store_commit(txn, 1);
  assert_int_equal(kl_t_ledger_entry(store, "t9", "k0").balance, 9);
  assert_int_equal(kl_t_ledger_entry(store, NULL, "k0").balance, 10);
  kl_store_destroy(store);
}

/* ---- what one backend alone needs: an op every backend answers ------- */

/* kl_err_detail() holds @p want. */
static void kl_t_detail_has(const char *want) {
  if (!strstr(kl_err_detail(), want))
    fail_msg("kl_err_detail() is \"%s\", not about \"%s\"", kl_err_detail(),
             want);
}

/* An embedder assigns it to a PGconn * with no cast: libpq's type. */
_Static_assert(_Generic(kl_txn_pg_conn(NULL), struct pg_conn * : 1,
                        default : 0),
               "kl_txn_pg_conn() returns struct pg_conn * (libpq's PGconn)");

/* Opens the fixture's store (*@p pg: it is PostgreSQL's), acquires
 * partition 0 as *@p epoch and begins a batch there. */
static kl_txn_t *kl_t_open_batch(void **state, kl_store_t **store, int *pg,
                                 uint64_t *epoch) {
  kl_t_store_fixture_t *fx = kl_t_store_fixture(state);
  *store = kl_t_store_open(fx->where, NULL);
  *pg = strcmp(kl_store_backend(*store), "postgresql") == 0;
  *epoch = kl_t_store_acquire(*store, 0);
  return kl_t_store_begin(*store, 0, *epoch);
}

void kl_t_contract_backend_ops_answer(void **state) {
  kl_store_t *store;
  int pg;
  uint64_t epoch;
  kl_txn_t *txn = kl_t_open_batch(state, &store, &pg, &epoch);
  /* A txn not begun ahead is settled. */
  assert_int_equal(kl__store_settle(txn), KL_OK);
  assert_false(kl__store_pending(txn));
  struct pg_conn *conn = kl_txn_pg_conn(txn);
  if (pg) {
    assert_non_null(conn);
  } else {
    assert_null(conn);
    kl_t_detail_has("the store is lmdb, which has no SQL");
  }
  /* Savepoints hold the kv writes' batch either way. */
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_SET), KL_OK);
  kl_t_txn_put(txn, "k", "v");
  assert_int_equal(kl__store_savepoint(txn, KL__SAVEPOINT_RELEASE), KL_OK);
  kl_t_store_commit(txn, 1);
  txn = kl_t_store_begin(store, 0, epoch);
  assert_string_equal(kl_t_txn_get(txn, "k"), "v");
  kl_store_abort(txn);

  const char *ids[1] = {"id-1"};
  size_t lens[1] = {4};
  kl_err_t err =
      kl__store_begin_ahead(store, KL_T_TOPIC, 0, epoch, ids, lens, 1, &txn);
  if (pg) {
    assert_int_equal(err, KL_OK);
    assert_int_equal(kl__store_settle(txn), KL_OK);
    kl_store_abort(txn);
  } else {
    assert_int_equal(err, KL_EINVAL);
    kl_t_detail_has("the lmdb store does not begin ahead");
  }

  assert_string_equal(kl__store_layout(store), pg ? "schema" : "format");
  char missing[64] = "x";
  assert_int_equal(kl__store_missing(store, missing, sizeof(missing)), KL_OK);
  assert_string_equal(missing, "");
  int64_t server = 0, before = 0, after = 0;
  err = kl__store_server_clock(store, &server, &before, &after);
  if (pg) {
    assert_int_equal(err, KL_OK);
    assert_true(server > 0 && before > 0 && before <= after);
  } else {
    assert_int_equal(err, KL_ENOTFOUND);
    kl_t_detail_has("the lmdb store keeps no clock of its own");
  }
  assert_null(kl_txn_pg_conn(NULL));
  kl_t_detail_has("kl_txn_pg_conn: txn is required");
  kl_store_destroy(store);
}

/* A handler's child txn lends its base's SQL connection only inline
 * (worker.concurrency 1), inside a savepoint; key-parallel it says why
 * not. */
void kl_t_contract_child_lends_sql_only_inline(void **state) {
  kl_store_t *store;
  int pg;
  uint64_t epoch;
  kl_txn_t *txn = kl_t_open_batch(state, &store, &pg, &epoch);
  kl__overlay_t ov;
  kl__ov_init(&ov);
  kl__child_t child;
  kl__child_init(&child);

  kl__child_begin(&child, txn, NULL, &ov);
  child.sql = 0; /* key-parallel */
  assert_null(kl_txn_pg_conn(&child.base));
  kl_t_detail_has("worker.concurrency > 1");
  assert_int_equal(kl__child_end(&child, 1), KL_OK);

  for (int ok = 0; ok < 2; ok++) {
    kl__child_begin(&child, txn, NULL, &ov);
    child.sql = 1; /* inline */
    struct pg_conn *conn = kl_txn_pg_conn(&child.base);
    if (pg) {
      assert_true(conn && child.savepoint);
    } else {
      assert_null(conn);
      kl_t_detail_has("the store is lmdb");
    }
    assert_int_equal(kl__child_end(&child, ok), KL_OK);
    assert_false(child.savepoint);
  }
  kl__child_destroy(&child);
  kl__ov_clear(&ov);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

void kl_t_lmdb_set_format(const char *where, uint32_t format) {
  MDB_env *env;
  MDB_txn *mtxn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 8), 0);
  assert_int_equal(mdb_env_open(env, where, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &mtxn), 0);
  assert_int_equal(mdb_dbi_open(mtxn, KL__LMDB_META_DB, 0, &dbi), 0);
  MDB_val key = {strlen(KL__LMDB_FORMAT_KEY), KL__LMDB_FORMAT_KEY};
  MDB_val val = {sizeof(format), &format};
  assert_int_equal(mdb_put(mtxn, dbi, &key, &val, 0), 0);
  assert_int_equal(mdb_txn_commit(mtxn), 0);
  mdb_env_close(env);
}
