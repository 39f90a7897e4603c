/*
 * A store belongs to one Kafka cluster and one consumer group (issue 39,
 * second attack: HIGH-2 and LOW-7), on embedded clusters: the first epoch
 * a worker takes for a topic records its cluster id and group in the
 * store (kl__store_acquire_owned()), and
 * - `keylane worker` on a second embedded cluster with the same topic name
 *   and group, against a store whose partitions hold watermark 0 (where the
 *   log check has nothing to compare), takes nothing: it stops the
 *   partitions (reason=cluster_mismatch), names both clusters and the fix,
 *   exits 3, and moves no epoch, while the live owner keeps applying;
 * - a typo'd group on the right cluster likewise (group_mismatch);
 * - `keylane store bind` records the new owner (--dry-run and --json
 *   first), after which a worker of the second cluster runs on the store;
 *   `store stats` shows the owner, `store reset -b -g` and `store
 *   rebuild` record theirs;
 * - on PostgreSQL, the second cluster is refused the same way (the
 *   group's server: the test skips without one, fails under
 *   KEYLANE_TEST_REQUIRE=postgresql).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/support.h"
#include "store/store_internal.h"
#include "worker/worker_internal.h"

typedef kl_t_ledger_fx_t kl_fx_t;

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

/* The id of the cluster at @p boot (rd_kafka_clusterid()), into @p id. */
static void kl_cluster_id(const char *boot, char *id, size_t size) {
  char errstr[256];
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  rd_kafka_conf_set(c, "bootstrap.servers", boot, errstr, sizeof(errstr));
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  char *cluster = rd_kafka_clusterid(rk, 10000);
  assert_non_null(cluster);
  snprintf(id, size, "%s", cluster);
  rd_kafka_mem_free(rk, cluster);
  rd_kafka_destroy(rk);
}

/* The fixture's topic (2 partitions) on cluster A, on the store at
 * @p store_uri (NULL: a new LMDB directory), and a live worker of group
 * "fleet" that owns both partitions with nothing applied yet: the store
 * records A and "fleet" as the topic's owner, at watermark 0. */
static kl_t_worker_t *kl_live_fleet(kl_fx_t *fx, const char *name,
                                    const char *store_uri, uint64_t epochs[2]) {
  kl_t_ledger_fx_up(fx, name, 2, 20, 21, store_uri);
  kl_t_worker_t *w =
      kl_t_worker_start(fx->boot, fx->topic, "fleet", fx->store, kl_fast);
  kl_worker_stats_t ws = {0};
  for (int i = 0; i < 600 && ws.owned < 2; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &ws, sizeof(ws));
  }
  assert_int_equal(ws.owned, 2);
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx->store, fx->topic, p, &st), KL_OK);
    assert_int_equal(st.watermark, 0);
    assert_true(st.epoch > 0);
    epochs[p] = st.epoch;
  }
  return w;
}

/* `keylane worker -b @p boot -t TOPIC -g @p group` on the fixture's store:
 * asserts it exits 3 within 60 s, stopping partitions for @p reason and
 * saying each of @p says (NULL-terminated), having taken nothing. */
static void kl_worker_refused(kl_fx_t *fx, const char *boot, const char *group,
                              const char *reason, const char *const *says) {
  const char *args[] = {"worker",  "-b",      boot,      "-t",
                        fx->topic, "--store", fx->where, "--handler",
                        "ledger",  "-g",      group,     "--session-timeout-ms",
                        "3000",    NULL};
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  char want[64];
  snprintf(want, sizeof(want), "reason=%s", reason);
  int said = r.rc == 3 && strstr(r.err, want) &&
             strstr(r.err, "this worker owns none") &&
             strstr(r.err, "keylane store bind -t ");
  for (size_t i = 0; said && says[i]; i++)
    said = strstr(r.err, says[i]) != NULL;
  if (!said)
    fail_msg("want exit 3 with %s, got %d:\n%s", want, r.rc, r.err);
  if (strstr(r.err, "assigned partition="))
    fail_msg("it took a partition:\n%s", r.err);
  kl_t_run_free(&r);
}

/* The fixture's epochs are still @p epochs, its watermarks 0. */
static void kl_assert_untaken(kl_fx_t *fx, const uint64_t epochs[2]) {
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx->store, fx->topic, p, &st), KL_OK);
    assert_int_equal(st.epoch, epochs[p]);
    assert_int_equal(st.watermark, 0);
  }
}

