/*
 * keylane-bench worker refuses, before it starts anything, a run larger
 * than its embedded cluster holds: it used to load the events, lose the
 * oldest to the mock's retention and wait minutes for a worker that could
 * never catch up. The figures themselves are measured, not tested; the
 * targets it prints are.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "support/run.h"
#include "support/support.h"

static void kl_assert_refused(const char *const *args, const char *says) {
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 30000, &r);
  assert_int_equal(r.rc, 2);
  if (!strstr(r.err, says))
    fail_msg("stderr: %s", r.err);
  kl_t_run_free(&r);
}

static void test_more_events_than_the_cluster_holds(void **state) {
  (void)state;
  kl_assert_refused(
      (const char *[]){"worker", "--events", "1000001", NULL},
      "--events 1000001 with --transfers 0 is more than the embedded "
      "cluster's 64 partitions hold (1000000 records, the mock's "
      "retention); give at most --events 1000000");
  kl_assert_refused(
      (const char *[]){"worker", "--store", "pg", "--events", "250001", NULL},
      "16 partitions hold (250000 records");
}

/* A transfer's credit is a record too. */
static void test_transfers_count_their_credits(void **state) {
  (void)state;
  kl_assert_refused((const char *[]){"worker", "--events", "900000",
                                     "--transfers", "25", NULL},
                    "give at most --events 800000");
}

/* The PostgreSQL fleet path's target is issue 37's 0.35, in the help as in
 * `keylane-bench all`'s table: the help said 0.20. */
static void test_pg_target_is_the_issues(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"worker", "--help", NULL}, NULL, 0, 30000, &r);
  assert_int_equal(r.rc, 0);
  if (!strstr(r.out, "(target ratio >= 0.35)"))
    fail_msg("stdout: %s", r.out);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pg_target_is_the_issues),
      cmocka_unit_test(test_more_events_than_the_cluster_holds),
      cmocka_unit_test(test_transfers_count_their_credits),
  };
  return cmocka_run_group_tests(tests, kl_t_use_bench, NULL);
}
