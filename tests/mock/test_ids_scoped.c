/*
 * Idempotency keys scoped by entity key, and follow-ups' ids in a space
 * of their own, on the embedded cluster with the ledger handler:
 *  - a client id that reads like a follow-up's ("invoice/42/0") cannot take
 *    the credit of transfer "invoice/42": money is conserved;
 *  - an id beginning with '~' (the follow-ups' space) is refused to a
 *    client, by kl_publish() and by `keylane publish`; one another
 *    producer wrote is a dead letter (reserved_id) unless it is a
 *    follow-up's, and a follow-up's id no producer can know in advance;
 *  - one id on two keys names two events: a live worker whose lane of one
 *    key waits on a dead letter applies both, and `keylane store rebuild`
 *    from the log builds the same balances.
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

#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/kafka_read.h"
#include "support/ledger_checks.h"
#include "support/run.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "cli/ledger_gen.h"

/* The balance of @p key in @p store; INT64_MIN when it has none. */
static int64_t balance_of(kl_store_t *store, const char *key) {
  kl_ledger_entry_t e;
  return kl_t_ledger_find(store, NULL, key, &e) ? e.balance : INT64_MIN;
}

/* Waits until @p w applied @p applied events and dead-lettered
 * @p dead. */
static void wait_applied(kl_t_worker_t *w, uint64_t applied, uint64_t dead) {
  kl_worker_stats_t st = {0};
  for (int i = 0;
       i < 600 && !(st.applied >= applied && st.dead_letters >= dead); i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  assert_int_equal(st.applied, applied);
  assert_int_equal(st.dead_letters, dead);
}

/* The probe that lost money: the credit of transfer "invoice/42" was
 * suppressed because a client had used "invoice/42/0", the id the credit
 * was given. */
static void test_client_id_cannot_take_a_follow_ups(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "taken", 4, 4, 3, NULL);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "taken"), fx.store, NULL);
  assert_int_equal(kl__ledger_gen_send(fx.producer, fx.topic, "acct-3", 6,
                                       "invoice/42/0", "credit", 7, 1, NULL),
                   KL_OK);
  assert_int_equal(kl__ledger_gen_send_transfer(fx.producer, fx.topic, "acct-1",
                                                "acct-2", "invoice/42", 10, 1,
                                                NULL),
                   KL_OK);
  assert_int_equal(kl_flush(fx.producer, 10000), KL_OK);
  wait_applied(w, 3, 0); /* the credit, the transfer and its credit */
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "acct-1"), -10);
  assert_int_equal(balance_of(fx.store, "acct-2"), 10);
  assert_int_equal(balance_of(fx.store, "acct-3"), 7);
  kl_t_ledger_fx_down(&fx);
}

static void letter_reason(void *opaque, const rd_kafka_message_t *m, int i) {
  (void)i;
  rd_kafka_headers_t *h = NULL;
  rd_kafka_message_headers(m, &h);
  kl_t_header(h, "keylane.dlq.reason", opaque, 32);
}

/* The probes that lost money (issue 33, finding 1): a producer that is
 * not keylane's writes a credit with the id the next transfer's credit
 * would have had, "~TOPIC/0/2/0", and one with a '~' id that is no
 * follow-up's. The first was applied and the real credit suppressed as
 * its duplicate (c = 1 + 5); the second applied too. Now a follow-up's id
 * carries a nonce no producer knows, so the real credit applies, and the
 * second is a dead letter of reason reserved_id; the partition goes on. */
static void test_raw_reserved_id_takes_no_follow_ups_place(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "rawtilde", 1, 1, 3, NULL);
  char guessed[128];
  snprintf(guessed, sizeof(guessed), "~%s/0/2/0", fx.topic);
  /* offsets 0 and 1, past every check of kl_publish() */
  assert_int_equal(kl_t_produce_credit(fx.boot, fx.topic, 0, "c", guessed, 1),
                   0);
  assert_int_equal(kl_t_produce_credit(fx.boot, fx.topic, 0, "c", "~nope", 5),
                   0);
  assert_int_equal(kl__ledger_gen_send_transfer(fx.producer, fx.topic, "a", "c",
                                                "t1", 100, 1, NULL),
                   KL_OK); /* offset 2; its credit 3 */
  assert_int_equal(kl_flush(fx.producer, 10000), KL_OK);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "rawtilde"), fx.store, NULL);
  wait_applied(w, 3, 1); /* the guessed id, the transfer and its credit */
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "a"), -100);
  assert_int_equal(balance_of(fx.store, "c"), 101);
  char dlq[160], reason[32] = "";
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx.topic);
  rd_kafka_t *rk =
      kl_t_consumer(fx.boot, kl_t_group(fx.cluster, "rawtilde-dlq"), dlq);
  assert_non_null(rk);
  assert_int_equal(kl_t_consume(rk, 1, 20000, letter_reason, reason), 1);
  kl_t_consumer_destroy(rk);
  assert_string_equal(reason, "reserved_id");
  kl_t_ledger_fx_down(&fx);
}

