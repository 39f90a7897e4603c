/*
 * keylane ledger on a store two topics share: without -t it sums every
 * topic's entry of a key, with -t TOPIC it prints that topic's alone
 * (issue 39's second attack, LOW-6: there was no -t, and a fleet could not
 * read its own balances in a shared store).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "keylane/handlers.h"
#include "keylane/store.h"
#include "support/run.h"
#include "support/support.h"

/* Applies a credit of @p amount to @p key on @p topic's partition 0, as
 * the worker does: handler, then commit. */
static void t_credit(kl_store_t *store, const char *topic, const char *key,
                     const char *id, int amount) {
  kl_partition_state_t ps;
  assert_int_equal(kl_store_partition(store, topic, 0, &ps), KL_OK);
  if (!ps.epoch)
    assert_int_equal(kl_store_acquire(store, topic, 0, &ps), KL_OK);
  const unsigned char payload[] = {
      0x82, 0xa6, 'a', 'm', 'o', 'u', 'n', 't', (unsigned char)amount,
      0xa3, 's',  'e', 'q', 0x01};
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = "credit",
                   .type_len = 6,
                   .ts = 1,
                   .payload = payload,
                   .payload_len = sizeof(payload)};
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, topic, 0, ps.epoch, &txn), KL_OK);
  kl_fence_t fence = {topic, 0, ps.epoch, ps.watermark};
  char why[256] = "";
  if (kl_ledger_handler(NULL, &ev, &fence, txn, why, sizeof(why)) !=
      KL_HANDLER_OK)
    fail_msg("credit %s on %s: %s", key, topic, why);
  assert_int_equal(kl_store_commit(txn, ps.watermark + 1), KL_OK);
}

/* `keylane ledger --store DIR`, with `-t @p topic` unless NULL; its line
 * "total\t..." must hold @p total. */
static void t_ledger_says(const char *dir, const char *topic,
                          const char *total) {
  kl_t_run_t r;
  const char *args[] = {"ledger", "--store", dir, topic ? "-t" : NULL,
                        topic,    NULL};
  kl_t_run(args, NULL, 0, &r);
  if (r.rc != 0 || !strstr(r.out, total))
    fail_msg("keylane ledger -t %s: exit %d, no \"%s\" in:\n%s%s",
             topic ? topic : "(none)", r.rc, total, r.out, r.err);
  kl_t_run_free(&r);
}

static void test_ledger_scopes_to_one_topic(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  t_credit(store, "t8", "k0", "a1", 10);
  t_credit(store, "t8", "k1", "a2", 20);
  t_credit(store, "t9", "k0", "b1", 5);
  kl_store_destroy(store);

  t_ledger_says(dir, NULL, "total\tkeys=2\tbalance=35\t");
  t_ledger_says(dir, "t8", "total\tkeys=2\tbalance=30\t");
  t_ledger_says(dir, "t9", "total\tkeys=1\tbalance=5\t");

  /* A topic the store does not hold is an error naming the ones it holds
   * (third attack, M3: an empty ledger with exit 0 read as no balances). */
  kl_t_run_t r;
  kl_t_run((const char *[]){"ledger", "--store", dir, "-t", "t10", NULL}, NULL,
           0, &r);
  if (r.rc != 1 || !strstr(r.err, "t10") || !strstr(r.err, "t8") ||
      !strstr(r.err, "t9") || r.out[0])
    fail_msg("-t t10: exit %d, stdout: %s, stderr: %s", r.rc, r.out, r.err);
  kl_t_run_free(&r);

  kl_t_run((const char *[]){"ledger", "--store", dir, "--topic", "t9", "--json",
                            NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  json_t *doc = kl_t_run_json(&r);
  assert_string_equal(json_string_value(json_object_get(doc, "topic")), "t9");
  json_t *k0 = json_object_get(json_object_get(doc, "balances"), "k0");
  assert_int_equal(json_integer_value(json_object_get(k0, "balance")), 5);
  json_decref(doc);
  kl_t_run_free(&r);

  /* A name Kafka would refuse is a usage error, naming the rule. */
  kl_t_run((const char *[]){"ledger", "--store", dir, "-t", "a/b", NULL}, NULL,
           0, &r);
  if (r.rc != 2 || !strstr(r.err, "a/b"))
    fail_msg("-t a/b: exit %d, stderr: %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"ledger", "--help", NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "-t, --topic TOPIC"));
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ledger_scopes_to_one_topic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
