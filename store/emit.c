/*
 * kl_txn_emit() and the outbox's dispatch: a batch's follow-ups are
 * buffered in its kl_txn_t, whatever the backend, and written by the
 * backend's commit (backend.h).
 */
#include <stdlib.h>
#include <string.h>

#include "event/envelope.h"
#include "event/uuid.h"
#include "common/internal.h"
#include "common/mutant.h"
#include "common/topic.h"
#include "keylane/worker.h"
#include "store/outbox_rec.h"
#include "store/backend.h"
#include "store/store_internal.h"

void kl__txn_source_event(kl_txn_t *txn, const kl_event_t *event,
                          const kl_fence_t *fence) {
  kl__txn_source(txn, fence->topic, fence->partition, fence->offset);
  txn->src = event;
}

void kl__txn_source(kl_txn_t *txn, const char *topic, int32_t partition,
                    int64_t offset) {
  txn->src = NULL;
  txn->src_topic = topic;
  txn->src_partition = partition;
  txn->src_offset = offset;
  txn->src_first = txn->emits ? txn->emits->count : 0;
  txn->src_ms = 0;
}

void kl__txn_set_message_max(kl_txn_t *txn, size_t message_max,
                             const char *source) {
  txn->message_max = message_max;
  txn->message_max_src = source;
}

void kl__txn_set_timer_max(kl_txn_t *txn, int64_t max_ms, int64_t src_ms) {
  txn->timer_max_ms = max_ms;
  txn->src_ms = src_ms;
}

void kl__txn_emits_free(kl_txn_t *txn) {
  kl__emits_free(txn->emits);
  txn->emits = NULL;
  free(txn->last);
  txn->last = NULL;
  txn->last_len = 0;
}

kl__emits_t *kl__txn_take_emits(kl_txn_t *txn) {
  kl__emits_t *emits = txn->emits;
  txn->emits = NULL;
  txn->src_first = 0;
  return emits;
}

static kl_err_t txn_emits(kl_txn_t *txn, kl__emits_t **out) {
  if (!txn->emits && !(txn->emits = calloc(1, sizeof(*txn->emits))))
    return kl__err(KL_ENOMEM, "kl_txn_emit: out of memory");
  *out = txn->emits;
  return KL_OK;
}

kl_err_t kl__txn_add_emits(kl_txn_t *txn, const kl__emits_t *emits) {
  kl__emits_t *to = NULL;
  kl_err_t err = txn_emits(txn, &to);
  if (!err && kl__emits_join(to, emits))
    err = kl__err(KL_ENOMEM, "kl_txn_emit: out of memory");
  return err;
}

static kl_err_t emit_check(const kl_txn_t *txn, const char *topic) {
  if (!txn->src_topic)
    return kl__err(KL_EINVAL, "kl_txn_emit: the txn runs no event; emit "
                              "from a handler, whose event's place in the "
                              "log the follow-up's id derives from");
  if (!txn->store->ops->outbox_list && txn->store->ops->commit)
    return kl__err(KL_EINVAL, "kl_txn_emit: the %s store has no outbox",
                   txn->store->ops->name);
  size_t have = txn->emits ? txn->emits->count - txn->src_first : 0;
  if (have >= KL__EMIT_MAX)
    return kl__err(KL_EINVAL,
                   "kl_txn_emit: the event emitted %zu follow-ups "
                   "already, at most %d are allowed: split the "
                   "work into more events",
                   have, KL__EMIT_MAX);
  if (!topic || !*topic)
    return KL_OK; /* the event's own */
  const char *why = kl__topic_reserved(topic);
  if (kl__topic_check(topic, strlen(topic)))
    return kl__err(KL_EINVAL, "kl_txn_emit: %s", kl_err_detail());
  if (why)
    return kl__err(KL_EINVAL,
                   "kl_txn_emit: topic \"%s\" is %s: a handler may not emit "
                   "to it",
                   topic, why);
  return KL_OK;
}

/* The source event's W3C trace context goes on with its follow-ups; a
 * malformed one (another producer's) stays behind, as kl_publish() would
 * refuse it. */
static void emit_trace(const kl_event_t *src, kl__outbox_rec_t *rec) {
  const kl_header_t *tp = src ? kl_event_header(src, KL_TRACEPARENT) : NULL;
  if (tp &&
      (tp->value_len > 255 || !kl_traceparent_valid(tp->value, tp->value_len)))
    tp = NULL;
  const kl_header_t *ts = tp ? kl_event_header(src, KL_TRACESTATE) : NULL;
  if (ts && !kl_tracestate_valid(ts->value, ts->value_len))
    ts = NULL;
  size_t n = 0;
  if (tp)
    rec->trace[n++] = *tp;
  if (ts)
    rec->trace[n++] = *ts;
  rec->event.headers = n ? rec->trace : NULL;
  rec->event.header_count = n;
}

/* The caller's options: the @c size bytes it knows of, the rest zero. */
static kl_err_t emit_opts(const kl_emit_opts_t *opts, kl_emit_opts_t *out) {
  *out = (kl_emit_opts_t){0};
  if (!opts)
    return KL_OK;
  if (!opts->size)
    return kl__err(KL_EINVAL, "kl_txn_emit_opts: opts->size is 0: set it to "
                              "sizeof(kl_emit_opts_t)");
  memcpy(out, opts, opts->size < sizeof(*out) ? opts->size : sizeof(*out));
  out->size = sizeof(*out);
  return KL_OK;
}

