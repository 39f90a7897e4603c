/* An event as a JSON object; see event_json.h. */
#include "event/event_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "event/envelope.h"
#include "common/internal.h"
#include "common/json_msgpack.h"
#include "common/units.h"

static kl_err_t jev_fail(char *err, size_t size, const char *fmt, ...)
    KL__PRINTF(3, 4);
static kl_err_t jev_fail(char *err, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, size, fmt, ap);
  va_end(ap);
  return KL_EINVAL;
}

/* The fields an event may have, in the order of the "unknown field"
 * message. */
enum {
  F_KEY,
  F_ID,
  F_TYPE,
  F_PAYLOAD,
  F_PAYLOAD_B64,
  F_HEADERS,
  F_NOT_BEFORE,
  F_DELAY,
  F__COUNT
};

/* Every field's value (NULL: absent), read in one walk over the object:
 * looking each name up hashed it again, 8 lookups per event. @returns
 * KL_OK, or KL_EINVAL naming the first field that is not one of them. */
static kl_err_t jev_fields(const json_t *root, const json_t *f[F__COUNT],
                           char *err, size_t size) {
  static const struct {
    const char *name;
    size_t len;
  } known[F__COUNT] = {{"key", 3},         {"id", 2},           {"type", 4},
                       {"payload", 7},     {"payload_b64", 11}, {"headers", 7},
                       {"not_before", 10}, {"delay", 5}};
  const char *name;
  size_t len;
  json_t *v;
  memset(f, 0, F__COUNT * sizeof(f[0]));
  json_object_keylen_foreach((json_t *)root, name, len, v) {
    size_t i = 0;
    while (i < F__COUNT &&
           (known[i].len != len || memcmp(name, known[i].name, len) != 0))
      i++;
    if (i == F__COUNT)
      return jev_fail(err, size,
                      "unknown field \"%.64s\"; the fields are "
                      "key, id, type, payload, payload_b64, headers, and "
                      "not_before or delay",
                      name);
    f[i] = v;
  }
  return KL_OK;
}

static kl_err_t jev_str(const json_t *v, const char *name, bool required,
                        size_t max, const char **s, size_t *len, char *err,
                        size_t size) {
  if (!v)
    return required ? jev_fail(err, size, "\"%s\" is missing", name) : KL_OK;
  if (!json_is_string(v))
    return jev_fail(err, size, "\"%s\" must be a string", name);
  *s = json_string_value(v);
  *len = json_string_length(v);
  const char *nul = memchr(*s, '\0', *len);
  if (nul)
    return jev_fail(err, size,
                    "\"%s\" holds a NUL byte at byte %zu: it must be text "
                    "without NUL",
                    name, (size_t)(nul - *s));
  if (*len == 0)
    return jev_fail(err, size, "\"%s\" is empty%s", name,
                    required ? "" : "; omit it to have one made");
  if (*len > max)
    return jev_fail(err, size, "\"%s\" is %zu bytes, the limit is %zu", name,
                    *len, max);
  return KL_OK;
}

/* The memory of what the event keeps besides the JSON value: the caller's
 * arena, or malloc()ed and owned by the jevent. */
typedef struct kl_jev_mem {
  kl__alloc_fn_t *alloc;
  void *ctx;
} kl_jev_mem_t;

static kl_err_t jev_headers(kl__jevent_t *je, const json_t *h,
                            const kl_jev_mem_t *mem, char *err, size_t size) {
  if (!h)
    return KL_OK;
  if (!json_is_object(h))
    return jev_fail(err, size, "\"headers\" must be an object of strings");
  size_t n = json_object_size(h);
  if (n > KL_HEADERS_MAX)
    return jev_fail(err, size,
                    "\"headers\" has %zu entries, the limit is "
                    "%d",
                    n, KL_HEADERS_MAX);
  if (n == 0)
    return KL_OK;
  kl_header_t *headers = mem->alloc
                             ? mem->alloc(mem->ctx, n * sizeof(kl_header_t))
                             : (je->headers = calloc(n, sizeof(kl_header_t)));
  if (!headers)
    return KL_ENOMEM;
  const char *name;
  json_t *v;
  size_t i = 0;
  json_object_foreach((json_t *)h, name, v) {
    if (!json_is_string(v))
      return jev_fail(err, size, "header \"%.64s\" must be a string", name);
    if (memchr(json_string_value(v), '\0', json_string_length(v)))
      return jev_fail(err, size,
                      "header \"%.64s\" holds a NUL byte: it must be text "
                      "without NUL",
                      name);
    headers[i++] = (kl_header_t){name, strlen(name), json_string_value(v),
                                 json_string_length(v)};
  }
  je->ev.headers = headers;
  je->ev.header_count = n;
  return KL_OK;
}

/* {"$base64": STR}: a msgpack bin as kl__msgpack_to_json() writes it. */
static const json_t *jev_bin(const json_t *p) {
  json_t *b64 = json_is_object(p) && json_object_size(p) == 1
                    ? json_object_get(p, "$base64")
                    : NULL;
  return json_is_string(b64) ? b64 : NULL;
}

