/*
 * The worker on the PostgreSQL store when the server goes away and when
 * its pool is smaller than its partitions: a server restarted (as
 * `pg_ctl restart -m immediate` does) while a batch is about to commit
 * costs that batch, which runs again once the worker has reconnected by
 * itself, and nothing is lost or applied twice (so does a link lost
 * between two events of a batch); a worker owning more
 * partitions than store.pg.pool keeps applying instead of waiting for a
 * connection its own open batches hold. On the embedded cluster, with a
 * server of its own (one the test restarts). Skips, saying why, when
 * PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "store/cache.h"
#include "store/store_internal.h"
#include "worker/worker_internal.h"
#include "keylane/handlers.h"

static int t_db_seq;

/* The ledger fixture on a fresh database of the test's server. */
static void kl_fx_up(kl_t_ledger_fx_t *fx, const char *topic, int partitions,
                     int keys) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char name[32], uri[256];
  snprintf(name, sizeof(name), "o%d", ++t_db_seq);
  assert_int_equal(kl_t_pg_createdb(pg, name, uri, sizeof(uri)), 0);
  kl_t_ledger_fx_up(fx, topic, partitions, keys, 42, uri);
}

/* Once every event is in the store: @p w applied the @p n published,
 * none dead-lettered or fenced; stops it and checks every balance (lost:
 * an event without its effect; twice: a balance off). */
static void kl_end_verified(kl_t_ledger_fx_t *fx, kl_t_worker_t *w,
                            uint64_t n) {
  assert_int_equal(kl_t_workers_applied(&w, 1, n, 5000), n);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.dead_letters, 0);
  assert_int_equal(st.fenced, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(fx);
}

/* ---- a restart under load ---------------------------------------------- */

static uint64_t kl_applied(kl_t_worker_t *w) {
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  return st.applied;
}

static void test_worker_survives_a_server_restart(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "restart", 4, 4000);
  kl_t_ledger_fx_publish(&fx, 8000);
  static const char *const conf[] = {"worker.session.timeout.ms=3000", NULL};
  kl_t_worker_t *w = kl_t_worker_start(fx.boot, fx.topic, "g", fx.store, conf);
  for (int i = 0; i < 6000 && kl_applied(w) < 1000; i++)
    kl_t_sleep_ms(10);
  assert_true(kl_applied(w) >= 1000 && kl_applied(w) < 8000);
  /* Every connection of the pool breaks: the lanes' open batches' and the
   * idle ones; for 3 s no connection can be made. */
  assert_int_equal(kl_t_pg_restart(kl_t_pg_group(), 3000), 0);
  int64_t t0 = kl__mono_ns();
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  double secs = (double)(kl__mono_ns() - t0) / 1e9;
  fprintf(stderr, "restart: caught up %.1f s after the server came back\n",
          secs);
  kl_end_verified(&fx, w, 8000);
  kl_t_ledger_fx_down(&fx);
}

/* ---- a restart under a running handler ------------------------------- */

typedef struct kl_hold {
  atomic_int armed;   /* the next event waits for the restart */
  atomic_int waiting; /* an event waits */
  atomic_int restarted;
} kl_hold_t;

/* The ledger handler; the event that finds the hold armed waits until the
 * test restarted the server, then reads a key the owner cache cannot
 * know, through its batch's connection, which the restart broke: a
 * handler's read that meets the restart, answered as the ledger answers
 * a failed read (RETRY). */
static kl_handler_result_t kl_held_ledger(void *opaque, const kl_event_t *event,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size) {
  kl_hold_t *h = opaque;
  int armed = 1;
  if (atomic_compare_exchange_strong(&h->armed, &armed, 0)) {
    atomic_store(&h->waiting, 1);
    for (int i = 0; i < 6000 && !atomic_load(&h->restarted); i++)
      kl_t_sleep_ms(10);
    const void *val;
    size_t len;
    kl_err_t err = kl_txn_get(txn, "never-written", 13, &val, &len);
    if (err != KL_OK && err != KL_ENOTFOUND) {
      snprintf(errbuf, errbuf_size, "held: %s", kl_err_detail());
      return KL_HANDLER_RETRY;
    }
  }
  return kl_ledger_handler(NULL, event, fence, txn, errbuf, errbuf_size);
}

