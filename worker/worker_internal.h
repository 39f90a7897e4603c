/* Internal worker interfaces: test hooks. Not installed. */
#ifndef KEYLANE_WORKER_INTERNAL_H
#define KEYLANE_WORKER_INTERNAL_H

#include "keylane/worker.h"
#include "worker/lane_stall.h"

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
 * The partitions @p worker owns, stalled or not (worker/lane_stall.h), up
 * to @p max into @p out. Any thread. @returns how many it owns.
 */
size_t kl__worker_stalls(kl_worker_t *worker, kl__stall_t *out, size_t max);

#endif
