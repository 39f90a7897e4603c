/*
 * The LMDB store: epochs, batches and their fence, idempotency keys and
 * their expiry, map growth, processes sharing one environment, and the
 * errors a caller must be able to handle (full, read-only, other format).
 * Each test gets a fresh directory under /tmp, removed afterwards.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <lmdb.h>
#include <pthread.h>

#include "keylane/store.h"
#include "worker/store_internal.h"

#define TOPIC "orders"

typedef struct t_state {
  char dir[64];
} t_state_t;

/* ---- fixtures -------------------------------------------------------- */

static void t_rmrf(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
        continue;
      char sub[512];
      snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
      t_rmrf(sub);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static int t_setup(void **state) {
  t_state_t *st = calloc(1, sizeof(*st));
  strcpy(st->dir, "/tmp/kl-store-XXXXXX");
  if (!mkdtemp(st->dir))
    return -1;
  *state = st;
  return 0;
}

static int t_teardown(void **state) {
  t_state_t *st = *state;
  kl__store_set_clock(NULL);
  t_rmrf(st->dir);
  free(st);
  return 0;
}

/* Opens the store at dir/sub with "key", "value", ... NULL settings. */
static kl_err_t t_open_v(const char *dir, const char *sub, kl_store_t **store,
                         va_list ap) {
  char path[256];
  snprintf(path, sizeof(path), "%s/%s", dir, sub);
  kl_conf_t *conf = kl_conf_new();
  const char *key;
  while ((key = va_arg(ap, const char *)) != NULL) {
    const char *value = va_arg(ap, const char *);
    if (kl_conf_set(conf, key, value, NULL, 0) != KL_OK) {
      kl_conf_destroy(conf);
      return KL_ECONF;
    }
  }
  kl_err_t err = kl_store_open(path, conf, store);
  kl_conf_destroy(conf);
  return err;
}

static kl_err_t t_try_open(const char *dir, kl_store_t **store, ...) {
  va_list ap;
  va_start(ap, store);
  kl_err_t err = t_open_v(dir, "s", store, ap);
  va_end(ap);
  return err;
}

static kl_store_t *t_open(const char *dir, ...) {
  kl_store_t *store = NULL;
  va_list ap;
  va_start(ap, dir);
  kl_err_t err = t_open_v(dir, "s", &store, ap);
  va_end(ap);
  if (err)
    fail_msg("open %s/s: %s: %s", dir, kl_err_name(err), kl_err_detail());
  return store;
}

static uint64_t t_acquire(kl_store_t *store, int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, TOPIC, partition, &ps), KL_OK);
  return ps.epoch;
}

static kl_partition_state_t t_part(kl_store_t *store, int32_t partition) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(store, TOPIC, partition, &ps), KL_OK);
  return ps;
}

static kl_txn_t *t_begin(kl_store_t *store, int32_t partition,
                         uint64_t epoch) {
  kl_txn_t *txn = NULL;
  kl_err_t err = kl_store_begin(store, TOPIC, partition, epoch, &txn);
  if (err)
    fail_msg("begin: %s: %s", kl_err_name(err), kl_err_detail());
  return txn;
}

static void t_commit(kl_txn_t *txn, int64_t watermark) {
  kl_err_t err = kl_store_commit(txn, watermark);
  if (err)
    fail_msg("commit: %s: %s", kl_err_name(err), kl_err_detail());
}

static void t_put(kl_txn_t *txn, const char *key, const char *val) {
  assert_int_equal(kl_txn_put(txn, key, strlen(key), val, strlen(val)),
                   KL_OK);
}

