/*
 * Bearer tokens: a set read from a file, checked in constant time.
 *
 * The file holds one token per line; blank lines and lines starting with
 * '#' are skipped, and surrounding spaces, tabs and the CR of CRLF files
 * are trimmed. Each token is 1..KL_TOKEN_MAX bytes of visible ASCII (RFC
 * 6750's token68 and more). The file is read once: rotate tokens by
 * restarting (or by a new set loaded and swapped by the caller).
 *
 * Constant time: kl__tokens_check() compares the candidate with every token,
 * always over KL_TOKEN_MAX bytes, and without an early exit, so its running
 * time depends on neither which token matched, nor how many leading bytes
 * matched, nor any token's length.
 *
 * Tokens are secrets: nothing here logs them or puts them in an error
 * detail (a bad line is reported by its number).
 *
 * Ownership: the set owns copies of the tokens; kl__tokens_destroy() wipes
 * and frees them.
 *
 * Caveats:
 * - A loaded set is read-only: kl__tokens_check() may run on any thread.
 */
#ifndef KEYLANE_COMMON_TOKEN_H
#define KEYLANE_COMMON_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "common/internal.h"

/** Longest token accepted, in bytes. */
#define KL_TOKEN_MAX 256
/** Most tokens in one file. */
#define KL_TOKENS_MAX 1024
/** Largest tokens file read: KL_TOKENS_MAX lines of KL_TOKEN_MAX bytes,
 * and room for comments. */
#define KL_TOKENS_FILE_MAX (1024 * 1024)
/** Tokens shorter than this are accepted, with a warning. */
#define KL_TOKEN_MIN_ADVISED 16

typedef struct kl__tokens kl__tokens_t;

/**
 * Reads the tokens of @p path.
 * @returns KL_OK and *out (freed with kl__tokens_destroy()); KL_EIO when the
 *          file cannot be read; KL_ECONF for a file with no token, a token
 *          too long or with control bytes, a NUL byte, more than
 *          KL_TOKENS_MAX tokens, or more than KL_TOKENS_FILE_MAX bytes
 *          (/dev/zero: refused at once, not read forever) (the detail
 *          names the line, never its text).
 */
kl_err_t kl__tokens_load(const char *path, kl__tokens_t **out);

/**
 * Reads the tokens of @p text (the file's format) as kl__tokens_load()
 * does; @p name stands for the file in messages ("KEYLANE_CONSOLE_TOKEN").
 */
kl_err_t kl__tokens_parse(const char *name, const char *text,
                          kl__tokens_t **out);

/**
 * @returns what to warn about a loaded file, or NULL: it is readable by
 *          every user of the host, or a token is shorter than
 *          KL_TOKEN_MIN_ADVISED bytes. Names no token. Valid while
 *          @p tokens lives.
 */
const char *kl__tokens_warning(const kl__tokens_t *tokens);

/** @returns how many tokens @p tokens holds. */
size_t kl__tokens_count(const kl__tokens_t *tokens);

/**
 * @returns true when @p candidate (@p len bytes) equals one of the tokens,
 *          in time that depends only on the number of tokens.
 */
bool kl__tokens_check(const kl__tokens_t *tokens, const void *candidate,
                      size_t len);

/**
 * @returns true when the @p len bytes at @p a and @p b are equal, reading
 *          all of them whatever they hold.
 */
bool kl__ct_equal(const void *a, const void *b, size_t len);

/** Wipes and frees @p tokens; accepts NULL. */
void kl__tokens_destroy(kl__tokens_t *tokens);

#endif
