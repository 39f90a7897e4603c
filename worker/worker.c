/*
 * The worker: one consumer, one lane per owned partition (lanes.c), the
 * executors (lanes_pool.c) and the dead-letter producer (dlq.c).
 *
 * The thread that called kl_worker_run() is the poll thread: it consumes,
 * runs the rebalance callback, group-commits the lanes and produces dead
 * letters; in inline mode (worker.concurrency = 1) it runs the handlers
 * too. Because the rebalance callback runs inside rd_kafka_consumer_poll()
 * on this thread, a revoked lane is drained and committed inside the
 * callback, before the partition is given up (worker_own.c). A lane
 * fenced by a replay or redrive takes its partition back once the fencer
 * goes quiet (worker_retake.c).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_features.h"
#include "common/kafka_pos.h"
#include "common/log.h"
#include "worker/checks.h"
#include "worker/lanes_keys.h"
#include "worker/lanes_stall.h"
#include "worker/worker_internal.h"
#include "worker/worker_state.h"

#define KL_COMP "worker"

void kl__worker_set_before_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                  void *opaque) {
  kl__lanes_set_before_commit(worker->lanes, fn, opaque);
}

void kl__worker_set_after_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                 void *opaque) {
  kl__lanes_set_after_commit(worker->lanes, fn, opaque);
}

void kl__worker_set_run_fault(kl_worker_t *worker,
                              int (*fn)(void *opaque, int32_t partition,
                                        int64_t offset),
                              void *opaque) {
  kl__lanes_set_run_fault(worker->lanes, fn, opaque);
}

size_t kl__worker_misrouted(kl_worker_t *worker, uint64_t *by_partition,
                            size_t max) {
  return kl__lanes_misrouted(worker->lanes, by_partition, max);
}

/* ---- setup --------------------------------------------------------------- */

/* Which librdkafka features this worker uses, once at start: what a user
 * of a newer distribution gains is then visible. */
static void rdk_log(const kl__rdk_features_t *features, int consumer_protocol) {
  char built[32], loaded[32];
  kl__rdk_version_str(features->built, built, sizeof(built));
  kl__rdk_version_str(features->loaded, loaded, sizeof(loaded));
  KL_LOG_I(KL_COMP, "librdkafka %s (built against %s): %s, group.protocol=%s%s",
           loaded, built,
           features->fetch_queue_backoff
               ? "fetch.queue.backoff.ms=10"
               : "queued.min.messages=1000000 (fetch.queue.backoff.ms needs "
                 "2.2)",
           consumer_protocol ? "consumer" : "classic",
           features->consumer_protocol ? ""
                                       : " (consumer needs librdkafka 2.12)");
}

/* The embedded cluster holds a fetch that finds no record for all of
 * fetch.wait.max.ms, records that arrive meanwhile included
 * (keylane/embedded.h): a worker of one in this process fetches with a
 * short one. Appends it to @p defaults (room for KL__RDK_DEFAULTS_MAX). */
static void embedded_fetch(const kl_conf_t *conf, const char **defaults) {
  if (!kl__embedded_local(kl_conf_get(conf, "kafka.bootstrap.servers")))
    return;
  size_t n = 0;
  while (defaults[n])
    n += 2;
  if (n + 2 < KL__RDK_DEFAULTS_MAX) {
    defaults[n] = "fetch.wait.max.ms";
    defaults[n + 1] = KL_EMBEDDED_FETCH_WAIT_MS;
    defaults[n + 2] = NULL;
  }
}

/* worker.group.protocol=consumer: KIP-848's. */
static int worker_consumer_protocol(const kl_conf_t *conf) {
  return strcmp(kl_conf_get(conf, "worker.group.protocol"), "consumer") == 0;
}

kl_err_t kl__worker_kafka_conf(const kl_conf_t *conf, rd_kafka_conf_t **out) {
  char session[32], heartbeat[32];
  int64_t session_ms = kl__conf_int(conf, "worker.session.timeout.ms");
  snprintf(session, sizeof(session), "%" PRId64, session_ms);
  /* A third of the session, as Kafka advises, and at most 1 s so that a
   * rebalance is noticed quickly. */
  snprintf(heartbeat, sizeof(heartbeat), "%" PRId64,
           session_ms / 3 < 1000 ? session_ms / 3 : 1000);
  const char *defaults[KL__RDK_DEFAULTS_MAX];
  kl__rdk_features_t features = kl__rdk_features_here();
  int consumer_protocol = worker_consumer_protocol(conf);
  kl_err_t err = kl__rdk_consumer_defaults(&features, consumer_protocol,
                                           kl_conf_get(conf, "worker.group"),
                                           session, heartbeat, defaults);
  if (err)
    return err;
  rdk_log(&features, consumer_protocol);
  embedded_fetch(conf, defaults);
  kl__membership_defaults(conf, defaults);
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  err = kl__kafka_conf_apply(kconf, conf, defaults);
  if (err) {
    rd_kafka_conf_destroy(kconf);
    return err;
  }
  *out = kconf;
  return KL_OK;
}

