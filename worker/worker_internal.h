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
 * @returns 1 while kl_worker_run() waits for Kafka to answer for the topic
 *          at start (worker.kafka.wait), with what it waits for in @p why;
 *          0 otherwise. Any thread (the metrics server's /healthz).
 */
int kl__worker_waiting(kl_worker_t *worker, char *why, size_t size);

#endif
