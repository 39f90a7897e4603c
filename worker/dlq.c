/*
 * Dead letters: the original record, unchanged, plus keylane.dlq.* headers,
 * on an idempotent acks=all producer. The lane keeps the record until the
 * ack, so a failed delivery is simply produced again from it.
 */
#include "worker/dlq.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "common/log.h"
#include "keylane/event.h"
#include "store/store_internal.h"

#define KL_COMP "dlq"

struct kl__dlq {
  rd_kafka_t *rk;
  kl__dlq_ack_fn *ack;
  void *opaque;
  char topic[];
};

const char *kl__dlq_reason_name(kl__dlq_reason_t reason) {
  switch (reason) {
  case KL__DLQ_DECODE:
    return "decode";
  case KL__DLQ_HANDLER_FAIL:
    return "handler_fail";
  case KL__DLQ_MAX_ATTEMPTS:
    return "max_attempts";
  case KL__DLQ_MISROUTED:
    return "misrouted";
  case KL__DLQ_OUTBOX:
    return "outbox";
  case KL__DLQ_RESERVED_ID:
    return "reserved_id";
  }
  return "unknown";
}

/* A letter Kafka refused for what it is: producing it again cannot
 * succeed. Every other failure (timeouts, a lost leader, a missing topic,
 * no authorization) is retried: a letter must not be lost, and those end
 * when the cluster or the operator fixes them. */
static kl_err_t dlq_err(rd_kafka_resp_err_t kerr) {
  if (!kerr)
    return KL_OK;
  return kl__kafka_record_refused(kerr) ? KL_EKAFKA : KL_EKAFKA_TRANSIENT;
}

static void dlq_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  (void)rk;
  kl__dlq_t *dlq = opaque;
  kl__dlq_ref_t *ref = m->_private;
  if (ref && dlq->ack)
    dlq->ack(dlq->opaque, ref, dlq_err(m->err),
             m->err ? rd_kafka_err2str(m->err) : "");
  free(ref);
}

/* The worker's kafka.* settings are the consumer's: this producer says it
 * ignores the consumer-only ones, which is no news. */
static void dlq_log(const rd_kafka_t *rk, int level, const char *fac,
                    const char *buf) {
  if (strcmp(fac, "CONFWARN") != 0)
    kl__kafka_log(rk, level, fac, buf);
}

kl_err_t kl__dlq_new(const kl_conf_t *conf, const char *topic,
                     kl__dlq_ack_fn *ack, void *opaque, kl__dlq_t **out) {
  const char *name = kl_conf_get(conf, "worker.dlq.topic");
  char fallback[300];
  if (!name || !*name) {
    snprintf(fallback, sizeof(fallback), "%s.dlq", topic);
    name = fallback;
  }
  kl__dlq_t *dlq = calloc(1, sizeof(*dlq) + strlen(name) + 1);
  if (!dlq)
    return KL_ENOMEM;
  strcpy(dlq->topic, name);
  dlq->ack = ack;
  dlq->opaque = opaque;
  /* A dead letter must survive a broker loss like any event: idempotent,
   * acks=all. No topic is created by producing: a missing dead-letter
   * topic is an operator's decision, reported at start. */
  char max[16];
  snprintf(max, sizeof(max), "%d", KL_MESSAGE_MAX); /* a broker's default */
  const char *const defaults[] = {"enable.idempotence",
                                  "true",
                                  "acks",
                                  "all",
                                  "partitioner",
                                  "murmur2_random",
                                  "linger.ms",
                                  "5",
                                  "allow.auto.create.topics",
                                  "false",
                                  "message.max.bytes",
                                  max,
                                  NULL};
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  kl_err_t err = kl__kafka_conf_apply(kconf, conf, defaults);
  if (err) {
    rd_kafka_conf_destroy(kconf);
    free(dlq);
    return err;
  }
  rd_kafka_conf_set_opaque(kconf, dlq);
  rd_kafka_conf_set_dr_msg_cb(kconf, dlq_dr);
  rd_kafka_conf_set_log_cb(kconf, dlq_log);
  char errstr[512];
  dlq->rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, errstr, sizeof(errstr));
  if (!dlq->rk) {
    rd_kafka_conf_destroy(kconf);
    free(dlq);
    return kl__err(KL_EKAFKA, "cannot create the dead-letter producer: %s",
                   errstr);
  }
  *out = dlq;
  return KL_OK;
}

void kl__dlq_set_opaque(kl__dlq_t *dlq, void *opaque) {
  dlq->opaque = opaque;
}

