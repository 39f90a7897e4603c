/*
 * libFuzzer target for the exec handler's lines (handlers/exec_line.c).
 *
 * 1. The input as an answer line a child wrote: the parser must not crash,
 *    overread or leak; it accepts only ok/retry/fail, an ok carries no
 *    error text, a retry or fail always does, a refused line says why, and
 *    parsing twice gives the same answer. A line with a key given twice is
 *    refused, an echoed "seq" is 1..2^63-1, and an "emit" goes through
 *    kl__exec_emit() (without a txn, so any entry it accepts fails at
 *    kl_txn_emit()): a verdict other than ok always says why. A "cancel"
 *    likewise goes through kl__exec_cancel() without a txn: only an empty
 *    one is ok, and a refusal says why.
 * 2. The input as event fields (key, id, type, payload, split at the first
 *    three 0xff bytes): the request line, with its seq, must be one JSON
 *    object whose "seq" and "id" are the ones given.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "handlers/exec_line.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* The emit array @p emit through kl__exec_emit(), with no txn. */
static void check_emit(json_t *emit) {
  char err[512];
  memset(err, 'x', sizeof(err));
  kl_handler_result_t r = kl__exec_emit(emit, "dead", NULL, err, sizeof(err));
  CHECK(r == KL_HANDLER_OK || r == KL_HANDLER_FAIL || r == KL_HANDLER_RETRY);
  CHECK(r != KL_HANDLER_OK || (json_is_array(emit) && !json_array_size(emit)));
  CHECK(r == KL_HANDLER_OK ||
        (memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0'));
}

/* The cancel array @p cancel through kl__exec_cancel(), with no txn. */
static void check_cancel(json_t *cancel) {
  static const kl_event_t event = {
      .key = "k", .key_len = 1, .id = "i", .id_len = 1};
  char err[512];
  memset(err, 'x', sizeof(err));
  kl_handler_result_t r =
      kl__exec_cancel(cancel, &event, NULL, err, sizeof(err));
  CHECK(r == KL_HANDLER_OK || r == KL_HANDLER_FAIL || r == KL_HANDLER_RETRY);
  CHECK(r != KL_HANDLER_OK ||
        (json_is_array(cancel) && !json_array_size(cancel)));
  CHECK(r == KL_HANDLER_OK ||
        (memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0'));
}

/* 1 when the input is JSON whose objects have some key twice. */
static int has_duplicate_key(const uint8_t *data, size_t size) {
  json_error_t jerr;
  json_t *loose = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &jerr);
  json_t *strict = json_loadb((const char *)data, size,
                              JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  int twice = loose && !strict;
  json_decref(loose);
  json_decref(strict);
  return twice;
}

static void check_answer(const uint8_t *data, size_t size) {
  kl__exec_answer_t a, b;
  int rc = kl__exec_answer_parse((const char *)data, size, &a);
  CHECK(memchr(a.error, '\0', sizeof(a.error)) != NULL);
  CHECK(kl__exec_answer_parse((const char *)data, size, &b) == rc);
  CHECK((a.emit == NULL) == (b.emit == NULL));
  CHECK(!a.emit || a.result == KL_HANDLER_OK);
  CHECK((a.cancel == NULL) == (b.cancel == NULL));
  CHECK(!a.cancel || a.result == KL_HANDLER_OK);
  CHECK(rc < 0 || !has_duplicate_key(data, size));
  CHECK(!a.has_seq || (a.seq >= 1 && a.seq <= (uint64_t)INT64_MAX));
  if (a.emit)
    check_emit(a.emit);
  if (a.cancel)
    check_cancel(a.cancel);
  json_decref(a.emit); /* the caller's references (handlers/exec.h) */
  json_decref(b.emit);
  json_decref(a.cancel);
  json_decref(b.cancel);
  a.emit = b.emit = a.cancel = b.cancel = NULL;
  CHECK(memcmp(&a, &b, sizeof(a)) == 0);
  if (rc < 0) {
    CHECK(a.error[0] != '\0');
    return;
  }
  CHECK(a.result == KL_HANDLER_OK || a.result == KL_HANDLER_RETRY ||
        a.result == KL_HANDLER_FAIL);
  CHECK((a.result == KL_HANDLER_OK) == (a.error[0] == '\0'));
  CHECK(a.has_seq || a.seq == 0);
}

/* Splits the input at the first three 0xff bytes into key, id, type and
 * the payload. */
static void check_request(const uint8_t *data, size_t size) {
  const char *part[4] = {"", "", "", ""};
  size_t len[4] = {0, 0, 0, 0};
  int n = 0;
  const uint8_t *start = data;
  for (size_t i = 0; i <= size && n < 4; i++)
    if (i == size || (data[i] == 0xff && n < 3)) {
      part[n] = (const char *)start;
      len[n++] = (size_t)(data + i - start);
      start = data + i + 1;
    }
  if (n == 4) /* the payload is the rest */
    len[3] = size - (size_t)((const uint8_t *)part[3] - data);
  kl_event_t event = {.key = part[0],
                      .key_len = len[0],
                      .id = part[1],
                      .id_len = len[1],
                      .type = part[2],
                      .type_len = len[2],
                      .ts = 1,
                      .payload = part[3],
                      .payload_len = len[3]};
  kl_fence_t fence = {"events", 1, 2, 3};
  size_t line_len;
  char *line = kl__exec_request(&event, &fence, &line_len);
  if (!line) /* an id or type that is not UTF-8 has no JSON string */
    return;
  uint64_t seq = size * 7919u;
  size_t pre = kl__exec_request_seq(line, seq);
  const char *text = line + KL__EXEC_SEQ_ROOM - pre;
  CHECK(text[pre + line_len - 1] == '\n');
  json_error_t jerr;
  /* A key with a NUL is \u0000 in JSON: valid, but jansson wants a flag. */
  json_t *obj = json_loadb(text, pre + line_len - 1, JSON_ALLOW_NUL, &jerr);
  CHECK(json_is_object(obj));
  CHECK((uint64_t)json_integer_value(json_object_get(obj, "seq")) == seq);
  json_t *id = json_object_get(obj, "id");
  if (id)
    CHECK(json_string_length(id) == len[1] &&
          memcmp(json_string_value(id), part[1], len[1]) == 0);
  json_decref(obj);
  free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_answer(data, size);
  check_request(data, size);
  return 0;
}
