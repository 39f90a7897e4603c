/*
 * The test support that starts keylane processes (support/spawn.h): its
 * children die with the thread that started them, so a failed assertion
 * leaves no worker behind, and their logs can be searched.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/spawn.h"
#include "support/support.h"

typedef struct kl_t_starter {
  const char *dir;
  pid_t pid;
} kl_t_starter_t;

static void *kl_t_start(void *opaque) {
  kl_t_starter_t *s = opaque;
  const char *argv[] = {"/bin/sh", "-c", "echo started; exec sleep 60", NULL};
  s->pid = kl_t_spawn_worker(s->dir, 0, argv);
  char line[64];
  for (int i = 0;
       i < 1000 && !kl_t_log_find(s->dir, 0, "started", line, sizeof(line));
       i++)
    kl_t_sleep_ms(10);
  return NULL; /* the thread ends: the child must go with it */
}

static void test_child_dies_with_its_thread(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_starter_t s = {.dir = dir};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, kl_t_start, &s), 0);
  pthread_join(t, NULL);
  char line[64];
  assert_true(kl_t_log_find(dir, 0, "started", line, sizeof(line)));
  assert_false(kl_t_log_find(dir, 0, "never written", line, sizeof(line)));
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 500 && (got = waitpid(s.pid, &status, WNOHANG)) == 0; i++)
    kl_t_sleep_ms(10);
  if (got == 0) {
    kill(s.pid, SIGKILL);
    waitpid(s.pid, &status, 0);
    fail_msg("the child outlived the thread that started it");
  }
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGKILL);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_child_dies_with_its_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
