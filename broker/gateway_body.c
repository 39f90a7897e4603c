/*
 * A publish request's body to a batch of events, all validated before the
 * first is produced: the envelope's rules, and what kl_publish() checks
 * beyond them (a delayed event's time, one record's size:
 * kl__gw_batch_publishable()), so that a request is published whole or
 * refused whole.
 *
 * A msgpack body is read by kl__msgpack_to_json(), which checks every
 * length against the bytes left before allocating (a 5-byte body cannot
 * claim a 268M-entry map), and then takes the JSON path: one set of event
 * rules for both. Its bin values read as {"$base64": ...}; a bin "payload"
 * is taken as the raw payload bytes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broker/gateway_internal.h"
#include "broker/producer_internal.h"
#include "common/json_msgpack.h"

int kl__gw_bad(kl__gw_bad_t *bad, int status, long index, const char *fmt,
               ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bad->msg, sizeof(bad->msg), fmt, ap);
  va_end(ap);
  bad->status = status;
  bad->index = index;
  return status;
}

static int body_doc(const char *ctype, const char *body, size_t len,
                    json_t **doc, kl__gw_bad_t *bad) {
  int msgpack = kl__gw_ctype_msgpack(ctype);
  if (msgpack < 0)
    return kl__gw_bad(bad, 415, -1,
                      "Content-Type \"%.64s\" is neither "
                      "application/json nor application/msgpack",
                      ctype);
  if (msgpack) {
    kl_err_t err = kl__msgpack_to_json(body, len, doc);
    if (err == KL_ENOMEM)
      return kl__gw_bad(bad, 503, -1, "out of memory reading the body");
    return err ? kl__gw_bad(bad, 400, -1, "the body is not valid msgpack: %s",
                            kl_err_detail())
               : 0;
  }
  json_error_t jerr;
  /* NUL is let through to kl__jevent_parse(), which refuses it in the
   * fields where msgpack bodies can hold it too: one rule for both. */
  *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!*doc)
    return kl__gw_bad(bad, 400, -1,
                      "the body is not valid JSON: %s (line %d, "
                      "column %d)",
                      jerr.text, jerr.line, jerr.column);
  return 0;
}

static int batch_events(kl__gw_batch_t *batch, bool raw_bin, size_t max_events,
                        kl__gw_bad_t *bad) {
  json_t *doc = batch->doc;
  bool one = json_is_object(doc);
  if (!one && !json_is_array(doc))
    return kl__gw_bad(bad, 400, -1,
                      "the body must be one event object or an "
                      "array of them");
  size_t n = one ? 1 : json_array_size(doc);
  if (n == 0)
    return kl__gw_bad(bad, 400, -1, "the array holds no event");
  if (n > max_events)
    return kl__gw_bad(bad, 413, -1,
                      "the request has %zu events; the gateway "
                      "takes at most %zu at once (--max-inflight)",
                      n, max_events);
  if (!(batch->events = calloc(n, sizeof(kl__jevent_t))))
    return kl__gw_bad(bad, 503, -1, "out of memory for %zu events", n);
  for (size_t i = 0; i < n; i++) {
    char err[400];
    json_t *root = one ? doc : json_array_get(doc, i);
    kl_err_t e =
        kl__jevent_parse(&batch->events[i], root, raw_bin, err, sizeof(err));
    if (e == KL_ENOMEM)
      return kl__gw_bad(bad, 503, (long)i, "out of memory reading event %zu",
                        i);
    if (e)
      return kl__gw_bad(bad, 400, (long)i, "event %zu: %s", i, err);
    batch->n = i + 1;
  }
  return 0;
}

int kl__gw_batch_decode(kl__gw_batch_t *batch, const char *ctype,
                        const char *body, size_t len, size_t max_events,
                        kl__gw_bad_t *bad) {
  memset(batch, 0, sizeof(*batch));
  int status = body_doc(ctype, body, len, &batch->doc, bad);
  if (!status)
    status =
        batch_events(batch, kl__gw_ctype_msgpack(ctype) == 1, max_events, bad);
  if (status)
    kl__gw_batch_free(batch);
  return status;
}

int kl__gw_batch_publishable(const kl__gw_batch_t *batch,
                             const kl_producer_t *producer, kl__gw_bad_t *bad) {
  for (size_t i = 0; i < batch->n; i++)
    if (kl__producer_event_check(producer, &batch->events[i].ev, NULL))
      return kl__gw_bad(bad, 400, (long)i,
                        "event %zu: %s; no event of the request was "
                        "published",
                        i, kl_err_detail());
  return 0;
}

void kl__gw_batch_free(kl__gw_batch_t *batch) {
  for (size_t i = 0; i < batch->n; i++)
    kl__jevent_clear(&batch->events[i]);
  free(batch->events);
  json_decref(batch->doc);
  memset(batch, 0, sizeof(*batch));
}
