/*
 * The exec handler's two line formats (handlers/exec.h): the request
 * keylane writes for an event, and the answer a child writes back. Apart
 * from the process handling so the answer parser can be fuzzed alone
 * (tests/fuzz/fuzz_exec_answer.c).
 */
#include "handlers/exec_line.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "event/event_json.h"
#include "event/trace.h"
#include "common/internal.h"
#include "common/json_msgpack.h"

static int exec_set_b64(json_t *obj, const char *name, const void *data,
                        size_t len) {
  char *b64 = malloc(kl__base64_encoded_len(len) + 1);
  if (!b64)
    return -1;
  kl__base64_encode(data, len, b64);
  int rc = json_object_set_new(obj, name, json_string(b64));
  free(b64);
  return rc;
}

/* The event's W3C trace context, when it has a valid one: the child
 * starts its span as a child of it (README "Trace context"). */
static void exec_set_trace(json_t *obj, const kl_event_t *event) {
  const kl_header_t *parent = kl__trace_parent(event);
  if (!parent)
    return;
  json_object_set_new(obj, KL_TRACEPARENT,
                      json_stringn(parent->value, parent->value_len));
  const kl_header_t *state = kl_event_header(event, KL_TRACESTATE);
  if (state && kl_tracestate_valid(state->value, state->value_len))
    json_object_set_new(obj, KL_TRACESTATE,
                        json_stringn(state->value, state->value_len));
}

static json_t *exec_request_obj(const kl_event_t *event,
                                const kl_fence_t *fence) {
  json_t *obj = json_object();
  json_t *payload = NULL;
  if (!obj)
    return NULL;
  int bad = 0;
  json_object_set_new(obj, "topic", json_string(fence->topic));
  json_t *key = json_stringn(event->key, event->key_len); /* NULL: not UTF-8 */
  if (key)
    json_object_set_new(obj, "key", key);
  else
    bad |= exec_set_b64(obj, "key_b64", event->key, event->key_len);
  json_object_set_new(obj, "id", json_stringn(event->id, event->id_len));
  json_object_set_new(obj, "type", json_stringn(event->type, event->type_len));
  json_object_set_new(obj, "ts", json_integer(event->ts));
  json_object_set_new(obj, "partition", json_integer(fence->partition));
  json_object_set_new(obj, "offset", json_integer(fence->offset));
  json_object_set_new(obj, "epoch", json_integer((json_int_t)fence->epoch));
  if (event->not_before > 0) /* a delayed event, run once its time came */
    json_object_set_new(obj, "not_before", json_integer(event->not_before));
  exec_set_trace(obj, event);
  if (event->payload_len &&
      kl__msgpack_to_json(event->payload, event->payload_len, &payload) ==
          KL_OK)
    json_object_set_new(obj, "payload", payload);
  else
    bad |= exec_set_b64(obj, "payload_b64", event->payload, event->payload_len);
  if (bad) {
    json_decref(obj);
    return NULL;
  }
  return obj;
}

char *kl__exec_request(const kl_event_t *event, const kl_fence_t *fence,
                       size_t *len) {
  json_t *obj = exec_request_obj(event, fence);
  char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  if (!text)
    return NULL;
  /* The text without its "{", after room for the seq prefix, then "\n". */
  size_t n = strlen(text) - 1;
  char *line = malloc(KL__EXEC_SEQ_ROOM + n + 2);
  if (line) {
    memcpy(line + KL__EXEC_SEQ_ROOM, text + 1, n);
    line[KL__EXEC_SEQ_ROOM + n] = '\n';
    line[KL__EXEC_SEQ_ROOM + n + 1] = '\0';
    *len = n + 1;
  }
  free(text);
  return line;
}

size_t kl__exec_request_seq(char *line, uint64_t seq) {
  char prefix[KL__EXEC_SEQ_ROOM + 1];
  int n = snprintf(prefix, sizeof(prefix), "{\"seq\":%llu,",
                   (unsigned long long)seq);
  memcpy(line + KL__EXEC_SEQ_ROOM - n, prefix, (size_t)n);
  return (size_t)n;
}

