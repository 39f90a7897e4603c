/*
 * The keys the lanes hold, for an operator (kl_worker_foreach_key(),
 * `GET /v1/keys` on the metrics listener): each key with events in a
 * window, what holds it, its next event's attempts and last error.
 *
 * A window's ring is in offset order and a key's head is its first
 * pending slot, so walking the rings in partition order meets each key
 * once, at its head, already in the order the pages use: a page is the
 * keys from a (partition, offset) place on, and needs no sort. The walk
 * holds the lanes' lock; it copies out at most a page and counts the
 * rest, so its cost is the windows' size (worker.window.max per owned
 * partition), which bounds it.
 */
#include "worker/lanes_keys.h"

#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "worker/lanes_internal.h"

static const char *slot_parked(const kl__lane_t *lane, const kl__slot_t *s) {
  if (lane->state == KL__LANE_FENCED)
    return "its partition has a newer owner (fenced): nothing more is "
           "applied here until the rebalance takes it away";
  if (s->state == KL__SLOT_DLQ_PENDING)
    return "its dead letter waits for Kafka's acknowledgement";
  if (s->store_wait)
    return "its last run failed in the store: it runs again after the "
           "partition's next commit";
  return NULL;
}

static kl_worker_key_state_t
slot_state(const kl__lane_t *lane, const kl__slot_t *s, const char **parked) {
  if ((*parked = slot_parked(lane, s)) != NULL)
    return KL_WORKER_KEY_PARKED;
  if (s->state == KL__SLOT_WAITING || s->last_failure_ms)
    return KL_WORKER_KEY_RETRYING;
  return KL_WORKER_KEY_WAITING;
}

static int slot_of_key(const kl__slot_t *s, const kl_worker_keys_query_t *q) {
  return !q->key || (s->key->len == q->key_len &&
                     memcmp(s->key->bytes, q->key, q->key_len) == 0);
}

static int from_place(const kl_worker_keys_query_t *q, int32_t partition,
                      int64_t offset) {
  return partition > q->from_partition ||
         (partition == q->from_partition && offset >= q->from_offset);
}

/* The copy of key @p s heads, into @p out; 0, or -1 out of memory. */
static int key_copy(const kl__lane_t *lane, const kl__slot_t *s,
                    kl_worker_key_state_t state, const char *parked,
                    int64_t now_ms, int64_t now_ns, kl_worker_key_t *out) {
  uint64_t pending = 0;
  for (const kl__slot_t *k = s; k; k = k->next)
    pending++;
  void *bytes = malloc(s->key->len ? s->key->len : 1);
  char *error = strdup(s->why ? s->why : "");
  if (!bytes || !error) {
    free(bytes);
    free(error);
    return -1;
  }
  memcpy(bytes, s->key->bytes, s->key->len);
  *out = (kl_worker_key_t){.size = sizeof(*out),
                           .partition = lane->partition,
                           .state = state,
                           .key = bytes,
                           .key_len = s->key->len,
                           .offset = s->offset,
                           .pending = pending,
                           .attempts = s->attempts,
                           .next_retry_ms =
                               s->state == KL__SLOT_WAITING
                                   ? now_ms + (s->due_ns - now_ns) / 1000000
                                   : 0,
                           .first_failure_ms = s->first_failure_ms,
                           .last_failure_ms = s->last_failure_ms,
                           .error = error,
                           .parked = parked ? parked : ""};
  return 0;
}

kl_err_t kl__lanes_keys(kl__lanes_t *lanes, const kl_worker_keys_query_t *q,
                        kl_worker_key_t *out, size_t *n, size_t *total) {
  size_t limit = q->limit ? q->limit : KL_WORKER_KEYS_MAX;
  unsigned states = q->states ? q->states : ~0u;
  int64_t now_ms = kl__now_ms(), now_ns = kl__mono_ns();
  kl_err_t err = KL_OK;
  *n = *total = 0;
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; p < lanes->count; p++) {
    const kl__lane_t *lane = lanes->lanes[p];
    if (!lane ||
        (lane->state != KL__LANE_OWNED && lane->state != KL__LANE_FENCED))
      continue;
    for (size_t i = 0; i < lane->ring_count; i++) {
      const kl__slot_t *s = kl__lane_at(lane, i);
      const char *parked;
      if (!s->key || s->key->head != s || !slot_of_key(s, q))
        continue;
      kl_worker_key_state_t state = slot_state(lane, s, &parked);
      if (!(state & states))
        continue;
      ++*total;
      if (*n == limit || !from_place(q, lane->partition, s->offset))
        continue;
      if (!err &&
          key_copy(lane, s, state, parked, now_ms, now_ns, &out[*n]) == 0)
        ++*n;
      else
        err = KL_ENOMEM;
    }
  }
  pthread_mutex_unlock(&lanes->mu);
  if (err) {
    kl__lanes_keys_free(out, *n);
    *n = 0;
    return kl__err(KL_ENOMEM, "kl_worker_foreach_key: out of memory");
  }
  return KL_OK;
}

void kl__lanes_keys_free(kl_worker_key_t *keys, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free((void *)keys[i].key);
    free((void *)keys[i].error);
  }
}
