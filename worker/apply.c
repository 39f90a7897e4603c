#include "worker/apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event/envelope.h"
#include "event/trace.h"
#include "common/bytes.h"
#include "common/hash.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/mutant.h"
#include "common/sqlstate.h"
#include "common/strbuf.h"
#include "keylane/producer.h"
#include "store/store_internal.h"
#include "store/timers.h"
#include "worker/dlq.h"
#include "worker/letters.h"

/* The letter a redriven delayed event's record names (redrive_named()). */
typedef struct kl_letter_ref {
  int64_t offset; /* of the record whose letter it is; -1: none */
  char key[KL__LETTER_KEY_MAX];
  size_t key_len;
} kl_letter_ref_t;

/* One murmur2 of the key per record: ~20 ns for a short key. Asked of a
 * record that decoded, so its key is there and within its limit. */
static int apply_misrouted(const kl__applier_t *a, int32_t partition,
                           const rd_kafka_message_t *m,
                           kl__apply_result_t *res) {
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

/* The value of @p m's last header @p name into *@p v, *@p n; 0, or -1
 * when it has none. */
static int header_get(const rd_kafka_message_t *m, const char *name,
                      const void **v, size_t *n) {
  rd_kafka_headers_t *h = NULL;
  *v = NULL;
  *n = 0;
  /* rd_kafka_message_headers() parses lazily into the message it is
   * given; only this event's run touches it. */
  return rd_kafka_message_headers((rd_kafka_message_t *)m, &h) || !h ||
                 rd_kafka_header_get_last(h, name, v, n) || !*v || !*n
             ? -1
             : 0;
}

/* The offset @p m's header @p name holds (decimal), or -1. */
static int64_t header_offset(const rd_kafka_message_t *m, const char *name) {
  const void *v;
  size_t n;
  if (header_get(m, name, &v, &n) || n > 18)
    return -1;
  int64_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    char c = ((const char *)v)[i];
    if (c < '0' || c > '9')
      return -1;
    offset = offset * 10 + (c - '0');
  }
  return offset;
}

/* The offset a firing record names in its KL__TIMER_HEADER, or -1. */
static int64_t timer_named(const rd_kafka_message_t *m) {
  return header_offset(m, KL__TIMER_HEADER);
}

/* A redriven delayed event published back (kl__dlq_redrive()): the offset
 * of the record it was a letter of, before @p m, with its letter's record
 * key into @p key (KL__LETTER_KEY_MAX bytes) and *@p key_len; -1 when @p m
 * is no such record. */
static int64_t redrive_named(const rd_kafka_message_t *m, char *key,
                             size_t *key_len) {
  int64_t offset = header_offset(m, KL__REDRIVE_HEADER);
  const void *v;
  size_t n, prefix = sizeof(KL__LETTER_KEY_PREFIX) - 1;
  if (offset < 0 || offset >= m->offset ||
      header_get(m, KL__REDRIVE_LETTER_HEADER, &v, &n) ||
      n >= KL__LETTER_KEY_MAX || n <= prefix ||
      memcmp(v, KL__LETTER_KEY_PREFIX, prefix) != 0)
    return -1;
  memcpy(key, v, n);
  *key_len = n;
  return offset;
}

static kl_handler_result_t timer_store_failed(kl_err_t err,
                                              kl__apply_result_t *res) {
  res->store_err = err;
  snprintf(res->why, sizeof(res->why), "store: timer: %s", kl_err_detail());
  return KL_HANDLER_RETRY;
}

/* Whether an id of mark @p mark may still run: never seen, or waiting as a
 * timer (KL__MARK_TIMER), which only its firing record runs. */
static int mark_open(kl_mark_t mark) {
  return mark == KL_MARK_NONE || mark == KL__MARK_TIMER;
}

/* Its first reading (or its redrive's record): the timer of @p offset
 * (@p m's own, or the redriven letter's) and its id's KL__MARK_TIMER in
 * this txn, once the time is checked, with the letter's record when
 * @p letter_key is set. @p from is the time its wait is judged from;
 * @p record_ms its record's. */
