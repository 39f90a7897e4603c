/*
 * Fencing across processes: worker processes of `keylane worker` are
 * SIGSTOPped past their session timeout while another takes over, then
 * SIGCONTed. One is frozen inside the window between its handlers and its
 * commit: it must be fenced and apply nothing stale; both must rejoin and
 * drain cleanly, and every balance must verify. On the embedded cluster,
 * or on KEYLANE_TEST_BOOTSTRAP's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/cluster.h"
#include "support/spawn.h"
#include "support/support.h"

/* The names on the cluster in use (see support/cluster.h). */
static const char *kl_topic, *kl_group;
#define TOPIC kl_topic
#define PARTS 4

static pid_t kl_spawn_worker(const char *boot, const char *dir, int i) {
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        boot,
                        "-t",
                        TOPIC,
                        "-g",
                        kl_group,
                        "--store",
                        dir,
                        "--handler",
                        "ledger",
                        "--session-timeout-ms",
                        "3000",
                        "--pause-on-sigusr1",
                        NULL};
  return kl_t_spawn_worker(dir, i, argv);
}

static int kl_log_has(const char *dir, int i, const char *needle) {
  char path[128], line[1024];
  snprintf(path, sizeof(path), "%s/worker-%d.log", dir, i);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof(line), f))
    found = strstr(line, needle) != NULL;
  if (f)
    fclose(f);
  return found;
}

static void kl_publish_some(kl__ledger_gen_t *gen, kl_producer_t *producer,
                            int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(kl__ledger_gen_publish(gen, producer, TOPIC), KL_OK);
    if (i % 20 == 19)
      assert_int_equal(kl__ledger_gen_republish(gen, producer, TOPIC), KL_OK);
  }
  kl_producer_poll(producer, 0);
}

static void test_sigstop_past_session_timeout(void **state) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "proc", PARTS, &cluster), KL_OK);
  kl_topic = kl_t_topic(cluster);
  kl_group = kl_t_group(cluster, "pg");
  const char *boot = kl_t_bootstrap(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(40, PARTS, 7);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  pid_t pids[2] = {kl_spawn_worker(boot, dir, 0),
                   kl_spawn_worker(boot, dir, 1)};
  assert_int_equal(kl__ledger_gen_wait(gen, store, TOPIC, 1, 30000), 0);

  /* Freeze worker 0 inside the window between handler and commit. */
  kill(pids[0], SIGUSR1);
  int p = -1;
  uint64_t epoch = 0;
  for (int i = 0; i < 300 && !kl_t_find_pause(dir, 0, &p, &epoch); i++) {
    kl_publish_some(gen, producer, 20);
    kl_t_sleep_ms(50);
  }
  assert_true(p >= 0);
  kill(pids[0], SIGSTOP);
  /* Keep publishing until the new owner took p and committed past it. */
  kl_partition_state_t at, now;
  assert_int_equal(kl_store_partition(store, TOPIC, p, &at), KL_OK);
  now = at;
  for (int i = 0;
       i < 400 && !(now.epoch > epoch && now.watermark > at.watermark); i++) {
    kl_publish_some(gen, producer, 20);
    kl_t_sleep_ms(50);
    kl_store_partition(store, TOPIC, p, &now);
  }
  assert_true(now.epoch > epoch);
  kl_t_resume_paused(pids[0]);

  /* A plain freeze of the other worker past its session timeout. */
  kl_t_sleep_ms(2000);
  kill(pids[1], SIGSTOP);
  for (int i = 0; i < 16; i++) {
    kl_publish_some(gen, producer, 50);
    kl_t_sleep_ms(500);
  }
  kill(pids[1], SIGCONT);
  kl_publish_some(gen, producer, 500);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  assert_int_equal(kl__ledger_gen_wait(gen, store, TOPIC, 0, 60000), 0);

  char fenced[64];
  snprintf(fenced, sizeof(fenced), "fenced partition=%d my_epoch=%" PRIu64, p,
           epoch);
  assert_true(kl_log_has(dir, 0, fenced));
  for (int i = 0; i < 2; i++) {
    int status;
    kill(pids[i], SIGTERM);
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(gen, store, TOPIC, &v), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(gen));
  assert_true(v.ok);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigstop_past_session_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
