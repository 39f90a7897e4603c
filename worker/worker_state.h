/*
 * The worker's state, shared by the three files of the worker: worker.c
 * (setup and the poll loop), worker_own.c (taking and giving up
 * partitions) and worker_retake.c (taking a partition back from a fencer
 * that went quiet).
 */
#ifndef KEYLANE_WORKER_STATE_H
#define KEYLANE_WORKER_STATE_H

#include <pthread.h>
#include <stdatomic.h>

#include <librdkafka/rdkafka.h>

#include "common/partitions.h"
#include "store/store_internal.h"
#include "worker/apply.h"
#include "worker/dlq.h"
#include "worker/lanes.h"
#include "worker/lanes_pool.h"
#include "worker/log_guard.h"
#include "worker/membership.h"
#include "worker/store_read.h"

/* What a fenced lane last saw of its partition in the store, and since
 * when it has not changed (0: not watched); after a failed retake, the
 * backoff before the next try and when that try may come. */
typedef struct kl_quiet {
  uint64_t own_epoch; /* the epoch this worker took it with */
  kl_partition_state_t seen;
  int64_t since_ns;
  int64_t backoff_ns;
  int64_t next_try_ns;
} kl_quiet_t;

struct kl_worker {
  kl_conf_t *conf;
  char *topic;
  kl_store_t *store;
  kl__store_read_t *reader; /* the observers' reads (store_read.h) */
  rd_kafka_t *rk;
  kl__applier_t applier; /* the poll thread's; the lanes copy it */
  kl__dlq_t *dlq;
  kl__lanes_t *lanes;
  kl__log_guard_t *log_guard;
  kl__lanes_pool_t *pool;
  int threads;       /* executors: 0 in inline mode */
  atomic_int stop;   /* lock-free: safe from a signal handler and threads */
  int assigned_once; /* a rebalance callback has assigned to this member */
  int cooperative;   /* the assignor's rebalance protocol is COOPERATIVE */
  _Atomic int32_t owned;
  int64_t retake_ns; /* worker.fenced.retake.ms; 0: never */
  int64_t retake_checked_ns;
  kl_quiet_t *quiet; /* by partition: its state as a fenced lane saw it */
  int32_t quiet_count;
  /* Set by kl_worker_run()'s thread, read by kl_worker_stats() on any. */
  atomic_int retention_override;  /* runs despite a failed retention check */
  atomic_int retention_unchecked; /* the cluster could not tell the retention */
  atomic_int waiting;      /* for Kafka, at start: kl__worker_waiting() */
  _Atomic int64_t loop_ns; /* the poll loop's last turn; 0: not running */
  pthread_mutex_t why_mu;  /* guards why, read by the metrics thread */
  char why[512];
  kl__partitions_expect_t expect;      /* the topic's count the fleet expects */
  _Atomic int32_t partitions_live;     /* as last read; 0: not yet */
  _Atomic int32_t partitions_expected; /* expect.count, for other threads */
  int64_t check_ns, checked_ns;        /* worker.partitions.check.ms */
  atomic_int topic_stopped; /* the count changed: it takes nothing more */
  kl__worker_seek_hook_fn *seek_hook; /* test hook; may be NULL */
  void *seek_hook_opaque;
  int64_t stall_ms;                      /* worker.stall.ms; 0: not watched */
  char instance_id[KL__INSTANCE_ID_MAX]; /* group.instance.id; "": dynamic */
  kl_err_t fatal; /* the consumer raised a fatal error (membership.h) */
  char fatal_why[1024];
  int64_t acquire_wait_ms; /* worker.acquire.wait */
  kl_err_t unowned; /* an assigned partition could not be taken: stopped */
  char unowned_why[1024];
  /* This worker's Kafka cluster and group (worker_owner()), which the
   * store records as the topic's owner or compares with the recorded
   * one; poll thread. owner_known: 0 until the cluster id was read. */
  kl__store_owner_t owner;
  int owner_known;
  /* kl_worker_health()'s memory of a fence, guarded by why_mu: the fenced
   * count it last saw grow, and the batch count then. */
  uint64_t health_fenced, health_batches;
  /* The last fences (kl_worker_foreach_fence()), a ring guarded by why_mu:
   * written by the poll thread, read by the metrics thread. */
  kl_worker_fence_t fences[KL_WORKER_FENCES_MAX];
  size_t nfences; /* ever seen */
};

/* Records the epochs just acquired in the group's commit metadata before
 * any handler runs with them: a store lost from now on cannot make a later
 * owner reuse them. The offsets are the store's watermarks, as every
 * commit's. */
void kl__worker_commit_epochs(kl_worker_t *worker,
                              rd_kafka_topic_partition_list_t *taken);

/* Adds @p partition, at the store's watermark with its new epoch, to the
 * list kl__worker_commit_epochs() commits. */
void kl__worker_epoch_add(rd_kafka_topic_partition_list_t *taken,
                          const char *topic, int32_t partition,
                          const kl_partition_state_t *state);

/* The Kafka cluster and group this worker is of, for the store's record
 * of the topic's owner (kl__store_acquire_owned()): the cluster id is read
 * once (rd_kafka_clusterid(), known after the group's join). NULL, logged,
 * while it cannot be read: the partitions are then taken without the
 * owner check, as a check that could not be made is (owner_refuses()). */
const kl__store_owner_t *kl__worker_owner(kl_worker_t *worker);

/* A revoked lane stops taking events, lets its running ones finish and
 * commits what completed, inside the rebalance callback, before the
 * partition is given up. A lost one commits nothing: a newer owner may
 * exist already. */
void kl__worker_on_revoke(kl_worker_t *worker,
                          rd_kafka_topic_partition_list_t *parts, int lost);

/* Offset commits (the lanes' and this file's) report here, on the poll
 * thread; a failed one is sent again (kl__lanes_kafka_committed()). */
void kl__worker_offset_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                 rd_kafka_topic_partition_list_t *offsets,
                                 void *opaque);

/* The consumer's rebalance callback (rd_kafka_conf_set_rebalance_cb()):
 * takes what the group assigns, gives up what it revokes. */
void kl__worker_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *parts,
                             void *opaque);

/* @returns what a fenced lane of @p partition last saw of it, or NULL. */
kl_quiet_t *kl__worker_quiet_of(kl_worker_t *worker, int32_t partition);

/* Takes back, every worker.fenced.retake.ms, the fenced partitions whose
 * fencer went quiet (worker_retake.c says how). */
void kl__worker_retake_quiet(kl_worker_t *worker);

#endif
