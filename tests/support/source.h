/* Files of the source tree (KEYLANE_SOURCE_DIR), for tests that check a
 * page of docs/ against the code or run what it shows. */
#ifndef KEYLANE_TESTS_SUPPORT_SOURCE_H
#define KEYLANE_TESTS_SUPPORT_SOURCE_H

#include <stddef.h>

/* @p rel's path under KEYLANE_SOURCE_DIR (. when unset) into @p path. */
void kl_t_source_path(const char *rel, char *path, size_t size);

/* @p rel's contents, NUL terminated (the caller frees); fails the test
 * when it cannot be read. */
char *kl_t_source_file(const char *rel);

#endif
