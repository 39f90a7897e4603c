/*
 * A publish request's body to a batch of events, all validated before the
 * first is produced: the envelope's rules, and what kl_publish() checks
 * beyond them (a delayed event's time, one record's size:
 * kl__gw_batch_publishable()), so that a request is published whole or
 * refused whole.
 *
 * A msgpack body is read by kl__msgpack_to_json(), which checks every
 * length against the bytes left before allocating (a 5-byte body cannot
 * claim a 268M-entry map), and then takes the JSON path: one set of event
 * rules for both. Its bin values read as {"$base64": ...}; a bin "payload"
 * is taken as the raw payload bytes.
 *
 * The arena: jansson allocates every value of a document on its own (about
 * 20 to 30 mallocs for an event of a few fields, and as many frees), which
 * was a fifth of the loop thread's time. jansson takes one allocator for
 * the process (json_set_alloc_funcs()), so the gateway installs one that
 * asks which request the calling thread is decoding: inside
 * kl__gw_arena_begin() .. kl__gw_arena_end() (the loop thread, from a
 * body's decoding to its events being handed to the producer, which copies
 * them) it bump-allocates from the gateway's arena and frees nothing, the
 * whole arena being rewound at the end; anywhere else (other threads, other
 * documents) it calls the allocator installed before it, as does a free of
 * memory that is not the arena's. A value must not outlive its arena's
 * scope: the batch's document is let go of before kl__gw_arena_end(), and
 * nothing else holds one.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broker/gateway_internal.h"
#include "broker/producer_internal.h"
#include "common/json_msgpack.h"

/* ---- the arena ---- */

/* A chunk's usable size when a request needs no more: a 100-event request
 * of a few fields takes about 150 KiB of jansson's values. */
#define KL_GW_CHUNK ((size_t)512 * 1024)
#define KL_GW_ALIGN ((size_t)16)

struct kl__gw_chunk {
  struct kl__gw_chunk *next;
  size_t size; /**< of data */
  _Alignas(16) char data[];
};

static _Thread_local kl__gw_arena_t *kl_gw_current;
static json_malloc_t kl_gw_prev_malloc;
static json_free_t kl_gw_prev_free;
static pthread_once_t kl_gw_once = PTHREAD_ONCE_INIT;

static void *arena_take(kl__gw_arena_t *a, size_t size) {
  if (size > SIZE_MAX - KL_GW_CHUNK)
    return NULL;
  /* Never 0: each allocation is its own address, as malloc's are. */
  size = size ? (size + KL_GW_ALIGN - 1) & ~(KL_GW_ALIGN - 1) : KL_GW_ALIGN;
  if (size > (size_t)(a->end - a->p)) {
    size_t want = size > KL_GW_CHUNK ? size : KL_GW_CHUNK;
    struct kl__gw_chunk *c = malloc(sizeof(*c) + want);
    if (!c)
      return NULL;
    c->next = a->chunks;
    c->size = want;
    a->chunks = c;
    a->p = c->data;
    a->end = c->data + want;
  }
  void *p = a->p;
  a->p += size;
  return p;
}

void *kl__gw_arena_alloc(void *ctx, size_t size) {
  return arena_take(ctx, size);
}

static bool arena_holds(const kl__gw_arena_t *a, const void *p) {
  for (const struct kl__gw_chunk *c = a->chunks; c; c = c->next)
    if ((const char *)p >= c->data && (const char *)p < c->data + c->size)
      return true;
  return false;
}

static void *jansson_malloc(size_t size) {
  kl__gw_arena_t *a = kl_gw_current;
  return a ? arena_take(a, size) : kl_gw_prev_malloc(size);
}

static void jansson_free(void *p) {
  kl__gw_arena_t *a = kl_gw_current;
  if (p && !(a && arena_holds(a, p)))
    kl_gw_prev_free(p);
}

static void arena_hook(void) {
  json_get_alloc_funcs(&kl_gw_prev_malloc, &kl_gw_prev_free);
  json_set_alloc_funcs(jansson_malloc, jansson_free);
}

void kl__gw_arena_begin(kl__gw_arena_t *arena) {
  /* Installed by the first use: a document read in an arena that jansson
   * did not allocate from would never be freed. */
  pthread_once(&kl_gw_once, arena_hook);
  if (arena->depth++ == 0)
    kl_gw_current = arena;
}

/* Frees every chunk but the oldest when it is of the usual size: the next
 * request starts in it, and one large value holds no memory for long. */
static void arena_trim(kl__gw_arena_t *a, bool all) {
  while (a->chunks &&
         (all || a->chunks->next || a->chunks->size != KL_GW_CHUNK)) {
    struct kl__gw_chunk *c = a->chunks;
    a->chunks = c->next;
    free(c);
  }
  a->p = a->chunks ? a->chunks->data : NULL;
  a->end = a->chunks ? a->chunks->data + a->chunks->size : NULL;
}

