/*
 * The store contract's cases of scans, expiry and the ledger
 * (store_contract.h): scan order and prefixes, partitions in order, the
 * sweep of expired ids (bounded, by topic, by its retention), the ledger's
 * state on a store two topics share, and the ops every backend answers.
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
    kl_t_store_detail_has("the store is lmdb, which has no SQL");
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
    kl_t_store_detail_has("the lmdb store does not begin ahead");
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
    kl_t_store_detail_has("the lmdb store keeps no clock of its own");
  }
  assert_null(kl_txn_pg_conn(NULL));
  kl_t_store_detail_has("kl_txn_pg_conn: txn is required");
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
  kl_t_store_detail_has("worker.concurrency > 1");
  assert_int_equal(kl__child_end(&child, 1), KL_OK);

  for (int ok = 0; ok < 2; ok++) {
    kl__child_begin(&child, txn, NULL, &ov);
    child.sql = 1; /* inline */
    struct pg_conn *conn = kl_txn_pg_conn(&child.base);
    if (pg) {
      assert_true(conn && child.savepoint);
    } else {
      assert_null(conn);
      kl_t_store_detail_has("the store is lmdb");
    }
    assert_int_equal(kl__child_end(&child, ok), KL_OK);
    assert_false(child.savepoint);
  }
  kl__child_destroy(&child);
  kl__ov_clear(&ov);
  kl_store_abort(txn);
  kl_store_destroy(store);
}