static kl_err_t consumer_new(kl_worker_t *worker) {
  rd_kafka_conf_t *kconf;
  kl_err_t err = kl__worker_kafka_conf(worker->conf, &kconf);
  if (err)
    return err;
  /* The rebalance protocol, from the configured assignors (librdkafka
   * requires them all to have the same one; cooperative-sticky is its only
   * cooperative assignor), not from rd_kafka_rebalance_protocol() in the
   * rebalance callback: in the callbacks rd_kafka_consumer_close() serves
   * for a member the group dropped (past max.poll.interval.ms), librdkafka
   * 2.0.2 answers NULL there, or never answers at all. */
  char strategy[256] = "";
  size_t size = sizeof(strategy);
  rd_kafka_conf_get(kconf, "partition.assignment.strategy", strategy, &size);
  /* KIP-848's protocol is incremental, like cooperative-sticky. */
  worker->cooperative = worker_consumer_protocol(worker->conf) ||
                        strstr(strategy, "cooperative") != NULL;
  kl__membership_instance(kconf, worker->instance_id,
                          sizeof(worker->instance_id));
  if (kl__membership_id_check("kafka.group.instance.id", worker->instance_id)) {
    rd_kafka_conf_destroy(kconf);
    return KL_ECONF;
  }
  rd_kafka_conf_set_opaque(kconf, worker);
  rd_kafka_conf_set_rebalance_cb(kconf, kl__worker_rebalance_cb);
  rd_kafka_conf_set_offset_commit_cb(kconf, kl__worker_offset_commit_cb);
  char errstr[512];
  worker->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr));
  if (!worker->rk) {
    rd_kafka_conf_destroy(kconf);
    return kl__err(KL_EKAFKA, "cannot create the consumer: %s", errstr);
  }
  rd_kafka_poll_set_consumer(worker->rk);
  return KL_OK;
}

/* The consumer, the dead-letter producer, the lanes and (unless inline)
 * the executor threads' pool, which starts in kl_worker_run(). */
static kl_err_t worker_parts_new(kl_worker_t *worker) {
  kl_err_t err = consumer_new(worker);
  if (!err)
    err = kl__dlq_new(worker->conf, worker->topic, kl__lanes_dlq_ack, NULL,
                      &worker->dlq);
  if (!err)
    err = kl__lanes_new(worker->conf, &worker->applier, worker->rk, worker->dlq,
                        &worker->lanes);
  if (!err)
    kl__dlq_set_opaque(worker->dlq, worker->lanes);
  if (!err)
    err = kl__log_guard_new(worker->conf, worker->topic, worker->rk,
                            worker->store, worker->lanes, &worker->log_guard);
  return err;
}

kl__log_guard_t *kl__worker_log_guard(kl_worker_t *worker) {
  return worker->log_guard;
}

/* The store's watermark is trusted only while the log holds it, so the
 * consumer must say when a position is out of the log (log_guard.h),
 * never move it silently: earliest would take a recreated topic's records
 * for applied ones, latest and earliest alike would skip a retention gap. */
static kl_err_t check_offset_reset(const kl_conf_t *conf) {
  const char *reset = kl_conf_get(conf, "kafka.auto.offset.reset");
  if (!reset || strcmp(reset, "error") == 0)
    return KL_OK;
  return kl__err(KL_ECONF,
                 "kafka.auto.offset.reset=%s: the worker resumes from the "
                 "store's watermark and needs librdkafka to report a position "
                 "outside the log (a recreated topic, a retention gap) instead "
                 "of moving it; remove the setting (see worker.on.gap and "
                 "`keylane store reset`)",
                 reset);
}

/* librdkafka's default max.poll.interval.ms. */
#define KL_MAX_POLL_DEFAULT_MS 300000

/*
 * The poll thread must poll within kafka.max.poll.interval.ms, or the
 * group evicts a member that is working. Between two polls it runs events
 * for at most the inline budget plus ONE handler call (lanes_pool.c checks the
 * budget before each event; at worker.concurrency > 1 it runs none, but a
 * revoke waits for the running ones), then commits and maybe seeks. So one
 * handler call may take at most half the interval, the other half being
 * for the rest. Only a declared bound can be checked: an in-process
 * handler that sets none (0) must keep to the interval by itself.
 */
