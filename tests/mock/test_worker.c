/*
 * The worker on the embedded cluster (or KEYLANE_TEST_BOOTSTRAP's): apply
 * once, resume from the store, fencing of a paused owner, per-key order
 * across rebalances.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/cluster.h"
#include "support/ledger_checks.h"
#include "support/paused_owner.h"
#include "support/support.h"
#include "common/kafka.h"
#include "worker/checks.h"
#include "handlers/ledger.h"
#include "worker/worker_internal.h"
#include "keylane/handlers.h"

typedef kl_t_ledger_fx_t kl_fx_t;

static void kl_fx_up(kl_fx_t *fx, const char *topic, int partitions) {
  kl_t_ledger_fx_up(fx, topic, partitions, 50, 42, NULL);
}

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

/* A worker of group g1 on @p fx, set up on @p topic, that applied @p n
 * events once each (and skipped the n / 10 published twice). */
static kl_t_worker_t *kl_applied(kl_fx_t *fx, const char *topic, int partitions,
                                 int n) {
  kl_fx_up(fx, topic, partitions);
  kl_t_ledger_fx_publish(fx, n);
  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(fx->cluster), fx->topic,
                        kl_t_group(fx->cluster, "g1"), fx->store, kl_fast);
  kl_t_ledger_fx_assert_applied_once(fx, w, (uint64_t)n, (uint64_t)n / 10,
                                     30000);
  return w;
}

static void test_applies_each_event_once(void **state) {
  kl_fx_t fx;
  kl_t_worker_t *w = kl_applied(&fx, "once", 4, 2000);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx);

  /* A crash between the store commit and the Kafka commit looks, to the
   * next owner, like Kafka offsets that lag the store. A new group has no
   * Kafka offsets at all: the worker must resume from the store alone.
   * (The store is bound to the new group first, as an operator who
   * renames a fleet's group does: else it refuses it, group_mismatch.) */
  kl_partition_state_t before;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &before), KL_OK);
  kl_t_store_rebind(fx.store, fx.topic, kl_t_group(fx.cluster, "g2"));
  w = kl_t_worker_start(kl_t_bootstrap(fx.cluster), fx.topic,
                        kl_t_group(fx.cluster, "g2"), fx.store, kl_fast);
  kl_partition_state_t after = before;
  for (int i = 0; i < 200 && after.epoch == before.epoch; i++) {
    kl_t_sleep_ms(50);
    kl_store_partition(fx.store, fx.topic, 0, &after);
  }
  assert_true(after.epoch > before.epoch);
  kl_t_sleep_ms(1000);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.applied, 0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx);
  kl_t_ledger_fx_down(&fx);
}

/* The stats struct as a program built against an older, smaller header
 * knows it: its first fields only. */
typedef struct t_stats_old {
  uint64_t applied;
  uint64_t duplicates;
} t_stats_old_t;

/* kl_worker_stats() fills the caller's struct up to the size it passes,
 * and not a byte past it: an older program's struct, followed by its own
 * data, gets the fields it knows of and keeps the rest. */
static void test_stats_fill_only_the_callers_size(void **state) {
  kl_fx_t fx;
  kl_t_worker_t *w = kl_applied(&fx, "stats", 2, 100);

  assert_int_equal(sizeof(t_stats_old_t),
                   offsetof(kl_worker_stats_t, redelivered));
  struct {
    t_stats_old_t st;
    unsigned char after[sizeof(kl_worker_stats_t)]; /* the program's own */
  } old;
  memset(&old, 0xa5, sizeof(old));
  assert_int_equal(
      kl_worker_stats(w->worker, (kl_worker_stats_t *)&old.st, sizeof(old.st)),
      KL_OK);
  assert_int_equal(old.st.applied, 100);
  assert_int_equal(old.st.duplicates, 10);
  for (size_t i = 0; i < sizeof(old.after); i++)
    assert_int_equal(old.after[i], 0xa5);

  memset(&old, 0xa5, sizeof(old)); /* size 0: nothing to fill */
  assert_int_equal(kl_worker_stats(w->worker, (kl_worker_stats_t *)&old.st, 0),
                   KL_OK);
  assert_int_equal(old.st.applied, 0xa5a5a5a5a5a5a5a5ULL);
  assert_int_equal(kl_worker_stats(w->worker, NULL, 0), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "stats are required"));
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

