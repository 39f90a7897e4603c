/*
 * The one msgpack reader: item by item over a byte range, every length
 * checked against the bytes left before it is used, nothing allocated.
 * Used by the envelope decoder (event/envelope.c) and the msgpack -> JSON
 * conversion (common/json_msgpack.c), which each say what they accept.
 *
 * Internal, not installed. Thread safe (no shared state).
 */
#ifndef KEYLANE_COMMON_MSGPACK_READ_H
#define KEYLANE_COMMON_MSGPACK_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  KL__MP_NONE, /**< no format byte: the input ended */
  KL__MP_NIL,
  KL__MP_BOOL,
  KL__MP_INT,
  KL__MP_FLOAT,
  KL__MP_STR,
  KL__MP_BIN,
  KL__MP_ARRAY,
  KL__MP_MAP,
  KL__MP_EXT,
  KL__MP_NEVER, /**< 0xc1, which msgpack never uses */
} kl__mp_kind_t;

/** One item: its header, and the body of a str, bin or ext. */
typedef struct kl__mp_item {
  kl__mp_kind_t kind;
  const char *what;    /**< the type's name for messages: "int", "str" */
  uint64_t n;          /**< str/bin/ext length, array/map count, or the raw
                            value of an unsigned int */
  int64_t i;           /**< an int's value, when !big */
  bool big;            /**< an unsigned int above INT64_MAX (n holds it) */
  bool b;              /**< a bool's value */
  double d;            /**< a float's value (float32 widened) */
  const uint8_t *body; /**< str/bin/ext bytes, borrowed from the input */
} kl__mp_item_t;

/** A cursor over [begin, end); p is the next byte to read. */
typedef struct kl__mp_reader {
  const uint8_t *begin, *p, *end;
} kl__mp_reader_t;

typedef enum {
  KL__MP_OK,
  KL__MP_SHORT_HEAD, /**< cut in the format byte or its length/value */
  KL__MP_SHORT_BODY, /**< cut in a str's, bin's or ext's bytes */
} kl__mp_status_t;

/** A reader over @p len bytes at @p data. */
kl__mp_reader_t kl__mp_reader(const void *data, size_t len);

/**
 * Reads the next item into @p item. An array's or map's elements are the
 * items that follow: the caller reads them with further calls.
 * @param need  on a short input, the bytes the cut part needs; rd->p is
 *              then left where it was cut, and item->kind says what was
 *              being read (KL__MP_NONE when not even the format byte was
 *              there).
 */
kl__mp_status_t kl__mp_next(kl__mp_reader_t *rd, kl__mp_item_t *item,
                            uint64_t *need);

/**
 * Moves @p rd past the next value, a container's elements included.
 * @returns false when the input ends first (@p rd is then where it was cut).
 */
bool kl__mp_skip(kl__mp_reader_t *rd);

/** @returns the offset of rd->p from the start of the input. */
size_t kl__mp_offset(const kl__mp_reader_t *rd);

#endif
