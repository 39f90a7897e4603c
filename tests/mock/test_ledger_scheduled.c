/*
 * The ledger's scheduled transfer (issue 36): a "transfer" with "at"
 * reserves its amount at once (debited, held) and emits to its own key a
 * "settle" delayed until "at", which releases the hold and emits the
 * destination's credit, once, only when the store's clock
 * (kl_t_store_clock_set()) reached "at". On LMDB and PostgreSQL.
 *  - while it waits: the source debited and holding, no credit, one timer
 *    on the source's partition due at "at"; a copy of the transfer holds
 *    nothing more; the key's later events go on;
 *  - a settle published by a service (its id is no follow-up's) and a
 *    scheduled transfer with an "at" that is not positive are dead
 *    letters, holding and releasing nothing;
 *  - at its time: the hold released, the destination credited once, the
 *    source's entry counting one delayed event applied.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "common/internal.h"
#include "keylane/handlers.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "support/timer_checks.h"
#include "handlers/ledger.h"
#include "store/store_internal.h"
#include "store/timers.h"

static char t_dest[16]; /* on another partition than "src" */

/* Publishes ledger event @p type of @p key with the payload @p a. */
static void publish(kl_t_ledger_fx_t *fx, const char *key, const char *id,
                    const char *type, const kl_ledger_args_t *a) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, a);
  kl_t_timers_publish(fx, key, id, type, sb.data, sb.size, 0);
  msgpack_sbuffer_destroy(&sb);
}

/* A transfer of 7 from "src" to t_dest with seq @p seq, settling at
 * @p at (0: none). */
static void publish_transfer(kl_t_ledger_fx_t *fx, const char *id, int64_t seq,
                             int64_t at) {
  kl_ledger_args_t a = {.amount = 7,
                        .seq = seq,
                        .has_seq = 1,
                        .to = t_dest,
                        .to_len = strlen(t_dest),
                        .at = at,
                        .has_at = at != 0};
  publish(fx, "src", id, "transfer", &a);
}

/* Waits until @p w's counts reach these, then checks they are exactly
 * these, and none early. */
static void wait_stats(kl_t_worker_t *w, uint64_t applied, uint64_t scheduled,
                       uint64_t duplicates, uint64_t failed) {
  kl_t_timers_wait(w, (kl_t_timers_want_t){.applied = applied,
                                           .scheduled = scheduled,
                                           .duplicates = duplicates,
                                           .failed = failed,
                                           .dead = KL_T_ANY,
                                           .fired = KL_T_ANY});
}
static size_t pending_n;
static int64_t pending_due;

static int pending_one(void *opaque, const kl__timer_t *t, const void *key,
                       size_t key_len, const void *env, size_t env_len) {
  (void)opaque, (void)env, (void)env_len;
  assert_int_equal(key_len, 3);
  assert_memory_equal(key, "src", 3); /* the settle waits on its source */
  pending_n++;
  pending_due = t->due_ms;
  return 0;
}

static size_t pending(kl_store_t *store, const char *topic, int32_t partition) {
  size_t bad = 0;
  pending_n = 0;
  assert_int_equal(
      kl__timers_scan(store, topic, partition, pending_one, NULL, &bad), KL_OK);
  assert_int_equal(bad, 0);
  return pending_n;
}

static kl_ledger_entry_t entry_of(kl_store_t *store, const char *key) {
  kl_ledger_entry_t e;
  kl_t_ledger_find(store, NULL, key, &e);
  return e;
}