/* A worker with the held ledger handler and @p conf; once it applied 100
 * events, arms @p h, publishes @p n more, waits for the one that waits and
 * restarts the server under it. */
static kl_t_worker_t *kl_held_restart(kl_hold_t *h, kl_t_ledger_fx_t *fx,
                                      const char *const *conf, int n) {
  kl_t_worker_t *w = kl_t_worker_new_with(fx->boot, fx->topic, "g", fx->store,
                                          conf, kl_held_ledger, h);
  kl_t_worker_go(w);
  for (int i = 0; i < 6000 && kl_applied(w) < 100; i++)
    kl_t_sleep_ms(10);
  atomic_store(&h->armed, 1);
  kl_t_ledger_fx_publish(fx, n);
  for (int i = 0; i < 6000 && !atomic_load(&h->waiting); i++)
    kl_t_sleep_ms(10);
  assert_true(atomic_load(&h->waiting));
  assert_int_equal(kl_t_pg_restart(kl_t_pg_group(), 500), 0);
  atomic_store(&h->restarted, 1);
  return w;
}

/* worker.max.attempts=1: one failed attempt dead-letters an event, so an
 * event that met the restart must not count it as its handler's. */
static void test_handler_read_meets_a_server_restart(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "held", 2, 50);
  kl_t_ledger_fx_publish(&fx, 500);
  kl_hold_t hold = {0, 0, 0};
  static const char *const conf[] = {"worker.max.attempts=1",
                                     "worker.session.timeout.ms=3000", NULL};
  kl_t_worker_t *w = kl_held_restart(&hold, &fx, conf, 500);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  kl_end_verified(&fx, w, 1000);
  kl_t_ledger_fx_down(&fx);
}

/* The event that met the restart waits with its whole partition behind
 * it: were the later events to commit first, a new owner taking the
 * partition meanwhile would find their ids applied above the watermark
 * and count them as duplicates, which the fault suite reads as a fenced
 * owner's commits. A (store errors held 3 s) is stopped 1.5 s after the
 * restart, B takes over, and the duplicates are the re-published events
 * alone. */
static void test_store_error_holds_the_partition(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "hold", 1, 50);
  kl_t_ledger_fx_publish(&fx, 200);
  kl_hold_t hold = {0, 0, 0};
  static const char *const conf[] = {"worker.retry.initial.ms=3000",
                                     "worker.session.timeout.ms=3000", NULL};
  kl_t_worker_t *a = kl_held_restart(&hold, &fx, conf, 300);
  /* No condition to wait for: with the partition held, nothing happens;
   * without, the later events commit in this time. */
  kl_t_sleep_ms(1500);
  assert_int_equal(kl_t_worker_stop(a), KL_OK);
  kl_t_worker_t *b = kl_t_worker_start(fx.boot, fx.topic, "g", fx.store, conf);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  assert_int_equal(kl_t_worker_stop(b), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx); /* duplicates == re-published */
  kl_t_ledger_fx_down(&fx);
}

/* ---- a link lost between a batch's events ---------------------------- */

typedef struct kl_cutter {
  PGconn *admin;
  char db[32];
  atomic_int armed; /* the next event cuts its batch's link */
  atomic_int cut;
} kl_cutter_t;

/* The ledger handler; the event that finds the cutter armed, once it has
 * run, terminates its batch's backend (the database's one transaction
 * open, idle between events) and waits until it is gone: the group
 * transaction goes on to its next events, whose writes the owner cache
 * and the buffer take without a round trip, until its next prefetch
 * meets the lost link. */
static kl_handler_result_t kl_cutting_ledger(void *opaque,
                                             const kl_event_t *event,
                                             const kl_fence_t *fence,
                                             kl_txn_t *txn, char *errbuf,
                                             size_t errbuf_size) {
  kl_cutter_t *c = opaque;
  kl_handler_result_t r =
      kl_ledger_handler(NULL, event, fence, txn, errbuf, errbuf_size);
  int armed = 1;
  if (r == KL_HANDLER_OK &&
      atomic_compare_exchange_strong(&c->armed, &armed, 0)) {
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
             "WHERE datname = '%s' AND state = 'idle in transaction'",
             c->db);
    atomic_store(&c->cut, (int)kl_t_sql(c->admin, q));
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM pg_stat_activity WHERE datname = '%s' "
             "AND state = 'idle in transaction'",
             c->db);
    for (int i = 0; i < 3000 && kl_t_sql(c->admin, q); i++)
      kl_t_sleep_ms(1);
  }
  return r;
}

