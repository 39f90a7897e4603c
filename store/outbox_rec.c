/* The outbox's record codec and a batch's emit buffer (outbox_rec.h). */
#include "store/outbox_rec.h"

#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/strbuf.h"

/* The trace section: none, or traceparent and maybe tracestate, the
 * only headers a follow-up carries (kl_txn_emit()); an empty one (u8 0,
 * u16 0) ahead of a not_before when the source had none. */
static size_t trace_len(const kl_event_t *e) {
  if (!e->header_count)
    return e->not_before > 0 ? 3 : 0;
  return 3 + e->headers[0].value_len +
         (e->header_count > 1 ? e->headers[1].value_len : 0);
}

static size_t rec_len(const kl__outbox_rec_t *rec) {
  const kl_event_t *e = &rec->event;
  return KL__OUTBOX_REC_HEAD + rec->topic_len + e->key_len + e->id_len +
         e->type_len + e->payload_len + trace_len(e) +
         (e->not_before > 0 ? 8 : 0);
}

static kl_err_t emits_room(kl__emits_t *emits, size_t more) {
  unsigned char *p =
      kl__reserve(emits->bytes, &emits->cap, emits->len + more, 1, 256);
  if (!p)
    return KL_ENOMEM;
  emits->bytes = p;
  return KL_OK;
}

static unsigned char *rec_copy(unsigned char *p, const void *src, size_t n) {
  if (n)
    memcpy(p, src, n);
  return p + n;
}

kl_err_t kl__emits_add(kl__emits_t *emits, const kl__outbox_rec_t *rec) {
  const kl_event_t *e = &rec->event;
  size_t len = rec_len(rec);
  if (emits_room(emits, 4 + len))
    return KL_ENOMEM;
  unsigned char *p = emits->bytes + emits->len;
  kl__put_be(p, len, 4);
  p += 4;
  p[0] = (unsigned char)rec->topic_len;
  kl__put_be(p + 1, e->key_len, 2);
  p[3] = (unsigned char)e->id_len;
  p[4] = (unsigned char)e->type_len;
  kl__put_be(p + 5, (uint64_t)e->ts, 8);
  kl__put_be(p + 13, e->payload_len, 4);
  p += KL__OUTBOX_REC_HEAD;
  p = rec_copy(p, rec->topic, rec->topic_len);
  p = rec_copy(p, e->key, e->key_len);
  p = rec_copy(p, e->id, e->id_len);
  p = rec_copy(p, e->type, e->type_len);
  p = rec_copy(p, e->payload, e->payload_len);
  if (e->header_count) {
    const kl_header_t *ts = e->header_count > 1 ? &e->headers[1] : NULL;
    p[0] = (unsigned char)e->headers[0].value_len;
    kl__put_be(p + 1, ts ? ts->value_len : 0, 2);
    p = rec_copy(p + 3, e->headers[0].value, e->headers[0].value_len);
    if (ts)
      p = rec_copy(p, ts->value, ts->value_len);
  } else if (e->not_before > 0) {
    memset(p, 0, 3); /* no trace context */
    p += 3;
  }
  if (e->not_before > 0)
    kl__put_be(p, (uint64_t)e->not_before, 8);
  emits->len += 4 + len;
  emits->count++;
  return KL_OK;
}

kl_err_t kl__emits_join(kl__emits_t *to, const kl__emits_t *from) {
  if (!from || !from->count)
    return KL_OK;
  if (emits_room(to, from->len))
    return KL_ENOMEM;
  memcpy(to->bytes + to->len, from->bytes, from->len);
  to->len += from->len;
  to->count += from->count;
  return KL_OK;
}

int kl__emits_next(const kl__emits_t *emits, size_t *off, const void **rec,
                   size_t *len) {
  if (!emits || *off + 4 > emits->len)
    return 0;
  *len = (size_t)kl__get_be(emits->bytes + *off, 4);
  *rec = emits->bytes + *off + 4;
  *off += 4 + *len;
  return 1;
}

void kl__emits_reset(kl__emits_t *emits) {
  if (emits)
    emits->len = emits->count = 0;
}

void kl__emits_free(kl__emits_t *emits) {
  if (emits)
    free(emits->bytes);
  free(emits);
}

/* The sections after the body at @p base: none; a trace context; or a
 * trace section, empty when the source had none, then a not_before.
 * @returns 0 with @p out's trace and not_before set, or -1. */
static int rec_tail(const unsigned char *p, size_t len, size_t base,
                    kl__outbox_rec_t *out) {
  if (len == base)
    return 0;
  if (len < base + 3)
    return -1;
  size_t tp = p[base], ts = (size_t)kl__get_be(p + base + 1, 2);
  size_t end = base + 3 + tp + ts;
  kl_event_t *e = &out->event;
  if (len == end + 8 && (tp || !ts)) /* written since delayed follow-ups */
    e->not_before = (int64_t)kl__get_be(p + end, 8);
  else if (len != end || !tp)
    return -1;
  if (len == end + 8 && e->not_before <= 0)
    return -1;
  if (!tp)
    return 0;
  const char *s = (const char *)p + base + 3;
  out->trace[0] = (kl_header_t){KL_TRACEPARENT, strlen(KL_TRACEPARENT), s, tp};
  out->trace[1] =
      (kl_header_t){KL_TRACESTATE, strlen(KL_TRACESTATE), s + tp, ts};
  e->headers = out->trace;
  e->header_count = ts ? 2 : 1;
  return 0;
}

int kl__outbox_rec_decode(const void *rec, size_t len, kl__outbox_rec_t *out) {
  const unsigned char *p = rec;
  if (len < KL__OUTBOX_REC_HEAD)
    return -1;
  memset(out, 0, sizeof(*out));
  kl_event_t *e = &out->event;
  out->topic_len = p[0];
  e->key_len = (size_t)kl__get_be(p + 1, 2);
  e->id_len = p[3];
  e->type_len = p[4];
  e->ts = (int64_t)kl__get_be(p + 5, 8);
  e->payload_len = (size_t)kl__get_be(p + 13, 4);
  size_t base = KL__OUTBOX_REC_HEAD + out->topic_len + e->key_len + e->id_len +
                e->type_len + e->payload_len;
  if (len < base || rec_tail(p, len, base, out))
    return -1;
  const char *s = (const char *)p + KL__OUTBOX_REC_HEAD;
  out->topic = s;
  e->key = s += out->topic_len;
  e->id = s += e->key_len;
  e->type = s += e->id_len;
  e->payload = s += e->type_len;
  return 0;
}