/* @returns the value of key as a static string, or NULL when absent. */
static const char *t_get(kl_txn_t *txn, const char *key) {
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

static kl_mark_t t_seen(kl_txn_t *txn, const char *id) {
  kl_mark_t mark = (kl_mark_t)-1;
  assert_int_equal(kl_txn_seen(txn, id, strlen(id), &mark), KL_OK);
  return mark;
}

static void t_mark(kl_txn_t *txn, const char *id, kl_mark_t mark) {
  assert_int_equal(kl_txn_mark(txn, id, strlen(id), mark), KL_OK);
}

static void t_uuid(char out[37], uint64_t n) {
  snprintf(out, 37, "%08x-%04x-7%03x-8%03x-%012llx", (unsigned)(n * 2654435761u),
           (unsigned)(n & 0xffff), (unsigned)(n % 0xfff),
           (unsigned)((n >> 12) % 0xfff), (unsigned long long)n);
}

static int64_t t_now_ms;
static int64_t t_clock(void) {
  return t_now_ms;
}

/* ---- epochs ---------------------------------------------------------- */

static void test_acquire_increments_and_persists(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  assert_int_equal(t_part(store, 3).epoch, 0);
  assert_int_equal(t_acquire(store, 3), 1);
  assert_int_equal(t_acquire(store, 3), 2);
  assert_int_equal(t_acquire(store, 4), 1);
  kl_store_destroy(store);

  store = t_open(st->dir, NULL);
  assert_int_equal(t_part(store, 3).epoch, 2);
  assert_int_equal(t_acquire(store, 3), 3);
  assert_int_equal(t_part(store, 4).epoch, 1);
  kl_store_destroy(store);
}

/* ---- batches --------------------------------------------------------- */

static void test_batch_visibility(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 0);

  kl_txn_t *a = t_begin(store, 0, epoch);
  t_put(a, "acct/1", "100");
  assert_string_equal(t_get(a, "acct/1"), "100"); /* own write, uncommitted */
  t_put(a, "acct/1", "150");
  assert_string_equal(t_get(a, "acct/1"), "150");
  t_put(a, "acct/2", "7");
  assert_int_equal(kl_txn_del(a, "acct/2", 6), KL_OK);
  assert_null(t_get(a, "acct/2")); /* own delete shadows own put */

  kl_txn_t *b = t_begin(store, 0, epoch);
  assert_null(t_get(b, "acct/1")); /* another snapshot: not committed yet */
  t_commit(a, 10);
  assert_null(t_get(b, "acct/1")); /* b's snapshot predates the commit */
  kl_store_abort(b);

  kl_txn_t *c = t_begin(store, 0, epoch);
  assert_string_equal(t_get(c, "acct/1"), "150");
  assert_null(t_get(c, "acct/2"));
  assert_int_equal(kl_txn_del(c, "acct/1", 6), KL_OK);
  assert_null(t_get(c, "acct/1")); /* a delete hides the snapshot's value */
  t_commit(c, 11);
  kl_store_destroy(store);

  store = t_open(st->dir, NULL);
  kl_txn_t *d = t_begin(store, 0, epoch);
  assert_null(t_get(d, "acct/1"));
  kl_store_abort(d);
  assert_int_equal(t_part(store, 0).watermark, 11);
  kl_store_destroy(store);
}

static void test_seen_and_mark(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 0);
  const char *uuid = "0190f5c4-7d2a-7b3e-9f00-1234567890ab";
  const char *upper = "0190F5C4-7D2A-7B3E-9F00-1234567890AB";

  kl_txn_t *txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_NONE);
  t_mark(txn, uuid, KL_MARK_APPLIED);
  t_mark(txn, "order-17-created", KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(t_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, upper), KL_MARK_NONE); /* another id */
  t_commit(txn, 2);

  txn = t_begin(store, 0, epoch);
  assert_int_equal(t_seen(txn, uuid), KL_MARK_APPLIED);
  assert_int_equal(t_seen(txn, "order-17-created"), KL_MARK_DEAD_LETTER);
  assert_int_equal(t_seen(txn, upper), KL_MARK_NONE);
  assert_int_equal(t_seen(txn, "order-17"), KL_MARK_NONE);
  kl_store_abort(txn);
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2);
  kl_store_destroy(store);
}

static void test_fenced_commit_applies_nothing(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t old = t_acquire(store, 2);
  kl_txn_t *txn = t_begin(store, 2, old);
  t_put(txn, "acct/9", "1");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);

  uint64_t now = t_acquire(store, 2); /* a new owner takes over */
  assert_int_equal(kl_store_commit(txn, 50), KL_EFENCED);
  assert_non_null(strstr(kl_err_detail(),
                         "fenced partition=2 my_epoch=1 current_epoch=2"));

  kl_partition_state_t ps = t_part(store, 2);
  assert_int_equal(ps.epoch, now);
  assert_int_equal(ps.watermark, 0);
  assert_int_equal(ps.applied + ps.duplicates + ps.dead_letters, 0);
  txn = t_begin(store, 2, now);
  assert_null(t_get(txn, "acct/9"));
  assert_int_equal(t_seen(txn, "id-1"), KL_MARK_NONE);
  kl_store_abort(txn);

  /* A stale owner is refused at begin, before its handlers run. */
  kl_txn_t *stale = NULL;
  assert_int_equal(kl_store_begin(store, TOPIC, 2, old, &stale), KL_EFENCED);
  assert_null(stale);
  kl_store_destroy(store);
}

