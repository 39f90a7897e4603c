/* The log against the store's watermark: checks_log.h. */
#include "worker/checks_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka_pos.h"
#include "store/store_internal.h"
#include "worker/apply.h"

kl__checks_log_verdict_t
kl__checks_log_classify(int64_t low, int64_t high, int64_t watermark,
                        kl__checks_log_result_t *check) {
  kl__checks_log_result_t c = {.verdict = KL__CHECKS_LOG_OK,
                               .low = low,
                               .high = high,
                               .watermark = watermark};
  if (watermark > 0 && high < watermark) {
    c.verdict = KL__CHECKS_LOG_BACKWARDS;
  } else if (watermark > 0 && low > watermark) {
    c.verdict = KL__CHECKS_LOG_GAP;
    c.lost = low - watermark;
  }
  if (check)
    *check = c;
  return c.verdict;
}

int kl__checks_log_store_unknown(const kl_partition_state_t *st, int64_t low,
                                 int64_t committed, uint64_t committed_epoch,
                                 kl__checks_log_result_t *check) {
  int64_t from = st->watermark > low ? st->watermark : low;
  /* At the store's own epoch too: the group's offsets follow the store's
   * commits, never lead them, so an offset above the watermark under the
   * same owner is a store that lost that owner's last commits (a backup
   * taken while it ran). */
  if (committed_epoch < st->epoch || committed_epoch == 0 || committed <= from)
    return 0;
  if (check) {
    check->verdict = KL__CHECKS_LOG_STORE_UNKNOWN;
    check->watermark = st->watermark;
    check->committed = committed;
    check->committed_epoch = committed_epoch;
    check->store_epoch = st->epoch;
  }
  return 1;
}

int kl__checks_log_owner_differs(const kl__store_owner_t *recorded,
                                 const kl__store_owner_t *mine,
                                 kl__checks_log_result_t *check) {
  if (kl__store_owner_equal(recorded, mine))
    return 0;
  if (check) {
    check->verdict = strcmp(recorded->cluster, mine->cluster) != 0
                         ? KL__CHECKS_LOG_CLUSTER_MISMATCH
                         : KL__CHECKS_LOG_GROUP_MISMATCH;
    check->recorded = *recorded;
    check->mine = *mine;
  }
  return 1;
}

const char *kl__checks_log_verdict_name(kl__checks_log_verdict_t verdict) {
  switch (verdict) {
  case KL__CHECKS_LOG_BACKWARDS:
    return "went_backwards";
  case KL__CHECKS_LOG_GAP:
    return "retention_gap";
  case KL__CHECKS_LOG_REPLACED:
    return "log_replaced";
  case KL__CHECKS_LOG_STORE_UNKNOWN:
    return "store_unknown";
  case KL__CHECKS_LOG_CLUSTER_MISMATCH:
    return "cluster_mismatch";
  case KL__CHECKS_LOG_GROUP_MISMATCH:
    return "group_mismatch";
  default:
    return "ok";
  }
}

/* kl__checks_log_describe() of KL__CHECKS_LOG_STORE_UNKNOWN: the fix for
 * a store that holds nothing of the partition is a rebuild of it (into the
 * fleet's store, or a new one), for one that holds an older state a
 * replay from its watermark; both take an epoch above the group's. */
static void store_unknown_describe(const char *topic, int32_t partition,
                                   const kl__checks_log_result_t *check,
                                   char *buf, size_t size) {
  int empty = check->store_epoch == 0 && check->watermark == 0;
  snprintf(buf, size,
           "topic %s partition %" PRId32 " is unknown to this store: the "
           "group committed offset %" PRId64 " with owner epoch %" PRIu64
           ", the store holds watermark %" PRId64 " and epoch %" PRIu64
           ": it never saw %s, and the records from offset %" PRId64
           " to %" PRId64 ", which the fleet applied, would be applied again "
           "(their follow-ups and dead letters sent again); if --store is "
           "not the fleet's store, point it there; if the store is to be "
           "adopted (%s), %s `keylane %s -b BOOTSTRAP -t %s -p %" PRId32
           "%s --store STORE --handler H -X worker.group=GROUP` with the "
           "fleet stopped (docs/operations.md, \"A partition the store "
           "does not know\")",
           topic, partition, check->committed, check->committed_epoch,
           check->watermark, check->store_epoch,
           check->committed_epoch == check->store_epoch
               ? "that owner's last commits"
               : "that owner",
           check->watermark > check->low ? check->watermark : check->low,
           check->committed - 1,
           empty ? "a lost store, deleted partition rows"
                 : "a backup, a store that lost commits",
           empty ? "rebuild the partition from the log:"
                 : "bring it up to date from its watermark on purpose:",
           empty ? "store rebuild" : "replay", topic, partition,
           empty ? "" : " --from watermark");
}

