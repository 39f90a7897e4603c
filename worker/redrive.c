/* Dead-letter redrive (see redrive.h for the rules it keeps). */
#include "worker/redrive.h"
#include "worker/checks.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka_pos.h"
#include "common/strbuf.h"
#include "keylane/producer.h"
#include "worker/apply.h"
#include "worker/dlq.h"
#include "store/store_internal.h"

#define KL_REDRIVE_ATTEMPTS 5
#define KL_REPUBLISH_TIMEOUT_MS 30000

struct kl__redrive {
  kl__redrive_opts_t opts;
  char topic[KL__LETTER_TOPIC_MAX + 1];
  kl__letters_t letters;
  kl__redriven_t *results;
  kl__replay_part_t *taken;
  size_t ntaken, taken_cap;
  kl__applier_t applier;
  char letter_key[KL__LETTER_KEY_MAX]; /* the letter being redriven's */
  kl__dlq_t *sender;  /* misrouted letters: re-published with it */
  int32_t partitions; /* the origin topic's count; 0: not read yet */
  int acked;          /* the sender's last ack: 1 ok, -1 failed */
  char ack_error[256];
  const kl__replay_part_t *holding; /* the partition taken now, or NULL */
  int64_t beat_period_ns;           /* kl__beat_period_ns() of opts.conf */
  int64_t beat_ns;                  /* when it last beat */
  int owner_checked; /* the store's recorded owner is this cluster's */
};

const char *kl__outcome_name(kl__outcome_t outcome) {
  static const char *const names[] = {
      "filtered", "applied", "duplicate", "failed",      "pending",
      "fenced",   "error",   "stopped",   "republished", "scheduled"};
  return outcome <= KL__OUT_SCHEDULED ? names[outcome] : "?";
}

/* The applier's tick (see replay.c's): the partition redrive holds beats
 * once a beat period has passed, so that letters that keep failing, which
 * commit nothing, do not look like a redrive that went quiet.
 * @returns KL_EFENCED when a newer owner holds it. */
static kl_err_t redrive_tick(void *opaque, int32_t partition) {
  kl__redrive_t *r = opaque;
  int64_t now = kl__mono_ns();
  const kl__replay_part_t *part = r->holding;
  if (r->opts.dry_run || !part || part->partition != partition ||
      now - r->beat_ns < r->beat_period_ns)
    return KL_OK;
  r->beat_ns = now;
  kl__beat_t beat = {partition, part->epoch, KL_OK};
  kl_err_t err = kl__store_beat(r->opts.store, r->topic, &beat, 1);
  if (err || !beat.err)
    return KL_OK; /* a store that is down fails the commit as well */
  return kl__err(KL_EFENCED,
                 "fenced: partition %" PRId32 " of %s has an "
                 "owner newer than this redrive's epoch %" PRIu64
                 ", which refused its heartbeat",
                 partition, r->topic, part->epoch);
}

static kl_err_t redrive_check(kl__redrive_t *r) {
  const kl__redrive_opts_t *o = &r->opts;
  if (!o->conf || !o->dlq_topic || !*o->dlq_topic || !o->store || !o->handler)
    return kl__err(KL_EINVAL, "kl__redrive_run: conf, dlq_topic, store and "
                              "handler are required");
  kl_err_t err = kl__conf_timer_check(o->conf); /* as a worker's start */
  if (err)
    return err;
  size_t len = strlen(o->dlq_topic);
  if (o->topic)
    snprintf(r->topic, sizeof(r->topic), "%s", o->topic);
  else if (len > 4 && strcmp(o->dlq_topic + len - 4, ".dlq") == 0)
    snprintf(r->topic, sizeof(r->topic), "%.*s", (int)(len - 4), o->dlq_topic);
  else
    return kl__err(KL_EINVAL,
                   "dead-letter topic %s does not end in .dlq: "
                   "name the origin topic with -t TOPIC",
                   o->dlq_topic);
  return KL_OK;
}

