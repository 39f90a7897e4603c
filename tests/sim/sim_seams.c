/*
 * The seams through which the simulated owners run the worker's own
 * lanes (worker/lanes*.c, lanes_pool.c, outbox.c, store/child.c): keylane-sim
 * is linked with `--wrap` for each function below (tests/CMakeLists.txt), so
 * that the library's calls to them come here, and nothing in the library
 * knows. Outside an owner's call into its lanes (W->acting NULL) each one
 * passes the call on to the real function.
 *
 * - The clock: kl__mono_ns() is the schedule's (W->now_ms, plus what the
 *   lanes waited: kl__sleep_ms() and the polls' timeouts pass no real time
 *   but move it on), so that retries, commit intervals and waits are
 *   decided by the schedule alone.
 * - The log: records are the simulated log's, which the lanes must not
 *   free (rd_kafka_message_destroy()).
 * - The dead-letter topic: kl__dlq_send() appends the letter to the
 *   simulated one (W->letters); its ack comes at the owner's next
 *   kl__dlq_poll(), sometimes as a transient failure (sent again).
 * - Firing records (worker/fire.c): kl__dlq_timer() appends a due timer's
 *   record to its partition of the log, with the header keylane.timer and
 *   the owner's clock as its timestamp; acked as letters are. A record of
 *   the log gives its own headers and timestamp to
 *   rd_kafka_message_headers() and rd_kafka_message_timestamp().
 * - The outbox's producer: kl_publish() checks the follow-up (its source
 *   event committed, the credit of its transfer) and appends it to the
 *   log; its delivery report comes at a later kl_producer_poll(), when the
 *   step says so, sometimes as a transient failure.
 * - The group commit: kl__store_commit_many() is where the step's fate
 *   strikes (a failed commit, a lost answer, the owner dying after it) and
 *   where the model learns what truly committed: the slots the commit
 *   holds, read in the before-commit hook (sim_owner.c).
 * - The committer thread: kl__lanes_flight_start() starts none; the
 *   owner's turn runs the commit a tick left in flight before its events,
 *   after them, after its tick, or right after a resume (sim_owner.c), or
 *   a later turn, a take or a settle in its lanes does.
 * - A dead owner (o->dead: it crashed, and its lanes are torn down or run
 *   on to the end of a call) reaches nothing: its commits fail, what it
 *   publishes or dead-letters is lost, its outbox removals fail.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/strbuf.h"
#include "keylane/producer.h"
#include "sim/sim.h"
#include "store/outbox_rec.h"
#include "store/timers.h"
#include "worker/dlq.h"
#include "worker/lanes.h"

int64_t __real_kl__mono_ns(void);
void __real_kl__sleep_ms(int64_t ms);
void __real_rd_kafka_message_destroy(rd_kafka_message_t *m);
void __real_kl__store_commit_many(kl__store_commit_t *c, size_t n);
kl_err_t __real_kl__store_outbox_del(kl_store_t *store, const char *topic,
                                     const kl__outbox_ack_t *acks, size_t n);
int64_t __wrap_kl__mono_ns(void);
void __wrap_kl__sleep_ms(int64_t ms);
void __wrap_rd_kafka_message_destroy(rd_kafka_message_t *m);
kl_err_t __wrap_kl__dlq_send(kl__dlq_t *dlq, const char *source_topic,
                             const kl__dlq_letter_t *letter,
                             const kl__dlq_ref_t *ref);
void __wrap_kl__dlq_poll(kl__dlq_t *dlq, int timeout_ms);
kl_err_t __wrap_kl__dlq_timer(kl__dlq_t *dlq, const char *topic,
                              int32_t partition, const void *key,
                              size_t key_len, const void *env, size_t env_len,
                              int64_t offset);
kl_err_t __real_kl__timers_scan(kl_store_t *store, const char *topic,
                                int32_t partition, kl__timer_cb_t *cb,
                                void *opaque, size_t *bad);
kl_err_t __wrap_kl__timers_scan(kl_store_t *store, const char *topic,
                                int32_t partition, kl__timer_cb_t *cb,
                                void *opaque, size_t *bad);
kl_err_t __real_kl__store_outbox_list(kl_store_t *store, const char *topic,
                                      int32_t partition, uint64_t after,
                                      size_t max, kl__outbox_cb_t *cb,
                                      void *opaque);
kl_err_t __wrap_kl__store_outbox_list(kl_store_t *store, const char *topic,
                                      int32_t partition, uint64_t after,
                                      size_t max, kl__outbox_cb_t *cb,
                                      void *opaque);
rd_kafka_resp_err_t __real_rd_kafka_message_headers(const rd_kafka_message_t *m,
                                                    rd_kafka_headers_t **h);
rd_kafka_resp_err_t __wrap_rd_kafka_message_headers(const rd_kafka_message_t *m,
                                                    rd_kafka_headers_t **h);
int64_t __real_rd_kafka_message_timestamp(const rd_kafka_message_t *m,
                                          rd_kafka_timestamp_type_t *type);
int64_t __wrap_rd_kafka_message_timestamp(const rd_kafka_message_t *m,
                                          rd_kafka_timestamp_type_t *type);
kl_err_t __wrap_kl__dlq_forward(kl__dlq_t *dlq, const char *topic,
                                int32_t partition,
                                const rd_kafka_message_t *msg,
                                const kl__dlq_ref_t *ref);
kl_err_t __wrap_kl_producer_new(const kl_conf_t *conf, kl_delivery_cb_t *cb,
                                void *cb_opaque, kl_producer_t **out);
kl_err_t __wrap_kl_publish(kl_producer_t *producer, const char *topic,
                           const kl_event_t *event, void *opaque);
int __wrap_kl_producer_poll(kl_producer_t *producer, int timeout_ms);
kl_err_t __wrap_kl_flush(kl_producer_t *producer, int timeout_ms);
void __wrap_kl_producer_destroy(kl_producer_t *producer);
kl_err_t __wrap_kl__store_outbox_del(kl_store_t *store, const char *topic,
                                     const kl__outbox_ack_t *acks, size_t n);
void __wrap_kl__store_commit_many(kl__store_commit_t *c, size_t n);
int __real_kl__lanes_flight_start(struct kl__lanes *lanes);
int __wrap_kl__lanes_flight_start(struct kl__lanes *lanes);

/* What an owner's Kafka holds for it: letters and follow-ups sent, their
 * reports not yet served. */