/* The group transaction (inline mode, worker.batch.max 10) runs hundreds
 * of events between two commits and looks their ids up 10 at a time: the
 * link cut under one of them fails a later lookup in the same
 * transaction. The events it had run were final, their writes only in
 * it: they must run again, not be committed without their writes by the
 * next group commit (every balance would then miss them). */
static void test_link_lost_between_a_batchs_events(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "cut", 1, 20);
  kl_cutter_t c = {.armed = 0, .cut = 0};
  snprintf(c.db, sizeof(c.db), "o%d", t_db_seq);
  char admin_uri[256];
  kl_t_pg_admin_uri(kl_t_pg_need(), admin_uri, sizeof(admin_uri));
  c.admin = PQconnectdb(admin_uri);
  kl_t_ledger_fx_publish(&fx, 200);
  static const char *const conf[] = {"worker.batch.max=10",
                                     "worker.retry.initial.ms=50",
                                     "worker.session.timeout.ms=3000", NULL};
  kl_t_worker_t *w = kl_t_worker_new_with(fx.boot, fx.topic, "g", fx.store,
                                          conf, kl_cutting_ledger, &c);
  kl_t_worker_go(w);
  /* The cache warm, so that the events after the cut reach the server
   * only by their lookup. */
  assert_int_equal(kl_t_workers_applied(&w, 1, 200, 5000), 200);
  atomic_store(&c.armed, 1);
  kl_t_ledger_fx_publish(&fx, 600);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  assert_int_equal(atomic_load(&c.cut), 1);
  kl_end_verified(&fx, w, 800);
  PQfinish(c.admin);
  kl_t_ledger_fx_down(&fx);
}

/* ---- a commit whose answer was lost ------------------------------------ */

typedef struct kl_commit_job {
  kl_txn_t *txn;
  kl_err_t err;
} kl_commit_job_t;

static void *kl_commit_main(void *opaque) {
  kl_commit_job_t *job = opaque;
  job->err = kl_store_commit(job->txn, 10);
  return NULL;
}

/* Runs @p sql on the server's maintenance database, then waits until a
 * new session sees @p setting at @p value (the server reloaded). */
static void kl_admin_reload(PGconn *admin, const char *sql, const char *value) {
  kl_t_sql(admin, sql);
  kl_t_sql(admin, "SELECT pg_reload_conf()");
  char q[160];
  snprintf(q, sizeof(q),
           "SELECT count(*) FROM pg_settings WHERE name = "
           "'synchronous_standby_names' AND setting = '%s'",
           value);
  for (int i = 0; i < 3000; i++) {
    char uri[256];
    kl_t_pg_admin_uri(kl_t_pg_group(), uri, sizeof(uri));
    PGconn *fresh = PQconnectdb(uri);
    long long seen = kl_t_sql(fresh, q);
    PQfinish(fresh);
    if (seen)
      return;
    kl_t_sleep_ms(10);
  }
  fail_msg("the server did not reload: %s", sql);
}

/* As the worker does: the batch looks its id up first, so that the
 * commit knows it was absent before (what pg_landed() asks for). */
static void kl_prefetch_one(kl_txn_t *txn, const char *id) {
  const char *ids[1] = {id};
  kl_t_txn_prefetch(txn, ids, 1);
  assert_int_equal(kl_t_txn_seen(txn, id), KL_MARK_NONE);
}

/* A store on a database of its own, its partition 0 taken, and a
 * connection to the server's maintenance database. */
typedef struct kl_cut {
  char uri[256];
  PGconn *admin;
  kl_store_t *store;
  uint64_t epoch;
} kl_cut_t;