static kl_err_t check_poll_interval(const kl_conf_t *conf) {
  int64_t handler_ms = kl__conf_int(conf, "worker.handler.timeout.ms");
  const char *set = kl_conf_get(conf, "kafka.max.poll.interval.ms");
  char *end = NULL;
  int64_t poll_ms = set ? strtoll(set, &end, 10) : KL_MAX_POLL_DEFAULT_MS;
  if (set && (end == set || *end || poll_ms <= 0))
    return kl__err(KL_ECONF,
                   "kafka.max.poll.interval.ms=%s is not a "
                   "positive number of ms: set it like "
                   "-X kafka.max.poll.interval.ms=300000",
                   set);
  if (handler_ms <= poll_ms / 2) /* 0: a bound the worker cannot know */
    return KL_OK;
  return kl__err(KL_ECONF,
                 "worker.handler.timeout.ms (%" PRId64 ") is more than half "
                 "of kafka.max.poll.interval.ms (%" PRId64 "): a handler call "
                 "that long keeps the worker from polling, and the group "
                 "evicts a member that is working; raise "
                 "kafka.max.poll.interval.ms to at least %" PRId64 " (-X "
                 "kafka.max.poll.interval.ms=%" PRId64 "), or lower the "
                 "handler timeout (--handler-timeout-ms) to at most %" PRId64,
                 handler_ms, poll_ms, handler_ms * 2, handler_ms * 2,
                 poll_ms / 2);
}

/*
 * The batch's PostgreSQL session sits idle in its transaction while a
 * handler that runs no SQL on it works, and the server ends a session
 * idle for store.pg.idle.timeout (pg.c): a handler call allowed that long
 * can end the batch's session before its commit, and the event runs again
 * as often, taking as long (kl__lanes_done() bounds that with
 * worker.max.attempts). So a declared handler bound must be below it.
 */
static kl_err_t check_idle_timeout(const kl_conf_t *conf, kl_store_t *store) {
  int64_t handler_ms = kl__conf_int(conf, "worker.handler.timeout.ms");
  int64_t idle_ms = kl__store_idle_ms(store);
  if (!handler_ms || !idle_ms || handler_ms < idle_ms) /* 0: no bound */
    return KL_OK;
  return kl__err(KL_ECONF,
                 "worker.handler.timeout.ms (%" PRId64 ") is not below "
                 "store.pg.idle.timeout (%" PRId64 " ms): the batch's "
                 "session is idle while a handler works, and the server "
                 "ends it after that long, so a handler call that takes its "
                 "time can never commit; lower the handler timeout "
                 "(--handler-timeout-ms) below %" PRId64 ", or raise "
                 "store.pg.idle.timeout above it (-X "
                 "store.pg.idle.timeout=%" PRId64 "ms)",
                 handler_ms, idle_ms, idle_ms, handler_ms * 2);
}

/*
 * A worker on a pooled store (PostgreSQL) holds one connection with its
 * open batch and needs another to read its outbox and timers meanwhile:
 * with a pool of one, every such read waited the pool's 10 s for the
 * batch's connection, and the worker applied about 100 events/s.
 */
static kl_err_t check_pool(kl_store_t *store) {
  if (kl__store_txn_max(store) != 1)
    return KL_OK; /* 0: not pooled */
  return kl__err(KL_ECONF,
                 "store.pg.pool is 1: a worker holds a connection with its "
                 "open batch and needs another to read its outbox and timers "
                 "meanwhile, so each such read would wait 10 s for it; set "
                 "store.pg.pool to 2 or more (-X store.pg.pool=4, the "
                 "default)");
}

