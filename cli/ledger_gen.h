/*
 * A ledger workload: publishes credit/debit events with per-key seq, keeps
 * what every balance must be, re-publishes earlier events with their
 * idempotency key, and verifies a store against it. Used by the demo, the
 * tests, the fault suite and the benchmarks, so all of them check the
 * same thing.
 *
 * Not thread safe: one thread publishes and verifies.
 */
#ifndef KEYLANE_CLI_LEDGER_GEN_H
#define KEYLANE_CLI_LEDGER_GEN_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "keylane/event.h"
#include "keylane/producer.h"
#include "keylane/store.h"

typedef struct kl__ledger_gen kl__ledger_gen_t;

typedef struct kl__ledger_verdict {
  uint64_t keys;             /* keys that were published to */
  uint64_t keys_ok;          /* stored balance and last seq as published */
  uint64_t keys_bad;         /* wrong balance, wrong seq, or an unknown key */
  uint64_t violations;       /* order violations the handler counted */
  uint64_t applied;          /* sum of the partitions' applied counters */
  uint64_t duplicates;       /* sum of their duplicate counters */
  uint64_t caught_up;        /* partitions whose watermark reached the end */
  uint64_t transfers;        /* transfers published (each emits a credit) */
  uint64_t scheduled;        /* of them scheduled (each emits a settle) */
  uint64_t delayed;          /* delayed events published, and settles */
  uint64_t delayed_applied;  /* delayed events the entries count applied */
  uint64_t due_checks;       /* kl__ledger_gen_check_due() looks */
  uint64_t early;            /* keys those found ahead of the clock */
  int64_t held;              /* the sum of the stored holds: 0 once every
                                scheduled transfer settled */
  uint64_t follow_up_copies; /* follow-ups the outbox published more than
                                once (kl__ledger_gen_read_follow_ups()) */
  uint64_t firing_copies;    /* timers' firing records beyond one each */
  uint64_t firing_max;       /* the most firing records one timer had */
  int64_t total;             /* the sum of the stored balances and holds */
  int64_t total_expected;    /* credits less debits published: transfers
                                move money, they never make or lose any */
  int total_ok;              /* total == total_expected: money is conserved */
  int ok;                    /* all of the above as published */
} kl__ledger_verdict_t;

/* Publishes one ledger event: @p type ("credit" or "debit") of @p key
 * (@p key_len bytes) with the payload {"amount": amount, "seq": seq};
 * @p id may be NULL (the producer makes one). */
kl_err_t kl__ledger_gen_send(kl_producer_t *producer, const char *topic,
                             const char *key, size_t key_len, const char *id,
                             const char *type, int64_t amount, int64_t seq,
                             void *opaque);

/** A workload over @p keys keys ("acct-0000"...) and @p partitions. */
kl__ledger_gen_t *kl__ledger_gen_new(int keys, int32_t partitions,
                                     uint64_t seed);
void kl__ledger_gen_destroy(kl__ledger_gen_t *gen);

/** Publishes one new event (30 % debits). */
kl_err_t kl__ledger_gen_publish(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                const char *topic);

/**
 * Publishes one new transfer {"to", "amount", "seq"} from a random key to
 * another: the worker debits the first and emits the credit of the second
 * (kl_txn_emit()). @returns KL_EINVAL with fewer than two keys.
 */
kl_err_t kl__ledger_gen_transfer(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                 const char *topic);

/**
 * Publishes one new credit without a seq, delayed by @p delay_ms (its
 * not_before; a delayed debit or transfer would break the key's seq
 * order). The store's entries count it among their delayed events.
 */
kl_err_t kl__ledger_gen_delayed(kl__ledger_gen_t *gen, kl_producer_t *producer,
                                const char *topic, int64_t delay_ms);

/**
 * Publishes one new scheduled transfer, {"to", "amount", "seq", "at"}
 * with "at" @p delay_ms from now: the worker debits and holds the amount
 * at once and settles it (the credit of "to") once "at" came.
 */
