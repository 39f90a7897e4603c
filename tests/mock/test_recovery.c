/*
 * Recovery that finishes, on the embedded cluster (and a PostgreSQL store
 * the program starts, for one test): a slow replay beside a
 * live worker it fenced is not taken back while it works, one stopped past
 * the retake period is, and its late commit refused; a retake whose seek
 * fails costs no epoch and backs off; slow handlers never keep the poll
 * thread from polling past max.poll.interval.ms, and a handler timeout
 * that could is refused at start.
 *
 * The live worker here holds its events (its handler answers RETRY while
 * `hold` is set) until the fencer has taken the partitions, so that the
 * fencer has work to do while the worker is alive and fenced.
 *
 * Run as `test_recovery --replay-child ...` it is the replay of the
 * SIGSTOP test, in a process of its own (see t_replay_child()).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "common/kafka_pos.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/support.h"
#include "support/cluster.h"
#include "handlers/ledger.h"
#include "worker/redrive.h"
#include "worker/replay.h"
#include "worker/worker_internal.h"
#include "keylane/handlers.h"

typedef kl_t_ledger_fx_t t_fx_t;

/* Short periods, so that a retake takes seconds: the retake period must
 * exceed the session timeout. */
#define T_SESSION "worker.session.timeout.ms=3000"
#define T_RETAKE "worker.fenced.retake.ms=3500"
#define T_RETAKE_MS 3500
/* The check period of worker.c at that retake period: a quarter of it. */
#define T_CHECK_MS (T_RETAKE_MS / 4)
/* The replay's handler time per event, the 40 ms. */
#define T_SLOW_MS 40

static atomic_int t_hold; /* the live worker's handler answers RETRY */
static atomic_int t_handled;

static kl_handler_result_t t_held_ledger(void *opaque, const kl_event_t *ev,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *errbuf, size_t errbuf_size) {
  if (atomic_load(&t_hold)) {
    snprintf(errbuf, errbuf_size, "held by the test");
    return KL_HANDLER_RETRY;
  }
  return kl_ledger_handler(opaque, ev, fence, txn, errbuf, errbuf_size);
}

/* A ledger worker on its own thread with @p handler and the test's
 * periods; @p extra adds "key=value" settings. Not started: kl_t_worker_go. */
static kl_t_worker_t *t_worker_new(t_fx_t *fx, kl_handler_fn_t *handler,
                                   const char *const *extra) {
  static const char *const base[] = {T_SESSION,
                                     T_RETAKE,
                                     "worker.retry.initial.ms=50",
                                     "worker.retry.max.ms=200",
                                     "worker.max.attempts=1000",
                                     NULL};
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.group", "g"), KL_OK);
  for (int pass = 0; pass < 2; pass++) {
    const char *const *set = pass ? extra : base;
    for (size_t i = 0; set && set[i]; i++) {
      char key[128];
      const char *eq = strchr(set[i], '=');
      snprintf(key, sizeof(key), "%.*s", (int)(eq - set[i]), set[i]);
      assert_int_equal(kl_conf_set(conf, key, eq + 1), KL_OK);
    }
  }
  kl_t_worker_t *tw = calloc(1, sizeof(*tw));
  assert_non_null(tw);
  if (kl_worker_new(conf, fx->topic, fx->store, handler, NULL, &tw->worker))
    fail_msg("worker: %s", kl_err_detail());
  kl_conf_destroy(conf);
  return tw;
}

static uint64_t t_epoch(t_fx_t *fx, int32_t partition) {
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx->store, fx->topic, partition, &st),
                   KL_OK);
  return st.epoch;
}

/* Waits until every partition's epoch is at least @p epoch. */
static void t_wait_epochs(t_fx_t *fx, uint64_t epoch, int ms) {
  for (int waited = 0;; waited += 20) {
    int all = 1;
    for (int32_t p = 0; p < fx->partitions; p++)
      all &= t_epoch(fx, p) >= epoch;
    if (all)
      return;
    if (waited >= ms)
      fail_msg("the partitions did not reach epoch %llu in %d ms",
               (unsigned long long)epoch, ms);
    kl_t_sleep_ms(20);
  }
}