kl_err_t kl_worker_new(const kl_conf_t *conf, const char *topic,
                       kl_store_t *store, kl_handler_fn_t *handler,
                       void *handler_opaque, kl_worker_t **out) {
  kl__err_clear();
  if (!conf || !topic || !*topic || !store || !handler || !out)
    return kl__err(KL_EINVAL, "kl_worker_new: conf, topic, store and handler "
                              "are required");
  if (!kl_conf_get(conf, "kafka.bootstrap.servers"))
    return kl__err(KL_ECONF, "no bootstrap servers: set "
                             "kafka.bootstrap.servers (-b HOST:PORT)");
  kl_err_t cerr = check_offset_reset(conf);
  if (cerr)
    return cerr;
  int64_t retake_ms = kl__conf_int(conf, "worker.fenced.retake.ms");
  int64_t session_ms = kl__conf_int(conf, "worker.session.timeout.ms");
  if (retake_ms && retake_ms <= session_ms)
    return kl__err(KL_ECONF,
                   "worker.fenced.retake.ms (%" PRId64 ") must exceed "
                   "worker.session.timeout.ms (%" PRId64 "), so that a member "
                   "the group replaced learns it before it takes a partition "
                   "back; raise it, or set 0 to never take one back",
                   retake_ms, session_ms);
  kl_err_t checked = check_poll_interval(conf);
  if (!checked)
    checked = kl__conf_timer_check(conf);
  if (!checked)
    checked = check_idle_timeout(conf, store);
  if (!checked)
    checked = check_pool(store);
  if (!checked)
    checked = kl__membership_check(conf);
  if (checked)
    return checked;
  kl_worker_t *worker = calloc(1, sizeof(*worker));
  if (worker)
    pthread_mutex_init(&worker->why_mu, NULL);
  if (!worker)
    return KL_ENOMEM;
  worker->conf = kl_conf_dup(conf);
  worker->topic = strdup(topic);
  worker->store = store;
  worker->applier = (kl__applier_t){
      .store = store,
      .topic = worker->topic,
      .handler = handler,
      .handler_opaque = handler_opaque,
      .decoder = kl_decoder_new(),
      .timer_max_ms = kl__conf_int(conf, "timer.max.delay"),
      .timer_past_ms = kl__conf_int(conf, "store.dedup.retention")};
  int64_t n = kl__conf_int(conf, "worker.concurrency");
  worker->threads = n > 1 ? (int)n : 0;
  worker->retake_ns = retake_ms * 1000000;
  worker->check_ns = kl__conf_int(conf, "worker.partitions.check.ms") * 1000000;
  worker->stall_ms = kl__conf_int(conf, "worker.stall.ms");
  worker->acquire_wait_ms = kl__conf_int(conf, "worker.acquire.wait");
  kl_err_t err = KL_ENOMEM;
  if (worker->conf && worker->topic && worker->applier.decoder)
    err = worker_parts_new(worker);
  if (!err)
    err = kl__store_read_new(store, topic, &worker->reader);
  if (err) {
    kl_worker_destroy(worker);
    return err;
  }
  *out = worker;
  return KL_OK;
}

/* Refuses to run on a topic that is missing or whose partition count is not
 * the one the fleet expects: keys would move between owners. Without
 * worker.expect.partitions the count seen now is the expected one. Then
 * every record's routing is checked against that count. */
static kl_err_t check_topic(kl_worker_t *worker, int timeout_ms) {
  int32_t have = 0;
  kl_err_t err = kl__kafka_partition_count_new(worker->rk, worker->topic,
                                               timeout_ms, &have);
  if (err == KL_ENOTFOUND)
    return kl__err(KL_ENOTFOUND, "topic %s does not exist: create it first",
                   worker->topic);
  if (err)
    return err;
  int64_t want = kl__conf_int(worker->conf, "worker.expect.partitions");
  worker->expect =
      (kl__partitions_expect_t){want ? (int32_t)want : have, want != 0,
                                "worker", "worker.expect.partitions"};
  worker->partitions_expected = worker->expect.count;
  worker->partitions_live = have;
  if ((err = kl__partitions_check(worker->topic, have, &worker->expect)))
    return err;
  kl__lanes_reserve(worker->lanes, have);
  kl__lanes_route(worker->lanes, have,
                  kl_conf_get(worker->conf, "worker.misrouted"));
  worker->checked_ns = kl__mono_ns();
  return KL_OK;
}

/* The topic's count changed while running: keys moved between owners, and
 * this worker stops taking the topic (every partition paused, nothing
 * acquired) until it is restarted; /healthz says so. */
static void stop_taking(kl_worker_t *worker) {
  KL_LOG_E(KL_COMP,
           "%s; this worker stopped taking topic %s (its partitions "
           "are paused; events already taken in are applied)",
           kl_err_detail(), worker->topic);
  worker->topic_stopped = 1;
  kl__lanes_stop_taking(worker->lanes);
  rd_kafka_topic_partition_list_t *assigned = NULL;
  if (!rd_kafka_assignment(worker->rk, &assigned) && assigned) {
    rd_kafka_pause_partitions(worker->rk, assigned);
    rd_kafka_topic_partition_list_destroy(assigned);
  }
}

/* Reads the topic's partition count every worker.partitions.check.ms, on
 * the poll thread between batches (one metadata request, bounded). */
static void watch_partitions(kl_worker_t *worker) {
  int64_t now = kl__mono_ns();
  if (worker->topic_stopped || now - worker->checked_ns < worker->check_ns)
    return;
  worker->checked_ns = now;
  int32_t live = 0;
  if (kl__kafka_partition_count(worker->rk, worker->topic, 2000, &live)) {
    KL_LOG_D(KL_COMP, "partition count: %s", kl_err_detail());
    return;
  }
  worker->partitions_live = live;
  if (kl__partitions_check(worker->topic, live, &worker->expect))
    stop_taking(worker);
}

/* Refuses to run when an idempotency key may be swept while a copy of its
 * event (the record, its dead letter) still exists, unless
 * worker.retention.check=warn says to run anyway (checks.h); warns when
 * the topic keeps records for less than timer.max.delay. */
