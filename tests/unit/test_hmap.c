/* kl__hmap: the one intrusive chained hash map (common/hmap.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"
#include "common/hmap.h"

typedef struct t_entry {
  int value;
  kl__hnode_t node; /* not first: KL__HMAP_ENTRY does the arithmetic */
  char key[16];
} t_entry_t;

static t_entry_t *t_find(const kl__hmap_t *map, const char *key) {
  uint64_t h = kl__fnv1a(key, strlen(key));
  for (kl__hnode_t *n = kl__hmap_first(map, h); n; n = kl__hmap_next(n, h)) {
    t_entry_t *e = KL__HMAP_ENTRY(n, t_entry_t, node);
    if (strcmp(e->key, key) == 0)
      return e;
  }
  return NULL;
}

static t_entry_t *t_add(kl__hmap_t *map, const char *key, int value) {
  assert_int_equal(kl__hmap_reserve(map, 4), 0);
  t_entry_t *e = calloc(1, sizeof(*e));
  assert_non_null(e);
  snprintf(e->key, sizeof(e->key), "%s", key);
  e->value = value;
  kl__hmap_link(map, &e->node, kl__fnv1a(key, strlen(key)));
  return e;
}

/* The buckets start at `first` and double as the entries reach them;
 * every entry is found after each move. */
static void test_grows_by_doubling_and_finds_all(void **state) {
  (void)state;
  kl__hmap_t map = KL__HMAP_INIT;
  assert_null(t_find(&map, "k0")); /* no buckets yet */
  char key[16];
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof(key), "k%d", i);
    t_add(&map, key, i);
  }
  assert_int_equal(map.count, 1000);
  assert_int_equal(map.cap, 1024); /* 4, 8, ..., 1024 */
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof(key), "k%d", i);
    t_entry_t *e = t_find(&map, key);
    assert_non_null(e);
    assert_int_equal(e->value, i);
  }
  assert_null(t_find(&map, "k1000"));
  kl__hmap_iter_t it = KL__HMAP_ITER(&map);
  for (kl__hnode_t *n; (n = kl__hmap_iter_next(&it));)
    free(KL__HMAP_ENTRY(n, t_entry_t, node));
  kl__hmap_free(&map);
  assert_null(map.buckets);
  assert_int_equal(map.cap, 0);
}

/* Same-hash nodes on one chain: first/next visit each of them, and an
 * unlink in the middle, at the head or at the tail leaves the others. */
static void test_unlink_keeps_the_rest(void **state) {
  (void)state;
  kl__hmap_t map = KL__HMAP_INIT;
  t_entry_t e[5] = {{0}};
  assert_int_equal(kl__hmap_reserve(&map, 8), 0);
  for (int i = 0; i < 5; i++) {
    e[i].value = i;
    kl__hmap_link(&map, &e[i].node, 42); /* one hash: one chain */
  }
  int seen = 0;
  for (kl__hnode_t *n = kl__hmap_first(&map, 42); n; n = kl__hmap_next(n, 42))
    seen |= 1 << KL__HMAP_ENTRY(n, t_entry_t, node)->value;
  assert_int_equal(seen, 0x1f);
  assert_null(kl__hmap_first(&map, 43)); /* same bucket, other hash */
  kl__hmap_unlink(&map, &e[2].node);
  kl__hmap_unlink(&map, &e[4].node); /* the head: linked last */
  kl__hmap_unlink(&map, &e[0].node); /* the tail */
  assert_int_equal(map.count, 2);
  seen = 0;
  for (kl__hnode_t *n = kl__hmap_first(&map, 42); n; n = kl__hmap_next(n, 42))
    seen |= 1 << KL__HMAP_ENTRY(n, t_entry_t, node)->value;
  assert_int_equal(seen, (1 << 1) | (1 << 3));
  kl__hmap_free(&map);
}

/* The walk visits every node once, even when each is unlinked as it is
 * returned; empty keeps the buckets for reuse. */
static void test_walk_unlink_and_empty(void **state) {
  (void)state;
  kl__hmap_t map = KL__HMAP_INIT;
  t_entry_t e[100];
  for (int i = 0; i < 100; i++) {
    e[i].value = i;
    assert_int_equal(kl__hmap_reserve(&map, 16), 0);
    kl__hmap_link(&map, &e[i].node, (uint64_t)i * 7);
  }
  int visits = 0, sum = 0;
  kl__hmap_iter_t it = KL__HMAP_ITER(&map);
  for (kl__hnode_t *n; (n = kl__hmap_iter_next(&it));) {
    kl__hmap_unlink(&map, n);
    visits++;
    sum += KL__HMAP_ENTRY(n, t_entry_t, node)->value;
  }
  assert_int_equal(visits, 100);
  assert_int_equal(sum, 99 * 100 / 2);
  assert_int_equal(map.count, 0);
  for (int i = 0; i < 10; i++)
    kl__hmap_link(&map, &e[i].node, (uint64_t)i);
  size_t cap = map.cap;
  kl__hmap_empty(&map);
  assert_int_equal(map.count, 0);
  assert_int_equal(map.cap, cap);
  for (uint64_t h = 0; h < 10; h++)
    assert_null(kl__hmap_first(&map, h));
  kl__hmap_empty(&(kl__hmap_t)KL__HMAP_INIT); /* no buckets: no memset */
  kl__hmap_free(&map);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grows_by_doubling_and_finds_all),
      cmocka_unit_test(test_unlink_keeps_the_rest),
      cmocka_unit_test(test_walk_unlink_and_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