/* A's application thread stalls in the hook; the group notices through
 * the poll interval and gives its partitions to B, which applies them.
 * With @p stop_a, A is told to stop as it wakes up, before it polls
 * again: it hears of the partitions it lost inside
 * rd_kafka_consumer_close(). */
static void kl_paused_owner(int stop_a) {
  kl_fx_t fx;
  kl_fx_up(&fx, "fence", 2);
  kl_t_ledger_fx_publish(&fx, 500);
  static const char *const slow[] = {"worker.session.timeout.ms=3000",
                                     "kafka.max.poll.interval.ms=3000", NULL};
  kl_t_pause_t pause = {.store = fx.store, .armed = 1};
  kl_t_worker_t *a =
      kl_t_worker_new(kl_t_bootstrap(fx.cluster), fx.topic,
                      kl_t_group(fx.cluster, "g"), fx.store, slow);
  pause.stop = stop_a ? a->worker : NULL;
  kl__worker_set_before_commit(a->worker, kl_t_pause_hook, &pause);
  kl_t_worker_go(a);
  kl_t_sleep_ms(500);
  kl_t_worker_t *b =
      kl_t_worker_start(kl_t_bootstrap(fx.cluster), fx.topic,
                        kl_t_group(fx.cluster, "g"), fx.store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  uint64_t fenced = kl_t_worker_fenced(a, 10000);
  assert_true(pause.saw_new_owner);
  /* One fenced batch per partition A had buffered when it stalled: one on
   * the embedded cluster, where B takes half; up to both on Kafka, where A
   * may hold both partitions when it leaves the group. */
  assert_true(fenced >= 1);
  /* Nothing of A's fenced batch exists: every event applied exactly once
   * across both workers, and the store agrees. */
  kl_t_worker_t *const both[] = {a, b};
  assert_int_equal(kl_t_workers_applied(both, 2, 500, 5000), 500);
  assert_int_equal(kl_t_worker_stop(a), KL_OK);
  assert_int_equal(kl_t_worker_stop(b), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx);
  kl_t_ledger_fx_down(&fx);
}

static void test_paused_owner_is_fenced(void **state) {
  kl_paused_owner(0);
}

/* Once the group has dropped a member, librdkafka 2.0.2 answers NULL to
 * rd_kafka_rebalance_protocol(), or blocks in it for ever, in the
 * rebalance callbacks that rd_kafka_consumer_close() serves: the worker
 * must still give its partitions up, and stop cleanly. (It asked, took the
 * NULL for a string, and the process died: the flaky test_worker_kafka.) */
static void test_owner_stopped_after_the_group_dropped_it(void **state) {
  kl_paused_owner(1);
}

static void test_order_holds_across_rebalances(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "order", 6);
  const char *boot = kl_t_bootstrap(fx.cluster);
  kl_t_worker_t *a = kl_t_worker_start(
      boot, fx.topic, kl_t_group(fx.cluster, "g"), fx.store, kl_fast);
  kl_t_worker_t *b = NULL, *c = NULL;
  for (int round = 0; round < 6; round++) {
    kl_t_ledger_fx_publish(&fx, 500);
    kl_t_sleep_ms(700);
    if (round == 1)
      b = kl_t_worker_start(boot, fx.topic, kl_t_group(fx.cluster, "g"),
                            fx.store, kl_fast);
    if (round == 3) {
      assert_int_equal(kl_t_worker_stop(a), KL_OK); /* drains, revokes */
      a = NULL;
    }
    if (round == 4)
      c = kl_t_worker_start(boot, fx.topic, kl_t_group(fx.cluster, "g"),
                            fx.store, kl_fast);
  }
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  assert_int_equal(kl_t_worker_stop(b), KL_OK);
  assert_int_equal(kl_t_worker_stop(c), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx);
  kl_t_ledger_fx_down(&fx);
}

