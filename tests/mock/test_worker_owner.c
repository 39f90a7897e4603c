/*
 * A new owner checks its store against the fleet's group before it takes
 * a partition (worker/checks_log.h, kl__checks_log_owner()), on the
 * embedded cluster:
 * - `keylane worker` on an empty store, in a group that committed
 *   offsets, takes nothing, applies nothing, moves no epoch (the fleet's
 *   store and the group's offsets are as they were) and exits 3 naming
 *   the store and the fixes; `keylane store rebuild` into that store is
 *   the way to adopt it, after which a worker runs on it;
 * - a store that knows one partition of two (as after its row was
 *   deleted) stops the other, reason store_unknown on /healthz and
 *   /metrics, and applies the one it knows; rebuilding the missing
 *   partition into it is the fix;
 * - a store restored from a backup (an older epoch and watermark than the
 *   group committed) is refused the same way;
 * - a new fleet (a group that committed nothing) starts on an empty store
 *   as before;
 * - on PostgreSQL, a row of keylane_partitions deleted is refused too, and
 *   its row is not written (the group's PostgreSQL server: the test skips
 *   without one, fails under KEYLANE_TEST_REQUIRE=postgresql).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "cli/metrics_server.h"
#include "common/kafka.h"
#include "support/http.h"
#include "support/pg_group.h"
#include "support/ledger_checks.h"
#include "support/run.h"
#include "support/sql.h"
#include "support/support.h"
#include "worker/log_guard.h"
#include "worker/worker_internal.h"

typedef kl_t_ledger_fx_t kl_fx_t;

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

/* The fixture's topic with 2 partitions, @p n events applied by a worker
 * of group @p group on the fixture's store, which then stopped: the
 * group committed offsets and epochs for both partitions. */
static void kl_fleet_ran(kl_fx_t *fx, const char *name, const char *group,
                         int n, const char *store_uri) {
  kl_t_ledger_fx_up(fx, name, 2, 20, 11, store_uri);
  kl_t_ledger_fx_publish(fx, n);
  kl_t_worker_t *w =
      kl_t_worker_start(fx->boot, fx->topic, group, fx->store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
}

/* The epochs group @p group committed for partitions 0 and 1, and the
 * offsets. */
static void kl_group_committed(kl_fx_t *fx, const char *group,
                               uint64_t epochs[2], int64_t offsets[2]) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", fx->boot, errstr, sizeof(errstr));
  rd_kafka_conf_set(c, "group.id", group, errstr, sizeof(errstr));
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  const int32_t parts[2] = {0, 1};
  assert_int_equal(kl__kafka_committed_epochs(rk, fx->topic, parts, 2, epochs,
                                              offsets, 10000),
                   KL_OK);
  rd_kafka_destroy(rk);
}

/* Asserts that @p store holds no state of the fixture's partitions. */
static void kl_assert_untouched(kl_fx_t *fx, kl_store_t *store) {
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(store, fx->topic, p, &st), KL_OK);
    assert_int_equal(st.epoch, 0);
    assert_int_equal(st.watermark, 0);
    assert_int_equal(st.applied, 0);
  }
}

/* `keylane worker` of @p group on @p where: asserts it exits 3 within
 * 60 s naming the store's problem and its fixes, having taken nothing. */
static void kl_worker_refused(kl_fx_t *fx, const char *group, const char *where,
                              int32_t partition) {
  char conf_group[128], names[256];
  snprintf(conf_group, sizeof(conf_group), "worker.group=%s", group);
  const char *args[] = {
      "worker",  "-b",  fx->boot,    "-t",     fx->topic,
      "--store", where, "--handler", "ledger", "--session-timeout-ms",
      "3000",    "-X",  conf_group,  NULL};
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  snprintf(names, sizeof(names),
           "topic %s partition %" PRId32 " is unknown to this store", fx->topic,
           partition);
  if (r.rc != 3 || !strstr(r.err, "the store does not know 2 partition(s)") ||
      !strstr(r.err, names) || !strstr(r.err, group) ||
      !strstr(r.err, "point it there") ||
      !strstr(r.err, "keylane store rebuild") ||
      !strstr(r.err, "reason=store_unknown"))
    fail_msg("want exit 3 naming the unknown store, got %d:\n%s", r.rc, r.err);
  if (strstr(r.err, "assigned partition=") || strstr(r.err, "-1001"))
    fail_msg("it took a partition:\n%s", r.err);
  kl_t_run_free(&r);
}