void kl__dlq_destroy(kl__dlq_t *dlq) {
  if (!dlq)
    return;
  /* Letters still in flight belong to lanes that were released: their
   * records are re-consumed by the next owner and written again. */
  dlq->ack = NULL; /* the lanes may be gone already */
  rd_kafka_flush(dlq->rk, 2000);
  rd_kafka_purge(dlq->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  rd_kafka_poll(dlq->rk, 0);
  rd_kafka_destroy(dlq->rk);
  free(dlq);
}

const char *kl__dlq_topic(const kl__dlq_t *dlq) {
  return dlq->topic;
}

kl_err_t kl__dlq_check(kl__dlq_t *dlq, const char *source_topic) {
  int32_t count = 0;
  kl_err_t err =
      kl__kafka_partition_count_new(dlq->rk, dlq->topic, 10000, &count);
  if (err != KL_ENOTFOUND)
    return err;
  return kl__err(KL_ENOTFOUND,
                 "dead-letter topic %s does not exist: create topic %s "
                 "(e.g. kafka-topics.sh --create --topic %s, with the "
                 "retention of %s or longer), or name another with "
                 "--dlq-topic",
                 dlq->topic, dlq->topic, dlq->topic, source_topic);
}

static int hdr_add(rd_kafka_headers_t *h, const char *name, const char *value) {
  return rd_kafka_header_add(h, name, -1, value, -1) != 0;
}

static int hdr_add_i64(rd_kafka_headers_t *h, const char *name, int64_t value) {
  char buf[24];
  snprintf(buf, sizeof(buf), "%" PRId64, value);
  return hdr_add(h, name, buf);
}

/* The original headers (when the record had any), then ours. */
static rd_kafka_headers_t *dlq_headers(const char *source_topic,
                                       const kl__dlq_letter_t *l) {
  rd_kafka_headers_t *orig = NULL;
  rd_kafka_headers_t *h;
  /* rd_kafka_message_headers() parses lazily into the message; it takes
   * a non-const message, and only the poll thread touches it here. */
  if (!l->destination &&
      rd_kafka_message_headers((rd_kafka_message_t *)l->msg, &orig) == 0 &&
      orig)
    h = rd_kafka_headers_copy(orig);
  else
    h = rd_kafka_headers_new(12);
  int bad =
      hdr_add(h, "keylane.dlq.reason", kl__dlq_reason_name(l->reason)) |
      hdr_add(h, "keylane.dlq.error", l->error ? l->error : "") |
      hdr_add_i64(h, "keylane.dlq.attempts", l->attempts) |
      hdr_add(h, "keylane.dlq.topic", source_topic) |
      hdr_add_i64(h, "keylane.dlq.partition", l->msg->partition) |
      hdr_add_i64(h, "keylane.dlq.offset", l->msg->offset) |
      hdr_add_i64(h, "keylane.dlq.first_failure_ms", l->first_failure_ms) |
      hdr_add_i64(h, "keylane.dlq.last_failure_ms", l->last_failure_ms);
  if (l->expected_partition >= 0)
    bad |=
        hdr_add_i64(h, "keylane.dlq.expected_partition", l->expected_partition);
  if (l->destination)
    bad |= hdr_add(h, "keylane.dlq.destination", l->destination);
  if (bad) {
    rd_kafka_headers_destroy(h);
    return NULL;
  }
  return h;
}

/* The record's headers without keylane.dlq.* (a redriven letter's), plus
 * where a forward came from, and for a redriven delayed event
 * (@p letter_key not NULL) the redrive's. */
static rd_kafka_headers_t *forward_headers(const rd_kafka_message_t *m,
                                           const char *letter_key) {
  rd_kafka_headers_t *orig = NULL;
  rd_kafka_headers_t *h = rd_kafka_headers_new(8);
  if (rd_kafka_message_headers((rd_kafka_message_t *)m, &orig) == 0 && orig) {
    const char *name;
    const void *value;
    size_t size;
    for (size_t i = 0; !rd_kafka_header_get_all(orig, i, &name, &value, &size);
         i++)
      if (strncmp(name, "keylane.dlq.", 12) != 0)
        rd_kafka_header_add(h, name, -1, value, (ssize_t)size);
  }
  if (hdr_add_i64(h, "keylane.forward.partition", m->partition) |
      hdr_add_i64(h, "keylane.forward.offset", m->offset) |
      (letter_key && (hdr_add_i64(h, KL__REDRIVE_HEADER, m->offset) |
                      hdr_add(h, KL__REDRIVE_LETTER_HEADER, letter_key)))) {
    rd_kafka_headers_destroy(h);
    return NULL;
  }
  return h;
}

/* Produces @p m's key and value, whole, to @p topic (@p partition, or UA)
 * with @p h, which it takes over, and @p ref's copy as the ack's opaque. */
static kl_err_t dlq_produce(kl__dlq_t *dlq, const char *topic,
                            int32_t partition, const rd_kafka_message_t *m,
                            rd_kafka_headers_t *h, int64_t timestamp,
                            const kl__dlq_ref_t *ref) {
  kl__dlq_ref_t *copy = h ? malloc(sizeof(*copy)) : NULL;
  if (!copy) {
    if (h)
      rd_kafka_headers_destroy(h);
    return kl__err(KL_ENOMEM, "record to %s: out of memory", topic);
  }
  *copy = *ref;
  rd_kafka_resp_err_t kerr = rd_kafka_producev(
      dlq->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
      RD_KAFKA_V_KEY(m->key, m->key_len), RD_KAFKA_V_VALUE(m->payload, m->len),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h),
      RD_KAFKA_V_TIMESTAMP(timestamp), RD_KAFKA_V_OPAQUE(copy), RD_KAFKA_V_END);
  if (kerr) {
    rd_kafka_headers_destroy(h); /* not taken over on failure */
    free(copy);
    return kl__err(dlq_err(kerr), "record to %s: %s", topic,
                   rd_kafka_err2str(kerr));
  }
  return KL_OK;
}

