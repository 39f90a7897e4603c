/* Running the keylane executable (KEYLANE_BIN) from a test. */
#ifndef KEYLANE_TESTS_SUPPORT_RUN_H
#define KEYLANE_TESTS_SUPPORT_RUN_H

#include <stddef.h>

typedef struct kl_t_run {
  int rc;    /* exit status, or 128 + signal */
  char *out; /* stdout, NUL terminated */
  char *err; /* stderr, NUL terminated */
} kl_t_run_t;

/* Runs keylane with @p args (NULL-terminated, without argv[0]) and waits
 * for it; stdin holds @p input (@p len bytes; may be NULL), stdout and
 * stderr go to files, so no pipe can fill up and block. Asserts on any
 * failure to run it. */
void kl_t_run(const char *const *args, const char *input, size_t len,
              kl_t_run_t *r);
/* The same, but a run still going after @p timeout_ms is killed (SIGKILL:
 * rc 137), so a command that should have refused its flags cannot hang
 * the test. */
void kl_t_run_for(const char *const *args, const char *input, size_t len,
                  int timeout_ms, kl_t_run_t *r);
/* The same, sending SIGTERM once @p term_ms have passed (a run still
 * going after @p timeout_ms is killed: rc 137). */
void kl_t_run_term(const char *const *args, int term_ms, int timeout_ms,
                   kl_t_run_t *r);
void kl_t_run_free(kl_t_run_t *r);
/* Runs @p args every 200 ms, for at most @p timeout_ms, until one run exits
 * 0 with @p needle in its stdout (a worker's effect showing in `keylane
 * ledger`). @returns 1 when one did, else 0. */
int kl_t_run_until(const char *const *args, const char *needle, int timeout_ms);
/* @p r's stdout parsed as JSON (the caller json_decref()s it); fails the
 * test, showing the output, when it is not JSON. */
struct json_t *kl_t_run_json(const kl_t_run_t *r);

#endif