static kl_err_t jev_payload(kl__jevent_t *je, const json_t *p,
                            const json_t *b64, bool raw_bin,
                            const kl_jev_mem_t *mem, char *err, size_t size) {
  size_t len = 0;
  kl_err_t e = KL_OK;
  if (p && b64)
    return jev_fail(err, size,
                    "both \"payload\" and \"payload_b64\" are "
                    "given: pass one");
  if (b64 && !json_is_string(b64))
    return jev_fail(err, size, "\"payload_b64\" must be a base64 string");
  if (p && raw_bin && jev_bin(p))
    b64 = jev_bin(p);
  const void *payload = NULL;
  if (b64 && mem->alloc)
    e = kl__base64_decode_in(json_string_value(b64), json_string_length(b64),
                             mem->alloc, mem->ctx, &payload, &len);
  else if (b64)
    e = kl__base64_decode(json_string_value(b64), json_string_length(b64),
                          &je->payload, &len);
  else if (p && mem->alloc)
    e = kl__json_to_msgpack_in(p, KL_PAYLOAD_MAX, mem->alloc, mem->ctx,
                               &payload, &len);
  else if (p)
    e = kl__json_to_msgpack(p, KL_PAYLOAD_MAX, &je->payload, &len);
  if (e == KL_ENOMEM)
    return e;
  if (e)
    return jev_fail(err, size, "\"%s\": %s", b64 ? "payload_b64" : "payload",
                    kl_err_detail());
  if (len > KL_PAYLOAD_MAX)
    return jev_fail(err, size, "the payload is %zu bytes, the limit is %d", len,
                    KL_PAYLOAD_MAX);
  je->ev.payload = payload ? payload : je->payload;
  je->ev.payload_len = len;
  return KL_OK;
}

/* "not_before" (ms since the epoch) or "delay" (a duration from now): the
 * time before which the event is not applied; neither is none. A "delay"
 * of 0 is none too, so that the envelope stays version 1, which every
 * worker reads. */
static kl_err_t jev_not_before(kl_event_t *ev, const json_t *nb,
                               const json_t *delay, char *err, size_t size) {
  if (nb && delay)
    return jev_fail(err, size,
                    "both \"not_before\" and \"delay\" are given: pass "
                    "one (\"not_before\" in ms since the Unix epoch, or "
                    "\"delay\" as a duration from now such as \"15m\")");
  if (nb && (!json_is_integer(nb) || json_integer_value(nb) <= 0))
    return jev_fail(err, size,
                    "\"not_before\" must be a positive integer, ms since "
                    "the Unix epoch (such as 1767225600000); omit it to "
                    "have the event applied when it is read");
  if (nb) {
    ev->not_before = (int64_t)json_integer_value(nb);
    return KL_OK;
  }
  if (!delay)
    return KL_OK;
  const char *text = json_is_string(delay) ? json_string_value(delay) : NULL;
  if (!text)
    return jev_fail(err, size,
                    "\"delay\" must be a string, a duration with a unit "
                    "such as \"500ms\", \"30s\", \"15m\", \"2h\" or "
                    "\"3d\"; or give \"not_before\" in ms since the Unix "
                    "epoch");
  if (strlen(text) != json_string_length(delay))
    return jev_fail(err, size,
                    "\"delay\" holds a NUL byte at byte %zu: give a duration "
                    "with a unit and nothing after it, such as \"15m\"",
                    strlen(text));
  int64_t ms, now = kl__now_ms();
  if (kl__units_parse("\"delay\"", text, KL__UNITS_DURATION, 0, INT64_MAX,
                      &ms) != KL_OK)
    return jev_fail(err, size, "%s", kl_err_detail());
  if (ms > INT64_MAX - now)
    return jev_fail(err, size,
                    "\"delay\" \"%.64s\" ends after the year 292 million: "
                    "give a shorter one",
                    text);
  ev->not_before = ms > 0 ? now + ms : 0;
  return KL_OK;
}

kl_err_t kl__jevent_parse(kl__jevent_t *je, const json_t *root, bool raw_bin,
                          char *err, size_t err_size) {
  return kl__jevent_parse_in(je, root, raw_bin, NULL, NULL, err, err_size);
}

kl_err_t kl__jevent_parse_in(kl__jevent_t *je, const json_t *root, bool raw_bin,
                             kl__alloc_fn_t *alloc, void *ctx, char *err,
                             size_t err_size) {
  const kl_jev_mem_t mem = {alloc, ctx};
  memset(je, 0, sizeof(*je));
  const char *key = NULL;
  kl_event_t *ev = &je->ev;
  if (!json_is_object(root))
    return jev_fail(err, err_size, "an event must be a JSON object");
  const json_t *f[F__COUNT];
  kl_err_t e = jev_fields(root, f, err, err_size);
  if (!e)
    e = jev_str(f[F_KEY], "key", true, KL_KEY_MAX, &key, &ev->key_len, err,
                err_size);
  if (!e)
    e = jev_str(f[F_TYPE], "type", true, KL_TYPE_MAX, &ev->type, &ev->type_len,
                err, err_size);
  if (!e)
    e = jev_str(f[F_ID], "id", false, KL_ID_MAX, &ev->id, &ev->id_len, err,
                err_size);
  if (!e && kl__reserved_check(ev, 0))
    e = jev_fail(err, err_size, "%s", kl_err_detail());
  if (!e)
    e = jev_not_before(ev, f[F_NOT_BEFORE], f[F_DELAY], err, err_size);
  if (!e)
    e = jev_headers(je, f[F_HEADERS], &mem, err, err_size);
  if (!e)
    e = jev_payload(je, f[F_PAYLOAD], f[F_PAYLOAD_B64], raw_bin, &mem, err,
                    err_size);
  ev->key = key;
  /* The envelope's own rules (header sizes, duplicates) have the last say. */
  if (!e && kl_event_validate(ev, 1) != KL_OK)
    e = jev_fail(err, err_size, "%s", kl_err_detail());
  if (e)
    kl__jevent_clear(je);
  return e;
}

void kl__jevent_clear(kl__jevent_t *je) {
  free(je->payload);
  free(je->headers);
  memset(je, 0, sizeof(*je));
}
