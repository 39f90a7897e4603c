/*
 * The executors that run the lanes' events: worker.concurrency threads,
 * or, at concurrency 1, the poll thread itself (inline mode), which saves
 * a thread hop per event and lets the events read through the lane's open
 * group transaction instead of a snapshot each.
 *
 * Each executor has its own decoder; the handler may be called from any
 * of them, never twice at once for one event key.
 */
#ifndef KEYLANE_WORKER_LANES_POOL_H
#define KEYLANE_WORKER_LANES_POOL_H

#include "worker/lanes.h"

typedef struct kl__lanes_pool kl__lanes_pool_t;

/**
 * Starts @p threads executors on @p lanes (borrowed); 0 starts none, for
 * inline mode.
 */
kl_err_t kl__lanes_pool_new(kl__lanes_t *lanes, int threads,
                            kl__lanes_pool_t **out);

/** Stops the executors (kl__lanes_stop()) and joins them; accepts NULL. */
void kl__lanes_pool_destroy(kl__lanes_pool_t *pool);

/**
 * Inline mode: runs ready events on the calling (poll) thread while less
 * than @p budget_ms has passed, checked before each event, so that the
 * thread is back to polling within @p budget_ms plus one handler call.
 * @returns the number run.
 */
int kl__lanes_pool_run_inline(kl__lanes_pool_t *pool, int budget_ms);

#endif
