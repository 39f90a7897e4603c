/* The growable byte string and kl__reserve(); see strbuf.h. */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"

/* Room for @p extra more bytes plus a NUL; doubles to keep appends O(1). */
static bool strbuf_reserve(kl__strbuf_t *sb, size_t extra) {
  if (sb->failed)
    return false;
  if (sb->len + extra < sb->cap)
    return true;
  char *data =
      extra < SIZE_MAX - sb->len
          ? kl__reserve(sb->data, &sb->cap, sb->len + extra + 1, 1, 256)
          : NULL;
  if (!data) {
    sb->failed = true;
    return false;
  }
  sb->data = data;
  return true;
}

void kl__strbuf_add(kl__strbuf_t *sb, const void *data, size_t len) {
  if (len == 0 || !strbuf_reserve(sb, len))
    return;
  memcpy(sb->data + sb->len, data, len);
  sb->len += len;
  sb->data[sb->len] = '\0';
}

void kl__strbuf_puts(kl__strbuf_t *sb, const char *s) {
  kl__strbuf_add(sb, s, strlen(s));
}

void kl__strbuf_printf(kl__strbuf_t *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !strbuf_reserve(sb, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb->len += (size_t)n;
}

/* Whether the 8 bytes at @p s are ASCII that needs no escaping in a JSON
 * string: no byte >= 0x80 (its top bit set), no control byte (below 0x20),
 * no '"', no '\\'. A byte below 0x20 borrows in the subtraction and sets
 * its top bit, as a byte equal to a quote or backslash does once xored to
 * 0; a borrow only ever follows a byte that is flagged. */
static bool json_plain8(const unsigned char *s) {
  uint64_t w, ones = UINT64_C(0x0101010101010101);
  memcpy(&w, s, 8);
  uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
  uint64_t hit = (w - ones * 0x20) | (quote - ones) | (slash - ones);
  return ((hit | w) & ones * 0x80) == 0;
}

void kl__strbuf_json_str(kl__strbuf_t *sb, const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  kl__strbuf_add(sb, "\"", 1);
  size_t run = 0; /* bytes copied in one go between escapes */
  for (size_t i = 0; i < len;) {
    /* The common text, an id, has nothing to escape: 8 bytes a step. */
    if (len - i >= 8 && json_plain8(u + i)) {
      i += 8;
      continue;
    }
    unsigned char c = u[i];
    size_t n = c < 0x80 ? 1 : kl__utf8_seq(u + i, len - i);
    if (n > 1 || (n == 1 && c >= 0x20 && c != '"' && c != '\\')) {
      i += n;
      continue;
    }
    kl__strbuf_add(sb, s + run, i - run);
    if (n == 0)
      kl__strbuf_add(sb, "\\ufffd", 6);
    else if (c == '"' || c == '\\')
      kl__strbuf_printf(sb, "\\%c", c);
    else
      kl__strbuf_printf(sb, "\\u%04x", c);
    run = ++i;
  }
  kl__strbuf_add(sb, s + run, len - run);
  kl__strbuf_add(sb, "\"", 1);
}

bool kl__strbuf_ok(const kl__strbuf_t *sb) {
  return !sb->failed;
}

char *kl__strbuf_take(kl__strbuf_t *sb, size_t *len) {
  if (sb->failed || !strbuf_reserve(sb, 0)) {
    kl__strbuf_free(sb);
    return NULL;
  }
  char *data = sb->data;
  data[sb->len] = '\0';
  if (len)
    *len = sb->len;
  *sb = (kl__strbuf_t)KL__STRBUF_INIT;
  return data;
}

void kl__strbuf_free(kl__strbuf_t *sb) {
  free(sb->data);
  *sb = (kl__strbuf_t)KL__STRBUF_INIT;
}

size_t kl__utf8_seq(const unsigned char *s, size_t left) {
  unsigned char c = s[0];
  size_t n = c < 0x80                 ? 1
             : c >= 0xc2 && c <= 0xdf ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || n > left)
    return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80)
      return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) ||
      (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
    return 0;
  return n;
}

/* Whether the 8 bytes at @p s are all ASCII, and with @p nul_ok unset
 * none of them NUL (0x01..0x7f): a byte of 0 borrows in the subtraction
 * and sets its top bit, a byte >= 0x80 has it set already; a borrow only
 * ever follows a byte that is flagged. */
static bool ascii8(const unsigned char *s, bool nul_ok) {
  uint64_t w;
  memcpy(&w, s, 8);
  uint64_t nul = nul_ok ? 0 : w - UINT64_C(0x0101010101010101);
  return ((nul | w) & UINT64_C(0x8080808080808080)) == 0;
}

size_t kl__utf8_valid_len(const char *text, size_t len, bool nul_ok) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < len) {
    if (len - i >= 8 && ascii8(s + i, nul_ok)) {
      i += 8;
    } else if (s[i] < 0x80) {
      if (s[i] == 0 && !nul_ok)
        return i;
      i++;
    } else {
      size_t n = kl__utf8_seq(s + i, len - i);
      if (n == 0)
        return i;
      i += n;
    }
  }
  return len;
}

