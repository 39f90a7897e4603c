/* One pending timer as JSON (cli/store_timers_row.h). */
#include "cli/store_timers_row.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/json_msgpack.h"
#include "common/strbuf.h"

/* @p len bytes (a key, an id or a type: KL_KEY_MAX at most) as text safe
 * for a terminal, one-to-one (kl__escape()). */
static json_t *timers_row_escaped(const void *s, size_t len) {
  char shown[KL__ESCAPED_SIZE(KL_KEY_MAX)];
  return json_string(kl__escape(shown, sizeof(shown), s, len));
}

static void timers_row_iso(int64_t ms, char *buf, size_t size) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  char day[32];
  gmtime_r(&t, &tm);
  strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, size, "%s.%03dZ", day, (int)(ms % 1000));
}

/* "payload" as JSON when it is msgpack JSON can say, else "payload_b64". */
static int timers_row_payload(json_t *row, const kl_event_t *ev) {
  json_t *payload = NULL;
  if (ev->payload_len &&
      kl__msgpack_to_json(ev->payload, ev->payload_len, &payload) == KL_OK)
    return json_object_set_new(row, "payload", payload);
  char *b64 = malloc(kl__base64_encoded_len(ev->payload_len) + 1);
  if (!b64)
    return -1;
  kl__base64_encode(ev->payload, ev->payload_len, b64);
  int rc = json_object_set_new(row, "payload_b64", json_string(b64));
  free(b64);
  return rc;
}

json_t *kl__store_timers_row(kl_decoder_t *decoder, const char *topic,
                             int32_t partition, const kl__timer_t *t,
                             const void *key, size_t key_len, const void *env,
                             size_t env_len, int64_t now, bool payload,
                             bool *malformed) {
  kl_event_t ev;
  bool decoded = !kl_event_decode(decoder, key, key_len, env, env_len, &ev);
  if (!decoded)
    *malformed = true;
  json_t *k = json_stringn(key, key_len);
  json_t *id = decoded ? json_stringn(ev.id, ev.id_len) : NULL;
  json_t *type = decoded ? json_stringn(ev.type, ev.type_len) : NULL;
  char iso[40];
  timers_row_iso(t->due_ms, iso, sizeof(iso));
  json_t *row = json_pack(
      "{sssIsososososososssIsIsb}", "topic", topic, "partition",
      (json_int_t)partition, "key", k ? k : json_null(), "key_escaped",
      timers_row_escaped(key, key_len), "id", id ? id : json_null(),
      "id_escaped",
      decoded ? timers_row_escaped(ev.id, ev.id_len) : json_null(), "type",
      type ? type : json_null(), "type_escaped",
      decoded ? timers_row_escaped(ev.type, ev.type_len) : json_null(), "due",
      iso, "due_ms", (json_int_t)t->due_ms, "offset", (json_int_t)t->offset,
      "due_now", t->due_ms <= now);
  if (row && payload && decoded && timers_row_payload(row, &ev)) {
    json_decref(row);
    return NULL;
  }
  return row;
}