/* The live owner @p w still applies what comes, once. */
static void kl_assert_live_applies(kl_fx_t *fx, kl_t_worker_t *w) {
  kl_t_ledger_fx_publish(fx, 30);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 0, 30000),
                   0);
  kl_worker_stats_t ws;
  kl_worker_stats(w->worker, &ws, sizeof(ws));
  assert_int_equal(ws.fenced, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(fx);
}

/* A second embedded cluster B with the fixture's topic name, holding
 * @p n events of its own generator (*@p gen, to destroy). */
static kl_t_cluster_t *kl_cluster_b(kl_fx_t *fx, int n,
                                    kl__ledger_gen_t **gen) {
  kl_t_cluster_t *b;
  assert_int_equal(kl_t_cluster_new(1, fx->topic, 2, &b), KL_OK);
  assert_string_equal(kl_t_topic(b), fx->topic);
  *gen = kl__ledger_gen_new(20, 2, 22);
  kl_producer_t *producer = kl_t_producer(kl_t_bootstrap(b), *gen);
  assert_non_null(producer);
  kl_t_ledger_publish(*gen, producer, fx->topic, n);
  kl_producer_destroy(producer);
  return b;
}

/* HIGH-2: a worker pointed at another cluster (a wrong -b) with the same
 * topic name and group, on partitions nothing was applied of; on the
 * store at @p store_uri (NULL: LMDB). */
static void kl_foreign_cluster(const char *store_uri) {
  kl_fx_t fx;
  uint64_t epochs[2];
  kl_t_worker_t *w = kl_live_fleet(&fx, "twin", store_uri, epochs);
  kl__ledger_gen_t *gen_b;
  kl_t_cluster_t *b = kl_cluster_b(&fx, 20, &gen_b);
  char id_a[256], id_b[256], says_a[300], says_b[300];
  kl_cluster_id(fx.boot, id_a, sizeof(id_a));
  kl_cluster_id(kl_t_bootstrap(b), id_b, sizeof(id_b));
  assert_string_not_equal(id_a, id_b);
  snprintf(says_a, sizeof(says_a), "records Kafka cluster %s and group fleet",
           id_a);
  snprintf(says_b, sizeof(says_b), "this worker reads cluster %s", id_b);
  kl_worker_refused(&fx, kl_t_bootstrap(b), "fleet", "cluster_mismatch",
                    (const char *const[]){says_a, says_b,
                                          "belongs to another "
                                          "Kafka cluster",
                                          NULL});
  kl_assert_untaken(&fx, epochs);
  kl_assert_live_applies(&fx, w);
  kl__ledger_gen_destroy(gen_b);
  kl_t_cluster_destroy(b);
  kl_t_ledger_fx_down(&fx);
}

/* `keylane ARGS...` on the fixture's store, which cluster B's -b points
 * elsewhere: asserts it fails naming the recorded cluster @p id_a, the
 * command @p who and the fix. */
static void kl_hand_refused(const char *const *args, const char *who,
                            const char *id_a) {
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  char want[320];
  snprintf(want, sizeof(want),
           "the store records Kafka cluster %s and group fleet as the owner "
           "of topic",
           id_a);
  if (r.rc == 0 || !strstr(r.err, want) || !strstr(r.err, who) ||
      !strstr(r.err, "keylane store bind"))
    fail_msg("want a refusal saying \"%s\", got exit %d:\n%s", want, r.rc,
             r.err);
  kl_t_run_free(&r);
}

/* Third attack, H1 to H3: the commands that take partitions by hand
 * check the store's recorded owner as the worker does. `keylane replay`
 * with a wrong -b applied another cluster's log into the fleet's store
 * and fenced it; `replay --from-dlq` (the console's redrive too) took
 * the partitions for another cluster's letters; `store rebuild` with a
 * wrong -b applied a foreign log and bound the topic to the other
 * cluster. All are refused now, taking nothing. */