static void scheduled_case(const char *name, const char *store_uri) {
  int64_t t0 = kl__now_ms(), at = t0 + 60000;
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 2, 1, 5, store_uri);
  int32_t src_p = kl_partition("src", 3, 2), dest_p = src_p;
  for (int i = 0; dest_p == src_p; i++) {
    snprintf(t_dest, sizeof(t_dest), "dest-%d", i);
    dest_p = kl_partition(t_dest, strlen(t_dest), 2);
  }
  publish_transfer(&fx, "sched-1", 1, at);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, NULL, kl_ledger_handler, NULL);
  kl_t_worker_go(w);
  /* reserved at once: debited and held; its settle waits as a timer of
   * its own key, due at "at"; nothing credited */
  wait_stats(w, 1, 1, 0, 0);
  kl_ledger_entry_t src = entry_of(fx.store, "src");
  assert_int_equal(src.balance, -7);
  assert_int_equal(src.held, 7);
  assert_int_equal(src.last_seq, 1);
  assert_int_equal(src.delayed, 0);
  assert_int_equal(pending(fx.store, fx.topic, src_p), 1);
  assert_int_equal(pending_due, at);
  assert_int_equal(pending(fx.store, fx.topic, dest_p), 0);
  assert_int_equal(entry_of(fx.store, t_dest).balance, 0);

  /* a copy holds nothing more; a settle from a service and a scheduled
   * transfer with no time fail; the key's later events go on */
  kl_t_store_clock_set(at - 1);
  publish_transfer(&fx, "sched-1", 1, at);
  kl_ledger_args_t forged = {
      .amount = 7, .to = t_dest, .to_len = strlen(t_dest)};
  publish(&fx, "src", "forged-settle", "settle", &forged);
  publish_transfer(&fx, "sched-bad", 2, -5);
  kl_ledger_args_t credit = {.amount = 100, .seq = 2, .has_seq = 1};
  publish(&fx, "src", "marker", "credit", &credit);
  wait_stats(w, 2, 1, 1, 2);
  src = entry_of(fx.store, "src");
  assert_int_equal(src.balance, 93);
  assert_int_equal(src.held, 7);
  assert_int_equal(src.violations, 0);
  assert_int_equal(entry_of(fx.store, t_dest).balance, 0);
  assert_int_equal(pending(fx.store, fx.topic, src_p), 1);

  /* its time: settled once, the hold released, the credit applied */
  kl_t_store_clock_set(at);
  wait_stats(w, 4, 1, 1, 2);
  assert_int_equal(pending(fx.store, fx.topic, src_p), 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  src = entry_of(fx.store, "src");
  assert_int_equal(src.balance, 93);
  assert_int_equal(src.held, 0);
  assert_int_equal(src.delayed, 1);
  kl_ledger_entry_t dest = entry_of(fx.store, t_dest);
  assert_int_equal(dest.balance, 7);
  assert_int_equal(dest.held, 0);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_scheduled_transfer(void **state) {
  (void)state;
  scheduled_case("lsched", NULL);
}

static void test_scheduled_transfer_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "lsched", uri, sizeof(uri)), 0);
  scheduled_case("lschedpg", uri);
}

/* The entry's layouts: a hold or a delayed count takes the longest, an
 * entry without either keeps what an older keylane wrote and reads. */
static void test_entry_layouts(void **state) {
  (void)state;
  unsigned char v[KL_LEDGER_VALUE_HELD_LEN] = {0};
  kl_ledger_entry_t e;
  v[7] = 5, v[39] = 7, v[47] = 2;
  assert_int_equal(kl__ledger_decode(v, KL_LEDGER_VALUE_HELD_LEN, &e), 0);
  assert_int_equal(e.balance, 5);
  assert_int_equal(e.held, 7);
  assert_int_equal(e.delayed, 2);
  assert_int_equal(kl__ledger_decode(v, KL_LEDGER_VALUE_LEN, &e), 0);
  assert_int_equal(e.held, 0);
  assert_int_equal(kl__ledger_decode(v, 40, &e), -1);
  /* "at" read and written back; twice is refused */
  kl_ledger_args_t a = {.amount = 3, .at = 1767225600000, .has_at = 1}, b;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, &a);
  const char *twice;
  assert_int_equal(kl__ledger_payload(sb.data, sb.size, &b, &twice), 0);
  assert_null(twice);
  assert_true(b.has_at);
  assert_int_equal(b.at, 1767225600000);
  msgpack_sbuffer_destroy(&sb);
  static const unsigned char two_ats[] = {0x82, 0xa2, 'a', 't', 0x01,
                                          0xa2, 'a',  't', 0x02};
  assert_int_equal(kl__ledger_payload(two_ats, sizeof(two_ats), &b, &twice), 0);
  assert_string_equal(twice, "at");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry_layouts),
      cmocka_unit_test(test_scheduled_transfer),
      cmocka_unit_test(test_scheduled_transfer_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