/* A live worker that owns every partition (epoch 1) and holds what it is
 * given; then @p n events it has not applied. */
static kl_t_worker_t *t_live_worker_holding(t_fx_t *fx, int n) {
  atomic_store(&t_hold, 1);
  kl_t_worker_t *w = t_worker_new(fx, t_held_ledger, NULL);
  kl_t_worker_go(w);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 1, 30000),
                   0);
  kl_t_ledger_fx_publish(fx, n);
  return w;
}

/* After the fencer: the worker takes its partitions back from the
 * watermark and applies what follows; every event applied once. */
static void t_assert_worker_resumes(t_fx_t *fx, kl_t_worker_t *w) {
  kl_t_ledger_fx_publish(fx, 50);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 0, 30000),
                   0);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.owned, fx->partitions);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(fx);
}

/* ---- a replay -------------------------------------------------------- */

/* The replay's handler: the slow one, 40 ms an event. The first
 * call releases the live worker (the replay holds the partitions by then),
 * which then commits, is fenced, and watches. At event stop_at, SIGSTOP. */
static int t_stop_at;

static kl_handler_result_t t_slow_ledger(void *opaque, const kl_event_t *ev,
                                         const kl_fence_t *fence, kl_txn_t *txn,
                                         char *errbuf, size_t errbuf_size) {
  atomic_store(&t_hold, 0);
  if (atomic_fetch_add(&t_handled, 1) + 1 == t_stop_at)
    raise(SIGSTOP);
  kl_t_sleep_ms(T_SLOW_MS);
  return kl_ledger_handler(opaque, ev, fence, txn, errbuf, errbuf_size);
}

/* Replays @p topic from the beginning with the slow handler. */
static kl__replay_t *t_replay_run(const char *boot, const char *topic,
                                  kl_store_t *store, kl_conf_t **conf) {
  *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(*conf, "kafka.bootstrap.servers", boot), KL_OK);
  assert_int_equal(kl_conf_set(*conf, "worker.fenced.retake.ms", "3500"),
                   KL_OK);
  kl__replay_opts_t opts = {.conf = *conf,
                            .topic = topic,
                            .store = store,
                            .handler = t_slow_ledger,
                            .to = {KL__POS_END, 0}};
  assert_int_equal(kl__pos_parse("beginning", kl__now_ms(), &opts.from), KL_OK);
  kl__replay_t *r;
  assert_int_equal(kl__replay_new(&opts, &r), KL_OK);
  assert_int_equal(kl__replay_run(r), KL_OK);
  return r;
}

/* The test: 200 events at 40 ms take the replay 8 s, about 4 s a
 * partition, each more than the retake period without a commit (a batch is
 * up to 1,000 events). The replay beats every partition it holds, so the
 * live worker it fenced leaves them alone: it ends done, having applied
 * everything; then the worker takes its partitions back (each once its
 * batch is done) and goes on. */
static void t_slow_replay_beside_a_live_worker(const char *store_uri) {
  t_fx_t fx;
  kl_t_ledger_fx_up(&fx, "slow", 2, 40, 7, store_uri);
  kl_t_worker_t *w = t_live_worker_holding(&fx, 200);
  t_stop_at = 0;
  kl_conf_t *conf;
  kl__replay_t *r = t_replay_run(fx.boot, fx.topic, fx.store, &conf);
  kl__replay_part_t total;
  kl__replay_totals(r, &total);
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(r, &n);
  for (size_t i = 0; i < n; i++)
    if (parts[i].status != KL__REPLAY_DONE)
      fail_msg("replay partition %d ended %s: %s", (int)parts[i].partition,
               kl__replay_status_name(parts[i].status), parts[i].why);
  assert_int_equal(total.applied, kl__ledger_gen_published(fx.gen));
  kl__replay_destroy(r);
  kl_conf_destroy(conf);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.fenced, 2);
  t_assert_worker_resumes(&fx, w);
  for (int32_t p = 0; p < 2; p++)
    assert_int_equal(t_epoch(&fx, p), 3); /* taken back once it was done */
  kl_t_ledger_fx_down(&fx);
}

