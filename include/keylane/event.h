/**
 * @file event.h
 * @brief The event and its wire envelope.
 *
 * On Kafka an event is a message whose key is the entity key and whose value
 * is a msgpack map, the envelope:
 *
 * | field | type            | limit                          |
 * |-------|-----------------|--------------------------------|
 * | v     | positive int    | 1, or 2 with nb                |
 * | id    | str             | 1..KL_ID_MAX bytes             |
 * | t     | str             | 1..KL_TYPE_MAX bytes           |
 * | ts    | int             | producer time, ms since epoch  |
 * | p     | bin             | 0..KL_PAYLOAD_MAX bytes        |
 * | h     | map str => str  | optional, <= KL_HEADERS_MAX    |
 * | nb    | positive int    | optional (version 2): the time |
 * |       |                 | before which the event is not  |
 * |       |                 | applied, ms since the epoch    |
 *
 * The message key is 1..KL_KEY_MAX bytes. Unknown fields are an error, so
 * that a newer producer's envelope is never half-understood.
 *
 * Size: a Kafka broker takes a record batch of at most message.max.bytes
 * (KL_MESSAGE_MAX by default), so kl_publish() refuses an event whose key
 * and envelope together exceed KL_RECORD_MAX. KL_PAYLOAD_MAX is chosen so
 * that an event with every field but the headers at its limit still fits;
 * headers count against the same total. The decoder accepts any envelope
 * up to KL_ENVELOPE_MAX: a producer elsewhere may be allowed more.
 *
 * Ownership: a kl_event_t is a view; it owns none of the bytes it points at.
 */
#ifndef KEYLANE_EVENT_H
#define KEYLANE_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The highest envelope version this build reads. It writes version 1,
 *  which every keylane reads, unless the event has a not_before: version 2
 *  carries "nb", so that a worker too old for timers refuses the event (a
 *  dead letter of reason decode) rather than apply it early. */
#define KL_ENVELOPE_VERSION 2
#define KL_KEY_MAX 1024
#define KL_ID_MAX 255
/** The first byte of the ids keylane derives for follow-up events
 *  (kl_txn_emit()): an id a service publishes may not begin with it
 *  (kl_publish() and the HTTP gateway refuse it), and a worker
 *  dead-letters a record whose id begins with it but is no follow-up's
 *  (reason reserved_id), so that no other id can take a follow-up's. */
#define KL_ID_RESERVED '~'
#define KL_TYPE_MAX 255
/** Types beginning with it are kept for keylane's own: kl_publish()
 *  refuses them, and a worker dead-letters a record of one (reason
 *  reserved_id). */
#define KL_TYPE_RESERVED '~'
/** Kafka's default message.max.bytes: the largest record batch a broker
 * (and a topic, as max.message.bytes) accepts. keylane's producers set it
 * as their own limit unless kafka.message.max.bytes says otherwise. */
#define KL_MESSAGE_MAX 1048588
/** The largest key + envelope of one record: KL_MESSAGE_MAX less a record
 * batch's framing (61 bytes of batch header, under 40 of record header). */
#define KL_RECORD_MAX (KL_MESSAGE_MAX - 128)
/** 1022 KiB: with the largest key, id and type, under KL_RECORD_MAX. */
#define KL_PAYLOAD_MAX (1022 * 1024)
#define KL_HEADERS_MAX 64
#define KL_HEADER_NAME_MAX 255
#define KL_HEADER_VALUE_MAX 4096
/** The largest envelope a decoder accepts: all fields at their limits. */
#define KL_ENVELOPE_MAX                                                        \
  (KL_PAYLOAD_MAX +                                                            \
   KL_HEADERS_MAX * (KL_HEADER_NAME_MAX + KL_HEADER_VALUE_MAX + 10) + 1024)

typedef struct kl_header {
  const char *name;
  size_t name_len;
  const char *value;
  size_t value_len;
} kl_header_t;

typedef struct kl_event {
  const void *key; /**< entity key, the Kafka message key */
  size_t key_len;
  const char *id; /**< idempotency key; NULL/0 lets the producer make one */
  size_t id_len;
  const char *type; /**< event type, e.g. "credit" */
  size_t type_len;
  int64_t ts; /**< producer time in ms; 0 lets the producer stamp it */
  const void *payload;
  size_t payload_len;
  const kl_header_t *headers; /**< optional; NULL when header_count is 0 */
  size_t header_count;
  /** ms since the Unix epoch before which the event is not applied: the
   *  worker keeps it as a timer of its key and applies it, in the key's
   *  order, once the time has come. 0: apply it when read. */
  int64_t not_before;
} kl_event_t;