/* Which letters were asked for; the others are filtered out. */
static void redrive_select(kl__redrive_t *r) {
  kl_decoder_t *decoder = r->applier.decoder;
  for (size_t i = 0; i < r->letters.n; i++) {
    const kl__letter_t *l = &r->letters.v[i];
    kl__redriven_t *out = &r->results[i];
    out->letter = l;
    kl_event_t ev;
    if (kl_event_decode(decoder, l->msg->key, l->msg->key_len, l->msg->payload,
                        l->msg->len, &ev) == KL_OK)
      snprintf(out->id, sizeof(out->id), "%.*s", (int)ev.id_len, ev.id);
    const char *key = r->opts.key;
    if (!l->topic[0]) {
      out->outcome = KL__OUT_ERROR;
      snprintf(out->why, sizeof(out->why),
               "not a keylane dead letter: it has no keylane.dlq.topic, "
               ".partition and .offset headers");
    } else if (strcmp(l->topic, r->topic) != 0 ||
               (r->opts.reason && strcmp(l->reason, r->opts.reason) != 0) ||
               (key && (l->msg->key_len != strlen(key) ||
                        memcmp(l->msg->key, key, l->msg->key_len) != 0))) {
      out->outcome = KL__OUT_FILTERED;
    } else if (l->truncated[0]) {
      out->outcome = KL__OUT_ERROR;
      snprintf(out->why, sizeof(out->why),
               "cut short by an older keylane (keylane.dlq.truncated): "
               "%zu bytes of a %" PRId64 "-byte record, not the event, so "
               "it is not redriven; the whole record is at %.200s "
               "partition %d offset %" PRId64 " while its retention lasts "
               "(a follow-up's is not): replay it from there, or settle "
               "it by hand",
               l->msg->len, l->original_size, l->topic, (int)l->partition,
               l->offset);
    } else {
      out->outcome = KL__OUT_STOPPED; /* until it is reached */
    }
  }
}

/* Takes @p partition like any owner (a dry run reads its epoch). */
static kl_err_t redrive_take(kl__redrive_t *r, int32_t partition,
                             kl__replay_part_t *part) {
  kl_partition_state_t st;
  memset(part, 0, sizeof(*part));
  part->partition = partition;
  /* Its letters' cluster must be the one the store belongs to, or a
   * letter of another cluster's log would be applied and the fleet
   * fenced. */
  if (!r->opts.dry_run && !r->owner_checked) {
    kl_err_t err = kl__checks_hand_owner(r->letters.rk, r->opts.store, r->topic,
                                         NULL, 10000, "redrive");
    if (err)
      return err;
    r->owner_checked = 1;
  }
  kl_err_t err =
      r->opts.dry_run
          ? kl_store_partition(r->opts.store, r->topic, partition, &st)
          : kl_store_acquire(r->opts.store, r->topic, partition, &st);
  if (err)
    return err;
  part->epoch = st.epoch;
  part->previous_epoch = r->opts.dry_run ? 0 : st.epoch - 1;
  part->watermark_before = part->watermark = st.watermark;
  if (part->previous_epoch > 0) {
    kl__replay_part_t *taken =
        kl__grow(r->taken, &r->taken_cap, r->ntaken, sizeof(*taken), 8);
    if (taken) {
      r->taken = taken;
      r->taken[r->ntaken++] = *part;
    }
  }
  return KL_OK;
}

static void redrive_back(kl__redrive_t *r, kl__redriven_t *out);

/* One letter, as a batch of its own at its origin offset, so that the
 * commit leaves the watermark (already past it) where it is. */
static void redrive_one(kl__redrive_t *r, kl__replay_part_t *part,
                        kl__redriven_t *out) {
  const kl__letter_t *l = out->letter;
  out->epoch = part->epoch;
  if (part->epoch == 0 || l->offset >= part->watermark) {
    out->outcome = KL__OUT_PENDING;
    snprintf(out->why, sizeof(out->why),
             "origin offset %" PRId64 " is not below partition %" PRId32
             "'s watermark %" PRId64 ": its owner has not recorded the dead "
             "letter yet; redrive it once the watermark has passed it",
             l->offset, l->partition, part->watermark);
    return;
  }
  rd_kafka_message_t *m = l->msg;
  m->partition = l->partition;
  m->offset = l->offset;
  r->applier.letter_key = r->letter_key;
  r->applier.letter_key_len =
      kl__letter_key(r->opts.dlq_topic, l, r->letter_key);
  int backoff_ms = 100;
  for (int attempt = 1;; attempt++) {
    kl__apply_result_t res;
    kl_err_t err = kl__apply_batch(&r->applier, l->partition, part->epoch,
                                   l->offset, &m, 1, &res);
    kl_partition_state_t st;
    if (!err && res.verdict == KL_HANDLER_OK && res.redrive_back) {
      redrive_back(r, out);
      return;
    }
    if (!err && res.verdict == KL_HANDLER_OK) {
      out->outcome = res.applied     ? KL__OUT_APPLIED
                     : res.scheduled ? KL__OUT_SCHEDULED
                                     : KL__OUT_DUPLICATE;
      return;
    }
    if (err == KL_EFENCED && r->opts.dry_run &&
        kl_store_partition(r->opts.store, r->topic, l->partition, &st) ==
            KL_OK &&
        st.epoch != part->epoch) {
      part->epoch = out->epoch = st.epoch; /* nothing was written: go on */
      continue;
    }
    int retriable =
        err ? kl_err_is_retriable(err) : res.verdict == KL_HANDLER_RETRY;
    if (!retriable || attempt >= KL_REDRIVE_ATTEMPTS) {
      out->outcome = err == KL_EFENCED ? KL__OUT_FENCED
                     : err             ? KL__OUT_ERROR
                                       : KL__OUT_FAILED;
      snprintf(out->why, sizeof(out->why), "%s",
               err ? kl_err_detail() : res.why);
      return;
    }
    kl__apply_sleep(&r->applier, l->partition, backoff_ms);
    backoff_ms *= 2;
  }
}