static kl_err_t check_retention(kl_worker_t *worker) {
  int warn =
      strcmp(kl_conf_get(worker->conf, "worker.retention.check"), "warn") == 0;
  int64_t dedup_ms = kl__conf_int(worker->conf, "store.dedup.retention");
  const char *const topics[2][2] = {
      {"topic", worker->topic},
      {"dead-letter topic", kl__dlq_topic(worker->dlq)}};
  for (int i = 0; i < 2; i++) {
    kl__check_t check;
    kl__check_retention(worker->rk, topics[i][0], topics[i][1], dedup_ms, 10000,
                        &check);
    if (check.status == KL__CHECK_FAIL && !warn)
      return kl__err(KL_ECONF, "%s", check.msg);
    if (check.status == KL__CHECK_WARN)
      worker->retention_unchecked = 1;
    else if (check.status == KL__CHECK_FAIL)
      worker->retention_override = 1;
    if (check.status == KL__CHECK_OK)
      KL_LOG_I(KL_COMP, "%s", check.msg);
    else
      KL_LOG_W(KL_COMP, "%s%s", check.msg,
               check.status == KL__CHECK_FAIL
                   ? " (worker.retention.check=warn: running anyway)"
                   : "");
  }
  kl__check_t timers;
  kl__check_timer_retention(worker->rk, worker->topic,
                            kl__conf_int(worker->conf, "timer.max.delay"),
                            10000, &timers);
  if (timers.status == KL__CHECK_OK)
    KL_LOG_I(KL_COMP, "%s", timers.msg);
  else if (!worker->retention_unchecked) /* else said above */
    KL_LOG_W(KL_COMP, "%s", timers.msg);
  return KL_OK;
}

/* The largest record a follow-up may be, so that kl_txn_emit() refuses
 * one that could never be published: the outbox producer's
 * message.max.bytes (the worker's kafka.message.max.bytes, else keylane's
 * default), or the topic's max.message.bytes when the cluster tells it and
 * it is lower. */
static void set_message_max(kl_worker_t *worker) {
  const char *conf = kl_conf_get(worker->conf, "kafka.message.max.bytes");
  long long max = conf ? strtoll(conf, NULL, 10) : 0;
  char source[128];
  snprintf(source, sizeof(source), "%s",
           max > 0 ? "the worker's kafka.message.max.bytes"
                   : "keylane's producer default message.max.bytes");
  if (max <= 0)
    max = KL_MESSAGE_MAX;
  int64_t topic_max = kl__check_message_max(worker->rk, worker->topic, 10000);
  if (topic_max > 0 && topic_max < max) {
    max = topic_max;
    snprintf(source, sizeof(source), "topic %s's max.message.bytes",
             worker->topic);
  }
  kl__lanes_set_message_max(worker->lanes, (size_t)max, source);
  KL_LOG_I(KL_COMP,
           "a handler's follow-up over %lld bytes as a Kafka record is "
           "refused when emitted (%s)",
           max, source);
}

static void on_consume_error(kl_worker_t *worker, rd_kafka_message_t *m) {
  if (m->err == RD_KAFKA_RESP_ERR__FATAL && !worker->fatal) {
    worker->fatal = kl__membership_fatal(
        worker->rk, kl_conf_get(worker->conf, "worker.group"),
        worker->instance_id);
    snprintf(worker->fatal_why, sizeof(worker->fatal_why), "%s",
             kl_err_detail());
    worker->stop = 1;
  } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt &&
             strcmp(rd_kafka_topic_name(m->rkt), worker->topic) == 0) {
    /* Stopping, a partition may be one it never took (no position). */
    if (!worker->stop)
      kl__log_guard_out_of_range(worker->log_guard, m->partition, m->offset);
  } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
    KL_LOG_W(KL_COMP, "consume: %s", rd_kafka_message_errstr(m));
  rd_kafka_message_destroy(m);
}

/*
 * librdkafka before 2.3.0 asserts when a cooperative-sticky consumer that
 * never received an assignment is destroyed (librdkafka issue #4312, fixed
 * by PR #4381; Debian 12 ships 2.0.2). A member stopped while its first
 * join is under way therefore waits for that join, within the session
 * timeout, before closing (on the embedded cluster a new group's first
 * join takes 3 s, one that had members up to the session timeout).
 * Messages consumed meanwhile are not applied, and the assignment it gets
 * takes no epoch (on_assign()).
 */
static void await_first_assignment(kl_worker_t *worker) {
  /* Only the cooperative assignor's state is destroyed unset, and 2.3.0
   * fixed it: others close at once. */
  if (!worker->cooperative || rd_kafka_version() >= 0x020300ff)
    return;
  int64_t deadline =
      kl__mono_ns() +
      kl__conf_int(worker->conf, "worker.session.timeout.ms") * 2000000;
  while (!worker->assigned_once && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk, 100);
    if (m)
      rd_kafka_message_destroy(m);
  }
}

