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
 * - a msgpack body is read as the oracle reads it
 *   (tests/support/msgpack_oracle.h: through a JSON document, as the
 *   gateway did before it read msgpack bodies from their bytes): the same
 *   events, or both refused;
 * - nothing leaks (ASan's leak check).
 * The body is decoded as the gateway decodes it: in its arena, between
 * kl__gw_arena_begin() and kl__gw_arena_end() (broker/gateway_body.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "broker/gateway_internal.h"
#include "support/msgpack_oracle.h"

static kl_decoder_t *kl_decoder;

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const types[] = {"application/json", "application/msgpack",
                                      "application/json; charset=utf-8",
                                      "text/plain"};
  if (!kl_decoder)
    CHECK((kl_decoder = kl_decoder_new()) != NULL);
  if (size == 0)
    return 0;
  static kl__gw_arena_t arena; /* reused, as the gateway's is */
  kl__gw_batch_t batch;
  kl__gw_bad_t bad;
  memset(&bad, 0, sizeof(bad));
  kl__gw_arena_begin(&arena);
  int status = kl__gw_batch_decode(&batch, types[data[0] & 3],
                                   (const char *)data + 1, size - 1, 100, &bad);
  if ((data[0] & 3) == 1) {
    char why[700];
    const char *diff = kl_msgpack_oracle_diff(data + 1, size - 1, 100, status,
                                              &batch, why, sizeof(why));
    if (diff)
      fprintf(stderr, "%s\n", diff);
    CHECK(diff == NULL);
  }
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
  kl__gw_arena_end(&arena);
  return 0;
}
