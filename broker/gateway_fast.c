/*
 * The fast reader of a JSON publish body: the common shape read straight
 * into events, without building jansson's document (which was half of the
 * loop thread's time).
 *
 * It takes only what it can read exactly as the full path would, and
 * hands anything else back (0): the full path (gateway_body.c: jansson,
 * kl__jevent_parse()) then reads the body and gives its answer, its error
 * and its index. Taken: an array of event objects (or one), whose fields
 * are "key", "type", "id" (strings), "headers" (an object of strings) and
 * "payload" (any JSON value but a real number); strings of printable ASCII
 * without escapes; integers of at most 18 digits; payloads nested at most
 * KL_GW_FAST_DEPTH deep, with at most KL_GW_FAST_CONTAINERS objects and
 * arrays and KL_GW_FAST_KEYS keys open at once. The event's own checks
 * (lengths, reserved types, kl_event_validate()) are the same functions the
 * full path calls; one that fails hands the body back too. The payload is
 * packed by msgpack-c's own functions, so its bytes are the full path's.
 *
 * Strings are borrowed from the body (it lives until the events are
 * produced); the events, payloads and headers are written into the
 * batch's arena. Runs on the loop thread.
 */
#include <stdint.h>
#include <string.h>

#include <msgpack.h>

#include "broker/gateway_internal.h"
#include "event/envelope.h"

#define KL_GW_FAST_DEPTH 32
#define KL_GW_FAST_CONTAINERS 256
#define KL_GW_FAST_KEYS 256

typedef struct kl_fr {
  const char *p, *end;
  /* a payload: its containers' sizes, counted by the first pass (pk NULL)
   * in the order they open, used by the second (pk set) */
  uint32_t sizes[KL_GW_FAST_CONTAINERS];
  size_t nsizes, next;
  struct {
    const char *s;
    size_t len;
  } keys[KL_GW_FAST_KEYS]; /* the keys of the objects open */
  size_t nkeys;
  msgpack_packer *pk;
  kl__strbuf_t *packed; /* the arena's scratch */
} kl_fr_t;

static void fr_ws(kl_fr_t *r) {
  while (r->p < r->end &&
         (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
    r->p++;
}

/* Skips blanks and takes @p c. */
static bool fr_take(kl_fr_t *r, char c) {
  fr_ws(r);
  if (r->p >= r->end || *r->p != c)
    return false;
  r->p++;
  return true;
}

/* A string of printable ASCII without escapes. */
static bool fr_str(kl_fr_t *r, const char **s, size_t *len) {
  if (!fr_take(r, '"'))
    return false;
  const char *b = r->p;
  for (; r->p < r->end; r->p++) {
    unsigned char c = (unsigned char)*r->p;
    if (c == '"') {
      *s = b;
      *len = (size_t)(r->p++ - b);
      return true;
    }
    if (c < 0x20 || c > 0x7e || c == '\\')
      return false;
  }
  return false;
}

static bool fr_word(kl_fr_t *r, const char *w, size_t n) {
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n) != 0)
    return false;
  r->p += n;
  return true;
}

/* -?(0|[1-9][0-9]*), at most 18 digits: an int64 exactly as strtoll. */
static bool fr_int(kl_fr_t *r, int64_t *v) {
  bool neg = r->p < r->end && *r->p == '-';
  const char *d = r->p + neg, *e = d;
  int64_t u = 0;
  for (; e < r->end && *e >= '0' && *e <= '9'; e++)
    if (e - d < 18) /* a longer run is refused below: never overflows */
      u = u * 10 + (*e - '0');
  size_t n = (size_t)(e - d);
  if (n == 0 || n > 18 || (n > 1 && *d == '0'))
    return false;
  if (e < r->end && (*e == '.' || *e == 'e' || *e == 'E'))
    return false; /* a real: the full path's strtod decides */
  r->p = e;
  *v = neg ? -u : u;
  return true;
}

static int fr_pack_write(void *data, const char *buf, size_t len) {
  kl__strbuf_t *sb = data;
  kl__strbuf_add(sb, buf, len);
  return kl__strbuf_ok(sb) ? 0 : -1;
}

static bool fr_value(kl_fr_t *r, int depth);

/* A key of the object whose keys start at @p base, unless seen in it. */
static bool fr_key(kl_fr_t *r, size_t base) {
  const char *s;
  size_t len;
  if (!fr_str(r, &s, &len) || r->nkeys == KL_GW_FAST_KEYS)
    return false;
  for (size_t i = base; i < r->nkeys; i++)
    if (r->keys[i].len == len && memcmp(r->keys[i].s, s, len) == 0)
      return false; /* twice: the full path refuses it */
  r->keys[r->nkeys].s = s;
  r->keys[r->nkeys++].len = len;
  if (r->pk)
    msgpack_pack_str(r->pk, len), msgpack_pack_str_body(r->pk, s, len);
  return fr_take(r, ':');
}

