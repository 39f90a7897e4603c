/* The oracle of a msgpack body's reading; see msgpack_oracle.h. */
#include "support/msgpack_oracle.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/internal.h"
#include "common/json_msgpack.h"
#include "event/event_json.h"

static const char *differ(char *why, size_t size, const char *fmt, ...)
    KL__PRINTF(3, 4);
static const char *differ(char *why, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, size, fmt, ap);
  va_end(ap);
  return why;
}

static bool same_bytes(const void *a, size_t alen, const void *b, size_t blen) {
  return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* @returns the first field of @p a and @p b that differs, or NULL. */
static const char *event_diff(const kl_event_t *a, const kl_event_t *b,
                              bool delayed) {
  if (!same_bytes(a->key, a->key_len, b->key, b->key_len))
    return "key";
  if (!same_bytes(a->type, a->type_len, b->type, b->type_len))
    return "type";
  if (!same_bytes(a->id, a->id_len, b->id, b->id_len))
    return "id";
  if (!same_bytes(a->payload, a->payload_len, b->payload, b->payload_len))
    return "payload";
  if (a->header_count != b->header_count)
    return "the header count";
  for (size_t i = 0; i < a->header_count; i++) {
    const kl_header_t *x = &a->headers[i], *y = &b->headers[i];
    if (!same_bytes(x->name, x->name_len, y->name, y->name_len) ||
        !same_bytes(x->value, x->value_len, y->value, y->value_len))
      return "a header";
  }
  int64_t d = a->not_before - b->not_before;
  if (d != 0 && !(delayed && d > -5000 && d < 5000))
    return "not_before";
  return NULL;
}

/* The "payload" of event @p i of @p body, a checked msgpack body, when it
 * is a bin: @returns whether it is, with its bytes. */
static bool payload_bin(const void *body, size_t len, size_t i,
                        const uint8_t **bytes, size_t *n) {
  kl__mp_reader_t rd = kl__mp_reader(body, len);
  kl__mp_item_t it;
  uint64_t need;
  kl__mp_next(&rd, &it, &need);
  if (it.kind == KL__MP_ARRAY) {
    for (size_t j = 0; j < i; j++)
      kl__mp_skip(&rd);
    kl__mp_next(&rd, &it, &need);
  }
  for (uint64_t k = 0; it.kind == KL__MP_MAP && k < it.n; k++) {
    kl__mp_item_t key, v;
    kl__mp_next(&rd, &key, &need);
    kl__mp_reader_t at = rd;
    kl__mp_next(&at, &v, &need);
    if (key.n == 7 && memcmp(key.body, "payload", 7) == 0) {
      *bytes = v.body;
      *n = (size_t)v.n;
      return v.kind == KL__MP_BIN;
    }
    kl__mp_skip(&rd);
  }
  return false;
}

/* The oracle's reading: @returns 0 with @p events, or the refusal in
 * @p why. */
static bool oracle_read(json_t *doc, size_t max_events, kl__jevent_t **events,
                        size_t *n, char *why, size_t size) {
  bool one = json_is_object(doc);
  *n = one ? 1 : json_array_size(doc);
  if (!one && !json_is_array(doc))
    return differ(why, size, "not an event or an array"), false;
  if (*n == 0 || *n > max_events)
    return differ(why, size, "%zu events", *n), false;
  *events = calloc(*n, sizeof(**events));
  for (size_t i = 0; i < *n; i++) {
    char err[400];
    if (kl__jevent_parse(&(*events)[i], one ? doc : json_array_get(doc, i), err,
                         sizeof(err))) {
      differ(why, size, "event %zu: %s", i, err);
      for (size_t j = 0; j < i; j++)
        kl__jevent_clear(&(*events)[j]);
      free(*events);
      *events = NULL;
      return false;
    }
  }
  return true;
}

const char *kl_msgpack_oracle_diff(const void *body, size_t len,
                                   size_t max_events, int status,
                                   const kl__gw_batch_t *batch, char *why,
                                   size_t size) {
  json_t *doc = NULL;
  kl__jevent_t *events = NULL;
  size_t n = 0;
  char refused[600] = "";
  bool took = false;
  if (kl__msgpack_body_to_json(body, len, &doc) != KL_OK)
    snprintf(refused, sizeof(refused), "not msgpack: %s", kl_err_detail());
  else
    took = oracle_read(doc, max_events, &events, &n, refused, sizeof(refused));
  const char *diff = NULL;
  if (took != (status == 0)) {
    diff = took ? differ(why, size,
                         "the gateway refused (%d) what the "
                         "oracle takes",
                         status)
                : differ(why, size,
                         "the gateway took what the oracle "
                         "refuses: %s",
                         refused);
  } else if (took && n != batch->n) {
    diff = differ(why, size, "%zu events, the oracle's %zu", batch->n, n);
  }
  for (size_t i = 0; took && !diff && i < n; i++) {
    const json_t *root = json_is_array(doc) ? json_array_get(doc, i) : doc;
    kl_event_t want = events[i].ev;
    const uint8_t *bin;
    size_t bin_len;
    if (payload_bin(body, len, i, &bin, &bin_len)) {
      want.payload = bin;
      want.payload_len = bin_len;
    }
    const char *field = event_diff(&batch->events[i].ev, &want,
                                   json_object_get(root, "delay") != NULL);
    if (field)
      diff = differ(why, size, "event %zu: the %s differs from the oracle's", i,
                    field);
  }
  for (size_t i = 0; took && i < n; i++)
    kl__jevent_clear(&events[i]);
  free(events);
  json_decref(doc);
  return diff;
}