/* `keylane store rebuild` of @p partitions ("all", or a list) of the
 * fixture's topic into @p where, above @p group's epochs. */
static void kl_rebuild(kl_fx_t *fx, const char *group, const char *where,
                       const char *partitions) {
  char conf_group[128];
  snprintf(conf_group, sizeof(conf_group), "worker.group=%s", group);
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "rebuild", "-b", fx->boot, "-t", fx->topic,
                            "-p", partitions, "--store", where, "--handler",
                            "ledger", "-X", conf_group, NULL},
           NULL, 0, &r);
  if (r.rc != 0)
    fail_msg("store rebuild -p %s exited %d: %s", partitions, r.rc, r.err);
  kl_t_run_free(&r);
}

/* The fix for a store the group's offsets are unknown to: kl_rebuild();
 * then a worker of @p group runs on it, and applies @p more events
 * published since once. */
static void kl_adopt_by_rebuild(kl_fx_t *fx, const char *group,
                                const char *where, const char *partitions,
                                int more) {
  kl_rebuild(fx, group, where, partitions);
  kl_store_t *store;
  assert_int_equal(kl_store_open(where, NULL, &store), KL_OK);
  kl_t_ledger_fx_publish(fx, more);
  kl_t_worker_t *w =
      kl_t_worker_start(fx->boot, fx->topic, group, store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, store, fx->topic, 0, 30000), 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_assert_verified(fx->gen, store, fx->topic);
  kl_store_destroy(store);
}

/* An empty store in a group that committed: refused, nothing moved. */
static void test_empty_store_is_refused(void **state) {
  kl_fx_t fx;
  const char *group = "fleet";
  kl_fleet_ran(&fx, "owned", group, 60, NULL);
  uint64_t epochs[2];
  int64_t offsets[2];
  kl_group_committed(&fx, group, epochs, offsets);
  assert_true(epochs[0] > 0 && epochs[1] > 0);
  assert_true(offsets[0] > 0 && offsets[1] > 0);

  char empty[64];
  kl_t_tmpdir(empty);
  kl_worker_refused(&fx, group, empty, 0);

  /* Nobody was fenced: the fleet's store and the group's offsets are as
   * they were; the empty store holds nothing. */
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx.store, fx.topic, p, &st), KL_OK);
    assert_int_equal(st.epoch, epochs[p]);
    assert_int_equal(st.watermark, offsets[p]);
  }
  uint64_t epochs_after[2];
  int64_t offsets_after[2];
  kl_group_committed(&fx, group, epochs_after, offsets_after);
  assert_memory_equal(epochs_after, epochs, sizeof(epochs));
  assert_memory_equal(offsets_after, offsets, sizeof(offsets));
  kl_store_t *store;
  assert_int_equal(kl_store_open(empty, NULL, &store), KL_OK);
  kl_assert_untouched(&fx, store);
  kl_store_destroy(store);

  /* Adopted on purpose: rebuilt from the log, above the group's epochs,
   * the store runs, and applies what comes next once. */
  kl_adopt_by_rebuild(&fx, group, empty, "all", 20);
  kl_t_rmrf(empty);
  kl_t_ledger_fx_down(&fx);
}

/* GET @p path: asserts @p status and that the body holds @p text. */
static void kl_assert_get(int port, const char *path, int status,
                          const char *text) {
  kl_t_http_resp_t resp;
  memset(&resp, 0, sizeof(resp));
  assert_int_equal(kl_t_http_once(port, "GET", path, NULL, NULL, &resp), 0);
  if (resp.status != status || !strstr(resp.body, text))
    fail_msg("GET %s: %d, expected %d with \"%s\":\n%s", path, resp.status,
             status, text, resp.body);
  kl_t_http_resp_free(&resp);
}

/* Waits up to 30 s for the worker's log guard to stop @p partition.
 * @returns its entry. */