/* An object or array after its opening character. */
static bool fr_container(kl_fr_t *r, bool object, int depth) {
  if (depth > KL_GW_FAST_DEPTH ||
      (!r->pk && r->nsizes == KL_GW_FAST_CONTAINERS))
    return false;
  size_t at = r->pk ? r->next++ : r->nsizes++, base = r->nkeys;
  uint32_t n = 0;
  if (r->pk && object)
    msgpack_pack_map(r->pk, r->sizes[at]);
  else if (r->pk)
    msgpack_pack_array(r->pk, r->sizes[at]);
  char close = object ? '}' : ']';
  fr_ws(r);
  if (r->p < r->end && *r->p == close) {
    r->p++;
  } else {
    do {
      if ((object && !fr_key(r, base)) || !fr_value(r, depth + 1))
        return false;
      n++;
    } while (fr_take(r, ','));
    if (!fr_take(r, close))
      return false;
  }
  r->nkeys = base;
  if (!r->pk)
    r->sizes[at] = n;
  return true;
}

static bool fr_value(kl_fr_t *r, int depth) {
  fr_ws(r);
  if (r->p >= r->end)
    return false;
  char c = *r->p;
  const char *s;
  size_t len;
  int64_t v;
  msgpack_packer *pk = r->pk;
  if (c == '{' || c == '[') {
    r->p++;
    return fr_container(r, c == '{', depth);
  }
  if (c == '"') {
    if (!fr_str(r, &s, &len))
      return false;
    return !pk ||
           (msgpack_pack_str(pk, len), msgpack_pack_str_body(pk, s, len), true);
  }
  if (fr_word(r, "true", 4))
    return !pk || (msgpack_pack_true(pk), true);
  if (fr_word(r, "false", 5))
    return !pk || (msgpack_pack_false(pk), true);
  if (fr_word(r, "null", 4))
    return !pk || (msgpack_pack_nil(pk), true);
  if (!fr_int(r, &v))
    return false;
  return !pk || (msgpack_pack_int64(pk, v), true);
}

/* The payload: checked and counted, then packed into the arena. */
static int fr_payload(kl_fr_t *r, kl__gw_arena_t *arena, kl_event_t *ev) {
  const char *start = r->p;
  r->nsizes = r->next = 0;
  r->pk = NULL;
  if (!fr_value(r, 1))
    return 0;
  const char *end = r->p;
  msgpack_packer pk;
  msgpack_packer_init(&pk, r->packed, fr_pack_write);
  r->packed->len = 0;
  r->p = start;
  r->pk = &pk;
  fr_value(r, 1); /* the same text: it reads as before */
  r->pk = NULL;
  r->p = end;
  if (!kl__strbuf_ok(r->packed)) {
    kl__strbuf_free(r->packed); /* usable again */
    return -1;
  }
  size_t len = r->packed->len;
  if (len > KL_PAYLOAD_MAX)
    return 0;
  void *bytes = kl__gw_arena_alloc(arena, len);
  if (!bytes)
    return -1;
  memcpy(bytes, r->packed->data, len);
  ev->payload = bytes;
  ev->payload_len = len;
  return 1;
}

static int fr_headers(kl_fr_t *r, kl__gw_arena_t *arena, kl_event_t *ev) {
  kl_header_t h[KL_HEADERS_MAX];
  size_t n = 0;
  if (!fr_take(r, '{'))
    return 0;
  if (!fr_take(r, '}')) {
    do {
      if (n == KL_HEADERS_MAX || !fr_str(r, &h[n].name, &h[n].name_len) ||
          !fr_take(r, ':') || !fr_str(r, &h[n].value, &h[n].value_len))
        return 0;
      for (size_t i = 0; i < n; i++)
        if (h[i].name_len == h[n].name_len &&
            memcmp(h[i].name, h[n].name, h[n].name_len) == 0)
          return 0;
      n++;
    } while (fr_take(r, ','));
    if (!fr_take(r, '}'))
      return 0;
  }
  if (n == 0)
    return 1;
  kl_header_t *kept = kl__gw_arena_alloc(arena, n * sizeof(*kept));
  if (!kept)
    return -1;
  memcpy(kept, h, n * sizeof(*kept));
  ev->headers = kept;
  ev->header_count = n;
  return 1;
}

