/*
 * Idempotency keys the producer makes when a service gives none: UUIDv7
 * (RFC 9562), so that keys sort by creation time and the store's index
 * stays append-mostly.
 *
 * Layout: 48-bit Unix ms | version 7 | 12-bit rand_a | variant 10 | 62 random
 * bits. rand_a is a counter (RFC 9562 6.2 method 1) seeded with 11 random
 * bits each new ms, which keeps ids strictly increasing within the process,
 * even across threads and a clock that steps back: the ms and counter are one
 * 60-bit number that only grows; past 2048+ ids in a ms it borrows the next
 * ms, as the RFC allows. The random bits: uuid_random() below.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "event/envelope.h"
#include "event/uuid.h"
#include "common/internal.h"
#include "keylane/event.h"

/* The random bits come from ChaCha20 (RFC 8439's block function), the
 * generator behind getrandom() too, run on each thread with a key of its
 * own from one getrandom(), four blocks at a time: taking 4000 bytes from
 * getrandom() every 400 ids cost 28 ns an id in the syscall and the
 * kernel's one-block-at-a-time ChaCha20, this 15 (both under load). The
 * key is replaced by a fresh getrandom() every 2^20 blocks, and in a child
 * after fork(), which must not repeat its parent's bits: two processes
 * with the same bits in the same ms make the same id, and the store would
 * take the second event for a duplicate of the first. */
enum {
  KL_UUID_RANDOM = 10, /* bytes an id takes */
  KL_UUID_BLOCKS = 20, /* a pool of 1280 bytes: 128 ids */
  KL_UUID_REKEY = 1 << 20
};

typedef struct uuid_rng {
  uint32_t state[16]; /* constants, key, block counter, nonce 0 */
  unsigned gen;       /* kl_uuid_gen when keyed */
  size_t used;        /* of pool */
  uint8_t pool[KL_UUID_BLOCKS * 64];
} uuid_rng_t;

static _Atomic uint64_t kl_uuid_last;
/* Counts forks (in the child); 0 is no thread's: the first draw keys. */
static _Atomic unsigned kl_uuid_gen = 1;
static pthread_once_t kl_uuid_once = PTHREAD_ONCE_INIT;
static _Thread_local uuid_rng_t kl_uuid_rng;

static void uuid_forked(void) {
  atomic_fetch_add(&kl_uuid_gen, 1);
}

static void uuid_atfork(void) {
  pthread_atfork(NULL, NULL, uuid_forked);
}

/* Falls back to splitmix64 when getrandom() fails (no such syscall): ids
 * stay unique within the process by the counter, and across processes as
 * far as the clock and pid differ. */
