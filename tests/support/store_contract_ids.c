/*
 * The store contract's cases of idempotency keys and their marks
 * (store_contract.h): seen and mark, a prefetch's answers, a dead letter
 * never replaces an applied mark, the timer mark, ids scoped by topic and
 * by entity key, long keys and ids.
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