static void test_slow_replay_beside_a_live_worker_finishes(void **state) {
  t_slow_replay_beside_a_live_worker(NULL);
}

/* The same on PostgreSQL, whose heartbeat is an UPDATE of the partitions'
 * row on a connection of its own while the batch holds another. */
static void test_slow_replay_beside_a_live_worker_finishes_on_pg(void **s) {
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(kl_t_pg_need(), "slow", uri, sizeof(uri)),
                   0);
  t_slow_replay_beside_a_live_worker(uri);
}

/* The replay of the SIGSTOP test: argv = --replay-child BOOT TOPIC STORE
 * STOP_AT. Exits 0 when every partition is done, 3 when one was fenced,
 * 1 otherwise. */
static int t_replay_child(char **argv) {
  kl_store_t *store;
  if (kl_store_open(argv[4], NULL, &store)) {
    fprintf(stderr, "replay child: %s\n", kl_err_detail());
    return 1;
  }
  t_stop_at = atoi(argv[5]);
  kl_conf_t *conf;
  kl__replay_t *r = t_replay_run(argv[2], argv[3], store, &conf);
  kl__replay_part_t total;
  kl__replay_totals(r, &total);
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(r, &n);
  for (size_t i = 0; i < n; i++)
    printf("partition %d %s applied=%llu: %s\n", (int)parts[i].partition,
           kl__replay_status_name(parts[i].status),
           (unsigned long long)parts[i].applied, parts[i].why);
  kl__replay_destroy(r);
  kl_conf_destroy(conf);
  kl_store_destroy(store);
  return total.status == KL__REPLAY_DONE     ? 0
         : total.status == KL__REPLAY_FENCED ? 3
                                             : 1;
}

/* A replay that stops (SIGSTOP, in a handler, its batch open) and stays
 * stopped past the retake period is taken back: the worker acquires a new
 * epoch and applies from the watermark; resumed, the replay is refused
 * (fenced) and commits nothing, so every event still applies once. */
static void test_replay_stopped_past_the_period_is_fenced(void **state) {
  t_fx_t fx;
  kl_t_ledger_fx_up(&fx, "stopped", 2, 40, 9, NULL);
  kl_t_worker_t *w = t_live_worker_holding(&fx, 200);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "test_recovery", "--replay-child", fx.boot,
          fx.topic, fx.where, "20", (char *)NULL);
    _exit(127);
  }
  t_wait_epochs(&fx, 2, 30000); /* the replay took both */
  atomic_store(&t_hold, 0);
  int status;
  assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
  assert_true(WIFSTOPPED(status));
  int64_t stopped = kl__mono_ns();
  t_wait_epochs(&fx, 3, 30000); /* the worker took both back */
  /* Not before the period, less the beat period (1 s) it last beat in. */
  assert_true(kl__mono_ns() - stopped >=
              (int64_t)(T_RETAKE_MS - 1000) * 1000000);
  kill(pid, SIGCONT);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 3); /* fenced */
  for (int32_t p = 0; p < 2; p++)
    assert_int_equal(t_epoch(&fx, p), 3);
  t_assert_worker_resumes(&fx, w);
  kl_t_ledger_fx_down(&fx);
}

/* ---- a redrive -------------------------------------------------------- */

/* The redrive's handler: still broken, it answers RETRY to every letter;
 * its first call releases the live worker, as t_slow_ledger does. */
