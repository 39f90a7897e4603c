/* Topic names; see topic.h. */
#include "common/topic.h"

#include <string.h>

#include "common/internal.h"
#include "common/strbuf.h"

kl_err_t kl__topic_check(const char *topic, size_t len) {
  if (len == 0 || len > KL__TOPIC_NAME_MAX)
    return kl__err(KL_EINVAL, "topic name is %zu bytes: Kafka allows 1..%d",
                   len, KL__TOPIC_NAME_MAX);
  if ((len == 1 && topic[0] == '.') || (len == 2 && !memcmp(topic, "..", 2)))
    return kl__err(KL_EINVAL, "topic name \"%.*s\" is reserved by Kafka",
                   (int)len, topic);
  char shown[KL__ESCAPED_SIZE(KL__TOPIC_NAME_MAX)];
  for (size_t i = 0; i < len; i++)
    if (!topic[i] || !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                             "UVWXYZ0123456789._-",
                             topic[i]))
      return kl__err(KL_EINVAL,
                     "topic \"%s\" has the byte 0x%02x at %zu: Kafka allows "
                     "letters, digits, '.', '_' and '-'",
                     kl__escape(shown, sizeof(shown), topic, len),
                     (unsigned char)topic[i], i);
  return KL_OK;
}

const char *kl__topic_reserved(const char *topic) {
  size_t len = strlen(topic);
  if (strncmp(topic, "__", 2) == 0)
    return "internal to Kafka (__*)";
  if (len > 4 && strcmp(topic + len - 4, ".dlq") == 0)
    return "a dead-letter topic (*.dlq)";
  return NULL;
}