static void kl_cut_up(kl_cut_t *c, const char *db, const char *pool) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char admin_uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, db, c->uri, sizeof(c->uri)), 0);
  kl_t_pg_admin_uri(pg, admin_uri, sizeof(admin_uri));
  c->admin = PQconnectdb(admin_uri);
  c->store = kl_t_store_open(c->uri, "store.pg.pool", pool, NULL);
  c->epoch = kl_t_store_acquire(c->store, 0);
}

/* Commits a batch recording @p id (watermark 10) and terminates its
 * backend once it shows in pg_stat_activity as @p waiting (a condition).
 * @returns what the commit returned. */
static kl_err_t kl_cut_commit(kl_cut_t *c, const char *id,
                              const char *waiting) {
  kl_txn_t *txn = kl_t_store_begin(c->store, 0, c->epoch);
  kl_t_txn_put(txn, "acct/1", "5");
  kl_prefetch_one(txn, id);
  kl_t_txn_mark(txn, id, KL_MARK_APPLIED);
  kl_commit_job_t job = {txn, KL_OK};
  pthread_t thread;
  pthread_create(&thread, NULL, kl_commit_main, &job);
  char sql[256];
  snprintf(sql, sizeof(sql),
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
           "WHERE %s",
           waiting);
  long long killed = 0;
  for (int i = 0; i < 3000 && !killed; i++)
    if (!(killed = kl_t_sql(c->admin, sql)))
      kl_t_sleep_ms(10);
  pthread_join(thread, NULL);
  assert_true(killed >= 1);
  return job.err;
}

/* Asserts partition 0's watermark and @p id's mark, then ends. */
static void kl_cut_down(kl_cut_t *c, const char *id, int64_t watermark,
                        kl_mark_t mark) {
  assert_int_equal(kl_t_store_partition(c->store, 0).watermark, watermark);
  kl_txn_t *txn = kl_t_store_begin(c->store, 0, c->epoch);
  assert_int_equal(kl_t_txn_seen(txn, id), mark);
  kl_store_abort(txn);
  kl_store_destroy(c->store);
  PQfinish(c->admin);
}

/* The server commits a batch and its connection dies before the answer
 * reaches the worker (a COMMIT held waiting for a synchronous standby that
 * never comes, then its backend terminated: committed locally, answer
 * lost). The commit asks the server and reports the batch committed, so
 * that the worker does not run it again as duplicates of itself. */
static void kl_lost_answer(const char *db, const char *pool) {
  kl_cut_t c;
  kl_cut_up(&c, db, pool);
  kl_admin_reload(c.admin,
                  "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
                  "nobody");
  kl_err_t err = kl_cut_commit(&c, "id-1", "wait_event = 'SyncRep'");
  kl_admin_reload(c.admin, "ALTER SYSTEM RESET synchronous_standby_names", "");
  assert_int_equal(err, KL_OK);
  kl_cut_down(&c, "id-1", 10, KL_MARK_APPLIED);
}

static void test_commit_whose_answer_was_lost(void **state) {
  (void)state;
  kl_lost_answer("lost_answer", "4");
}

/* With store.pg.pool=1 the batch held the only connection: the question
 * gets one all the same (it waited the pool's 10 s for it, then ran the
 * batch again as duplicates of itself). */
static void test_commit_whose_answer_was_lost_pool_of_one(void **state) {
  (void)state;
  kl_lost_answer("lost_answer_1", "1");
}

/* The connection of a batch dies while its commit waits for a row lock:
 * the server rolls the batch back. Asked, it says so: the commit fails,
 * the watermark stays, the id is not recorded, and the batch may run
 * again. */
static void test_commit_lost_before_it_landed(void **state) {
  (void)state;
  kl_cut_t c;
  kl_cut_up(&c, "lost_commit", "4");
  PGconn *holder = PQconnectdb(c.uri);
  kl_t_sql(holder, "BEGIN");
  kl_t_sql(holder, "SELECT count(*) FROM (SELECT 1 FROM keylane_partitions "
                   "WHERE partition = 0 FOR UPDATE) l");
  kl_err_t err = kl_cut_commit(&c, "id-2", "wait_event_type = 'Lock'");
  kl_t_sql(holder, "ROLLBACK");
  PQfinish(holder);
  assert_int_not_equal(err, KL_OK);
  kl_cut_down(&c, "id-2", 0, KL_MARK_NONE);
}

