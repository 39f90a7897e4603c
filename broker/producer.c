/*
 * The producer: an idempotent librdkafka producer (acks=all) that routes
 * every event itself with kl_partition(), so that the partition, and the
 * worker that owns the key, never depend on librdkafka's partitioner.
 *
 * Per event, the envelope is written into a buffer on the stack
 * (kl__envelope_write(): the bytes of kl_event_encode() without its malloc
 * or msgpack-c's packer) and produced with RD_KAFKA_MSG_F_COPY: librdkafka
 * allocates for every message anyway, and copying the ~170 bytes into
 * that allocation costs less on the publishing thread than a heap buffer
 * of ours for it to free (keylane-bench produce measures it). A missing id
 * and ts come from one clock read.
 *
 * A message owns nothing of ours: its msg_opaque is the caller's opaque,
 * and the delivery report reads the event's id back from the payload. So
 * a report that never comes leaks nothing, and no heap chunk lives until
 * the report (with 100,000 events in flight, each would be a cache miss
 * when freed). The report reads the id where the encoder writes it,
 * checked byte by byte (producer_id_peek()), and decodes the envelope only
 * when the bytes do not match.
 *
 * Every function here runs on the caller's thread (the one that uses the
 * producer), including the delivery and error callbacks, which librdkafka
 * serves from rd_kafka_poll()/rd_kafka_flush(); except the watch thread,
 * which reads the partition count of every topic in use every
 * producer.partitions.check.ms (one metadata request for all of them) and
 * stores it in the topic's atomic `live`. A publish compares that with the
 * count the topic had at its first publish (or producer.expect.partitions)
 * and refuses on a difference: keys would move between owners. The
 * publishing thread pays one relaxed atomic load for it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "event/envelope.h"
#include "broker/producer_internal.h"
#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/partitions.h"
#include "common/strbuf.h"
#include "keylane/producer.h"

/* How long the first publish to a topic waits for its partition count. */
#define KL_METADATA_TIMEOUT_MS 10000
/* How long the watch thread waits for the counts, each time. */
#define KL_WATCH_TIMEOUT_MS 5000
/* Envelopes up to this size are encoded on the stack, larger ones on the
 * heap: 1 KiB holds a 100-byte payload with room for headers. */
#define KL_ENVELOPE_STACK 1024

typedef struct kl_topic {
  char *name;
  rd_kafka_topic_t *rkt;
  int32_t partitions; /* routed by: the count at the first publish */
  kl__partitions_expect_t expect;
  _Atomic int32_t live; /* as the watch thread last read it */
  int reported;         /* the watch thread logged the change */
} kl_topic_t;

struct kl_producer {
  rd_kafka_t *rk;
  kl_delivery_cb_t *cb;
  void *cb_opaque;
  int64_t inflight; /* only touched on the producer's thread */
  int64_t inflight_max;
  int64_t enqueue_timeout_ms;
  int32_t expect_partitions;
  int follow_ups;      /* producer.follow_ups: ids beginning with '~' allowed */
  kl_topic_t **topics; /* each stays where it is: the watch thread's too */
  size_t topic_cnt;    /* written with mu held, on the caller's thread */
  size_t topic_cap;
  pthread_mutex_t mu;  /* topics and topic_cnt against the watch thread */
  pthread_cond_t wake; /* the watch thread's timer; stopping */
  pthread_t watch;
  int watching, stopping;
  int64_t check_ms;
  int64_t timer_max_ms; /* timer.max.delay */
  kl_topic_t *last;     /* most publishes go to the topic of the previous one */
  kl_decoder_t *decoder; /* reads ids back in delivery reports */
};

static kl_err_t watch_start(kl_producer_t *producer);

/* ---- callbacks, served on the producer's thread ---- */

/* Where kl_event_encode() puts the id: {"v": 1, "id": <str>, ...}. A
 * shortcut for the delivery report, checked byte by byte; anything else
 * (another encoder version) takes the decoder. */
