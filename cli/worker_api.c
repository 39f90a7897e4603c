#include "cli/worker_api.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/strbuf.h"

#define KL_API_JSON "application/json"

static void api_json(kl__http_req_t *req, int status, json_t *doc) {
  char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  if (!text) {
    static const char oom[] = "{\"error\":\"out of memory\"}";
    kl__http_respond(req, 503, KL_API_JSON, NULL, oom, sizeof(oom) - 1);
    return;
  }
  kl__http_respond(req, status, KL_API_JSON,
                   status == 405 ? "Allow: GET\r\n" : NULL, text, strlen(text));
  free(text);
}

static void api_error(kl__http_req_t *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void api_error(kl__http_req_t *req, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  api_json(req, status, json_pack("{s:s}", "error", msg));
}

static json_t *api_text(const void *bytes, size_t len) {
  char *out = malloc(KL__ESCAPED_SIZE(len));
  json_t *s =
      out ? json_string(kl__escape(out, KL__ESCAPED_SIZE(len), bytes, len))
          : NULL;
  free(out);
  return s;
}

/* ---- /v1/partitions ---- */

static const char *api_status(kl_worker_partition_status_t s) {
  static const char *names[] = {"OK", "WARN", "STALL", "ERR"};
  return (unsigned)s < 4 ? names[s] : "ERR";
}

static int api_partition(void *opaque, const kl_worker_partition_t *p) {
  json_t *parts = opaque;
  json_t *o = json_pack(
      "{s:i, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, "
      "s:I, s:I, s:I, s:b, s:b, s:b, s:b}",
      "partition", (int)p->partition, "owned",
      (p->flags & KL_WORKER_PARTITION_OWNED) != 0, "status",
      api_status(p->status), "epoch", (json_int_t)p->epoch, "watermark",
      (json_int_t)p->watermark, "committed", (json_int_t)p->committed, "high",
      (json_int_t)p->high, "lag", (json_int_t)p->lag, "lag_seconds",
      p->lag_seconds, "records", (json_int_t)p->records, "retrying",
      (json_int_t)p->waiting, "running", (json_int_t)p->running, "outbox",
      (json_int_t)p->outbox, "last_commit_ms", (json_int_t)p->last_commit_ms,
      "unmoved_ms", (json_int_t)p->unmoved_ms, "oldest_ts_ms",
      (json_int_t)p->oldest_ts_ms, "stopped",
      (p->flags & KL_WORKER_PARTITION_STOPPED) != 0, "stalled",
      (p->flags & KL_WORKER_PARTITION_STALLED) != 0, "resized",
      (p->flags & KL_WORKER_PARTITION_RESIZED) != 0, "has_retries",
      (p->flags & KL_WORKER_PARTITION_RETRYING) != 0);
  if (o && p->stop_reason)
    json_object_set_new(o, "stop_reason", json_string(p->stop_reason));
  if (o && p->stop_detail)
    json_object_set_new(o, "stop_detail", json_string(p->stop_detail));
  return !o || json_array_append_new(parts, o) != 0;
}

static void api_partitions(kl__http_req_t *req, kl_worker_t *worker,
                           const char *topic, const char *group) {
  json_t *parts = json_array();
  if (parts &&
      kl_worker_foreach_partition(worker, api_partition, parts) != KL_OK) {
    json_decref(parts);
    api_error(req, 503, "%s", kl_err_detail());
    return;
  }
  size_t i;
  json_t *p;
  json_array_foreach(parts, i, p)
      json_object_set_new(p, "topic", json_string(topic));
  api_json(req, 200,
           parts ? json_pack("{s:s, s:s, s:o}", "topic", topic, "group", group,
                             "partitions", parts)
                 : NULL);
}

/* ---- /v1/keys ---- */

static const char *api_key_state(kl_worker_key_state_t s) {
  return s == KL_WORKER_KEY_RETRYING ? "retrying"
         : s == KL_WORKER_KEY_PARKED ? "parked"
                                     : "waiting";
}

static json_t *api_key_json(const kl_worker_key_t *k) {
  json_t *o = json_pack(
      "{s:o, s:i, s:s, s:I, s:I, s:i, s:I, s:I, s:I, s:s, s:s}", "key",
      api_text(k->key, k->key_len), "partition", (int)k->partition, "state",
      api_key_state(k->state), "offset", (json_int_t)k->offset, "pending",
      (json_int_t)k->pending, "attempts", k->attempts, "next_retry_ms",
      (json_int_t)k->next_retry_ms, "first_failure_ms",
      (json_int_t)k->first_failure_ms, "last_failure_ms",
      (json_int_t)k->last_failure_ms, "error", k->error, "parked", k->parked);
  return o;
}

typedef struct api_page {
  json_t *keys;
  int32_t last_partition;
  int64_t last_offset;
} api_page_t;

static int api_key(void *opaque, const kl_worker_key_t *k) {
  api_page_t *page = opaque;
  page->last_partition = k->partition;
  page->last_offset = k->offset;
  json_t *o = api_key_json(k);
  return !o || json_array_append_new(page->keys, o) != 0;
}

/* state=a,b: the mask; 0 with the error in @p why. */
static unsigned api_states(const char *v, size_t len, char *why, size_t size) {
  static const struct {
    const char *name;
    unsigned bit;
  } names[] = {{"waiting", KL_WORKER_KEY_WAITING},
               {"retrying", KL_WORKER_KEY_RETRYING},
               {"parked", KL_WORKER_KEY_PARKED}};
  unsigned mask = 0;
  for (size_t at = 0; at <= len;) {
    size_t n = 0;
    while (at + n < len && v[at + n] != ',')
      n++;
    unsigned bit = 0;
    for (size_t i = 0; i < 3 && !bit; i++)
      if (strlen(names[i].name) == n && strncmp(v + at, names[i].name, n) == 0)
        bit = names[i].bit;
    if (!bit) {
      char shown[KL__ESCAPED_SIZE(32)];
      snprintf(why, size,
               "state=%s is not a key state: use waiting, retrying or "
               "parked, or several joined by commas",
               kl__escape(shown, sizeof(shown), v + at, n < 32 ? n : 32));
      return 0;
    }
    mask |= bit;
    at += n + 1;
  }
  return mask;
}

/* A whole decimal of at most 18 digits, into *out; -1 when it is not. */
static int api_number(const char *v, size_t len, int64_t *out) {
  if (!len || len > 18)
    return -1;
  int64_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (v[i] < '0' || v[i] > '9')
      return -1;
    n = n * 10 + (v[i] - '0');
  }
  *out = n;
  return 0;
}

