/*
 * keylane-bench's one flag parser (tests/bench/bench_shared.c): counts,
 * switches and text flags in one table, --json and --help.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bench/bench.h"

/* The flags of a store-like benchmark, and what they took. */
typedef struct kl_took {
  int64_t seconds, batch;
  int full, skip_pg, json;
  const char *pg_uri;
} kl_took_t;

static int kl_helped;
static void kl_help(void) {
  kl_helped++;
}

/* Parses the NULL-ended @p args after a benchmark's name into @p took
 * (which starts at the defaults); @returns kl_bench_flags()'s answer. */
static int kl_parse(kl_took_t *took, const char *const *args) {
  *took = (kl_took_t){.seconds = 3, .pg_uri = "none"};
  const kl_bench_flag_t flags[] = {
      {.name = "full", .on = &took->full},
      {.name = "seconds", .max = 600, .out = &took->seconds},
      {.name = "pg", .text = &took->pg_uri},
      {.name = "skip-pg", .on = &took->skip_pg},
      {.name = "batch", .max = 1000, .out = &took->batch},
      {0}};
  /* getopt_long() reorders argv's pointers, never the strings. */
  char *argv[16] = {"bench"};
  int argc = 1;
  for (; argc < 16 && args[argc - 1]; argc++)
    argv[argc] = (char *)args[argc - 1];
  return kl_bench_flags("bench", argc, argv, flags, &took->json, kl_help);
}

/* Each kind takes what it should; flags not given keep their defaults. */
static void test_kinds_in_one_table(void **state) {
  (void)state;
  kl_took_t t;
  const char *const all[] = {"--full", "--seconds", "5", "--pg",
                             "pg://x", "--json",    NULL};
  assert_int_equal(kl_parse(&t, all), 0);
  assert_int_equal(t.full, 1);
  assert_int_equal(t.seconds, 5);
  assert_string_equal(t.pg_uri, "pg://x");
  assert_int_equal(t.json, 1);
  assert_int_equal(t.skip_pg, 0);
  assert_int_equal(t.batch, 0);
  const char *const none[] = {NULL};
  assert_int_equal(kl_parse(&t, none), 0);
  assert_int_equal(t.seconds, 3);
  assert_string_equal(t.pg_uri, "none");
  assert_int_equal(t.full + t.skip_pg + t.json, 0);
}

/* A switch takes no value: the flag after it is a flag of its own. */
static void test_switch_takes_no_value(void **state) {
  (void)state;
  kl_took_t t;
  const char *const args[] = {"--skip-pg", "--batch", "100", NULL};
  assert_int_equal(kl_parse(&t, args), 0);
  assert_int_equal(t.skip_pg, 1);
  assert_int_equal(t.batch, 100);
  const char *const valued[] = {"--full=1", NULL};
  assert_int_equal(kl_parse(&t, valued), 2);
}

/* Bad usage is 2, --help calls the help and is -1. */
static void test_bad_usage_and_help(void **state) {
  (void)state;
  kl_took_t t;
  const char *const no_text[] = {"--pg", NULL};
  const char *const bad_count[] = {"--seconds", "601", NULL};
  const char *const unknown[] = {"--fast", NULL};
  assert_int_equal(kl_parse(&t, no_text), 2);
  assert_int_equal(kl_parse(&t, bad_count), 2);
  assert_int_equal(t.seconds, 3);
  assert_int_equal(kl_parse(&t, unknown), 2);
  const char *const help[] = {"--full", "--help", NULL};
  kl_helped = 0;
  assert_int_equal(kl_parse(&t, help), -1);
  assert_int_equal(kl_helped, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kinds_in_one_table),
      cmocka_unit_test(test_switch_takes_no_value),
      cmocka_unit_test(test_bad_usage_and_help),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