static void test_hand_commands_refuse_a_foreign_cluster(void **state) {
  (void)state;
  kl_fx_t fx;
  uint64_t epochs[2];
  kl_t_worker_t *w = kl_live_fleet(&fx, "hand", NULL, epochs);
  kl__ledger_gen_t *gen_b;
  kl_t_cluster_t *b = kl_cluster_b(&fx, 20, &gen_b);
  char id_a[256];
  kl_cluster_id(fx.boot, id_a, sizeof(id_a));
  const char *boot_b = kl_t_bootstrap(b);
  kl_hand_refused((const char *const[]){"replay", "-b", boot_b, "-t", fx.topic,
                                        "-p", "all", "--from", "watermark",
                                        "--store", fx.where, "--handler",
                                        "ledger", NULL},
                  "replay", id_a);
  kl_assert_untaken(&fx, epochs);
  /* A rebuild, partition by partition, into a store of its own: the first
   * records A and "fleet" (A's log now holds events to rebuild from); one
   * of B, or of A for another group, is refused and leaves that record. */
  kl_t_ledger_fx_publish(&fx, 10);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  char rebuilt[96];
  snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "rebuild", "-b", fx.boot, "-t", fx.topic,
                            "-p", "0", "--store", rebuilt, "--handler",
                            "ledger", "-X", "worker.group=fleet", NULL},
           NULL, 0, &r);
  if (r.rc != 0)
    fail_msg("store rebuild of partition 0 exited %d: %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_hand_refused((const char *const[]){"store", "rebuild", "-b", boot_b, "-t",
                                        fx.topic, "-p", "1", "--store", rebuilt,
                                        "--handler", "ledger", "-X",
                                        "worker.group=fleet", NULL},
                  "store rebuild", id_a);
  kl_hand_refused((const char *const[]){"store", "rebuild", "-b", fx.boot, "-t",
                                        fx.topic, "-p", "1", "--store", rebuilt,
                                        "--handler", "ledger", "-X",
                                        "worker.group=other", NULL},
                  "store rebuild", id_a);
  /* A dead letter of B's own fleet, redriven into A's store (H2). */
  char other[96];
  snprintf(other, sizeof(other), "%s/other", fx.dir);
  kl_store_t *other_store;
  assert_int_equal(kl_store_open(other, NULL, &other_store), KL_OK);
  kl_t_worker_t *wb =
      kl_t_worker_start(boot_b, fx.topic, "other", other_store, kl_fast);
  kl_producer_t *pb = kl_t_producer(boot_b, gen_b);
  assert_int_equal(kl__ledger_gen_send(pb, fx.topic, "k-bad", 5, "bad-1",
                                       "credit", 0, 0, NULL),
                   KL_OK);
  assert_int_equal(kl_flush(pb, 10000), KL_OK);
  kl_producer_destroy(pb);
  kl_worker_stats_t bs = {0};
  for (int i = 0; i < 600 && bs.dead_letters < 1; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(wb->worker, &bs, sizeof(bs));
  }
  assert_int_equal(bs.dead_letters, 1);
  assert_int_equal(kl_t_worker_stop(wb), KL_OK);
  kl_store_destroy(other_store);
  char dlq[160];
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx.topic);
  kl_hand_refused((const char *const[]){"replay", "-b", boot_b, "--from-dlq",
                                        dlq, "-t", fx.topic, "--store",
                                        fx.where, "--handler", "ledger", NULL},
                  "redrive", id_a);
  kl_store_t *copy;
  assert_int_equal(kl_store_open(rebuilt, NULL, &copy), KL_OK);
  kl__store_owner_t owner;
  assert_int_equal(kl__store_owner(copy, fx.topic, &owner), KL_OK);
  assert_string_equal(owner.cluster, id_a);
  assert_string_equal(owner.group, "fleet");
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(copy, fx.topic, 1, &st), KL_OK);
  assert_int_equal(st.epoch, 0); /* partition 1 was never taken */
  kl_store_destroy(copy);
  kl_assert_live_applies(&fx, w);
  kl__ledger_gen_destroy(gen_b);
  kl_t_cluster_destroy(b);
  kl_t_ledger_fx_down(&fx);
}

/* Third attack, M1: a worker fenced from outside its group takes its
 * partition back once the fencer is quiet, unless the store has been
 * bound to another owner meanwhile (`keylane store bind`): the old fleet
 * then fenced the new one back and skipped its own records. */