/* ---- more partitions than connections --------------------------------- */

/* A worker owning 8 partitions on a store of 2 connections, with the
 * handler on the poll thread (@p concurrency 1) or on executors: every
 * event is applied, none waits KL__PG_POOL_WAIT_MS (10 s) for a connection
 * the worker's own open batches hold. */
static void kl_small_pool(const char *topic, const char *concurrency) {
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, topic, 8, 400);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "store.pg.pool", "2"), KL_OK);
  kl_store_t *store;
  assert_int_equal(kl_store_open(fx.where, conf, &store), KL_OK);
  kl_conf_destroy(conf);
  kl_t_ledger_fx_publish(&fx, 1600);
  char conc[64];
  snprintf(conc, sizeof(conc), "worker.concurrency=%s", concurrency);
  const char *const extra[] = {"worker.session.timeout.ms=3000", conc, NULL};
  kl_t_worker_t *w = kl_t_worker_start(fx.boot, fx.topic, "g", store, extra);
  for (int i = 0; i < 6000 && kl_applied(w) == 0; i++)
    kl_t_sleep_ms(10); /* the group's join is not what is measured */
  int64_t t0 = kl__mono_ns();
  int left = kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000);
  double secs = (double)(kl__mono_ns() - t0) / 1e9;
  fprintf(stderr, "pool 2, 8 partitions, concurrency %s: %.1f s\n", concurrency,
          secs);
  assert_int_equal(left, 0);
  /* Below one pool wait: none happened (it took 43 s when each begin past
   * the pool's bound waited). */
  assert_true(secs < 8.0);
  kl_end_verified(&fx, w, 1600);
  kl_store_destroy(store);
  kl_t_ledger_fx_down(&fx);
}

static void test_more_partitions_than_the_pool(void **state) {
  (void)state;
  kl_small_pool("small", "1");
}

static void test_more_partitions_than_the_pool_key_parallel(void **state) {
  (void)state;
  kl_small_pool("small_kp", "4");
}

/* A worker refuses a pool of one connection, naming the fix: its open
 * batch holds that connection, and each read of its outbox or timers
 * waited the pool's 10 s for it (about 100 events/s). Two is enough. */
static void test_worker_refuses_a_pool_of_one(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_fx_up(&fx, "pool_one", 2, 10);
  for (int pool = 1; pool <= 2; pool++) {
    kl_conf_t *conf = kl_conf_new();
    char v[8];
    snprintf(v, sizeof(v), "%d", pool);
    assert_int_equal(kl_conf_set(conf, "store.pg.pool", v), KL_OK);
    kl_store_t *store;
    assert_int_equal(kl_store_open(fx.where, conf, &store), KL_OK);
    assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                     KL_OK);
    kl_worker_t *worker = NULL;
    kl_err_t err =
        kl_worker_new(conf, fx.topic, store, kl_ledger_handler, NULL, &worker);
    if (pool == 1) {
      assert_int_equal(err, KL_ECONF);
      assert_non_null(strstr(kl_err_detail(), "store.pg.pool to 2 or more"));
    } else {
      assert_int_equal(err, KL_OK);
      kl_worker_destroy(worker);
    }
    kl_store_destroy(store);
    kl_conf_destroy(conf);
  }
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_survives_a_server_restart),
      cmocka_unit_test(test_handler_read_meets_a_server_restart),
      cmocka_unit_test(test_store_error_holds_the_partition),
      cmocka_unit_test(test_link_lost_between_a_batchs_events),
      cmocka_unit_test(test_commit_whose_answer_was_lost),
      cmocka_unit_test(test_commit_whose_answer_was_lost_pool_of_one),
      cmocka_unit_test(test_commit_lost_before_it_landed),
      cmocka_unit_test(test_more_partitions_than_the_pool),
      cmocka_unit_test(test_more_partitions_than_the_pool_key_parallel),
      cmocka_unit_test(test_worker_refuses_a_pool_of_one),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup_restartable,
                                kl_t_pg_group_teardown);
}