/* kl__checks_log_describe() of the two mismatches: both owners, what a
 * take would have done, and the two fixes. */
static void owner_describe(const char *topic, int32_t partition,
                           const kl__checks_log_result_t *check, char *buf,
                           size_t size) {
  int cluster = check->verdict == KL__CHECKS_LOG_CLUSTER_MISMATCH;
  char where[32] = ""; /* a partition < 0: the whole topic (doctor) */
  if (partition >= 0)
    snprintf(where, sizeof(where), " partition %" PRId32, partition);
  snprintf(buf, size,
           "topic %s%s belongs to another %s: the store "
           "records Kafka cluster %s and group %s as the topic's owner, this "
           "worker reads cluster %s in group %s; taking it would fence the "
           "fleet that owns it and apply %s; if %s is wrong, give the "
           "worker the fleet's (%s %s); if the fleet moved on purpose (%s), "
           "record the new owner with `keylane store bind -t %s -b "
           "BOOTSTRAP -g %s --store STORE` (docs/operations.md, \"A store "
           "that belongs to another cluster or group\")",
           topic, where, cluster ? "Kafka cluster" : "consumer group",
           check->recorded.cluster, check->recorded.group, check->mine.cluster,
           check->mine.group,
           cluster ? "another cluster's log, whose records the fleet's "
                     "owner would later skip as duplicates"
                   : "the records a second time",
           cluster ? "-b (bootstrap.servers)" : "-g (worker.group)",
           cluster ? "-b of cluster" : "-g",
           cluster ? check->recorded.cluster : check->recorded.group,
           cluster ? "a new cluster after a disaster" : "a renamed group",
           topic, check->mine.group);
}

const char *kl__checks_log_describe(const char *topic, int32_t partition,
                                    const kl__checks_log_result_t *check,
                                    char *buf, size_t size) {
  if (check->verdict == KL__CHECKS_LOG_BACKWARDS)
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
  else if (check->verdict == KL__CHECKS_LOG_GAP)
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
  else if (check->verdict == KL__CHECKS_LOG_REPLACED)
    snprintf(buf, size,
             "topic %s partition %" PRId32 " holds another log than the one "
             "the store applied: the record at offset %" PRId64 " (the "
             "store's watermark - 1) is %s, the store applied %s there: the "
             "topic was deleted and created again with as many records, or "
             "this store belongs to another cluster, and its records would "
             "be taken for ones already applied; if the new log is meant to "
             "be applied, run `keylane store reset -t %s -p %" PRId32
             " --store STORE` (it keeps the idempotency keys and starts the "
             "partition again from its first record), else give the worker "
             "the cluster its store belongs to",
             topic, partition, check->watermark - 1, check->found,
             check->applied, topic, partition);
  else if (check->verdict == KL__CHECKS_LOG_STORE_UNKNOWN)
    store_unknown_describe(topic, partition, check, buf, size);
  else if (check->verdict == KL__CHECKS_LOG_CLUSTER_MISMATCH ||
           check->verdict == KL__CHECKS_LOG_GROUP_MISMATCH)
    owner_describe(topic, partition, check, buf, size);
  else if (size)
    buf[0] = '\0';
  return buf;
}

typedef struct last_read {
  kl_decoder_t *decoder;
  int64_t offset;
  char ident[KL__SID_MAX];
  size_t len; /* 0: the log no longer holds the record */
} last_read_t;

