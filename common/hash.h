/* The code base's two non-cryptographic hashes. Neither is for anything
 * an adversary may aim at (both are easy to collide): where a collision
 * matters, compare the full key as well.
 *
 * kl__hash(): the in-memory hash tables' (a batch's writes and marks, the
 * overlay, the lanes' keys, the owner cache), which the worker computes a
 * few times per event. It reads 8 bytes at a time, where FNV-1a reads one:
 * FNV-1a over the worker's ~60-byte sids took 7 % of its poll thread
 * (perf, keylane-bench worker, 2026-12-07). Its values may change between
 * builds: never store them.
 *
 * kl__fnv1a(): FNV-1a, 64 bits, for what is stored or compared across
 * processes (a long id's LMDB key, an undecodable record's identity, a
 * timer's key): its values must never change. */
#ifndef KEYLANE_COMMON_HASH_H
#define KEYLANE_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* A 64-bit finalizer (MurmurHash3's fmix64): every input bit moves about
 * half of the output's, so a table may index by the low bits. */
static inline uint64_t kl__hash_fmix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

/** Continues the hash @p h (0 to start) over @p n bytes: a word at a time,
 * the last one zero-padded and the length mixed in, so "a" and "a\0"
 * differ. Equal bytes hash equal whatever their alignment. */
static inline uint64_t kl__hash_more(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  const uint64_t k = 0x9e3779b97f4a7c15ULL; /* odd: a bijective multiply */
  h ^= (uint64_t)n * k;
  for (; n >= 8; s += 8, n -= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  return kl__hash_fmix((h ^ w) * k);
}

static inline uint64_t kl__hash(const void *p, size_t n) {
  return kl__hash_more(0, p, n);
}

#endif
