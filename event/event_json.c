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

/* A field's value as either body's reader found it: what the rules below
 * need of it, whatever the encoding, so that one set of rules holds for
 * both. */
typedef struct kl_jev_val {
  enum { JV_NONE, JV_STR, JV_INT, JV_OBJECT, JV_OTHER } kind;
  const char *s;      /**< JV_STR: its bytes, borrowed; a msgpack payload: its
                           bytes as stored */
  size_t len;         /**< JV_STR, payload: of s; JV_OBJECT: its entries */
  int64_t i;          /**< JV_INT */
  const json_t *json; /**< the JSON reader's value */
  kl__mp_reader_t mp; /**< the msgpack reader's: at a map's first key */
  bool stored;        /**< a msgpack payload, in s as it is stored */
  size_t bin;         /**< a msgpack bin, its JSON form an object of one
                           entry: its bytes' count (s: the bytes) */
} kl_jev_val_t;

static const struct {
  const char *name;
  size_t len;
} kl_jev_known[F__COUNT] = {
    {"key", 3},          {"id", 2},      {"type", 4},        {"payload", 7},
    {"payload_b64", 11}, {"headers", 7}, {"not_before", 10}, {"delay", 5}};

/* @returns the field @p name is, or F__COUNT for none of them. */
static int jev_field(const char *name, size_t len) {
  int i = 0;
  while (i < F__COUNT && (kl_jev_known[i].len != len ||
                          memcmp(name, kl_jev_known[i].name, len) != 0))
    i++;
  return i;
}

static kl_err_t jev_unknown(const char *name, size_t len, char *err,
                            size_t size) {
  return jev_fail(err, size,
                  "unknown field \"%.*s\"; the fields are "
                  "key, id, type, payload, payload_b64, headers, and "
                  "not_before or delay",
                  (int)(len < 64 ? len : 64), name);
}

static kl_jev_val_t jev_json_val(const json_t *v) {
  kl_jev_val_t r = {.kind = JV_OTHER, .json = v};
  if (!v)
    r.kind = JV_NONE;
  else if (json_is_string(v))
    r = (kl_jev_val_t){.kind = JV_STR,
                       .s = json_string_value(v),
                       .len = json_string_length(v),
                       .json = v};
  else if (json_is_integer(v))
    r.kind = JV_INT, r.i = (int64_t)json_integer_value(v);
  else if (json_is_object(v))
    r.kind = JV_OBJECT, r.len = json_object_size(v);
  return r;
}

/* Every field's value, read in one walk over the object: looking each
 * name up hashed it again, 8 lookups per event. @returns KL_OK, or
 * KL_EINVAL naming the first field that is not one of them. */
static kl_err_t jev_fields(const json_t *root, kl_jev_val_t f[F__COUNT],
                           char *err, size_t size) {
  const char *name;
  size_t len;
  json_t *v;
  for (int i = 0; i < F__COUNT; i++)
    f[i] = (kl_jev_val_t){.kind = JV_NONE};
  json_object_keylen_foreach((json_t *)root, name, len, v) {
    int i = jev_field(name, len);
    if (i == F__COUNT)
      return jev_unknown(name, len, err, size);
    f[i] = jev_json_val(v);
  }
  return KL_OK;
}

