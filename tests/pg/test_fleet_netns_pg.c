/*
 * A fleet across hosts: two `keylane worker` processes, each in a network
 * namespace of its own (a host, with a veth pair to the root namespace,
 * made by the test), share the PostgreSQL store and the embedded Kafka
 * cluster over their veths. One host is cut off the network (its veth
 * down) with a batch between its handlers and its commit, for longer than
 * its session timeout; the other host takes its partitions over. When the
 * cut host is reconnected its commit reaches the database and is fenced:
 * it applies nothing stale, both drain cleanly, every balance verifies.
 *
 * Skips, saying why, when it cannot make namespaces (not root, no
 * iproute2, not permitted) or PostgreSQL is not installed.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/netns.h"
#include "support/pg.h"
#include "support/spawn.h"
#include "support/support.h"

#define TOPIC "fleet"
#define PARTS 4
#define HOSTS 2

typedef struct kl_fleet {
  kl_t_netns_t *ns;
  kl_t_pg_t *pg;
  kl_embedded_t *cluster;
  kl_store_t *store; /* the test's own view, from the root namespace */
  char uri[256];     /* from the root namespace */
  char dir[64];      /* the workers' logs */
  pid_t pids[HOSTS]; /* > 0 while running */
  char why[2048];    /* why the fleet could not be made */
} kl_fleet_t;

/* The store as host @p i reaches it: through its gateway. No TCP
 * keepalives: a batch's idle connection outlives the cut, as it would a
 * short network partition, so its commit reaches the fence. */
static void kl_host_uri(const kl_fleet_t *f, int i, char *uri, size_t size) {
  snprintf(uri, size, "postgresql://keylane@%s:%d/fleet?connect_timeout=3",
           kl_t_netns_gateway(f->ns, i), f->pg->port);
}

static pid_t kl_spawn_worker(const kl_fleet_t *f, int i) {
  char uri[320];
  kl_host_uri(f, i, uri, sizeof(uri));
  const char *argv[] = {kl_t_netns_ip(f->ns),
                        "netns",
                        "exec",
                        kl_t_netns_name(f->ns, i),
                        kl_t_bin(),
                        "worker",
                        "-b",
                        kl_embedded_bootstrap(f->cluster),
                        "-t",
                        TOPIC,
                        "-g",
                        "fleet",
                        "--store",
                        uri,
                        "--handler",
                        "ledger",
                        "--session-timeout-ms",
                        "3000",
                        "--pause-on-sigusr1",
                        NULL};
  return kl_t_spawn_worker(f->dir, i, argv);
}

/* Relays every broker port of the embedded cluster into the hosts. */
static int kl_relay_brokers(kl_fleet_t *f) {
  const char *p = kl_embedded_bootstrap(f->cluster);
  while (p && *p) {
    const char *colon = strchr(p, ':');
    if (!colon || kl_t_netns_relay(f->ns, atoi(colon + 1)))
      return -1;
    p = strchr(colon, ',');
    p = p ? p + 1 : NULL;
  }
  return 0;
}

/* Makes the hosts, the store and the cluster; f->why says why not (the
 * test then skips). A setup with a teardown, so that a failed assertion
 * leaves nothing behind: no namespace, no server, no worker. */
static int kl_fleet_up(void **state) {
  kl_fleet_t *f = calloc(1, sizeof(*f));
  *state = f;
  kl_t_tmpdir(f->dir);
  if (!(f->ns = kl_t_netns_new(HOSTS, f->why, sizeof(f->why))))
    return 0;
  f->pg = kl_t_pg_start_on(0, kl_t_netns_gateways(f->ns), "10.213.0.0/16",
                           f->why, sizeof(f->why));
  if (!f->pg)
    return 0;
  if (kl_t_pg_createdb(f->pg, "fleet", f->uri, sizeof(f->uri)) ||
      kl_store_open(f->uri, NULL, &f->store) ||
      kl_embedded_new(1, TOPIC, PARTS, &f->cluster) || kl_relay_brokers(f))
    return -1;
  return 0;
}