static int last_take(void *opaque, rd_kafka_message_t *m) {
  last_read_t *r = opaque;
  if (m->offset == r->offset)
    r->len = kl__apply_ident(r->decoder, m, r->ident);
  return KL__READ_STOP;
}

/* Compares the record at the watermark - 1 of partition @p p with the
 * one the store applied there, when it kept it: KL__CHECKS_LOG_REPLACED in
 * @p check when they differ. */
static void check_last(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                       int32_t p, kl__checks_log_result_t *check) {
  char ident[KL__SID_MAX];
  size_t len;
  int64_t wm;
  if (check->watermark <= check->low ||
      kl__store_last(store, topic, p, &wm, ident, &len) || !len ||
      wm != check->watermark)
    return;
  last_read_t r = {kl_decoder_new(), wm - 1, "", 0};
  kl__tp_range_t range = {.partition = p, .start = wm - 1, .end = wm};
  if (r.decoder &&
      kl__kafka_read(rk, topic, &range, 1, last_take, &r, NULL) == KL_OK &&
      r.len && (r.len != len || memcmp(r.ident, ident, len) != 0)) {
    check->verdict = KL__CHECKS_LOG_REPLACED;
    kl__apply_ident_text(r.ident, r.len, check->found, sizeof(check->found));
    kl__apply_ident_text(ident, len, check->applied, sizeof(check->applied));
  }
  kl_decoder_destroy(r.decoder);
}

/* Reads partition @p p's state in @p store into @p st and its log's
 * offsets through @p rk into @p check, classified. @returns KL_OK, or the
 * error naming what could not be read. */
static kl_err_t log_read(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                         int32_t p, int timeout_ms, kl_partition_state_t *st,
                         kl__checks_log_result_t *check) {
  if (kl_store_partition(store, topic, p, st))
    return kl__err(KL_ESTORE,
                   "cannot read partition %" PRId32
                   " of topic %s in the store: %s",
                   p, topic, kl_err_detail());
  int64_t low, high;
  rd_kafka_resp_err_t kerr =
      rd_kafka_query_watermark_offsets(rk, topic, p, &low, &high, timeout_ms);
  if (kerr)
    return kl__err(KL_EKAFKA_TRANSIENT,
                   "cannot read the log offsets of topic %s partition "
                   "%" PRId32 ": %s; its log is not checked against the "
                   "store's watermark",
                   topic, p, rd_kafka_err2str(kerr));
  kl__checks_log_classify(low, high, st->watermark, check);
  check->store_epoch = st->epoch;
  return KL_OK;
}

/* The owner @p store recorded for @p topic against @p mine: 1 with the
 * verdict in @p check when they differ; 0 when they agree or none is
 * recorded (the acquire records @p mine); -1 when it cannot be read. */
static int owner_read(kl_store_t *store, const char *topic,
                      const kl__store_owner_t *mine,
                      kl__checks_log_result_t *check) {
  kl__store_owner_t recorded;
  kl_err_t err = kl__store_owner(store, topic, &recorded);
  if (err == KL_ENOTFOUND)
    return 0;
  if (err) {
    kl__err(KL_ESTORE, "cannot read the owner of topic %s in the store: %s",
            topic, kl_err_detail());
    return -1;
  }
  return kl__checks_log_owner_differs(&recorded, mine, check);
}

kl_err_t kl__checks_log_owner(rd_kafka_t *reader, kl_store_t *store,
                              const char *topic, int32_t p,
                              const kl__store_owner_t *mine, int64_t committed,
                              uint64_t committed_epoch, int timeout_ms,
                              kl__checks_log_result_t *check) {
  kl_partition_state_t st;
  kl_err_t err = log_read(reader, store, topic, p, timeout_ms, &st, check);
  if (!err &&
      !kl__checks_log_store_unknown(&st, check->low, committed, committed_epoch,
                                    check) &&
      check->verdict == KL__CHECKS_LOG_OK)
    check_last(reader, store, topic, p, check);
  /* After the log's checks, whose verdicts (and fixes) stand for a store
   * whose log is gone; the owner's catches what they cannot see: nothing
   * applied yet (watermark 0), or a foreign log as long as the store's. */
  if (!err && check->verdict == KL__CHECKS_LOG_OK && mine &&
      owner_read(store, topic, mine, check) < 0)
    err = KL_ESTORE;
  return err;
}

