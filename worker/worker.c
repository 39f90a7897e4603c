/*
 * The worker: one consumer, one lane per owned partition, one fenced store
 * commit per batch.
 *
 * Everything runs on the thread that called kl_worker_run(): polling,
 * the rebalance callback, the handlers and the commits. A partition's
 * messages are buffered in its lane until the batch is full, the batch
 * wait elapsed, or the partition is revoked; then the lane is applied.
 * Because the rebalance callback runs inside rd_kafka_consumer_poll() on
 * this same thread, a revoked lane's batch is finished inside the
 * callback, before the partition is given up.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "worker/apply.h"

typedef enum kl_lane_state {
  KL_LANE_FREE = 0, /* not owned */
  KL_LANE_OWNED,    /* owned: consuming and applying */
  KL_LANE_FENCED,   /* a newer owner exists: apply nothing until revoked */
  KL_LANE_FAILED,   /* the handler failed: stopped until revoked */
} kl_lane_state_t;

typedef struct kl_lane {
  kl_lane_state_t state;
  uint64_t epoch;
  int64_t watermark; /* next offset to apply */
  rd_kafka_message_t **msgs;
  size_t count;
  int64_t first_ns; /* when the oldest buffered message arrived */
} kl_lane_t;

struct kl_worker {
  kl_conf_t *conf;
  char *topic;
  kl_store_t *store;
  rd_kafka_t *rk;
  kl__applier_t applier;
  kl_lane_t *lanes;
  int32_t partitions;
  size_t batch_max;
  int64_t batch_wait_ns;
  volatile sig_atomic_t stop;
  int assigned_once; /* a rebalance callback has assigned to this member */
  _Atomic uint64_t applied, duplicates, redelivered, batches, fenced, failed;
  _Atomic int32_t owned;
};

#define KL_COMP "worker"

void kl__worker_set_before_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                  void *opaque) {
  worker->applier.before_commit = fn;
  worker->applier.hook_opaque = opaque;
}

static void kl_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- applying a batch -------------------------------------------------- */

static void kl_lane_drop_msgs(kl_lane_t *lane) {
  for (size_t i = 0; i < lane->count; i++)
    rd_kafka_message_destroy(lane->msgs[i]);
  lane->count = 0;
}

static void kl_commit_kafka(kl_worker_t *worker, int32_t partition,
                            int64_t next) {
  rd_kafka_topic_partition_list_t *offsets =
      rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(offsets, worker->topic, partition)->offset =
      next;
  rd_kafka_resp_err_t kerr = rd_kafka_commit(worker->rk, offsets, 1);
  if (kerr)
    KL_LOG_D(KL_COMP, "offset commit partition=%" PRId32 ": %s", partition,
             rd_kafka_err2str(kerr));
  rd_kafka_topic_partition_list_destroy(offsets);
}

static void kl_lane_pause(kl_worker_t *worker, int32_t partition) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, worker->topic, partition);
  rd_kafka_pause_partitions(worker->rk, l);
  rd_kafka_topic_partition_list_destroy(l);
}

static void kl_lane_fenced(kl_worker_t *worker, kl_lane_t *lane,
                           int32_t partition) {
  kl_partition_state_t now = {0};
  kl_store_partition(worker->store, worker->topic, partition, &now);
  KL_LOG_W(KL_COMP,
           "fenced partition=%" PRId32 " my_epoch=%" PRIu64
           " current_epoch=%" PRIu64 ": a newer owner holds it; this batch of "
           "%zu events was rolled back",
           partition, lane->epoch, now.epoch, lane->count);
  worker->fenced++;
  lane->state = KL_LANE_FENCED;
  kl_lane_pause(worker, partition);
}

