/*
 * A growable byte string for building responses and exposition text, and
 * kl__grow()/kl__reserve(), the doubling of any array, and
 * kl__grow_zeroed() for an array indexed by partition.
 *
 * Ownership: the strbuf owns its bytes; kl__strbuf_free() releases them and
 * kl__strbuf_take() hands them to the caller. After an allocation failure
 * the strbuf is "failed": further appends are no-ops and kl__strbuf_ok()
 * says so, so a builder checks once at the end instead of after each call.
 *
 * Caveats:
 * - Not thread safe; a strbuf is used by one thread at a time.
 */
#ifndef KEYLANE_COMMON_STRBUF_H
#define KEYLANE_COMMON_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "common/internal.h"

typedef struct kl__strbuf {
  char *data; /**< NUL terminated when len > 0 and not failed */
  size_t len;
  size_t cap;
  bool failed;
} kl__strbuf_t;

#define KL__STRBUF_INIT                                                        \
  { NULL, 0, 0, false }

/** Appends @p len bytes of @p data. */
void kl__strbuf_add(kl__strbuf_t *sb, const void *data, size_t len);

/** Appends the NUL-terminated @p s. */
void kl__strbuf_puts(kl__strbuf_t *sb, const char *s);

/** Appends printf-formatted text. */
void kl__strbuf_printf(kl__strbuf_t *sb, const char *fmt, ...) KL__PRINTF(2, 3);

/**
 * Appends @p s as a JSON string literal, quotes included. Control bytes
 * are escaped as \\u00XX, and each byte that is not part of valid UTF-8
 * (kl__utf8_seq()) is written as \\ufffd, so the result is valid JSON
 * whatever @p s holds (a message quoting a client's text cut in the middle
 * of a character, say); other bytes are copied as they are.
 */
void kl__strbuf_json_str(kl__strbuf_t *sb, const char *s, size_t len);

/**
 * @returns the length of the UTF-8 sequence at @p s (at most @p left
 *          bytes), or 0 when it is not one: no overlong forms, no
 *          surrogates, nothing above U+10FFFF (RFC 3629).
 */
size_t kl__utf8_seq(const unsigned char *s, size_t left);

/**
 * @returns how many bytes of @p s, from its start, are valid UTF-8
 *          (kl__utf8_seq()'s rules), and without NUL unless @p nul_ok:
 *          @p len when all of them are. ASCII goes 8 bytes at a time.
 */
size_t kl__utf8_valid_len(const char *s, size_t len, bool nul_ok);

/**
 * Appends @p len bytes of @p s as text safe for a terminal and a log line,
 * and one-to-one (two different inputs never read the same): a backslash
 * as \\, a control byte (C0, DEL, C1), a NUL, any byte that is not part
 * of valid UTF-8, and each byte of a character that is invisible where
 * it stands (direction and line marks, zero widths, joiners, the BOM,
 * variation selectors, tags, private use: strbuf.c's kl_invisible; a
 * right-to-left override would show a key's text reversed, a zero width
 * space one key as another) as \xHH; other UTF-8 as it is.
 */
void kl__strbuf_escaped(kl__strbuf_t *sb, const void *s, size_t len);

/**
 * kl__strbuf_escaped() into @p out (@p size bytes, NUL-terminated): for
 * a log line that carries text a client or a handler wrote (a key, an id,
 * a type, a handler's error, a child's stderr), which must not start a
 * line of its own or drive the terminal. Text that does not fit is cut
 * between two characters and ends with "...".
 * @returns @p out, for a "%s":
 *   char k[KL__ESCAPED_SIZE(64)];
 *   KL_LOG_W(COMP, "key \"%s\" ...", kl__escape(k, sizeof(k), key, len));
 */
const char *kl__escape(char *out, size_t size, const void *s, size_t len);

/** The bytes kl__escape() needs for @p n bytes of text, however escaped. */
#define KL__ESCAPED_SIZE(n) (4 * (size_t)(n) + 1)

/** @returns true unless an allocation failed. */
bool kl__strbuf_ok(const kl__strbuf_t *sb);

/**
 * @returns the bytes (the caller frees them with free()) and their length
 *          in *len, leaving @p sb empty; NULL when an allocation failed.
 */
char *kl__strbuf_take(kl__strbuf_t *sb, size_t *len);

/** Frees the bytes and empties @p sb. */
void kl__strbuf_free(kl__strbuf_t *sb);

/**
 * Makes room for @p need items in @p items, an array of *cap items of
 * @p size bytes (> 0): when *cap is less, doubles it (from @p first, > 0,
 * when 0) until it holds them, reallocates @p items and sets *cap.
 * @returns the array to use from now on, or NULL when out of memory or
 *          too big; then @p items and *cap are unchanged and still the
 *          caller's.
 */
void *kl__reserve(void *items, size_t *cap, size_t need, size_t size,
                  size_t first);

/**
 * Makes room for one more item in @p items, an array of *cap items of
 * @p size bytes (> 0) that holds @p count: when it is full, reallocates it
 * to twice *cap (@p first, > 0, when *cap is 0) and sets *cap.
 * @returns the array to use from now on (@p items when it had room), or
 *          NULL when out of memory; then @p items and *cap are unchanged
 *          and still the caller's.
 */
static inline void *kl__grow(void *items, size_t *cap, size_t count,
                             size_t size, size_t first) {
  return count < *cap ? items : kl__reserve(items, cap, count + 1, size, first);
}

/**
 * Lengthens @p items, an array of @p count items of @p size bytes (> 0),
 * to @p need items (> @p count) exactly, the new ones zeroed: for an
 * array indexed by partition, whose length is the partitions seen.
 * @returns the array to use from now on, or NULL when out of memory or
 *          too big; then @p items is unchanged and still the caller's.
 */
void *kl__grow_zeroed(void *items, size_t count, size_t need, size_t size);

#endif