static void exec_answer_error(json_t *obj, kl__exec_answer_t *answer) {
  json_t *error = json_object_get(obj, "error");
  const char *text = json_string_value(error);
  char *dumped = text || !error ? NULL : json_dumps(error, JSON_COMPACT);
  snprintf(answer->error, sizeof(answer->error), "exec handler: %s",
           text     ? text
           : dumped ? dumped
                    : "no error given");
  free(dumped);
}

/* Reads "seq" when present: 0, or -1 when it is not one keylane gives
 * (1..2^63-1: jansson's integers; none is 0). */
static int exec_answer_seq(json_t *obj, kl__exec_answer_t *answer) {
  json_t *seq = json_object_get(obj, "seq");
  if (!seq)
    return 0;
  if (!json_is_integer(seq) || json_integer_value(seq) < 1)
    return -1;
  answer->has_seq = 1;
  answer->seq = (uint64_t)json_integer_value(seq);
  return 0;
}

int kl__exec_answer_parse(const char *line, size_t len,
                          kl__exec_answer_t *answer) {
  memset(answer, 0, sizeof(*answer));
  json_error_t jerr;
  /* A key given twice would be taken last-wins: which "seq", which
   * "status"? Such a line is no answer. */
  json_t *obj = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
  const char *status = json_string_value(json_object_get(obj, "status"));
  int rc = 0;
  if (status && strcmp(status, "ok") == 0)
    answer->result = KL_HANDLER_OK;
  else if (status && strcmp(status, "retry") == 0)
    answer->result = KL_HANDLER_RETRY;
  else if (status && strcmp(status, "fail") == 0)
    answer->result = KL_HANDLER_FAIL;
  else
    rc = -1;
  int shown = len > 60 ? 60 : (int)len; /* @p line need not end in NUL */
  if (!obj) {
    snprintf(answer->error, sizeof(answer->error),
             "answered garbage, not JSON (%s): \"%.*s\"", jerr.text, shown,
             line);
  } else if (rc == 0 && exec_answer_seq(obj, answer) < 0) {
    snprintf(answer->error, sizeof(answer->error),
             "answered a \"seq\" that is not a whole number from 1 to "
             "2^63-1 (echo the request's): \"%.*s\"",
             shown, line);
    rc = -1;
  } else if (rc < 0) {
    snprintf(answer->error, sizeof(answer->error),
             "answered garbage: "
             "\"%.*s\" is not {\"seq\":N,\"status\":\"ok\"|\"retry\"|"
             "\"fail\"}",
             shown, line);
  } else if (answer->result != KL_HANDLER_OK) {
    exec_answer_error(obj, answer);
  } else if (json_object_get(obj, "emit")) {
    answer->emit = json_incref(json_object_get(obj, "emit"));
  }
  json_decref(obj);
  return rc;
}

static kl_err_t emit_refuse(char *errbuf, size_t size, size_t i,
                            const char *fmt, ...) KL__PRINTF(4, 5);
static kl_err_t emit_refuse(char *errbuf, size_t size, size_t i,
                            const char *fmt, ...) {
  int n = snprintf(errbuf, size, "exec handler: \"emit\"[%zu]: ", i);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < size)
    vsnprintf(errbuf + n, size - (size_t)n, fmt, ap);
  va_end(ap);
  return KL_EINVAL;
}

/* The fields of an emit entry; "id" and "headers", which an event written
 * as JSON has, are refused with their reasons. */
static kl_err_t emit_fields(json_t *item, size_t i, char *errbuf, size_t size) {
  static const char *const known[] = {
      "topic", "key", "type", "payload", "payload_b64", "not_before", "delay"};
  const size_t n = sizeof(known) / sizeof(known[0]);
  static const struct {
    const char *name, *why;
  } refused[] = {
      {"id", "\"id\" is not allowed: keylane derives a follow-up's id from "
             "its source event's place in the log "
             "(~TOPIC/PARTITION/OFFSET/INDEX), so that it can never collide "
             "with an id a client chose; drop \"id\""},
      {"headers", "headers on follow-ups are not supported yet (a "
                  "follow-up carries only its source's trace context); "
                  "drop \"headers\" and put the data in the payload"}};
  const char *name;
  json_t *v;
  json_object_foreach(item, name, v) {
    for (size_t k = 0; k < 2; k++)
      if (strcmp(name, refused[k].name) == 0)
        return emit_refuse(errbuf, size, i, "%s", refused[k].why);
    size_t k = 0;
    while (k < n && strcmp(name, known[k]) != 0)
      k++;
    if (k == n)
      return emit_refuse(errbuf, size, i,
                         "unknown field \"%.64s\"; an emit takes topic, key, "
                         "type, payload or payload_b64, and not_before or "
                         "delay",
                         name);
  }
  return KL_OK;
}