/* ---- records of letters the dead-letter topic dropped ----------------- */

#define KL_PRUNE_MAX 10000 /* records removed by one redrive at most */

typedef struct kl_prune {
  kl__redrive_t *r;
  size_t prefix_len;
  int32_t partition; /* the dead-letter partition whose low offset is */
  int64_t low;       /* cached here; -1: unknown, keep its records */
  char **keys;
  size_t n, cap;
} kl_prune_t;

static int64_t dlq_low(kl_prune_t *pr, int32_t partition) {
  if (partition != pr->partition) {
    int64_t low = -1, high = -1;
    if (rd_kafka_query_watermark_offsets(pr->r->letters.rk,
                                         pr->r->opts.dlq_topic, partition, &low,
                                         &high, 5000))
      low = -1;
    pr->partition = partition;
    pr->low = low;
  }
  return pr->low;
}

/* Collects the records whose letter is below its partition's log start:
 * no redrive can read that letter again. Records come in key order, so
 * one partition's are together and its low offset is asked once. */
static int prune_cb(void *opaque, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  (void)val;
  (void)val_len;
  kl_prune_t *pr = opaque;
  char buf[KL__LETTER_KEY_MAX];
  int32_t partition;
  int64_t offset;
  if (key_len >= sizeof(buf))
    return 0;
  memcpy(buf, key, key_len);
  buf[key_len] = '\0';
  if (sscanf(buf + pr->prefix_len, "%" SCNd32 "/%" SCNd64, &partition,
             &offset) != 2 ||
      offset >= dlq_low(pr, partition))
    return 0;
  char **keys = kl__grow(pr->keys, &pr->cap, pr->n, sizeof(*keys), 64);
  if (!keys || !(keys[pr->n] = strdup(buf))) {
    pr->keys = keys ? keys : pr->keys;
    return 1;
  }
  pr->keys = keys;
  return ++pr->n >= KL_PRUNE_MAX;
}

/* Removes the records of letters the dead-letter topic no longer holds
 * (letters.h), in a commit of @p part, which this redrive owns; a fenced
 * or failed prune is left to the next redrive. */
static void redrive_prune(kl__redrive_t *r, const kl__replay_part_t *part) {
  if (r->opts.dry_run || part->epoch == 0 || part->watermark < 0 ||
      part->status == KL__REPLAY_FENCED)
    return;
  char prefix[KL__LETTER_KEY_MAX];
  int len = snprintf(prefix, sizeof(prefix), KL__LETTER_KEY_PREFIX "%s/",
                     r->opts.dlq_topic);
  kl_prune_t pr = {r, (size_t)len, -1, -1, NULL, 0, 0};
  kl_txn_t *txn = NULL;
  kl_err_t err =
      kl_store_scan(r->opts.store, prefix, (size_t)len, prune_cb, &pr);
  if (!err && pr.n)
    err = kl_store_begin(r->opts.store, r->topic, part->partition, part->epoch,
                         &txn);
  for (size_t i = 0; !err && txn && i < pr.n; i++)
    err = kl_txn_del(txn, pr.keys[i], strlen(pr.keys[i]));
  if (txn && !err)
    err = kl_store_commit(txn, part->watermark);
  else
    kl_store_abort(txn);
  for (size_t i = 0; i < pr.n; i++)
    free(pr.keys[i]);
  free(pr.keys);
}

/* ---- misrouted and outbox letters: re-published to their key's partition */

