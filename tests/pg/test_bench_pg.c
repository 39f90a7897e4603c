/*
 * keylane-bench on PostgreSQL, through the real executable
 * (KEYLANE_BUILD_DIR's bin/keylane-bench), each run on its own throwaway
 * server; a figure it did not measure is said to be so, never a zero:
 * - store: a run of one batch size (--batch) reports the ratio it measured
 *   and leaves the others and the batch-1000 target unjudged ("not run",
 *   JSON null), never "MISSED" for a run it did not make;
 * - worker --store pg: LMDB's write-transaction counts are null; the
 *   WAL written per event is the server's.
 * The figures themselves are measured, not tested.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/run.h"
#include "support/skips.h"
#include "support/support.h"

/* Runs the bench at batch 100 (1 s per slice set); skips, as a missing
 * PostgreSQL, when it could not start one. */
static void kl_run_batch_100(int json, kl_t_run_t *r) {
  const char *args[] = {"store",     "--batch", "100",
                        "--seconds", "1",       json ? "--json" : NULL,
                        NULL};
  kl_t_run_for(args, NULL, 0, 120000, r);
  if (r->rc != 0)
    fail_msg("rc %d, stderr: %s", r->rc, r->err);
  const char *skipped = strstr(r->out, "skipped");
  if (skipped) {
    kl_t_missing("postgresql", skipped);
    kl_t_run_free(r);
    skip();
  }
}

static void test_one_batch_size_judges_no_other(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_run_batch_100(1, &r);
  json_t *j = kl_t_run_json(&r);
  json_t *runs = json_object_get(j, "commits");
  assert_int_equal(json_array_size(runs), 2); /* lmdb and postgresql */
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(runs, i), "batch")),
        100);
  double r100 = json_real_value(json_object_get(j, "pg_vs_lmdb_batch_100"));
  assert_true(r100 > 0);
  assert_true(json_is_null(json_object_get(j, "pg_vs_lmdb_batch_1000")));
  assert_true(json_is_null(json_object_get(j, "pg_target_met")));
  json_decref(j);
  kl_t_run_free(&r);
}

static void test_text_says_not_run(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_run_batch_100(0, &r);
  if (!strstr(r.out, "batch 1000 not run (target >= 0.25 at batch 1000: "
                     "not run)"))
    fail_msg("stdout: %s", r.out);
  assert_null(strstr(r.out, "MISSED"));
  kl_t_run_free(&r);
}

static void test_worker_counts_no_lmdb_commits(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run_for((const char *[]){"worker", "--store", "pg", "--events", "20000",
                                "--rounds", "1", "--json", NULL},
               NULL, 0, 120000, &r);
  if (r.rc == 1 && strstr(r.err, "no PostgreSQL server")) {
    kl_t_missing("postgresql", r.err);
    kl_t_run_free(&r);
    skip();
  }
  if (r.rc != 0)
    fail_msg("rc %d, stderr: %s", r.rc, r.err);
  json_t *j = kl_t_run_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "store")),
                      "postgresql");
  assert_true(json_real_value(json_object_get(j, "ratio")) > 0);
  assert_true(json_is_null(json_object_get(j, "commits_per_1000_events")));
  assert_true(json_is_null(json_object_get(j, "fsyncs_per_1000_events")));
  /* what the commits wrote, read from the server: ids alone take more */
  assert_true(json_real_value(json_object_get(j, "wal_bytes_per_event")) > 50);
  /* the commits the store counted: each holds one partition batch or more,
   * and waiting for them is part of the worker's time */
  assert_true(json_real_value(json_object_get(j, "batches_per_commit")) >= 1);
  double share = json_real_value(json_object_get(j, "commit_wait_share"));
  assert_true(share > 0 && share < 1);
  json_decref(j);
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_batch_size_judges_no_other),
      cmocka_unit_test(test_text_says_not_run),
      cmocka_unit_test(test_worker_counts_no_lmdb_commits),
  };
  return cmocka_run_group_tests(tests, kl_t_use_bench, NULL);
}