static void uuid_fallback(uint8_t *out, size_t n) {
  static _Thread_local uint64_t state;
  static _Thread_local pid_t pid; /* a child seeds again */
  if (state == 0 || pid != getpid()) {
    pid = getpid();
    state = (uint64_t)kl__mono_ns() ^ ((uint64_t)pid << 32);
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t z = (state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    out[i] = (uint8_t)(z ^ (z >> 31));
  }
}

/* Four blocks at once, one in each lane of a 4 x 32-bit vector (SSE2 on
 * x86-64, NEON on arm64, plain words where neither): 3 times one block's
 * speed. */
typedef uint32_t uuid_v4 __attribute__((vector_size(16)));

#define KL_ROTL(v, n) ((v) << (n) | (v) >> (32 - (n)))
#define KL_QR(a, b, c, d)                                                      \
  (a += b, d ^= a, d = KL_ROTL(d, 16), c += d, b ^= c, b = KL_ROTL(b, 12),     \
   a += b, d ^= a, d = KL_ROTL(d, 8), c += d, b ^= c, b = KL_ROTL(b, 7))

/* The RFC's byte order, little-endian: a plain store on most machines. */
static inline void uuid_le32(uint8_t *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  memcpy(p, &v, 4);
#else
  for (int b = 0; b < 4; b++)
    p[b] = (uint8_t)(v >> (8 * b));
#endif
}

void kl__uuid_chacha20x4(const uint32_t in[16], uint8_t out[256]) {
  uuid_v4 x[16], s[16];
  for (int i = 0; i < 16; i++)
    s[i] = (uuid_v4){in[i], in[i], in[i], in[i]};
  s[12] += (uuid_v4){0, 1, 2, 3};
  memcpy(x, s, sizeof(x));
  for (int i = 0; i < 10; i++) {
    KL_QR(x[0], x[4], x[8], x[12]);
    KL_QR(x[1], x[5], x[9], x[13]);
    KL_QR(x[2], x[6], x[10], x[14]);
    KL_QR(x[3], x[7], x[11], x[15]);
    KL_QR(x[0], x[5], x[10], x[15]);
    KL_QR(x[1], x[6], x[11], x[12]);
    KL_QR(x[2], x[7], x[8], x[13]);
    KL_QR(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; i++) {
    uuid_v4 v = x[i] + s[i];
    uint32_t w[4];
    memcpy(w, &v, sizeof(w));
    for (int lane = 0; lane < 4; lane++)
      uuid_le32(out + 64 * lane + 4 * i, w[lane]);
  }
}

/* A fresh key from the kernel, block counter and nonce 0. */
static void uuid_key(uuid_rng_t *rng, unsigned gen) {
  static const uint32_t sigma[4] = {0x61707865, 0x3320646e, 0x79622d32,
                                    0x6b206574}; /* "expand 32-byte k" */
  uint8_t key[32];
  ssize_t n;
  do
    n = getrandom(key, sizeof(key), 0);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof(key))
    uuid_fallback(key, sizeof(key));
  memcpy(rng->state, sigma, sizeof(sigma));
  for (int i = 0; i < 8; i++)
    rng->state[4 + i] = (uint32_t)key[4 * i] | (uint32_t)key[4 * i + 1] << 8 |
                        (uint32_t)key[4 * i + 2] << 16 |
                        (uint32_t)key[4 * i + 3] << 24;
  memset(rng->state + 12, 0, 4 * sizeof(uint32_t));
  memset(key, 0, sizeof(key));
  rng->gen = gen;
}

static void uuid_refill(uuid_rng_t *rng) {
  for (int b = 0; b < KL_UUID_BLOCKS; b += 4) {
    kl__uuid_chacha20x4(rng->state, rng->pool + 64 * b);
    rng->state[12] += 4;
  }
  rng->used = 0;
}

/* Random bytes for one id, from this thread's pool. */
static const uint8_t *uuid_random(void) {
  uuid_rng_t *rng = &kl_uuid_rng;
  unsigned gen = atomic_load_explicit(&kl_uuid_gen, memory_order_relaxed);
  if (rng->gen != gen || rng->state[12] >= KL_UUID_REKEY) {
    pthread_once(&kl_uuid_once, uuid_atfork);
    uuid_key(rng, atomic_load(&kl_uuid_gen));
    uuid_refill(rng);
  } else if (rng->used == sizeof(rng->pool)) {
    uuid_refill(rng);
  }
  rng->used += KL_UUID_RANDOM;
  return rng->pool + rng->used - KL_UUID_RANDOM;
}

/* The next (ms << 12 | counter), strictly above every earlier one. */
static uint64_t uuid_stamp(const uint8_t *rnd, int64_t now_ms) {
  uint64_t seed = ((uint64_t)(rnd[0] & 0x07) << 8) | rnd[1];
  uint64_t now = ((uint64_t)now_ms << 12) | seed;
  uint64_t last = atomic_load_explicit(&kl_uuid_last, memory_order_relaxed);
  uint64_t next;
  do
    next = now > last ? now : last + 1;
  while (!atomic_compare_exchange_weak_explicit(
      &kl_uuid_last, &last, next, memory_order_relaxed, memory_order_relaxed));
  return next;
}

void kl_event_make_id(char out[37]) {
  kl__event_make_id_at(out, kl__now_ms());
}

/* Text offsets of the 16 bytes in 8-4-4-4-12 form; the dashes fill the
 * gaps. A fixed layout, so the loop has no branch to mispredict. */
static const uint8_t kl_uuid_text_at[16] = {0,  2,  4,  6,  9,  11, 14, 16,
                                            19, 21, 24, 26, 28, 30, 32, 34};

void kl__uuid_format(const uint8_t b[16], char out[36]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[kl_uuid_text_at[i]] = hex[b[i] >> 4];
    out[kl_uuid_text_at[i] + 1] = hex[b[i] & 0x0f];
  }
  out[8] = out[13] = out[18] = out[23] = '-';
}

/* A lowercase hex digit's value, or -1 (uppercase included): two
 * unsigned compares, as this runs 32 times for each id the store looks up
 * (keylane-bench store's dedup lookups). */
static int uuid_hex(int c) {
  if ((unsigned)(c - '0') < 10)
    return c - '0';
  return (unsigned)(c - 'a') < 6 ? c - 'a' + 10 : -1;
}

int kl__uuid_parse(const char *text, size_t len, uint8_t out[16]) {
  if (len != 36 || text[8] != '-' || text[13] != '-' || text[18] != '-' ||
      text[23] != '-')
    return -1;
  for (size_t i = 0; i < 16; i++) {
    int hi = uuid_hex(text[kl_uuid_text_at[i]]);
    int lo = uuid_hex(text[kl_uuid_text_at[i] + 1]);
    if ((hi | lo) < 0)
      return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

uint64_t kl__uuid_random64(void) {
  const uint8_t *rnd = uuid_random();
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | rnd[i];
  return v;
}

void kl__event_make_id_at(char out[37], int64_t now_ms) {
  const uint8_t *rnd = uuid_random();
  uint64_t stamp = uuid_stamp(rnd, now_ms);
  uint8_t b[16];
  for (int i = 0; i < 6; i++)
    b[i] = (uint8_t)(stamp >> (52 - 8 * i));
  b[6] = (uint8_t)(0x70 | ((stamp >> 8) & 0x0f));
  b[7] = (uint8_t)stamp;
  b[8] = (uint8_t)(0x80 | (rnd[2] & 0x3f));
  for (int i = 9; i < 16; i++)
    b[i] = rnd[i - 6];
  kl__uuid_format(b, out);
  out[36] = '\0';
}
