/* A paused owner, the worker that fencing must stop: its batch is held
 * between its handlers and its commit until a newer owner has taken the
 * partition and committed. For the LMDB and PostgreSQL fencing tests. */
#ifndef KEYLANE_TESTS_SUPPORT_PAUSED_OWNER_H
#define KEYLANE_TESTS_SUPPORT_PAUSED_OWNER_H

#include <stdint.h>

#include "support/support.h"

typedef struct kl_t_pause {
  kl_store_t *store; /* where the newer owner's commit shows */
  int armed;         /* 1: hold the next batch (once) */
  int saw_new_owner; /* set by the hook when it saw one (30 s at most) */
  kl_worker_t *stop; /* stopped as the hook returns, if set */
} kl_t_pause_t;

/* The hook for kl__worker_set_before_commit(), with a kl_t_pause_t as
 * @p opaque. Runs on the worker's thread. */
void kl_t_pause_hook(void *opaque, const char *topic, int32_t partition,
                     uint64_t epoch);

/* Waits up to @p ms for @p tw to count a fenced batch; returns its
 * stats.fenced then. */
uint64_t kl_t_worker_fenced(kl_t_worker_t *tw, int ms);

#endif