int kl__worker_api_keys_query(const char *query, kl_worker_keys_query_t *q,
                              char *why, size_t size) {
  size_t len;
  const char *v;
  int64_t n;
  *q = (kl_worker_keys_query_t){.size = sizeof(*q),
                                .limit = KL_WORKER_API_KEYS_PAGE};
  if ((v = kl__http_query(query, "state", &len)) &&
      !(q->states = api_states(v, len, why, size)))
    return -1;
  if ((v = kl__http_query(query, "limit", &len))) {
    if (api_number(v, len, &n) || n < 1 || n > KL_WORKER_KEYS_MAX) {
      snprintf(why, size, "limit= takes a whole number from 1 to %d",
               KL_WORKER_KEYS_MAX);
      return -1;
    }
    q->limit = (size_t)n;
  }
  if ((v = kl__http_query(query, "from", &len))) {
    const char *colon = memchr(v, ':', len);
    int64_t part;
    if (!colon || api_number(v, (size_t)(colon - v), &part) ||
        part > INT32_MAX ||
        api_number(colon + 1, len - (size_t)(colon + 1 - v), &n)) {
      snprintf(why, size,
               "from= takes PARTITION:OFFSET, as a page's \"next\" gives it");
      return -1;
    }
    q->from_partition = (int32_t)part;
    q->from_offset = n;
  }
  return 0;
}

long kl__worker_api_key(const char *encoded, char *out, char *why,
                        size_t size) {
  size_t len = strlen(encoded);
  long n = len <= 3 * KL_KEY_MAX ? kl__http_pct_decode(encoded, len, out) : -1;
  if (n > 0 && n <= KL_KEY_MAX)
    return n;
  snprintf(why, size,
           "/v1/keys/KEY takes a key of 1 to %d bytes, percent-encoded "
           "(%%XX for a byte that is not a letter, digit or -._~)",
           KL_KEY_MAX);
  return -1;
}