static void test_watermark_never_goes_back(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 0);
  t_commit(t_begin(store, 0, epoch), 100);
  assert_int_equal(t_part(store, 0).watermark, 100);
  t_commit(t_begin(store, 0, epoch), 50);
  assert_int_equal(t_part(store, 0).watermark, 100);
  t_commit(t_begin(store, 0, epoch), 101);
  assert_int_equal(t_part(store, 0).watermark, 101);
  /* A new owner resumes from it. */
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, TOPIC, 0, &ps), KL_OK);
  assert_int_equal(ps.watermark, 101);
  kl_store_destroy(store);
}

static void test_counters(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 1);
  kl_txn_t *txn = t_begin(store, 1, epoch);
  t_mark(txn, "a", KL_MARK_APPLIED);
  t_mark(txn, "b", KL_MARK_APPLIED);
  t_mark(txn, "c", KL_MARK_DEAD_LETTER);
  t_mark(txn, "a", KL_MARK_APPLIED); /* once per id */
  kl_txn_count_duplicate(txn);
  kl_txn_count_duplicate(txn);
  t_commit(txn, 5);
  txn = t_begin(store, 1, epoch);
  t_mark(txn, "d", KL_MARK_APPLIED);
  kl_txn_count_duplicate(txn);
  t_commit(txn, 6);
  kl_txn_t *aborted = t_begin(store, 1, epoch);
  t_mark(aborted, "e", KL_MARK_APPLIED);
  kl_store_abort(aborted);

  kl_partition_state_t ps = t_part(store, 1);
  assert_int_equal(ps.applied, 3);
  assert_int_equal(ps.dead_letters, 1);
  assert_int_equal(ps.duplicates, 3);
  kl_store_destroy(store);
}

/* ---- scans ----------------------------------------------------------- */

typedef struct t_scan {
  char keys[16][32];
  int n, stop_after;
} t_scan_t;

static int t_scan_cb(void *opaque, const void *key, size_t key_len,
                     const void *val, size_t val_len) {
  t_scan_t *s = opaque;
  snprintf(s->keys[s->n++], 32, "%.*s=%.*s", (int)key_len, (const char *)key,
           (int)val_len, (const char *)val);
  return s->stop_after && s->n >= s->stop_after;
}

