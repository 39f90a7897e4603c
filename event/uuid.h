/*
 * UUID text, 8-4-4-4-12 lowercase hex digits, and its 16 bytes: the
 * producer writes the ids it makes (uuid.c), the LMDB store keeps
 * canonical ones in 16 bytes (store/lmdb_ids.c). And the random bits
 * behind both ids and follow-ups' nonces.
 */
#ifndef KEYLANE_EVENT_UUID_H
#define KEYLANE_EVENT_UUID_H

#include <stddef.h>
#include <stdint.h>

/** Writes the 36 characters (no NUL) of @p b's text into @p out. */
void kl__uuid_format(const uint8_t b[16], char out[36]);

/**
 * Reads canonical UUID text (36 characters, lowercase) into @p out.
 * @returns 0, or -1 when @p text is not one: uppercase hex is not, since
 *          it is a different id and must stay one.
 */
int kl__uuid_parse(const char *text, size_t len, uint8_t out[16]);

/**
 * @returns 64 random bits from the pool the producer's ids draw on (this
 * thread's getrandom() pool, drawn again after fork()): a
 * follow-up's nonce (emit_id.h).
 */
uint64_t kl__uuid_random64(void);

#endif