static int timer_schedule(const kl__applier_t *a, int32_t partition,
                          kl_txn_t *txn, const rd_kafka_message_t *m,
                          const kl_event_t *event, int64_t offset,
                          const char *letter_key, size_t letter_key_len,
                          int64_t from, int64_t record_ms,
                          kl__apply_result_t *res) {
  kl_err_t err;
  /* the rule kl_publish() keeps (envelope.h says why the bound behind is
   * the retention here), behind judged from the record's time, so that a
   * rebuild decides the same, ahead from @p from */
  if ((err = kl__not_before_check(event, record_ms, 0, a->timer_past_ms,
                                  "store.dedup.retention")) ||
      (err = kl__not_before_check(event, from, a->timer_max_ms, 0, NULL))) {
    res->failed_err = err;
    snprintf(res->why, sizeof(res->why), "decode: %s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  kl__timer_t nt = {event->not_before, offset, 0};
  err = kl__timer_put(txn, a->topic, partition, event->key, event->key_len,
                      event->id, event->id_len, &nt, m->payload, m->len);
  if (err == KL_EINVAL) {
    snprintf(res->why, sizeof(res->why), "timer: %s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  /* a redriven letter is done once it waits again (redrive.h) */
  if (!err && letter_key)
    err = kl__letter_done_put(txn, letter_key, letter_key_len, event);
  if (err)
    return timer_store_failed(err, res);
  res->scheduled++;
  res->scheduled_due = event->not_before;
  return KL_HANDLER_OK;
}

/*
 * A dead-lettered delayed event that an operator redrives (keylane replay
 * --from-dlq): a firing record that failed (it carries KL__TIMER_HEADER)
 * runs now. Any other is published back to its partition
 * (res->redrive_back; nothing is written here), and its owner schedules
 * it from that record as a first reading (apply_timer()), judged by the
 * record's time and the owner's timer.max.delay, so that a rebuild, which
 * reads that record too, schedules it alike (docs/design.md, "Timers").
 * One whose id waits as a timer already is a duplicate.
 * @returns as apply_timer().
 */
static int timer_redrive(const kl__applier_t *a, int32_t partition,
                         kl_txn_t *txn, const rd_kafka_message_t *m,
                         const kl_event_t *event, kl_mark_t mark,
                         const kl__timer_t *t, int found,
                         kl__apply_result_t *res) {
  int64_t here = kl__store_now_ms();
  int firing = timer_named(m) >= 0;
  /* the rule its first reading kept (timer_schedule()), judged now: a
   * time in seconds, or one past by more than the retention, stays a
   * dead letter; a firing record's time passed the rule when it waited */
  kl_err_t err = kl__not_before_check(
      event, here, 0, firing ? 0 : a->timer_past_ms, "store.dedup.retention");
  if (err) {
    res->failed_err = err;
    snprintf(res->why, sizeof(res->why), "decode: %s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  if (!firing && (found || mark == KL__MARK_TIMER)) {
    kl_txn_count_duplicate(txn);
    res->duplicates++;
    return KL_HANDLER_OK;
  }
  if (!firing && mark != KL_MARK_APPLIED && event->not_before > 0) {
    res->redrive_back++;
    return KL_HANDLER_OK;
  }
  if (found &&
      (err = kl__timer_del(txn, a->topic, partition, event->key, event->key_len,
                           event->id, event->id_len, t->due_ms)))
    return timer_store_failed(err, res);
  return -1; /* runs, or is a duplicate of its applied id */
}

/*
 * A delayed event (docs/design.md, "Timers"), or any record of an id that
 * waits as a timer (KL__MARK_TIMER). Its first reading schedules it: a
 * timer and the id's timer mark in this txn. Its firing record (the header
 * names the timer's offset) runs it once due, and takes the timer in the
 * same commit. Anything else of it (a copy while it waits, with or without
 * `nb`, a firing record of a timer gone or of an id settled meanwhile, a
 * copy after a cancel) is a duplicate.
 *
 * "Due" is judged by the record's timestamp, not by this host's clock, so
 * that a rebuild or a replay from the log, at any later time and on any
 * host, decides as the live owner did: the owner stamps a firing record
 * with its clock when it writes it, once due by that clock. A record
 * stamped before the time (a producer that is not keylane) is early, and
 * the timer waits on.
 * @returns -1 when the event runs now (its timer taken, if any); else the
 *          verdict, the event settled here (res says how).
 */
static int apply_timer(const kl__applier_t *a, int32_t partition, kl_txn_t *txn,
                       const rd_kafka_message_t *m, const kl_event_t *event,
                       kl_mark_t mark, const kl_letter_ref_t *back,
                       kl__apply_result_t *res) {
  /* Only the envelope the timer holds fires it: a record that names the
   * timer with other contents is a copy, not the event. */
  kl__timer_t t;
  int fire;
  kl_err_t err =
      kl__timer_find(txn, a->topic, partition, event->key, event->key_len,
                     event->id, event->id_len, timer_named(m),
                     event->not_before, m->payload, m->len, &t, &fire);
  if (err && err != KL_ENOTFOUND)
    return timer_store_failed(err, res);
  int found = !err;
  if (a->redrive)
    return timer_redrive(a, partition, txn, m, event, mark, &t, found, res);
  /* Due by the record's time (the top of the function says why); the
   * wait's length is judged by it too, but never from later than this
   * host's clock, so that a record stamped ahead cannot pass
   * timer.max.delay. */
  int64_t here = kl__store_now_ms(), now = rd_kafka_message_timestamp(m, NULL);
  if (now < 0) /* a record without one: this host's clock */
    now = here;
  int64_t from = now < here ? now : here, record_ms = now;
  if (fire && KL__MUTANT(KL__MUTANT_TIMER_EARLY)) /* test only: mutant.h */
    now = t.due_ms;
  /* its redrive's record: a first reading, also of a dead-lettered id */
  if (back && !found && mark != KL__MARK_TIMER && mark != KL_MARK_APPLIED)
    return timer_schedule(a, partition, txn, m, event, back->offset, back->key,
                          back->key_len, from, record_ms, res);
  int open = mark_open(mark);
  if (fire && (!open || t.due_ms <= now)) {
    /* runs now, or its id was applied or dead-lettered meanwhile: the
     * timer goes */
    if (open && KL__MUTANT(KL__MUTANT_TIMER_TWICE))
      found = 0; /* test only: common/mutant.h */
    if (found && (err = kl__timer_del(txn, a->topic, partition, event->key,
                                      event->key_len, event->id, event->id_len,
                                      t.due_ms)))
      return timer_store_failed(err, res);
    if (open)
      return -1;
  }
  if (fire && open) /* stamped before its time */
    res->timers_early++;
  else if (!found && mark == KL_MARK_NONE && event->not_before > 0 &&
           timer_named(m) < 0 && !back)
    return timer_schedule(a, partition, txn, m, event, m->offset, NULL, 0, from,
                          record_ms, res);
  kl_txn_count_duplicate(txn);
  res->duplicates++;
  return KL_HANDLER_OK;
}

kl_handler_result_t kl__apply_event(const kl__applier_t *a, int32_t partition,
                                    uint64_t epoch, kl_txn_t *txn,
                                    const rd_kafka_message_t *m,
                                    kl_event_t *event,
                                    kl__apply_result_t *res) {
  res->failed_err = KL_OK;
  res->store_err = KL_OK;
  kl_err_t err = kl_event_decode(a->decoder, m->key, m->key_len, m->payload,
                                 m->len, event);
  /* A producer that is not keylane's can write any id: the rule that
   * kl_publish() keeps is kept here again, or a record could take a
   * follow-up's id and have the real one suppressed as its duplicate. */
  if (!err && !KL__MUTANT(KL__MUTANT_RESERVED) &&
      (err = kl__reserved_check(event, 1)))
    res->reserved_id = 1;
  if (err) {
    res->failed_err = err;
    snprintf(res->why, sizeof(res->why), "%s: %s: %s",
             res->reserved_id ? "reserved_id" : "decode", kl_err_name(err),
             kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  /* Routed only once it is a valid event: a record no owner could apply
   * (a key past its limit, no envelope) is a decode letter wherever it
   * arrived, not one to forward to another owner that refuses it too. */
  if (apply_misrouted(a, partition, m, res))
    return KL_HANDLER_FAIL;
  const kl_header_t *trace = kl__trace_parent(event);
  kl__log_trace_set(trace ? trace->value : NULL); /* cleared by the caller */
  kl_mark_t mark;
  const void *done = NULL;
  size_t done_len;
  /* a redriven delayed event's record (kl__dlq_redrive()) has a letter */
  kl_letter_ref_t back = {-1, {0}, 0};
  if (!a->redrive && event->not_before > 0 && timer_named(m) < 0)
    back.offset = redrive_named(m, back.key, &back.key_len);
  const char *letter_key = back.offset >= 0 ? back.key : a->letter_key;
  size_t letter_key_len = back.offset >= 0 ? back.key_len : a->letter_key_len;
  if ((err = kl__txn_seen(txn, event->key, event->key_len, event->id,
                          event->id_len, &mark)) ||
      (letter_key &&
       (err = kl_txn_get(txn, letter_key, letter_key_len, &done, &done_len)) &&
       err != KL_ENOTFOUND)) {
    res->store_err = err;
    snprintf(res->why, sizeof(res->why), "store: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  if (done && !kl__letter_done_by(done, done_len, event->key, event->key_len,
                                  event->id, event->id_len))
    done = NULL;                   /* another event named the letter */
  if (KL__MUTANT(KL__MUTANT_SEEN)) /* test only: common/mutant.h */
    mark = KL_MARK_NONE, done = NULL;
  if (mark == KL__MARK_TIMER && !event->not_before &&
      KL__MUTANT(KL__MUTANT_TIMER_COPY)) /* test only: common/mutant.h */
    mark = KL_MARK_NONE;
  /* A record of an id that waits as a timer goes there too, with or
   * without `nb`: only the timer's firing record runs it. */
  int timed = (event->not_before > 0 || mark == KL__MARK_TIMER) && !done
                  ? apply_timer(a, partition, txn, m, event, mark,
                                back.offset >= 0 ? &back : NULL, res)
                  : -1;
  if (timed >= 0)
    return (kl_handler_result_t)timed;
  if (mark == KL__MARK_TIMER) /* its timer's firing record: it runs */
    mark = KL_MARK_NONE;
  if (done || mark == KL_MARK_APPLIED ||
      (mark != KL_MARK_NONE && !a->redrive)) {
    kl_txn_count_duplicate(txn);
    res->duplicates++;
    return KL_HANDLER_OK;
  }
  kl_fence_t fence = {a->topic, partition, epoch, m->offset};
  kl__txn_source_event(txn, event, &fence); /* its follow-ups' ids */
  kl__txn_set_message_max(txn, a->message_max, a->message_max_src);
  int64_t src_ms = rd_kafka_message_timestamp(m, NULL);
  kl__txn_set_timer_max(txn, a->timer_max_ms, src_ms > 0 ? src_ms : 0);
  kl_handler_result_t r =
      a->dry_run && !a->dry_run_handler
          ? KL_HANDLER_OK /* would run it; still marked, for the range */
          : a->handler(a->handler_opaque, event, &fence, txn, res->why,
                       sizeof(res->why));
  kl__txn_source(txn, NULL, 0, 0);
  if ((int)r == KL__HANDLER_STORE) { /* the store's setup, not the event */
    res->store_err = KL_ESTORE;
    return KL_HANDLER_RETRY;
  }
  if (r != KL_HANDLER_OK)
    return r == KL_HANDLER_RETRY ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
  if ((err = kl_txn_mark(txn, event->key, event->key_len, event->id,
                         event->id_len, KL_MARK_APPLIED)) ||
      (a->letter_key && (err = kl__letter_done_put(
                             txn, a->letter_key, a->letter_key_len, event)))) {
    res->store_err = err;
    snprintf(res->why, sizeof(res->why), "store: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  res->applied++;
  return KL_HANDLER_OK;
}

/* The sids of @p msgs from offset @p from on (store_internal.h), with
 * their unscoped ids while the store may hold such; 0 also when memory is
 * short: kl_txn_seen() then asks one by one. */
static size_t ids_decode(kl__sids_t *s, const kl_store_t *store,
                         rd_kafka_message_t *const *msgs, size_t n,
                         int64_t from) {
  kl_decoder_t *decoder = kl_decoder_new();
  const void **keys = malloc((n ? n : 1) * sizeof(*keys));
  const char **ids = malloc((n ? n : 1) * sizeof(*ids));
  size_t *key_lens = malloc((n ? n : 1) * sizeof(*key_lens));
  size_t *id_lens = malloc((n ? n : 1) * sizeof(*id_lens));
  size_t k = 0;
  memset(s, 0, sizeof(*s));
  for (size_t i = 0; decoder && keys && ids && key_lens && id_lens && i < n;
       i++) {
    const rd_kafka_message_t *m = msgs[i];
    kl_event_t ev;
    if (m->offset < from ||
        kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev))
      continue;
    keys[k] = ev.key, key_lens[k] = ev.key_len; /* borrowed from m */
    ids[k] = ev.id, id_lens[k++] = ev.id_len;
  }
  if (k && kl__sids_build(s, store, keys, key_lens, ids, id_lens, k))
    memset(s, 0, sizeof(*s));
  kl_decoder_destroy(decoder);
  free(keys);
  free(ids);
  free(key_lens);
  free(id_lens);
  return s->n;
}

kl_err_t kl__apply_prefetch(const kl__applier_t *a, kl_txn_t *txn,
                            rd_kafka_message_t *const *msgs, size_t n,
                            int64_t from) {
  if (!n || !kl__store_has_prefetch(a->store))
    return KL_OK;
  kl__sids_t s;
  kl_err_t err =
      ids_decode(&s, a->store, msgs, n, from)
          ? kl__txn_prefetch_sids(txn, (const char *const *)s.sids, s.lens, s.n)
          : KL_OK;
  kl__sids_free(&s);
  return err;
}

kl_err_t kl__apply_begin_ahead(const kl__applier_t *a, int32_t partition,
                               uint64_t epoch, rd_kafka_message_t *const *msgs,
                               size_t n, kl_txn_t **txn) {
  if (!n || !kl__store_has_prefetch(a->store))
    return KL_EINVAL;
  kl__sids_t s;
  kl_err_t err =
      ids_decode(&s, a->store, msgs, n, 0)
          ? kl__store_begin_ahead(a->store, a->topic, partition, epoch,
                                  (const char *const *)s.sids, s.lens, s.n, txn)
          : KL_ENOMEM;
  kl__sids_free(&s);
  return err;
}

size_t kl__apply_ident(kl_decoder_t *decoder, const rd_kafka_message_t *m,
                       char *out) {
  kl_event_t ev;
  if (kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev) ==
      KL_OK)
    return kl__sid_encode(ev.key, ev.key_len, ev.id, ev.id_len, out);
  uint64_t k = kl__fnv1a(m->key, m->key ? m->key_len : 0);
  uint64_t v = kl__fnv1a(m->payload, m->payload ? m->len : 0);
  out[0] = 1;
  kl__put_be(out + 1, k, 8);
  kl__put_be(out + 9, v, 8);
  return 17;
}

const char *kl__apply_ident_text(const char *ident, size_t len, char *out,
                                 size_t size) {
  const void *key;
  const char *id;
  size_t key_len, id_len;
  char k[KL__ESCAPED_SIZE(64)], i[KL__ESCAPED_SIZE(64)];
  if (len && ident[0] == 0 &&
      kl__sid_decode(ident, len, &key, &key_len, &id, &id_len) == 0 && key)
    snprintf(out, size, "key=%s id=%s",
             kl__escape(k, sizeof(k), key, key_len < 64 ? key_len : 64),
             kl__escape(i, sizeof(i), id, id_len < 64 ? id_len : 64));
  else
    snprintf(out, size, "a record that is no keylane event");
  return out;
}

kl_err_t kl__apply_set_last(kl_decoder_t *decoder, kl_txn_t *txn,
                            const rd_kafka_message_t *m) {
  char ident[KL__SID_MAX];
  size_t len = kl__apply_ident(decoder, m, ident);
  return kl__txn_set_last(txn, ident, len);
}

kl_err_t kl__apply_dead_letter(const kl__applier_t *a, int32_t partition,
                               kl_txn_t *txn, const rd_kafka_message_t *m,
                               int *taken) {
  int64_t named = timer_named(m);
  kl_event_t ev;
  kl__timer_t t;
  int same = 0;
  if (taken)
    *taken = 0;
  if (named < 0 || kl_event_decode(a->decoder, m->key, m->key_len, m->payload,
                                   m->len, &ev) != KL_OK)
    return KL_OK;
  kl_err_t err = kl__timer_find(txn, a->topic, partition, ev.key, ev.key_len,
                                ev.id, ev.id_len, named, ev.not_before,
                                m->payload, m->len, &t, &same);
  if (err == KL_ENOTFOUND || (!err && !same) ||
      KL__MUTANT(KL__MUTANT_TIMER_DEAD)) /* test only: common/mutant.h */
    return KL_OK;
  if (!err)
    err = kl__timer_del(txn, a->topic, partition, ev.key, ev.key_len, ev.id,
                        ev.id_len, t.due_ms);
  if (!err && taken)
    *taken = 1;
  return err;
}

/* The identity of the record at @p watermark - 1, when it is among
 * @p msgs, into @p txn: what a new owner compares with the log. */
static kl_err_t set_last(const kl__applier_t *a, kl_txn_t *txn,
                         rd_kafka_message_t *const *msgs, size_t count,
                         int64_t watermark) {
  for (size_t i = count; i-- > 0;)
    if (msgs[i]->offset == watermark - 1)
      return kl__apply_set_last(a->decoder, txn, msgs[i]);
  return KL_OK;
}

void kl__apply_sleep(const kl__applier_t *a, int32_t partition, int ms) {
  while (ms > 0) {
    int step = ms < 100 ? ms : 100;
    kl__sleep_ms(step);
    ms -= step;
    if (a->tick)
      a->tick(a->tick_opaque, partition); /* its verdict: at the next batch */
  }
}

static kl_err_t run_batch(const kl__applier_t *a, int32_t partition,
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
    if (r == KL_HANDLER_RETRY && KL__MUTANT(KL__MUTANT_WATERMARK)) {
      res->next = m->offset + 1; /* test only: common/mutant.h */
      continue;
    }
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
    err = run_batch(a, partition, epoch, txn, msgs, count, res);
  if (err || res->verdict != KL_HANDLER_OK || a->dry_run) {
    kl_store_abort(txn);
    return err;
  }
  if (res->next > watermark &&
      (err = set_last(a, txn, msgs, count, res->next))) {
    kl_store_abort(txn);
    return err;
  }
  if (a->before_commit)
    a->before_commit(a->hook_opaque, a->topic, partition, epoch);
  err = kl_store_commit(txn, res->next);
  res->committed = err == KL_OK;
  return err;
}