static int producer_id_peek(const uint8_t *p, size_t len, const char **id,
                            size_t *id_len) {
  static const uint8_t head[] = {0xa1, 'v', 0x01, 0xa2, 'i', 'd'};
  if (len < 9 || (p[0] != 0x85 && p[0] != 0x86) ||
      memcmp(p + 1, head, sizeof(head)) != 0)
    return -1;
  size_t off = p[7] >= 0xa1 && p[7] <= 0xbf ? 8 : p[7] == 0xd9 ? 9 : 0;
  size_t n = off == 8 ? (size_t)(p[7] & 0x1f) : off == 9 ? p[8] : 0;
  if (off == 0 || n > KL_ID_MAX || off + n > len)
    return -1;
  *id = (const char *)p + off;
  *id_len = n;
  return 0;
}

/* The id of the event in a message we produced, copied out to be NUL
 * terminated. */
static size_t producer_dr_id(kl_producer_t *producer,
                             const rd_kafka_message_t *msg,
                             char id[KL_ID_MAX + 1]) {
  kl_event_t ev = {0};
  if (producer_id_peek(msg->payload, msg->len, &ev.id, &ev.id_len) != 0 &&
      kl_event_decode(producer->decoder, msg->key, msg->key_len, msg->payload,
                      msg->len, &ev) != KL_OK)
    ev.id_len = 0;
  if (ev.id_len)
    memcpy(id, ev.id, ev.id_len);
  id[ev.id_len] = '\0';
  return ev.id_len;
}

static void producer_dr(rd_kafka_t *rk, const rd_kafka_message_t *msg,
                        void *opaque) {
  (void)rk;
  kl_producer_t *producer = opaque;
  producer->inflight--;
  if (!producer->cb)
    return;
  char id[KL_ID_MAX + 1];
  kl_delivery_t d = {
      .err = kl__kafka_err(msg->err),
      /* not rd_kafka_message_errstr(): on a delivery report it would
       * return the payload, our envelope, as the message */
      .errmsg = msg->err ? rd_kafka_err2str(msg->err) : NULL,
      .topic = rd_kafka_topic_name(msg->rkt),
      .partition = msg->partition,
      .offset = msg->err ? -1 : msg->offset,
      .id = id,
      .id_len = producer_dr_id(producer, msg, id),
      .opaque = msg->_private,
  };
  producer->cb(producer->cb_opaque, &d);
}

static void producer_error(rd_kafka_t *rk, int err, const char *reason,
                           void *opaque) {
  (void)opaque;
  kl__kafka_refusal_note(rk, err, reason);
  if (err == RD_KAFKA_RESP_ERR__FATAL)
    KL_LOG_E("producer",
             "fatal: %s; no further event can be published by "
             "this producer",
             reason);
  else if (err == RD_KAFKA_RESP_ERR__TRANSPORT ||
           err == RD_KAFKA_RESP_ERR__RESOLVE)
    KL_LOG_D("producer", "%s", reason); /* librdkafka logged it already */
  else
    KL_LOG_W("producer", "%s: %s", rd_kafka_err2name(err), reason);
}

/* ---- creation ---- */

/* keylane's guarantees rest on these; a conflicting value is refused
 * rather than silently replaced. */
static kl_err_t producer_check_forced(const kl_conf_t *conf) {
  static const char *const acks[] = {"kafka.acks",
                                     "kafka.request.required.acks"};
  for (size_t i = 0; i < 2; i++) {
    const char *v = kl_conf_get(conf, acks[i]);
    if (v && strcmp(v, "all") != 0 && strcmp(v, "-1") != 0)
      return kl__err(KL_ECONF,
                     "%s=%s: keylane publishes with acks=all so "
                     "that no acknowledged event is lost; remove it",
                     acks[i], v);
  }
  const char *idem = kl_conf_get(conf, "kafka.enable.idempotence");
  if (idem && strcmp(idem, "true") != 0)
    return kl__err(KL_ECONF,
                   "kafka.enable.idempotence=%s: keylane needs the "
                   "idempotent producer (no duplicates or reordering "
                   "on retry); remove it",
                   idem);
  if (!kl_conf_get(conf, "kafka.bootstrap.servers") &&
      !kl_conf_get(conf, "kafka.metadata.broker.list"))
    return kl__err(KL_ECONF, "kafka.bootstrap.servers is not set: give the "
                             "brokers as HOST:PORT[,HOST:PORT] (-b)");
  return KL_OK;
}

