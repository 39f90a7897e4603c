/*
 * Who may publish through the gateway, apart from tokens: which browser
 * origins, which body media types and which topics.
 *
 * A web page a developer visits can make the browser POST to a gateway on
 * their laptop (http://127.0.0.1:8080) without asking first when the body
 * is a form, text/plain, or has no type: a "simple" request, with no CORS
 * preflight. So the events route takes only application/json and
 * application/msgpack (a browser asks first for those, and the gateway
 * never says yes), and a request with an Origin header is served only
 * when that origin is on --allow-origin. Servers and curl send no Origin.
 *
 * All of this runs on the loop thread.
 */
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "broker/gateway_internal.h"

/* The next comma-separated item of @p *list, trimmed; @returns its length
 * (0 for an empty one) and moves *list past it, or -1 at the end. */
static long list_next(const char **list, const char **item) {
  const char *s = *list;
  if (!s || !*s)
    return -1;
  size_t len = strcspn(s, ",");
  *list = s[len] ? s + len + 1 : s + len;
  while (len && (*s == ' ' || *s == '\t'))
    s++, len--;
  while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
    len--;
  *item = s;
  return (long)len;
}

/* "scheme://host[:port]": what a browser sends, no path, no slash. */
static bool origin_form(const char *s, size_t len) {
  size_t scheme = 0;
  while (scheme < len && s[scheme] != ':' && s[scheme] != '/')
    scheme++;
  if (scheme == 0 || len - scheme <= 3 || memcmp(s + scheme, "://", 3) != 0)
    return false;
  for (size_t i = scheme + 3; i < len; i++)
    if (s[i] == '/' || s[i] == ' ' || s[i] == '?' || s[i] == '#')
      return false;
  return true;
}

kl_err_t kl__gw_origins_check(const char *list) {
  const char *item;
  long len;
  while ((len = list_next(&list, &item)) >= 0)
    if (!origin_form(item, (size_t)len))
      return kl__err(KL_ECONF,
                     "--allow-origin entry \"%.*s\" is not an origin: give "
                     "scheme://host[:port] as a browser sends it, e.g. "
                     "https://app.example.com, without a path or a "
                     "trailing slash",
                     (int)(len > 200 ? 200 : len), item);
  return KL_OK;
}

bool kl__gw_origin_ok(const kl__http_conn_t *conn) {
  const kl__http_parse_t *parse = &conn->parse;
  if (!parse->origin_seen)
    return true;
  if (parse->origin_bad)
    return false;
  const char *list = kl__gw_http_gateway(conn)->opts.allow_origins, *item;
  long len;
  while ((len = list_next(&list, &item)) >= 0)
    if ((size_t)len == parse->origin_len &&
        strncasecmp(item, parse->origin, (size_t)len) == 0)
      return true;
  return false;
}

int kl__gw_ctype_msgpack(const char *ctype) {
  size_t len = strcspn(ctype, ";");
  while (len && (ctype[len - 1] == ' ' || ctype[len - 1] == '\t'))
    len--;
  while (len && (*ctype == ' ' || *ctype == '\t'))
    ctype++, len--;
  static const struct {
    const char *type;
    int msgpack;
  } types[] = {{"application/json", 0},
               {"application/msgpack", 1},
               {"application/x-msgpack", 1},
               {"application/vnd.msgpack", 1}};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (len && strlen(types[i].type) == len &&
        strncasecmp(types[i].type, ctype, len) == 0)
      return types[i].msgpack;
  return -1;
}

bool kl__gw_ctype_ok(const char *ctype) {
  return kl__gw_ctype_msgpack(ctype) >= 0;
}

/* ---- topics ----
 *
 * A client that may publish to "<topic>.dlq" can forge dead letters that
 * `keylane replay --from-dlq` would apply, and "__*" are Kafka's own
 * (__consumer_offsets). Refused unless --allow-internal-topics. With
 * --allow-topics, only names matching an entry are served. */

/* An allow-list that lists nothing must not mean "any topic": an empty
 * value (a variable that expanded to nothing) is refused like an empty
 * entry, never read as the default. */
kl_err_t kl__gw_topics_check(const char *list) {
  const char *item, *rest = list;
  long len;
  while ((len = list_next(&rest, &item)) > 0 && len <= KL_GW_TOPIC_MAX)
    ;
  if (len < 0 && *list)
    return KL_OK;
  if (len > KL_GW_TOPIC_MAX)
    return kl__err(KL_ECONF,
                   "--allow-topics entry \"%.40s...\" is %ld bytes, longer "
                   "than a topic name may be (%d): give topic names or "
                   "patterns such as orders-*, separated by commas",
                   item, len, KL_GW_TOPIC_MAX);
  bool blank = strspn(list, ", \t") == strlen(list);
  return kl__err(KL_ECONF,
                 "--allow-topics \"%.200s\" %s: give topic names or patterns "
                 "such as orders-*, separated by commas, or leave the flag "
                 "out to allow any topic",
                 list, blank ? "names no topic" : "has an empty entry");
}

static bool topic_listed(const char *list, const char *topic) {
  const char *item;
  long len;
  char pattern[KL_GW_TOPIC_MAX + 1];
  while ((len = list_next(&list, &item)) >= 0) {
    if (len == 0 || len > KL_GW_TOPIC_MAX)
      continue;
    memcpy(pattern, item, (size_t)len);
    pattern[len] = '\0';
    if (fnmatch(pattern, topic, 0) == 0)
      return true;
  }
  return false;
}

static bool topic_internal(const char *topic) {
  size_t len = strlen(topic);
  return strncmp(topic, "__", 2) == 0 ||
         (len > 4 && strcmp(topic + len - 4, ".dlq") == 0);
}

bool kl__gw_topic_allowed(const kl__gateway_opts_t *o, const char *topic,
                          char *why, size_t size) {
  if (!o->allow_internal_topics && topic_internal(topic)) {
    snprintf(why, size,
             "topic \"%s\" is %s: clients may not publish to it; start the "
             "gateway with --allow-internal-topics to let them",
             topic,
             topic[0] == '_' ? "internal to Kafka (__*)"
                             : "a dead-letter topic (*.dlq)");
    return false;
  }
  if (o->allow_topics && !topic_listed(o->allow_topics, topic)) {
    snprintf(why, size,
             "topic \"%s\" is not in --allow-topics (%.200s): add it, or "
             "a pattern that matches it",
             topic, o->allow_topics);
    return false;
  }
  return true;
}
