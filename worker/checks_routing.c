/*
 * The routing and partition-count checks of checks.h, for keylane doctor:
 * the same judgement the worker makes per record (apply.c) and on its
 * timer (worker.c), over a sample or on demand.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker/partitioners.h"
#include "common/kafka_pos.h"
#include "common/partitions.h"
#include "keylane/producer.h"
#include "worker/checks.h"

void kl__check_routing_judge(const char *topic, const kl__routed_t *sample,
                             size_t n, int32_t partitions, kl__check_t *out) {
  size_t keyed = 0, misrouted = 0;
  const kl__routed_t *example = NULL;
  kl__partitioners_t explains = ~0u;
  for (size_t i = 0; i < n; i++) {
    const kl__routed_t *r = &sample[i];
    if (!r->key || !r->key_len)
      continue;
    keyed++;
    if (kl_partition(r->key, r->key_len, partitions) == r->partition)
      continue;
    misrouted++;
    example = example ? example : r;
    explains &= kl__partitioners_explaining(r->key, r->key_len, partitions,
                                            r->partition);
  }
  out->status = KL__CHECK_OK;
  if (!keyed) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg), "topic %s: no keyed record in the "
             "sample of %zu to check the routing of", topic, n);
  } else if (!misrouted) {
    snprintf(out->msg, sizeof(out->msg), "topic %s: all %zu sampled keys "
             "route (murmur2, %" PRId32 " partitions) to the partition they "
             "are on", topic, keyed, partitions);
  } else {
    char fix[600];
    kl__partitioners_explain(explains & ~(1u << KL__PARTITIONER_MURMUR2),
                             fix, sizeof(fix));
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg), "topic %.100s: %zu of %zu sampled "
             "records are on another partition than their key routes to "
             "(murmur2, %" PRId32 " partitions; e.g. one on partition %"
             PRId32 " belongs on %" PRId32 "): their producers do not use "
             "the Java default partitioner; %.380s",
             topic, misrouted, keyed, partitions, example->partition,
             kl_partition(example->key, example->key_len, partitions), fix);
  }
}

void kl__check_partitions(rd_kafka_t *rk, const char *topic, int32_t expected,
                          int timeout_ms, kl__check_t *out) {
  int32_t live = 0;
  if (kl__kafka_partition_count(rk, topic, timeout_ms, &live)) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg), "%s", kl_err_detail());
    return;
  }
  kl__partitions_expect_t expect = {expected ? expected : live, 1, "fleet",
                                    "--partitions"};
  out->status = KL__CHECK_OK;
  if (kl__partitions_check(topic, live, &expect)) {
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg), "%s", kl_err_detail());
  } else {
    snprintf(out->msg, sizeof(out->msg), "topic %s has %" PRId32
             " partitions%s", topic, live,
             expected ? ", as the fleet expects" : "");
  }
}
