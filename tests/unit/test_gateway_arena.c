/*
 * The gateway's arena (broker/gateway_body.c) and its fast reader
 * (broker/gateway_fast.c): a body decoded inside kl__gw_arena_begin() ..
 * kl__gw_arena_end() (the fast reader when it takes the body, else jansson
 * into the arena) gives the same events, byte for byte, or the same error
 * and index, as one decoded by the full path with malloc(): bodies larger
 * than a chunk, one value larger than a chunk, a msgpack body's bin
 * payload, headers, and a table of bodies at the fast reader's edges;
 * begin/end nest, and a rewound arena is used again.
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
#include "common/strbuf.h"

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
static bool last_fast; /* whether decode_both()'s arena side was fast */

static int decode_both(kl__gw_arena_t *arena, const char *ctype,
                       const void *body, size_t len) {
  kl__gw_batch_t plain, pooled;
  kl__gw_bad_t bad_plain, bad_pooled;
  bool nested = arena->depth > 0; /* then "plain" is in the arena too */
  int s1 = kl__gw_batch_decode(&plain, ctype, body, len, 100000, &bad_plain);
  kl__gw_arena_begin(arena);
  int s2 = kl__gw_batch_decode(&pooled, ctype, body, len, 100000, &bad_pooled);
  if (s1 != s2)
    fail_msg("%.200s: %d (%s) against %d (%s)", (const char *)body, s1,
             s1 ? bad_plain.msg : "", s2, s2 ? bad_pooled.msg : "");
  last_fast = !s2 && pooled.fast;
  assert_false(plain.fast && !nested);
  if (s1) {
    assert_int_equal(bad_plain.index, bad_pooled.index);
    assert_string_equal(bad_plain.msg, bad_pooled.msg);
  } else {
    assert_ptr_equal(pooled.arena, arena);
    assert_ptr_equal(plain.arena, nested ? arena : NULL);
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

/* The fast reader's edges: each body gives what the full path gives. */
static void fast_reader_reads_as_the_full_path(void **state) {
  (void)state;
  static const struct {
    const char *body;
    bool fast; /* the fast reader takes it */
  } cases[] = {
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":{\"a\":1,\"b\":[1,-2,0,-0,"
       "127,128,-32,-33,255,256,65535,65536,4294967296,-2147483649,"
       "999999999999999999,-999999999999999999],\"c\":{},\"d\":[],\"e\":"
       "null,\"f\":true,\"g\":false,\"h\":\"\",\"i\":\"x y\"}}]",
       true},
      {" \t\r\n{ \"type\" : \"t\" , \"key\":\"k\" , \"id\":\"i-1\" } \n", true},
      {"[{\"key\":\"k\",\"type\":\"t\",\"headers\":{\"h1\":\"v\",\"h2\":\"\"}},"
       "{\"key\":\"k2\",\"type\":\"t\",\"headers\":{},\"payload\":\"s\"}]",
       true},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":null}]", true},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":[[[[[[[[[[[[[[[[[[[[[[[[[["
       "[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]",
       false}, /* 42 deep: the full path */
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":{\"a\":1,\"a\":2}}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":{\"a\":{\"a\":1},\"b\":"
       "{\"a\":2}}}]",
       true},
      {"[{\"key\":\"a\",\"key\":\"b\",\"type\":\"t\"}]", false},
      {"[{\"key\":\"a\",\"type\":\"t\",\"paylaod\":1}]", false},
      {"[{\"key\":\"a\",\"type\":\"t\",\"not_before\":1767225600000}]", false},
      {"[]", false},
      {"[{\"key\":\"k\",\"type\":\"t\"}] x", false},
      {"[{\"key\":\"k\",\"type\":\"t\"},]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":1.5}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":1e5}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":1234567890123456789}]",
       false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":-123456789012345678901234567"
       "89}]",
       false}, /* no overflow on the way (UBSan) */
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":01}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":-}]", false},
      {"[{\"key\":\"k\\n\",\"type\":\"t\"}]", false},
      {"[{\"key\":\"caf\u00e9\",\"type\":\"t\"}]", false},
      {"[{\"key\":\"\",\"type\":\"t\"}]", false},
      {"[{\"key\":\"k\"}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"id\":\"\"}]", false},
      {"[{\"key\":\"k\",\"type\":\"~timer\"}]", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"headers\":{\"h\":\"a\",\"h\":\"b\"}}]",
       false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"headers\":{\"h\":1}}]", false},
      {"[{\"key\":\"k\",\"type\":1}]", false},
      {"{\"key\":\"k\",\"type\":\"t\"", false},
      {"[{\"key\":\"k\",\"type\":\"t\"}", false},
      {"[{\"key\":\"k\",\"type\":\"t\",\"payload\":tru}]", false},
      {"\"k\"", false},
  };
  kl__gw_arena_t arena = {0};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    decode_both(&arena, "application/json", cases[i].body,
                strlen(cases[i].body));
    if (last_fast != cases[i].fast)
      fail_msg("case %zu: fast %d, expected %d", i, last_fast, cases[i].fast);
  }
  /* 65 headers, a 1,025-byte key: over the limits, the full path's error */
  char body[4096];
  size_t n =
      (size_t)sprintf(body, "{\"key\":\"k\",\"type\":\"t\",\"headers\":{");
  for (int i = 0; i < 65; i++)
    n += (size_t)sprintf(body + n, "%s\"h%d\":\"v\"", i ? "," : "", i);
  n += (size_t)sprintf(body + n, "}}");
  assert_int_equal(decode_both(&arena, "application/json", body, n), 400);
  n = (size_t)sprintf(body, "{\"key\":\"");
  memset(body + n, 'k', 1025);
  n += 1025;
  n += (size_t)sprintf(body + n, "\",\"type\":\"t\"}");
  assert_int_equal(decode_both(&arena, "application/json", body, n), 400);
  kl__gw_arena_destroy(&arena);
}

