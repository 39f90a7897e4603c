/*
 * Misrouted records: a record whose key routes (murmur2, the partition
 * count the fleet expects) to another partition than the one it arrived
 * on was published by a client with another partitioner, and the owner of
 * its key is another worker: applying it here would give the key two
 * writers. apply.c refuses it once it decoded (one that does not is a
 * decode letter wherever it arrived); here the lane dead-letters it
 * (worker.misrouted=dlq) or re-publishes it to its key's partition
 * (forward), in either case only passing it once Kafka acknowledged the
 * write, and says, at most every 10 s, which partitioner explains it and
 * the client setting that fixes it.
 *
 * Runs with kl__lanes_t.mu held, like the rest of a lane's outcomes.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event/partitioners.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "worker/lanes_internal.h"

#define KL_COMP "worker"
#define KL_MISROUTED_WARN_NS (10LL * 1000000000)

void kl__lanes_route(kl__lanes_t *lanes, int32_t partitions,
                     const char *policy) {
  pthread_mutex_lock(&lanes->mu);
  lanes->applier.partitions = strcmp(policy, "apply") == 0 ? 0 : partitions;
  lanes->forward_misrouted = strcmp(policy, "forward") == 0;
  pthread_mutex_unlock(&lanes->mu);
}

static void misrouted_warn(kl__lanes_t *lanes, const kl__lane_t *lane,
                           const kl__slot_t *slot) {
  int64_t now = kl__mono_ns();
  if (lanes->misrouted_warned_ns &&
      now - lanes->misrouted_warned_ns < KL_MISROUTED_WARN_NS) {
    lanes->misrouted_unwarned++;
    return;
  }
  const rd_kafka_message_t *m = slot->msg;
  char key[KL__ESCAPED_SIZE(64)], fix[1024];
  kl__escape(key, sizeof(key), m->key, m->key_len);
  kl__partitioners_explain(
      kl__partitioners_explaining(m->key, m->key_len, lanes->applier.partitions,
                                  lane->partition),
      fix, sizeof(fix));
  char more[64] = "";
  if (lanes->misrouted_unwarned)
    snprintf(more, sizeof(more), "; %" PRIu64 " more since the last warning",
             lanes->misrouted_unwarned);
  KL_LOG_W(KL_COMP,
           "misrouted record partition=%" PRId32 " offset=%" PRId64
           ": key \"%s\" routes to partition %" PRId32 " of %" PRId32
           " (murmur2), whose owner is another worker; %s (worker.misrouted="
           "%s%s). Its producer does not use the Java default partitioner; "
           "what put it there: %s",
           lane->partition, slot->offset, key, slot->expected_partition,
           lanes->applier.partitions,
           slot->forward ? "re-published to its key's partition"
                         : "dead-lettered with reason misrouted",
           slot->forward ? "forward" : "dlq", more, fix);
  lanes->misrouted_warned_ns = now;
  lanes->misrouted_unwarned = 0;
}

void kl__lane_misrouted(kl__lanes_t *lanes, kl__lane_t *lane, kl__slot_t *slot,
                        const kl__run_t *run) {
  int64_t now = kl__now_ms();
  if (!slot->first_failure_ms)
    slot->first_failure_ms = now;
  slot->last_failure_ms = now;
  free(slot->why);
  slot->why = strdup(run->why ? run->why : "misrouted");
  slot->expected_partition = run->expected_partition;
  slot->forward = lanes->forward_misrouted;
  lane->misrouted++;
  lanes->misrouted_total++;
  misrouted_warn(lanes, lane, slot);
  kl__lane_dead_letter(lanes, lane, slot, KL__DLQ_MISROUTED, run->why);
}

size_t kl__lanes_misrouted(kl__lanes_t *lanes, uint64_t *by_partition,
                           size_t max) {
  pthread_mutex_lock(&lanes->mu);
  size_t n = lanes->count < 0 ? 0 : (size_t)lanes->count;
  if (n > max)
    n = max;
  for (size_t p = 0; p < n; p++)
    by_partition[p] = lanes->lanes[p] ? lanes->lanes[p]->misrouted : 0;
  pthread_mutex_unlock(&lanes->mu);
  return n;
}

void kl__lanes_stop_taking(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (lane && lane->state != KL__LANE_FREE)
      kl__lane_pause(lanes, lane, KL__PAUSE_TOPIC);
  }
  pthread_mutex_unlock(&lanes->mu);
}