/* A client may not publish into the follow-ups' space. */
static void test_reserved_ids_are_refused(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "reserved", 1, 1, 3, NULL);
  kl_event_t ev = {.key = "k",
                   .key_len = 1,
                   .id = "~events/0/1/0",
                   .id_len = 13,
                   .type = "credit",
                   .type_len = 6};
  assert_int_equal(kl_publish(fx.producer, fx.topic, &ev, NULL), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "begins with '~'"));
  ev.id = "a~b";
  ev.id_len = 3;
  assert_int_equal(kl_publish(fx.producer, fx.topic, &ev, NULL), KL_OK);
  assert_int_equal(kl_flush(fx.producer, 10000), KL_OK);
  const char line[] = "{\"key\":\"k\",\"type\":\"credit\",\"id\":\"~x\"}\n";
  kl_t_run_t r;
  kl_t_run((const char *[]){"publish", "-b", fx.boot, "-t", fx.topic, NULL},
           line, sizeof(line) - 1, &r);
  assert_int_not_equal(r.rc, 0);
  if (!strstr(r.err, "begins with '~'"))
    fail_msg("keylane publish did not name the reserved id: %s", r.err);
  kl_t_run_free(&r);
  kl_t_ledger_fx_down(&fx);
}

/* Types beginning with '~' are keylane's: kl_publish() refuses one, and
 * a record of one that another producer wrote is a dead letter of reason
 * reserved_id; the key's next event is applied. */
static void test_reserved_types_are_dead_letters(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "rtypes", 1, 1, 3, NULL);
  const unsigned char credit[] = {0x82, 0xa6, 'a',  'm', 'o', 'u', 'n',
                                  't',  0x07, 0xa3, 's', 'e', 'q', 0x01};
  kl_event_t ev = {.key = "d",
                   .key_len = 1,
                   .id = "tilde",
                   .id_len = 5,
                   .type = "~credit",
                   .type_len = 7,
                   .payload = credit,
                   .payload_len = sizeof(credit)};
  assert_int_equal(kl_publish(fx.producer, fx.topic, &ev, NULL), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "begins with '~'"));
  void *env;
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &env, &len), KL_OK);
  assert_int_equal(kl_t_produce_raw(fx.boot, fx.topic, 0, "d", env, len, NULL),
                   0);
  free(env);
  assert_int_equal(kl_t_produce_credit(fx.boot, fx.topic, 0, "d", "now", 5), 0);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "rtypes"), fx.store, NULL);
  wait_applied(w, 1, 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "d"), 5);
  char dlq[160], reason[32] = "";
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx.topic);
  rd_kafka_t *rk =
      kl_t_consumer(fx.boot, kl_t_group(fx.cluster, "rtypes-dlq"), dlq);
  assert_non_null(rk);
  assert_int_equal(kl_t_consume(rk, 1, 20000, letter_reason, reason), 1);
  kl_t_consumer_destroy(rk);
  assert_string_equal(reason, "reserved_id");
  kl_t_ledger_fx_down(&fx);
}

/* The probe whose outcome depended on timing: on one partition, B's first
 * event fails (its dead letter holds B's lane), then B and C publish the
 * same id "X". Both are events of their own key: both apply, live and in
 * a store rebuilt from the log. */
static void test_shared_id_live_equals_rebuild(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "shared", 1, 2, 3, NULL);
  const char *extra[] = {"worker.concurrency=4", NULL};
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "shared"), fx.store, extra);
  kl_producer_t *p = fx.producer;
  assert_int_equal(
      kl__ledger_gen_send(p, fx.topic, "B", 1, "p1", "debit", -1, 1, NULL),
      KL_OK); /* not positive: a dead letter */
  assert_int_equal(
      kl__ledger_gen_send(p, fx.topic, "B", 1, "X", "credit", 5, 2, NULL),
      KL_OK);
  assert_int_equal(
      kl__ledger_gen_send(p, fx.topic, "C", 1, "X", "credit", 7, 1, NULL),
      KL_OK);
  assert_int_equal(
      kl__ledger_gen_send(p, fx.topic, "C", 1, "X", "credit", 7, 1, NULL),
      KL_OK); /* C's own copy: a duplicate */
  assert_int_equal(kl_flush(p, 10000), KL_OK);
  wait_applied(w, 2, 1);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(balance_of(fx.store, "B"), 5);
  assert_int_equal(balance_of(fx.store, "C"), 7);

  char rebuilt[96];
  snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
  kl_store_t *copy = kl_t_ledger_fx_rebuild(&fx, rebuilt, NULL, NULL);
  assert_int_equal(balance_of(copy, "B"), 5);
  assert_int_equal(balance_of(copy, "C"), 7);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_client_id_cannot_take_a_follow_ups),
      cmocka_unit_test(test_reserved_ids_are_refused),
      cmocka_unit_test(test_raw_reserved_id_takes_no_follow_ups_place),
      cmocka_unit_test(test_reserved_types_are_dead_letters),
      cmocka_unit_test(test_shared_id_live_equals_rebuild),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