/* ---- random bodies at the fast reader's edges ---- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

static void ws(kl__strbuf_t *sb) {
  if (!rnd(5))
    kl__strbuf_puts(sb, rnd(2) ? " " : "\n\t");
}

static void gen_str(kl__strbuf_t *sb) {
  static const char *const odd[] = {"\\n",      "\\u00e9", "\\\"", "\x01",
                                    "\xc3\xa9", "\\u0000", "\xff", " ",
                                    "~",        ":/"};
  static const char chars[] = "ab09-_.";
  kl__strbuf_puts(sb, "\"");
  for (uint32_t i = 0, n = rnd(50) ? 1 + rnd(8) : 0; i < n; i++) {
    if (!rnd(150))
      kl__strbuf_puts(sb, odd[rnd(sizeof(odd) / sizeof(odd[0]))]);
    else
      kl__strbuf_add(sb, &chars[rnd(sizeof(chars) - 1)], 1);
  }
  kl__strbuf_puts(sb, "\"");
}

static void gen_int(kl__strbuf_t *sb) {
  static const char *const odd[] = {
      "01",  "-", "1.5", "1e5", "-0", "1E-2", "1234567890123456789",
      "0.0", "+1"};
  if (!rnd(40)) {
    kl__strbuf_puts(sb, odd[rnd(sizeof(odd) / sizeof(odd[0]))]);
    return;
  }
  int64_t v = (int64_t)rnd(1000);
  for (uint32_t i = 0, n = rnd(6); i < n; i++)
    v = v * 1000 + rnd(1000);
  kl__strbuf_printf(sb, "%s%lld", rnd(3) ? "" : "-", (long long)v);
}

static void gen_value(kl__strbuf_t *sb, int depth) {
  static const char *const keys[] = {"\"a\"", "\"b\"", "\"c\"", "\"d\"",
                                     "\"e\"", "\"f\"", "\"\""};
  uint32_t kind = depth > 36 ? rnd(4) : rnd(7);
  ws(sb);
  if (kind == 0)
    gen_int(sb);
  else if (kind == 1)
    gen_str(sb);
  else if (kind == 2)
    kl__strbuf_puts(sb, rnd(3) == 0 ? "true" : rnd(2) ? "false" : "null");
  else if (kind == 3)
    kl__strbuf_puts(sb, rnd(100) ? "null" : "nul");
  else {
    bool object = kind == 4 || kind == 6;
    uint32_t n = depth > 3 ? rnd(2) : rnd(4);
    kl__strbuf_puts(sb, object ? "{" : "[");
    for (uint32_t i = 0; i < n; i++) {
      if (i)
        kl__strbuf_puts(sb, ",");
      if (object) {
        kl__strbuf_puts(sb, keys[rnd(7)]);
        ws(sb);
        kl__strbuf_puts(sb, ":");
      }
      gen_value(sb, depth + 1);
    }
    if (!rnd(300))
      kl__strbuf_puts(sb, ",");
    kl__strbuf_puts(sb, object ? "}" : "]");
  }
  ws(sb);
}

static void gen_field(kl__strbuf_t *sb, const char *name) {
  kl__strbuf_printf(sb, "\"%s\"", name);
  ws(sb);
  kl__strbuf_puts(sb, ":");
  ws(sb);
  if (!strcmp(name, "payload") || !rnd(60))
    gen_value(sb, 1);
  else if (!strcmp(name, "headers")) {
    kl__strbuf_puts(sb, "{");
    for (uint32_t i = 0, n = rnd(4); i < n; i++) {
      kl__strbuf_printf(sb, "%s\"%c\":", i ? "," : "", "hgh"[rnd(3)]);
      if (rnd(50))
        gen_str(sb);
      else
        gen_int(sb);
    }
    kl__strbuf_puts(sb, "}");
  } else if (!strcmp(name, "type") && !rnd(50))
    kl__strbuf_puts(sb, "\"~t\"");
  else
    gen_str(sb);
}

static void gen_event(kl__strbuf_t *sb) {
  static const char *const names[] = {"key",     "type",       "id",
                                      "payload", "headers",    "paylaod",
                                      "delay",   "payload_b64"};
  const char *order[8] = {"key", "type"};
  uint32_t n = 2;
  for (int i = 2; i < 5; i++)
    if (rnd(2))
      order[n++] = names[i];
  if (!rnd(40))
    order[n++] = names[rnd(8)]; /* another, or one twice */
  if (!rnd(60)) {               /* one missing */
    uint32_t gone = rnd(n);
    n--;
    order[gone] = order[n];
  }
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = rnd(i);
    const char *t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
  kl__strbuf_puts(sb, "{");
  for (uint32_t i = 0; i < n; i++) {
    if (i)
      kl__strbuf_puts(sb, ",");
    ws(sb);
    gen_field(sb, order[i]);
  }
  kl__strbuf_puts(sb, "}");
}