static int kl_fleet_down(void **state) {
  kl_fleet_t *f = *state;
  for (int i = 0; i < HOSTS; i++)
    if (f->pids[i] > 0) {
      kill(f->pids[i], SIGKILL);
      waitpid(f->pids[i], NULL, 0);
    }
  kl_embedded_destroy(f->cluster);
  kl_store_destroy(f->store);
  kl_t_pg_stop(f->pg);
  kl_t_netns_destroy(f->ns);
  kl_t_rmrf(f->dir);
  free(f);
  return 0;
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

/* Waits for host 0's "pausing partition=P epoch=E", publishing meanwhile. */
static int kl_wait_pause(kl_fleet_t *f, kl__ledger_gen_t *gen,
                         kl_producer_t *producer, uint64_t *epoch) {
  for (int i = 0; i < 300; i++) {
    kl_publish_some(gen, producer, 20);
    kl_t_sleep_ms(50);
    int p;
    if (kl_t_find_pause(f->dir, 0, &p, epoch))
      return p;
  }
  return -1;
}

static void kl_assert_verified(kl_fleet_t *f, kl__ledger_gen_t *gen) {
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(gen, f->store, TOPIC, &v), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(gen));
  assert_true(v.ok);
}

static void test_host_cut_off_is_fenced(void **state) {
  kl_fleet_t *f = *state;
  if (!f->pg) {
    fprintf(stderr, "skipped: %s\n", f->why);
    skip();
  }
  kl__ledger_gen_t *gen = kl__ledger_gen_new(40, PARTS, 11);
  kl_producer_t *producer =
      kl_t_producer(kl_embedded_bootstrap(f->cluster), gen);
  for (int i = 0; i < HOSTS; i++)
    f->pids[i] = kl_spawn_worker(f, i);
  kl_publish_some(gen, producer, 200);
  assert_int_equal(kl__ledger_gen_wait(gen, f->store, TOPIC, 1, 60000), 0);

  /* Host 0 holds a batch between its handlers and its commit ... */
  kill(f->pids[0], SIGUSR1);
  uint64_t epoch = 0;
  int p = kl_wait_pause(f, gen, producer, &epoch);
  assert_true(p >= 0);
  /* ... and is cut off; host 1 takes p over and commits past it. */
  assert_int_equal(kl_t_netns_cut(f->ns, 0, 1), 0);
  kl_partition_state_t at, now;
  assert_int_equal(kl_store_partition(f->store, TOPIC, p, &at), KL_OK);
  now = at;
  for (int i = 0;
       i < 600 && !(now.epoch > epoch && now.watermark > at.watermark); i++) {
    kl_publish_some(gen, producer, 20);
    kl_t_sleep_ms(50);
    kl_store_partition(f->store, TOPIC, p, &now);
  }
  assert_true(now.epoch > epoch);
  kl_t_sleep_ms(4000); /* well past the session timeout */
  assert_int_equal(kl_t_netns_cut(f->ns, 0, 0), 0);
  kl_t_resume_paused(f->pids[0]);

  kl_publish_some(gen, producer, 400);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  assert_int_equal(kl__ledger_gen_wait(gen, f->store, TOPIC, 0, 90000), 0);
  char fenced[64], line[1024];
  snprintf(fenced, sizeof(fenced), "fenced partition=%d my_epoch=%" PRIu64, p,
           epoch);
  for (int i = 0;
       i < 300 && !kl_t_log_find(f->dir, 0, fenced, line, sizeof(line)); i++)
    kl_t_sleep_ms(100);
  assert_true(kl_t_log_find(f->dir, 0, fenced, line, sizeof(line)));
  for (int i = 0; i < HOSTS; i++) {
    int status;
    kill(f->pids[i], SIGTERM);
    assert_int_equal(waitpid(f->pids[i], &status, 0), f->pids[i]);
    f->pids[i] = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  kl_assert_verified(f, gen);
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_host_cut_off_is_fenced, kl_fleet_up,
                                      kl_fleet_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