static kl_err_t producer_rkconf(const kl_conf_t *conf, kl_producer_t *producer,
                                rd_kafka_conf_t **out) {
  rd_kafka_conf_t *rkconf = rd_kafka_conf_new();
  char n[32];
  /* librdkafka's queue must hold the whole budget, so that the budget,
   * with its documented wait, is what a caller meets first. */
  snprintf(n, sizeof(n), "%lld", (long long)producer->inflight_max + 1000);
  char max[16];
  snprintf(max, sizeof(max), "%d", KL_MESSAGE_MAX); /* a broker's default */
  const char *const defaults[] = {"queue.buffering.max.messages", n,
                                  "message.max.bytes", max, NULL};
  kl_err_t err = kl__kafka_conf_apply(rkconf, conf, defaults);
  if (!err)
    err = kl__kafka_set(rkconf, "enable.idempotence", "true");
  if (!err)
    err = kl__kafka_set(rkconf, "acks", "all");
  if (err) {
    rd_kafka_conf_destroy(rkconf);
    return err;
  }
  rd_kafka_conf_set_dr_msg_cb(rkconf, producer_dr);
  rd_kafka_conf_set_error_cb(rkconf, producer_error);
  rd_kafka_conf_set_opaque(rkconf, producer);
  *out = rkconf;
  return KL_OK;
}

/* Frees what kl_producer_new() set up before librdkafka's handle. */
static void producer_free(kl_producer_t *producer) {
  kl_decoder_destroy(producer->decoder);
  pthread_mutex_destroy(&producer->mu);
  pthread_cond_destroy(&producer->wake);
  free(producer);
}

kl_err_t kl_producer_new(const kl_conf_t *conf, kl_delivery_cb_t *cb,
                         void *cb_opaque, kl_producer_t **out) {
  kl__err_clear();
  if (!conf || !out)
    return kl__err(KL_EINVAL, "kl_producer_new: conf and out are required");
  kl_err_t err = producer_check_forced(conf);
  if (err)
    return err;
  kl_producer_t *producer = calloc(1, sizeof(*producer));
  if (!producer || !(producer->decoder = kl_decoder_new())) {
    free(producer);
    return kl__err(KL_ENOMEM, "kl_producer_new: out of memory");
  }
  producer->cb = cb;
  producer->cb_opaque = cb_opaque;
  producer->inflight_max = kl__conf_int(conf, "producer.inflight.max");
  producer->enqueue_timeout_ms =
      kl__conf_int(conf, "producer.enqueue.timeout.ms");
  producer->expect_partitions =
      (int32_t)kl__conf_int(conf, "producer.expect.partitions");
  producer->check_ms = kl__conf_int(conf, "producer.partitions.check.ms");
  producer->timer_max_ms = kl__conf_int(conf, "timer.max.delay");
  producer->follow_ups =
      strcmp(kl_conf_get(conf, "producer.follow_ups"), "true") == 0;
  pthread_mutex_init(&producer->mu, NULL);
  kl__mono_cond_init(&producer->wake);
  rd_kafka_conf_t *rkconf;
  if ((err = producer_rkconf(conf, producer, &rkconf))) {
    producer_free(producer);
    return err;
  }
  char errstr[512];
  producer->rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, rkconf, errstr, sizeof(errstr));
  if (!producer->rk) {
    rd_kafka_conf_destroy(rkconf);
    producer_free(producer);
    return kl__err(KL_ECONF, "cannot create the Kafka producer: %s", errstr);
  }
  if ((err = watch_start(producer))) {
    kl_producer_destroy(producer);
    return err;
  }
  *out = producer;
  return KL_OK;
}

/* ---- topics and their partition counts ---- */

/* One metadata request for @p topic: the count, 0 while the topic has no
 * leaders yet (just created), or a negative kl_err_t with the detail. */
