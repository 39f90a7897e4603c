/*
 * JSON values <-> msgpack, and base64: how events cross the text boundary
 * (keylane publish, the HTTP gateway, keylane inspect).
 *
 * Mapping, both ways: null <-> nil, true/false <-> bool, integer <-> int,
 * real <-> float64, string <-> str, array <-> array, object <-> map with
 * str keys (in the object's order). msgpack that JSON cannot say is refused
 * with a reason, except bin, which becomes {"$base64": "..."}: ext, a
 * non-str map key, a map key holding a NUL or given twice in one map (as
 * jansson's reader with JSON_REJECT_DUPLICATES refuses them), an integer
 * above INT64_MAX, a str that is not UTF-8, a NaN or infinite float.
 *
 * Limits: nesting depth at most KL_JSON_DEPTH_MAX both ways; the msgpack
 * produced at most @p max_size bytes. A msgpack input is read with every
 * length checked against the bytes left before anything is allocated, so a
 * few bytes claiming a huge array cannot make it allocate.
 *
 * Internal, not installed. Thread safe (no shared state).
 */
#ifndef KEYLANE_COMMON_JSON_MSGPACK_H
#define KEYLANE_COMMON_JSON_MSGPACK_H

#include <stddef.h>

#include <jansson.h>

#include "common/msgpack_read.h"
#include "keylane/error.h"

#define KL_JSON_DEPTH_MAX 64

/**
 * Packs @p value as msgpack.
 * @param out  receives a malloc()ed buffer the caller frees; untouched on
 *             failure.
 * @returns KL_OK; KL_EINVAL when too deep or over @p max_size bytes, with
 *          the reason in kl_err_detail(); KL_ENOMEM.
 */
kl_err_t kl__json_to_msgpack(const json_t *value, size_t max_size, void **out,
                             size_t *out_len);

/** An allocator that hands out memory its owner frees all at once (an
 * arena): @returns @p size bytes aligned for any type, or NULL. */
typedef void *(kl__alloc_fn_t)(void *ctx, size_t size);

/**
 * kl__json_to_msgpack() into memory from @p alloc (@p ctx is passed to
 * it), sized exactly: packed on the stack and copied when it takes at most
 * 1 KiB, else walked twice, to measure and to write in place; no malloc()
 * either way.
 * @param out  receives the bytes, @p alloc's; untouched on failure.
 */
kl_err_t kl__json_to_msgpack_in(const json_t *value, size_t max_size,
                                kl__alloc_fn_t *alloc, void *ctx,
                                const void **out, size_t *out_len);

/**
 * Reads exactly one msgpack value from @p data (trailing bytes are an
 * error) into a new JSON value.
 * @param out  receives a new reference the caller json_decref()s.
 * @returns KL_OK; KL_EINVAL naming the offending byte offset; KL_ENOMEM.
 */
kl_err_t kl__msgpack_to_json(const void *data, size_t len, json_t **out);

/**
 * Reads one msgpack value at @p rd, nested @p depth deep in its input (1:
 * the input's own value), checks it as kl__msgpack_to_json() checks its
 * input, and writes what kl__json_to_msgpack() would pack of the JSON
 * value it reads as, byte for byte, without making that value: the gateway
 * takes a msgpack body's payloads this way.
 * @param out  receives the bytes, @p alloc's, which also holds the key
 *             sets of large maps.
 * @returns KL_OK with @p rd past the value; KL_EINVAL as
 *          kl__msgpack_to_json() (the byte offset from the reader's
 *          start), or over @p max_size; KL_ENOMEM.
 */
kl_err_t kl__msgpack_repack_in(kl__mp_reader_t *rd, int depth, size_t max_size,
                               kl__alloc_fn_t *alloc, void *ctx,
                               const void **out, size_t *out_len);

/**
 * kl__msgpack_to_json() for a whole request body: the JSON value the body
 * stands for, its nesting limited as jansson's reader limits a JSON text
 * (JSON_PARSER_MAX_DEPTH values deep) instead of KL_JSON_DEPTH_MAX,
 * so that a msgpack body nests as deep as the same JSON body may. (A
 * payload's own limit is applied when it is packed.)
 */
kl_err_t kl__msgpack_body_to_json(const void *data, size_t len, json_t **out);

/**
 * Checks @p data as kl__msgpack_body_to_json() reads it, without making
 * the JSON value: the same faults, with the same messages.
 * @param alloc  holds the key sets of large maps (an arena's).
 */
kl_err_t kl__msgpack_check(const void *data, size_t len, kl__alloc_fn_t *alloc,
                           void *ctx);

/** @returns the length of the base64 text of @p len bytes, without NUL. */
size_t kl__base64_encoded_len(size_t len);

/** Writes the base64 (RFC 4648, padded) of @p data and a NUL into @p out,
 * which holds kl__base64_encoded_len(len) + 1 bytes. */
void kl__base64_encode(const void *data, size_t len, char *out);

/**
 * Decodes base64 (RFC 4648, padding required; no whitespace).
 * @param out  receives a malloc()ed buffer (never NULL on success, even for
 *             0 bytes) the caller frees.
 * @returns KL_OK; KL_EINVAL naming the first bad character's offset;
 *          KL_ENOMEM.
 */
kl_err_t kl__base64_decode(const char *text, size_t len, void **out,
                           size_t *out_len);

/** kl__base64_decode() into memory from @p alloc (@p ctx is passed to
 * it), which keeps it also on failure. */
kl_err_t kl__base64_decode_in(const char *text, size_t len,
                              kl__alloc_fn_t *alloc, void *ctx,
                              const void **out, size_t *out_len);

#endif