kl_err_t kl__dlq_timer(kl__dlq_t *dlq, const char *topic, int32_t partition,
                       const void *key, size_t key_len, const void *env,
                       size_t env_len, int64_t offset) {
  rd_kafka_headers_t *h = rd_kafka_headers_new(1);
  if (hdr_add_i64(h, KL__TIMER_HEADER, offset)) {
    rd_kafka_headers_destroy(h);
    h = NULL;
  }
  rd_kafka_message_t m = {.partition = partition,
                          .key = (void *)key,
                          .key_len = key_len,
                          .payload = (void *)env,
                          .len = env_len,
                          .offset = offset};
  kl__dlq_ref_t ref = {partition, offset, KL__DLQ_TIMER_GEN};
  return dlq_produce(dlq, topic, partition, &m, h, kl__store_now_ms(), &ref);
}

kl_err_t kl__dlq_forward(kl__dlq_t *dlq, const char *topic, int32_t partition,
                         const rd_kafka_message_t *msg,
                         const kl__dlq_ref_t *ref) {
  return dlq_produce(dlq, topic, partition, msg, forward_headers(msg, NULL), 0,
                     ref);
}

kl_err_t kl__dlq_redrive(kl__dlq_t *dlq, const char *topic, int32_t partition,
                         const rd_kafka_message_t *msg, const char *letter_key,
                         const kl__dlq_ref_t *ref) {
  /* stamped by the store's clock, as a firing record: its owner judges
   * the wait from it, and so does a rebuild */
  return dlq_produce(dlq, topic, partition, msg,
                     forward_headers(msg, letter_key), kl__store_now_ms(), ref);
}

kl_err_t kl__dlq_send(kl__dlq_t *dlq, const char *source_topic,
                      const kl__dlq_letter_t *letter,
                      const kl__dlq_ref_t *ref) {
  if (letter->forward)
    return kl__dlq_forward(dlq, source_topic, letter->expected_partition,
                           letter->msg, ref);
  return dlq_produce(dlq, dlq->topic, RD_KAFKA_PARTITION_UA, letter->msg,
                     dlq_headers(source_topic, letter), 0, ref);
}

void kl__dlq_poll(kl__dlq_t *dlq, int timeout_ms) {
  rd_kafka_poll(dlq->rk, timeout_ms);
}

kl_err_t kl__letter_done_put(kl_txn_t *txn, const char *letter_key,
                             size_t letter_key_len, const kl_event_t *event) {
  char sid[KL__SID_MAX];
  size_t n =
      kl__sid_encode(event->key, event->key_len, event->id, event->id_len, sid);
  return kl_txn_put(txn, letter_key, letter_key_len, sid, n);
}

bool kl__letter_done_by(const void *v, size_t len, const void *key,
                        size_t key_len, const char *id, size_t id_len) {
  if (len == 1 && *(const char *)v == '1') /* before it named the event */
    return true;
  char sid[KL__SID_MAX];
  size_t n = kl__sid_encode(key, key_len, id, id_len, sid);
  return len == n && memcmp(v, sid, n) == 0;
}