enum { F_KEY = 1, F_TYPE = 2, F_ID = 4, F_PAYLOAD = 8, F_HEADERS = 16 };

/* One field of an event object. */
static int fr_field(kl_fr_t *r, kl__gw_arena_t *arena, kl_event_t *ev,
                    unsigned *seen) {
  static const struct {
    const char *name;
    size_t len;
    unsigned bit;
  } fields[] = {{"key", 3, F_KEY},
                {"type", 4, F_TYPE},
                {"id", 2, F_ID},
                {"payload", 7, F_PAYLOAD},
                {"headers", 7, F_HEADERS}};
  const char *s;
  size_t len, i = 0;
  if (!fr_str(r, &s, &len) || !fr_take(r, ':'))
    return 0;
  while (i < 5 &&
         !(fields[i].len == len && memcmp(fields[i].name, s, len) == 0))
    i++;
  if (i == 5 || (*seen & fields[i].bit))
    return 0; /* another field, or twice: the full path says which */
  *seen |= fields[i].bit;
  switch (fields[i].bit) {
  case F_KEY: {
    const char *key;
    bool ok = fr_str(r, &key, &ev->key_len);
    ev->key = key;
    return ok;
  }
  case F_TYPE:
    return fr_str(r, &ev->type, &ev->type_len);
  case F_ID:
    return fr_str(r, &ev->id, &ev->id_len);
  case F_PAYLOAD:
    return fr_payload(r, arena, ev);
  default:
    return fr_headers(r, arena, ev);
  }
}

/* What kl__jevent_parse() checks of the fields read. */
static bool fr_event_ok(const kl_event_t *ev, unsigned seen) {
  return (seen & (F_KEY | F_TYPE)) == (F_KEY | F_TYPE) && ev->key_len >= 1 &&
         ev->key_len <= KL_KEY_MAX && ev->type_len >= 1 &&
         ev->type_len <= KL_TYPE_MAX &&
         (!(seen & F_ID) || (ev->id_len >= 1 && ev->id_len <= KL_ID_MAX)) &&
         kl__reserved_check(ev, 0) == KL_OK &&
         kl_event_validate(ev, 1) == KL_OK;
}

static int fr_event(kl_fr_t *r, kl__gw_arena_t *arena, kl__jevent_t *je) {
  memset(je, 0, sizeof(*je));
  unsigned seen = 0;
  if (!fr_take(r, '{'))
    return 0;
  if (!fr_take(r, '}')) {
    do {
      int rc = fr_field(r, arena, &je->ev, &seen);
      if (rc <= 0)
        return rc;
    } while (fr_take(r, ','));
    if (!fr_take(r, '}'))
      return 0;
  }
  return fr_event_ok(&je->ev, seen) ? 1 : 0;
}

/* One more event slot in @p batch, grown in the arena. */
static kl__jevent_t *fr_slot(kl__gw_batch_t *batch, size_t *cap) {
  if (batch->n == *cap) {
    size_t want = *cap ? *cap * 2 : 128;
    kl__jevent_t *grown =
        kl__gw_arena_alloc(batch->arena, want * sizeof(*grown));
    if (!grown)
      return NULL;
    if (batch->n)
      memcpy(grown, batch->events, batch->n * sizeof(*grown));
    batch->events = grown;
    *cap = want;
  }
  return &batch->events[batch->n];
}

static int fr_events(kl_fr_t *r, kl__gw_batch_t *batch, size_t max_events) {
  size_t cap = 0;
  bool array = fr_take(r, '[');
  do {
    kl__jevent_t *je = fr_slot(batch, &cap);
    if (!je)
      return -1;
    int rc = fr_event(r, batch->arena, je);
    if (rc <= 0)
      return rc;
    if (++batch->n > max_events)
      return 0; /* the full path answers 413 */
  } while (array && fr_take(r, ','));
  if (array && !fr_take(r, ']'))
    return 0;
  fr_ws(r);
  return r->p == r->end ? 1 : 0;
}

int kl__gw_fast_decode(kl__gw_batch_t *batch, const char *body, size_t len,
                       size_t max_events) {
  kl_fr_t *r = kl__gw_arena_alloc(batch->arena, sizeof(*r));
  if (!r)
    return -1;
  memset(r, 0, sizeof(*r));
  r->p = body;
  r->end = body + len;
  r->packed = &batch->arena->scratch;
  int rc = fr_events(r, batch, max_events);
  if (rc <= 0) {
    batch->events = NULL; /* the arena's */
    batch->n = 0;
  }
  return rc;
}