static kl__log_guard_stop_t kl_wait_stopped(kl_t_worker_t *w,
                                            int32_t partition) {
  kl__log_guard_stop_t stops[4];
  for (int i = 0; i < 600; i++) {
    size_t n = kl__log_guard_stops(kl__worker_log_guard(w->worker), stops, 4);
    for (size_t j = 0; j < n; j++)
      if (stops[j].partition == partition && stops[j].stopped)
        return stops[j];
    kl_t_sleep_ms(50);
  }
  fail_msg("partition %" PRId32 " was not stopped", partition);
  return stops[0];
}

/* A store that knows partition 0 and not 1 (rebuilt with -p 0, as one
 * whose row of partition 1 was deleted): partition 1 stops, 0 runs. */
static void test_store_missing_a_partition(void **state) {
  kl_fx_t fx;
  const char *group = "fleet";
  kl_fleet_ran(&fx, "partial", group, 60, NULL);
  char partial[64], conf_group[128];
  kl_t_tmpdir(partial);
  snprintf(conf_group, sizeof(conf_group), "worker.group=%s", group);
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "rebuild", "-b", fx.boot, "-t", fx.topic,
                            "-p", "0", "--store", partial, "--handler",
                            "ledger", "-X", conf_group, NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  kl_t_run_free(&r);
  kl_store_t *store;
  assert_int_equal(kl_store_open(partial, NULL, &store), KL_OK);
  kl_partition_state_t st1, fleet1;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 1, &fleet1), KL_OK);

  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, store, kl_fast);
  kl__log_guard_stop_t s = kl_wait_stopped(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_STORE_UNKNOWN);
  assert_int_equal(s.check.committed, fleet1.watermark);
  assert_int_equal(s.check.committed_epoch, fleet1.epoch);
  assert_int_equal(s.check.store_epoch, 0);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL, fx.topic,
                                            w->worker, store, &server),
                   KL_OK);
  int port = kl__metrics_server_port(server);
  char text[512];
  snprintf(text, sizeof(text),
           "stopped partition 1: topic %s partition 1 is unknown to this "
           "store: the group committed offset %" PRId64
           " with owner epoch %" PRIu64,
           fx.topic, fleet1.watermark, fleet1.epoch);
  kl_assert_get(port, "/healthz", 503, text);
  snprintf(text, sizeof(text),
           "keylane_worker_partition_stopped{topic=\"%s\",partition=\"1\","
           "reason=\"store_unknown\"} 1\n",
           fx.topic);
  kl_assert_get(port, "/metrics", 200, text);
  /* Partition 0 runs: what comes next is applied there. */
  kl_t_ledger_fx_publish(&fx, 20);
  kl_worker_stats_t ws;
  for (int i = 0; i < 600; i++) {
    kl_worker_stats(w->worker, &ws, sizeof(ws));
    if (ws.applied > 0 && ws.owned == 1)
      break;
    kl_t_sleep_ms(50);
  }
  assert_true(ws.applied > 0);
  assert_int_equal(ws.owned, 1);
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  /* Partition 1 was not taken, in this store nor in the fleet's. */
  assert_int_equal(kl_store_partition(store, fx.topic, 1, &st1), KL_OK);
  assert_int_equal(st1.epoch, 0);
  assert_int_equal(st1.applied, 0);
  kl_partition_state_t now;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 1, &now), KL_OK);
  assert_int_equal(now.epoch, fleet1.epoch);

  /* The fix: rebuild the missing partition into the store. */
  kl_store_destroy(store);
  kl_adopt_by_rebuild(&fx, group, partial, "1", 10);
  kl_t_rmrf(partial);
  kl_t_ledger_fx_down(&fx);
}

/* Copies LMDB store directory @p from to @p to (a backup). */
static void kl_copy_store(const char *from, const char *to) {
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "cp -a %s/. %s/", from, to);
  assert_int_equal(system(cmd), 0);
}

/* A backup of the fleet's store, older than the group's offsets and
 * epochs: refused as an unknown store; `keylane replay --from watermark`
 * takes it on purpose. */