/* A follow-up's delivery time, under the rule kl_publish() and the worker
 * keep (kl__not_before_check()), judged from its source record's time, as
 * the worker judges a delayed event, so that a rebuild decides as the live
 * owner did; or from now, when that is earlier, by which the follow-up is
 * judged again when it is published. Behind by timer.max.delay, the bound
 * the outbox's publish keeps and the worker's (store.dedup.retention, never
 * less) takes: a time the outbox would refuse fails the event here, with
 * the reason, instead of committing a follow-up that ends as a dead letter.
 * A follow-up late by its source's lag still runs at once. */
static kl_err_t emit_not_before(const kl_txn_t *txn, const kl_event_t *e) {
  int64_t now = kl__now_ms();
  int64_t at = txn->src_ms > 0 && txn->src_ms < now ? txn->src_ms : now;
  return kl__not_before_check(e, at, txn->timer_max_ms, txn->timer_max_ms,
                              "timer.max.delay");
}

kl_err_t kl_txn_emit(kl_txn_t *txn, const char *topic, const void *key,
                     size_t key_len, const char *type, const void *payload,
                     size_t payload_len) {
  return kl_txn_emit_opts(txn, topic, key, key_len, type, payload, payload_len,
                          NULL);
}

kl_err_t kl_txn_emit_opts(kl_txn_t *txn, const char *topic, const void *key,
                          size_t key_len, const char *type, const void *payload,
                          size_t payload_len, const kl_emit_opts_t *opts) {
  kl_emit_opts_t o;
  if (!txn || !type)
    return kl__err(KL_EINVAL, "kl_txn_emit: txn and type are required");
  kl_err_t err = emit_opts(opts, &o);
  if (!err)
    err = emit_check(txn, topic);
  if (err)
    return err;
  unsigned index =
      (unsigned)(txn->emits ? txn->emits->count - txn->src_first : 0);
  char id[KL_ID_MAX + 1];
  kl__outbox_rec_t rec = {.topic = topic ? topic : "",
                          .topic_len = topic ? strlen(topic) : 0};
  rec.event = (kl_event_t){.key = key,
                           .key_len = key_len,
                           .id = id,
                           .type = type,
                           .type_len = strlen(type),
                           .ts = kl__now_ms(),
                           .payload = payload,
                           .payload_len = payload_len,
                           .not_before = o.not_before};
  if (index == 0) /* one nonce per run of an event: emit_id.h */
    txn->src_nonce = kl__uuid_random64();
  kl__emit_src_t at = {txn->src_topic,
                       strlen(txn->src_topic),
                       txn->src_partition,
                       txn->src_offset,
                       index,
                       txn->src_nonce,
                       !KL__MUTANT(KL__MUTANT_NONCE)};
  if (!(rec.event.id_len = kl__emit_id(&at, id)))
    return kl__err(KL_EINVAL,
                   "kl_txn_emit: the source topic's name is %zu bytes; a "
                   "follow-up's id holds it, so topics whose handlers emit "
                   "may have at most %d",
                   at.topic_len, KL__EMIT_TOPIC_MAX);
  emit_trace(txn->src, &rec);
  /* Everything the published record carries, the source's trace context
   * included, under the worker's producer and topic limits
   * (kl__txn_set_message_max()): what fits here is never refused by
   * kl_publish() or the producer later, where it could only wait in the
   * outbox for an operator. */
  if ((err = kl_event_validate(&rec.event, 0)) ||
      (err = emit_not_before(txn, &rec.event)) ||
      (err = kl__record_check_max(&rec.event, kl__envelope_size(&rec.event),
                                  txn->message_max, txn->message_max_src)))
    return kl__err(err, "kl_txn_emit: %s", kl_err_detail());
  kl__emits_t *emits = NULL;
  if ((err = txn_emits(txn, &emits)))
    return err;
  if (kl__emits_add(emits, &rec))
    return kl__err(KL_ENOMEM, "kl_txn_emit: out of memory");
  return KL_OK;
}

kl_err_t kl__store_outbox_list(kl_store_t *store, const char *topic,
                               int32_t partition, uint64_t after, size_t max,
                               kl__outbox_cb_t *cb, void *opaque) {
  kl_err_t err = kl__store_check_tp("kl__store_outbox_list", topic, partition);
  if (err || !store || !cb)
    return err ? err
               : kl__err(KL_EINVAL, "kl__store_outbox_list: store and "
                                    "cb are required");
  if (!store->ops->outbox_list)
    return kl__err(KL_EINVAL, "the %s store has no outbox in this build",
                   store->ops->name);
  return store->ops->outbox_list(store, topic, partition, after, max, cb,
                                 opaque);
}

kl_err_t kl__store_outbox_del(kl_store_t *store, const char *topic,
                              const kl__outbox_ack_t *acks, size_t n) {
  kl_err_t err = kl__store_check_tp("kl__store_outbox_del", topic, 0);
  for (size_t i = 0; !err && i < n; i++)
    err = kl__store_check_tp("kl__store_outbox_del", topic, acks[i].partition);
  if (err || !store || (!acks && n))
    return err ? err
               : kl__err(KL_EINVAL, "kl__store_outbox_del: store and acks "
                                    "are required");
  if (!store->ops->outbox_del)
    return kl__err(KL_EINVAL, "the %s store has no outbox in this build",
                   store->ops->name);
  return n ? store->ops->outbox_del(store, topic, acks, n) : KL_OK;
}

/* Follow-ups that a store without an outbox would drop: refused whole. */
kl_err_t kl__store_commit_outboxless(kl_txn_t *txn) {
  if (!txn->emits || !txn->emits->count || txn->store->ops->outbox_list)
    return KL_OK;
  kl_err_t err = kl__err(KL_EINVAL,
                         "kl_store_commit: the batch emitted %zu "
                         "follow-ups and the %s store has no "
                         "outbox; nothing was applied",
                         txn->emits->count, txn->store->ops->name);
  kl_store_abort(txn);
  return err;
}