/**
 * Checks every field of @p event against the limits above.
 * @returns KL_OK or the KL_EDECODE_* code naming the first problem, with a
 *          detail in kl_err_detail(). An empty id is accepted here only when
 *          @p id_optional is nonzero (the producer fills it in). A
 *          "traceparent" header that is not a valid W3C traceparent, or a
 *          "tracestate" that kl_tracestate_valid() refuses, is
 *          KL_EDECODE_TYPE. (The decoder does not check them: a worker
 *          passes on what another producer wrote and logs no trace for an
 *          invalid one.)
 */
KL_EXPORT kl_err_t kl_event_validate(const kl_event_t *event, int id_optional);

/**
 * Encodes the envelope of @p event (its key is not part of it).
 *
 * @param out      receives a malloc()ed buffer the caller frees with free().
 * @param out_len  receives its length.
 * @returns KL_OK; an invalid event (see kl_event_validate, id required) or
 *          KL_ENOMEM, in which case *out is untouched.
 */
KL_EXPORT kl_err_t kl_event_encode(const kl_event_t *event, void **out,
                                   size_t *out_len);

typedef struct kl_decoder kl_decoder_t;

/** @returns a decoder, reusable for any number of events, or NULL (ENOMEM). */
KL_EXPORT kl_decoder_t *kl_decoder_new(void);

/** Frees @p decoder; accepts NULL. */
KL_EXPORT void kl_decoder_destroy(kl_decoder_t *decoder);

/**
 * Decodes a Kafka message (@p key, @p value) into @p event, checking every
 * field against its limit. Never reads outside the given bytes.
 *
 * @returns KL_OK or one KL_EDECODE_* code per kind of malformed input, with
 *          the field named in kl_err_detail().
 * @remark  The event borrows from @p key, @p value and @p decoder: it is
 *          valid until either buffer is freed or the decoder is used again.
 */
KL_EXPORT kl_err_t kl_event_decode(kl_decoder_t *decoder, const void *key,
                                   size_t key_len, const void *value,
                                   size_t value_len, kl_event_t *event);

/**
 * @name Trace context
 * A W3C trace context (https://www.w3.org/TR/trace-context/) travels in
 * the event's headers under these names, as it would in HTTP: the
 * gateway copies the request's headers of the same names there, a caller
 * of kl_publish() adds them to kl_event_t.headers. A handler reads them
 * with kl_event_header() and starts its span as a child of the parent id,
 * with the OpenTelemetry messaging attributes (see README "Trace context").
 * @{
 */
#define KL_TRACEPARENT "traceparent"
#define KL_TRACESTATE "tracestate"
/** The longest tracestate accepted (W3C: 32 members, 512 characters). */
#define KL_TRACESTATE_MAX 512
/** @} */

/**
 * @returns 1 when @p value (@p len bytes) is a valid W3C traceparent:
 *          "VV-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lower
 *          case hex, neither id all zeros, version not ff, and version 00
 *          exactly 55 characters long (a later version may append
 *          "-..."); else 0.
 */
KL_EXPORT int kl_traceparent_valid(const char *value, size_t len);

/**
 * @returns 1 when @p value is a tracestate keylane carries: at most
 *          KL_TRACESTATE_MAX printable ASCII characters; else 0.
 */
KL_EXPORT int kl_tracestate_valid(const char *value, size_t len);

/**
 * @returns the header of @p event named exactly @p name (e.g.
 *          KL_TRACEPARENT), or NULL. Borrowed from @p event.
 */
KL_EXPORT const kl_header_t *kl_event_header(const kl_event_t *event,
                                             const char *name);

/**
 * Writes a new time-ordered idempotency key (UUIDv7 text, 36 chars) and a
 * terminating NUL into @p out.
 */
KL_EXPORT void kl_event_make_id(char out[37]);

/**
 * @name Routing
 * An event's partition is a function of its key alone, the one the Java
 * client's default partitioner computes, so that every producer, in any
 * language, sends a key to the partition whose owner applies it.
 * @{
 */

/**
 * @returns (murmur2(key) & 0x7fffffff) % partitions, the partition the Java
 *          client's default partitioner picks for a non-empty key; -1 when
 *          @p partitions < 1.
 */
KL_EXPORT int32_t kl_partition(const void *key, size_t len, int32_t partitions);

/** Kafka's murmur2 (seed 0x9747b28c), as org.apache.kafka.common.utils.Utils.
 */
KL_EXPORT uint32_t kl_murmur2(const void *key, size_t len);
/** @} */

#ifdef __cplusplus
}
#endif
#endif