static void republish_ack(void *opaque, const kl__dlq_ref_t *ref, kl_err_t err,
                          const char *errstr) {
  (void)ref;
  kl__redrive_t *r = opaque;
  r->acked = err ? -1 : 1;
  snprintf(r->ack_error, sizeof(r->ack_error), "%s", errstr ? errstr : "");
}

/* The sender and the topic's partition count, on the first misrouted
 * letter. */
static kl_err_t republish_ready(kl__redrive_t *r) {
  kl_err_t err = KL_OK;
  if (!r->partitions)
    err = kl__kafka_partition_count(r->letters.rk, r->topic, 10000,
                                    &r->partitions);
  if (!err && !r->sender && !r->opts.dry_run)
    err = kl__dlq_new(r->opts.conf, r->topic, republish_ack, r, &r->sender);
  return err;
}

/* Produces @p l to @p partition and waits for Kafka's acknowledgement;
 * with @p letter_key, as a redriven delayed event (kl__dlq_redrive()). */
static kl_err_t republish_send(kl__redrive_t *r, const kl__letter_t *l,
                               const char *topic, int32_t partition,
                               const char *letter_key) {
  kl__dlq_ref_t ref = {l->partition, l->offset, 0};
  r->acked = 0;
  kl_err_t err =
      letter_key ? kl__dlq_redrive(r->sender, topic, partition, l->msg,
                                   letter_key, &ref)
                 : kl__dlq_forward(r->sender, topic, partition, l->msg, &ref);
  int64_t deadline = kl__mono_ns() + KL_REPUBLISH_TIMEOUT_MS * 1000000LL;
  while (!err && !r->acked && kl__mono_ns() < deadline)
    kl__dlq_poll(r->sender, 100);
  if (!err && r->acked != 1)
    err = kl__err(KL_EKAFKA_TRANSIENT,
                  "Kafka did not acknowledge it within %d ms%s%s; redrive it "
                  "again (its id makes a second copy harmless)",
                  KL_REPUBLISH_TIMEOUT_MS, r->acked ? ": " : "",
                  r->acked ? r->ack_error : "");
  return err;
}

/* A misrouted letter goes to its key's partition of its topic; an outbox
 * letter (a follow-up Kafka refused) to its key's partition of its
 * destination. */
static void redrive_republish(kl__redrive_t *r, kl__redriven_t *out) {
  const kl__letter_t *l = out->letter;
  rd_kafka_message_t *m = l->msg;
  const char *dest = l->destination[0] ? l->destination : r->topic;
  int32_t partitions = 0;
  kl_err_t err = republish_ready(r);
  if (!err && strcmp(dest, r->topic) != 0)
    err = kl__kafka_partition_count(r->letters.rk, dest, 10000, &partitions);
  else
    partitions = r->partitions;
  int32_t to = err ? -1 : kl_partition(m->key, m->key_len, partitions);
  if (!err && !r->opts.dry_run) {
    m->partition = l->partition; /* where it came from, in its headers */
    m->offset = l->offset;
    err = republish_send(r, l, dest, to, NULL);
  }
  out->outcome = err ? KL__OUT_ERROR : KL__OUT_REPUBLISHED;
  if (err)
    snprintf(out->why, sizeof(out->why), "cannot re-publish it: %s",
             kl_err_detail());
  else
    snprintf(out->why, sizeof(out->why),
             "%s to partition %d of %s, its key's (murmur2 of %d "
             "partitions); its owner applies it once",
             r->opts.dry_run ? "would be re-published" : "re-published",
             (int)to, dest, (int)partitions);
}

/* A delayed letter that is no firing record goes back to its partition,
 * with the headers that name its letter: its owner schedules it from that
 * record as a first reading, so that a rebuild, which reads the record
 * too, holds the same timer (docs/design.md, "Timers"). */
static void redrive_back(kl__redrive_t *r, kl__redriven_t *out) {
  const kl__letter_t *l = out->letter;
  kl_err_t err = republish_ready(r);
  if (!err && !r->opts.dry_run)
    err = republish_send(r, l, r->topic, l->partition, r->letter_key);
  out->outcome = err ? KL__OUT_ERROR : KL__OUT_SCHEDULED;
  if (err)
    snprintf(out->why, sizeof(out->why), "cannot publish it back: %s",
             kl_err_detail());
  else
    snprintf(out->why, sizeof(out->why),
             "%s to partition %d of %s with the header " KL__REDRIVE_HEADER
             ": its owner schedules it from there (by its timer.max.delay "
             "and that record's time) and runs it when due, once",
             r->opts.dry_run ? "would be published back" : "published back",
             (int)l->partition, r->topic);
}

