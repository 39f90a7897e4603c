/*
 * The observers' store reads on a thread of their own (store_read.h says
 * why). One mutex guards the state; the thread sleeps on `ask` until a
 * caller starts a read, and a read's end wakes every caller on `done`.
 */
#include "worker/store_read.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

struct kl__store_read {
  kl_store_t *store;
  char *topic;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t ask, done;
  int stop;
  int cached;       /* kl__store_read_cached() */
  int64_t since_ns; /* the read under way began; 0: none */
  int64_t done_ns;  /* the last read ended */
  uint64_t reads;   /* reads ended */
  /* The last read's outcome. */
  kl_err_t err;
  char detail[1024];
  kl__store_part_t *parts; /* KL__STORE_READ_PARTS_MAX */
  size_t nparts;
  /* The thread's own, filled while it reads, then swapped with parts. */
  kl__store_part_t *next;
  size_t nnext;
};

static int read_part(void *opaque, const char *topic, int32_t partition,
                     const kl_partition_state_t *state) {
  kl__store_read_t *reader = opaque;
  if (strcmp(topic, reader->topic) == 0 &&
      reader->nnext < KL__STORE_READ_PARTS_MAX)
    reader->next[reader->nnext++] = (kl__store_part_t){partition, *state};
  return 0;
}

static void *read_main(void *opaque) {
  kl__store_read_t *reader = opaque;
  pthread_mutex_lock(&reader->mu);
  for (;;) {
    while (!reader->stop && !reader->since_ns)
      pthread_cond_wait(&reader->ask, &reader->mu);
    if (reader->stop)
      break;
    pthread_mutex_unlock(&reader->mu);
    reader->nnext = 0;
    kl_err_t err = kl_store_foreach_partition(reader->store, read_part, reader);
    pthread_mutex_lock(&reader->mu);
    kl__store_part_t *parts = reader->parts;
    reader->parts = reader->next;
    reader->nparts = reader->nnext;
    reader->next = parts;
    reader->err = err;
    snprintf(reader->detail, sizeof(reader->detail), "%s",
             err ? kl_err_detail() : "");
    reader->since_ns = 0;
    reader->done_ns = kl__mono_ns();
    reader->reads++;
    pthread_cond_broadcast(&reader->done);
  }
  pthread_mutex_unlock(&reader->mu);
  return NULL;
}

static void read_free(kl__store_read_t *reader) {
  pthread_cond_destroy(&reader->ask);
  pthread_cond_destroy(&reader->done);
  pthread_mutex_destroy(&reader->mu);
  free(reader->parts);
  free(reader->next);
  free(reader->topic);
  free(reader);
}

kl_err_t kl__store_read_new(kl_store_t *store, const char *topic,
                            kl__store_read_t **out) {
  kl__store_read_t *reader = calloc(1, sizeof(*reader));
  if (!reader)
    return kl__err(KL_ENOMEM, "out of memory");
  reader->store = store;
  reader->topic = strdup(topic);
  reader->parts = malloc(KL__STORE_READ_PARTS_MAX * sizeof(*reader->parts));
  reader->next = malloc(KL__STORE_READ_PARTS_MAX * sizeof(*reader->next));
  pthread_mutex_init(&reader->mu, NULL);
  pthread_cond_init(&reader->ask, NULL);
  kl__mono_cond_init(&reader->done);
  if (!reader->topic || !reader->parts || !reader->next) {
    read_free(reader);
    return kl__err(KL_ENOMEM, "out of memory");
  }
  if (pthread_create(&reader->thread, NULL, read_main, reader) != 0) {
    read_free(reader);
    return kl__err(KL_EIO, "cannot start the store reader's thread");
  }
  *out = reader;
  return KL_OK;
}

void kl__store_read_destroy(kl__store_read_t *reader) {
  if (!reader)
    return;
  pthread_mutex_lock(&reader->mu);
  reader->stop = 1;
  pthread_cond_signal(&reader->ask);
  pthread_mutex_unlock(&reader->mu);
  pthread_join(reader->thread, NULL);
  read_free(reader);
}

void kl__store_read_cached(kl__store_read_t *reader) {
  pthread_mutex_lock(&reader->mu);
  reader->cached = 1;
  pthread_mutex_unlock(&reader->mu);
}

/* Starts a read unless one is under way; mu held. */
static void read_start(kl__store_read_t *reader, int64_t now) {
  if (reader->since_ns)
    return;
  reader->since_ns = now;
  pthread_cond_signal(&reader->ask);
}

kl_err_t kl__store_read(kl__store_read_t *reader, kl__store_part_t *out,
                        size_t cap, size_t *n) {
  *n = 0;
  pthread_mutex_lock(&reader->mu);
  int64_t now = kl__mono_ns();
  int64_t bound = KL__STORE_READ_WAIT_MS * 1000000LL;
  uint64_t want = reader->reads + 1; /* the one under way ends it */
  if (reader->cached && reader->reads) {
    /* The last read's outcome, unless the one under way is too old. */
    if (now - reader->done_ns >= KL__STORE_READ_FRESH_MS * 1000000LL)
      read_start(reader, now);
    if (!reader->since_ns || now - reader->since_ns < bound)
      want = reader->reads;
  } else {
    read_start(reader, now);
  }
  while (reader->reads < want &&
         kl__mono_cond_wait(&reader->done, &reader->mu,
                            reader->since_ns + bound) != ETIMEDOUT)
    ;
  if (reader->reads < want) {
    int64_t age = (kl__mono_ns() - reader->since_ns) / 1000000;
    pthread_mutex_unlock(&reader->mu);
    return kl__err(KL_ETIMEOUT,
                   "the store has not answered a read for %" PRId64
                   " ms (a read is waited for %d ms): its server is stopped "
                   "or overloaded, or the network to it drops packets; the "
                   "worker's commits wait for it too",
                   age, KL__STORE_READ_WAIT_MS);
  }
  kl_err_t err = reader->err;
  if (err) {
    char detail[sizeof(reader->detail)];
    memcpy(detail, reader->detail, sizeof(detail));
    pthread_mutex_unlock(&reader->mu);
    return kl__err(err, "%s", detail);
  }
  *n = reader->nparts < cap ? reader->nparts : cap;
  if (*n)
    memcpy(out, reader->parts, *n * sizeof(*out));
  pthread_mutex_unlock(&reader->mu);
  return KL_OK;
}

int64_t kl__store_read_age_ms(kl__store_read_t *reader) {
  pthread_mutex_lock(&reader->mu);
  int64_t since = reader->since_ns;
  pthread_mutex_unlock(&reader->mu);
  return since ? (kl__mono_ns() - since) / 1000000 : 0;
}