static void test_fenced_worker_does_not_retake_a_rebound_topic(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_t_ledger_fx_up(&fx, "rebound", 2, 20, 24, NULL);
  static const char *const retake[] = {"worker.session.timeout.ms=3000",
                                       "worker.fenced.retake.ms=3500", NULL};
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, "fleet", fx.store, retake);
  kl_worker_stats_t ws = {0};
  for (int i = 0; i < 600 && ws.owned < 2; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &ws, sizeof(ws));
  }
  assert_int_equal(ws.owned, 2);
  kl__store_owner_t other;
  assert_int_equal(kl__store_owner_make(&other, "another-cluster", "fleet"),
                   KL_OK);
  assert_int_equal(kl__store_bind(fx.store, fx.topic, &other), KL_OK);
  kl_partition_state_t taken;
  assert_int_equal(kl_store_acquire(fx.store, fx.topic, 0, &taken), KL_OK);
  kl_t_ledger_fx_publish(&fx, 10); /* the fenced lane sees its fence */
  kl_t_sleep_ms(9000); /* past two retake periods of a quiet fencer */
  kl_partition_state_t now;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &now), KL_OK);
  assert_int_equal(now.epoch, taken.epoch);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

static void test_foreign_cluster_is_refused(void **state) {
  kl_foreign_cluster(NULL);
}

/* The same on PostgreSQL (keylane_topic_owners; the group's server: the
 * test skips without one, fails under KEYLANE_TEST_REQUIRE=postgresql). */
static void test_foreign_cluster_is_refused_on_pg(void **state) {
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "cluster_twin", uri, sizeof(uri)), 0);
  kl_foreign_cluster(uri);
}

/* LOW-7: a typo'd group on the right cluster. */
static void test_typo_group_is_refused(void **state) {
  kl_fx_t fx;
  uint64_t epochs[2];
  kl_t_worker_t *w = kl_live_fleet(&fx, "typo", NULL, epochs);
  kl_worker_refused(&fx, fx.boot, "flete", "group_mismatch",
                    (const char *const[]){"belongs to another consumer group",
                                          "and group fleet as the topic's",
                                          "in group flete", NULL});
  kl_assert_untaken(&fx, epochs);
  kl_assert_live_applies(&fx, w);
  kl_t_ledger_fx_down(&fx);
}

/* `keylane store bind` of the fixture's topic to @p boot and "fleet":
 * asserts it exits 0; @returns its stdout (free()). */
static char *kl_bind(kl_fx_t *fx, const char *boot, const char *flag) {
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "bind", "-b", boot, "-t", fx->topic, "-g",
                            "fleet", "--store", fx->where, flag, NULL},
           NULL, 0, &r);
  if (r.rc != 0)
    fail_msg("store bind exited %d: %s", r.rc, r.err);
  char *out = strdup(r.out);
  kl_t_run_free(&r);
  return out;
}

/* `keylane store stats` shows the owner (@p id_b's, bound); `store reset
 * -b -g` records its cluster (@p id_a's, at the fixture's bootstrap) and
 * wants both; `store rebuild` from @p boot_b records B and its
 * worker.group in the store it builds. */