/* The most one character's escaped text takes: 4 bytes, each as \xNN. */
#define KL_ESCAPE_PIECE 16

/* Code points that are invisible where they stand: Unicode's default
 * ignorable ones (soft hyphen, zero widths, joiners, fillers, variation
 * selectors, tags, the BOM), the direction and line marks, the
 * interlinear annotations, and private use, which no font agrees on. Each
 * can make a key show another key's text ("d2\u200b1" as "d21") or turn
 * its row's columns around ("Trojan Source"). Sorted ranges. */
static const uint32_t kl_invisible[][2] = {
    {0x00ad, 0x00ad},   {0x034f, 0x034f},   {0x061c, 0x061c},
    {0x115f, 0x1160},   {0x17b4, 0x17b5},   {0x180b, 0x180f},
    {0x200b, 0x200f},   {0x2028, 0x202e},   {0x2060, 0x206f},
    {0x3164, 0x3164},   {0xe000, 0xf8ff},   {0xfe00, 0xfe0f},
    {0xfeff, 0xfeff},   {0xffa0, 0xffa0},   {0xfff0, 0xfffb},
    {0x1bca0, 0x1bca3}, {0x1d173, 0x1d17a}, {0xe0000, 0xe0fff},
    {0xf0000, 0x10ffff}};

/* Whether the @p n-byte UTF-8 character at @p p (a whole one, or n == 0)
 * is one a terminal acts on or that changes how the text around it
 * reads: a C0 control, DEL, a C1 control, or one of kl_invisible. */
static bool escape_needed(const unsigned char *p, size_t n) {
  if (n == 1)
    return p[0] < 0x20 || p[0] == 0x7f;
  if (n < 2)
    return true;
  uint32_t cp = p[0] & (0x7f >> n);
  for (size_t i = 1; i < n; i++)
    cp = cp << 6 | (p[i] & 0x3f);
  if (cp < 0xa0)
    return true; /* C1 */
  for (size_t i = 0; i < sizeof(kl_invisible) / sizeof(kl_invisible[0]); i++)
    if (cp <= kl_invisible[i][1])
      return cp >= kl_invisible[i][0];
  return false;
}

/* The escaped text of the character at @p p (@p left bytes remain) into
 * @p out: at most KL_ESCAPE_PIECE bytes (a 4-byte character as \xNN
 * each), no NUL. @returns its length; *@p used receives the bytes of @p p
 * it stands for. */
static size_t escape_one(const unsigned char *p, size_t left,
                         char out[KL_ESCAPE_PIECE], size_t *used) {
  size_t n = kl__utf8_seq(p, left);
  bool control = escape_needed(p, n);
  *used = n ? n : 1;
  if (n == 1 && p[0] == '\\') {
    memcpy(out, "\\\\", 2);
    return 2;
  }
  if (n && !control) {
    memcpy(out, p, n);
    return n;
  }
  for (size_t j = 0; j < *used; j++) {
    char *o = out + 4 * j;
    o[0] = '\\';
    o[1] = 'x';
    kl__hex_encode(p + j, 1, o + 2);
  }
  return 4 * *used;
}

void kl__strbuf_escaped(kl__strbuf_t *sb, const void *s, size_t len) {
  const unsigned char *p = s;
  char piece[KL_ESCAPE_PIECE];
  for (size_t i = 0, used; i < len; i += used)
    kl__strbuf_add(sb, piece, escape_one(p + i, len - i, piece, &used));
}

const char *kl__escape(char *out, size_t size, const void *s, size_t len) {
  const unsigned char *p = s;
  char piece[KL_ESCAPE_PIECE];
  size_t n = 0, keep = 0, used;
  if (!size)
    return out;
  for (size_t i = 0; i < len; i += used) {
    size_t k = escape_one(p + i, len - i, piece, &used);
    if (n + k >= size) { /* cut after the last piece that leaves room */
      n = keep;
      if (n + 3 < size) {
        memcpy(out + n, "...", 3);
        n += 3;
      }
      break;
    }
    memcpy(out + n, piece, k);
    n += k;
    if (n + 3 < size) /* "..." and the NUL still fit after it */
      keep = n;
  }
  out[n] = '\0';
  return out;
}

void *kl__reserve(void *items, size_t *cap, size_t need, size_t size,
                  size_t first) {
  if (need <= *cap)
    return items;
  size_t n = *cap ? *cap : first;
  if (!n)
    return NULL;
  while (n < need) {
    if (n > SIZE_MAX / 2) /* doubling would wrap */
      return NULL;
    n *= 2;
  }
  if (n > SIZE_MAX / size)
    return NULL;
  void *grown = realloc(items, n * size);
  if (grown)
    *cap = n;
  return grown;
}

void *kl__grow_zeroed(void *items, size_t count, size_t need, size_t size) {
  if (need > SIZE_MAX / size)
    return NULL;
  unsigned char *grown = realloc(items, need * size);
  if (grown)
    memset(grown + count * size, 0, (need - count) * size);
  return grown;
}
