#include "support/ledger_checks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "support/run.h"
#include "support/support.h"
#include "store/store_internal.h"

void kl_t_ledger_fx_up(kl_t_ledger_fx_t *fx, const char *topic, int partitions,
                       int keys, uint64_t seed, const char *store_uri) {
  memset(fx, 0, sizeof(*fx));
  if (store_uri) {
    snprintf(fx->where, sizeof(fx->where), "%s", store_uri);
  } else {
    kl_t_tmpdir(fx->dir);
    snprintf(fx->where, sizeof(fx->where), "%s", fx->dir);
  }
  assert_int_equal(kl_t_cluster_new(1, topic, partitions, &fx->cluster), KL_OK);
  fx->boot = kl_t_bootstrap(fx->cluster);
  fx->topic = kl_t_topic(fx->cluster);
  fx->partitions = partitions;
  assert_int_equal(kl_store_open(fx->where, NULL, &fx->store), KL_OK);
  fx->gen = kl__ledger_gen_new(keys, partitions, seed);
  fx->producer = kl_t_producer(fx->boot, fx->gen);
  assert_non_null(fx->producer);
}

void kl_t_ledger_fx_down(kl_t_ledger_fx_t *fx) {
  kl_producer_destroy(fx->producer);
  kl__ledger_gen_destroy(fx->gen);
  kl_store_destroy(fx->store);
  kl_t_cluster_destroy(fx->cluster);
  if (fx->dir[0])
    kl_t_rmrf(fx->dir);
}

void kl_t_ledger_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                         const char *topic, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(gen, producer, topic), KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
}

void kl_t_ledger_assert_verified(const kl__ledger_gen_t *gen, kl_store_t *store,
                                 const char *topic) {
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(gen, store, topic, &v), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.keys_ok, v.keys);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(gen));
  assert_true(v.ok);
}

void kl_t_ledger_fx_publish(kl_t_ledger_fx_t *fx, int n) {
  kl_t_ledger_publish(fx->gen, fx->producer, fx->topic, n);
}

void kl_t_ledger_fx_assert_verified(kl_t_ledger_fx_t *fx) {
  kl_t_ledger_assert_verified(fx->gen, fx->store, fx->topic);
}

void kl_t_ledger_fx_assert_applied_once(kl_t_ledger_fx_t *fx, kl_t_worker_t *w,
                                        uint64_t events, uint64_t duplicates,
                                        int ms) {
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 0, ms),
                   0);
  assert_int_equal(kl_t_workers_applied(&w, 1, events, 5000), events);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.duplicates, duplicates);
  assert_int_equal(st.fenced, 0);
}

static int kl_t_count_cb(void *opaque, uint64_t seq, const void *rec,
                         size_t len) {
  (void)seq, (void)rec, (void)len;
  (*(size_t *)opaque)++;
  return 0;
}

size_t kl_t_outbox_held(kl_store_t *store, const char *topic, int partitions) {
  size_t n = 0;
  for (int p = 0; p < partitions; p++)
    assert_int_equal(
        kl__store_outbox_list(store, topic, p, 0, SIZE_MAX, kl_t_count_cb, &n),
        KL_OK);
  return n;
}

kl_store_t *kl_t_ledger_fx_rebuild(kl_t_ledger_fx_t *fx, const char *where,
                                   const char *group, const char *says) {
  char group_x[300];
  snprintf(group_x, sizeof(group_x), "worker.group=%s",
           group ? group : "keylane");
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "rebuild", "-b", fx->boot, "-t", fx->topic,
                            "--store", where, "--handler", "ledger", "-X",
                            group_x, NULL},
           NULL, 0, &r);
  if (r.rc != 0)
    fail_msg("store rebuild exited %d: %s", r.rc, r.err);
  if (says && !strstr(r.err, says))
    fail_msg("store rebuild did not say \"%s\": %s", says, r.err);
  kl_t_run_free(&r);
  kl_store_t *store;
  assert_int_equal(kl_store_open(where, NULL, &store), KL_OK);
  return store;
}

typedef struct kl_t_ledger_row {
  const char *key;
  kl_ledger_entry_t *e;
  int found;
} kl_t_ledger_row_t;

static int kl_t_ledger_row(void *opaque, const void *key, size_t key_len,
                           const kl_ledger_entry_t *e) {
  kl_t_ledger_row_t *row = opaque;
  if (key_len == strlen(row->key) && memcmp(key, row->key, key_len) == 0)
    *row->e = *e, row->found = 1;
  return row->found;
}

int kl_t_ledger_find(kl_store_t *store, const char *topic, const char *key,
                     kl_ledger_entry_t *e) {
  kl_t_ledger_row_t row = {key, e, 0};
  memset(e, 0, sizeof(*e));
  assert_int_equal(kl__ledger_walk(store, topic, kl_t_ledger_row, &row), KL_OK);
  return row.found;
}

int64_t kl_t_ledger_balance(kl_store_t *store, const char *key) {
  kl_ledger_entry_t e;
  return kl_t_ledger_find(store, NULL, key, &e) ? e.balance : INT64_MIN;
}
