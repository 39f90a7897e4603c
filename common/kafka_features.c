/* librdkafka feature gating (common/kafka_features.h). */
#include "common/kafka_features.h"

#include <stdio.h>

#include <librdkafka/rdkafka.h>

kl__rdk_features_t kl__rdk_features(int built, int loaded) {
  kl__rdk_features_t f = {built, loaded, 0, 0, 0};
  f.fetch_queue_backoff = loaded >= KL__RDK_FETCH_QUEUE_BACKOFF;
  f.consumer_protocol = loaded >= KL__RDK_CONSUMER_PROTOCOL;
  f.topic_ids = built >= KL__RDK_TOPIC_IDS && loaded >= KL__RDK_TOPIC_IDS;
  return f;
}

kl__rdk_features_t kl__rdk_features_here(void) {
  return kl__rdk_features(RD_KAFKA_VERSION, rd_kafka_version());
}

void kl__rdk_version_str(int version, char *out, size_t size) {
  int pre = version & 0xff;
  snprintf(out, size, pre == 0xff ? "%d.%d.%d" : "%d.%d.%d-RC%d",
           (version >> 24) & 0xff, (version >> 16) & 0xff,
           (version >> 8) & 0xff, pre);
}

kl_err_t kl__rdk_consumer_defaults(const kl__rdk_features_t *features,
                                   int consumer_protocol, const char *group,
                                   const char *session, const char *heartbeat,
                                   const char **out) {
  if (consumer_protocol && !features->consumer_protocol) {
    char loaded[32], want[32];
    kl__rdk_version_str(features->loaded, loaded, sizeof(loaded));
    kl__rdk_version_str(KL__RDK_CONSUMER_PROTOCOL, want, sizeof(want));
    return kl__err(KL_ECONF,
                   "worker.group.protocol=consumer (KIP-848) needs librdkafka "
                   "%s or newer and Apache Kafka 4.0 or newer; this process "
                   "loaded librdkafka %s: use worker.group.protocol=classic "
                   "or install a newer librdkafka",
                   want, loaded);
  }
  size_t n = 0;
  out[n++] = "group.id", out[n++] = group;
  out[n++] = "enable.auto.commit", out[n++] = "false";
  out[n++] = "enable.auto.offset.store", out[n++] = "false";
  out[n++] = "auto.offset.reset", out[n++] = "error"; /* log_guard.h */
  if (consumer_protocol) {
    out[n++] = "group.protocol", out[n++] = "consumer";
  } else {
    out[n++] = "partition.assignment.strategy";
    out[n++] = "cooperative-sticky";
    out[n++] = "session.timeout.ms", out[n++] = session;
    out[n++] = "heartbeat.interval.ms", out[n++] = heartbeat;
  }
  /* librdkafka stops fetching a partition whose queue holds
   * queued.min.messages (100000 by default) and, before 2.2, looks again
   * only about once a second: a worker catching up on a backlog took a
   * burst, worked it off and idled for most of a second. 2.2 made that
   * wait fetch.queue.backoff.ms; older ones get a queue too deep to
   * empty between looks. queued.max.messages.kbytes (64 MiB by default)
   * still bounds the prefetch; kafka.* settings override both. */
  if (features->fetch_queue_backoff) {
    out[n++] = "fetch.queue.backoff.ms", out[n++] = "10";
  } else {
    out[n++] = "queued.min.messages", out[n++] = "1000000";
  }
  out[n] = NULL;
  return KL_OK;
}