typedef struct sim_sent {
  kl__dlq_ref_t ref; /* a letter's */
  void *opaque;      /* a follow-up's (kl_publish()'s) */
  int letter;
  int refused; /* Kafka refuses it for good: too large, say */
} sim_sent_t;

struct sim_fake {
  sim_owner_t *owner;
  int tno;              /* the topic of its engine */
  kl_delivery_cb_t *cb; /* the outbox's producer */
  void *cb_opaque;
  sim_sent_t *v;
  size_t n, cap;
};

static int sim_rec_mark; /* msg._private of the simulated log's records */

void *sim_rec_private(void) {
  return &sim_rec_mark;
}

sim_fake_t *sim_fake_new(sim_owner_t *o, int tno) {
  sim_fake_t *f = calloc(1, sizeof(*f));
  f->owner = o;
  f->tno = tno;
  return f;
}

void sim_fake_free(sim_fake_t *f) {
  if (f) {
    free(f->v);
    free(f);
  }
}

size_t sim_fake_inflight(const sim_fake_t *f) {
  return f ? f->n : 0;
}

/* ---- the clock ----------------------------------------------------------- */

int64_t __wrap_kl__mono_ns(void) {
  if (!W)
    return __real_kl__mono_ns();
  return W->now_ms * 1000000 + W->drift_ns;
}

void __wrap_kl__sleep_ms(int64_t ms) {
  if (!W)
    __real_kl__sleep_ms(ms);
  else if (ms > 0)
    W->drift_ns += ms * 1000000;
}

void __wrap_rd_kafka_message_destroy(rd_kafka_message_t *m) {
  if (m && m->_private != &sim_rec_mark)
    __real_rd_kafka_message_destroy(m);
}