/*
 * Leaves the group before rd_kafka_consumer_close(), serving the
 * revocations on this thread while the group still answers. A member the
 * group dropped (past max.poll.interval.ms) can have rebalance events
 * queued that the group no longer waits for; served inside close, their
 * callbacks race with the end of the group, and librdkafka 2.0.2 answers
 * the unassign they make with nothing, or never: the request is purged
 * with the group's queue, and the worker would hang in it. Unsubscribed,
 * the member gets its last revocation now, and close has nothing left to
 * serve. Bounded by the session timeout; messages consumed meanwhile are
 * not applied (the lanes stop taking them as they are revoked).
 */
static void leave_group(kl_worker_t *worker) {
  rd_kafka_resp_err_t kerr = rd_kafka_unsubscribe(worker->rk);
  if (kerr)
    KL_LOG_W(KL_COMP, "unsubscribe from %s: %s; closing anyway", worker->topic,
             rd_kafka_err2str(kerr));
  int64_t deadline =
      kl__mono_ns() +
      kl__conf_int(worker->conf, "worker.session.timeout.ms") * 1000000;
  int quiet = 0;
  while (!(worker->owned == 0 && quiet) && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk, 100);
    quiet = m == NULL;
    if (m)
      rd_kafka_message_destroy(m);
  }
}

/*
 * A static member does not leave the group (KIP-345): librdkafka sends no
 * LeaveGroup when it closes, and Kafka keeps the member's partitions for
 * it for the session timeout, for the same instance to take back without
 * a rebalance. So no unsubscribe: each lane stops taking records, lets
 * its running ones finish and commits them, with the final offsets,
 * before the close; the revocation the close then serves finds nothing
 * left to commit.
 */
static void stay_in_group(kl_worker_t *worker) {
  rd_kafka_topic_partition_list_t *assigned = NULL;
  if (!rd_kafka_assignment(worker->rk, &assigned) && assigned) {
    kl__worker_on_revoke(worker, assigned, 0);
    rd_kafka_topic_partition_list_destroy(assigned);
  }
  KL_LOG_I(KL_COMP,
           "staying in group %s as static member %s: a worker started with "
           "worker.instance.id=%s within worker.session.timeout.ms "
           "(%" PRId64 " ms) takes its partitions back without a rebalance",
           kl_conf_get(worker->conf, "worker.group"), worker->instance_id,
           worker->instance_id,
           kl__conf_int(worker->conf, "worker.session.timeout.ms"));
}

/* Records taken per clock read: their commit latency (kl__lanes_push())
 * counts from the first of them, a fraction of a millisecond early at
 * most (the histogram's least bucket is 1 ms). A read per record was
 * about 1 % of the poll thread (issue 37). */
#define KL_CONSUME_CLOCK 256

/* Takes what the consumer has, up to @p max records, waiting at most
 * @p timeout_ms for the first. */
static void worker_consume(kl_worker_t *worker, int timeout_ms, int max) {
  int64_t taken_ns = 0;
  for (int i = 0; i < max; i++) {
    rd_kafka_message_t *m =
        rd_kafka_consumer_poll(worker->rk, i ? 0 : timeout_ms);
    if (!m)
      return;
    if (i % KL_CONSUME_CLOCK == 0)
      taken_ns = kl__mono_ns();
    if (m->err)
      on_consume_error(worker, m);
    else
      kl__lanes_push(worker->lanes, m, taken_ns);
  }
}

/* The poll thread: consume, run events (inline mode), serve dead-letter
 * acks, then the lanes' tick (retries, commits, bounds). */
static void worker_loop(kl_worker_t *worker) {
  int64_t last_sweep = 0, last_stall_check = 0;
  while (!worker->stop) {
    atomic_store(&worker->loop_ns, kl__mono_ns());
    int busy = worker->threads == 0 && kl__lanes_has_ready(worker->lanes);
    worker_consume(worker, busy ? 0 : 5, 10000);
    worker->owned += kl__log_guard_tick(worker->log_guard);
    if (worker->threads == 0)
      kl__lanes_pool_run_inline(worker->pool, 20);
    kl__dlq_poll(worker->dlq, 0);
    kl__lanes_tick(worker->lanes);
    kl__worker_retake_quiet(worker);
    watch_partitions(worker);
    int64_t now = kl__mono_ns();
    if (worker->stall_ms && now - last_stall_check > 100000000) {
      kl__lanes_watch_stalls(worker->lanes, now, worker->stall_ms);
      last_stall_check = now;
    }
    if (now - last_sweep > 1000000000) {
      size_t removed = 0;
      if (kl_store_sweep(worker->store, 1000, &removed))
        KL_LOG_D(KL_COMP, "sweep: %s", kl_err_detail());
      last_sweep = now;
    }
  }
}

