/*
 * The store contract's helpers (store_contract.h). Its cases are in
 * store_contract_*.c, by subject: batches (epochs and batches), ids (ids
 * and their marks), fencing (watermarks, owners, counters), scans (scans,
 * expiry, the ledger, the ops every backend answers), timers. Where the
 * backends' tests used to differ, each case checks what either checked;
 * what only one backend does stays in its own program.
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

void kl_t_store_detail_has(const char *want) {
  if (!strstr(kl_err_detail(), want))
    fail_msg("kl_err_detail() is \"%s\", not about \"%s\"", kl_err_detail(),
             want);
}