static void test_scan_order_and_prefix(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  const char *keys[] = {"b/2", "a/1", "b/1", "b/10", "c", "b", "ba"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    t_put(txn, keys[i], "v");
  t_commit(txn, 1);

  t_scan_t s = {0};
  assert_int_equal(kl_store_scan(store, "b/", 2, t_scan_cb, &s), KL_OK);
  assert_int_equal(s.n, 3);
  assert_string_equal(s.keys[0], "b/1=v");
  assert_string_equal(s.keys[1], "b/10=v");
  assert_string_equal(s.keys[2], "b/2=v");

  memset(&s, 0, sizeof(s));
  assert_int_equal(kl_store_scan(store, NULL, 0, t_scan_cb, &s), KL_OK);
  assert_int_equal(s.n, 7);
  assert_string_equal(s.keys[0], "a/1=v");
  assert_string_equal(s.keys[1], "b=v");
  assert_string_equal(s.keys[6], "c=v");

  memset(&s, 0, sizeof(s));
  s.stop_after = 2;
  assert_int_equal(kl_store_scan(store, "b", 1, t_scan_cb, &s), KL_OK);
  assert_int_equal(s.n, 2);

  memset(&s, 0, sizeof(s));
  assert_int_equal(kl_store_scan(store, "zz", 2, t_scan_cb, &s), KL_OK);
  assert_int_equal(s.n, 0);
  kl_store_destroy(store);
}

typedef struct t_parts {
  char seen[8][64];
  int n;
} t_parts_t;

static int t_parts_cb(void *opaque, const char *topic, int32_t partition,
                      const kl_partition_state_t *ps) {
  t_parts_t *p = opaque;
  snprintf(p->seen[p->n++], 64, "%s/%d@%llu", topic, (int)partition,
           (unsigned long long)ps->epoch);
  return 0;
}

static void test_foreach_partition_order(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  kl_partition_state_t ps;
  assert_int_equal(kl_store_acquire(store, "b", 0, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 300, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a", 2, &ps), KL_OK);
  assert_int_equal(kl_store_acquire(store, "a.b", 0, &ps), KL_OK);
  t_parts_t p = {0};
  assert_int_equal(kl_store_foreach_partition(store, t_parts_cb, &p), KL_OK);
  assert_int_equal(p.n, 4);
  assert_string_equal(p.seen[0], "a/2@2");
  assert_string_equal(p.seen[1], "a/300@1");
  assert_string_equal(p.seen[2], "a.b/0@1");
  assert_string_equal(p.seen[3], "b/0@1");
  kl_store_destroy(store);
}

/* ---- expiry ---------------------------------------------------------- */

static void t_mark_many(kl_store_t *store, uint64_t epoch, uint64_t from,
                        uint64_t n) {
  char id[40];
  for (uint64_t done = 0; done < n;) {
    kl_txn_t *txn = t_begin(store, 0, epoch);
    for (int i = 0; i < 1000 && done < n; i++, done++) {
      if ((from + done) % 3)
        t_uuid(id, from + done);
      else
        snprintf(id, sizeof(id), "raw-%llu", (unsigned long long)(from + done));
      t_mark(txn, id, KL_MARK_APPLIED);
    }
    t_commit(txn, (int64_t)(from + done));
  }
}

static void test_sweep_bounded_and_keeps_young(void **state) {
  t_state_t *st = *state;
  t_now_ms = 1700000000000LL;
  kl__store_set_clock(t_clock);
  kl_store_t *store = t_open(st->dir, "store.dedup.retention", "1h", NULL);
  uint64_t epoch = t_acquire(store, 0);
  t_mark_many(store, epoch, 0, 5000); /* old */
  t_now_ms += 3600 * 1000 + 1;
  t_mark_many(store, epoch, 5000, 300); /* young */

  size_t removed = 0, total = 0;
  int calls = 0;
  uint64_t count = 0;
  do {
    assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
    assert_true(removed <= 1000);
    total += removed;
    calls++;
    if (calls == 3) { /* the cursor is kept in the store: a restart */
      kl_store_destroy(store); /* continues the cycle */
      store = t_open(st->dir, "store.dedup.retention", "1h", NULL);
    }
    assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  } while (count > 300 && calls < 20);
  assert_int_equal(total, 5000);
  assert_true(calls <= 6); /* one cycle over 5300 keys, 1000 at a time */
  assert_int_equal(kl_store_sweep(store, 1000, &removed), KL_OK);
  assert_int_equal(removed, 0);

  char id[40];
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_uuid(id, 4999);
  assert_int_equal(t_seen(txn, id), KL_MARK_NONE);
  t_uuid(id, 5002); /* ids that are multiples of 3 are raw */
  assert_int_equal(t_seen(txn, id), KL_MARK_APPLIED);
  assert_int_equal(t_seen(txn, "raw-5001"), KL_MARK_APPLIED);
  kl_store_abort(txn);
  kl_store_destroy(store);
}

static void test_sweep_keeps_a_key_for_the_retention(void **state) {
  t_state_t *st = *state;
  t_now_ms = 1700000000000LL;
  kl__store_set_clock(t_clock);
  kl_store_t *store = t_open(st->dir, "store.dedup.retention", "1000ms",
                             NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_mark(txn, "k", KL_MARK_APPLIED);
  t_commit(txn, 1);
  size_t removed = 9;
  t_now_ms += 1000; /* exactly the retention: still kept */
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 0);
  t_now_ms += 1;
  assert_int_equal(kl_store_sweep(store, 10, &removed), KL_OK);
  assert_int_equal(removed, 1);
  kl_store_destroy(store);
}

/* ---- map size -------------------------------------------------------- */

/* Commits batches of @p per 1 KiB values until @p total or an error. */
static kl_err_t t_fill(kl_store_t *store, uint64_t epoch, int from, int total,
                       int per) {
  char key[32], val[1024];
  memset(val, 'x', sizeof(val));
  for (int k = from; k < from + total;) {
    kl_txn_t *txn = t_begin(store, 0, epoch);
    for (int i = 0; i < per && k < from + total; i++, k++) {
      snprintf(key, sizeof(key), "big/%08d", k);
      assert_int_equal(kl_txn_put(txn, key, strlen(key), val, sizeof(val)),
                       KL_OK);
    }
    kl_err_t err = kl_store_commit(txn, k);
    if (err)
      return err;
  }
  return KL_OK;
}

static int t_count_cb(void *opaque, const void *key, size_t key_len,
                      const void *val, size_t val_len) {
  (*(int *)opaque)++;
  return 0;
}

static void test_map_grows(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, "store.map.size", "1M",
                             "store.map.max", "64M", NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl__store_usage_t u;
  assert_int_equal(kl__store_lmdb_usage(store, &u), KL_OK);
  assert_int_equal(u.map_size, 1 << 20);
  kl_err_t err = t_fill(store, epoch, 0, 8000, 500); /* ~9 MB */
  if (err)
    fail_msg("fill: %s: %s", kl_err_name(err), kl_err_detail());
  assert_int_equal(kl__store_lmdb_usage(store, &u), KL_OK);
  assert_true(u.map_size >= 8u << 20);
  int n = 0;
  assert_int_equal(kl_store_scan(store, "big/", 4, t_count_cb, &n), KL_OK);
  assert_int_equal(n, 8000);
  kl_store_destroy(store);

  /* Reopened with the small configured size, it keeps the grown map. */
  store = t_open(st->dir, "store.map.size", "1M", NULL);
  assert_int_equal(kl__store_lmdb_usage(store, &u), KL_OK);
  assert_true(u.map_size >= 8u << 20);
  kl_store_destroy(store);
}

static void test_map_full_at_max(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, "store.map.size", "1M",
                             "store.map.max", "2M", NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_err_t err = t_fill(store, epoch, 0, 100000, 100);
  assert_int_equal(err, KL_ESTORE_FULL);
  assert_non_null(strstr(kl_err_detail(), "store.map.max"));
  /* The failed batch applied nothing, and the store still works. */
  kl_partition_state_t ps = t_part(store, 0);
  assert_true(ps.watermark > 0 && ps.watermark % 100 == 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  char key[32];
  snprintf(key, sizeof(key), "big/%08d", (int)ps.watermark);
  assert_null(t_get(txn, key));
  kl_store_abort(txn);
  kl_store_destroy(store);
}

/* A growth in one thread waits for the batches other threads hold. */
typedef struct t_holder {
  kl_store_t *store;
  uint64_t epoch;
  kl_err_t err;
} t_holder_t;

static void *t_hold_batch(void *opaque) {
  t_holder_t *h = opaque;
  kl_txn_t *txn = NULL;
  h->err = kl_store_begin(h->store, TOPIC, 1, h->epoch, &txn);
  if (h->err)
    return NULL;
  struct timespec ts = {0, 300 * 1000000L};
  nanosleep(&ts, NULL);
  h->err = kl_txn_put(txn, "held", 4, "1", 1);
  if (!h->err)
    h->err = kl_store_commit(txn, 1);
  return NULL;
}

static void test_map_growth_waits_for_open_batches(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, "store.map.size", "1M", NULL);
  uint64_t epoch = t_acquire(store, 0);
  t_holder_t h = {store, t_acquire(store, 1), KL_OK};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, t_hold_batch, &h), 0);
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL);
  kl_err_t err = t_fill(store, epoch, 0, 3000, 3000); /* must grow */
  pthread_join(thread, NULL);
  if (err)
    fail_msg("fill: %s: %s", kl_err_name(err), kl_err_detail());
  assert_int_equal(h.err, KL_OK);
  assert_int_equal(t_part(store, 1).watermark, 1);
  kl_store_destroy(store);
}