int kl__worker_waiting(kl_worker_t *worker, char *why, size_t size) {
  if (!atomic_load(&worker->waiting))
    return 0;
  pthread_mutex_lock(&worker->why_mu);
  snprintf(why, size, "%s", worker->why);
  pthread_mutex_unlock(&worker->why_mu);
  return 1;
}

static void set_why(kl_worker_t *worker, const char *fmt, ...) KL__PRINTF(2, 3);
static void set_why(kl_worker_t *worker, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&worker->why_mu);
  vsnprintf(worker->why, sizeof(worker->why), fmt, ap);
  pthread_mutex_unlock(&worker->why_mu);
  va_end(ap);
  atomic_store(&worker->waiting, 1);
}

/* A fleet restarting while its brokers restart must not crash-loop: the
 * topic check is retried with backoff (0.5 s doubling to 30 s) for
 * worker.kafka.wait, saying what it waits for in the log and in /healthz,
 * and giving way to kl_worker_stop(). @returns the check's result, or
 * KL_ESTOPPED when stopped while waiting. */
static kl_err_t wait_for_kafka(kl_worker_t *worker) {
  int64_t wait_ms = kl__conf_int(worker->conf, "worker.kafka.wait");
  int64_t deadline = kl__mono_ns() + wait_ms * 1000000;
  const char *boot = kl_conf_get(worker->conf, "kafka.bootstrap.servers");
  kl_err_t err;
  for (int backoff_ms = 500;;
       backoff_ms = backoff_ms < 15000 ? backoff_ms * 2 : 30000) {
    /* Short tries while waiting, so that a stop is not held for long. */
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    int try_ms = wait_ms == 0     ? 10000
                 : left_ms > 5000 ? 5000
                 : left_ms > 1000 ? (int)left_ms
                                  : 1000;
    err = check_topic(worker, try_ms);
    left_ms = (deadline - kl__mono_ns()) / 1000000;
    if (err != KL_EKAFKA_TRANSIENT || left_ms <= 0 ||
        atomic_load(&worker->stop))
      break;
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    set_why(worker,
            "waiting for Kafka (%s) to answer for topic %s: %s; "
            "next try in %d ms, giving up in %" PRId64 " s "
            "(worker.kafka.wait, --kafka-wait)",
            boot ? boot : "?", worker->topic, detail, backoff_ms,
            left_ms / 1000);
    KL_LOG_W(KL_COMP, "%s", worker->why);
    for (int slept = 0; slept < backoff_ms && !atomic_load(&worker->stop);
         slept += 100) {
      atomic_store(&worker->loop_ns, kl__mono_ns());
      kl__sleep_ms(100);
    }
  }
  atomic_store(&worker->waiting, 0);
  if (err == KL_EKAFKA_TRANSIENT && atomic_load(&worker->stop))
    return KL_ESTOPPED;
  if (err == KL_EKAFKA_TRANSIENT && wait_ms > 0) {
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    return kl__err(err,
                   "%s; gave up after waiting %" PRId64 " ms "
                   "(worker.kafka.wait, --kafka-wait)",
                   detail, wait_ms);
  }
  return err;
}

int64_t kl__worker_loop_age_ms(kl_worker_t *worker) {
  int64_t at = atomic_load(&worker->loop_ns);
  return at ? (kl__mono_ns() - at) / 1000000 : -1;
}