static char *gen_body(size_t *len) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  ws(&sb);
  if (!rnd(10)) {
    gen_event(&sb);
  } else {
    kl__strbuf_puts(&sb, "[");
    for (uint32_t i = 0, n = rnd(4); i < n; i++) {
      if (i)
        kl__strbuf_puts(&sb, ",");
      ws(&sb);
      gen_event(&sb);
    }
    kl__strbuf_puts(&sb, "]");
  }
  ws(&sb);
  if (!rnd(40))
    kl__strbuf_puts(&sb, rnd(2) ? "x" : "{}");
  char *body = kl__strbuf_take(&sb, len);
  assert_non_null(body);
  if (!rnd(40))
    *len = rnd((uint32_t)*len + 1); /* cut short */
  return body;
}

/* 20,000 random bodies near the fast reader's edges: every one gives what
 * the full path gives; a good share is the fast reader's. */
static void fast_reader_agrees_on_random_bodies(void **state) {
  (void)state;
  kl__gw_arena_t arena = {0};
  int fast = 0, ok = 0;
  for (int i = 0; i < 20000; i++) {
    size_t len;
    char *body = gen_body(&len);
    ok += decode_both(&arena, "application/json", body, len) == 0;
    fast += last_fast;
    free(body);
  }
  printf("%d of 20000 bodies accepted, %d by the fast reader\n", ok, fast);
  assert_true(fast >= 5000 && ok - fast >= 300);
  kl__gw_arena_destroy(&arena);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(arena_gives_the_same_events),
      cmocka_unit_test(arena_nests),
      cmocka_unit_test(fast_reader_reads_as_the_full_path),
      cmocka_unit_test(fast_reader_agrees_on_random_bodies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
