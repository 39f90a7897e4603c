/* W3C trace context in event headers (event/trace.h). */
#include "event/trace.h"

#include <string.h>

#include "common/internal.h"

static int lower_hex(const char *s, size_t n, int nonzero) {
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return 0;
    any |= c != '0';
  }
  return !nonzero || any;
}

int kl_traceparent_valid(const char *value, size_t len) {
  if (!value || len < KL__TRACEPARENT_LEN || len > KL_HEADER_VALUE_MAX)
    return 0;
  const char *v = value;
  if (!lower_hex(v, 2, 0) || strncmp(v, "ff", 2) == 0 || v[2] != '-' ||
      v[35] != '-' || v[52] != '-')
    return 0;
  if (!lower_hex(v + 3, 32, 1) || !lower_hex(v + 36, 16, 1) ||
      !lower_hex(v + 53, 2, 0))
    return 0;
  if (strncmp(v, "00", 2) == 0)
    return len == KL__TRACEPARENT_LEN;
  return len == KL__TRACEPARENT_LEN || v[KL__TRACEPARENT_LEN] == '-';
}

int kl_tracestate_valid(const char *value, size_t len) {
  if (!value || len > KL_TRACESTATE_MAX)
    return 0;
  for (size_t i = 0; i < len; i++)
    if (value[i] < 0x20 || value[i] > 0x7e)
      return 0;
  return 1;
}

const kl_header_t *kl_event_header(const kl_event_t *event, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; event && i < event->header_count; i++) {
    const kl_header_t *h = &event->headers[i];
    if (h->name_len == n && memcmp(h->name, name, n) == 0)
      return h;
  }
  return NULL;
}

const kl_header_t *kl__trace_parent(const kl_event_t *event) {
  const kl_header_t *h = kl_event_header(event, KL_TRACEPARENT);
  return h && kl_traceparent_valid(h->value, h->value_len) ? h : NULL;
}

kl_err_t kl__trace_check(const kl_event_t *event) {
  const kl_header_t *h = kl_event_header(event, KL_TRACEPARENT);
  if (h && !kl_traceparent_valid(h->value, h->value_len))
    return kl__err(KL_EDECODE_TYPE,
                   "header traceparent \"%.*s\" is not a W3C traceparent: "
                   "send \"00-<32 lower-case hex trace id>-<16 hex parent "
                   "id>-<2 hex flags>\" (ids not all zeros) or leave it out",
                   (int)(h->value_len < 80 ? h->value_len : 80), h->value);
  h = kl_event_header(event, KL_TRACESTATE);
  if (h && !kl_tracestate_valid(h->value, h->value_len))
    return kl__err(KL_EDECODE_TYPE,
                   "header tracestate is %zu bytes or holds a character "
                   "outside printable ASCII: W3C allows at most %d "
                   "printable characters; shorten it or leave it out",
                   h->value_len, KL_TRACESTATE_MAX);
  return KL_OK;
}