kl_err_t kl__ledger_gen_scheduled(kl__ledger_gen_t *gen,
                                  kl_producer_t *producer, const char *topic,
                                  int64_t delay_ms);

/** Publishes one transfer of @p amount from @p from to @p to. */
kl_err_t kl__ledger_gen_send_transfer(kl_producer_t *producer,
                                      const char *topic, const char *from,
                                      const char *to, const char *id,
                                      int64_t amount, int64_t seq,
                                      void *opaque);

/** Re-publishes a random earlier event unchanged, same idempotency key. */
kl_err_t kl__ledger_gen_republish(kl__ledger_gen_t *gen,
                                  kl_producer_t *producer, const char *topic);

/** The delivery callback to give kl_producer_new(), opaque = gen. */
void kl__ledger_gen_on_delivery(void *gen, const kl_delivery_t *delivery);

uint64_t kl__ledger_gen_published(const kl__ledger_gen_t *gen);
uint64_t kl__ledger_gen_republished(const kl__ledger_gen_t *gen);
uint64_t kl__ledger_gen_transfers(const kl__ledger_gen_t *gen);
uint64_t kl__ledger_gen_acked(const kl__ledger_gen_t *gen);
uint64_t kl__ledger_gen_failed(const kl__ledger_gen_t *gen);
/** The events the store applies for what was published: each event, each
 *  transfer's credit, each scheduled transfer's settle. */
uint64_t kl__ledger_gen_applies(const kl__ledger_gen_t *gen);

/**
 * Checks that no delayed event ran before its time, as the store shows it
 * now: per key, the delayed events its entry counts applied may not be
 * more than those due by the clock read after the store. Call it often
 * while the workers apply; kl__ledger_gen_verify() reports the looks and
 * the keys found ahead (each named on stderr, the first 10).
 */
kl_err_t kl__ledger_gen_check_due(kl__ledger_gen_t *gen, kl_store_t *store,
                                  const char *topic);

/** Offset after the last acknowledged event of @p partition. */
int64_t kl__ledger_gen_end(const kl__ledger_gen_t *gen, int32_t partition);

/**
 * Reads the part of @p topic that @p store applied ([0, watermark) of each
 * partition, through @p bootstrap) and counts the transfers' credits
 * there: an outbox publishes a follow-up again when its worker died
 * between Kafka's acknowledgement and the follow-up's removal, and the
 * next owner skips the copy as a duplicate. It counts the timers' firing
 * records too: one runs each delayed event, any other (written again by
 * an owner that did not read it back, or by a predecessor) is a
 * duplicate. kl__ledger_gen_verify() then expects those copies among the
 * duplicates, and one distinct follow-up per transfer and per settle.
 * Without this call it expects no copy.
 */
kl_err_t kl__ledger_gen_read_follow_ups(kl__ledger_gen_t *gen,
                                        kl_store_t *store,
                                        const char *bootstrap,
                                        const char *topic);

/**
 * Decodes @p m into @p ev with @p decoder and tells whether it is a
 * follow-up, an event kl_txn_emit() made: its id is one kl__emit_id()
 * makes (outbox_rec.h). @p ev borrows from @p m and @p decoder
 * (kl_event_decode()).
 * @returns 1 for a follow-up; 0 when @p m does not decode or is none.
 */
int kl__ledger_gen_decode_follow_up(kl_decoder_t *decoder,
                                    const rd_kafka_message_t *m,
                                    kl_event_t *ev);

/**
 * Compares @p store (topic @p topic) with what was published; fills
 * @p verdict. Call after kl_flush(), once the workers caught up.
 */
kl_err_t kl__ledger_gen_verify(const kl__ledger_gen_t *gen, kl_store_t *store,
                               const char *topic,
                               kl__ledger_verdict_t *verdict);

/** Polls @p store until every partition has applied up to its end offset
 *  (or, with @p any_owner, merely has an owner); 0 when within @p ms. */
int kl__ledger_gen_wait(const kl__ledger_gen_t *gen, kl_store_t *store,
                        const char *topic, int any_owner, int ms);

#endif