static kl_err_t jev_str(const kl_jev_val_t *v, const char *name, bool required,
                        size_t max, const char **s, size_t *len, char *err,
                        size_t size) {
  if (v->kind == JV_NONE)
    return required ? jev_fail(err, size, "\"%s\" is missing", name) : KL_OK;
  if (v->kind != JV_STR)
    return jev_fail(err, size, "\"%s\" must be a string", name);
  *s = v->s;
  *len = v->len;
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

/* The memory of what the event keeps besides the body's values: the
 * caller's arena, or malloc()ed and owned by the jevent. */
typedef struct kl_jev_mem {
  kl__alloc_fn_t *alloc;
  void *ctx;
} kl_jev_mem_t;

static kl_err_t jev_header(kl_header_t *out, const char *name, size_t len,
                           const kl_jev_val_t *v, char *err, size_t size) {
  int shown = (int)(len < 64 ? len : 64);
  if (v->kind != JV_STR)
    return jev_fail(err, size, "header \"%.*s\" must be a string", shown, name);
  if (memchr(v->s, '\0', v->len))
    return jev_fail(err, size,
                    "header \"%.*s\" holds a NUL byte: it must be text "
                    "without NUL",
                    shown, name);
  *out = (kl_header_t){name, len, v->s, v->len};
  return KL_OK;
}

static kl_jev_val_t jev_mp_val(kl__mp_reader_t *rd);

static kl_err_t jev_headers(kl__jevent_t *je, const kl_jev_val_t *h,
                            const kl_jev_mem_t *mem, char *err, size_t size) {
  if (h->kind == JV_NONE)
    return KL_OK;
  if (h->kind != JV_OBJECT)
    return jev_fail(err, size, "\"headers\" must be an object of strings");
  size_t n = h->len;
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
  kl_err_t e = KL_OK;
  if (h->json) {
    const char *name;
    json_t *v;
    size_t i = 0;
    json_object_foreach((json_t *)h->json, name, v) {
      kl_jev_val_t hv = jev_json_val(v);
      if ((e = jev_header(&headers[i++], name, strlen(name), &hv, err, size)))
        return e;
    }
  } else if (h->s) {
    /* A bin's JSON form, {"$base64": STR}: one header. */
    size_t len = kl__base64_encoded_len(h->bin);
    char *text = mem->alloc(mem->ctx, len + 1);
    if (!text)
      return KL_ENOMEM;
    kl__base64_encode(h->s, h->bin, text);
    kl_jev_val_t hv = {.kind = JV_STR, .s = text, .len = len};
    if ((e = jev_header(&headers[0], "$base64", 7, &hv, err, size)))
      return e;
  } else {
    /* Checked as msgpack already (kl__msgpack_check()): every key a
     * string. */
    kl__mp_reader_t rd = h->mp;
    for (size_t i = 0; i < n && !e; i++) {
      kl__mp_item_t key;
      uint64_t need;
      kl__mp_next(&rd, &key, &need);
      kl_jev_val_t hv = jev_mp_val(&rd);
      e = jev_header(&headers[i], (const char *)key.body, (size_t)key.n, &hv,
                     err, size);
    }
    if (e)
      return e;
  }
  je->ev.headers = headers;
  je->ev.header_count = n;
  return KL_OK;
}

static kl_err_t jev_payload(kl__jevent_t *je, const kl_jev_val_t *p,
                            const kl_jev_val_t *b64, const kl_jev_mem_t *mem,
                            char *err, size_t size) {
  size_t len = 0;
  kl_err_t e = KL_OK;
  if (p->kind != JV_NONE && b64->kind != JV_NONE)
    return jev_fail(err, size,
                    "both \"payload\" and \"payload_b64\" are "
                    "given: pass one");
  if (b64->kind != JV_NONE && b64->kind != JV_STR)
    return jev_fail(err, size, "\"payload_b64\" must be a base64 string");
  const void *payload = NULL;
  if (p->stored) {
    payload = p->s;
    len = p->len;
  } else if (b64->kind == JV_STR && mem->alloc) {
    e = kl__base64_decode_in(b64->s, b64->len, mem->alloc, mem->ctx, &payload,
                             &len);
  } else if (b64->kind == JV_STR) {
    e = kl__base64_decode(b64->s, b64->len, &je->payload, &len);
  } else if (p->json && mem->alloc) {
    e = kl__json_to_msgpack_in(p->json, KL_PAYLOAD_MAX, mem->alloc, mem->ctx,
                               &payload, &len);
  } else if (p->json) {
    e = kl__json_to_msgpack(p->json, KL_PAYLOAD_MAX, &je->payload, &len);
  }
  if (e == KL_ENOMEM)
    return e;
  if (e)
    return jev_fail(err, size, "\"%s\": %s",
                    b64->kind == JV_STR ? "payload_b64" : "payload",
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
static kl_err_t jev_not_before(kl_event_t *ev, const kl_jev_val_t *nb,
                               const kl_jev_val_t *delay,
                               const kl_jev_mem_t *mem, char *err,
                               size_t size) {
  if (nb->kind != JV_NONE && delay->kind != JV_NONE)
    return jev_fail(err, size,
                    "both \"not_before\" and \"delay\" are given: pass "
                    "one (\"not_before\" in ms since the Unix epoch, or "
                    "\"delay\" as a duration from now such as \"15m\")");
  if (nb->kind != JV_NONE && (nb->kind != JV_INT || nb->i <= 0))
    return jev_fail(err, size,
                    "\"not_before\" must be a positive integer, ms since "
                    "the Unix epoch (such as 1767225600000); omit it to "
                    "have the event applied when it is read");
  if (nb->kind != JV_NONE) {
    ev->not_before = nb->i;
    return KL_OK;
  }
  if (delay->kind == JV_NONE)
    return KL_OK;
  if (delay->kind != JV_STR)
    return jev_fail(err, size,
                    "\"delay\" must be a string, a duration with a unit "
                    "such as \"500ms\", \"30s\", \"15m\", \"2h\" or "
                    "\"3d\"; or give \"not_before\" in ms since the Unix "
                    "epoch");
  const char *nul = memchr(delay->s, '\0', delay->len);
  if (nul)
    return jev_fail(err, size,
                    "\"delay\" holds a NUL byte at byte %zu: give a duration "
                    "with a unit and nothing after it, such as \"15m\"",
                    (size_t)(nul - delay->s));
  /* Text as kl__units_parse() reads it: a msgpack str has no NUL after
   * it. */
  const char *text = delay->s;
  if (!delay->json) {
    char *copy = mem->alloc ? mem->alloc(mem->ctx, delay->len + 1) : NULL;
    if (!copy)
      return KL_ENOMEM;
    memcpy(copy, delay->s, delay->len);
    copy[delay->len] = '\0';
    text = copy;
  }
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

/* The rules, one set for both encodings, over the fields' values. */
static kl_err_t jev_read(kl__jevent_t *je, const kl_jev_val_t f[F__COUNT],
                         const kl_jev_mem_t *mem, char *err, size_t err_size) {
  const char *key = NULL;
  kl_event_t *ev = &je->ev;
  kl_err_t e = jev_str(&f[F_KEY], "key", true, KL_KEY_MAX, &key, &ev->key_len,
                       err, err_size);
  if (!e)
    e = jev_str(&f[F_TYPE], "type", true, KL_TYPE_MAX, &ev->type, &ev->type_len,
                err, err_size);
  if (!e)
    e = jev_str(&f[F_ID], "id", false, KL_ID_MAX, &ev->id, &ev->id_len, err,
                err_size);
  if (!e && kl__reserved_check(ev, 0))
    e = jev_fail(err, err_size, "%s", kl_err_detail());
  if (!e)
    e = jev_not_before(ev, &f[F_NOT_BEFORE], &f[F_DELAY], mem, err, err_size);
  if (!e)
    e = jev_headers(je, &f[F_HEADERS], mem, err, err_size);
  if (!e)
    e = jev_payload(je, &f[F_PAYLOAD], &f[F_PAYLOAD_B64], mem, err, err_size);
  ev->key = key;
  /* The envelope's own rules (header sizes, duplicates) have the last say. */
  if (!e && kl_event_validate(ev, 1) != KL_OK)
    e = jev_fail(err, err_size, "%s", kl_err_detail());
  if (e)
    kl__jevent_clear(je);
  return e;
}

kl_err_t kl__jevent_parse(kl__jevent_t *je, const json_t *root, char *err,
                          size_t err_size) {
  return kl__jevent_parse_in(je, root, NULL, NULL, err, err_size);
}

kl_err_t kl__jevent_parse_in(kl__jevent_t *je, const json_t *root,
                             kl__alloc_fn_t *alloc, void *ctx, char *err,
                             size_t err_size) {
  const kl_jev_mem_t mem = {alloc, ctx};
  memset(je, 0, sizeof(*je));
  if (!json_is_object(root))
    return jev_fail(err, err_size, "an event must be a JSON object");
  kl_jev_val_t f[F__COUNT];
  kl_err_t e = jev_fields(root, f, err, err_size);
  return e ? e : jev_read(je, f, &mem, err, err_size);
}

/* ---- msgpack ---- */

/* The value at @p rd as a field's value, @p rd left past it. The body was
 * checked as a whole (kl__msgpack_check()). */
static kl_jev_val_t jev_mp_val(kl__mp_reader_t *rd) {
  kl__mp_reader_t at = *rd;
  kl__mp_item_t it;
  uint64_t need;
  kl__mp_next(rd, &it, &need);
  kl_jev_val_t r = {.kind = JV_OTHER};
  if (it.kind == KL__MP_STR)
    r = (kl_jev_val_t){
        .kind = JV_STR, .s = (const char *)it.body, .len = (size_t)it.n};
  else if (it.kind == KL__MP_INT)
    r = (kl_jev_val_t){.kind = JV_INT, .i = it.i};
  else if (it.kind == KL__MP_MAP)
    r = (kl_jev_val_t){.kind = JV_OBJECT, .len = (size_t)it.n, .mp = *rd};
  else if (it.kind == KL__MP_BIN) /* {"$base64": STR} */
    r = (kl_jev_val_t){.kind = JV_OBJECT,
                       .len = 1,
                       .s = (const char *)it.body,
                       .bin = (size_t)it.n};
  if (it.kind == KL__MP_ARRAY || it.kind == KL__MP_MAP) {
    *rd = at; /* past its elements too */
    kl__mp_skip(rd);
  }
  return r;
}

/* Every field's value, read in one walk over the event's map as
 * jev_fields() reads an object's; a payload other than a bin is made what
 * it is stored as on the way (kl__msgpack_repack_in()), a bin is its
 * bytes. */
static kl_err_t jev_mp_fields(kl__mp_reader_t *rd, uint64_t n,
                              kl_jev_val_t f[F__COUNT], const kl_jev_mem_t *mem,
                              char *err, size_t size) {
  for (int i = 0; i < F__COUNT; i++)
    f[i] = (kl_jev_val_t){.kind = JV_NONE};
  for (uint64_t k = 0; k < n; k++) {
    kl__mp_item_t key;
    uint64_t need;
    kl__mp_next(rd, &key, &need);
    int i = jev_field((const char *)key.body, (size_t)key.n);
    if (i == F__COUNT)
      return jev_unknown((const char *)key.body, (size_t)key.n, err, size);
    if (i != F_PAYLOAD) {
      f[i] = jev_mp_val(rd);
      continue;
    }
    kl__mp_reader_t at = *rd;
    kl__mp_item_t it;
    kl__mp_next(&at, &it, &need);
    kl_jev_val_t *p = &f[i];
    *p = (kl_jev_val_t){.kind = JV_OTHER, .stored = true};
    if (it.kind == KL__MP_BIN) {
      p->s = (const char *)it.body;
      p->len = (size_t)it.n;
      *rd = at;
      continue;
    }
    const void *bytes;
    kl_err_t e = kl__msgpack_repack_in(rd, 1, SIZE_MAX, mem->alloc, mem->ctx,
                                       &bytes, &p->len);
    if (e)
      return e == KL_ENOMEM
                 ? e
                 : jev_fail(err, size, "\"payload\": %s", kl_err_detail());
    p->s = bytes;
  }
  return KL_OK;
}

kl_err_t kl__jevent_parse_mp(kl__jevent_t *je, kl__mp_reader_t *rd,
                             kl__alloc_fn_t *alloc, void *ctx, char *err,
                             size_t err_size) {
  const kl_jev_mem_t mem = {alloc, ctx};
  memset(je, 0, sizeof(*je));
  kl__mp_item_t it;
  uint64_t need;
  if (kl__mp_next(rd, &it, &need) != KL__MP_OK || it.kind != KL__MP_MAP)
    return jev_fail(err, err_size, "an event must be a JSON object");
  kl_jev_val_t f[F__COUNT];
  kl_err_t e = jev_mp_fields(rd, it.n, f, &mem, err, err_size);
  return e ? e : jev_read(je, f, &mem, err, err_size);
}

void kl__jevent_clear(kl__jevent_t *je) {
  free(je->payload);
  free(je->headers);
  memset(je, 0, sizeof(*je));
}
