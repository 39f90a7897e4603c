/*
 * A topic's partition count (read with kl__kafka_partition_count(),
 * common/kafka_pos.h) checked against the one the fleet expects: the
 * producer (at its first publish to a topic and on a timer), the worker
 * (at start and on a timer) and `keylane doctor` ask the same question the
 * same way. Changing the count moves keys between
 * owners (kl_partition() depends on it), so a difference is an error that
 * names both counts and the fix. Not installed.
 *
 * Thread safety: pure.
 */
#ifndef KEYLANE_COMMON_PARTITIONS_H
#define KEYLANE_COMMON_PARTITIONS_H

#include <stdint.h>

#include "keylane/error.h"

/** Where the expected count of kl__partitions_check() came from. */
typedef struct kl__partitions_expect {
  int32_t count;       /* the expected count */
  int configured;      /* from @p setting; 0: seen at start */
  const char *who;     /* "worker", "producer": who saw it at start */
  const char *setting; /* "worker.expect.partitions", ... */
} kl__partitions_expect_t;

/**
 * @returns KL_OK when @p live is @p expect->count; else KL_EPARTITIONS
 *          whose detail names @p topic, both counts and the fix ("topic
 *          events has 12 partitions now, 8 when this worker started: ...").
 */
kl_err_t kl__partitions_check(const char *topic, int32_t live,
                              const kl__partitions_expect_t *expect);

#endif
