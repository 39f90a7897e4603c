/*
 * The one msgpack reader (common/msgpack_read.h), against what msgpack-c
 * packs: every format's kind and value, and every cut of the input
 * reported as short, never read past.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "common/msgpack_read.h"

/* Packs one of each format msgpack-c writes, and an ext. */
static void kl_t_pack_all(msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 14);
  msgpack_pack_nil(&pk);
  msgpack_pack_true(&pk);
  msgpack_pack_int64(&pk, -5);
  msgpack_pack_int64(&pk, -40000);
  msgpack_pack_uint64(&pk, 300);
  msgpack_pack_uint64(&pk, UINT64_MAX);
  msgpack_pack_double(&pk, 2.5);
  msgpack_pack_float(&pk, 0.5f);
  msgpack_pack_str_with_body(&pk, "hello", 5);
  char big[300];
  memset(big, 'x', sizeof(big));
  msgpack_pack_str_with_body(&pk, big, sizeof(big));
  msgpack_pack_bin_with_body(&pk, "\x00\x01", 2);
  msgpack_pack_map(&pk, 1);
  msgpack_pack_str_with_body(&pk, "k", 1);
  msgpack_pack_ext_with_body(&pk, "abcd", 4, 7); /* fixext 4 */
  msgpack_pack_ext_with_body(&pk, "abc", 3, 7);  /* ext 8 */
  msgpack_pack_int64(&pk, INT64_MIN);
}

static kl__mp_item_t kl_t_next(kl__mp_reader_t *rd) {
  kl__mp_item_t it;
  uint64_t need = 0;
  assert_int_equal(kl__mp_next(rd, &it, &need), KL__MP_OK);
  return it;
}

static void test_every_format(void **state) {
  (void)state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl_t_pack_all(&sb);
  kl__mp_reader_t rd = kl__mp_reader(sb.data, sb.size);
  kl__mp_item_t it = kl_t_next(&rd);
  assert_int_equal(it.kind, KL__MP_ARRAY);
  assert_int_equal(it.n, 14);
  assert_int_equal(kl_t_next(&rd).kind, KL__MP_NIL);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_BOOL && it.b);
  assert_int_equal(kl_t_next(&rd).i, -5);
  assert_int_equal(kl_t_next(&rd).i, -40000);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_INT && !it.big && it.i == 300);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_INT && it.big && it.n == UINT64_MAX);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_FLOAT && it.d == 2.5);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_FLOAT && it.d == 0.5);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_STR && it.n == 5);
  assert_memory_equal(it.body, "hello", 5);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_STR && it.n == 300 && it.body[299] == 'x');
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_BIN && it.n == 2 && it.body[1] == 1);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_MAP && it.n == 1);
  assert_int_equal(kl_t_next(&rd).kind, KL__MP_STR);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_EXT && it.n == 4);
  assert_memory_equal(it.body, "abcd", 4);
  it = kl_t_next(&rd);
  assert_true(it.kind == KL__MP_EXT && it.n == 3);
  assert_memory_equal(it.body, "abc", 3);
  assert_int_equal(kl_t_next(&rd).i, INT64_MIN);
  assert_ptr_equal(rd.p, rd.end);
  msgpack_sbuffer_destroy(&sb);
}

/* Every prefix of the input: the reader stops short at the cut, within
 * the bytes it was given (a copy of exactly that size, for ASan). */
static void test_every_cut_is_short(void **state) {
  (void)state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl_t_pack_all(&sb);
  for (size_t cut = 0; cut < sb.size; cut++) {
    uint8_t *copy = malloc(cut ? cut : 1);
    memcpy(copy, sb.data, cut);
    kl__mp_reader_t rd = kl__mp_reader(copy, cut);
    kl__mp_item_t it;
    uint64_t need = 0;
    kl__mp_status_t st;
    while ((st = kl__mp_next(&rd, &it, &need)) == KL__MP_OK)
      ;
    assert_true(rd.p <= rd.end);
    assert_true(need > (uint64_t)(rd.end - rd.p));
    free(copy);
  }
  msgpack_sbuffer_destroy(&sb);
}

static void test_never_used_and_empty(void **state) {
  (void)state;
  kl__mp_reader_t rd = kl__mp_reader("\xc1", 1);
  assert_int_equal(kl_t_next(&rd).kind, KL__MP_NEVER);
  rd = kl__mp_reader(NULL, 0);
  kl__mp_item_t it;
  uint64_t need = 0;
  assert_int_equal(kl__mp_next(&rd, &it, &need), KL__MP_SHORT_HEAD);
  assert_int_equal(it.kind, KL__MP_NONE);
  assert_int_equal(need, 1);
  /* A str claiming 4 GiB in 5 bytes: short in its body, nothing read. */
  rd = kl__mp_reader("\xdb\xff\xff\xff\xff", 5);
  assert_int_equal(kl__mp_next(&rd, &it, &need), KL__MP_SHORT_BODY);
  assert_int_equal(need, 0xffffffffu);
  assert_int_equal(kl__mp_offset(&rd), 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_format),
      cmocka_unit_test(test_every_cut_is_short),
      cmocka_unit_test(test_never_used_and_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
