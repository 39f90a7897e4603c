/*
 * The keys the lanes hold, copied out for kl_worker_foreach_key()
 * (worker/lanes_keys.c).
 */
#ifndef KEYLANE_WORKER_LANES_KEYS_H
#define KEYLANE_WORKER_LANES_KEYS_H

#include <stddef.h>

#include "keylane/worker.h"

typedef struct kl__lanes kl__lanes_t; /* worker/lanes.h */

/**
 * Copies the keys that match @p query, a page of them (query->limit, 0:
 * KL_WORKER_KEYS_MAX), into @p out, which holds that many, in the order
 * kl_worker_foreach_key() documents. Any thread.
 * @returns KL_OK with *@p n copied (free them with kl__lanes_keys_free())
 *          and *@p total matching in all; KL_ENOMEM with nothing copied.
 */
kl_err_t kl__lanes_keys(kl__lanes_t *lanes, const kl_worker_keys_query_t *query,
                        kl_worker_key_t *out, size_t *n, size_t *total);

/** Frees the copies kl__lanes_keys() made (not @p keys itself). */
void kl__lanes_keys_free(kl_worker_key_t *keys, size_t n);

#endif
