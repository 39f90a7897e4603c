/*
 * A store's location as keylane reads and prints it: an LMDB directory, a
 * postgresql:// (or postgres://) URI, or a libpq keyword/value connection
 * string ("host=db dbname=kl user=kl password=..."). A PostgreSQL location
 * may hold a password, which nothing keylane prints, logs or reports may
 * show: every output names a location through kl__location_redact(), and
 * every text that may quote it (libpq's errors do) through
 * kl__location_scrub(). Not installed.
 */
#ifndef KEYLANE_STORE_LOCATION_H
#define KEYLANE_STORE_LOCATION_H

#include <stddef.h>

/* What a password is printed as. */
#define KL__LOCATION_HIDDEN "****"

/* A buffer that holds a redacted location or a scrubbed error. */
#define KL__LOCATION_MAX 1024

/**
 * @returns nonzero when @p location names a PostgreSQL store: a
 *          postgresql:// or postgres:// URI, or a connection string whose
 *          first word is a keyword followed by '=' ("host=db ..."). An
 *          LMDB directory whose name starts that way is written "./name".
 */
int kl__location_is_pg(const char *location);

/**
 * @p location as it may be printed: the password of a PostgreSQL URI (its
 * user info's, or a password= query parameter's) or connection string
 * (password=..., quoted or not) replaced by KL__LOCATION_HIDDEN; an LMDB
 * directory as it is. Cut to @p size - 1 bytes.
 * @returns @p out.
 */
const char *kl__location_redact(const char *location, char *out, size_t size);

/**
 * Copies @p text into @p out (@p size bytes) with @p location replaced by
 * its redacted form and every other occurrence of its password (as
 * written, and percent- or quote-decoded) that stands where a password
 * stands (after ':', '=' or a quote; before '@', '&', a quote or a space)
 * by KL__LOCATION_HIDDEN: for messages that may quote a connection
 * string, such as libpq's. The letters of a short password inside a word
 * ("a" in "cannot") are left, so the message stays readable.
 * @returns @p out.
 */
const char *kl__location_scrub(const char *location, const char *text,
                               char *out, size_t size);

#endif