/* A thread that holds a batch and grows the map from another batch would
 * wait for itself: it gets KL_ESTORE_BUSY instead of a deadlock. */
static void test_map_growth_with_own_snapshot_is_busy(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, "store.map.size", "1M", NULL);
  uint64_t epoch = t_acquire(store, 0);
  uint64_t other = t_acquire(store, 1);
  kl_txn_t *held = t_begin(store, 1, other);
  kl_err_t err = t_fill(store, epoch, 0, 3000, 3000);
  assert_int_equal(err, KL_ESTORE_BUSY);
  assert_true(kl_err_is_retriable(err));
  kl_store_abort(held);
  err = t_fill(store, epoch, 0, 3000, 3000);
  if (err)
    fail_msg("fill: %s: %s", kl_err_name(err), kl_err_detail());
  kl_store_destroy(store);
}

/* Several threads commit to their own partitions while the map grows. */
typedef struct t_writer {
  kl_store_t *store;
  int32_t partition;
  uint64_t epoch;
  int busy;
  kl_err_t err;
} t_writer_t;

static void *t_write_batches(void *opaque) {
  t_writer_t *w = opaque;
  char key[32], val[200];
  memset(val, 'y', sizeof(val));
  for (int b = 0; b < 40 && !w->err;) {
    kl_txn_t *txn = NULL;
    w->err = kl_store_begin(w->store, TOPIC, w->partition, w->epoch, &txn);
    for (int i = 0; i < 100 && !w->err; i++) {
      snprintf(key, sizeof(key), "p%d/%04d/%03d", (int)w->partition, b, i);
      w->err = kl_txn_put(txn, key, strlen(key), val, sizeof(val));
    }
    if (!w->err)
      w->err = kl_store_commit(txn, b + 1);
    else
      kl_store_abort(txn);
    if (w->err == KL_ESTORE_BUSY) { /* retriable: run the batch again */
      w->busy++;
      w->err = KL_OK;
      continue;
    }
    b++;
  }
  return NULL;
}

