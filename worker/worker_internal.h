/* Internal worker interfaces: test hooks. Not installed. */
#ifndef KEYLANE_WORKER_INTERNAL_H
#define KEYLANE_WORKER_INTERNAL_H

#include "keylane/worker.h"

/**
 * Called on the worker's thread after the handlers of a batch ran and
 * before its store commit: the window in which a GC pause or a stalled VM
 * lets another owner take the partition. Tests block here to make exactly
 * that happen.
 */
typedef void(kl__worker_hook_fn)(void *opaque, const char *topic,
                                 int32_t partition, uint64_t epoch);

void kl__worker_set_before_commit(kl_worker_t *worker, kl__worker_hook_fn *fn,
                                  void *opaque);

/**
 * Misrouted records seen per partition since the worker started (the
 * metric keylane_worker_misrouted_total): fills @p by_partition[0..n-1].
 * Any thread. @returns n, at most @p max.
 */
size_t kl__worker_misrouted(kl_worker_t *worker, uint64_t *by_partition,
                            size_t max);

#endif