static void test_refuses_partition_mismatch(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "mismatch", 3);
  static const char *const want[] = {"worker.expect.partitions=12", NULL};
  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(fx.cluster), fx.topic,
                        kl_t_group(fx.cluster, "g"), fx.store, want);
  pthread_join(w->thread, NULL);
  assert_int_equal(w->result, KL_EPARTITIONS);
  assert_non_null(strstr(w->detail, "has 3 partitions, the fleet expects 12"));
  kl_worker_destroy(w->worker);
  free(w);
  kl_t_ledger_fx_down(&fx);
}

/* A retake period within the session timeout could let a member the group
 * replaced take a partition back before it learns it: refused, saying so. */
static void test_refuses_retake_within_the_session(void **state) {
  kl_conf_t *conf = kl_conf_new();
  const char *const set[][2] = {{"kafka.bootstrap.servers", "127.0.0.1:1"},
                                {"worker.session.timeout.ms", "10000"},
                                {"worker.fenced.retake.ms", "10000"}};
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(kl_conf_set(conf, set[i][0], set[i][1]), KL_OK);
  kl_store_t *store;
  char dir[64];
  kl_t_tmpdir(dir);
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_worker_t *w = NULL;
  assert_int_equal(kl_worker_new(conf, "t", store, kl_ledger_handler, NULL, &w),
                   KL_ECONF);
  assert_null(w);
  assert_non_null(strstr(kl_err_detail(), "worker.fenced.retake.ms (10000) "
                                          "must exceed "
                                          "worker.session.timeout.ms (10000)"));
  assert_int_equal(kl_conf_set(conf, "worker.fenced.retake.ms", "0"),
                   KL_OK); /* never: allowed */
  assert_int_equal(kl_worker_new(conf, "t", store, kl_ledger_handler, NULL, &w),
                   KL_OK);
  kl_worker_destroy(w);
  kl_store_destroy(store);
  kl_conf_destroy(conf);
  kl_t_rmrf(dir);
}

/* ---- retention against store.dedup.retention ---------------------------- */

/* What the hook answers for the topic and for its dead-letter topic. */
/* [dlq?][retention.ms, cleanup.policy, retention.bytes] */
static const char *t_retention[2][3];

static const char *t_topic_config(const char *topic, const char *name) {
  size_t len = strlen(topic);
  int dlq = len > 4 && strcmp(topic + len - 4, ".dlq") == 0;
  return t_retention[dlq][strcmp(name, "retention.ms") == 0     ? 0
                          : strcmp(name, "cleanup.policy") == 0 ? 1
                                                                : 2];
}

/* Runs a worker with @p extra. One that should run (@p runs) is stopped
 * once it owns a partition, with its stats in @p st; one that should not
 * is joined. @returns what kl_worker_run() returned, its detail in
 * @p detail (512 bytes). */
static kl_err_t t_run_retention(kl_fx_t *fx, const char *const *extra, int runs,
                                kl_worker_stats_t *st, char *detail) {
  /* One group for every run: the store records the first run's as the
   * topic's owner and refuses a worker of another (group_mismatch). */
  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(fx->cluster), fx->topic,
                        kl_t_group(fx->cluster, "retention"), fx->store, extra);
  memset(st, 0, sizeof(*st));
  for (int i = 0; runs && i < 600 && st->owned == 0; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, st, sizeof(*st));
  }
  kl_worker_stop(w->worker);
  pthread_join(w->thread, NULL);
  kl_err_t err = w->result;
  snprintf(detail, 512, "%s", w->detail);
  kl_worker_destroy(w->worker);
  free(w);
  return err;
}

