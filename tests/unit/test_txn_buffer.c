/*
 * The batch write buffer (store/txn_buffer.h): its sorted list is in
 * LMDB's key order, whatever order the keys came in; a reset or recycled
 * buffer is empty and keeps its memory for the next batch, unless that
 * memory is over KL__BUF_KEEP_MAX.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/txn_buffer.h"

/* Sets @p n keys "k<i*7919 mod n>" (and every 5th one shorter, a prefix of
 * another), each valued with its key. */
static void t_fill(kl__buf_t *buf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char key[32];
    int len = snprintf(key, sizeof(key), "k%zu", i * 7919 % n);
    if (i % 5 == 0)
      len--; /* "k12" then also "k1" */
    assert_int_equal(kl__buf_set(buf, key, (size_t)len, key, (size_t)len, 1),
                     KL_OK);
  }
}

static int t_order(const kl__buf_entry_t *x, const kl__buf_entry_t *y) {
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(kl__buf_key(x), kl__buf_key(y), n);
  return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static void t_sorted_ok(kl__buf_t *buf) {
  const kl__buf_entry_t *const *list;
  assert_int_equal(kl__buf_sorted(buf, &list), KL_OK);
  for (size_t i = 0; i < buf->count; i++) {
    assert_ptr_equal(kl__buf_get(buf, kl__buf_key(list[i]), list[i]->key_len),
                     list[i]); /* every entry, once */
    if (i)
      assert_true(t_order(list[i - 1], list[i]) < 0);
  }
}

static void sorted_in_key_order(void **state) {
  (void)state;
  kl__buf_t buf;
  kl__buf_init(&buf);
  const kl__buf_entry_t *const *list;
  assert_int_equal(kl__buf_sorted(&buf, &list), KL_OK);
  assert_null(list); /* empty */
  size_t sizes[] = {1, 2, 3, 17, 1000, 4099};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
    t_fill(&buf, sizes[s]);
    t_sorted_ok(&buf);
    kl__buf_reset(&buf);
    assert_int_equal(buf.count, 0);
  }
  kl__buf_clear(&buf);
}

static void recycle_keeps_what_is_small(void **state) {
  (void)state;
  kl__buf_t buf;
  kl__buf_init(&buf);
  t_fill(&buf, 3000);
  t_sorted_ok(&buf);
  kl__buf_entry_t **slots = buf.slots;
  size_t cap = buf.cap;
  kl__buf_recycle(&buf);
  assert_int_equal(buf.count, 0);
  assert_null(kl__buf_get(&buf, "k1", 2));
  assert_ptr_equal(buf.slots, slots); /* kept: the next batch reuses it */
  assert_int_equal(buf.cap, cap);
  t_fill(&buf, 3000); /* the same again: no table growth */
  assert_ptr_equal(buf.slots, slots);
  t_sorted_ok(&buf);
  kl__buf_chunk_t *arena = buf.arena; /* one chunk, as large as them all */
  size_t arena_bytes = buf.arena_bytes;
  kl__buf_recycle(&buf);
  t_fill(&buf, 3000); /* fits in it: no chunk more */
  assert_ptr_equal(buf.arena, arena);
  assert_int_equal(buf.arena_bytes, arena_bytes);
  t_sorted_ok(&buf);

  /* Over KL__BUF_KEEP_MAX: freed, not kept. */
  char val[512] = {0};
  for (int i = 0; i < 4000; i++) {
    char key[16];
    int len = snprintf(key, sizeof(key), "big%d", i);
    assert_int_equal(kl__buf_set(&buf, key, (size_t)len, val, sizeof(val), 1),
                     KL_OK);
  }
  kl__buf_recycle(&buf);
  assert_int_equal(buf.count, 0);
  assert_null(buf.slots);
  assert_null(buf.arena);
  assert_int_equal(buf.cap, 0);
  t_fill(&buf, 10); /* and usable again */
  t_sorted_ok(&buf);
  kl__buf_clear(&buf);
}

/* A merge that shows what it was given: have * 10 + tag. */
static int t_merge(int have, int tag) {
  return have * 10 + tag;
}

/* kl__buf_retag(): a key not there is added with no value and the merge
 * of 0 and the tag; one there keeps its value and gets the merge of its
 * tag and the new one; the other keys are left alone. */
static void retag_merges_into_one_entry(void **state) {
  (void)state;
  kl__buf_t buf;
  kl__buf_init(&buf);
  t_fill(&buf, 40); /* a table grown a few times */
  size_t count = buf.count;
  assert_int_equal(kl__buf_retag(&buf, "id-a", 4, t_merge, 2), KL_OK);
  const kl__buf_entry_t *e = kl__buf_get(&buf, "id-a", 4);
  assert_non_null(e);
  assert_int_equal(e->tag, 2);
  assert_int_equal(e->val_len, 0);
  assert_int_equal(kl__buf_retag(&buf, "id-a", 4, t_merge, 3), KL_OK);
  assert_int_equal(kl__buf_get(&buf, "id-a", 4)->tag, 23);
  assert_int_equal(kl__buf_retag(&buf, "k7", 2, t_merge, 4), KL_OK);
  e = kl__buf_get(&buf, "k7", 2);
  assert_int_equal(e->tag, 14); /* t_fill's tag 1 */
  assert_int_equal(e->val_len, 2);
  assert_memory_equal(kl__buf_val(e), "k7", 2);
  assert_int_equal(buf.count, count + 1);
  t_sorted_ok(&buf);
  kl__buf_clear(&buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sorted_in_key_order),
      cmocka_unit_test(recycle_keeps_what_is_small),
      cmocka_unit_test(retag_merges_into_one_entry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