/* A record of the simulated log has its own headers and timestamp (a
 * firing record's keylane.timer, its writer's clock): librdkafka's would
 * read a message of its own making. */
rd_kafka_resp_err_t __wrap_rd_kafka_message_headers(const rd_kafka_message_t *m,
                                                    rd_kafka_headers_t **h) {
  if (!m || m->_private != &sim_rec_mark)
    return __real_rd_kafka_message_headers(m, h);
  *h = ((const sim_rec_t *)m)->headers;
  return *h ? RD_KAFKA_RESP_ERR_NO_ERROR : RD_KAFKA_RESP_ERR__NOENT;
}

int64_t __wrap_rd_kafka_message_timestamp(const rd_kafka_message_t *m,
                                          rd_kafka_timestamp_type_t *type) {
  if (!m || m->_private != &sim_rec_mark)
    return __real_rd_kafka_message_timestamp(m, type);
  if (type)
    *type = RD_KAFKA_TIMESTAMP_CREATE_TIME;
  return ((const sim_rec_t *)m)->ts;
}

/* ---- reports ------------------------------------------------------------- */

static void sent_add(sim_fake_t *f, sim_sent_t s) {
  f->v = kl__grow(f->v, &f->cap, f->n, sizeof(*f->v), 16);
  f->v[f->n++] = s;
}

/* Serves @p f's reports: with @p wait (a poll that waits, a flush) every
 * one, successful; else as the owner's step says (sim_batch_t.acks). */
static int serve(sim_fake_t *f, int letters, int wait) {
  sim_owner_t *o = f->owner;
  if (o->dead || (!wait && !o->batch.acks))
    return 0;
  int failing = !wait && o->batch.acks == 2;
  int served = 0;
  for (size_t i = 0; i < f->n;) {
    sim_sent_t s = f->v[i];
    if (s.letter != letters) {
      i++;
      continue;
    }
    memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof(*f->v));
    f->n--;
    kl_err_t err = s.refused ? KL_EKAFKA
                   : failing ? KL_EKAFKA_TRANSIENT
                             : KL_OK;
    const char *why = s.refused ? "sim: larger than the topic takes"
                      : failing ? "sim: the broker did not answer"
                                : NULL;
    failing = 0; /* the first one only */
    served++;
    if (letters) {
      kl__lanes_dlq_ack(o->lanes[f->tno], &s.ref, err, why);
    } else if (f->cb) {
      kl_delivery_t d = {
          .err = err, .errmsg = why, .opaque = s.opaque, .offset = -1};
      f->cb(f->cb_opaque, &d);
    }
  }
  return served;
}

/* Whether Kafka refuses a record for good (larger than its topic takes):
 * one in @p in of the records an owner sends outside the drain, decided
 * by the schedule's seed and how many it sent. */
static int refused(int in) {
  return !W->calm &&
         sim_mix(W->seed ^ (0x5e7a51deULL + W->sends++)) % (uint64_t)in == 0;
}

/* ---- the dead-letter topic ----------------------------------------------- */

/* The letter of a follow-up Kafka refused (the outbox sets it aside):
 * refused too, sometimes (the follow-up must then stay in the store),
 * else appended to the dead-letter topic with the follow-up's record. */
static kl_err_t aside_send(sim_fake_t *f, const kl__dlq_letter_t *letter,
                           const kl__dlq_ref_t *ref) {
  static kl_decoder_t *decoder;
  if (!decoder)
    decoder = kl_decoder_new();
  const rd_kafka_message_t *m = letter->msg;
  kl_event_t ev;
  int k = -1;
  uint32_t e = SIM_NONE;
  if (kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev) ==
          KL_OK &&
      (k = sim_key_by_name(f->tno, ev.key, ev.key_len)) >= 0)
    e = sim_event_find((uint8_t)k, ev.id, ev.id_len);
  if (e == SIM_NONE || !sim_followup(W->events[e].kind)) {
    sim_fail("letter", "a follow-up set aside is no follow-up the model knows");
    return KL_EINVAL;
  }
  if (f->owner->dead)
    return KL_OK;
  int refuse = refused(2);
  if (!refuse) {
    W->letters = kl__grow(W->letters, &W->letters_cap, W->nletters,
                          sizeof(*W->letters), 64);
    void *copy = malloc(m->len);
    memcpy(copy, m->payload, m->len);
    W->letters[W->nletters++] = (sim_letter_t){-1, -1, e, copy, m->len};
    W->events[e].aside = 1;
    W->stats.letters++;
  }
  sim_say("owner %d sets follow-up %.*s aside as a dead letter%s", f->owner->no,
          (int)ev.id_len, ev.id, refuse ? ", which Kafka refuses too" : "");
  sent_add(f, (sim_sent_t){*ref, NULL, 1, refuse});
  return KL_OK;
}

