/*
 * Is the log still the one the store applied? A partition's retained log
 * [low, high) compared with the store's watermark (the next offset it
 * would apply): the one comparison behind the worker's stop of a
 * partition whose log went backwards or lost records to retention
 * (log_guard.c), written so that `keylane doctor` can call it too.
 *
 * Kafka tells a recreated topic from the old one by its topic ID, but
 * librdkafka has no public topic-ID API before 2.3.0 (rd_kafka_DescribeTopics;
 * Debian 12 ships 2.0.2). So the store keeps, with each watermark, the
 * identity of the record at watermark - 1 (kl__store_last()): a recreated
 * topic that already holds more records than the watermark has another
 * record there (KL__CHECKS_LOG_REPLACED), which the worker finds when it takes
 * the partition (lanes.h, kl__lanes_verify()) and doctor when it runs.
 *
 * kl__check_log() runs the comparison on every partition of a topic, as
 * a check of checks.h, for `keylane doctor`.
 *
 * Internal, not installed. kl__checks_log_classify() and
 * kl__checks_log_describe() are pure (any thread); kl__check_log() blocks on
 * Kafka.
 */
#ifndef KEYLANE_WORKER_CHECKS_LOG_H
#define KEYLANE_WORKER_CHECKS_LOG_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "keylane/store.h"
#include "store/store_internal.h"
#include "worker/checks.h"

typedef enum kl__checks_log_verdict {
  /** low <= watermark <= high, or nothing applied */
  KL__CHECKS_LOG_OK = 0,
  /** high < watermark: recreated or truncated */
  KL__CHECKS_LOG_BACKWARDS,
  /** watermark < low: retention deleted unapplied records */
  KL__CHECKS_LOG_GAP,
  /** the record at watermark - 1 is not the one the store applied there: a
   *  replaced log */
  KL__CHECKS_LOG_REPLACED,
  /** the group committed an offset above the store's watermark, with an
   *  owner's epoch above the store's: the store never saw that owner, and
   *  the records in between, which the log still holds, would be applied
   *  a second time (kl__checks_log_store_unknown()) */
  KL__CHECKS_LOG_STORE_UNKNOWN,
  /** the store records another Kafka cluster as the topic's owner: this
   *  worker reads a foreign log under the same topic name
   *  (kl__checks_log_owner_differs()) */
  KL__CHECKS_LOG_CLUSTER_MISMATCH,
  /** the store records another consumer group as the topic's owner: a
   *  second fleet (a typo'd group) would fence the first */
  KL__CHECKS_LOG_GROUP_MISMATCH,
} kl__checks_log_verdict_t;

/** One comparison, as kl__checks_log_classify() made it. */
typedef struct kl__checks_log_result {
  kl__checks_log_verdict_t verdict;
  int64_t low, high; /**< the retained log: [low, high) */
  int64_t watermark; /**< the offset the store applies next */
  int64_t lost;      /**< _GAP: records deleted unapplied; else 0 */
  char found[160];   /**< _REPLACED: the two records, as */
  char applied[160]; /**< kl__apply_ident_text() says them */
  int64_t committed; /**< _STORE_UNKNOWN: the group's committed offset, */
  uint64_t committed_epoch; /**< the epoch it carries, */
  uint64_t store_epoch;     /**< and the store's */
  /** _CLUSTER_MISMATCH, _GROUP_MISMATCH: the owner the store recorded for
   *  the topic, and this worker's */
  kl__store_owner_t recorded, mine;
} kl__checks_log_result_t;

/**
 * Compares the retained log [@p low, @p high) of a partition with the
 * store's @p watermark. A watermark of 0 (nothing applied: a consumer
 * starts at the log's beginning) is always KL__CHECKS_LOG_OK.
 * @returns the verdict, also in @p check (may be NULL) with the figures.
 */
kl__checks_log_verdict_t
kl__checks_log_classify(int64_t low, int64_t high, int64_t watermark,
                        kl__checks_log_result_t *check);