static void kl_lane_failed(kl_worker_t *worker, kl_lane_t *lane,
                           int32_t partition, const kl__apply_result_t *res) {
  KL_LOG_E(KL_COMP,
           "handler failed partition=%" PRId32 " offset=%" PRId64
           ": %s; partition %" PRId32 " is stopped at offset %" PRId64
           " (nothing of this batch was applied); fix the handler or the "
           "event and restart the worker",
           partition, res->failed_offset, res->why, partition, lane->watermark);
  worker->failed++;
  lane->state = KL_LANE_FAILED;
  kl_lane_pause(worker, partition);
}

/*
 * Applies a lane's buffered messages as one fenced store transaction,
 * re-running the whole batch after a backoff when the handler or the store
 * asks for a retry. Returns with the lane's buffer empty.
 */
static void kl_lane_apply(kl_worker_t *worker, int32_t partition) {
  kl_lane_t *lane = &worker->lanes[partition];
  int backoff_ms = (int)kl__conf_int(worker->conf, "worker.retry.initial.ms");
  const int backoff_max = (int)kl__conf_int(worker->conf, "worker.retry.max.ms");
  while (lane->count > 0 && lane->state == KL_LANE_OWNED) {
    kl__apply_result_t res;
    kl_err_t err = kl__apply_batch(&worker->applier, partition, lane->epoch,
                                   lane->watermark, lane->msgs, lane->count,
                                   &res);
    if (!err && res.verdict == KL_HANDLER_OK) {
      lane->watermark = res.next;
      worker->applied += res.applied;
      worker->duplicates += res.duplicates;
      worker->redelivered += res.redelivered;
      worker->batches++;
      kl_lane_drop_msgs(lane);
      kl_commit_kafka(worker, partition, res.next);
      return;
    }
    if (err == KL_EFENCED) {
      kl_lane_fenced(worker, lane, partition);
    } else if (!err && res.verdict == KL_HANDLER_FAIL) {
      kl_lane_failed(worker, lane, partition, &res);
    } else {
      KL_LOG_W(KL_COMP,
               "batch of partition=%" PRId32 " will be retried in %d ms: %s",
               partition, backoff_ms,
               err ? kl_err_detail() : res.why);
      if (worker->stop)
        break; /* nothing applied; the next owner resumes from the store */
      kl_sleep_ms(backoff_ms);
      backoff_ms = backoff_ms * 2 > backoff_max ? backoff_max : backoff_ms * 2;
    }
  }
  kl_lane_drop_msgs(lane);
}

/* ---- ownership ------------------------------------------------------- */

static kl_err_t kl_lanes_reserve(kl_worker_t *worker, int32_t partition) {
  if (partition < worker->partitions)
    return KL_OK;
  int32_t n = partition + 1;
  kl_lane_t *lanes = realloc(worker->lanes, (size_t)n * sizeof(*lanes));
  if (!lanes)
    return KL_ENOMEM;
  memset(lanes + worker->partitions, 0,
         (size_t)(n - worker->partitions) * sizeof(*lanes));
  worker->lanes = lanes;
  worker->partitions = n;
  return KL_OK;
}

/* Acquires a new epoch, retrying while the store is unavailable: the group
 * gave us the partition, and nobody else will apply it meanwhile. */
static kl_err_t kl_lane_acquire(kl_worker_t *worker, int32_t partition,
                                kl_partition_state_t *state) {
  int backoff_ms = 100;
  for (;;) {
    kl_err_t err = kl_store_acquire(worker->store, worker->topic, partition,
                                    state);
    if (!err || !kl_err_is_retriable(err) || worker->stop)
      return err;
    KL_LOG_W(KL_COMP, "acquire partition=%" PRId32 " retry in %d ms: %s",
             partition, backoff_ms, kl_err_detail());
    kl_sleep_ms(backoff_ms);
    if (backoff_ms < 5000)
      backoff_ms *= 2;
  }
}

