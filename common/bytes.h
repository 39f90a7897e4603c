/*
 * Big-endian integers in byte buffers, at any alignment: the order of the
 * store's keys and records (so that numbers sort as bytes), of msgpack
 * and of PostgreSQL's binary values. Compilers turn the loops into one
 * load or store and a byte swap. And hex digits: their value, and bytes
 * written as them.
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

/** @returns the value of the hex digit @p c (either case), or -1. */
static inline int kl__hex_value(int c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/** Writes the @p n bytes at @p p as 2 * @p n lowercase hex digits at
 *  @p out (no NUL). */
static inline void kl__hex_encode(const void *p, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
}

static inline void kl__put_be32(void *p, uint32_t v) {
  kl__put_be(p, v, 4);
}

static inline uint32_t kl__get_be32(const void *p) {
  return (uint32_t)kl__get_be(p, 4);
}

#endif
