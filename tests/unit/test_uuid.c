/*
 * The random bits of the ids kl_publish() makes (event/uuid.c): each
 * thread draws its own from getrandom(), and a child after fork() never
 * repeats its parent's ids.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/internal.h"
#include "event/envelope.h"
#include "event/uuid.h"

/* The 62 random bits of a UUIDv7 (after the variant), as 16 hex digits
 * with the variant's two bits cleared. */
static uint64_t id_rand_b(const char *id) {
  char hex[17];
  memcpy(hex, id + 19, 4);
  memcpy(hex + 4, id + 24, 12);
  hex[16] = '\0';
  return strtoull(hex, NULL, 16) & UINT64_C(0x3fffffffffffffff);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* How many values of @p v (sorted in place) occur more than once. */
static int repeats(uint64_t *v, size_t n) {
  qsort(v, n, sizeof(*v), cmp_u64);
  int r = 0;
  for (size_t i = 1; i < n; i++)
    r += v[i] == v[i - 1];
  return r;
}

enum { THREADS = 4, PER_THREAD = 5000 };
static uint64_t thread_bits[THREADS * PER_THREAD];

static void *draw_ids(void *arg) {
  uint64_t *bits = arg;
  char id[37];
  for (int i = 0; i < PER_THREAD; i++) {
    kl_event_make_id(id);
    bits[i] = id_rand_b(id);
  }
  return NULL;
}

/* The ids' counter keeps them unique whatever the random bits are; these
 * must be random all the same (RFC 9562 6.9: unguessable), and no two
 * threads may draw the same stream: 20,000 draws of 62 bits repeat none
 * (the odds of a repeat are 2^-34), across every refill of the pools. */
static void test_random_bits_threads(void **state) {
  (void)state;
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(
        pthread_create(&t[i], NULL, draw_ids, thread_bits + i * PER_THREAD), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  int ones = 0;
  for (size_t i = 0; i < THREADS * PER_THREAD; i++)
    ones += __builtin_popcountll(thread_bits[i]);
  /* 1,240,000 bits: half of them set, give or take 0.005 (11 sigma) */
  double share = (double)ones / (62.0 * THREADS * PER_THREAD);
  if (share < 0.495 || share > 0.505)
    fail_msg("%.4f of the random bits are set, not half", share);
  assert_int_equal(repeats(thread_bits, THREADS * PER_THREAD), 0);
}

enum { FORK_IDS = 200 };

/* Ids made at one given ms, as parent and child would in the same ms. */
static void make_ids(int64_t at, char ids[FORK_IDS][37]) {
  for (int i = 0; i < FORK_IDS; i++)
    kl__event_make_id_at(ids[i], at);
}

/* A child after fork() inherits its parent's memory, the thread's pool of
 * random bytes too: drawing from it, parent and child made the same ids
 * in the same ms, and the store took the second event of such a pair for
 * a duplicate of the first and dropped it. */
static void test_fork_ids_differ(void **state) {
  (void)state;
  char id[37];
  for (int i = 0; i < 5; i++) /* a pool in use when the process forks */
    kl_event_make_id(id);
  int64_t at = kl__now_ms() + 60000; /* above every id made so far */
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    static char child[FORK_IDS][37];
    make_ids(at, child);
    ssize_t n = write(fd[1], child, sizeof(child));
    _exit(n == (ssize_t)sizeof(child) ? 0 : 1);
  }
  close(fd[1]);
  static char parent[FORK_IDS][37], child[FORK_IDS][37];
  make_ids(at, parent);
  size_t got = 0;
  ssize_t n;
  while (got < sizeof(child) &&
         (n = read(fd[0], (char *)child + got, sizeof(child) - got)) > 0)
    got += (size_t)n;
  close(fd[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_int_equal(got, sizeof(child));
  int same = 0;
  for (int i = 0; i < FORK_IDS; i++)
    for (int j = 0; j < FORK_IDS; j++)
      same += memcmp(parent[i], child[j], 36) == 0;
  if (same)
    fail_msg("parent and child made %d ids alike (first: %s)", same, parent[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_bits_threads),
      cmocka_unit_test(test_fork_ids_differ),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
