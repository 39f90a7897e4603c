/*
 * The gateway's arena (broker/gateway_body.c): a body decoded inside
 * kl__gw_arena_begin() .. kl__gw_arena_end() gives the same events, byte
 * for byte, as one decoded with malloc(): bodies larger than a chunk, one
 * value larger than a chunk, a msgpack body's bin payload, headers, and
 * errors (the message and the index); begin/end nest, and a rewound arena
 * is used again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "broker/gateway_internal.h"
#include "common/json_msgpack.h"

static void same_header(const kl_header_t *a, const kl_header_t *b) {
  assert_int_equal(a->name_len, b->name_len);
  assert_memory_equal(a->name, b->name, a->name_len);
  assert_int_equal(a->value_len, b->value_len);
  assert_memory_equal(a->value, b->value, a->value_len);
}

static void same_event(const kl_event_t *a, const kl_event_t *b) {
  assert_int_equal(a->key_len, b->key_len);
  assert_memory_equal(a->key, b->key, a->key_len);
  assert_int_equal(a->type_len, b->type_len);
  assert_memory_equal(a->type, b->type, a->type_len);
  assert_int_equal(a->id_len, b->id_len);
  if (a->id_len)
    assert_memory_equal(a->id, b->id, a->id_len);
  assert_int_equal(a->payload_len, b->payload_len);
  if (a->payload_len)
    assert_memory_equal(a->payload, b->payload, a->payload_len);
  assert_int_equal(a->header_count, b->header_count);
  for (size_t i = 0; i < a->header_count; i++)
    same_header(&a->headers[i], &b->headers[i]);
}

/* Decodes @p body twice, with and without @p arena, and compares: the
 * status, the bad index and message, or every event. @returns the
 * status. */
static int decode_both(kl__gw_arena_t *arena, const char *ctype,
                       const void *body, size_t len) {
  kl__gw_batch_t plain, pooled;
  kl__gw_bad_t bad_plain, bad_pooled;
  bool nested = arena->depth > 0; /* then "plain" is in the arena too */
  int s1 = kl__gw_batch_decode(&plain, ctype, body, len, 100000, &bad_plain);
  kl__gw_arena_begin(arena);
  int s2 = kl__gw_batch_decode(&pooled, ctype, body, len, 100000, &bad_pooled);
  assert_int_equal(s1, s2);
  if (s1) {
    assert_int_equal(bad_plain.index, bad_pooled.index);
    assert_string_equal(bad_plain.msg, bad_pooled.msg);
  } else {
    assert_ptr_equal(pooled.arena, arena);
    /* A msgpack body outside an arena is read in the batch's own. */
    bool msgpack = strstr(ctype, "msgpack") != NULL;
    assert_ptr_equal(plain.arena, nested ? arena : msgpack ? &plain.own : NULL);
    assert_int_equal(plain.n, pooled.n);
    for (size_t i = 0; i < plain.n; i++)
      same_event(&plain.events[i].ev, &pooled.events[i].ev);
    kl__gw_batch_free(&pooled);
    kl__gw_batch_free(&plain);
  }
  kl__gw_arena_end(arena);
  return s1;
}

/* 3,000 events of every field: several chunks of jansson's values. */
static char *many_events(size_t *len) {
  size_t cap = 3000 * 256, n = 0;
  char *body = malloc(cap);
  body[n++] = '[';
  for (int i = 0; i < 3000; i++)
    n += (size_t)snprintf(
        body + n, cap - n,
        "%s{\"key\":\"k%d\",\"type\":\"t\",\"id\":\"id-%d\","
        "\"headers\":{\"a\":\"%d\",\"b\":\"x\"},\"payload\":{\"n\":%d,"
        "\"r\":1.25,\"s\":\"caf\\u00e9\",\"l\":[null,true,false,{}]}}",
        i ? "," : "", i, i, i, i);
  body[n++] = ']';
  *len = n;
  return body;
}

static void arena_gives_the_same_events(void **state) {
  (void)state;
  kl__gw_arena_t arena = {0};
  size_t len;
  char *body = many_events(&len);
  for (int round = 0; round < 2; round++) /* the second reuses the arena */
    assert_int_equal(decode_both(&arena, "application/json", body, len), 0);
  assert_non_null(arena.chunks);
  /* An error at event 2999, after most of the body was read. */
  char *bad = strstr(body, "{\"key\":\"k2999\"");
  bad[2] = 'j';
  assert_int_equal(decode_both(&arena, "application/json", body, len), 400);
  free(body);

  /* One value larger than a chunk: a payload of 900 KiB. */
  size_t big = 900 * 1024;
  body = malloc(big + 64);
  len = (size_t)sprintf(body, "{\"key\":\"k\",\"type\":\"t\",\"payload\":\"");
  memset(body + len, 'x', big);
  len += big;
  len += (size_t)sprintf(body + len, "\"}");
  assert_int_equal(decode_both(&arena, "application/json", body, len), 0);
  free(body);

  /* msgpack: a bin payload is its bytes, both ways. */
  json_t *doc = json_pack("{s:s, s:s, s:{s:s}}", "key", "k", "type", "t",
                          "headers", "h", "v");
  void *mp;
  size_t mp_len;
  assert_int_equal(kl__json_to_msgpack(doc, 1 << 20, &mp, &mp_len), KL_OK);
  json_decref(doc);
  /* the map of 3 grows by "payload": bin 8 of 3 bytes */
  char mbody[256];
  memcpy(mbody, mp, mp_len);
  free(mp);
  mbody[0] = (char)0x84;
  memcpy(mbody + mp_len, "\xa7payload\xc4\x03\x00\x01\x02", 13);
  assert_int_equal(
      decode_both(&arena, "application/msgpack", mbody, mp_len + 13), 0);
  kl__gw_arena_destroy(&arena);
  assert_null(arena.chunks);
}

static void arena_nests(void **state) {
  (void)state;
  kl__gw_arena_t arena = {0};
  const char *one = "{\"key\":\"k\",\"type\":\"t\",\"payload\":[1,2,3]}";
  kl__gw_arena_begin(&arena);
  kl__gw_batch_t outer;
  kl__gw_bad_t bad;
  assert_int_equal(kl__gw_batch_decode(&outer, "application/json", one,
                                       strlen(one), 10, &bad),
                   0);
  /* A request decoded meanwhile (nested) leaves the outer one's intact. */
  assert_int_equal(decode_both(&arena, "application/json", one, strlen(one)),
                   0);
  assert_int_equal(outer.n, 1);
  assert_memory_equal(outer.events[0].ev.key, "k", 1);
  assert_memory_equal(outer.events[0].ev.payload, "\x93\x01\x02\x03", 4);
  kl__gw_batch_free(&outer);
  kl__gw_arena_end(&arena);
  assert_int_equal(arena.depth, 0);
  kl__gw_arena_destroy(&arena);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(arena_gives_the_same_events),
      cmocka_unit_test(arena_nests),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
