/* FNV-1a, 64 bits: the one non-cryptographic hash of the code base, for
 * hash tables and for grouping keys. Not for anything an adversary may
 * aim at (it is easy to collide): where a collision matters, compare the
 * full key as well. */
#ifndef KEYLANE_COMMON_HASH_H
#define KEYLANE_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KL__FNV_SEED 14695981039346656037ULL

/** Continues the hash @p h (KL__FNV_SEED to start) over @p n bytes. */
static inline uint64_t kl__fnv1a_more(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ s[i]) * 1099511628211ULL;
  return h;
}

static inline uint64_t kl__fnv1a(const void *p, size_t n) {
  return kl__fnv1a_more(KL__FNV_SEED, p, n);
}

#endif
