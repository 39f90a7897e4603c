/*
 * A partition whose history retention has already cut: librdkafka 2.0.2's
 * mock cluster has no DeleteRecords, but it keeps at most 5 MiB per
 * partition and drops its oldest message sets beyond that, moving the log
 * start offset up, as retention does on a real broker.
 */
#ifndef KEYLANE_TESTS_SUPPORT_HISTORY_H
#define KEYLANE_TESTS_SUPPORT_HISTORY_H

#include <stdint.h>

/*
 * Publishes @p count ledger credits (amount 1, seq 1..count) of key
 * @p key to partition 0 of @p topic, each padded with ~120 KB of random
 * bytes (the ledger ignores the field; random so that compression cannot
 * shrink it): 60 of them exceed the mock's 5 MiB. Aborts on failure.
 * @returns the partition's low watermark afterwards.
 */
int64_t kl_t_publish_truncated(const char *bootstrap, const char *topic,
                               const char *key, int count);

#endif
