/*
 * libFuzzer target for the gateway's body validation (gateway_body.c,
 * event_json.c, the msgpack reader of json_msgpack.c): the first byte picks
 * the Content-Type (JSON, msgpack, or another), the rest is the body.
 * Whatever the bytes:
 * - the answer is 0 (every event good) or one of 400, 413, 415, 503, with
 *   a message;
 * - every event of an accepted body passes kl_event_validate() (the id may
 *   still be made by the gateway) and encodes to an envelope that decodes
 *   back to the same key, type, payload and not_before: the gateway never
 *   hands Kafka what a worker would dead-letter as malformed;
 * - nothing leaks (ASan's leak check);
 * - decoded in the gateway's arena (its fast reader, or jansson there), the
 *   body gives the same answer, error, index and event bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "broker/gateway_internal.h"

static kl_decoder_t *kl_decoder;
/* The Content-Type, by the first byte. */
static const char *const types[] = {"application/json", "application/msgpack",
                                    "application/json; charset=utf-8",
                                    "text/plain"};

static void kl_check_event(const kl_event_t *ev) {
  CHECK(kl_event_validate(ev, 1) == KL_OK);
  kl_event_t full = *ev;
  char id[37];
  if (full.id_len == 0) {
    kl_event_make_id(id);
    full.id = id;
    full.id_len = 36;
  }
  void *buf;
  size_t len;
  CHECK(kl_event_encode(&full, &buf, &len) == KL_OK);
  kl_event_t back;
  CHECK(kl_event_decode(kl_decoder, full.key, full.key_len, buf, len, &back) ==
        KL_OK);
  CHECK(back.not_before == full.not_before);
  CHECK(back.type_len == full.type_len &&
        memcmp(back.type, full.type, full.type_len) == 0);
  CHECK(back.payload_len == full.payload_len &&
        (full.payload_len == 0 ||
         memcmp(back.payload, full.payload, full.payload_len) == 0));
  free(buf);
}

static int kl_same_bytes(const void *a, size_t alen, const void *b,
                         size_t blen) {
  return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* The body decoded in an arena against @p batch, decoded without one. */
static void kl_check_arena(const uint8_t *data, size_t size, int status,
                           const kl__gw_batch_t *batch,
                           const kl__gw_bad_t *bad) {
  static kl__gw_arena_t arena; /* reused, as the gateway's is */
  kl__gw_batch_t in;
  kl__gw_bad_t in_bad;
  memset(&in_bad, 0, sizeof(in_bad));
  kl__gw_arena_begin(&arena);
  int in_status = kl__gw_batch_decode(
      &in, types[data[0] & 3], (const char *)data + 1, size - 1, 100, &in_bad);
  CHECK(in_status == status);
  if (status) {
    CHECK(in_bad.index == bad->index && strcmp(in_bad.msg, bad->msg) == 0);
  } else {
    CHECK(in.n == batch->n);
    for (size_t i = 0; i < in.n; i++) {
      const kl_event_t *a = &in.events[i].ev, *b = &batch->events[i].ev;
      CHECK(kl_same_bytes(a->key, a->key_len, b->key, b->key_len) &&
            kl_same_bytes(a->type, a->type_len, b->type, b->type_len) &&
            kl_same_bytes(a->id, a->id_len, b->id, b->id_len) &&
            kl_same_bytes(a->payload, a->payload_len, b->payload,
                          b->payload_len) &&
            a->header_count == b->header_count);
      for (size_t h = 0; h < a->header_count; h++)
        CHECK(kl_same_bytes(a->headers[h].name, a->headers[h].name_len,
                            b->headers[h].name, b->headers[h].name_len) &&
              kl_same_bytes(a->headers[h].value, a->headers[h].value_len,
                            b->headers[h].value, b->headers[h].value_len));
    }
    kl__gw_batch_free(&in);
  }
  kl__gw_arena_end(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!kl_decoder)
    CHECK((kl_decoder = kl_decoder_new()) != NULL);
  if (size == 0)
    return 0;
  kl__gw_batch_t batch;
  kl__gw_bad_t bad;
  memset(&bad, 0, sizeof(bad));
  int status = kl__gw_batch_decode(&batch, types[data[0] & 3],
                                   (const char *)data + 1, size - 1, 100, &bad);
  kl_check_arena(data, size, status, &batch, &bad);
  if (status == 0) {
    CHECK(batch.n >= 1 && batch.n <= 100);
    for (size_t i = 0; i < batch.n; i++)
      kl_check_event(&batch.events[i].ev);
    kl__gw_batch_free(&batch);
  } else {
    CHECK(status == 400 || status == 413 || status == 415 || status == 503);
    CHECK(bad.msg[0] != '\0');
    CHECK((data[0] & 3) != 3 || status == 415);
  }
  return 0;
}