static void test_restored_backup_is_refused(void **state) {
  kl_fx_t fx;
  const char *group = "fleet";
  kl_fleet_ran(&fx, "backup", group, 40, NULL);
  char backup[64];
  kl_t_tmpdir(backup);
  kl_store_destroy(fx.store); /* closed while copied */
  kl_copy_store(fx.dir, backup);
  assert_int_equal(kl_store_open(fx.where, NULL, &fx.store), KL_OK);
  kl_t_ledger_fx_publish(&fx, 40);
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  kl_store_t *old;
  assert_int_equal(kl_store_open(backup, NULL, &old), KL_OK);
  kl_partition_state_t before;
  assert_int_equal(kl_store_partition(old, fx.topic, 0, &before), KL_OK);
  assert_true(before.epoch > 0);
  kl_t_stderr_t log;
  kl_t_stderr_begin(&log);
  w = kl_t_worker_start(fx.boot, fx.topic, group, old, kl_fast);
  /* It owns nothing: it stops by itself, failing, and applied nothing. */
  for (int i = 0; i < 600 && kl__worker_unowned(w->worker) == 0; i++)
    kl_t_sleep_ms(50);
  kl_worker_stats_t ws;
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.applied, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_ESTORE);
  char *said = kl_t_stderr_end(&log);
  char text[256];
  snprintf(text, sizeof(text),
           "topic %s partition 0 is unknown to this store: the group "
           "committed offset ",
           fx.topic);
  int named = strstr(said, text) &&
              strstr(said, "keylane replay -b BOOTSTRAP -t") &&
              strstr(said, "reason=store_unknown");
  snprintf(text, sizeof(text),
           "the store holds watermark %" PRId64 " and epoch %" PRIu64,
           before.watermark, before.epoch);
  named = named && strstr(said, text);
  free(said);
  assert_true(named);
  kl_partition_state_t after;
  assert_int_equal(kl_store_partition(old, fx.topic, 0, &after), KL_OK);
  assert_int_equal(after.epoch, before.epoch);
  assert_int_equal(after.watermark, before.watermark);
  kl_store_destroy(old);
  kl_t_rmrf(backup);
  kl_t_ledger_fx_down(&fx);
}

/* A backup taken with mdb_copy while the owner the group committed last
 * runs: its epoch is the group's, its watermark below the group's offset.
 * Refused too: the group's offsets never lead the store's commits, so the
 * store lost that owner's last commits, and the records after its
 * watermark would be applied again (their follow-ups published again
 * under new ids). Found by the attack on issue 39's fixes. */
static void test_backup_under_the_same_owner_is_refused(void **state) {
  kl_fx_t fx;
  const char *group = "fleet";
  kl_fleet_ran(&fx, "samebk", group, 40, NULL);
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, kl_fast);
  kl_t_ledger_fx_publish(&fx, 40);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  char backup[64], cmd[256];
  kl_t_tmpdir(backup);
  snprintf(cmd, sizeof(cmd), "mdb_copy %s %s", fx.dir, backup);
  assert_int_equal(system(cmd), 0); /* the owner still runs */
  kl_t_ledger_fx_publish(&fx, 40);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);

  kl_store_t *bk;
  assert_int_equal(kl_store_open(backup, NULL, &bk), KL_OK);
  kl_partition_state_t before[2];
  uint64_t epochs[2];
  int64_t offsets[2];
  kl_group_committed(&fx, group, epochs, offsets);
  for (int32_t p = 0; p < 2; p++) {
    assert_int_equal(kl_store_partition(bk, fx.topic, p, &before[p]), KL_OK);
    assert_int_equal(before[p].epoch, epochs[p]); /* the same owner */
  }
  assert_true(offsets[0] > before[0].watermark ||
              offsets[1] > before[1].watermark);
  w = kl_t_worker_start(fx.boot, fx.topic, group, bk, kl_fast);
  kl_worker_stats_t ws = {0};
  for (int i = 0; i < 200 && !kl__worker_unowned(w->worker); i++)
    kl_t_sleep_ms(50);
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.applied, 0);
  kl_t_worker_stop(w);
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t after;
    assert_int_equal(kl_store_partition(bk, fx.topic, p, &after), KL_OK);
    if (offsets[p] > before[p].watermark) /* refused: nothing taken */
      assert_int_equal(after.epoch, before[p].epoch);
    assert_int_equal(after.watermark, before[p].watermark);
  }
  kl_store_destroy(bk);
  kl_t_rmrf(backup);
  kl_t_ledger_fx_down(&fx);
}

