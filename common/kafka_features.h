/*
 * librdkafka, today's and tomorrow's: which newer features keylane uses,
 * decided from the version it was built against (RD_KAFKA_VERSION) and
 * the one loaded at run time (rd_kafka_version()). Debian 12 ships 2.0.2,
 * which CI builds and runs with; newer distributions ship 2.3 to 2.16.
 *
 * A configuration property is a string librdkafka reads at run time, so
 * the loaded library alone decides it: a binary built against 2.0.2
 * headers that loads 2.6 may set fetch.queue.backoff.ms, and one built
 * against 2.6 that loads 2.0.2 must not (rd_kafka_conf_set() would refuse
 * the name). A function or constant of the API needs both: the headers to
 * compile the call, and the library to have the symbol.
 *
 *   feature                       | kind     | from
 *   fetch.queue.backoff.ms        | property | 2.2.0
 *   group.protocol=consumer       | property | 2.12.0 (KIP-848 GA)
 *   topic ids (DescribeTopics)    | API      | 2.3.0
 *
 * Not installed.
 */
#ifndef KEYLANE_COMMON_KAFKA_FEATURES_H
#define KEYLANE_COMMON_KAFKA_FEATURES_H

#include <stddef.h>

#include "common/internal.h"

#define KL__RDK_V(major, minor, rev)                                           \
  (((major) << 24) | ((minor) << 16) | ((rev) << 8) | 0xff)
#define KL__RDK_FETCH_QUEUE_BACKOFF KL__RDK_V(2, 2, 0)
#define KL__RDK_CONSUMER_PROTOCOL KL__RDK_V(2, 12, 0)
#define KL__RDK_TOPIC_IDS KL__RDK_V(2, 3, 0)

/** Entries kl__rdk_consumer_defaults() writes at most, the NULL included. */
#define KL__RDK_DEFAULTS_MAX 20

typedef struct kl__rdk_features {
  int built, loaded;       /* the two versions, as rd_kafka_version() */
  int fetch_queue_backoff; /* set fetch.queue.backoff.ms, not the
                              queued.min.messages workaround */
  int consumer_protocol;   /* group.protocol=consumer may be asked for */
  int topic_ids;           /* the topic-id API may be called */
} kl__rdk_features_t;

/** The decision for any two versions (a pure function, for tests). */
kl__rdk_features_t kl__rdk_features(int built, int loaded);

/** The decision for this binary: RD_KAFKA_VERSION and rd_kafka_version(). */
kl__rdk_features_t kl__rdk_features_here(void);

/** Writes "2.0.2" (a pre-release: "2.13.0-RC1") for @p version. */
void kl__rdk_version_str(int version, char *out, size_t size);

/**
 * The consumer's librdkafka properties for @p features: pairs of name and
 * value, NULL-terminated, into @p out (room for KL__RDK_DEFAULTS_MAX), from the
 * group and the timeouts given.
 * @param consumer_protocol  worker.group.protocol=consumer: the group's
 *        session, heartbeat and assignment are the broker's (KIP-848), so
 *        session.timeout.ms, heartbeat.interval.ms and
 *        partition.assignment.strategy are left out (librdkafka refuses
 *        them then).
 * @returns KL_OK; KL_ECONF when @p consumer_protocol is asked of a
 *          librdkafka that lacks it, naming both versions and the fix.
 */
kl_err_t kl__rdk_consumer_defaults(const kl__rdk_features_t *features,
                                   int consumer_protocol, const char *group,
                                   const char *session, const char *heartbeat,
                                   const char **out);

#endif
