/*
 * An event written as a JSON object, the shape every text entry point
 * shares (the HTTP gateway; `keylane publish` reads the same shape):
 *
 *   {"key": STR, "type": STR, "id": STR?, "payload": ANY?,
 *    "payload_b64": STR?, "headers": {STR: STR}?,
 *    "not_before": INT?, "delay": STR?}
 *
 * "payload" is stored as msgpack (common/json_msgpack.h's mapping);
 * "payload_b64" is the raw payload as base64; not both; neither is an
 * empty payload. "not_before" (ms since the Unix epoch, positive) or
 * "delay" (a duration with a unit, common/units.h: "15m", read when the
 * event is, as now + delay; "0" is none), not both, set the event's
 * not_before. "id" may be omitted (the producer makes one) but not
 * empty. "key", "type", "id" and header values are text: a NUL in one is
 * refused (both encodings come here, so one rule holds for both). Unknown
 * fields are refused, so a typo ("paylaod") is an error rather than an event
 * without its payload.
 *
 * Ownership: the event borrows its key, type, id and header strings from
 * the JSON value (valid while it lives); the payload and the header array
 * are the jevent's, freed by kl__jevent_clear(), or, read by
 * kl__jevent_parse_in(), the caller's allocator's.
 */
#ifndef KEYLANE_EVENT_JSON_H
#define KEYLANE_EVENT_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/json_msgpack.h"
#include "keylane/event.h"

typedef struct kl__jevent {
  kl_event_t ev;
  void *payload;        /**< owned; ev.payload points here */
  kl_header_t *headers; /**< owned; ev.headers points here */
} kl__jevent_t;

/**
 * Reads @p root into @p je (which it zeroes first).
 *
 * @param err  receives the problem, naming the field ("\"type\" is
 *             missing"), when the call fails.
 * @returns KL_OK; KL_EINVAL for a bad event (nothing to free); KL_ENOMEM.
 */
kl_err_t kl__jevent_parse(kl__jevent_t *je, const json_t *root, char *err,
                          size_t err_size);

/**
 * kl__jevent_parse() with the payload and the header array written into
 * memory from @p alloc (@p ctx passed to it), which owns them: a caller
 * reading many events frees them all at once, not one by one.
 */
kl_err_t kl__jevent_parse_in(kl__jevent_t *je, const json_t *root,
                             kl__alloc_fn_t *alloc, void *ctx, char *err,
                             size_t err_size);

/**
 * Reads the event at @p rd, a map in a msgpack body that
 * kl__msgpack_check() accepted, by the rules kl__jevent_parse_in() applies
 * to the JSON value kl__msgpack_body_to_json() makes of it, without making
 * that value: the same event, or a refusal; but a "payload" that is a bin
 * is the payload's bytes (JSON has no bin: its JSON form would be stored
 * as the map {"$base64": STR}). The key, type, id, header strings and a
 * bin payload are borrowed from the body; the rest is @p alloc's
 * (required). A payload nests at most KL_JSON_DEPTH_MAX values deep,
 * counted from itself, as a JSON payload does.
 * @returns KL_OK with @p rd past the event; KL_EINVAL with @p err;
 *          KL_ENOMEM.
 */
kl_err_t kl__jevent_parse_mp(kl__jevent_t *je, kl__mp_reader_t *rd,
                             kl__alloc_fn_t *alloc, void *ctx, char *err,
                             size_t err_size);

/** Frees what @p je owns and zeroes it; accepts a zeroed jevent. */
void kl__jevent_clear(kl__jevent_t *je);

#endif