static kl_handler_result_t t_still_broken(void *opaque, const kl_event_t *ev,
                                          const kl_fence_t *fence,
                                          kl_txn_t *txn, char *errbuf,
                                          size_t errbuf_size) {
  (void)opaque, (void)ev, (void)fence, (void)txn;
  atomic_store(&t_hold, 0);
  snprintf(errbuf, errbuf_size, "still broken");
  return KL_HANDLER_RETRY;
}

/* A dead letter of @p topic's partition 0 at @p offset: a credit with an
 * id of its own, the headers a worker gives it. */
static void t_letter(t_fx_t *fx, const char *dlq, int64_t offset) {
  kl_event_t ev = {.key = "acct-1",
                   .key_len = 6,
                   .type = "credit",
                   .type_len = 6,
                   .payload = "\x81\xa6"
                              "amount"
                              "\x05",
                   .payload_len = 9};
  char id[37], off[24];
  kl_event_make_id(id);
  ev.id = id;
  ev.id_len = strlen(id);
  void *buf;
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &buf, &len), KL_OK);
  snprintf(off, sizeof(off), "%lld", (long long)offset);
  const char *const hdrs[] = {"keylane.dlq.topic",
                              fx->topic,
                              "keylane.dlq.partition",
                              "0",
                              "keylane.dlq.offset",
                              off,
                              "keylane.dlq.reason",
                              "handler_fail",
                              NULL};
  assert_int_equal(kl_t_produce_raw(fx->boot, dlq, 0, "acct-1", buf, len, hdrs),
                   0);
  free(buf);
}

/* The redrive case: letters that keep failing commit nothing, and
 * each takes 1.5 s of backoff (5 attempts), so 4 of them hold the
 * partition 6 s without a change but the beats. The live worker it fenced
 * leaves it alone: every letter ends failed, none fenced; then the worker
 * takes the partition back and goes on. */
static void test_redrive_of_failing_letters_beside_a_live_worker(void **s) {
  t_fx_t fx;
  kl_t_ledger_fx_up(&fx, "rdv", 1, 10, 11, NULL);
  assert_int_equal(kl_t_cluster_topic_create(fx.cluster, "rdv.dlq", 1), KL_OK);
  const char *dlq = kl_t_name(fx.cluster, "rdv.dlq");
  atomic_store(&t_hold, 0);
  kl_t_worker_t *w = t_worker_new(&fx, t_held_ledger, NULL);
  kl_t_worker_go(w);
  kl_t_ledger_fx_publish(&fx, 10);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  atomic_store(&t_hold, 1);
  /* The worker holds these. Nine: no re-published one among them, whose
   * original the worker applied already. It would complete as a duplicate
   * beyond the held watermark, be committed so, and count once more when
   * the worker reads it again after the retake (the store counts skips). */
  kl_t_ledger_fx_publish(&fx, 9);
  for (int64_t offset = 0; offset < 4; offset++)
    t_letter(&fx, dlq, offset); /* below the watermark: redriven */
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.fenced.retake.ms", "3500"), KL_OK);
  kl__redrive_opts_t o = {.conf = conf,
                          .dlq_topic = dlq,
                          .topic = fx.topic,
                          .store = fx.store,
                          .handler = t_still_broken,
                          .from = {KL__POS_BEGINNING, 0},
                          .to = {KL__POS_END, 0}};
  kl__redrive_t *r = NULL;
  assert_int_equal(kl__redrive_run(&o, &r), KL_OK);
  size_t n;
  const kl__redriven_t *out = kl__redrive_results(r, &n);
  assert_int_equal(n, 4);
  for (size_t i = 0; i < n; i++)
    if (out[i].outcome != KL__OUT_FAILED)
      fail_msg("letter %zu ended %s: %s", i, kl__outcome_name(out[i].outcome),
               out[i].why);
  kl__redrive_destroy(r);
  kl_conf_destroy(conf);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.fenced, 1);
  t_assert_worker_resumes(&fx, w);
  assert_int_equal(t_epoch(&fx, 0), 3); /* worker, redrive, the retake */
  kl_t_ledger_fx_down(&fx);
}