static int32_t topic_read_count(kl_producer_t *producer, kl_topic_t *topic,
                                int timeout_ms) {
  const struct rd_kafka_metadata *md;
  kl_err_t err = kl__kafka_metadata(producer->rk, topic->name, timeout_ms, &md);
  if (err)
    return -(int32_t)err;
  int32_t count = -(int32_t)kl__err(KL_ENOTFOUND,
                                    "metadata for topic %s "
                                    "came back empty",
                                    topic->name);
  if (md->topic_cnt == 1) {
    rd_kafka_resp_err_t rerr = md->topics[0].err;
    count = md->topics[0].partition_cnt;
    if (rerr == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE)
      count = 0;
    else if (rerr)
      count = -(int32_t)kl__err(kl__kafka_err(rerr), "topic %s: %s",
                                topic->name, rd_kafka_err2str(rerr));
  }
  rd_kafka_metadata_destroy(md);
  return count;
}

/* The refusal, or KL_OK: one relaxed load on every publish. */
static kl_err_t topic_check(const kl_topic_t *topic) {
  int32_t live = atomic_load_explicit(&topic->live, memory_order_relaxed);
  if (live == topic->expect.count)
    return KL_OK;
  kl__partitions_check(topic->name, live, &topic->expect);
  char why[512];
  snprintf(why, sizeof(why), "%s", kl_err_detail());
  return kl__err(KL_EPARTITIONS, "%s; nothing was published", why);
}

/* Reads the count, waiting out a topic that is still being created. */
static kl_err_t topic_load(kl_producer_t *producer, kl_topic_t *topic) {
  int64_t deadline = kl__mono_ns() + (int64_t)KL_METADATA_TIMEOUT_MS * 1000000;
  for (;;) {
    int64_t left_ms = (deadline - kl__mono_ns()) / 1000000;
    int32_t count =
        topic_read_count(producer, topic, left_ms > 0 ? (int)left_ms : 1);
    if (count < 0)
      return (kl_err_t)-count;
    if (count > 0) {
      int32_t expect = producer->expect_partitions;
      topic->partitions = count;
      topic->expect =
          (kl__partitions_expect_t){expect ? expect : count, expect != 0,
                                    "producer", "producer.expect.partitions"};
      atomic_store(&topic->live, count);
      return KL_OK;
    }
    if (left_ms <= 0)
      return kl__err(KL_EKAFKA_TRANSIENT,
                     "topic %s has no partition leaders "
                     "after %d ms",
                     topic->name, KL_METADATA_TIMEOUT_MS);
    rd_kafka_poll(producer->rk, 100);
  }
}

static kl_topic_t *topic_find(kl_producer_t *producer, const char *name) {
  kl_topic_t *last = producer->last;
  if (last && (last->name == name || strcmp(last->name, name) == 0))
    return last;
  for (size_t i = 0; i < producer->topic_cnt; i++)
    if (strcmp(producer->topics[i]->name, name) == 0)
      return producer->last = producer->topics[i];
  return NULL;
}

static void topic_free(kl_topic_t *topic) {
  if (topic->rkt)
    rd_kafka_topic_destroy(topic->rkt);
  free(topic->name);
  free(topic);
}

static kl_err_t topic_new(kl_producer_t *producer, const char *name,
                          kl_topic_t **out) {
  kl_topic_t *topic = calloc(1, sizeof(*topic));
  if (!topic || !(topic->name = strdup(name))) {
    free(topic);
    return kl__err(KL_ENOMEM, "out of memory adding topic %s", name);
  }
  topic->rkt = rd_kafka_topic_new(producer->rk, name, NULL);
  if (!topic->rkt) {
    topic_free(topic);
    return kl__err(KL_EINVAL, "topic %s: %s", name,
                   rd_kafka_err2str(rd_kafka_last_error()));
  }
  *out = topic;
  return KL_OK;
}

