/* A follow-up's id, written and parsed (emit_id.h). */
#include "event/emit_id.h"

#include <inttypes.h>
#include <stdio.h>

#include "common/bytes.h"
#include "common/topic.h"

size_t kl__emit_id(const kl__emit_src_t *src, char out[KL_ID_MAX + 1]) {
  size_t max = src->has_nonce ? KL__EMIT_TOPIC_MAX : KL__EMIT_TOPIC_MAX_V1;
  if (src->topic_len == 0 || src->topic_len > max)
    return 0;
  int n = snprintf(out, KL_ID_MAX + 1, "%c%.*s/%" PRId32 "/%" PRId64 "/%u",
                   KL_ID_RESERVED, (int)src->topic_len, src->topic,
                   src->partition, src->offset, src->index);
  if (n > 0 && src->has_nonce)
    n += snprintf(out + n, KL_ID_MAX + 1 - (size_t)n, "/%016" PRIx64,
                  src->nonce);
  return n > 0 && n <= KL_ID_MAX ? (size_t)n : 0;
}

/* The decimal number of @p len digits at @p s (at most @p max of them, no
 * leading zero), or -1; also -1 past INT64_MAX (19 digits may be). */
static int64_t emit_num(const char *s, size_t len, int max) {
  if (len == 0 || len > (size_t)max || (len > 1 && s[0] == '0'))
    return -1;
  int64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9' || v > (INT64_MAX - (s[i] - '0')) / 10)
      return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

/* The nonce: exactly 16 lowercase hex digits, the one spelling
 * kl__emit_id() writes, so that one nonce has one id. */
static int emit_nonce(const char *s, size_t len, uint64_t *nonce) {
  if (len != 16)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    int d = s[i] >= 'A' && s[i] <= 'F' ? -1 : kl__hex_value(s[i]);
    if (d < 0)
      return -1;
    v = v << 4 | (unsigned)d;
  }
  *nonce = v;
  return 0;
}

int kl__emit_id_parse(const char *id, size_t id_len, kl__emit_src_t *src) {
  if (id_len < 8 || id[0] != KL_ID_RESERVED)
    return -1;
  /* A topic holds no '/' (Kafka's rule): 3 of them are the first form,
   * 4 the form with a nonce, the last one before it. */
  size_t at[5], n = 0;
  for (size_t i = id_len; i > 1; i--)
    if (id[i - 1] == '/' && n++ < 5)
      at[n - 1] = i - 1;
  if (n != 3 && n != 4)
    return -1;
  kl__emit_src_t s = {.has_nonce = n == 4};
  size_t end = id_len, k = 0;
  if (s.has_nonce && emit_nonce(id + at[0] + 1, id_len - at[0] - 1, &s.nonce))
    return -1;
  if (s.has_nonce)
    end = at[k++];
  int64_t index = emit_num(id + at[k] + 1, end - at[k] - 1, 2);
  int64_t offset = emit_num(id + at[k + 1] + 1, at[k] - at[k + 1] - 1, 19);
  int64_t partition =
      emit_num(id + at[k + 2] + 1, at[k + 1] - at[k + 2] - 1, 10);
  s.topic = id + 1;
  s.topic_len = at[k + 2] - 1;
  if (index < 0 || index >= KL__EMIT_MAX || offset < 0 || partition < 0 ||
      partition > INT32_MAX ||
      s.topic_len >
          (s.has_nonce ? KL__EMIT_TOPIC_MAX : KL__EMIT_TOPIC_MAX_V1) ||
      kl__topic_check(s.topic, s.topic_len) != KL_OK)
    return -1;
  s.partition = (int32_t)partition;
  s.offset = offset;
  s.index = (unsigned)index;
  *src = s;
  return 0;
}
