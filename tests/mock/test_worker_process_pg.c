/*
 * Fencing across processes on the PostgreSQL store, with the inventory
 * handler: two `keylane worker` processes share one database; one is
 * frozen (SIGSTOP) between its handlers and its commit, its transaction
 * open and holding the row locks of its stock decrements, for longer than
 * its session timeout. The other takes the partition over: its own
 * decrements wait for those locks only until the server ends the frozen
 * transaction (store.pg.idle.timeout). Thawed, the frozen worker is fenced
 * and applies nothing; every reservation is decided exactly once and every
 * stock count adds up. Skips, saying why, without PostgreSQL (fails under
 * KEYLANE_TEST_REQUIRE=postgresql, support/skips.h).
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
#include <libpq-fe.h>

#include "support/cluster.h"
#include "support/pg.h"
#include "support/spawn.h"
#include "support/sql.h"
#include "support/support.h"
#include "handlers/inventory.h"

#define PARTS 4
#define SKUS 8
#define STOCK 30

static const char *kl_topic, *kl_group;

/* What the test holds, released by the teardown even when an assertion or
 * a skip leaves the test early: no worker process, no server, no leak. */
static struct {
  pid_t pids[2]; /* the worker processes, > 0 while running */
  kl_t_pg_t *pg;
  kl_store_t *store;
  PGconn *admin;
  kl_t_cluster_t *cluster;
  kl_producer_t *producer;
  char dir[64];
} kl_fx;

static int kl_fx_down(void **state) {
  for (int i = 0; i < 2; i++)
    if (kl_fx.pids[i] > 0) {
      kill(kl_fx.pids[i], SIGKILL);
      waitpid(kl_fx.pids[i], NULL, 0);
    }
  kl_producer_destroy(kl_fx.producer);
  kl_t_cluster_destroy(kl_fx.cluster);
  PQfinish(kl_fx.admin);
  kl_store_destroy(kl_fx.store);
  kl_t_pg_stop(kl_fx.pg);
  if (kl_fx.dir[0])
    kl_t_rmrf(kl_fx.dir);
  memset(&kl_fx, 0, sizeof(kl_fx));
  return 0;
}

static pid_t kl_spawn_worker(const char *boot, const char *uri, const char *dir,
                             int i) {
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        boot,
                        "-t",
                        kl_topic,
                        "-g",
                        kl_group,
                        "--store",
                        uri,
                        "--handler",
                        "inventory",
                        "--session-timeout-ms",
                        "3000",
                        "-X",
                        "store.pg.idle.timeout=2s",
                        "--pause-on-sigusr1",
                        NULL};
  return kl_t_spawn_worker(dir, i, argv);
}

typedef struct kl_orders {
  kl_producer_t *producer;
  int published;     /* distinct ids */
  int per_sku[SKUS]; /* distinct ids per SKU */
} kl_orders_t;

/* Publishes @p n reservations round the SKUs, re-publishing every 10th. */
static void kl_orders_publish(kl_orders_t *o, int n) {
  for (int i = 0; i < n; i++) {
    int k = o->published % SKUS;
    char sku[16], id[32];
    snprintf(sku, sizeof(sku), "sku-%d", k);
    snprintf(id, sizeof(id), "order-%d", o->published);
    kl_event_t event = {sku, strlen(sku), id, strlen(id), "reserve", 7,
                        0,   "\x80",      1,  NULL,       0,         0};
    assert_int_equal(kl_publish(o->producer, kl_topic, &event, NULL), KL_OK);
    if (o->published % 10 == 9)
      assert_int_equal(kl_publish(o->producer, kl_topic, &event, NULL), KL_OK);
    o->published++;
    o->per_sku[k]++;
  }
  kl_producer_poll(o->producer, 0);
}

static int kl_wait_outcomes(PGconn *admin, long long want, int ms) {
  for (int t = 0; t < ms; t += 100) {
    if (kl_t_sql(admin, "SELECT count(*) FROM keylane_inventory_outcomes") >=
        want)
      return 0;
    kl_t_sleep_ms(100);
  }
  return -1;
}

static void kl_assert_stock(PGconn *admin, const kl_orders_t *o) {
  assert_int_equal(kl_t_sql(admin, "SELECT count(*) FROM "
                                   "keylane_inventory_outcomes"),
                   o->published);
  for (int k = 0; k < SKUS; k++) {
    int reserved = o->per_sku[k] < STOCK ? o->per_sku[k] : STOCK;
    char sql[160];
    snprintf(sql, sizeof(sql), "SELECT qty FROM stock WHERE sku = 'sku-%d'", k);
    assert_int_equal(kl_t_sql(admin, sql), STOCK - reserved);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM keylane_inventory_outcomes WHERE sku = "
             "'sku-%d' AND outcome = 'reserved'",
             k);
    assert_int_equal(kl_t_sql(admin, sql), reserved);
  }
}

