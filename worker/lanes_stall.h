/*
 * Stalled partitions: an owned lane that holds records but whose
 * watermark has not moved for worker.stall.ms (a letter Kafka keeps
 * refusing, a handler that keeps timing out, a store that keeps failing).
 * The worker's poll thread watches; /healthz and /metrics read
 * (cli/metrics_server.h).
 */
#ifndef KEYLANE_WORKER_LANES_STALL_H
#define KEYLANE_WORKER_LANES_STALL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kl__lanes kl__lanes_t; /* worker/lanes.h */

/** One owned partition: stalled (1) or not (0), and since when (ms). */
typedef struct kl__stall {
  int32_t partition;
  int stalled;
  int64_t for_ms; /* how long its watermark has not moved with records */
  size_t records; /* held in its window */
  int64_t watermark;
  int64_t oldest_ts_ms;   /* envelope ts of its oldest unapplied record in the
                             window; 0: none held, or none with a ts */
  size_t waiting;         /* records in retry backoff */
  int64_t committed;      /* the offset last sent to the group's offsets */
  size_t running;         /* events its handlers run now */
  size_t outbox;          /* follow-ups unpublished (the last tick's count) */
  int64_t last_commit_ms; /* its last store commit; 0: none */
  uint64_t epoch;         /* the epoch this worker took it with */
} kl__stall_t;

/**
 * Notes each owned lane's watermark and marks it stalled once it has held
 * records for @p stall_ms (> 0) without the watermark moving. Poll thread.
 */
void kl__lanes_watch_stalls(kl__lanes_t *lanes, int64_t now_ns,
                            int64_t stall_ms);

/**
 * Fills @p out with up to @p max owned partitions. Any thread. Decodes the
 * envelope of each partition's oldest unapplied record for its ts. A
 * partition is stalled once kl__lanes_watch_stalls() said so, or when it
 * has held records unmoved for @p stall_ms since the watch last saw it
 * move: the watch runs on the poll thread, which a store that does not
 * answer can hold.
 * @returns how many there are (may exceed @p max).
 */
size_t kl__lanes_stalls(kl__lanes_t *lanes, int64_t stall_ms, kl__stall_t *out,
                        size_t max);

/**
 * Group commits that failed in a row (the store refused or failed them,
 * fenced ones aside), none committed since: while they mount, no commit
 * can succeed. Any thread.
 * @returns how many (0: the last one committed), with how long since the
 *          first of them in @p for_ms and the last one's error in @p why.
 */
uint64_t kl__lanes_commits_failing(kl__lanes_t *lanes, int64_t *for_ms,
                                   char *why, size_t size);

/**
 * Event runs that failed in the store in a row (its link, a statement of
 * its own, or a handler's SQL refused for the store's setup: a revoked
 * privilege), none applied since: while they mount, no event can apply.
 * Any thread. @returns as kl__lanes_commits_failing().
 */
uint64_t kl__lanes_store_failing(kl__lanes_t *lanes, int64_t *for_ms, char *why,
                                 size_t size);

#endif
