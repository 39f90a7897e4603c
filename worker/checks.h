/*
 * Checks of the environment that keylane's guarantees rest on (docs/design.md,
 * "Assumptions are checks"), each a function the worker runs at
 * start and `keylane doctor` can run on demand. A check says OK, WARN (it
 * could not tell) or FAIL, with a message that names the thing, the values
 * and the fix; what to do about a FAIL is the caller's (the worker refuses
 * to run unless overridden).
 *
 * Not installed. Caveats: the checks block on Kafka for up to their
 * timeout; call them at start-up, not from a poll loop.
 */
#ifndef KEYLANE_WORKER_CHECKS_H
#define KEYLANE_WORKER_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "keylane/store.h"
#include "store/store_internal.h"

typedef enum kl__check_status {
  KL__CHECK_OK = 0,
  KL__CHECK_WARN, /* could not be checked: the message says why */
  KL__CHECK_FAIL, /* the assumption does not hold */
} kl__check_status_t;

typedef struct kl__check {
  kl__check_status_t status;
  char msg[768]; /* what was found, and for WARN and FAIL the fix */
} kl__check_t;

/** @returns "OK", "WARN" or "FAIL". */
const char *kl__check_status_name(kl__check_status_t status);

/**
 * Writes @p ms as the largest unit that divides it ("7d", "36h", "90s",
 * "250ms"), the form store.dedup.retention takes.
 */
void kl__duration_format(int64_t ms, char *buf, size_t size);

/**
 * Judges a topic's retention against the idempotency keys' retention.
 * Every copy of an event (the record in @p topic, its letter in the
 * dead-letter topic) must be gone before its id is swept: an id swept
 * while its event can still be redelivered, replayed or re-published is
 * applied twice. So FAIL when @p dedup_ms is shorter than
 * @p retention_ms, and when the topic keeps records forever
 * (@p retention_ms < 0: retention.ms=-1, or a compacted topic), which no
 * finite dedup retention covers.
 * @param role    "topic" or "dead-letter topic", for the message
 * @param source  the setting the retention came from ("retention.ms=-1",
 *                "cleanup.policy=compact"), for the message
 */
void kl__check_retention_judge(const char *role, const char *topic,
                               int64_t retention_ms, const char *source,
                               int64_t dedup_ms, kl__check_t *out);

/**
 * Reads retention.ms and cleanup.policy of @p topic (Admin API
 * DescribeConfigs) and judges them as kl__check_retention_judge() does.
 * WARN when the cluster cannot answer DescribeConfigs at all (no
 * controller: librdkafka's mock cluster, which the embedded cluster is;
 * it keeps records by size, 5 MiB per partition, never by time); FAIL
 * when it refuses (an ACL without DescribeConfigs on the topic) or does not
 * answer within @p timeout_ms: a check that could not pass is no pass.
 */
void kl__check_retention(rd_kafka_t *rk, const char *role, const char *topic,
                         int64_t dedup_ms, int timeout_ms, kl__check_t *out);

/**
 * Judges a topic's retention against timer.max.delay (@p max_ms). A
 * pending timer lives in the store with its event, so a record deleted
 * while its timer waits changes nothing live; but `keylane store rebuild`
 * finds pending timers in the log, and loses one whose record is gone.
 * So WARN, never FAIL (a worker runs): when @p retention_ms (>= 0) is
 * shorter than @p max_ms, naming both and the fix; when the topic deletes
 * by size too (@p bytes >= 0, retention.bytes), which no time bound
 * covers; else OK (@p retention_ms < 0: kept forever).
 * @param source  the setting the retention came from, for the message
 */
void kl__check_timer_judge(const char *topic, int64_t retention_ms,
                           const char *source, int64_t bytes, int64_t max_ms,
                           kl__check_t *out);

/**
 * Reads @p topic's retention.ms, cleanup.policy and retention.bytes
 * (DescribeConfigs, or the hook of kl__checks_set_topic_config()) and
 * judges them as kl__check_timer_judge() does; WARN when the cluster does
 * not answer (the embedded one cannot).
 */
void kl__check_timer_retention(rd_kafka_t *rk, const char *topic,
                               int64_t max_ms, int timeout_ms,
                               kl__check_t *out);