/* ---- a retake whose seek fails ---------------------------------------- */

typedef struct t_seeks {
  atomic_int calls;
  int fail; /* the first this many fail */
  int64_t at_ns[16];
} t_seeks_t;

static int t_seek_hook(void *opaque, int32_t partition) {
  (void)partition;
  t_seeks_t *s = opaque;
  int i = atomic_fetch_add(&s->calls, 1);
  if (i < 16)
    s->at_ns[i] = kl__mono_ns();
  return i < s->fail ? RD_KAFKA_RESP_ERR__TRANSPORT : 0;
}

/* The test fences the worker itself, as a replay would, and goes quiet.
 * The worker's first three seeks fail: it acquires no epoch for them (the
 * holder is not fenced again at every try), tries less and less often,
 * and takes the partition once the seek works: one epoch in all. */
static void test_failed_seek_takes_no_epoch(void **state) {
  t_fx_t fx;
  kl_t_ledger_fx_up(&fx, "seek", 1, 20, 5, NULL);
  atomic_store(&t_hold, 0);
  kl_t_worker_t *w = t_worker_new(&fx, t_held_ledger, NULL);
  t_seeks_t seeks = {.fail = 3};
  kl__worker_set_seek_hook(w->worker, t_seek_hook, &seeks);
  kl_t_worker_go(w);
  kl_t_ledger_fx_publish(&fx, 20);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  kl_partition_state_t fencer;
  assert_int_equal(kl_store_acquire(fx.store, fx.topic, 0, &fencer), KL_OK);
  kl_t_ledger_fx_publish(&fx, 20); /* the worker's commit is refused */
  t_wait_epochs(&fx, fencer.epoch + 1, 60000);
  /* 3 failed, then one that worked (a loaded machine may add a real
   * failure: librdkafka timing the seek out, which costs no epoch either). */
  assert_true(atomic_load(&seeks.calls) >= 4);
  assert_int_equal(t_epoch(&fx, 0), fencer.epoch + 1);
  /* Backoff: one check period, then doubling, up to the retake period. */
  const int64_t ms = 1000000;
  assert_true(seeks.at_ns[1] - seeks.at_ns[0] >= T_CHECK_MS * ms);
  assert_true(seeks.at_ns[2] - seeks.at_ns[1] >= 2 * T_CHECK_MS * ms);
  assert_true(seeks.at_ns[3] - seeks.at_ns[2] >= T_RETAKE_MS * ms);
  t_assert_worker_resumes(&fx, w);
  assert_int_equal(t_epoch(&fx, 0), fencer.epoch + 1);
  kl_t_ledger_fx_down(&fx);
}

/* ---- the poll thread is never starved ---------------------------------- */

#define T_STARVE_MS 500

static kl_handler_result_t t_slowish_ledger(void *opaque, const kl_event_t *ev,
                                            const kl_fence_t *fence,
                                            kl_txn_t *txn, char *errbuf,
                                            size_t errbuf_size) {
  kl_t_sleep_ms(T_STARVE_MS);
  return kl_ledger_handler(opaque, ev, fence, txn, errbuf, errbuf_size);
}

/* At concurrency 1 the poll thread runs the handlers. With 500 ms each and
 * max.poll.interval.ms at 6 s (the embedded cluster's first join takes 3 s,
 * which a much shorter interval times out), 16 events before the budget
 * check keep it from polling for 8 s: the member is evicted, rejoins and
 * takes a new epoch. Checked before each event, it is back within 520 ms
 * and keeps its epoch throughout. */
static void test_slow_handlers_do_not_starve_the_poll_thread(void **state) {
  t_fx_t fx;
  kl_t_ledger_fx_up(&fx, "starve", 1, 20, 3, NULL);
  static const char *const tight[] = {
      "worker.session.timeout.ms=3000", "kafka.max.poll.interval.ms=6000",
      "worker.fenced.retake.ms=0", "worker.handler.timeout.ms=1000", NULL};
  kl_t_worker_t *w = t_worker_new(&fx, t_slowish_ledger, tight);
  kl_t_worker_go(w);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 1, 30000),
                   0);
  kl_t_ledger_fx_publish(&fx, 20);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 60000),
                   0);
  assert_int_equal(t_epoch(&fx, 0), 1); /* never evicted */
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_assert_verified(&fx);
  kl_t_ledger_fx_down(&fx);
}