/* Adds a topic whose count was read, for the publishes and the watch. */
static kl_err_t topic_add(kl_producer_t *producer, kl_topic_t *topic) {
  pthread_mutex_lock(&producer->mu);
  kl_topic_t **topics = kl__grow(producer->topics, &producer->topic_cap,
                                 producer->topic_cnt, sizeof(*topics), 8);
  if (topics) {
    producer->topics = topics;
    topics[producer->topic_cnt++] = topic;
  }
  pthread_mutex_unlock(&producer->mu);
  if (!topics)
    return kl__err(KL_ENOMEM, "out of memory adding topic %s", topic->name);
  producer->last = topic;
  return KL_OK;
}

/* The cached topic, its partition count read on first use. A topic whose
 * count could not be read is not kept, so the next call tries again. */
static kl_err_t topic_get(kl_producer_t *producer, const char *name,
                          kl_topic_t **out) {
  kl_topic_t *topic = topic_find(producer, name);
  if (!topic) {
    kl_err_t err = topic_new(producer, name, &topic);
    if (err)
      return err;
    if ((err = topic_load(producer, topic)) == KL_OK)
      err = topic_add(producer, topic);
    if (err) {
      topic_free(topic);
      return err;
    }
  }
  *out = topic;
  return topic_check(topic);
}

void kl__producer_forget(kl_producer_t *producer, const char *name) {
  for (size_t i = 0; producer && i < producer->topic_cnt; i++) {
    kl_topic_t *topic = producer->topics[i];
    if (strcmp(topic->name, name) != 0)
      continue;
    pthread_mutex_lock(&producer->mu);
    producer->topics[i] = producer->topics[--producer->topic_cnt];
    pthread_mutex_unlock(&producer->mu);
    producer->last = NULL;
    topic_free(topic);
    return;
  }
}

kl_err_t kl_producer_partitions(kl_producer_t *producer, const char *topic,
                                int32_t *count) {
  kl__err_clear();
  if (!producer || !topic || !count)
    return kl__err(KL_EINVAL, "kl_producer_partitions: producer, topic and "
                              "count are required");
  *count = 0;
  kl_topic_t *t = NULL;
  kl_err_t err = topic_get(producer, topic, &t);
  if (err && err != KL_EPARTITIONS)
    return err;
  /* A mismatch is not this call's failure: the live count is known. */
  kl__err_clear();
  *count = atomic_load(&t->live);
  return KL_OK;
}

kl_err_t kl__producer_topic_check(kl_producer_t *producer, const char *topic) {
  kl_topic_t *t;
  return topic_get(producer, topic, &t);
}

/* ---- the watch thread ---- */

/* Stores the counts of @p md in the topics (mu held), and says once when
 * one changed. */
static void watch_apply(kl_producer_t *producer,
                        const struct rd_kafka_metadata *md) {
  for (int i = 0; i < md->topic_cnt; i++) {
    const rd_kafka_metadata_topic_t *mt = &md->topics[i];
    if (mt->err || mt->partition_cnt <= 0)
      continue;
    for (size_t j = 0; j < producer->topic_cnt; j++) {
      kl_topic_t *t = producer->topics[j];
      if (strcmp(t->name, mt->topic) != 0)
        continue;
      atomic_store(&t->live, mt->partition_cnt);
      if (mt->partition_cnt != t->expect.count && !t->reported) {
        t->reported = 1;
        kl__partitions_check(t->name, mt->partition_cnt, &t->expect);
        KL_LOG_E("producer",
                 "%s; publishing to topic %s is refused from now "
                 "on",
                 kl_err_detail(), t->name);
      } else if (mt->partition_cnt == t->expect.count) {
        t->reported = 0;
      }
    }
  }
}

static void *watch_main(void *opaque) {
  kl_producer_t *producer = opaque;
  pthread_mutex_lock(&producer->mu);
  while (!producer->stopping) {
    kl__mono_cond_wait(&producer->wake, &producer->mu,
                       kl__mono_ns() + producer->check_ms * 1000000);
    if (producer->stopping || !producer->topic_cnt)
      continue;
    pthread_mutex_unlock(&producer->mu);
    /* No topic named: librdkafka asks for every topic this handle uses. */
    const struct rd_kafka_metadata *md = NULL;
    kl_err_t err =
        kl__kafka_metadata(producer->rk, NULL, KL_WATCH_TIMEOUT_MS, &md);
    pthread_mutex_lock(&producer->mu);
    if (err) {
      KL_LOG_D("producer", "partition counts: %s", kl_err_detail());
      continue;
    }
    watch_apply(producer, md);
    rd_kafka_metadata_destroy(md);
  }
  pthread_mutex_unlock(&producer->mu);
  return NULL;
}

