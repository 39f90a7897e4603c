/*
 * What the producer needs of the envelope codec beyond event.h: encoding
 * into a buffer it owns, and ids stamped from a clock it has read already.
 * Not installed.
 */
#ifndef KEYLANE_EVENT_ENVELOPE_H
#define KEYLANE_EVENT_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/event.h"

/**
 * @returns how many bytes kl__envelope_write() needs for @p event: the exact
 *          size, but for ts counted at its widest (9 bytes).
 */
size_t kl__envelope_size(const kl_event_t *event);

/**
 * Writes the envelope of @p event into @p buf, which holds at least
 * kl__envelope_size(event) bytes: the bytes kl_event_encode() returns.
 *
 * @param event  validated (kl_event_validate(event, 0)); nothing is checked.
 * @returns the envelope's length.
 */
size_t kl__envelope_write(const kl_event_t *event, uint8_t *buf);

/**
 * Checks that @p event (validated, its id made) fits one Kafka record:
 * key + @p envelope_size bytes of envelope <= KL_RECORD_MAX.
 * @returns KL_OK, or KL_EDECODE_OVERSIZE saying by how much it does not.
 */
kl_err_t kl__record_check(const kl_event_t *event, size_t envelope_size);

/**
 * kl__record_check() under a limit of @p message_max bytes (a producer's
 * message.max.bytes or a topic's max.message.bytes; 0: KL_MESSAGE_MAX),
 * which @p source names in the error ("the worker's
 * kafka.message.max.bytes"; NULL: Kafka's default message.max.bytes).
 */
kl_err_t kl__record_check_max(const kl_event_t *event, size_t envelope_size,
                              size_t message_max, const char *source);

/**
 * kl_event_make_id() with the millisecond clock given: @p now_ms, from
 * kl__now_ms(), so that a caller that stamps ts too reads the clock once.
 */
void kl__event_make_id_at(char out[37], int64_t now_ms);

/**
 * The rule on ids beginning with KL_ID_RESERVED, one for every side: such
 * ids are keylane's own, the ids it derives for follow-ups
 * (kl_txn_emit(), event/emit_id.h), so that no other id can take a
 * follow-up's. kl_publish(), the gateway and `keylane publish` ask it
 * with @p follow_ups 0 (a client may publish none); the outbox's producer
 * and the worker, for every record it consumes, with 1 (only a
 * well-formed follow-up id).
 * @returns KL_OK, or KL_EINVAL naming the id and the rule.
 */
kl_err_t kl__id_check(const char *id, size_t id_len, int follow_ups);

/**
 * kl__id_check() of @p event's id (@p own as its follow_ups), and the rule
 * on its type: a type beginning with KL_TYPE_RESERVED is keylane's, and
 * none is published or applied yet.
 * @returns KL_OK, or KL_EINVAL naming the id or type and the rule.
 */
kl_err_t kl__reserved_check(const kl_event_t *event, int own);

/** 10^11 ms after the Unix epoch, 1973-03-03: a not_before below it is a
 *  time in seconds (10^11 s is the year 5138), never one a producer meant
 *  in milliseconds. */
#define KL__NOT_BEFORE_MIN_MS 100000000000LL

/**
 * The rule on a delayed event's time, one for every side that writes or
 * reads one (docs/envelope.md, "Delayed events"; the Python and Go
 * clients copy it). A not_before (> 0) is refused when it is below
 * KL__NOT_BEFORE_MIN_MS (a time in seconds), more than @p past_ms before
 * @p now_ms (@p past_key names that bound's setting; 0: none), or more
 * than @p max_ms (timer.max.delay; 0: none) after it; both bounds
 * inclusive. The publishers (kl_publish(), so the gateway and `keylane
 * publish` too) bound both sides by timer.max.delay from their clock; the
 * worker judges from the record's time, with store.dedup.retention
 * behind, which is never less, so that it takes what a publisher whose
 * clock ran a little ahead took; kl_txn_emit() bounds both sides by
 * timer.max.delay from its source record's time (what the outbox's
 * publish then takes), so a follow-up late by its source's lag runs at
 * once.
 * @returns KL_OK, or KL_EINVAL naming the bound, by how much (in ms,
 *          exactly), and the fix.
 */
kl_err_t kl__not_before_check(const kl_event_t *event, int64_t now_ms,
                              int64_t max_ms, int64_t past_ms,
                              const char *past_key);

#endif