static void test_threads_commit_while_map_grows(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, "store.map.size", "1M", NULL);
  t_writer_t w[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (t_writer_t){store, i, t_acquire(store, i), 0, KL_OK};
    assert_int_equal(pthread_create(&threads[i], NULL, t_write_batches, &w[i]),
                     0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(threads[i], NULL);
    if (w[i].err)
      fail_msg("writer %d: %s: %s", i, kl_err_name(w[i].err), kl_err_detail());
    assert_int_equal(t_part(store, i).watermark, 40);
  }
  int n = 0;
  assert_int_equal(kl_store_scan(store, "p", 1, t_count_cb, &n), KL_OK);
  assert_int_equal(n, 4 * 40 * 100);
  kl_store_destroy(store);
}

/* ---- processes ------------------------------------------------------- */

/* In a forked child: own store, own partition, 20 batches. No cmocka. */
static int t_child_commits(const char *dir, int32_t partition) {
  kl_store_t *store = NULL;
  if (t_try_open(dir, &store, NULL))
    return 10;
  kl_partition_state_t ps;
  if (kl_store_acquire(store, TOPIC, partition, &ps))
    return 11;
  for (int b = 0; b < 20; b++) {
    kl_txn_t *txn = NULL;
    char id[32];
    if (kl_store_begin(store, TOPIC, partition, ps.epoch, &txn))
      return 12;
    for (int i = 0; i < 50; i++) {
      snprintf(id, sizeof(id), "p%d-%d-%d", (int)partition, b, i);
      if (kl_txn_mark(txn, id, strlen(id), KL_MARK_APPLIED) ||
          kl_txn_put(txn, id, strlen(id), "v", 1))
        return 13;
    }
    if (kl_store_commit(txn, (b + 1) * 50))
      return 14;
  }
  kl_store_destroy(store);
  return 0;
}

static int t_wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

static void test_two_processes_share_one_env(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL); /* the parent has it open too */
  pid_t pids[2];
  for (int i = 0; i < 2; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0)
      _exit(t_child_commits(st->dir, i));
  }
  for (int i = 0; i < 2; i++)
    assert_int_equal(t_wait(pids[i]), 0);
  for (int i = 0; i < 2; i++) {
    kl_partition_state_t ps = t_part(store, i);
    assert_int_equal(ps.epoch, 1);
    assert_int_equal(ps.watermark, 1000);
    assert_int_equal(ps.applied, 1000);
  }
  uint64_t count;
  assert_int_equal(kl_store_id_count(store, &count), KL_OK);
  assert_int_equal(count, 2000);
  kl_store_destroy(store);
}

static int t_child_acquire(const char *dir, int32_t partition) {
  kl_store_t *store = NULL;
  kl_partition_state_t ps;
  if (t_try_open(dir, &store, NULL))
    return 10;
  if (kl_store_acquire(store, TOPIC, partition, &ps))
    return 11;
  kl_store_destroy(store);
  return (int)ps.epoch;
}

