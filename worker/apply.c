#include "worker/apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/trace.h"
#include "common/internal.h"
#include "common/log.h"
#include "keylane/producer.h"
#include "worker/store_backend.h"
#include "worker/store_internal.h"

/* One murmur2 of the key per record: ~20 ns for a short key. A record
 * without a key is the decoder's to refuse. */
static int kl_misrouted(const kl__applier_t *a, int32_t partition,
                        const rd_kafka_message_t *m, kl__apply_result_t *res) {
  if (a->partitions <= 0 || !m->key || !m->key_len)
    return 0;
  int32_t want = kl_partition(m->key, m->key_len, a->partitions);
  if (want == partition)
    return 0;
  res->misrouted = 1;
  res->expected_partition = want;
  snprintf(res->why, sizeof(res->why),
           "misrouted: its key routes to partition %d of %d (murmur2, the "
           "Java default partitioner), it arrived on partition %d",
           (int)want, (int)a->partitions, (int)partition);
  return 1;
}

kl_handler_result_t kl__apply_event(const kl__applier_t *a, int32_t partition,
                                    uint64_t epoch, kl_txn_t *txn,
                                    const rd_kafka_message_t *m,
                                    kl_event_t *event,
                                    kl__apply_result_t *res) {
  res->failed_err = KL_OK;
  res->store_err = KL_OK;
  if (kl_misrouted(a, partition, m, res))
    return KL_HANDLER_FAIL;
  kl_err_t err = kl_event_decode(a->decoder, m->key, m->key_len, m->payload,
                                 m->len, event);
  if (err) {
    res->failed_err = err;
    snprintf(res->why, sizeof(res->why), "decode: %s: %s", kl_err_name(err),
             kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  const kl_header_t *trace = kl__trace_parent(event);
  kl__log_trace_set(trace ? trace->value : NULL); /* cleared by the caller */
  kl_mark_t mark;
  const void *done = NULL;
  size_t done_len;
  if ((err = kl_txn_seen(txn, event->id, event->id_len, &mark)) ||
      (a->letter_key &&
       (err = kl_txn_get(txn, a->letter_key, a->letter_key_len, &done,
                         &done_len)) &&
       err != KL_ENOTFOUND)) {
    res->store_err = err;
    snprintf(res->why, sizeof(res->why), "store: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  if (done || mark == KL_MARK_APPLIED ||
      (mark != KL_MARK_NONE && !a->redrive)) {
    kl_txn_count_duplicate(txn);
    res->duplicates++;
    return KL_HANDLER_OK;
  }
  kl_fence_t fence = {a->topic, partition, epoch, m->offset};
  kl__txn_source_event(txn, event); /* its follow-ups' ids */
  kl_handler_result_t r =
      a->dry_run && !a->dry_run_handler
          ? KL_HANDLER_OK /* would run it; still marked, for the range */
          : a->handler(a->handler_opaque, event, &fence, txn, res->why,
                       sizeof(res->why));
  kl__txn_source(txn, NULL, 0);
  if (r != KL_HANDLER_OK)
    return r == KL_HANDLER_RETRY ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
  if ((err = kl_txn_mark(txn, event->id, event->id_len, KL_MARK_APPLIED)) ||
      (a->letter_key &&
       (err = kl_txn_put(txn, a->letter_key, a->letter_key_len, "1", 1)))) {
    res->store_err = err;
    snprintf(res->why, sizeof(res->why), "store: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  res->applied++;
  return KL_HANDLER_OK;
}

/* The decoded ids of @p msgs, copied into @p arena (KL_ID_BYTES each). */
#define KL_ID_BYTES 255
static size_t kl_decode_ids(rd_kafka_message_t *const *msgs, size_t n,
                            int64_t from, char *arena, const char **ids,
                            size_t *lens) {
  kl_decoder_t *decoder = kl_decoder_new();
  size_t k = 0;
  for (size_t i = 0; decoder && i < n; i++) {
    const rd_kafka_message_t *m = msgs[i];
    kl_event_t ev;
    if (m->offset < from ||
        kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev) ||
        !ev.id_len || ev.id_len > KL_ID_BYTES)
      continue;
    ids[k] = memcpy(arena + k * KL_ID_BYTES, ev.id, ev.id_len);
    lens[k++] = ev.id_len;
  }
  kl_decoder_destroy(decoder);
  return k;
}

/* A batch's ids, decoded (kl_decode_ids()). */
typedef struct kl_ids {
  char *arena;
  const char **ids;
  size_t *lens;
  size_t n;
} kl_ids_t;

/* @returns the ids' count (0 also when memory is short: kl_txn_seen() then
 * asks one by one). */
static size_t kl_ids_decode(kl_ids_t *d, rd_kafka_message_t *const *msgs,
                            size_t n, int64_t from) {
  d->arena = malloc(n * KL_ID_BYTES);
  d->ids = malloc(n * sizeof(*d->ids));
  d->lens = malloc(n * sizeof(*d->lens));
  d->n = d->arena && d->ids && d->lens
             ? kl_decode_ids(msgs, n, from, d->arena, d->ids, d->lens)
             : 0;
  return d->n;
}

static void kl_ids_free(kl_ids_t *d) {
  free(d->arena);
  free(d->ids);
  free(d->lens);
}

kl_err_t kl__apply_prefetch(const kl__applier_t *a, kl_txn_t *txn,
                            rd_kafka_message_t *const *msgs, size_t n,
                            int64_t from) {
  if (!n || !kl__store_has_prefetch(a->store))
    return KL_OK;
  kl_ids_t d;
  kl_err_t err = kl_ids_decode(&d, msgs, n, from)
                     ? kl_txn_prefetch(txn, d.ids, d.lens, d.n)
                     : KL_OK;
  kl_ids_free(&d);
  return err;
}

kl_err_t kl__apply_begin_ahead(const kl__applier_t *a, int32_t partition,
                               uint64_t epoch, rd_kafka_message_t *const *msgs,
                               size_t n, kl_txn_t **txn) {
  if (!n || !kl__store_has_prefetch(a->store))
    return KL_EINVAL;
  kl_ids_t d;
  kl_err_t err = kl_ids_decode(&d, msgs, n, 0)
                     ? kl__store_begin_ahead(a->store, a->topic, partition,
                                             epoch, d.ids, d.lens, d.n, txn)
                     : KL_ENOMEM;
  kl_ids_free(&d);
  return err;
}

void kl__apply_sleep(const kl__applier_t *a, int32_t partition, int ms) {
  while (ms > 0) {
    int step = ms < 100 ? ms : 100;
    struct timespec ts = {0, (long)step * 1000000L};
    nanosleep(&ts, NULL);
    ms -= step;
    if (a->tick)
      a->tick(a->tick_opaque, partition); /* its verdict: at the next batch */
  }
}

static kl_err_t kl_run_batch(const kl__applier_t *a, int32_t partition,
                             uint64_t epoch, kl_txn_t *txn,
                             rd_kafka_message_t *const *msgs, size_t count,
                             kl__apply_result_t *res) {
  for (size_t i = 0; i < count; i++) {
    const rd_kafka_message_t *m = msgs[i];
    if (m->offset < res->next) {
      res->redelivered++;
      continue;
    }
    kl_err_t err = a->tick ? a->tick(a->tick_opaque, partition) : KL_OK;
    if (err)
      return err;
    kl_event_t event;
    kl_handler_result_t r =
        kl__apply_event(a, partition, epoch, txn, m, &event, res);
    kl__log_trace_set(NULL);
    if (r != KL_HANDLER_OK) {
      res->verdict = r;
      res->failed_offset = m->offset;
      return KL_OK;
    }
    res->next = m->offset + 1;
  }
  return KL_OK;
}

kl_err_t kl__apply_batch(const kl__applier_t *a, int32_t partition,
                         uint64_t epoch, int64_t watermark,
                         rd_kafka_message_t *const *msgs, size_t count,
                         kl__apply_result_t *res) {
  memset(res, 0, sizeof(*res));
  res->next = watermark;
  res->verdict = KL_HANDLER_OK;
  kl_txn_t *txn;
  kl_err_t err = kl_store_begin(a->store, a->topic, partition, epoch, &txn);
  if (err)
    return err;
  err = kl__apply_prefetch(a, txn, msgs, count, watermark);
  if (!err)
    err = kl_run_batch(a, partition, epoch, txn, msgs, count, res);
  if (err || res->verdict != KL_HANDLER_OK || a->dry_run) {
    kl_store_abort(txn);
    return err;
  }
  if (a->before_commit)
    a->before_commit(a->hook_opaque, a->topic, partition, epoch);
  return kl_store_commit(txn, res->next);
}
