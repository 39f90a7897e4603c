/*
 * The one-of-each primitives of common/: big-endian bytes and hex digits
 * (common/bytes.h), kl__sleep_ms() and the out-of-memory exit kl__oom().
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/bytes.h"
#include "common/internal.h"
#include "common/log.h"

/* Most significant byte first, at any width and any alignment, and back. */
static void test_big_endian_round_trip(void **state) {
  (void)state;
  unsigned char b[9] = {0};
  kl__put_be(b + 1, 0x0102030405060708ULL, 8); /* unaligned */
  static const unsigned char want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_memory_equal(b + 1, want, 8);
  assert_true(kl__get_be(b + 1, 8) == 0x0102030405060708ULL);
  kl__put_be(b, 0xabcdef, 2); /* the low bytes only */
  assert_int_equal(b[0], 0xcd);
  assert_int_equal(b[1], 0xef);
  assert_int_equal(kl__get_be(b, 2), 0xcdef);
  kl__put_be32(b, 0xdeadbeef);
  assert_int_equal(b[0], 0xde);
  assert_int_equal(b[3], 0xef);
  assert_int_equal(kl__get_be32(b), 0xdeadbeef);
  assert_int_equal(kl__get_be(b, 0), 0);
}

static void test_hex_value(void **state) {
  (void)state;
  assert_int_equal(kl__hex_value('0'), 0);
  assert_int_equal(kl__hex_value('9'), 9);
  assert_int_equal(kl__hex_value('a'), 10);
  assert_int_equal(kl__hex_value('F'), 15);
  assert_int_equal(kl__hex_value('g'), -1);
  assert_int_equal(kl__hex_value('/'), -1);
  assert_int_equal(kl__hex_value((char)0xe9), -1);
}

static void test_hex_encode(void **state) {
  (void)state;
  char out[9] = "????????";
  kl__hex_encode((const unsigned char[]){0x00, 0x9f, 0xa0, 0xff}, 4, out);
  assert_string_equal(out, "009fa0ff");
  kl__hex_encode("", 0, out);
  assert_string_equal(out, "009fa0ff"); /* nothing written */
}

static void test_sleep_ms(void **state) {
  (void)state;
  int64_t start = kl__mono_ns();
  kl__sleep_ms(30);
  assert_true(kl__mono_ns() - start >= 30 * 1000000LL);
  start = kl__mono_ns();
  kl__sleep_ms(0);
  kl__sleep_ms(-5);
  assert_true(kl__mono_ns() - start < 20 * 1000000LL);
}

/* kl__oom() logs what happened and what a restart does, then aborts. */
static void test_oom_logs_and_aborts(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    signal(SIGABRT, SIG_DFL);
    kl__oom("worker");
  }
  close(fds[1]);
  char buf[512] = {0};
  size_t n = 0;
  for (ssize_t r; n < sizeof(buf) - 1 &&
                  (r = read(fds[0], buf + n, sizeof(buf) - 1 - n)) > 0;)
    n += (size_t)r;
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  assert_non_null(strstr(buf, "ERROR"));
  assert_non_null(strstr(buf, "worker: out of memory: exiting; a restarted "
                              "worker resumes from what the store holds"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_big_endian_round_trip),
      cmocka_unit_test(test_hex_value),
      cmocka_unit_test(test_hex_encode),
      cmocka_unit_test(test_sleep_ms),
      cmocka_unit_test(test_oom_logs_and_aborts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