kl_err_t __wrap_kl__dlq_send(kl__dlq_t *dlq, const char *source_topic,
                             const kl__dlq_letter_t *letter,
                             const kl__dlq_ref_t *ref) {
  sim_fake_t *f = (sim_fake_t *)dlq;
  const rd_kafka_message_t *m = letter->msg;
  if (letter->destination)
    return aside_send(f, letter, ref);
  int32_t part = f->tno * W->cfg.partitions + m->partition;
  if (m->_private != &sim_rec_mark || m->partition >= W->cfg.partitions ||
      (size_t)m->offset >= W->log[part].n) {
    sim_fail("letter", "a dead letter names no record of the log");
    return KL_EINVAL;
  }
  if (f->owner->dead)
    return KL_OK; /* lost with its process */
  W->letters = kl__grow(W->letters, &W->letters_cap, W->nletters,
                        sizeof(*W->letters), 64);
  uint32_t e = W->log[part].v[m->offset]->event;
  W->letters[W->nletters++] = (sim_letter_t){part, m->offset, e, NULL, 0};
  W->stats.letters++;
  sim_say("owner %d dead-letters offset %" PRId64 " of partition %d (%s)",
          f->owner->no, m->offset, (int)m->partition,
          kl__dlq_reason_name(letter->reason));
  sent_add(f, (sim_sent_t){*ref, NULL, 1, 0});
  return KL_OK;
}

void __wrap_kl__dlq_poll(kl__dlq_t *dlq, int timeout_ms) {
  if (timeout_ms > 0)
    W->drift_ns += (int64_t)timeout_ms * 1000000;
  serve((sim_fake_t *)dlq, 1, timeout_ms > 0);
}

/* A due timer's firing record (worker/fire.c): the stored envelope, back
 * to its key's partition with the header keylane.timer naming the record
 * that scheduled it and the owner's clock as its timestamp, acked like a
 * letter. It must be a delayed event's, of a record of the log, and due
 * by the owner's clock. */
kl_err_t __wrap_kl__dlq_timer(kl__dlq_t *dlq, const char *topic,
                              int32_t partition, const void *key,
                              size_t key_len, const void *env, size_t env_len,
                              int64_t offset) {
  static kl_decoder_t *decoder;
  if (!decoder)
    decoder = kl_decoder_new();
  sim_fake_t *f = (sim_fake_t *)dlq;
  int32_t part = f->tno * W->cfg.partitions + partition;
  kl_event_t ev;
  int k = -1;
  uint32_t e = SIM_NONE;
  if (strcmp(topic, W->topics[f->tno]) == 0 && partition >= 0 &&
      partition < W->cfg.partitions &&
      kl_event_decode(decoder, key, key_len, env, env_len, &ev) == KL_OK &&
      (k = sim_key_by_name(f->tno, ev.key, ev.key_len)) >= 0)
    e = sim_event_find((uint8_t)k, ev.id, ev.id_len);
  if (e == SIM_NONE || !W->events[e].not_before || W->events[e].part != part ||
      offset < 0 || (size_t)offset >= W->log[part].n ||
      W->log[part].v[offset]->event != e) {
    sim_fail("fire",
             "owner %d wrote a firing record to partition %d of %s, naming "
             "offset %" PRId64 ", that is no delayed event's of the log",
             f->owner->no, (int)partition, topic, offset);
    return KL_EINVAL;
  }
  if (kl__store_now_ms() < W->events[e].not_before) {
    sim_fail("fire-early",
             "owner %d wrote the firing record of %.*s %" PRId64
             " ms before its time by its own clock",
             f->owner->no, (int)ev.id_len, ev.id,
             W->events[e].not_before - kl__store_now_ms());
    return KL_EINVAL;
  }
  if (f->owner->dead)
    return KL_OK; /* lost with its process */
  void *copy = malloc(env_len);
  memcpy(copy, env, env_len);
  int64_t at = sim_log_append_at(e, copy, env_len, kl__store_now_ms(), offset);
  sim_key_place(e); /* where it runs among the key's events */
  W->stats.fired++;
  sim_say("owner %d fires the timer of %.*s (offset %" PRId64
          ") of partition %d: offset %" PRId64 ", %+" PRId64
          " ms past its time",
          f->owner->no, (int)ev.id_len, ev.id, offset, (int)part, at,
          kl__store_now_ms() - W->events[e].not_before);
  sent_add(f, (sim_sent_t){{partition, offset, KL__DLQ_TIMER_GEN}, NULL, 1, 0});
  return KL_OK;
}