static void api_keys(kl__http_req_t *req, kl_worker_t *worker,
                     const char *query) {
  kl_worker_keys_query_t q;
  char why[256];
  if (kl__worker_api_keys_query(query, &q, why, sizeof(why))) {
    api_error(req, 400, "%s", why);
    return;
  }
  api_page_t page = {json_array(), -1, -1};
  size_t total = 0;
  if (!page.keys) {
    api_json(req, 503, NULL);
    return;
  }
  if (kl_worker_foreach_key(worker, &q, api_key, &page, &total) != KL_OK) {
    json_decref(page.keys);
    api_error(req, 503, "%s", kl_err_detail());
    return;
  }
  json_t *next = json_null();
  if (json_array_size(page.keys) == q.limit) {
    char at[64];
    snprintf(at, sizeof(at), "%" PRId32 ":%" PRId64, page.last_partition,
             page.last_offset + 1);
    next = json_string(at);
  }
  api_json(req, 200,
           json_pack("{s:o, s:I, s:o}", "keys", page.keys, "total",
                     (json_int_t)total, "next", next));
}

static int api_one_key(void *opaque, const kl_worker_key_t *k) {
  *(json_t **)opaque = api_key_json(k);
  return 1;
}

static void api_key_get(kl__http_req_t *req, kl_worker_t *worker,
                        const char *encoded) {
  char key[3 * KL_KEY_MAX], why[256];
  long n = kl__worker_api_key(encoded, key, why, sizeof(why));
  if (n < 0) {
    api_error(req, 400, "%s", why);
    return;
  }
  kl_worker_keys_query_t q = {
      .size = sizeof(q), .limit = 1, .key = key, .key_len = (size_t)n};
  json_t *found = NULL;
  kl_err_t err = kl_worker_foreach_key(worker, &q, api_one_key, &found, NULL);
  if (err)
    api_error(req, 503, "%s", kl_err_detail());
  else if (!found)
    api_json(req, 404,
             json_pack("{s:o, s:s}", "key", api_text(key, (size_t)n), "error",
                       "this key holds no event in this worker's window: it "
                       "is applied up to the window, or its partition is "
                       "another worker's"));
  else
    api_json(req, 200, found);
}

/* ---- /v1/fences ---- */

static int api_fence(void *opaque, const kl_worker_fence_t *f) {
  json_array_append_new(opaque, json_pack("{s:i, s:I, s:I, s:I}", "partition",
                                          (int)f->partition, "epoch",
                                          (json_int_t)f->epoch, "current_epoch",
                                          (json_int_t)f->current_epoch, "at_ms",
                                          (json_int_t)f->at_ms));
  return 0;
}

static void api_fences(kl__http_req_t *req, kl_worker_t *worker) {
  json_t *fences = json_array();
  if (fences && kl_worker_foreach_fence(worker, api_fence, fences) != KL_OK) {
    json_decref(fences);
    api_error(req, 503, "%s", kl_err_detail());
    return;
  }
  api_json(req, 200,
           fences ? json_pack("{s:o, s:i}", "fences", fences, "kept",
                              KL_WORKER_FENCES_MAX)
                  : NULL);
}

int kl__worker_api(kl__http_req_t *req, kl_worker_t *worker, const char *topic,
                   const char *group, int is_get, const char *path,
                   const char *query) {
  int keys = strncmp(path, "/v1/keys/", 9) == 0;
  if (strcmp(path, "/v1/partitions") != 0 && strcmp(path, "/v1/keys") != 0 &&
      strcmp(path, "/v1/fences") != 0 && !keys)
    return 0;
  if (!is_get)
    api_error(req, 405, "use GET: the worker's API is read-only");
  else if (path[4] == 'f')
    api_fences(req, worker);
  else if (path[4] == 'p')
    api_partitions(req, worker, topic, group);
  else if (keys)
    api_key_get(req, worker, path + 9);
  else
    api_keys(req, worker, query);
  return 1;
}
