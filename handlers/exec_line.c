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
#include "common/strbuf.h"

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
  size_t len = json_string_length(error);
  /* a text holding \u0000 is shown whole, its NUL escaped, not cut there */
  char *escaped =
      text && strlen(text) != len ? malloc(KL__ESCAPED_SIZE(len)) : NULL;
  if (escaped)
    text = kl__escape(escaped, KL__ESCAPED_SIZE(len), text, len);
  char *dumped = text || !error ? NULL : json_dumps(error, JSON_COMPACT);
  snprintf(answer->error, sizeof(answer->error), "exec handler: %s",
           text     ? text
           : dumped ? dumped
                    : "no error given");
  free(dumped);
  free(escaped);
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
   * "status"? Such a line is no answer. A string may hold \u0000, as JSON
   * allows: the field that cannot carry it refuses it by name (an emit's
   * as the gateway does, a cancel's id as kl_txn_cancel() does), so that
   * the event fails with the reason and the child, which answered a line
   * in step, is not taken for one that lost its way. */
  json_t *obj =
      json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  json_t *jstatus = json_object_get(obj, "status");
  const char *status = json_string_value(jstatus);
  if (status && strlen(status) != json_string_length(jstatus))
    status = NULL; /* "ok\u0000..." is no status */
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
  } else {
    answer->emit = json_incref(json_object_get(obj, "emit"));
    answer->cancel = json_incref(json_object_get(obj, "cancel"));
  }
  json_decref(obj);
  return rc;
}

/* The reason entry @p i of the answer's array @p array ("emit",
 * "cancel") is refused, into @p errbuf. @returns KL_EINVAL. */
static kl_err_t entry_refuse(char *errbuf, size_t size, const char *array,
                             size_t i, const char *fmt, ...) KL__PRINTF(5, 6);