static kl_err_t watch_start(kl_producer_t *producer) {
  if (pthread_create(&producer->watch, NULL, watch_main, producer) != 0)
    return kl__err(KL_ENOMEM, "cannot start the producer's partition-count "
                              "watch thread");
  producer->watching = 1;
  return KL_OK;
}

static void watch_stop(kl_producer_t *producer) {
  if (!producer->watching)
    return;
  pthread_mutex_lock(&producer->mu);
  producer->stopping = 1;
  pthread_cond_signal(&producer->wake);
  pthread_mutex_unlock(&producer->mu);
  pthread_join(producer->watch, NULL);
  producer->watching = 0;
}

/* ---- publishing ---- */

/* Waits, serving delivery reports, until the budget has room. */
static kl_err_t budget_wait(kl_producer_t *producer) {
  if (producer->inflight < producer->inflight_max)
    return KL_OK;
  int64_t start = kl__mono_ns();
  int64_t deadline = start + producer->enqueue_timeout_ms * 1000000;
  for (;;) {
    int64_t left_ms = (deadline - kl__mono_ns() + 999999) / 1000000;
    if (producer->inflight < producer->inflight_max)
      return KL_OK;
    if (left_ms <= 0)
      break;
    rd_kafka_poll(producer->rk, left_ms < 100 ? (int)left_ms : 100);
  }
  return kl__err(KL_EQUEUE_FULL,
                 "%lld events are waiting for Kafka's acknowledgement, the "
                 "budget (producer.inflight.max) is %lld, and none was "
                 "acknowledged within producer.enqueue.timeout.ms=%lld: is "
                 "the cluster reachable? The event was not published",
                 (long long)producer->inflight,
                 (long long)producer->inflight_max,
                 (long long)producer->enqueue_timeout_ms);
}

/* Hands the envelope to librdkafka, which copies it (the file comment says
 * why). __QUEUE_FULL (librdkafka's byte limit, queue.buffering.max.kbytes)
 * gets the same wait as the budget. */
static kl_err_t msg_produce(kl_producer_t *producer, kl_topic_t *topic,
                            const kl_event_t *event, const void *envelope,
                            size_t envelope_len, void *opaque) {
  int32_t partition =
      kl_partition(event->key, event->key_len, topic->partitions);
  int64_t deadline = 0;
  while (rd_kafka_produce(topic->rkt, partition, RD_KAFKA_MSG_F_COPY,
                          (void *)envelope, envelope_len, event->key,
                          event->key_len, opaque) != 0) {
    rd_kafka_resp_err_t rerr = rd_kafka_last_error();
    if (rerr != RD_KAFKA_RESP_ERR__QUEUE_FULL ||
        (deadline && kl__mono_ns() > deadline))
      return kl__err(kl__kafka_err(rerr), "cannot publish to %s [%d]: %s",
                     topic->name, (int)partition, rd_kafka_err2str(rerr));
    if (!deadline)
      deadline = kl__mono_ns() + producer->enqueue_timeout_ms * 1000000;
    rd_kafka_poll(producer->rk, 10);
  }
  producer->inflight++;
  return KL_OK;
}

/* Fills in the id and ts the service left out, from one clock read. */
static void publish_stamp(kl_event_t *ev, char id[37]) {
  if (ev->id_len != 0 && ev->ts != 0)
    return;
  int64_t now = kl__now_ms();
  if (ev->id_len == 0) {
    kl__event_make_id_at(id, now);
    ev->id = id;
    ev->id_len = 36;
  }
  if (ev->ts == 0)
    ev->ts = now;
}