static void kl_on_assign(kl_worker_t *worker,
                         rd_kafka_topic_partition_list_t *parts) {
  for (int i = 0; i < parts->cnt; i++) {
    rd_kafka_topic_partition_t *tp = &parts->elems[i];
    kl_partition_state_t state;
    kl_err_t err = kl_lanes_reserve(worker, tp->partition);
    if (!err)
      err = kl_lane_acquire(worker, tp->partition, &state);
    if (err) {
      KL_LOG_E(KL_COMP, "cannot take partition=%" PRId32 ": %s", tp->partition,
               kl_err_detail());
      worker->stop = 1;
      continue;
    }
    kl_lane_t *lane = &worker->lanes[tp->partition];
    lane->state = KL_LANE_OWNED;
    lane->epoch = state.epoch;
    lane->watermark = state.watermark;
    lane->count = 0;
    tp->offset = state.watermark > 0 ? state.watermark : RD_KAFKA_OFFSET_BEGINNING;
    worker->owned++;
    KL_LOG_I(KL_COMP,
             "assigned partition=%" PRId32 " epoch=%" PRIu64
             " resume_offset=%" PRId64,
             tp->partition, state.epoch, state.watermark);
  }
}

static void kl_on_revoke(kl_worker_t *worker,
                         rd_kafka_topic_partition_list_t *parts, int lost) {
  for (int i = 0; i < parts->cnt; i++) {
    int32_t p = parts->elems[i].partition;
    if (p >= worker->partitions || worker->lanes[p].state == KL_LANE_FREE)
      continue;
    kl_lane_t *lane = &worker->lanes[p];
    if (!lost)
      kl_lane_apply(worker, p);
    kl_lane_drop_msgs(lane);
    KL_LOG_I(KL_COMP,
             "%s partition=%" PRId32 " epoch=%" PRIu64 " watermark=%" PRId64,
             lost ? "lost" : "revoked", p, lane->epoch, lane->watermark);
    lane->state = KL_LANE_FREE;
    worker->owned--;
  }
}

static void kl_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                            rd_kafka_topic_partition_list_t *parts,
                            void *opaque) {
  kl_worker_t *worker = opaque;
  int cooperative = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    worker->assigned_once = 1;
    kl_on_assign(worker, parts);
    if (cooperative)
      rd_kafka_error_destroy(rd_kafka_incremental_assign(rk, parts));
    else
      rd_kafka_assign(rk, parts);
    /* A partition this worker paused when it was fenced must not stay
     * paused when the group hands it back. */
    rd_kafka_resume_partitions(rk, parts);
  } else {
    kl_on_revoke(worker, parts, rd_kafka_assignment_lost(rk));
    if (cooperative)
      rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, parts));
    else
      rd_kafka_assign(rk, NULL);
  }
}

/* ---- setup --------------------------------------------------------------- */

static kl_err_t kl_consumer_new(kl_worker_t *worker) {
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  char session[32], heartbeat[32];
  int64_t session_ms = kl__conf_int(worker->conf, "worker.session.timeout.ms");
  snprintf(session, sizeof(session), "%" PRId64, session_ms);
  /* A third of the session, as Kafka advises, and at most 1 s so that a
   * rebalance is noticed quickly. */
  snprintf(heartbeat, sizeof(heartbeat), "%" PRId64,
           session_ms / 3 < 1000 ? session_ms / 3 : 1000);
  const char *const defaults[] = {
      "group.id", kl_conf_get(worker->conf, "worker.group"),
      "partition.assignment.strategy", "cooperative-sticky",
      "enable.auto.commit", "false",
      "enable.auto.offset.store", "false",
      "auto.offset.reset", "earliest",
      "session.timeout.ms", session,
      "heartbeat.interval.ms", heartbeat,
      NULL};
  kl_err_t err = kl__kafka_conf_apply(kconf, worker->conf, defaults);
  if (err) {
    rd_kafka_conf_destroy(kconf);
    return err;
  }
  rd_kafka_conf_set_opaque(kconf, worker);
  rd_kafka_conf_set_rebalance_cb(kconf, kl_rebalance_cb);
  char errstr[512];
  worker->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr));
  if (!worker->rk) {
    rd_kafka_conf_destroy(kconf);
    return kl__err(KL_EKAFKA, "cannot create the consumer: %s", errstr);
  }
  rd_kafka_poll_set_consumer(worker->rk);
  return KL_OK;
}

