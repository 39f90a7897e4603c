/*
 * keylane worker's bounded stop (worker.shutdown.timeout).
 *
 * The first SIGTERM or SIGINT stops the worker gracefully: it takes no new
 * record, lets the events in flight finish, commits them with the final
 * offsets, and leaves the group (a static member stays: membership.h);
 * kl_worker_run() then returns and the process exits 0. A second signal,
 * or worker.shutdown.timeout after the first, aborts that: the process
 * exits 1 at once, with what is in flight uncommitted, after killing the
 * exec handler's children (handlers/exec_spawn.h). Nothing is applied
 * twice: an uncommitted batch leaves nothing in the store, and the
 * partition's next owner, under a newer epoch, applies those events from
 * the store's watermark, skipping the ids the store already holds.
 *
 * Caveats: kl__stop_guard_signal() is the one call a signal handler may
 * make; the others run on the thread that runs the worker.
 */
#ifndef KEYLANE_CLI_STOP_GUARD_H
#define KEYLANE_CLI_STOP_GUARD_H

#include <stdint.h>

#include "keylane/error.h"
#include "keylane/worker.h"

typedef struct kl__stop_guard kl__stop_guard_t;

/**
 * Starts the guard of @p worker (borrowed: destroy the guard before the
 * worker) on a thread of its own, which waits for a signal.
 * @param timeout_ms  worker.shutdown.timeout
 * @param out  on KL_OK, the guard, for kl__stop_guard_destroy().
 */
kl_err_t kl__stop_guard_new(kl_worker_t *worker, int64_t timeout_ms,
                            kl__stop_guard_t **out);

/** Tells the guard that signal @p sig arrived. Async-signal-safe. */
void kl__stop_guard_signal(kl__stop_guard_t *guard, int sig);

/** Stops the guard's thread and frees it; accepts NULL. */
void kl__stop_guard_destroy(kl__stop_guard_t *guard);

#endif