/* The emit's "topic" into *@p out, NULL for the event's own: a topic
 * clients may publish to, which is not the worker's dead-letter topic. */
static kl_err_t emit_topic(json_t *item, size_t i, const char *dlq_topic,
                           const char **out, char *errbuf, size_t size) {
  json_t *topic = json_object_get(item, "topic");
  *out = json_string_value(topic);
  if (!topic)
    return KL_OK;
  if (!*out || !json_string_length(topic))
    return emit_refuse(errbuf, size, i,
                       "\"topic\" must be a topic name; omit it to emit to "
                       "the event's own topic");
  /* kl_txn_emit() refuses names that are invalid or reserved to all */
  if (dlq_topic && strcmp(*out, dlq_topic) == 0)
    return emit_refuse(errbuf, size, i,
                       "topic \"%s\" is the worker's dead-letter topic "
                       "(worker.dlq.topic): a handler may not emit to it",
                       *out);
  return KL_OK;
}

/* One follow-up of "emit": KL_OK, or the reason in @p errbuf. Past its
 * topic, an emit is an event written as JSON (event/event_json.h) without
 * "id" and "headers", read by the same code as the gateway's: its
 * "not_before" or "delay" too. */
static kl_err_t emit_one(json_t *item, size_t i, const char *dlq_topic,
                         kl_txn_t *txn, char *errbuf, size_t size) {
  if (!json_is_object(item))
    return emit_refuse(errbuf, size, i,
                       "not an object {\"topic\"?, \"key\", \"type\", "
                       "\"payload\" or \"payload_b64\"}");
  const char *topic;
  kl_err_t err = emit_fields(item, i, errbuf, size);
  if (!err)
    err = emit_topic(item, i, dlq_topic, &topic, errbuf, size);
  if (err)
    return err;
  json_t *event = json_copy(item); /* shallow: borrows item's values */
  if (!event)
    return KL_ENOMEM;
  json_object_del(event, "topic");
  kl__jevent_t je;
  char why[256];
  err = kl__jevent_parse(&je, event, false, why, sizeof(why));
  kl_emit_opts_t opts = {sizeof(opts), je.ev.not_before};
  if (err == KL_EINVAL)
    emit_refuse(errbuf, size, i, "%s", why);
  else if (!err && (err = kl_txn_emit_opts(txn, topic, je.ev.key, je.ev.key_len,
                                           je.ev.type, je.ev.payload,
                                           je.ev.payload_len, &opts)))
    emit_refuse(errbuf, size, i, "%s", kl_err_detail());
  kl__jevent_clear(&je);
  json_decref(event);
  return err;
}

kl_handler_result_t kl__exec_emit(json_t *emit, const char *dlq_topic,
                                  kl_txn_t *txn, char *errbuf,
                                  size_t errbuf_size) {
  if (!json_is_array(emit)) {
    snprintf(errbuf, errbuf_size,
             "exec handler: \"emit\" is not an array "
             "of follow-up events");
    return KL_HANDLER_FAIL;
  }
  for (size_t i = 0; i < json_array_size(emit); i++) {
    kl_err_t err = emit_one(json_array_get(emit, i), i, dlq_topic, txn, errbuf,
                            errbuf_size);
    if (err == KL_ENOMEM)
      snprintf(errbuf, errbuf_size,
               "exec handler: out of memory for \"emit\"[%zu]", i);
    if (err)
      return err == KL_ENOMEM ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
  }
  return KL_HANDLER_OK;
}