kl_err_t kl_worker_new(const kl_conf_t *conf, const char *topic,
                       kl_store_t *store, kl_handler_fn_t *handler,
                       void *handler_opaque, kl_worker_t **out) {
  if (!conf || !topic || !*topic || !store || !handler || !out)
    return kl__err(KL_EINVAL, "kl_worker_new: conf, topic, store and handler "
                              "are required");
  if (!kl_conf_get(conf, "kafka.bootstrap.servers"))
    return kl__err(KL_ECONF, "no bootstrap servers: set "
                             "kafka.bootstrap.servers (-b HOST:PORT)");
  kl_worker_t *worker = calloc(1, sizeof(*worker));
  if (!worker)
    return KL_ENOMEM;
  worker->conf = kl_conf_dup(conf);
  worker->topic = strdup(topic);
  worker->store = store;
  worker->applier = (kl__applier_t){.store = store,
                                    .topic = worker->topic,
                                    .handler = handler,
                                    .handler_opaque = handler_opaque,
                                    .decoder = kl_decoder_new()};
  worker->batch_max = (size_t)kl__conf_int(conf, "worker.batch.max");
  worker->batch_wait_ns = kl__conf_int(conf, "worker.batch.wait.ms") * 1000000;
  kl_err_t err = KL_ENOMEM;
  if (worker->conf && worker->topic && worker->applier.decoder)
    err = kl_consumer_new(worker);
  if (err) {
    kl_worker_destroy(worker);
    return err;
  }
  *out = worker;
  return KL_OK;
}

/* Refuses to run on a topic that is missing or whose partition count is not
 * the one the fleet expects: keys would move between owners. */
static kl_err_t kl_check_topic(kl_worker_t *worker) {
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(worker->rk, worker->topic, NULL);
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t kerr = rd_kafka_metadata(worker->rk, 0, rkt, &md, 10000);
  rd_kafka_topic_destroy(rkt);
  if (kerr)
    return kl__err(KL_EKAFKA_TRANSIENT,
                   "cannot read the metadata of topic %s: %s; check -b",
                   worker->topic, rd_kafka_err2str(kerr));
  kl_err_t err = KL_OK;
  int32_t have = md->topic_cnt == 1 ? md->topics[0].partition_cnt : 0;
  int64_t want = kl__conf_int(worker->conf, "worker.expect.partitions");
  if (md->topic_cnt != 1 || md->topics[0].err || have == 0)
    err = kl__err(KL_ENOTFOUND, "topic %s does not exist: create it first",
                  worker->topic);
  else if (want && have != want)
    err = kl__err(KL_EPARTITIONS,
                  "topic %s has %" PRId32 " partitions, the fleet expects %" PRId64
                  ": keys would move between owners; recreate the topic or "
                  "pass --partitions %" PRId32,
                  worker->topic, have, want, have);
  rd_kafka_metadata_destroy(md);
  return err ? err : kl_lanes_reserve(worker, have - 1);
}

/* Buffers one consumed message in its lane; returns the lane's partition
 * when the batch is full, else -1. */
static int32_t kl_buffer(kl_worker_t *worker, rd_kafka_message_t *m) {
  int32_t p = m->partition;
  if (p >= worker->partitions || worker->lanes[p].state != KL_LANE_OWNED) {
    rd_kafka_message_destroy(m); /* fenced, failed or no longer ours */
    return -1;
  }
  kl_lane_t *lane = &worker->lanes[p];
  if (!lane->msgs &&
      !(lane->msgs = malloc(worker->batch_max * sizeof(*lane->msgs)))) {
    rd_kafka_message_destroy(m);
    return -1; /* not consumed past; redelivered after the next rebalance */
  }
  if (lane->count == 0)
    lane->first_ns = kl__mono_ns();
  lane->msgs[lane->count++] = m;
  return lane->count >= worker->batch_max ? p : -1;
}

