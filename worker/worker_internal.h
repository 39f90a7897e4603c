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
 * Called on the poll thread before a retake moves the consumer back to the
 * watermark of @p partition: a nonzero librdkafka error makes that seek
 * fail as if librdkafka had returned it. Tests use it to see what a failed
 * retake costs.
 */
typedef int(kl__worker_seek_hook_fn)(void *opaque, int32_t partition);

void kl__worker_set_seek_hook(kl_worker_t *worker, kl__worker_seek_hook_fn *fn,
                              void *opaque);

#endif
