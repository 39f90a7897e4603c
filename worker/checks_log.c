/* The log against the store's watermark: logcheck.h. */
#include "worker/checks_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

kl__log_verdict_t kl__log_classify(int64_t low, int64_t high, int64_t watermark,
                                   kl__log_check_t *check) {
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
  case KL__LOG_BACKWARDS:
    return "went_backwards";
  case KL__LOG_GAP:
    return "retention_gap";
  default:
    return "ok";
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
             topic, partition, check->high, check->watermark, topic, partition,
             check->low);
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

/* Reads partition @p p's log and watermark into @p check. @returns the
 * status the check falls to when they cannot be read (msg written), or
 * KL__CHECK_OK. */
static kl__check_status_t check_one(rd_kafka_t *rk, kl_store_t *store,
                                    const char *topic, int32_t p,
                                    int timeout_ms, kl__log_check_t *check,
                                    kl__check_t *out) {
  kl_partition_state_t st;
  if (kl_store_partition(store, topic, p, &st)) {
    snprintf(out->msg, sizeof(out->msg),
             "cannot read partition %" PRId32 " of topic %s in the store: %s",
             p, topic, kl_err_detail());
    return KL__CHECK_FAIL;
  }
  int64_t low, high;
  rd_kafka_resp_err_t kerr =
      rd_kafka_query_watermark_offsets(rk, topic, p, &low, &high, timeout_ms);
  if (kerr) {
    snprintf(out->msg, sizeof(out->msg),
             "cannot read the log offsets of "
             "topic %s partition %" PRId32 ": %s; its log is not checked "
             "against the store's watermark",
             topic, p, rd_kafka_err2str(kerr));
    return KL__CHECK_WARN;
  }
  kl__log_classify(low, high, st.watermark, check);
  return KL__CHECK_OK;
}

void kl__check_log(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                   int32_t partitions, int timeout_ms, kl__check_t *out) {
  kl__check_t unread = {KL__CHECK_OK, ""}; /* the last WARN */
  char first[sizeof(out->msg)] = "";
  int bad = 0;
  for (int32_t p = 0; p < partitions; p++) {
    kl__log_check_t check;
    kl__check_status_t s =
        check_one(rk, store, topic, p, timeout_ms, &check, out);
    if (s == KL__CHECK_FAIL) {
      out->status = s;
      return;
    }
    if (s == KL__CHECK_WARN)
      unread = *out;
    else if (check.verdict != KL__LOG_OK && !bad++)
      kl__log_describe(topic, p, &check, first, sizeof(first));
  }
  if (bad) {
    out->status = KL__CHECK_FAIL;
    if (bad == 1)
      memcpy(out->msg, first, sizeof(out->msg));
    else if (snprintf(out->msg, sizeof(out->msg),
                      "%d partitions of topic %s "
                      "went backwards or lost records; the first: %s",
                      bad, topic, first) < 0) /* a long message is cut: fine */
      out->msg[0] = '\0';
  } else if (unread.status == KL__CHECK_WARN) {
    *out = unread;
  } else {
    out->status = KL__CHECK_OK;
    snprintf(out->msg, sizeof(out->msg),
             "the logs of topic %s hold the "
             "store's watermarks on all %" PRId32 " partitions: none went "
             "backwards, none lost records before they were applied",
             topic, partitions);
  }
}