void kl__gw_arena_end(kl__gw_arena_t *arena) {
  if (--arena->depth > 0)
    return;
  kl_gw_current = NULL;
  arena_trim(arena, false);
}

void kl__gw_arena_destroy(kl__gw_arena_t *arena) {
  arena_trim(arena, true);
}

/* ---- the body ---- */

int kl__gw_bad(kl__gw_bad_t *bad, int status, long index, const char *fmt,
               ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bad->msg, sizeof(bad->msg), fmt, ap);
  va_end(ap);
  bad->status = status;
  bad->index = index;
  return status;
}

static int body_doc(const char *ctype, const char *body, size_t len,
                    json_t **doc, kl__gw_bad_t *bad) {
  int msgpack = kl__gw_ctype_msgpack(ctype);
  if (msgpack < 0)
    return kl__gw_bad(bad, 415, -1,
                      "Content-Type \"%.64s\" is neither "
                      "application/json nor application/msgpack",
                      ctype);
  if (msgpack) {
    kl_err_t err = kl__msgpack_to_json(body, len, doc);
    if (err == KL_ENOMEM)
      return kl__gw_bad(bad, 503, -1, "out of memory reading the body");
    return err ? kl__gw_bad(bad, 400, -1, "the body is not valid msgpack: %s",
                            kl_err_detail())
               : 0;
  }
  json_error_t jerr;
  /* NUL is let through to kl__jevent_parse(), which refuses it in the
   * fields where msgpack bodies can hold it too: one rule for both. */
  *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!*doc)
    return kl__gw_bad(bad, 400, -1,
                      "the body is not valid JSON: %s (line %d, "
                      "column %d)",
                      jerr.text, jerr.line, jerr.column);
  return 0;
}

static int batch_events(kl__gw_batch_t *batch, bool raw_bin, size_t max_events,
                        kl__gw_bad_t *bad) {
  json_t *doc = batch->doc;
  bool one = json_is_object(doc);
  if (!one && !json_is_array(doc))
    return kl__gw_bad(bad, 400, -1,
                      "the body must be one event object or an "
                      "array of them");
  size_t n = one ? 1 : json_array_size(doc);
  if (n == 0)
    return kl__gw_bad(bad, 400, -1, "the array holds no event");
  if (n > max_events)
    return kl__gw_bad(bad, 413, -1,
                      "the request has %zu events; the gateway "
                      "takes at most %zu at once (--max-inflight)",
                      n, max_events);
  kl__gw_arena_t *arena = batch->arena;
  batch->events = arena ? arena_take(arena, n * sizeof(kl__jevent_t))
                        : calloc(n, sizeof(kl__jevent_t));
  if (!batch->events)
    return kl__gw_bad(bad, 503, -1, "out of memory for %zu events", n);
  for (size_t i = 0; i < n; i++) {
    char err[400];
    json_t *root = one ? doc : json_array_get(doc, i);
    kl_err_t e = kl__jevent_parse_in(&batch->events[i], root, raw_bin,
                                     arena ? kl__gw_arena_alloc : NULL, arena,
                                     err, sizeof(err));
    if (e == KL_ENOMEM)
      return kl__gw_bad(bad, 503, (long)i, "out of memory reading event %zu",
                        i);
    if (e)
      return kl__gw_bad(bad, 400, (long)i, "event %zu: %s", i, err);
    batch->n = i + 1;
  }
  return 0;
}

int kl__gw_batch_decode(kl__gw_batch_t *batch, const char *ctype,
                        const char *body, size_t len, size_t max_events,
                        kl__gw_bad_t *bad) {
  memset(batch, 0, sizeof(*batch));
  batch->arena = kl_gw_current;
  int status = body_doc(ctype, body, len, &batch->doc, bad);
  if (!status)
    status =
        batch_events(batch, kl__gw_ctype_msgpack(ctype) == 1, max_events, bad);
  if (status)
    kl__gw_batch_free(batch);
  return status;
}

int kl__gw_batch_publishable(const kl__gw_batch_t *batch,
                             const kl_producer_t *producer, kl__gw_bad_t *bad) {
  for (size_t i = 0; i < batch->n; i++)
    if (kl__producer_event_check(producer, &batch->events[i].ev, NULL))
      return kl__gw_bad(bad, 400, (long)i,
                        "event %zu: %s; no event of the request was "
                        "published",
                        i, kl_err_detail());
  return 0;
}

void kl__gw_batch_free(kl__gw_batch_t *batch) {
  for (size_t i = 0; i < batch->n; i++)
    kl__jevent_clear(&batch->events[i]);
  /* In an arena, the document's values go when it is rewound: walking
   * them to free each one would cost as much as their frees did. Nothing
   * else holds a reference to them. */
  if (!batch->arena) {
    free(batch->events);
    json_decref(batch->doc);
  }
  memset(batch, 0, sizeof(*batch));
}