/* PostgreSQL: the row of partition 1 deleted from keylane_partitions
 * (its handler state and ids kept). The worker stops partition 1 without
 * writing its row, applies partition 0, and a rebuild of partition 1 into
 * the store (its events then duplicates of the ids kept) lets it run. */
static void test_deleted_partition_row_on_pg(void **state) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "owner_rows", uri, sizeof(uri)), 0);
  kl_fx_t fx;
  const char *group = "fleet";
  kl_fleet_ran(&fx, "rows", group, 60, uri);
  kl_partition_state_t fleet1;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 1, &fleet1), KL_OK);
  assert_true(fleet1.watermark > 0);
  PGconn *conn = PQconnectdb(uri);
  assert_int_equal(PQstatus(conn), CONNECTION_OK);
  char sql[256];
  snprintf(sql, sizeof(sql),
           "WITH d AS (DELETE FROM keylane_partitions WHERE topic = '%s' "
           "AND partition = 1 RETURNING 1) SELECT count(*) FROM d",
           fx.topic);
  assert_int_equal(kl_t_sql(conn, sql), 1);

  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, kl_fast);
  kl__log_guard_stop_t s = kl_wait_stopped(w, 1);
  assert_int_equal(s.check.verdict, KL__CHECKS_LOG_STORE_UNKNOWN);
  assert_int_equal(s.check.committed, fleet1.watermark);
  assert_int_equal(s.check.committed_epoch, fleet1.epoch);
  kl_t_ledger_fx_publish(&fx, 10);
  kl_worker_stats_t ws = {0};
  for (int i = 0; i < 600 && ws.applied == 0; i++) {
    kl_worker_stats(w->worker, &ws, sizeof(ws));
    kl_t_sleep_ms(50);
  }
  assert_true(ws.applied > 0);
  assert_int_equal(ws.owned, 1);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  snprintf(sql, sizeof(sql),
           "SELECT count(*) FROM keylane_partitions WHERE topic = '%s' AND "
           "partition = 1",
           fx.topic);
  assert_int_equal(kl_t_sql(conn, sql), 0); /* no epoch was taken */
  PQfinish(conn);

  /* The rebuild finds partition 1's ids in the store (duplicates, its
   * balances untouched), and a worker then takes it: every balance right,
   * with what comes next. The applied counters went with the row. */
  kl_rebuild(&fx, group, uri, "1");
  kl_t_ledger_fx_publish(&fx, 10);
  w = kl_t_worker_start(fx.boot, fx.topic, group, fx.store, kl_fast);
  kl__ledger_verdict_t v = {0};
  for (int i = 0; i < 600; i++) {
    assert_int_equal(kl__ledger_gen_verify(fx.gen, fx.store, fx.topic, &v),
                     KL_OK);
    if (v.keys_ok == v.keys)
      break;
    kl_t_sleep_ms(50);
  }
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.keys_ok, v.keys);
  assert_int_equal(v.violations, 0);
  kl_t_ledger_fx_down(&fx);
}

/* A group that committed nothing: an empty store starts as it always did. */
static void test_new_fleet_starts(void **state) {
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "fresh", 2, 20, 12, NULL);
  kl_t_ledger_fx_publish(&fx, 40);
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, "new", fx.store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  kl_worker_stats_t ws;
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.owned, 2);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_assert_verified(fx.gen, fx.store, fx.topic);
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty_store_is_refused),
      cmocka_unit_test(test_store_missing_a_partition),
      cmocka_unit_test(test_restored_backup_is_refused),
      cmocka_unit_test(test_backup_under_the_same_owner_is_refused),
      cmocka_unit_test(test_new_fleet_starts),
      cmocka_unit_test(test_deleted_partition_row_on_pg),
  };
  /* The server for the PostgreSQL test; without one, that test skips. */
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