/**
 * Whether the store's state @p st of a partition never saw the owner that
 * committed offset @p committed with epoch @p committed_epoch in the
 * fleet's group (common/kafka.h), on a log that starts at @p low: that
 * owner's epoch is above the store's and its offset above the store's
 * watermark and the log's start, so the records it applied, still in the
 * log, would be applied again. A store the fleet used always holds the
 * epochs and watermarks its group committed (the store commits first), a
 * `keylane store reset` a newer epoch; a wrong --store, a lost store or
 * deleted partition rows do not. A group that committed nothing (a new
 * fleet; RD_KAFKA_OFFSET_INVALID) or without keylane's metadata (epoch 0)
 * is no sign. Pure.
 * @returns 1 with KL__CHECKS_LOG_STORE_UNKNOWN and the figures in @p check
 *          (may be NULL), else 0 (@p check untouched).
 */
int kl__checks_log_store_unknown(const kl_partition_state_t *st, int64_t low,
                                 int64_t committed, uint64_t committed_epoch,
                                 kl__checks_log_result_t *check);

/**
 * Whether @p mine, a new owner's Kafka cluster and group, differs from
 * @p recorded, the topic's owner its store recorded (kl__store_owner()):
 * another cluster (KL__CHECKS_LOG_CLUSTER_MISMATCH: its log is not the one
 * the store applied, whatever the offsets say) or, on the same cluster,
 * another group (KL__CHECKS_LOG_GROUP_MISMATCH: a second fleet). Pure.
 * @returns 1 with the verdict and both owners in @p check (may be NULL),
 *          else 0 (@p check untouched).
 */
int kl__checks_log_owner_differs(const kl__store_owner_t *recorded,
                                 const kl__store_owner_t *mine,
                                 kl__checks_log_result_t *check);

/**
 * What a new owner checks before it takes a partition (a new epoch fences
 * whoever applies it, on any cluster): partition @p p of @p topic against
 * @p store's state: kl__checks_log_store_unknown() with the group's
 * @p committed offset and @p committed_epoch, then the log's offsets
 * (kl__checks_log_classify()) and the record at the watermark - 1 when the
 * store kept it, all read through @p reader (kl__kafka_reader_new(), reset
 * "earliest"), @p timeout_ms for the offsets; when they pass, the owner
 * the store recorded for the topic against @p mine
 * (kl__checks_log_owner_differs(); NULL: not compared; the acquire
 * compares it again, kl__store_acquire_owned()). Blocks on Kafka.
 * @returns KL_OK with the verdict in @p check; else the error (the
 *          detail says whether the store or the log could not be read),
 *          and nothing was checked.
 */
kl_err_t kl__checks_log_owner(rd_kafka_t *reader, kl_store_t *store,
                              const char *topic, int32_t p,
                              const kl__store_owner_t *mine, int64_t committed,
                              uint64_t committed_epoch, int timeout_ms,
                              kl__checks_log_result_t *check);

/** @returns "ok", "went_backwards", "retention_gap", "log_replaced",
 *  "store_unknown", "cluster_mismatch" or "group_mismatch" (a metric
 *  label). */
const char *kl__checks_log_verdict_name(kl__checks_log_verdict_t verdict);

/**
 * Writes what @p check means for partition @p partition of @p topic (an
 * owner mismatch: -1 for the whole topic), for
 * a person: the figures, the likely cause and the fixes (one line, no
 * trailing newline). "" for KL__CHECKS_LOG_OK.
 * @returns @p buf.
 */
const char *kl__checks_log_describe(const char *topic, int32_t partition,
                                    const kl__checks_log_result_t *check,
                                    char *buf, size_t size);

/**
 * For `keylane doctor`: compares the store's watermark of each of the
 * @p partitions partitions of @p topic with its retained log (low and
 * high offsets from @p rk, @p timeout_ms each). OK when every log holds
 * its watermark; FAIL naming the first partition whose log went backwards
 * or lost records (as kl__checks_log_describe() says it) and how many more did,
 * or when the store cannot be read; WARN when a log's offsets cannot be
 * read.
 */
void kl__check_log(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                   int32_t partitions, int timeout_ms, kl__check_t *out);

#endif
