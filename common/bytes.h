/*
 * Big-endian integers in byte buffers, at any alignment: the order of the
 * store's keys and records (so that numbers sort as bytes), of msgpack
 * and of PostgreSQL's binary values. Compilers turn the loops into one
 * load or store and a byte swap.
 */
#ifndef KEYLANE_COMMON_BYTES_H
#define KEYLANE_COMMON_BYTES_H

#include <stddef.h>
#include <stdint.h>

/** Writes the low @p n bytes (<= 8) of @p v at @p p, big-endian. */
static inline void kl__put_be(void *p, uint64_t v, size_t n) {
  unsigned char *o = p;
  for (size_t i = n; i-- > 0; v >>= 8)
    o[i] = (unsigned char)v;
}

/** @returns the @p n bytes (<= 8) at @p p read as a big-endian number. */
static inline uint64_t kl__get_be(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v = v << 8 | s[i];
  return v;
}

static inline void kl__put_be32(void *p, uint32_t v) {
  kl__put_be(p, v, 4);
}

static inline uint32_t kl__get_be32(const void *p) {
  return (uint32_t)kl__get_be(p, 4);
}

#endif
