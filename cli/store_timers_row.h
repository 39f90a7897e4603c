/* One pending timer as a JSON row: what `keylane store timers --json`
 * lists (cli/store_timers.c) and the console's GET /api/timers serves
 * (cli/console_timers.c). */
#ifndef KEYLANE_CLI_STORE_TIMERS_ROW_H
#define KEYLANE_CLI_STORE_TIMERS_ROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "keylane/event.h"
#include "store/timers.h"

/**
 * The row of the timer @p t of entity @p key (@p key_len bytes) in
 * @p topic's @p partition, read by kl__timers_scan() with its envelope
 * @p env: {"topic", "partition", "key", "key_escaped", "id",
 * "id_escaped", "type", "type_escaped", "due" (UTC, ISO 8601), "due_ms",
 * "offset" (of the record that scheduled it), "due_now" (due by @p now,
 * ms)}. "key", "id" and "type" are exact, or null when they are not UTF-8;
 * the *_escaped ones show the bytes as a terminal may (kl__escape()). An
 * envelope that does not decode has null "id" and "type" and sets
 * *@p malformed (its owner dead-letters it when it fires). With
 * @p payload, also "payload" (JSON, when it is msgpack) or "payload_b64".
 * @returns a new reference, json_decref()ed by the caller; NULL when out
 *          of memory.
 */
json_t *kl__store_timers_row(kl_decoder_t *decoder, const char *topic,
                             int32_t partition, const kl__timer_t *t,
                             const void *key, size_t key_len, const void *env,
                             size_t env_len, int64_t now, bool payload,
                             bool *malformed);

#endif
