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

/* One getrandom() call per 400 ids (4000 bytes): the syscall was a tenth
 * of the cost of kl_publish at 25 ids a call. */
enum { KL_UUID_RANDOM = 10, KL_UUID_BATCH = 400 };

static _Atomic uint64_t kl_uuid_last;
/* Counts forks, in the child: a thread's pool drawn under another count is
 * its parent's. Two processes drawing the same bytes in the same ms make
 * the same id, and the store takes the second event for a duplicate of the
 * first. */
static _Atomic unsigned kl_uuid_gen = 1;
static pthread_once_t kl_uuid_once = PTHREAD_ONCE_INIT;

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

/* Random bytes for one id, from a per-thread pool refilled by getrandom(),
 * and drawn again in a child after fork(). */
static const uint8_t *uuid_random(void) {
  static _Thread_local uint8_t pool[KL_UUID_RANDOM * KL_UUID_BATCH];
  static _Thread_local size_t used = sizeof(pool);
  static _Thread_local unsigned drawn; /* kl_uuid_gen of the pool */
  unsigned gen = atomic_load_explicit(&kl_uuid_gen, memory_order_relaxed);
  if (used == sizeof(pool) || drawn != gen) {
    pthread_once(&kl_uuid_once, uuid_atfork);
    drawn = atomic_load(&kl_uuid_gen);
    ssize_t n;
    do
      n = getrandom(pool, sizeof(pool), 0);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof(pool))
      uuid_fallback(pool, sizeof(pool));
    used = 0;
  }
  used += KL_UUID_RANDOM;
  return pool + used - KL_UUID_RANDOM;
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

/* The two digits of every byte, "00" to "ff": a byte is one 2-byte copy,
 * not two lookups (kl_publish() formats an id per event: issue 37). */
#define KL_HEX16(h)                                                            \
  h "0" h "1" h "2" h "3" h "4" h "5" h "6" h "7" h "8" h "9" h "a" h "b" h    \
    "c" h "d" h "e" h "f"
static const char kl_hex_pairs[] = KL_HEX16("0") KL_HEX16("1") KL_HEX16("2")
    KL_HEX16("3") KL_HEX16("4") KL_HEX16("5") KL_HEX16("6") KL_HEX16("7")
        KL_HEX16("8") KL_HEX16("9") KL_HEX16("a") KL_HEX16("b") KL_HEX16("c")
            KL_HEX16("d") KL_HEX16("e") KL_HEX16("f");

void kl__uuid_format(const uint8_t b[16], char out[36]) {
  for (int i = 0; i < 16; i++)
    memcpy(out + kl_uuid_text_at[i], kl_hex_pairs + 2 * b[i], 2);
  out[8] = out[13] = out[18] = out[23] = '-';
}

/* A lowercase hex digit's value with KL_UUID_DIGIT set, or 0 (not one:
 * uppercase included). The store parses every id it looks up and marks
 * (keylane-bench store's dedup lookups, the worker's path: issue 37), so a
 * pair of digits is two loads and an AND, not four compares. */
#define KL_UUID_DIGIT 0x20
static const uint8_t kl_uuid_hex[256] = {
    ['0'] = KL_UUID_DIGIT | 0,  ['1'] = KL_UUID_DIGIT | 1,
    ['2'] = KL_UUID_DIGIT | 2,  ['3'] = KL_UUID_DIGIT | 3,
    ['4'] = KL_UUID_DIGIT | 4,  ['5'] = KL_UUID_DIGIT | 5,
    ['6'] = KL_UUID_DIGIT | 6,  ['7'] = KL_UUID_DIGIT | 7,
    ['8'] = KL_UUID_DIGIT | 8,  ['9'] = KL_UUID_DIGIT | 9,
    ['a'] = KL_UUID_DIGIT | 10, ['b'] = KL_UUID_DIGIT | 11,
    ['c'] = KL_UUID_DIGIT | 12, ['d'] = KL_UUID_DIGIT | 13,
    ['e'] = KL_UUID_DIGIT | 14, ['f'] = KL_UUID_DIGIT | 15};

int kl__uuid_parse(const char *text, size_t len, uint8_t out[16]) {
  if (len != 36 || text[8] != '-' || text[13] != '-' || text[18] != '-' ||
      text[23] != '-')
    return -1;
  const unsigned char *t = (const unsigned char *)text;
  unsigned all = KL_UUID_DIGIT;
  for (size_t i = 0; i < 16; i++) {
    unsigned hi = kl_uuid_hex[t[kl_uuid_text_at[i]]];
    unsigned lo = kl_uuid_hex[t[kl_uuid_text_at[i] + 1]];
    all &= hi & lo;
    out[i] = (uint8_t)((hi & 0x0f) << 4 | (lo & 0x0f));
  }
  return all ? 0 : -1;
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
