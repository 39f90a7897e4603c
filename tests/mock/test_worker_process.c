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

/* ---- exec children never outlive their worker (issue 33 item 4) ------ */

/* The child's and its own child's pids, read from the files the child
 * writes, for the checks and for the teardown, which kills their groups
 * whatever the test's outcome. */
static pid_t kl_exec_pids[2];

/* 1 when @p pid runs (a zombie waiting for its reaper does not). */
static int kl_pid_runs(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

static pid_t kl_read_pid(const char *dir, const char *name) {
  char path[128];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  int pid = 0;
  if (f && fscanf(f, "%d", &pid) != 1)
    pid = 0;
  if (f)
    fclose(f);
  return (pid_t)pid;
}

static int kl_exec_teardown(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++)
    if (kl_exec_pids[i] > 0) {
      kill(-kl_exec_pids[i], SIGKILL);
      kill(kl_exec_pids[i], SIGKILL);
    }
  kl_exec_pids[0] = kl_exec_pids[1] = 0;
  return 0;
}

/* Starts a worker whose exec child starts a process of its own (its group's)
 * and hangs on the first event; @returns the worker's pid once both are
 * running, their pids in kl_exec_pids. */
static pid_t kl_exec_hang(kl_t_cluster_t *cluster, const char *dir) {
  const char *boot = kl_t_bootstrap(cluster);
  assert_int_equal(kl_t_cluster_topic_create(cluster, "hang.dlq", 1), KL_OK);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(4, 1, 7);
  kl_producer_t *producer = kl_t_producer(boot, gen);
  assert_int_equal(kl__ledger_gen_publish(gen, producer, kl_topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  char handler[512], store[96];
  snprintf(handler, sizeof(handler),
           "exec:sleep 600 & echo $! > %s/gc.tmp; mv %s/gc.tmp %s/gc.pid; "
           "echo $$ > %s/c.tmp; mv %s/c.tmp %s/c.pid; wait",
           dir, dir, dir, dir, dir, dir);
  snprintf(store, sizeof(store), "%s/store", dir);
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        boot,
                        "-t",
                        kl_topic,
                        "-g",
                        kl_group,
                        "--store",
                        store,
                        "--handler",
                        handler,
                        "--dlq-topic",
                        kl_t_name(cluster, "hang.dlq"),
                        "--shutdown-timeout",
                        "2s",
                        NULL};
  pid_t worker = kl_t_spawn_worker(dir, 0, argv);
  for (int i = 0; i < 600 && !(kl_exec_pids[0] && kl_exec_pids[1]); i++) {
    kl_t_sleep_ms(50);
    kl_exec_pids[0] = kl_read_pid(dir, "c.pid");
    kl_exec_pids[1] = kl_read_pid(dir, "gc.pid");
  }
  assert_true(kl_exec_pids[0] > 0 && kl_exec_pids[1] > 0);
  assert_true(kl_pid_runs(kl_exec_pids[0]) && kl_pid_runs(kl_exec_pids[1]));
  return worker;
}

/* 1 once none of the first @p n of kl_exec_pids runs, within 5 s. */
static int kl_exec_gone(int n) {
  int runs = 1;
  for (int i = 0; i < 100 && runs; i++) {
    runs = 0;
    for (int j = 0; j < n; j++)
      runs |= kl_pid_runs(kl_exec_pids[j]);
    if (runs)
      kl_t_sleep_ms(50);
  }
  return !runs;
}

/* Ends the worker of kl_exec_hang() with @p sig: SIGTERM, and the hung
 * event holds the stop past --shutdown-timeout (the worker exits 1);
 * SIGKILL, and the worker runs no code at all. Either way its child is
 * gone within 5 s; an aborted stop also ends what the child started. */
static void kl_exec_end(const char *group, int sig) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "hang", 1, &cluster), KL_OK);
  kl_topic = kl_t_topic(cluster);
  kl_group = kl_t_group(cluster, group);
  pid_t worker = kl_exec_hang(cluster, dir);
  kill(worker, sig);
  int status;
  assert_int_equal(waitpid(worker, &status, 0), worker);
  if (sig == SIGTERM) {
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    char line[256];
    assert_true(kl_t_log_find(dir, 0, "aborting the stop", line, sizeof(line)));
  }
  assert_true(kl_exec_gone(sig == SIGTERM ? 2 : 1));
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

/* The probe: the worker exited 1 and left its children under PID 1. */
static void test_aborted_stop_ends_exec_children(void **state) {
  (void)state;
  kl_exec_end("hang", SIGTERM);
}

/* The kernel ends the child of a SIGKILLed worker. */
static void test_killed_worker_ends_exec_child(void **state) {
  (void)state;
  kl_exec_end("killed", SIGKILL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigstop_past_session_timeout),
      cmocka_unit_test_teardown(test_aborted_stop_ends_exec_children,
                                kl_exec_teardown),
      cmocka_unit_test_teardown(test_killed_worker_ends_exec_child,
                                kl_exec_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
