/*
 * Settings from a file, for every subcommand: `--config FILE`, or the file
 * KEYLANE_CONFIG names when no --config is given. A line is `key = value`
 * (blank lines and lines beginning with '#' are skipped); the keys are the
 * ones -X takes (a key of the conf table, kafka.NAME, or a librdkafka
 * property alone), and store.uri, the default of --store. A value is the
 * rest of the line, trimmed; `${NAME}` is the environment variable NAME
 * and `@/path` the contents of a file (a secret mounted from a Kubernetes
 * Secret), less one trailing newline, read at start. The file is applied
 * before the command line, so -X and flags override it.
 *
 * Where each setting came from is noted for `keylane config`, which prints
 * the effective configuration; a secret's value (kl__conf_is_secret(), the
 * password of a store URI) is never printed.
 */
#ifndef KEYLANE_CLI_CONFIG_FILE_H
#define KEYLANE_CLI_CONFIG_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "keylane/conf.h"

/** The environment variable that names the file when --config does not. */
#define KL__CONFIG_ENV "KEYLANE_CONFIG"

/**
 * Reads @p path into @p conf (a scratch conf checks the keys when @p conf
 * is NULL: a command without -X). Prints "keylane SUB: FILE:LINE: ..." for
 * a line it refuses (an unknown key, a bad value, a variable that is not
 * set, a file that cannot be read), and a warning when the file holds a
 * secret and others may read it (or a @file it names).
 * @param store_uri  receives store.uri's value, or NULL; it lives as long
 *                   as the process.
 * @returns -1 to go on, or the exit code (KL_EXIT_USAGE).
 */
int kl__config_load(const char *sub, const char *path, kl_conf_t *conf,
                    const char **store_uri);

/** Notes that @p key was set from @p source ("-X", "--store",
 *  "FILE:LINE"); the last note of a key wins. */
void kl__config_note(const char *key, const char *source);

/** Where @p key was set (the last kl__config_note()), or NULL: default. */
const char *kl__config_source(const char *key);

/** The keys noted, in the order first noted; NULL past the last. */
const char *kl__config_noted(size_t i);

/** @p value as it may be shown for @p key: "(secret)" for a secret,
 *  a store location without its password (kl__location_redact()), else
 *  @p value; in @p buf when changed. */
const char *kl__config_shown(const char *key, const char *value, char *buf,
                             size_t size);

#endif
