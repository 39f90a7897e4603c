/*
 * Positions in a partition, as tools take them on the command line, and
 * their resolution to offsets: `keylane replay`, `keylane store rebuild`
 * and `keylane inspect` read ranges of partitions with these.
 *
 *   N            the offset N
 *   beginning    the earliest retained offset (also: earliest)
 *   end          the high watermark when the tool started (also: latest)
 *   watermark    the store's watermark (replay only: the next offset the
 *                store would apply)
 *   @MS          the first offset whose timestamp is >= MS (ms since the
 *                Unix epoch), by rd_kafka_offsets_for_times()
 *   @YYYY-MM-DDTHH:MM:SSZ   the same, in UTC
 *   @-DURATION   the same, DURATION ago: @-90s, @-15m, @-2h, @-7d
 *
 * A time after the last record resolves to the high watermark (Kafka
 * answers -1 for it). Ranges are half-open: [start, end).
 *
 * Internal, not installed. Thread safe.
 */
#ifndef KEYLANE_COMMON_KAFKA_POS_H
#define KEYLANE_COMMON_KAFKA_POS_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "keylane/conf.h"
#include "keylane/error.h"

typedef enum kl__pos_kind {
  KL__POS_OFFSET = 0,
  KL__POS_BEGINNING,
  KL__POS_END,
  KL__POS_WATERMARK,
  KL__POS_TIME, /* value: ms since the Unix epoch */
} kl__pos_kind_t;

typedef struct kl__pos {
  kl__pos_kind_t kind;
  int64_t value;
} kl__pos_t;

/**
 * Parses @p text (see above); relative times count back from @p now_ms.
 * @returns KL_OK, or KL_EINVAL with a detail that names the text and the
 *          accepted forms.
 */
kl_err_t kl__pos_parse(const char *text, int64_t now_ms, kl__pos_t *pos);

/** Writes @p pos as the user would type it ("1200", "@1714000000000"). */
const char *kl__pos_format(const kl__pos_t *pos, char *buf, size_t size);

/**
 * Parses a partition list "0,2,5-7" or "all" for a topic of @p partitions.
 * @param out    receives a malloc()ed, sorted, duplicate-free array the
 *               caller frees; untouched on failure.
 * @returns KL_OK; KL_EINVAL naming the bad part (or a partition the topic
 *          does not have).
 */
kl_err_t kl__pos_partitions(const char *text, int32_t partitions, int32_t **out,
                            size_t *count);

/** One partition's range, resolved. */
typedef struct kl__tp_range {
  int32_t partition;
  int64_t low, high; /* retained log when resolved: [low, high) */
  int64_t start;     /* first offset to read; -1 for KL__POS_WATERMARK */
  int64_t end;       /* offset to stop before, <= high */
} kl__tp_range_t;

/**
 * Reads the partition count of @p topic (kl__kafka_metadata()).
 * @returns KL_OK; KL_ENOTFOUND when the topic does not exist;
 *          KL_EKAFKA_TRANSIENT when the metadata cannot be read or the topic
 *          has no leader yet; KL_EKAFKA when Kafka refused (not authorized,
 *          say), which waiting does not cure.
 */
kl_err_t kl__kafka_partition_count(rd_kafka_t *rk, const char *topic,
                                   int timeout_ms, int32_t *count);

/* How long a worker waits, at start, for a topic the cluster does not
 * know yet: one just created on a cluster of several brokers reaches
 * their metadata a moment later, and a fleet started right after its
 * topics would otherwise stop for good. */
#define KL__TOPIC_NEW_GRACE_MS 10000

/** kl__kafka_partition_count(), but a topic not found is asked again every
 *  250 ms for KL__TOPIC_NEW_GRACE_MS before KL_ENOTFOUND is returned. */
kl_err_t kl__kafka_partition_count_new(rd_kafka_t *rk, const char *topic,
                                       int timeout_ms, int32_t *count);

/**
 * Fills low and high of each of @p ranges (whose partition is set), then
 * start and end from @p from and @p to: offsets are clamped into
 * [low, high], times are looked up. The caller resolves
 * KL__POS_WATERMARK starts itself.
 * @returns KL_OK; KL_EINVAL for `--to watermark`; KL_EKAFKA_TRANSIENT when
 *          the broker does not answer, with the partition in the detail.
 */
kl_err_t kl__kafka_resolve(rd_kafka_t *rk, const char *topic,
                           kl__tp_range_t *ranges, size_t count,
                           const kl__pos_t *from, const kl__pos_t *to,
                           int timeout_ms);

/**
 * Creates a consumer for reading ranges by hand: assign() only, so it
 * never joins a group (librdkafka polls through a group handle, so it gets
 * the id @p client_id, which it never joins), no commits, partition EOF
 * events, and @p reset as auto.offset.reset ("error": a start that
 * retention deleted fails instead of skipping). "kafka.*" keys of @p conf
 * reach it.
 * @returns KL_OK and *out (rd_kafka_destroy() it), or KL_ECONF/KL_EKAFKA.
 */
kl_err_t kl__kafka_reader_new(const kl_conf_t *conf, const char *client_id,
                              const char *reset, rd_kafka_t **out);

/* What a kl__kafka_read_fn returns: flags. */
#define KL__READ_KEEP 1 /* the callback took the message: not destroyed */
#define KL__READ_STOP 2 /* stop reading */

/** Called for each record of a range, in offset order per partition. */
typedef int(kl__kafka_read_fn)(void *opaque, rd_kafka_message_t *m);

/**
 * Reads every record of @p ranges ([start, end) each) with @p rk, a
 * reader, calling @p cb for each, until every range is read, @p cb says
 * stop, or *@p stop (may be NULL) is set. Consume errors other than the
 * end of a partition are logged and skipped.
 * @returns KL_OK; KL_EKAFKA when the partitions cannot be assigned.
 */
kl_err_t kl__kafka_read(rd_kafka_t *rk, const char *topic,
                        kl__tp_range_t *ranges, size_t count,
                        kl__kafka_read_fn *cb, void *opaque,
                        volatile int *stop);

#endif