kl_err_t kl_publish(kl_producer_t *producer, const char *topic,
                    const kl_event_t *event, void *opaque) {
  kl__err_clear();
  if (!producer || !topic || !event)
    return kl__err(KL_EINVAL, "kl_publish: producer, topic and event are "
                              "required");
  kl_event_t ev = *event;
  /* Validating first: a bad event fails before any waiting. The id
   * publish_stamp() makes is UUID text by its making: the text check of
   * an id is for the service's (it is an eighth of kl_publish()'s own
   * instructions on `keylane-bench produce`). */
  kl_err_t err = kl_event_validate(&ev, 1);
  char id[37];
  publish_stamp(&ev, id);
  if (!err) /* the outbox's ids are keylane's; nobody else's may be */
    err = kl__reserved_check(&ev, producer->follow_ups);
  size_t size = 0;
  if (!err)
    err = kl__producer_event_check(producer, &ev, &size);
  if (err)
    return err;
  /* librdkafka copies the envelope, so it only lives for this call. */
  uint8_t stack[KL_ENVELOPE_STACK];
  uint8_t *envelope = size <= sizeof(stack) ? stack : malloc(size);
  if (!envelope)
    return kl__err(KL_ENOMEM, "cannot allocate a %zu-byte envelope", size);
  size_t envelope_len = kl__envelope_write(&ev, envelope);
  kl_topic_t *t;
  err = topic_get(producer, topic, &t);
  if (!err)
    err = budget_wait(producer);
  if (!err)
    err = msg_produce(producer, t, &ev, envelope, envelope_len, opaque);
  if (envelope != stack)
    free(envelope);
  if (err)
    return err;
  rd_kafka_poll(producer->rk, 0); /* serve delivery reports as we go */
  return KL_OK;
}

int kl_producer_poll(kl_producer_t *producer, int timeout_ms) {
  return producer ? rd_kafka_poll(producer->rk, timeout_ms) : 0;
}

kl_err_t kl_flush(kl_producer_t *producer, int timeout_ms) {
  kl__err_clear();
  if (!producer)
    return kl__err(KL_EINVAL, "kl_flush: producer is NULL");
  if (rd_kafka_flush(producer->rk, timeout_ms) == RD_KAFKA_RESP_ERR_NO_ERROR)
    return KL_OK;
  return kl__err(KL_ETIMEOUT,
                 "%lld events still wait for Kafka's "
                 "acknowledgement after %d ms",
                 (long long)producer->inflight, timeout_ms);
}

int64_t kl_producer_inflight(const kl_producer_t *producer) {
  return producer ? producer->inflight : 0;
}

void kl_producer_destroy(kl_producer_t *producer) {
  if (!producer)
    return;
  watch_stop(producer);
  if (kl_flush(producer, 10000) != KL_OK) {
    KL_LOG_W("producer", "%s; failing them", kl_err_detail());
    /* Purged events get a delivery report (KL_ESTOPPED). */
    rd_kafka_purge(producer->rk,
                   RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(producer->rk, 2000);
  }
  for (size_t i = 0; i < producer->topic_cnt; i++)
    topic_free(producer->topics[i]);
  free(producer->topics);
  rd_kafka_destroy(producer->rk);
  producer_free(producer);
}

kl_err_t kl__producer_event_check(const kl_producer_t *producer,
                                  const kl_event_t *event,
                                  size_t *envelope_size) {
  /* the clock only for a delayed event: one read less per event */
  kl_err_t err =
      event->not_before
          ? kl__not_before_check(event, kl__now_ms(), producer->timer_max_ms,
                                 producer->timer_max_ms, "timer.max.delay")
          : KL_OK;
  if (err)
    return err;
  kl_event_t ev = *event;
  if (ev.id_len == 0)
    ev.id_len = 36; /* the UUIDv7 kl_publish() makes */
  size_t size = kl__envelope_size(&ev);
  if (envelope_size)
    *envelope_size = size;
  return kl__record_check(&ev, size);
}

/* For the gateway (broker/producer_internal.h): its loop wakes up on the
 * main queue's event callback and probes Kafka with metadata requests. */
rd_kafka_t *kl__producer_rk(kl_producer_t *producer) {
  return producer->rk;
}
