/* The log against the store's watermark: logcheck.h. */
#include "worker/logcheck.h"

#include <inttypes.h>
#include <stdio.h>

kl__log_verdict_t kl__log_classify(int64_t low, int64_t high,
                                   int64_t watermark, kl__log_check_t *check) {
  kl__log_check_t c = {KL__LOG_OK, low, high, watermark, 0};
  if (watermark > 0 && high < watermark) {
    c.verdict = KL__LOG_BACKWARDS;
  } else if (watermark > 0 && low > watermark) {
    c.verdict = KL__LOG_GAP;
    c.lost = low - watermark;
  }
  if (check)
    *check = c;
  return c.verdict;
}

const char *kl__log_verdict_name(kl__log_verdict_t verdict) {
  switch (verdict) {
  case KL__LOG_BACKWARDS: return "went_backwards";
  case KL__LOG_GAP: return "retention_gap";
  default: return "ok";
  }
}

const char *kl__log_describe(const char *topic, int32_t partition,
                             const kl__log_check_t *check, char *buf,
                             size_t size) {
  if (check->verdict == KL__LOG_BACKWARDS)
    snprintf(buf, size,
             "topic %s partition %" PRId32 " went backwards: its log ends at "
             "offset %" PRId64 ", below the store's watermark %" PRId64
             " (the next offset the store applies): the topic was recreated "
             "or truncated, or this store belongs to another cluster, and "
             "its records would be taken for ones already applied; if the "
             "log is meant to start over, run `keylane store reset -t %s -p "
             "%" PRId32 " --store STORE` (it keeps the idempotency keys and "
             "starts the partition again from offset %" PRId64 "), else "
             "give the worker the cluster its store belongs to",
             topic, partition, check->high, check->watermark, topic,
             partition, check->low);
  else if (check->verdict == KL__LOG_GAP)
    snprintf(buf, size,
             "topic %s partition %" PRId32 " lost %" PRId64 " records: its "
             "log starts at offset %" PRId64 ", above the store's watermark "
             "%" PRId64 ": retention deleted offsets %" PRId64 "..%" PRId64
             " before they were applied; to go on without them set "
             "worker.on.gap=skip (they are counted in "
             "keylane_worker_gap_records_total), and raise the topic's "
             "retention.ms above the longest time a worker may lag",
             topic, partition, check->lost, check->low, check->watermark,
             check->watermark, check->low - 1);
  else if (size)
    buf[0] = '\0';
  return buf;
}