static void kl_assert_owner_tools(kl_fx_t *fx, const char *boot_b,
                                  const char *id_a, const char *id_b) {
  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "stats", "--store", fx->where, "-t",
                            fx->topic, "--json", NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  json_t *o = json_loads(r.out, 0, NULL);
  json_t *owner = json_array_get(json_object_get(o, "owners"), 0);
  assert_string_equal(json_string_value(json_object_get(owner, "cluster")),
                      id_b);
  assert_string_equal(json_string_value(json_object_get(owner, "group")),
                      "fleet");
  json_decref(o);
  kl_t_run_free(&r);

  kl_t_run((const char *[]){"store", "reset", "-t", fx->topic, "-p", "all",
                            "-b", fx->boot, "--store", fx->where, NULL},
           NULL, 0, &r);
  if (r.rc != 2 || !strstr(r.err, "-b and -g go together"))
    fail_msg("store reset -b without -g: %d %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"store", "reset", "-t", fx->topic, "-p", "all",
                            "-b", fx->boot, "-g", "fleet", "--store", fx->where,
                            NULL},
           NULL, 0, &r);
  char want[320];
  snprintf(want, sizeof(want), "recorded owner: cluster %s, group fleet", id_a);
  if (r.rc != 0 || !strstr(r.out, want))
    fail_msg("store reset -b -g: %d, want \"%s\":\n%s%s", r.rc, want, r.out,
             r.err);
  kl_t_run_free(&r);
  kl__store_owner_t rec;
  assert_int_equal(kl__store_owner(fx->store, fx->topic, &rec), KL_OK);
  assert_string_equal(rec.cluster, id_a);

  char fresh[64];
  kl_t_tmpdir(fresh);
  kl_t_run((const char *[]){"store", "rebuild", "-b", boot_b, "-t", fx->topic,
                            "--store", fresh, "--handler", "ledger", "-X",
                            "worker.group=fleet", NULL},
           NULL, 0, &r);
  if (r.rc != 0)
    fail_msg("store rebuild exited %d: %s", r.rc, r.err);
  kl_t_run_free(&r);
  kl_store_t *rebuilt;
  assert_int_equal(kl_store_open(fresh, NULL, &rebuilt), KL_OK);
  assert_int_equal(kl__store_owner(rebuilt, fx->topic, &rec), KL_OK);
  assert_string_equal(rec.cluster, id_b);
  assert_string_equal(rec.group, "fleet");
  kl_store_destroy(rebuilt);
  kl_t_rmrf(fresh);
}

/* The fleet moved to cluster B on purpose: `keylane store bind` records
 * B (its dry run records nothing), and a worker of B then runs. */
static void test_bind_adopts_a_new_cluster(void **state) {
  kl_fx_t fx;
  uint64_t epochs[2];
  kl_t_worker_t *w = kl_live_fleet(&fx, "moved", NULL, epochs);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl__ledger_gen_t *gen_b;
  kl_t_cluster_t *b = kl_cluster_b(&fx, 30, &gen_b);
  char id_a[256], id_b[256];
  kl_cluster_id(fx.boot, id_a, sizeof(id_a));
  kl_cluster_id(kl_t_bootstrap(b), id_b, sizeof(id_b));

  char *out = kl_bind(&fx, kl_t_bootstrap(b), "--dry-run");
  char want[1024];
  snprintf(want, sizeof(want),
           "recorded owner: cluster %s, group fleet\ntopic %s: new owner: "
           "cluster %s, group fleet",
           id_a, fx.topic, id_b);
  if (!strstr(out, want))
    fail_msg("want \"%s\" in:\n%s", want, out);
  free(out);
  kl__store_owner_t rec;
  assert_int_equal(kl__store_owner(fx.store, fx.topic, &rec), KL_OK);
  assert_string_equal(rec.cluster, id_a); /* a dry run records nothing */

  out = kl_bind(&fx, kl_t_bootstrap(b), "--json");
  json_t *o = json_loads(out, 0, NULL);
  assert_non_null(o);
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(o, "recorded"), "cluster")),
                      id_a);
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(o, "owner"), "cluster")),
                      id_b);
  json_decref(o);
  free(out);
  assert_int_equal(kl__store_owner(fx.store, fx.topic, &rec), KL_OK);
  assert_string_equal(rec.cluster, id_b);
  assert_string_equal(rec.group, "fleet");

  w = kl_t_worker_start(kl_t_bootstrap(b), fx.topic, "fleet", fx.store,
                        kl_fast);
  assert_int_equal(kl__ledger_gen_wait(gen_b, fx.store, fx.topic, 0, 30000), 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_assert_verified(gen_b, fx.store, fx.topic);
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx.store, fx.topic, p, &st), KL_OK);
    assert_true(st.epoch > epochs[p]);
  }
  kl_assert_owner_tools(&fx, kl_t_bootstrap(b), id_a, id_b);
  kl__ledger_gen_destroy(gen_b);
  kl_t_cluster_destroy(b);
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_foreign_cluster_is_refused),
      cmocka_unit_test(test_typo_group_is_refused),
      cmocka_unit_test(test_bind_adopts_a_new_cluster),
      cmocka_unit_test(test_hand_commands_refuse_a_foreign_cluster),
      cmocka_unit_test(test_fenced_worker_does_not_retake_a_rebound_topic),
      cmocka_unit_test(test_foreign_cluster_is_refused_on_pg),
  };
  /* The server for the PostgreSQL test; without one, that test skips. */
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