static void test_sigstop_holding_row_locks(void **state) {
  char why[2048];
  kl_t_pg_t *pg = kl_fx.pg = kl_t_pg_start(0, why, sizeof(why));
  if (!pg) {
    fprintf(stderr, "skipped: %s\n", why);
    skip();
  }
  char uri[256], *dir = kl_fx.dir;
  assert_int_equal(kl_t_pg_createdb(pg, "fleet", uri, sizeof(uri)), 0);
  kl_t_tmpdir(dir);
  assert_int_equal(kl_store_open(uri, NULL, &kl_fx.store), KL_OK);
  kl_store_t *store = kl_fx.store;
  PGconn *admin = kl_fx.admin = PQconnectdb(uri);
  assert_int_equal(kl_t_cluster_new(1, "inv", PARTS, &kl_fx.cluster), KL_OK);
  kl_t_cluster_t *cluster = kl_fx.cluster;
  kl_topic = kl_t_topic(cluster);
  kl_t_sql(admin, KL__INVENTORY_STOCK_DDL);
  char sql[512];
  snprintf(sql, sizeof(sql),
           "INSERT INTO stock SELECT '%s', 'sku-' || i, %d FROM "
           "generate_series(0, %d) AS i",
           kl_topic, STOCK, SKUS - 1);
  kl_t_sql(admin, sql);
  kl_group = kl_t_group(cluster, "inv");
  const char *boot = kl_t_bootstrap(cluster);
  kl_conf_t *conf = kl_conf_new();
  kl_conf_set(conf, "kafka.bootstrap.servers", boot);
  kl_orders_t o = {NULL, 0, {0}};
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &kl_fx.producer), KL_OK);
  o.producer = kl_fx.producer;
  kl_conf_destroy(conf);

  char line[1024];
  pid_t *pids = kl_fx.pids;
  pids[0] = kl_spawn_worker(boot, uri, dir, 0);
  pids[1] = kl_spawn_worker(boot, uri, dir, 1);
  kl_orders_publish(&o, 80);
  assert_int_equal(kl_flush(o.producer, 30000), KL_OK);
  /* A worker that runs handlers on a txn without the batch's connection
   * decides nothing: the very bug this test is here to catch. */
  if (kl_wait_outcomes(admin, 80, 30000) &&
      (kl_t_log_find(dir, 0, "kl_txn_pg_conn() gave none", line,
                     sizeof(line)) ||
       kl_t_log_find(dir, 1, "kl_txn_pg_conn() gave none", line, sizeof(line))))
    fail_msg("the worker gave the inventory handler no PostgreSQL "
             "connection (kl_txn_pg_conn() on its txn is NULL): %s",
             line);
  assert_int_equal(kl_wait_outcomes(admin, 80, 1000), 0);

  /* Freeze worker 0 with a batch's decrements done and not committed. */
  kill(pids[0], SIGUSR1);
  int p = -1;
  uint64_t epoch = 0;
  for (int i = 0; i < 300 && !kl_t_find_pause(dir, 0, &p, &epoch); i++) {
    kl_orders_publish(&o, 8);
    kl_t_sleep_ms(50);
  }
  assert_true(p >= 0);
  kill(pids[0], SIGSTOP);
  kl_partition_state_t at, now;
  assert_int_equal(kl_store_partition(store, kl_topic, p, &at), KL_OK);
  now = at;
  for (int i = 0;
       i < 400 && !(now.epoch > epoch && now.watermark > at.watermark); i++) {
    kl_orders_publish(&o, 8);
    kl_t_sleep_ms(50);
    kl_store_partition(store, kl_topic, p, &now);
  }
  assert_true(now.epoch > epoch); /* the new owner got past the locks */
  kl_t_resume_paused(pids[0]);

  kl_orders_publish(&o, 100);
  assert_int_equal(kl_flush(o.producer, 30000), KL_OK);
  assert_int_equal(kl_wait_outcomes(admin, o.published, 60000), 0);
  kl_t_sleep_ms(500); /* nothing more may arrive */

  /* The frozen batch never committed: it was fenced at its commit, or its
   * commit failed (the server had ended its transaction) and the partition
   * was gone before it could run again. The counts below are the proof. */
  char fenced[64], lost[64];
  snprintf(fenced, sizeof(fenced), "fenced partition=%d my_epoch=%" PRIu64, p,
           epoch);
  snprintf(lost, sizeof(lost), "lost partition=%d epoch=%" PRIu64, p, epoch);
  assert_true(kl_t_log_find(dir, 0, fenced, line, sizeof(line)) ||
              kl_t_log_find(dir, 0, lost, line, sizeof(line)));
  for (int i = 0; i < 2; i++) {
    int status;
    kill(pids[i], SIGTERM);
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    pids[i] = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  kl_assert_stock(admin, &o);
  uint64_t ids;
  assert_int_equal(kl_store_id_count(store, &ids), KL_OK);
  assert_int_equal(ids, (uint64_t)o.published);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_sigstop_holding_row_locks, kl_fx_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