static void test_other_process_fences_us(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  uint64_t epoch = t_acquire(store, 0);
  kl_txn_t *txn = t_begin(store, 0, epoch);
  t_put(txn, "acct/1", "1");
  t_mark(txn, "id-1", KL_MARK_APPLIED);
  pid_t pid = fork(); /* another worker takes partition 0 */
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(t_child_acquire(st->dir, 0));
  assert_int_equal(t_wait(pid), 2);
  assert_int_equal(kl_store_commit(txn, 10), KL_EFENCED);
  assert_non_null(strstr(kl_err_detail(),
                         "fenced partition=0 my_epoch=1 current_epoch=2"));
  kl_partition_state_t ps = t_part(store, 0);
  assert_int_equal(ps.watermark, 0);
  assert_int_equal(ps.applied, 0);
  kl_store_destroy(store);
}

/* ---- errors ---------------------------------------------------------- */

/* As an unprivileged user, opening dir/s must fail with READONLY. */
static int t_child_readonly(const char *dir) {
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
    return 20;
  kl_store_t *store = NULL;
  kl_err_t err = t_try_open(dir, &store, NULL);
  if (err != KL_ESTORE_READONLY)
    return 21;
  if (!strstr(kl_err_detail(), "writable"))
    return 22;
  return 0;
}

static void t_chmod_all(const char *dir, mode_t dmode, mode_t fmode) {
  char path[256];
  const char *files[] = {"data.mdb", "lock.mdb"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof(path), "%s/s/%s", dir, files[i]);
    chmod(path, fmode);
  }
  snprintf(path, sizeof(path), "%s/s", dir);
  chmod(path, dmode);
}

static void test_readonly_directory(void **state) {
  t_state_t *st = *state;
  char path[256];
  chmod(st->dir, 0755); /* the unprivileged child must reach dir/s */
  snprintf(path, sizeof(path), "%s/s", st->dir);
  for (int existing = 0; existing < 2; existing++) {
    if (existing)
      kl_store_destroy(t_open(st->dir, NULL));
    else
      assert_int_equal(mkdir(path, 0755), 0);
    t_chmod_all(st->dir, 0555, 0444);
    pid_t pid = fork(); /* root may write anywhere: drop to nobody */
    assert_true(pid >= 0);
    if (pid == 0)
      _exit(t_child_readonly(st->dir));
    assert_int_equal(t_wait(pid), 0);
    t_chmod_all(st->dir, 0755, 0644);
  }
}

static void t_set_format(const char *dir, uint32_t format) {
  char path[256];
  MDB_env *env;
  MDB_txn *mtxn;
  MDB_dbi dbi;
  snprintf(path, sizeof(path), "%s/s", dir);
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 4), 0);
  assert_int_equal(mdb_env_open(env, path, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &mtxn), 0);
  assert_int_equal(mdb_dbi_open(mtxn, KL__LMDB_META_DB, 0, &dbi), 0);
  MDB_val key = {strlen(KL__LMDB_FORMAT_KEY), KL__LMDB_FORMAT_KEY};
  MDB_val val = {sizeof(format), &format};
  assert_int_equal(mdb_put(mtxn, dbi, &key, &val, 0), 0);
  assert_int_equal(mdb_txn_commit(mtxn), 0);
  mdb_env_close(env);
}

static void test_version_mismatch(void **state) {
  t_state_t *st = *state;
  kl_store_destroy(t_open(st->dir, NULL));
  t_set_format(st->dir, 7);
  kl_store_t *store = NULL;
  assert_int_equal(t_try_open(st->dir, &store, NULL), KL_ESTORE_VERSION);
  assert_null(store);
  assert_non_null(strstr(kl_err_detail(), "format version 7"));
  assert_non_null(strstr(kl_err_detail(), "supports version 1"));
  t_set_format(st->dir, KL__LMDB_FORMAT);
  kl_store_destroy(t_open(st->dir, NULL));
}

static void test_foreign_lmdb_is_refused(void **state) {
  t_state_t *st = *state;
  char path[256];
  MDB_env *env;
  MDB_txn *mtxn;
  MDB_dbi dbi;
  snprintf(path, sizeof(path), "%s/s", st->dir);
  assert_int_equal(mkdir(path, 0755), 0);
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, path, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &mtxn), 0);
  assert_int_equal(mdb_dbi_open(mtxn, NULL, 0, &dbi), 0);
  MDB_val key = {3, "foo"}, val = {3, "bar"};
  assert_int_equal(mdb_put(mtxn, dbi, &key, &val, 0), 0);
  assert_int_equal(mdb_txn_commit(mtxn), 0);
  mdb_env_close(env);
  kl_store_t *store = NULL;
  assert_int_equal(t_try_open(st->dir, &store, NULL), KL_ESTORE_VERSION);
  assert_non_null(strstr(kl_err_detail(), "did not write"));
}