static kl_err_t t_worker_new_with(const char *handler_ms, const char *poll_ms) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.handler.timeout.ms", handler_ms),
                   KL_OK);
  if (poll_ms)
    assert_int_equal(kl_conf_set(conf, "kafka.max.poll.interval.ms", poll_ms),
                     KL_OK);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_worker_t *w = NULL;
  kl_err_t err = kl_worker_new(conf, "t", store, kl_ledger_handler, NULL, &w);
  assert_true(err ? w == NULL : w != NULL);
  kl_worker_destroy(w);
  kl_store_destroy(store);
  kl_conf_destroy(conf);
  kl_t_rmrf(dir);
  return err;
}

/* A handler timeout that one call could spend past half the poll interval
 * is refused at start, naming both values and the fix. */
static void
test_refuses_a_handler_timeout_the_poll_interval_cannot_hold(void **state) {
  assert_int_equal(t_worker_new_with("200000", NULL), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(),
                         "worker.handler.timeout.ms (200000) is more than "
                         "half of kafka.max.poll.interval.ms (300000)"));
  assert_non_null(
      strstr(kl_err_detail(), "-X kafka.max.poll.interval.ms=400000"));
  assert_non_null(strstr(kl_err_detail(), "at most 150000"));
  assert_int_equal(t_worker_new_with("150000", NULL), KL_OK);
  assert_int_equal(t_worker_new_with("200000", "400000"), KL_OK);
  assert_int_equal(t_worker_new_with("30000", "50000"), KL_ECONF);
  assert_int_equal(t_worker_new_with("30000", "60000"), KL_OK);
  assert_int_equal(t_worker_new_with("30000", "1min"), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "not a positive number of ms"));
}

/* keylane worker: an exec handler's timeout (30 s unless given) is that
 * bound, checked before anything starts. */
static void
test_cli_refuses_an_exec_timeout_over_half_the_poll_interval(void **state) {
  char dir[64], cmd[512];
  kl_t_tmpdir(dir);
  snprintf(cmd, sizeof(cmd),
           "'%s' worker -b 127.0.0.1:1 -t t --store '%s' --handler exec:cat "
           "-X kafka.max.poll.interval.ms=20000 2>&1",
           kl_t_bin(), dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[4096];
  size_t len = fread(out, 1, sizeof(out) - 1, p);
  out[len] = '\0';
  int status = pclose(p);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  if (!strstr(out, "worker.handler.timeout.ms (30000) is more than half of "
                   "kafka.max.poll.interval.ms (20000)") ||
      !strstr(out, "--handler-timeout-ms) to at most 10000"))
    fail_msg("keylane worker said: %s", out);
  kl_t_rmrf(dir);
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "--replay-child") == 0)
    return t_replay_child(argv);
  if (argc == 2) /* a test name, or a pattern of them ('*', '?') */
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_refuses_a_handler_timeout_the_poll_interval_cannot_hold),
      cmocka_unit_test(
          test_cli_refuses_an_exec_timeout_over_half_the_poll_interval),
      cmocka_unit_test(test_slow_handlers_do_not_starve_the_poll_thread),
      cmocka_unit_test(test_failed_seek_takes_no_epoch),
      cmocka_unit_test(test_slow_replay_beside_a_live_worker_finishes),
      cmocka_unit_test(test_slow_replay_beside_a_live_worker_finishes_on_pg),
      cmocka_unit_test(test_replay_stopped_past_the_period_is_fenced),
      cmocka_unit_test(test_redrive_of_failing_letters_beside_a_live_worker),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