static void test_refuses_retention_longer_than_dedup(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "retention", 2);
  kl__checks_set_topic_config(t_topic_config);
  static const char *const dflt[] = {"worker.session.timeout.ms=3000", NULL};
  static const char *const warn[] = {"worker.session.timeout.ms=3000",
                                     "worker.retention.check=warn", NULL};
  kl_worker_stats_t st;
  char detail[512];

  char want[256];
  t_retention[0][0] = "1209600000"; /* 14d, the default dedup is 7d */
  assert_int_equal(t_run_retention(&fx, dflt, 0, &st, detail), KL_ECONF);
  snprintf(want, sizeof(want),
           "topic %s keeps records for 14d "
           "(retention.ms=1209600000) but store.dedup.retention is 7d",
           fx.topic);
  assert_non_null(strstr(detail, want));
  assert_non_null(strstr(detail, "applied twice"));
  assert_non_null(strstr(detail, "at least 14d"));

  t_retention[0][0] = "604800000"; /* the topic is fine, its letters not */
  t_retention[1][0] = "-1";
  assert_int_equal(t_run_retention(&fx, dflt, 0, &st, detail), KL_ECONF);
  snprintf(want, sizeof(want),
           "dead-letter topic %s.dlq keeps records "
           "forever (retention.ms=-1)",
           fx.topic);
  assert_non_null(strstr(detail, want));

  t_retention[1][0] = NULL; /* the broker's default: 7d */
  t_retention[0][1] = "compact";
  assert_int_equal(t_run_retention(&fx, dflt, 0, &st, detail), KL_ECONF);
  assert_non_null(strstr(detail, "keeps records forever "
                                 "(cleanup.policy=compact)"));

  /* The operator's override: it runs, says so, and the gauge shows it. */
  assert_int_equal(t_run_retention(&fx, warn, 1, &st, detail), KL_OK);
  assert_true(st.owned > 0);
  assert_int_equal(st.retention_override, 1);
  assert_int_equal(st.retention_unchecked, 0);

  t_retention[0][1] = "compact,delete"; /* deleted after 7d: covered */
  assert_int_equal(t_run_retention(&fx, dflt, 1, &st, detail), KL_OK);
  assert_true(st.owned > 0);
  assert_int_equal(st.retention_override, 0);
  kl_t_ledger_fx_down(&fx);
}

/* Runs a worker as t_run_retention() does. @returns its log. */
static char *t_run_logged(kl_fx_t *fx, const char *const *extra) {
  kl_worker_stats_t st;
  char detail[512];
  kl_t_stderr_t capture;
  kl_t_stderr_begin(&capture);
  kl_err_t err = t_run_retention(fx, extra, 1, &st, detail);
  char *log = kl_t_stderr_end(&capture);
  assert_int_equal(err, KL_OK);
  assert_true(st.owned > 0);
  return log;
}

/* A topic that keeps records for less than timer.max.delay: the worker
 * runs (a pending timer lives in the store), and says at start that a
 * rebuild loses the timers that wait longer, naming both and the fix. */
static void test_warns_retention_shorter_than_timers(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "timer-retention", 2);
  kl__checks_set_topic_config(t_topic_config);
  static const char *const dflt[] = {"worker.session.timeout.ms=3000", NULL};
  static const char *const one_day[] = {"worker.session.timeout.ms=3000",
                                        "timer.max.delay=1d", NULL};
  char want[256];
  t_retention[0][0] = "86400000"; /* 1d: within the dedup's 7d */
  char *log = t_run_logged(&fx, dflt);
  snprintf(want, sizeof(want),
           "topic %s keeps records for 1d "
           "(retention.ms=86400000), less than timer.max.delay 7d",
           fx.topic);
  const char *line = strstr(log, want);
  while (line && line > log && line[-1] != '\n')
    line--;
  if (!line || strncmp(strchr(line, ' '), " WARN ", 6) != 0 ||
      !strstr(log, "raise the topic's retention.ms to at least 604800000 "
                   "(7d), or lower timer.max.delay to at most 1d"))
    fail_msg("no warning \"%s\" with the fix in:\n%s", want, log);
  free(log);

  log = t_run_logged(&fx, one_day); /* within it now */
  snprintf(want, sizeof(want),
           "topic %s keeps records for 1d (retention.ms=86400000), at "
           "least timer.max.delay 1d",
           fx.topic);
  if (!strstr(log, want) || strstr(log, "less than timer.max.delay"))
    fail_msg("expected \"%s\" and no warning in:\n%s", want, log);
  free(log);

  t_retention[0][2] = "1073741824"; /* by size too: cannot be judged */
  log = t_run_logged(&fx, one_day);
  if (!strstr(log, "deletes records by size too "
                   "(retention.bytes=1073741824)"))
    fail_msg("no warning of retention.bytes in:\n%s", log);
  free(log);
  kl_t_ledger_fx_down(&fx);
}