static void test_open_twice_in_one_process(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = t_open(st->dir, NULL);
  kl_store_t *again = NULL;
  assert_int_equal(t_try_open(st->dir, &again, NULL), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "already open"));
  assert_null(again);
  kl_store_destroy(store);
  kl_store_destroy(t_open(st->dir, NULL));
}

static void test_durability_modes(void **state) {
  t_state_t *st = *state;
  const char *modes[] = {"meta", "none", "full"};
  for (int i = 0; i < 3; i++) {
    kl_store_t *store = t_open(st->dir, "store.durability", modes[i], NULL);
    uint64_t epoch = t_acquire(store, 0);
    assert_int_equal(epoch, (uint64_t)i + 1);
    kl_txn_t *txn = t_begin(store, 0, epoch);
    t_put(txn, modes[i], "1");
    t_commit(txn, i + 1);
    kl_store_destroy(store);
  }
  kl_store_t *store = t_open(st->dir, NULL);
  kl_txn_t *txn = t_begin(store, 0, 3);
  assert_string_equal(t_get(txn, "meta"), "1");
  assert_string_equal(t_get(txn, "none"), "1");
  kl_store_abort(txn);
  kl_store_destroy(store);
}

static void test_invalid_arguments(void **state) {
  t_state_t *st = *state;
  kl_store_t *store = NULL;
  assert_int_equal(t_try_open(st->dir, &store, "store.map.size", "8M",
                              "store.map.max", "4M", NULL),
                   KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "store.map.max"));
  assert_int_not_equal(kl_store_open("postgresql://127.0.0.1:1/none", NULL,
                                     &store),
                       KL_OK);
  store = t_open(st->dir, NULL);
  kl_partition_state_t ps;
  kl_txn_t *txn = NULL;
  assert_int_equal(kl_store_acquire(store, TOPIC, -1, &ps), KL_EINVAL);
  assert_int_equal(kl_store_acquire(store, "", 0, &ps), KL_EINVAL);
  assert_int_equal(kl_store_begin(store, TOPIC, 0, 0, &txn), KL_EINVAL);
  txn = t_begin(store, 0, t_acquire(store, 0));
  char big[600];
  memset(big, 'k', sizeof(big));
  assert_int_equal(kl_txn_put(txn, big, 512, "v", 1), KL_EINVAL);
  assert_int_equal(kl_txn_put(txn, big, 0, "v", 1), KL_EINVAL);
  assert_int_equal(kl_txn_put(txn, big, 511, "v", 1), KL_OK);
  assert_int_equal(kl_txn_mark(txn, big, 256, KL_MARK_APPLIED), KL_EINVAL);
  assert_int_equal(kl_txn_mark(txn, big, 255, KL_MARK_APPLIED), KL_OK);
  assert_int_equal(kl_txn_mark(txn, "x", 1, KL_MARK_NONE), KL_EINVAL);
  t_commit(txn, 1);
  kl_store_destroy(store);
  kl_store_destroy(NULL);
  kl_store_abort(NULL);
}

#define T(name) cmocka_unit_test_setup_teardown(name, t_setup, t_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_acquire_increments_and_persists),
      T(test_batch_visibility),
      T(test_seen_and_mark),
      T(test_fenced_commit_applies_nothing),
      T(test_watermark_never_goes_back),
      T(test_counters),
      T(test_scan_order_and_prefix),
      T(test_foreach_partition_order),
      T(test_sweep_bounded_and_keeps_young),
      T(test_sweep_keeps_a_key_for_the_retention),
      T(test_map_grows),
      T(test_map_full_at_max),
      T(test_map_growth_waits_for_open_batches),
      T(test_map_growth_with_own_snapshot_is_busy),
      T(test_threads_commit_while_map_grows),
      T(test_two_processes_share_one_env),
      T(test_other_process_fences_us),
      T(test_readonly_directory),
      T(test_version_mismatch),
      T(test_foreign_lmdb_is_refused),
      T(test_open_twice_in_one_process),
      T(test_durability_modes),
      T(test_invalid_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