void kl__check_owner(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                     const char *group, int timeout_ms, kl__check_t *out) {
  kl__store_owner_t mine, recorded;
  kl_err_t err = kl__store_owner(store, topic, &recorded);
  out->status = KL__CHECK_FAIL;
  if (err && err != KL_ENOTFOUND) {
    snprintf(out->msg, sizeof(out->msg),
             "cannot read the owner of topic %s in the store: %s", topic,
             kl_err_detail());
    return;
  }
  if (kl__checks_kafka_owner(rk, group, timeout_ms, &mine)) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg),
             "cannot tell this cluster's id: %s; the store records %s%s%s%s",
             kl_err_detail(), err ? "no owner of the topic" : "cluster ",
             err ? "" : recorded.cluster, err ? "" : " and group ",
             err ? "" : recorded.group);
    return;
  }
  kl__checks_log_result_t check;
  if (err) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg),
             "the store records no owner of topic %s yet (a store of an "
             "older version, or a topic no worker took): the next worker "
             "records its own, here cluster %s and group %s; make sure that "
             "is the fleet's",
             topic, mine.cluster, mine.group);
  } else if (kl__checks_log_owner_differs(&recorded, &mine, &check)) {
    kl__checks_log_describe(topic, -1, &check, out->msg, sizeof(out->msg));
  } else {
    out->status = KL__CHECK_OK;
    snprintf(out->msg, sizeof(out->msg),
             "the store records Kafka cluster %s and group %s as the owner "
             "of topic %s, the ones given",
             recorded.cluster, recorded.group, topic);
  }
}

/* Reads partition @p p's log and watermark into @p check. @returns the
 * status the check falls to when they cannot be read (msg written), or
 * KL__CHECK_OK. */
static kl__check_status_t
check_one(rd_kafka_t *rk, kl_store_t *store, const char *topic, int32_t p,
          int timeout_ms, kl__checks_log_result_t *check, kl__check_t *out) {
  kl_partition_state_t st;
  kl_err_t err = log_read(rk, store, topic, p, timeout_ms, &st, check);
  if (err) {
    snprintf(out->msg, sizeof(out->msg), "%s", kl_err_detail());
    return err == KL_ESTORE ? KL__CHECK_FAIL : KL__CHECK_WARN;
  }
  if (check->verdict == KL__CHECKS_LOG_OK)
    check_last(rk, store, topic, p, check);
  return KL__CHECK_OK;
}

void kl__check_log(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                   int32_t partitions, int timeout_ms, kl__check_t *out) {
  kl__check_t unread = {KL__CHECK_OK, ""}; /* the last WARN */
  char first[sizeof(out->msg)] = "";
  int bad = 0;
  for (int32_t p = 0; p < partitions; p++) {
    kl__checks_log_result_t check;
    kl__check_status_t s =
        check_one(rk, store, topic, p, timeout_ms, &check, out);
    if (s == KL__CHECK_FAIL) {
      out->status = s;
      return;
    }
    if (s == KL__CHECK_WARN)
      unread = *out;
    else if (check.verdict != KL__CHECKS_LOG_OK && !bad++)
      kl__checks_log_describe(topic, p, &check, first, sizeof(first));
  }
  if (bad) {
    out->status = KL__CHECK_FAIL;
    if (bad == 1)
      memcpy(out->msg, first, sizeof(out->msg));
    else if (snprintf(out->msg, sizeof(out->msg),
                      "%d partitions of topic %s went backwards, lost "
                      "records or hold another log; the first: %s",
                      bad, topic, first) < 0) /* a long message is cut: fine */
      out->msg[0] = '\0';
  } else if (unread.status == KL__CHECK_WARN) {
    *out = unread;
  } else {
    out->status = KL__CHECK_OK;
    snprintf(out->msg, sizeof(out->msg),
             "the logs of topic %s hold the "
             "store's watermarks on all %" PRId32 " partitions: none went "
             "backwards, none lost records before they were applied, none "
             "holds another record where the store applied one",
             topic, partitions);
  }
}