static kl_err_t entry_refuse(char *errbuf, size_t size, const char *array,
                             size_t i, const char *fmt, ...) {
  int n = snprintf(errbuf, size, "exec handler: \"%s\"[%zu]: ", array, i);
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
        return entry_refuse(errbuf, size, "emit", i, "%s", refused[k].why);
    size_t k = 0;
    while (k < n && strcmp(name, known[k]) != 0)
      k++;
    if (k == n)
      return entry_refuse(errbuf, size, "emit", i,
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
  if (!*out || !json_string_length(topic) ||
      strlen(*out) != json_string_length(topic))
    return entry_refuse(errbuf, size, "emit", i,
                        "\"topic\" must be a topic name (with no NUL); omit "
                        "it to emit to the event's own topic");
  /* kl_txn_emit() refuses names that are invalid or reserved to all */
  if (dlq_topic && strcmp(*out, dlq_topic) == 0)
    return entry_refuse(errbuf, size, "emit", i,
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
    return entry_refuse(errbuf, size, "emit", i,
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
  err = kl__jevent_parse(&je, event, why, sizeof(why));
  kl_emit_opts_t opts = {sizeof(opts), je.ev.not_before};
  if (err == KL_EINVAL)
    entry_refuse(errbuf, size, "emit", i, "%s", why);
  else if (!err && (err = kl_txn_emit_opts(txn, topic, je.ev.key, je.ev.key_len,
                                           je.ev.type, je.ev.payload,
                                           je.ev.payload_len, &opts)))
    entry_refuse(errbuf, size, "emit", i, "%s", kl_err_detail());
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

/* ---- "cancel": timers of the event's own key ---- */

/* The "id" of a cancel entry into @p id, @p len: KL_OK, or the reason. */
static kl_err_t cancel_id(json_t *item, size_t i, const char **id, size_t *len,
                          char *errbuf, size_t size) {
  json_t *v = json_object_get(item, "id");
  *id = json_string_value(v);
  *len = json_string_length(v);
  if (!v)
    return entry_refuse(errbuf, size, "cancel", i,
                        "\"id\" is missing: name the delayed event whose "
                        "timer to cancel, as {\"id\":\"...\"}");
  if (!*id)
    return entry_refuse(errbuf, size, "cancel", i,
                        "\"id\" is not a string: give the delayed event's "
                        "id, a string of 1 to %d bytes",
                        KL_ID_MAX);
  if (*len < 1 || *len > KL_ID_MAX)
    return entry_refuse(errbuf, size, "cancel", i,
                        "\"id\" is %zu bytes; an event's id is 1 to %d "
                        "bytes, so no timer has it",
                        *len, KL_ID_MAX);
  return KL_OK;
}

/* The "key" of a cancel entry, when given, is the event's: a handler
 * changes its own key only, whose lane orders the cancel and the firing
 * (kl_txn_cancel()). KL_OK, or the reason. */
static kl_err_t cancel_key(json_t *item, size_t i, const kl_event_t *event,
                           char *errbuf, size_t size) {
  json_t *v = json_object_get(item, "key");
  if (!v)
    return KL_OK;
  const char *key = json_string_value(v);
  size_t len = json_string_length(v);
  if (key && len == event->key_len && memcmp(key, event->key, len) == 0)
    return KL_OK;
  char own[KL__ESCAPED_SIZE(64)], given[KL__ESCAPED_SIZE(64)];
  kl__escape(own, sizeof(own), event->key, event->key_len);
  if (!key)
    return entry_refuse(errbuf, size, "cancel", i,
                        "\"key\" is not a string: give the event's key "
                        "(\"%s\") as a string, or leave it out",
                        own);
  return entry_refuse(errbuf, size, "cancel", i,
                      "key \"%s\" is not the event's (\"%s\"): a handler "
                      "cancels its own key's timers; to cancel another key's, "
                      "emit a follow-up to that key whose handler cancels it",
                      kl__escape(given, sizeof(given), key, len), own);
}

/* One entry of "cancel": KL_OK (also when no such timer waits), or the
 * error with the reason in @p errbuf. */
static kl_err_t cancel_one(json_t *item, size_t i, const kl_event_t *event,
                           kl_txn_t *txn, char *errbuf, size_t size) {
  if (!json_is_object(item))
    return entry_refuse(errbuf, size, "cancel", i,
                        "not an object {\"id\", \"key\"?}; cancel a "
                        "timer as {\"id\":\"...\"}");
  const char *name;
  json_t *v;
  json_object_foreach(item, name, v) {
    if (strcmp(name, "id") != 0 && strcmp(name, "key") != 0)
      return entry_refuse(errbuf, size, "cancel", i,
                          "unknown field \"%.64s\"; a cancel takes \"id\" "
                          "and, optionally, \"key\"",
                          name);
  }
  const char *id;
  size_t id_len;
  kl_err_t err = cancel_id(item, i, &id, &id_len, errbuf, size);
  if (!err)
    err = cancel_key(item, i, event, errbuf, size);
  if (err)
    return err;
  err = kl_txn_cancel(txn, event->key, event->key_len, id, id_len);
  /* No timer waits: it ran (before this event, in the key's order, so the
   * handler saw it), was cancelled, or never was. Cancelling is then
   * done, as clearTimeout() of a fired timer is. */
  if (err == KL_ENOTFOUND)
    return KL_OK;
  if (err)
    entry_refuse(errbuf, size, "cancel", i, "%s", kl_err_detail());
  return err;
}

kl_handler_result_t kl__exec_cancel(json_t *cancel, const kl_event_t *event,
                                    kl_txn_t *txn, char *errbuf,
                                    size_t errbuf_size) {
  if (!json_is_array(cancel) || json_array_size(cancel) > KL__EXEC_CANCEL_MAX) {
    snprintf(errbuf, errbuf_size,
             "exec handler: \"cancel\" must be an array of at most %d "
             "timers to cancel, [{\"id\":\"...\"}, ...]%s",
             KL__EXEC_CANCEL_MAX,
             json_is_array(cancel) ? "; cancel the rest from a follow-up "
                                     "to the key"
                                   : "");
    return KL_HANDLER_FAIL;
  }
  for (size_t i = 0; i < json_array_size(cancel); i++) {
    kl_err_t err = cancel_one(json_array_get(cancel, i), i, event, txn, errbuf,
                              errbuf_size);
    /* a bad entry fails the event; the store's failure retries it */
    if (err)
      return err == KL_EINVAL ? KL_HANDLER_FAIL : KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}
