/*
 * `-t TOPIC` of the store actions (keylane store stats, outbox, reset) on
 * an LMDB store: a topic the store holds no partition of is an error, exit
 * 1, that names the topics it does hold, with --json as without (nothing
 * on stdout), never an empty answer that exits 0. A topic it holds is
 * shown as before.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/store.h"
#include "support/run.h"
#include "support/support.h"
#include "store/store_internal.h"

/* A store holding partition 0 of each of @p topics. */
static void t_store_with(const char *dir, const char *const *topics) {
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  for (size_t i = 0; topics[i]; i++) {
    kl_partition_state_t st;
    kl_txn_t *txn;
    assert_int_equal(kl_store_acquire(store, topics[i], 0, &st), KL_OK);
    assert_int_equal(kl_store_begin(store, topics[i], 0, st.epoch, &txn),
                     KL_OK);
    assert_int_equal(kl_store_commit(txn, 7), KL_OK);
  }
  kl_store_destroy(store);
}

/* keylane @p args exits 1, prints nothing on stdout and says @p want on
 * stderr. */
static void t_refused(const char *const *args, const char *want) {
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 30000, &r);
  if (r.rc != 1 || r.out[0] || !strstr(r.err, want))
    fail_msg("keylane %s %s -t %s: exit %d, want 1 saying \"%s\"\nstdout: "
             "%s\nstderr: %s",
             args[0], args[1], args[3], r.rc, want, r.out, r.err);
  kl_t_run_free(&r);
}

static void test_unknown_topic_names_the_known(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store_with(dir, (const char *[]){"events", "orders", NULL});
  const char *want = "has no partition of topic evnts; it has topics "
                     "events, orders: check -t and --store";
  t_refused(
      (const char *[]){"store", "stats", "-t", "evnts", "--store", dir, NULL},
      want);
  t_refused((const char *[]){"store", "stats", "-t", "evnts", "--store", dir,
                             "--json", NULL},
            want);
  t_refused(
      (const char *[]){"store", "outbox", "-t", "evnts", "--store", dir, NULL},
      want);
  t_refused((const char *[]){"store", "outbox", "-t", "evnts", "--store", dir,
                             "--json", NULL},
            want);
  t_refused((const char *[]){"store", "outbox", "-t", "evnts", "--store", dir,
                             "--drop", "0:1", NULL},
            want);
  t_refused((const char *[]){"store", "reset", "-t", "evnts", "--store", dir,
                             "-p", "all", NULL},
            want);

  /* A topic it holds: shown, exit 0. */
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"store", "stats", "-t", "orders", "--store",
                                dir, "--json", NULL},
               NULL, 0, 30000, &r);
  if (r.rc != 0 || !strstr(r.out, "\"topic\":\"orders\"") ||
      strstr(r.out, "\"topic\":\"events\""))
    fail_msg("store stats -t orders: exit %d\nstdout: %s\nstderr: %s", r.rc,
             r.out, r.err);
  kl_t_run_free(&r);
  kl_t_run_for(
      (const char *[]){"store", "outbox", "-t", "orders", "--store", dir, NULL},
      NULL, 0, 30000, &r);
  if (r.rc != 0 || !strstr(r.out, "the outbox is empty"))
    fail_msg("store outbox -t orders: exit %d\nstdout: %s\nstderr: %s", r.rc,
             r.out, r.err);
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

/* A store no worker has taken a partition of yet: said so. */
/* A recorded group is any text `store bind -g` took: a newline in it is
 * escaped by `store stats`, not printed as a forged line of its own (third
 * attack, L1). */
static void test_owner_is_printed_escaped(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store_with(dir, (const char *[]){"events", NULL});
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl__store_owner_t owner;
  assert_int_equal(
      kl__store_owner_make(&owner, "real",
                           "fleet\nowner of topic events: Kafka cluster FAKE"),
      KL_OK);
  assert_int_equal(kl__store_bind(store, "events", &owner), KL_OK);
  kl_store_destroy(store);
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "stats", "--store", dir, NULL}, NULL, 0,
           &r);
  assert_int_equal(r.rc, 0);
  if (strstr(r.out, "\nowner of topic events: Kafka cluster FAKE") ||
      !strstr(r.out, "Kafka cluster real, group fleet\\x0aowner"))
    fail_msg("store stats printed the group unescaped:\n%s", r.out);
  kl_t_run_free(&r);
  kl_t_rmrf(dir);
}

static void test_store_without_partitions(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  t_store_with(dir, (const char *[]){NULL});
  t_refused((const char *[]){"store", "stats", "-t", "events", "--store", dir,
                             "--json", NULL},
            "has no partition of topic events, nor of any other: no worker "
            "has taken one there yet");
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unknown_topic_names_the_known),
      cmocka_unit_test(test_store_without_partitions),
      cmocka_unit_test(test_owner_is_printed_escaped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
