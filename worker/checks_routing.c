/*
 * The routing and partition-count checks of checks.h, for keylane doctor:
 * the same judgement the worker makes per record (apply.c) and on its
 * timer (worker.c), over a sample or on demand.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event/partitioners.h"
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
    snprintf(out->msg, sizeof(out->msg),
             "topic %s: no keyed record in the "
             "sample of %zu to check the routing of",
             topic, n);
  } else if (!misrouted) {
    snprintf(out->msg, sizeof(out->msg),
             "topic %s: all %zu sampled keys "
             "route (murmur2, %" PRId32 " partitions) to the partition they "
             "are on",
             topic, keyed, partitions);
  } else {
    char fix[600];
    kl__partitioners_explain(explains & ~(1u << KL__PARTITIONER_MURMUR2), fix,
                             sizeof(fix));
    out->status = KL__CHECK_FAIL;
    snprintf(out->msg, sizeof(out->msg),
             "topic %.100s: %zu of %zu sampled "
             "records are on another partition than their key routes to "
             "(murmur2, %" PRId32 " partitions; e.g. one on partition %" PRId32
             " belongs on %" PRId32 "): their producers do not use "
             "the Java default partitioner; %.380s",
             topic, misrouted, keyed, partitions, example->partition,
             kl_partition(example->key, example->key_len, partitions), fix);
  }
}

/* The keys of a sample, copied out of the records read. */
typedef struct kl_sample {
  kl__routed_t *v;
  size_t n, cap;
} kl_sample_t;

static int sample_take(void *opaque, rd_kafka_message_t *m) {
  kl_sample_t *s = opaque;
  if (s->n == s->cap)
    return KL__READ_STOP;
  kl__routed_t *r = &s->v[s->n];
  void *key = m->key_len ? malloc(m->key_len) : NULL;
  if (m->key_len && !key)
    return KL__READ_STOP; /* judged on what was read so far */
  if (key)
    memcpy(key, m->key, m->key_len);
  *r = (kl__routed_t){key, key ? m->key_len : 0, m->partition};
  s->n++;
  return 0;
}

void kl__check_routing(rd_kafka_t *rk, const char *topic, int32_t partitions,
                       size_t sample, int timeout_ms, volatile int *stop,
                       kl__check_t *out) {
  kl__tp_range_t *ranges = calloc((size_t)partitions, sizeof(*ranges));
  kl_sample_t s = {calloc((size_t)partitions * sample, sizeof(*s.v)), 0,
                   (size_t)partitions * sample};
  const kl__pos_t from = {KL__POS_BEGINNING, 0}, to = {KL__POS_END, 0};
  kl_err_t err = ranges && s.v ? KL_OK : KL_ENOMEM;
  for (int32_t p = 0; ranges && p < partitions; p++)
    ranges[p].partition = p;
  if (!err)
    err = kl__kafka_resolve(rk, topic, ranges, (size_t)partitions, &from, &to,
                            timeout_ms);
  for (int32_t p = 0; !err && p < partitions; p++)
    if (ranges[p].end - ranges[p].start > (int64_t)sample)
      ranges[p].start = ranges[p].end - (int64_t)sample;
  if (!err)
    err = kl__kafka_read(rk, topic, ranges, (size_t)partitions, sample_take, &s,
                         stop);
  if (err) {
    out->status = KL__CHECK_WARN;
    snprintf(out->msg, sizeof(out->msg), "cannot read a sample of topic %s: %s",
             topic, err == KL_ENOMEM ? "out of memory" : kl_err_detail());
  } else {
    kl__check_routing_judge(topic, s.v, s.n, partitions, out);
  }
  for (size_t i = 0; i < s.n; i++)
    free((void *)s.v[i].key);
  free(s.v);
  free(ranges);
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
    snprintf(out->msg, sizeof(out->msg),
             "topic %s has %" PRId32 " partitions%s", topic, live,
             expected ? ", as the fleet expects" : "");
  }
}