/* The cluster answers again, whatever the test above left. */
static int t_retention_reset(void **state) {
  (void)state;
  kl__checks_set_topic_config(NULL);
  memset(t_retention, 0, sizeof(t_retention));
  return 0;
}

/* Sets retention.ms of @p topic on a real cluster (AlterConfigs). */
static void t_alter_retention(const char *boot, const char *topic,
                              const char *ms) {
  rd_kafka_conf_t *c = rd_kafka_conf_new();
  assert_int_equal(kl__kafka_set(c, "bootstrap.servers", boot), KL_OK);
  char errstr[256];
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_ConfigResource_t *res =
      rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
  rd_kafka_ConfigResource_set_config(res, "retention.ms", ms);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_AlterConfigs(rk, &res, 1, NULL, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
  assert_non_null(ev);
  assert_int_equal(rd_kafka_event_error(ev), 0);
  size_t n;
  const rd_kafka_ConfigResource_t **r = rd_kafka_AlterConfigs_result_resources(
      rd_kafka_event_AlterConfigs_result(ev), &n);
  assert_int_equal(n, 1);
  assert_int_equal(rd_kafka_ConfigResource_error(r[0]), 0);
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_ConfigResource_destroy(res);
  rd_kafka_destroy(rk);
}

/* Without the hook: a real broker answers (a topic that keeps 14d is
 * refused, one that keeps 1d runs with a warning of timer.max.delay);
 * the embedded cluster cannot (librdkafka 2.0.2's mock names no
 * controller), and the worker runs with keylane_worker_retention_unchecked. */
static void test_retention_read_from_the_cluster(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "retention-read", 2);
  static const char *const dflt[] = {"worker.session.timeout.ms=3000", NULL};
  kl_worker_stats_t st;
  char detail[512];
  if (kl_t_cluster_is_real(fx.cluster)) {
    assert_int_equal(t_run_retention(&fx, dflt, 1, &st, detail), KL_OK);
    assert_int_equal(st.retention_unchecked, 0);
    t_alter_retention(fx.boot, fx.topic, "1209600000");
    assert_int_equal(t_run_retention(&fx, dflt, 0, &st, detail), KL_ECONF);
    assert_non_null(strstr(detail, "keeps records for 14d "
                                   "(retention.ms=1209600000) but "
                                   "store.dedup.retention is 7d"));
    /* within the ids' retention, shorter than timer.max.delay: runs,
     * warning that a rebuild loses the timers that wait longer */
    t_alter_retention(fx.boot, fx.topic, "86400000");
    char *log = t_run_logged(&fx, dflt);
    if (!strstr(log, "keeps records for 1d (retention.ms=86400000), less "
                     "than timer.max.delay 7d"))
      fail_msg("no warning of timer.max.delay in:\n%s", log);
    free(log);
  } else {
    assert_int_equal(t_run_retention(&fx, dflt, 1, &st, detail), KL_OK);
    assert_true(st.owned > 0);
    assert_int_equal(st.retention_unchecked, 1);
    assert_int_equal(st.retention_override, 0);
  }
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_applies_each_event_once),
      cmocka_unit_test(test_stats_fill_only_the_callers_size),
      cmocka_unit_test(test_paused_owner_is_fenced),
      cmocka_unit_test(test_owner_stopped_after_the_group_dropped_it),
      cmocka_unit_test(test_order_holds_across_rebalances),
      cmocka_unit_test(test_refuses_partition_mismatch),
      cmocka_unit_test(test_refuses_retake_within_the_session),
      cmocka_unit_test_teardown(test_refuses_retention_longer_than_dedup,
                                t_retention_reset),
      cmocka_unit_test_teardown(test_warns_retention_shorter_than_timers,
                                t_retention_reset),
      cmocka_unit_test(test_retention_read_from_the_cluster),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