/* worker/fire.c reads the due index on its owner's store handle. On
 * PostgreSQL the simulator's owner is two workers (one per topic) on one
 * handle of store.pg.pool 2, whose lanes keep a batch open each, where a
 * worker's keep pool - 1 and leave one connection for such a read: it
 * would wait KL__PG_POOL_WAIT_MS of real time, then fail. It reads on the
 * world's handle instead, which sees the same committed timers. */
kl_err_t __wrap_kl__timers_scan(kl_store_t *store, const char *topic,
                                int32_t partition, kl__timer_cb_t *cb,
                                void *opaque, size_t *bad) {
  if (W && W->acting && W->backend == SIM_PG && store == W->acting->store)
    store = W->store;
  return __real_kl__timers_scan(store, topic, partition, cb, opaque, bad);
}

/* The outbox publisher's listing (worker/outbox.c), and its removals, for
 * the same reason: on the owner's handle they waited KL__PG_POOL_WAIT_MS
 * of real time whenever both its topics' lanes held a batch open (in a
 * drain, say). */
kl_err_t __wrap_kl__store_outbox_list(kl_store_t *store, const char *topic,
                                      int32_t partition, uint64_t after,
                                      size_t max, kl__outbox_cb_t *cb,
                                      void *opaque) {
  if (W && W->acting && W->backend == SIM_PG && store == W->acting->store)
    store = W->store;
  return __real_kl__store_outbox_list(store, topic, partition, after, max, cb,
                                      opaque);
}

kl_err_t __wrap_kl__dlq_forward(kl__dlq_t *dlq, const char *topic,
                                int32_t partition,
                                const rd_kafka_message_t *msg,
                                const kl__dlq_ref_t *ref) {
  sim_fail("forward", "the simulated worker forwarded a record");
  return KL_EINVAL;
}

/* ---- the outbox's producer ----------------------------------------------- */

kl_err_t __wrap_kl_producer_new(const kl_conf_t *conf, kl_delivery_cb_t *cb,
                                void *cb_opaque, kl_producer_t **out) {
  sim_fake_t *f = W->acting ? W->acting->fake[W->acting->tno] : NULL;
  if (!f) {
    sim_fail("producer", "a producer was made outside an owner's lanes");
    return KL_EINVAL;
  }
  f->cb = cb;
  f->cb_opaque = cb_opaque;
  *out = (kl_producer_t *)f;
  return KL_OK;
}

/* The follow-up's source must be an event of topic @p t whose batch
 * committed. */
static uint32_t followup_source(const kl_event_t *fe, int t) {
  kl__emit_src_t src;
  const char *topic = W->topics[t];
  int32_t first = t * W->cfg.partitions;
  if (kl__emit_id_parse(fe->id, fe->id_len, &src) ||
      src.topic_len != strlen(topic) ||
      memcmp(src.topic, topic, src.topic_len) || src.index != 0 ||
      src.partition >= W->cfg.partitions ||
      (size_t)src.offset >= W->log[first + src.partition].n) {
    sim_fail("followup",
             "the outbox holds a follow-up of id %.*s, which "
             "names no record of the log",
             (int)fe->id_len, fe->id);
    return SIM_NONE;
  }
  uint32_t s = W->log[first + src.partition].v[src.offset]->event;
  if (!W->live.marks[s].applied) {
    sim_fail("orphan-followup",
             "the outbox of partition %d holds follow-up %.*s, whose source "
             "event %.*s was never committed",
             (int)src.partition, (int)fe->id_len, fe->id,
             (int)W->events[s].id_len, W->events[s].id);
    return SIM_NONE;
  }
  return s;
}