/**
 * Compares each of @p partitions partitions' epoch in @p store with the
 * highest epoch the consumer group @p group recorded in Kafka with its
 * offsets (common/kafka.h; "kafka.*" of @p conf reach the reader). OK when
 * the store's is at least the group's everywhere; WARN naming the
 * partitions where it is below (a new or rebuilt store: its next owner,
 * worker, replay or rebuild, takes an epoch above the group's, so external
 * resources that kept the old epochs accept it), and when the group's
 * epochs cannot be read; FAIL when the store cannot be read, or when the
 * group also committed an offset above the store's watermark there: a
 * store that never saw that owner, which a worker refuses
 * (kl__checks_log_store_unknown(); the log's start is not read here).
 */
void kl__check_epochs(kl_store_t *store, const kl_conf_t *conf,
                      const char *group, const char *topic, int32_t partitions,
                      int timeout_ms, kl__check_t *out);

/**
 * Judges how durable an acknowledged event of @p topic is. keylane's
 * producers publish with acks=all, which waits for min.insync.replicas
 * copies: FAIL when @p min_isr is above the replication factor @p rf
 * (every publish is refused with NOT_ENOUGH_REPLICAS); WARN when @p rf or
 * @p min_isr is below 2 (an acknowledged event may live on one broker
 * only, and is lost with it), and when @p min_isr is unknown (-1;
 * @p unknown then says why); else OK.
 * @param role  "topic" or "dead-letter topic", for the message
 */
void kl__check_replication_judge(const char *role, const char *topic, int rf,
                                 int min_isr, const char *unknown,
                                 kl__check_t *out);

/**
 * Reads @p topic's replication factor (the fewest replicas of any of its
 * partitions, from the metadata) and min.insync.replicas (Admin API
 * DescribeConfigs; the hook of kl__checks_set_topic_config() answers in
 * tests) and judges them as kl__check_replication_judge() does. A cluster
 * that cannot answer DescribeConfigs (the embedded one) or refuses it
 * leaves min.insync.replicas unknown: WARN, "cannot tell".
 */
void kl__check_replication(rd_kafka_t *rk, const char *role, const char *topic,
                           int timeout_ms, kl__check_t *out);

/**
 * This side's owner of a topic, as the store records it (kl__store_owner_t):
 * the id of the Kafka cluster @p rk is connected to (rd_kafka_clusterid(),
 * waiting up to @p timeout_ms for the metadata) and @p group.
 * @returns KL_OK; KL_EKAFKA_TRANSIENT when the cluster did not say its id;
 *          KL_EINVAL for an empty or too long group.
 */
kl_err_t kl__checks_kafka_owner(rd_kafka_t *rk, const char *group,
                                int timeout_ms, kl__store_owner_t *owner);

/**
 * For the commands that take partitions by hand (`keylane replay`,
 * `replay --from-dlq`, the console's redrive, `store rebuild`): refuses a
 * store whose recorded owner of @p topic is of another Kafka cluster than
 * @p rk's, and with @p group (a rebuild, which records it) of another
 * group too. Such a command would apply a foreign log and fence the
 * fleet. @p who names the command in the message ("replay"). A store that
 * records no owner passes; against one that does, a cluster that does not say
 * its id within @p timeout_ms is refused too (KL_ECONF).
 * @returns KL_OK, or KL_ECONF with both owners and the fix.
 */
kl_err_t kl__checks_hand_owner(rd_kafka_t *rk, kl_store_t *store,
                               const char *topic, const char *group,
                               int timeout_ms, const char *who);

/**
 * For `keylane doctor`: the owner @p store recorded for @p topic against
 * this side's (@p rk's cluster, @p group). OK when they agree; WARN when
 * none is recorded (the next worker records this side's) or the cluster
 * id cannot be read; FAIL when they differ (a worker would stop every
 * partition: cluster_mismatch or group_mismatch, with the fix) or the
 * store cannot be read.
 */
void kl__check_owner(rd_kafka_t *rk, kl_store_t *store, const char *topic,
                     const char *group, int timeout_ms, kl__check_t *out);

/* ---- routing and the partition count (checks_routing.c) ---- */

/** One record of a sample: its key (borrowed) and the partition it is on. */
typedef struct kl__routed {
  const void *key;
  size_t key_len;
  int32_t partition;
} kl__routed_t;

