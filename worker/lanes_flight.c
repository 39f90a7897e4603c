/*
 * The committer thread: commits the group commit in flight that the tick
 * built (lanes_commit.c), while the poll thread consumes and runs other
 * lanes' events. Inline mode only; started on the first flight.
 */
#include <pthread.h>
#include <stdlib.h>

#include "common/log.h"
#include "worker/lanes_internal.h"

#define KL_COMP "worker"

static void *committer_main(void *opaque) {
  kl__lanes_t *lanes = opaque;
  for (;;) {
    if (kl__lanes_flight_run(lanes))
      continue;
    pthread_mutex_lock(&lanes->mu);
    if (!lanes->committer_stop && !kl__lanes_flight_queued(lanes))
      pthread_cond_wait(&lanes->flight_cv, &lanes->mu);
    int stop = lanes->committer_stop;
    pthread_mutex_unlock(&lanes->mu);
    if (stop)
      return NULL;
  }
}

int kl__lanes_flight_start(kl__lanes_t *lanes) {
  if (lanes->committer_stop)
    return -1; /* stopped for good (kl__lanes_flight_stop()) */
  if (!lanes->committer_on) {
    if (pthread_create(&lanes->committer, NULL, committer_main, lanes)) {
      KL_LOG_W(KL_COMP, "no committer thread: the poll thread commits");
      lanes->committer_stop = 1; /* said once */
      return -1;
    }
    lanes->committer_on = 1;
    if (lanes->rk)
      lanes->consumer_q = rd_kafka_queue_get_consumer(lanes->rk);
  }
  pthread_cond_broadcast(&lanes->flight_cv);
  return 0;
}

void kl__lanes_flight_done(kl__lanes_t *lanes) {
  pthread_cond_broadcast(&lanes->flight_cv);
  /* The poll thread may wait for records: it returns to reap this. */
  if (lanes->consumer_q)
    rd_kafka_queue_yield(lanes->consumer_q);
}

void kl__lanes_flight_stop(kl__lanes_t *lanes) {
  pthread_mutex_lock(&lanes->mu);
  kl__lanes_settle(lanes);
  lanes->committer_stop = 1;
  pthread_cond_broadcast(&lanes->flight_cv);
  int on = lanes->committer_on;
  lanes->committer_on = 0;
  pthread_mutex_unlock(&lanes->mu);
  if (on)
    pthread_join(lanes->committer, NULL);
  if (lanes->consumer_q)
    rd_kafka_queue_destroy(lanes->consumer_q);
  lanes->consumer_q = NULL;
  kl__lanes_flight_free(lanes);
}