/* The model's event of follow-up @p fe (made at its first publish), or
 * SIM_NONE with the schedule failed. */
static uint32_t followup_event(const kl_event_t *fe, int t) {
  uint32_t s = followup_source(fe, t);
  int k = sim_key_by_name(t, fe->key, fe->key_len);
  if (s == SIM_NONE)
    return SIM_NONE;
  if (!sim_emits(W->events[s].kind) || k != W->events[s].to) {
    sim_fail("followup",
             "follow-up %.*s is not the credit of its source "
             "transfer or defer",
             (int)fe->id_len, fe->id);
    return SIM_NONE;
  }
  /* Its source's: another event may have its id (a hostile record, an
   * earlier log's follow-up), which makes it no less this one. */
  uint32_t e = W->events[s].followup;
  if (e != SIM_NONE && (W->events[e].id_len != fe->id_len ||
                        memcmp(W->events[e].id, fe->id, fe->id_len))) {
    sim_fail("followup",
             "transfer %.*s emitted follow-up %.*s, and earlier %.*s",
             (int)W->events[s].id_len, W->events[s].id, (int)fe->id_len, fe->id,
             (int)W->events[e].id_len, W->events[e].id);
    return SIM_NONE;
  }
  if (e == SIM_NONE) {
    int defer = W->events[s].kind == SIM_DEFER;
    e = sim_event_add((uint8_t)k, fe->id, fe->id_len);
    W->events[e].kind = defer ? SIM_DEFERRED : SIM_FOLLOWUP;
    W->events[e].amount = W->events[s].amount;
    W->events[e].valid = 1;
    /* the time its defer gave it, whatever the record says: the model's
     * rules for a delayed event hold it to that (sim_timers.c) */
    W->events[e].not_before = defer ? W->events[s].emit_nb : 0;
    W->events[s].followup = e;
    W->stats.defers += (uint64_t)defer;
  }
  return e;
}

/* Appends follow-up @p fe, event @p e, to the log. */
static int followup_append(sim_owner_t *o, uint32_t e, const kl_event_t *fe) {
  void *out;
  size_t out_len;
  if (kl_event_encode(fe, &out, &out_len)) {
    sim_fail("followup", "follow-up %.*s does not encode: %s", (int)fe->id_len,
             fe->id, kl_err_detail());
    return -1;
  }
  int64_t off = sim_log_append(e, out, out_len);
  sim_say("owner %d publishes follow-up %.*s to partition %d, offset %" PRId64,
          o->no, (int)fe->id_len, fe->id, (int)W->events[e].part, off);
  W->stats.published++;
  return 0;
}

kl_err_t __wrap_kl_publish(kl_producer_t *producer, const char *topic,
                           const kl_event_t *event, void *opaque) {
  sim_fake_t *f = (sim_fake_t *)producer;
  if (strcmp(topic, W->topics[f->tno]) != 0) {
    sim_fail("followup", "a follow-up went to topic %s", topic);
    return KL_EINVAL;
  }
  if (f->owner->dead)
    return KL_OK; /* lost with its process; never reported */
  uint32_t e = followup_event(event, f->tno);
  if (e == SIM_NONE)
    return KL_EINVAL;
  int refuse = refused(200);
  if (refuse)
    sim_say("owner %d publishes follow-up %.*s, which Kafka refuses for good",
            f->owner->no, (int)event->id_len, event->id);
  else if (followup_append(f->owner, e, event))
    return KL_EINVAL;
  sent_add(f, (sim_sent_t){{0, 0, 0}, opaque, 0, refuse});
  return KL_OK;
}