static void redrive_walk(kl__redrive_t *r) {
  kl__replay_part_t part = {.partition = -1};
  int have = 0;
  for (size_t i = 0; i < r->letters.n; i++) {
    kl__redriven_t *out = &r->results[i];
    if (out->outcome != KL__OUT_STOPPED)
      continue;
    if (r->opts.stop && *r->opts.stop)
      return;
    if (strcmp(out->letter->reason, "misrouted") == 0 ||
        strcmp(out->letter->reason, "outbox") == 0) {
      redrive_republish(r, out);
      continue;
    }
    int32_t p = out->letter->partition;
    if (!have || part.partition != p) {
      r->holding = NULL;
      kl_err_t err = redrive_take(r, p, &part);
      have = 1;
      r->holding = err ? NULL : &part;
      r->beat_ns = kl__mono_ns();
      if (err) {
        part.epoch = 0;
        part.watermark = -1;
        snprintf(part.why, sizeof(part.why), "%s", kl_err_detail());
      }
    }
    if (part.watermark < 0 || part.status == KL__REPLAY_FENCED) {
      out->outcome = part.watermark < 0 ? KL__OUT_ERROR : KL__OUT_FENCED;
      snprintf(out->why, sizeof(out->why), "%s", part.why);
      continue;
    }
    redrive_one(r, &part, out);
    if (out->outcome == KL__OUT_FENCED) {
      r->holding = NULL;
      part.status = KL__REPLAY_FENCED;
      snprintf(part.why, sizeof(part.why), "%s", out->why);
    }
  }
  if (have)
    redrive_prune(r, &part);
}

/* Redrives the selected letters, one partition after another. */
static void redrive_all(kl__redrive_t *r) {
  redrive_walk(r);
  r->holding = NULL; /* it pointed into the walk's frame */
}

kl_err_t kl__redrive_run(const kl__redrive_opts_t *opts, kl__redrive_t **out) {
  kl__redrive_t *r = calloc(1, sizeof(*r));
  if (!r)
    return KL_ENOMEM;
  r->opts = *opts;
  kl_err_t err = redrive_check(r);
  if (!err && opts->only)
    err = kl__letters_read_at(opts->conf, opts->dlq_topic, opts->only,
                              opts->nonly, opts->stop, &r->letters);
  else if (!err)
    err = kl__letters_read(opts->conf, opts->dlq_topic, &opts->from, &opts->to,
                           opts->stop, &r->letters);
  if (!err && r->letters.n &&
      !(r->results = calloc(r->letters.n, sizeof(*r->results))))
    err = KL_ENOMEM;
  r->applier = (kl__applier_t){.store = opts->store,
                               .topic = r->topic,
                               .handler = opts->handler,
                               .handler_opaque = opts->handler_opaque,
                               .decoder = kl_decoder_new(),
                               .dry_run = opts->dry_run,
                               .dry_run_handler = opts->dry_run_handler,
                               .redrive = 1,
                               .tick = redrive_tick,
                               .tick_opaque = r,
                               .timer_max_ms =
                                   kl__conf_int(opts->conf, "timer.max.delay")};
  r->applier.timer_past_ms = kl__conf_int(opts->conf, "store.dedup.retention");
  r->beat_period_ns = kl__beat_period_ns(opts->conf);
  if (!err && !r->applier.decoder)
    err = KL_ENOMEM;
  if (err) {
    kl__redrive_destroy(r);
    return err;
  }
  redrive_select(r);
  redrive_all(r);
  *out = r;
  return KL_OK;
}

const kl__redriven_t *kl__redrive_results(const kl__redrive_t *r,
                                          size_t *count) {
  *count = r->letters.n;
  return r->results;
}

size_t kl__redrive_count(const kl__redrive_t *r, kl__outcome_t outcome) {
  size_t n = 0;
  for (size_t i = 0; i < r->letters.n; i++)
    n += r->results[i].outcome == outcome;
  return n;
}

const kl__replay_part_t *kl__redrive_taken(const kl__redrive_t *r, size_t *n) {
  *n = r->ntaken;
  return r->taken;
}

const char *kl__redrive_topic(const kl__redrive_t *r) {
  return r->topic;
}

void kl__redrive_destroy(kl__redrive_t *r) {
  if (!r)
    return;
  kl__dlq_destroy(r->sender);
  kl__letters_clear(&r->letters);
  free(r->results);
  free(r->taken);
  kl_decoder_destroy(r->applier.decoder);
  free(r);
}
