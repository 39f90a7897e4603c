/*
 * Static group membership (worker.instance.id, KIP-345) on a real broker:
 * librdkafka 2.0.2's mock cluster reads group.instance.id but keeps no
 * static members. `keylane worker` processes, two per test:
 *  - one stopped with SIGTERM and started again within the session
 *    timeout gets its partitions back, and the other never sees a
 *    rebalance; each partition still takes a newer epoch;
 *  - one stopped for longer stays in the group until the session timeout
 *    (it did not leave), then the other takes its partitions, and it
 *    rejoins as a new member when it comes back;
 *  - a second process with a live one's instance id: Kafka fences the
 *    older one, which exits 1 naming the id and the fix, and the ledger
 *    shows every event applied once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/cluster.h"
#include "support/spawn.h"
#include "support/support.h"

#define PARTS 4

/* One test's cluster, store, workload and worker processes. */
typedef struct fleet {
  kl_t_cluster_t *cluster;
  const char *boot, *topic, *group;
  char dir[64];
  kl_store_t *store;
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
  const char *session_ms;
} fleet_t;

static void fleet_new(fleet_t *f, const char *name, const char *session_ms) {
  memset(f, 0, sizeof(*f));
  assert_int_equal(kl_t_cluster_new(1, name, PARTS, &f->cluster), KL_OK);
  f->boot = kl_t_bootstrap(f->cluster);
  f->topic = kl_t_topic(f->cluster);
  f->group = kl_t_group(f->cluster, name);
  f->session_ms = session_ms;
  kl_t_tmpdir(f->dir);
  assert_int_equal(kl_store_open(f->dir, NULL, &f->store), KL_OK);
  f->gen = kl__ledger_gen_new(40, PARTS, 11);
  f->producer = kl_t_producer(f->boot, f->gen);
}

static void fleet_destroy(fleet_t *f) {
  kl_producer_destroy(f->producer);
  kl__ledger_gen_destroy(f->gen);
  kl_store_destroy(f->store);
  kl_t_cluster_destroy(f->cluster);
  kl_t_rmrf(f->dir);
}

/* `keylane worker` number @p i (its log "worker-<i>.log") with
 * worker.instance.id @p instance. */
static pid_t spawn(const fleet_t *f, int i, const char *instance) {
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        f->boot,
                        "-t",
                        f->topic,
                        "-g",
                        f->group,
                        "--store",
                        f->dir,
                        "--handler",
                        "ledger",
                        "--instance-id",
                        instance,
                        "--session-timeout-ms",
                        f->session_ms,
                        "-X",
                        "worker.retention.check=warn",
                        NULL};
  return kl_t_spawn_worker(f->dir, i, argv);
}

static void publish(fleet_t *f, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(kl__ledger_gen_publish(f->gen, f->producer, f->topic),
                     KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(f->gen, f->producer, f->topic),
                       KL_OK);
  }
  assert_int_equal(kl_flush(f->producer, 30000), KL_OK);
}

/* Every event applied once, every balance as published. */
static void verify(fleet_t *f) {
  assert_int_equal(kl__ledger_gen_wait(f->gen, f->store, f->topic, 0, 60000),
                   0);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(f->gen, f->store, f->topic, &v),
                   KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(f->gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(f->gen));
  assert_true(v.ok);
}

static int owned_count(const uint64_t *epochs) {
  int n = 0;
  for (int p = 0; p < PARTS; p++)
    n += epochs[p] != 0;
  return n;
}

/* Waits until workers @p a and @p b own every partition between them,
 * each some; fills their epochs. */
static void await_split(const fleet_t *f, int a, int b, uint64_t *ea,
                        uint64_t *eb) {
  int na = 0, nb = 0;
  for (int i = 0; i < 600; i++) {
    kl_t_log_owned(f->dir, a, ea, PARTS);
    kl_t_log_owned(f->dir, b, eb, PARTS);
    na = owned_count(ea), nb = owned_count(eb);
    if (na && nb && na + nb == PARTS)
      return;
    kl_t_sleep_ms(100);
  }
  fail_msg("workers %d and %d own %d and %d of %d partitions after 60 s", a, b,
           na, nb, PARTS);
}

static void stop(pid_t pid, int want_rc) {
  int status;
  kill(pid, SIGTERM);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), want_rc);
}