int __wrap_kl_producer_poll(kl_producer_t *producer, int timeout_ms) {
  if (timeout_ms > 0)
    W->drift_ns += (int64_t)timeout_ms * 1000000;
  return serve((sim_fake_t *)producer, 0, timeout_ms > 0);
}

kl_err_t __wrap_kl_flush(kl_producer_t *producer, int timeout_ms) {
  sim_fake_t *f = (sim_fake_t *)producer;
  serve(f, 0, 1);
  for (size_t i = 0; i < f->n; i++)
    if (!f->v[i].letter)
      return KL_ETIMEOUT;
  return KL_OK;
}

void __wrap_kl_producer_destroy(kl_producer_t *producer) {
  sim_fake_t *f = (sim_fake_t *)producer;
  if (!f)
    return;
  /* What is left is reported as failed, as the real one does. */
  for (size_t i = 0; i < f->n;) {
    if (f->v[i].letter) {
      i++;
      continue;
    }
    kl_delivery_t d = {.err = KL_EKAFKA_TRANSIENT,
                       .errmsg = "sim: the producer is closed",
                       .opaque = f->v[i].opaque,
                       .offset = -1};
    memmove(&f->v[i], &f->v[i + 1], (f->n - i - 1) * sizeof(*f->v));
    f->n--;
    if (f->cb)
      f->cb(f->cb_opaque, &d);
  }
  f->cb = NULL;
}

/* ---- the store ------------------------------------------------------------
 */

kl_err_t __wrap_kl__store_outbox_del(kl_store_t *store, const char *topic,
                                     const kl__outbox_ack_t *acks, size_t n) {
  if (W && W->acting && W->acting->dead)
    return kl__err(KL_ESTORE_BUSY, "sim: the owner is dead");
  if (W && W->acting && W->backend == SIM_PG && store == W->acting->store)
    store = W->store; /* as the listing: __wrap_kl__store_outbox_list() */
  return __real_kl__store_outbox_del(store, topic, acks, n);
}

void __wrap_kl__store_commit_many(kl__store_commit_t *c, size_t n) {
  sim_owner_t *o = W ? W->acting : NULL;
  if (!o) {
    __real_kl__store_commit_many(c, n);
    return;
  }
  sim_batch_t *b = &o->batch;
  size_t npend = o->npend[o->tno];
  sim_pend_t *pend = o->pend[o->tno];
  if (npend != n)
    sim_fail("seam", "owner %d commits %zu batches, its hook saw %zu", o->no, n,
             npend);
  sim_fate_t fate = o->dead ? SIM_COMMIT_ABORT : b->fate;
  b->fate = SIM_COMMIT_GO; /* the step's fate strikes its first commit */
  W->stats.lost += fate == SIM_COMMIT_LOST;
  W->stats.aborted += fate == SIM_COMMIT_ABORT && !o->dead;
  if (fate == SIM_COMMIT_ABORT) {
    for (size_t i = 0; i < n; i++) {
      kl_store_abort(c[i].txn);
      c[i].err = KL_ESTORE_BUSY;
      snprintf(c[i].why, sizeof(c[i].why), "sim: the commit failed");
    }
  } else {
    __real_kl__store_commit_many(c, n);
    for (size_t i = 0; i < n && i < npend; i++) {
      if (c[i].err)
        continue;
      W->dirty = 1;
      W->stats.commits++;
      sim_view_commit_lane(&W->live, &pend[i], c[i].watermark);
      if (fate == SIM_COMMIT_LOST) {
        c[i].err = KL_ESTORE_BUSY;
        snprintf(c[i].why, sizeof(c[i].why), "sim: the answer was lost");
      }
    }
  }
  o->npend[o->tno] = 0;
  if (b->crash) { /* it dies there: the rest of its call is a ghost's */
    b->crash = 0;
    o->dead = 1;
  }
}

/* An owner's commit in flight waits for its turn to run it
 * (sim_owner.c), or for a settle in its lanes; no committer thread. */
int __wrap_kl__lanes_flight_start(struct kl__lanes *lanes) {
  if (!W || !W->acting)
    return __real_kl__lanes_flight_start(lanes);
  return 0;
}