static void kl_apply_due(kl_worker_t *worker, int force) {
  int64_t now = kl__mono_ns();
  for (int32_t p = 0; p < worker->partitions; p++) {
    kl_lane_t *lane = &worker->lanes[p];
    if (lane->count &&
        (force || now - lane->first_ns >= worker->batch_wait_ns))
      kl_lane_apply(worker, p);
  }
}

static void kl_on_consume_error(kl_worker_t *worker, rd_kafka_message_t *m) {
  if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
    KL_LOG_W(KL_COMP, "consume: %s", rd_kafka_message_errstr(m));
  rd_kafka_message_destroy(m);
}

/*
 * librdkafka before 2.3.0 asserts when a cooperative-sticky consumer that
 * never received an assignment is destroyed (librdkafka issue #4312, fixed
 * by PR #4381; Debian 12 ships 2.0.2). A member stopped while its first
 * join is under way therefore waits for that join, within the session
 * timeout, before closing. Messages consumed meanwhile are not applied.
 */
static void kl_await_first_assignment(kl_worker_t *worker) {
  int64_t deadline = kl__mono_ns() +
                     kl__conf_int(worker->conf, "worker.session.timeout.ms") *
                         2000000;
  while (!worker->assigned_once && kl__mono_ns() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk, 100);
    if (m)
      rd_kafka_message_destroy(m);
  }
}

kl_err_t kl_worker_run(kl_worker_t *worker) {
  kl_err_t err = kl_check_topic(worker);
  if (err)
    return err;
  rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, worker->topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t kerr = rd_kafka_subscribe(worker->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (kerr)
    return kl__err(KL_EKAFKA, "subscribe to %s: %s", worker->topic,
                   rd_kafka_err2str(kerr));
  int64_t last_sweep = 0;
  while (!worker->stop) {
    int timeout_ms = (int)(worker->batch_wait_ns / 1000000);
    rd_kafka_message_t *m = rd_kafka_consumer_poll(worker->rk,
                                                   timeout_ms > 0 ? timeout_ms : 1);
    if (m && m->err)
      kl_on_consume_error(worker, m);
    else if (m) {
      int32_t full = kl_buffer(worker, m);
      if (full >= 0)
        kl_lane_apply(worker, full);
    }
    kl_apply_due(worker, !m);
    int64_t now = kl__mono_ns();
    if (now - last_sweep > 1000000000) {
      size_t removed = 0;
      if (kl_store_sweep(worker->store, 1000, &removed))
        KL_LOG_D(KL_COMP, "sweep: %s", kl_err_detail());
      last_sweep = now;
    }
  }
  kl_apply_due(worker, 1);
  kl_await_first_assignment(worker);
  rd_kafka_consumer_close(worker->rk); /* revokes, so lanes finish first */
  return KL_OK;
}

void kl_worker_stop(kl_worker_t *worker) {
  worker->stop = 1;
}

void kl_worker_stats(const kl_worker_t *worker, kl_worker_stats_t *stats) {
  stats->applied = worker->applied;
  stats->duplicates = worker->duplicates;
  stats->redelivered = worker->redelivered;
  stats->batches = worker->batches;
  stats->fenced = worker->fenced;
  stats->failed = worker->failed;
  stats->owned = worker->owned;
}

void kl_worker_destroy(kl_worker_t *worker) {
  if (!worker)
    return;
  for (int32_t p = 0; p < worker->partitions; p++) {
    kl_lane_drop_msgs(&worker->lanes[p]);
    free(worker->lanes[p].msgs);
  }
  free(worker->lanes);
  if (worker->rk)
    rd_kafka_destroy(worker->rk);
  kl_decoder_destroy(worker->applier.decoder);
  kl_conf_destroy(worker->conf);
  free(worker->topic);
  free(worker);
}