static void test_restart_within_session_timeout(void **state) {
  (void)state;
  fleet_t f;
  fleet_new(&f, "static-in", "10000");
  pid_t a = spawn(&f, 0, "a"), b = spawn(&f, 1, "b");
  uint64_t ea[PARTS], eb[PARTS], now[PARTS];
  await_split(&f, 0, 1, ea, eb);
  publish(&f, 200);
  assert_int_equal(kl__ledger_gen_wait(f.gen, f.store, f.topic, 0, 60000), 0);
  int b_changes = kl_t_log_owned(f.dir, 1, eb, PARTS);

  stop(a, 0);
  char line[1024];
  assert_true(kl_t_log_find(f.dir, 0, "staying in group", line, sizeof(line)));
  a = spawn(&f, 2, "a");
  /* It gets back exactly what it had, each partition under a newer epoch,
   * well within the session timeout. */
  int back = 0;
  for (int i = 0; i < 80 && !back; i++) {
    kl_t_sleep_ms(100);
    kl_t_log_owned(f.dir, 2, now, PARTS);
    back = owned_count(now) == owned_count(ea);
  }
  assert_true(back);
  for (int p = 0; p < PARTS; p++) {
    assert_int_equal(now[p] != 0, ea[p] != 0);
    if (ea[p])
      assert_true(now[p] > ea[p]);
  }
  publish(&f, 200);
  verify(&f);
  /* The other member saw no rebalance: its assignment never changed. */
  assert_int_equal(kl_t_log_owned(f.dir, 1, now, PARTS), b_changes);
  assert_memory_equal(now, eb, sizeof(eb));
  stop(a, 0);
  stop(b, 0);
  fleet_destroy(&f);
}

static void test_restart_past_session_timeout(void **state) {
  (void)state;
  fleet_t f;
  fleet_new(&f, "static-past", "3000");
  pid_t a = spawn(&f, 0, "a"), b = spawn(&f, 1, "b");
  uint64_t ea[PARTS], eb[PARTS], now[PARTS];
  await_split(&f, 0, 1, ea, eb);
  publish(&f, 100);
  assert_int_equal(kl__ledger_gen_wait(f.gen, f.store, f.topic, 0, 60000), 0);

  stop(a, 0);
  int64_t gone = kl__mono_ns();
  /* It did not leave: the group gives its partitions to b only once its
   * session timed out, not at once. */
  int all = 0;
  for (int i = 0; i < 300 && !all; i++) {
    kl_t_sleep_ms(50);
    kl_t_log_owned(f.dir, 1, now, PARTS);
    all = owned_count(now) == PARTS;
  }
  int64_t took_ms = (kl__mono_ns() - gone) / 1000000;
  assert_true(all);
  print_message("b took a's partitions %" PRId64 " ms after a exited\n",
                took_ms);
  assert_true(took_ms >= 2000);
  for (int p = 0; p < PARTS; p++)
    if (ea[p])
      assert_true(now[p] > ea[p]);
  publish(&f, 100);

  /* Back past the session: a new member, which the group gives some
   * partitions again, with newer epochs. */
  a = spawn(&f, 2, "a");
  uint64_t ea2[PARTS];
  await_split(&f, 2, 1, ea2, now);
  for (int p = 0; p < PARTS; p++)
    if (ea2[p])
      assert_true(ea2[p] > ea[p]);
  publish(&f, 100);
  verify(&f);
  stop(a, 0);
  stop(b, 0);
  fleet_destroy(&f);
}

static void test_duplicate_instance_id_is_fenced(void **state) {
  (void)state;
  fleet_t f;
  fleet_new(&f, "static-dup", "10000");
  uint64_t e0[PARTS] = {0}, e1[PARTS] = {0};
  pid_t first = spawn(&f, 0, "a");
  for (int i = 0; i < 600 && owned_count(e0) < PARTS; i++) {
    kl_t_sleep_ms(100);
    kl_t_log_owned(f.dir, 0, e0, PARTS);
  }
  assert_int_equal(owned_count(e0), PARTS);
  publish(&f, 100);
  assert_int_equal(kl__ledger_gen_wait(f.gen, f.store, f.topic, 0, 60000), 0);

  /* A second process with the same id, while events keep coming: Kafka
   * hands the id to it and fences the first, which exits 1 with the
   * reason and the fix. */
  pid_t second = spawn(&f, 1, "a");
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 300 && done != first; i++) {
    publish(&f, 5);
    done = waitpid(first, &status, WNOHANG);
    if (done != first)
      kl_t_sleep_ms(100);
  }
  assert_int_equal(done, first);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 1);
  char line[1024];
  assert_true(kl_t_log_find(f.dir, 0,
                            "worker.instance.id=a is used by another live "
                            "worker of group",
                            line, sizeof(line)));
  assert_non_null(strstr(line, "FENCED_INSTANCE_ID"));
  assert_non_null(strstr(line, "give each worker an instance id of its own"));
  /* The second owns everything, each partition under a newer epoch. */
  for (int i = 0; i < 100 && owned_count(e1) < PARTS; i++) {
    kl_t_sleep_ms(100);
    kl_t_log_owned(f.dir, 1, e1, PARTS);
  }
  assert_int_equal(owned_count(e1), PARTS);
  for (int p = 0; p < PARTS; p++)
    assert_true(e1[p] > e0[p]);
  publish(&f, 100);
  verify(&f);
  stop(second, 0);
  fleet_destroy(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart_within_session_timeout),
      cmocka_unit_test(test_restart_past_session_timeout),
      cmocka_unit_test(test_duplicate_instance_id_is_fenced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
