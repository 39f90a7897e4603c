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
} kl__checks_log_verdict_t;

/** One comparison, as kl__checks_log_classify() made it. */
typedef struct kl__checks_log_result {
  kl__checks_log_verdict_t verdict;
  int64_t low, high; /**< the retained log: [low, high) */
  int64_t watermark; /**< the offset the store applies next */
  int64_t lost;      /**< _GAP: records deleted unapplied; else 0 */
  char found[160];   /**< _REPLACED: the two records, as */
  char applied[160]; /**< kl__apply_ident_text() says them */
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

/** @returns "ok", "went_backwards", "retention_gap" or "log_replaced" (a
 *  metric label). */
const char *kl__checks_log_verdict_name(kl__checks_log_verdict_t verdict);

/**
 * Writes what @p check means for partition @p partition of @p topic, for
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