/**
 * Judges a sample of @p topic's records (keylane doctor: the last ones of
 * each partition) against a topic of @p partitions partitions: OK when
 * every key routes (murmur2) to the partition it is on; FAIL saying how
 * many do not, one of them, and which partitioner explains them all (what
 * kl__partitioners_explaining() leaves over the misrouted ones,
 * event/partitioners.h) with the client setting to fix. Records without
 * a key are not judged; WARN when no record had one.
 */
void kl__check_routing_judge(const char *topic, const kl__routed_t *sample,
                             size_t n, int32_t partitions, kl__check_t *out);

/**
 * Reads the last @p sample records of each of the @p partitions partitions
 * of @p topic with @p rk, a reader (kl__kafka_reader_new(); its assignment
 * is changed), and judges them as kl__check_routing_judge() does. WARN
 * when the offsets cannot be read within @p timeout_ms. Holds the sampled
 * keys (not the values) in memory; stops early when *@p stop is set.
 */
void kl__check_routing(rd_kafka_t *rk, const char *topic, int32_t partitions,
                       size_t sample, int timeout_ms, volatile int *stop,
                       kl__check_t *out);

/**
 * Reads @p topic's partition count and compares it with @p expected (the
 * fleet's --partitions; 0: none given, OK with the count). FAIL with
 * kl__partitions_check()'s message (common/partitions.h); WARN when the
 * count cannot be read within @p timeout_ms.
 */
void kl__check_partitions(rd_kafka_t *rk, const char *topic, int32_t expected,
                          int timeout_ms, kl__check_t *out);

/* ---- the store (checks_store.c) ---- */

/**
 * The store's layout version (kl__store_version()) against this build's:
 * OK when equal and, for PostgreSQL, every column keylane needs is there;
 * FAIL when the store cannot be read or a column is missing. (A store of
 * another version does not open at all: its open error is the check's FAIL.)
 * @param location  the store's directory or URI, for the message
 */
void kl__check_store_version(kl_store_t *store, const char *location,
                             kl__check_t *out);

/**
 * The retention the last sweep that removed @p topic's ids judged them by
 * (kl__store_sweeps()) against @p dedup_ms, the fleet's
 * store.dedup.retention: WARN when it is shorter (a worker of the topic
 * runs with another retention, and removes its ids sooner than the fleet
 * expects); OK otherwise. Each topic's sweep removes its own ids alone,
 * so other topics' retentions are only named, never judged.
 * @returns 0 with nothing written when no sweep of the store has removed
 *          an id yet; else 1, with @p out.
 */
int kl__check_sweeps(kl_store_t *store, const char *topic, int64_t dedup_ms,
                     kl__check_t *out);

/** Above this skew between this host's clock and the PostgreSQL server's,
 *  kl__check_clock() warns: NTP keeps healthy hosts within milliseconds,
 *  so a second means a host without time synchronisation. */
#define KL__CLOCK_SKEW_WARN_MS 1000

/**
 * Measures the skew between this host's clock (kl__store_now_ms(): the
 * test clock when one is set) and the PostgreSQL server's
 * (clock_timestamp()), net of the query's round trip, and WARNs above
 * @p bound_ms. The store stamps and sweeps idempotency keys by the
 * server's clock alone, so the skew does not endanger them; it skews what
 * hosts stamp themselves (an event's ts, logs, `@-2h` positions).
 * @returns 0 with nothing written for a store without a server clock
 *          (LMDB: this host's clock is the store's); else 1, with @p out
 *          (WARN also when the server cannot be asked).
 */
int kl__check_clock(kl_store_t *store, int64_t bound_ms, kl__check_t *out);

/**
 * Reads @p topic's max.message.bytes (DescribeConfigs), the largest record
 * batch its brokers take.
 * @returns it, or 0 when the cluster does not tell (no controller, as on
 *          the embedded cluster; refused; no answer within @p timeout_ms).
 */
int64_t kl__check_message_max(rd_kafka_t *rk, const char *topic,
                              int timeout_ms);

/**
 * Test hook: answers the reads of topic configurations instead of the
 * cluster. @p fn returns the value of configuration @p name of @p topic
 * (NULL: the broker's default: 7d, delete, no size bound, one in-sync
 * replica). NULL restores the cluster. Process
 * wide.
 */
typedef const char *(kl__topic_config_fn)(const char *topic, const char *name);
void kl__checks_set_topic_config(kl__topic_config_fn *fn);

#endif