kl_err_t kl_worker_run(kl_worker_t *worker) {
  kl__err_clear();
  atomic_store(&worker->loop_ns, kl__mono_ns());
  kl_err_t err = wait_for_kafka(worker);
  if (err == KL_ESTOPPED)
    return KL_OK; /* stopped before it began: nothing to finish */
  if (!err)
    err = kl__dlq_check(worker->dlq, worker->topic);
  if (!err)
    err = check_retention(worker); /* a refusal is said, stopped or not */
  if (!err)
    kl__membership_check_cluster(worker->rk,
                                 kl_conf_get(worker->conf, "worker.group"),
                                 worker->instance_id);
  if (!err && worker->stop)
    return KL_OK; /* before it subscribed: no group to leave */
  if (!err)
    set_message_max(worker);
  if (!err)
    err = kl__lanes_pool_new(worker->lanes, worker->threads, &worker->pool);
  if (err)
    return err;
  rd_kafka_topic_partition_list_t *topics =
      rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, worker->topic,
                                    RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t kerr = rd_kafka_subscribe(worker->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (kerr)
    return kl__err(kl__kafka_err(kerr), "subscribe to %s: %s", worker->topic,
                   rd_kafka_err2str(kerr));
  worker_loop(worker);
  if (!worker->fatal)
    await_first_assignment(worker);
  if (worker->fatal)
    KL_LOG_W(KL_COMP, "closing the consumer: nothing more is committed");
  else if (*worker->instance_id)
    stay_in_group(worker);
  else
    leave_group(worker);                /* revokes: lanes commit first */
  kl__lanes_flight_stop(worker->lanes); /* it wakes the queue close polls */
  rd_kafka_consumer_close(worker->rk);
  kl__lanes_pool_destroy(worker->pool);
  worker->pool = NULL;
  if (worker->fatal)
    return kl__err(worker->fatal, "%s", worker->fatal_why);
  if (worker->unowned)
    return kl__err(worker->unowned, "%s", worker->unowned_why);
  return KL_OK;
}

rd_kafka_t *kl__worker_consumer(kl_worker_t *worker) {
  return worker->rk;
}

struct kl__metrics *kl__worker_metrics(kl_worker_t *worker) {
  return kl__lanes_metrics(worker->lanes);
}

uint64_t kl__worker_kafka_commits(kl_worker_t *worker) {
  return kl__lanes_kafka_commits(worker->lanes);
}

uint64_t kl__worker_ahead(kl_worker_t *worker) {
  return kl__lanes_ahead(worker->lanes);
}

size_t kl__worker_stalls(kl_worker_t *worker, kl__stall_t *out, size_t max) {
  return kl__lanes_stalls(worker->lanes, worker->stall_ms, out, max);
}

kl_err_t kl__worker_keys(kl_worker_t *worker, const kl_worker_keys_query_t *q,
                         kl_worker_key_t *out, size_t *n, size_t *total) {
  return kl__lanes_keys(worker->lanes, q, out, n, total);
}

int kl__worker_unowned(const kl_worker_t *worker) {
  return worker->unowned != KL_OK;
}

const char *kl__worker_topic(const kl_worker_t *worker) {
  return worker->topic;
}

kl_store_t *kl__worker_store(const kl_worker_t *worker) {
  return worker->store;
}

kl__store_read_t *kl__worker_reader(const kl_worker_t *worker) {
  return worker->reader;
}

const kl_conf_t *kl__worker_conf(const kl_worker_t *worker) {
  return worker->conf;
}

uint64_t kl__worker_fence_batches(kl_worker_t *worker, uint64_t fenced,
                                  uint64_t batches) {
  pthread_mutex_lock(&worker->why_mu);
  if (fenced > worker->health_fenced) {
    worker->health_fenced = fenced;
    worker->health_batches = batches;
  }
  uint64_t at = worker->health_batches;
  pthread_mutex_unlock(&worker->why_mu);
  return at;
}

uint64_t kl__worker_commits_failing(kl_worker_t *worker, int runs,
                                    int64_t *for_ms, char *why, size_t size) {
  return runs ? kl__lanes_store_failing(worker->lanes, for_ms, why, size)
              : kl__lanes_commits_failing(worker->lanes, for_ms, why, size);
}

void kl_worker_stop(kl_worker_t *worker) {
  worker->stop = 1;
}

kl_err_t kl_worker_stats(const kl_worker_t *worker, kl_worker_stats_t *stats,
                         size_t size) {
  kl__err_clear();
  if (!worker || !stats)
    return kl__err(KL_EINVAL, "kl_worker_stats: worker and stats are "
                              "required");
  /* Filled whole, then copied as far as the caller's struct goes: fields
   * are only appended (worker.h), so its size ends between two of ours. */
  kl_worker_stats_t all;
  memset(&all, 0, sizeof(all));
  kl__lanes_stats(worker->lanes, &all);
  all.owned = worker->owned;
  all.retention_override = worker->retention_override;
  all.retention_unchecked = worker->retention_unchecked;
  all.partitions_expected = worker->partitions_expected;
  all.partitions_live = worker->partitions_live;
  memcpy(stats, &all, size < sizeof(all) ? size : sizeof(all));
  return KL_OK;
}

void kl_worker_destroy(kl_worker_t *worker) {
  if (!worker)
    return;
  kl__store_read_destroy(worker->reader);
  kl__lanes_pool_destroy(worker->pool);
  if (worker->rk)
    rd_kafka_destroy(worker->rk);
  kl__log_guard_destroy(worker->log_guard);
  kl__lanes_destroy(worker->lanes);
  kl__dlq_destroy(worker->dlq);
  kl_decoder_destroy(worker->applier.decoder);
  kl_conf_destroy(worker->conf);
  free(worker->quiet);
  free(worker->topic);
  pthread_mutex_destroy(&worker->why_mu);
  free(worker);
}
