/*
 * A publish request's body to a batch of events, all validated before the
 * first is produced: the envelope's rules, and what kl_publish() checks
 * beyond them (a delayed event's time, one record's size:
 * kl__gw_batch_publishable()), so that a request is published whole or
 * refused whole.
 *
 * A msgpack body means what kl__msgpack_body_to_json() makes of it, read by
 * the JSON body's rules (event/event_json.h: one set of event rules for
 * both); its bin values read as {"$base64": ...}, and a bin "payload" is
 * taken as the raw payload bytes. It is read without making that JSON
 * document, which took three fifths of the loop thread's time per event:
 * kl__msgpack_check() checks the whole body first, as the conversion
 * would (every length against the bytes left before allocating: a 5-byte
 * body cannot claim a 268M-entry map), then each event is read from the
 * bytes (kl__jevent_parse_mp()), a payload packed as its JSON value would
 * be. tests/fuzz/fuzz_gateway_body.c holds every input to the two ways:
 * the same events, or both refused.
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

/* A body that starts as JSON does ('{' and '[' are msgpack integers, so
 * it reads as one followed by trailing bytes) says so: the Content-Type
 * was wrong, not the events. */
static int bad_msgpack(kl__gw_bad_t *bad, kl_err_t err, const char *body,
                       size_t len) {
  if (err == KL_ENOMEM)
    return kl__gw_bad(bad, 503, -1, "out of memory reading the body");
  bool json = len > 0 && (body[0] == '{' || body[0] == '[');
  return kl__gw_bad(bad, 400, -1, "the body is not valid msgpack: %s%s",
                    kl_err_detail(),
                    json ? "; it starts as JSON does: send it with "
                           "Content-Type: application/json"
                         : "");
}

static int body_json(const char *body, size_t len, json_t **doc,
                     kl__gw_bad_t *bad) {
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

/* The body's shape: one event (@p n 1, @p one) or an array of @p n. */
static int body_count(bool one, bool array, size_t n, size_t max_events,
                      kl__gw_bad_t *bad) {
  if (!one && !array)
    return kl__gw_bad(bad, 400, -1,
                      "the body must be one event object or an "
                      "array of them");
  if (n == 0)
    return kl__gw_bad(bad, 400, -1, "the array holds no event");
  if (n > max_events)
    return kl__gw_bad(bad, 413, -1,
                      "the request has %zu events; the gateway "
                      "takes at most %zu at once (--max-inflight)",
                      n, max_events);
  return 0;
}

static int batch_alloc(kl__gw_batch_t *batch, size_t n, kl__gw_bad_t *bad) {
  kl__gw_arena_t *arena = batch->arena;
  batch->events = arena ? arena_take(arena, n * sizeof(kl__jevent_t))
                        : calloc(n, sizeof(kl__jevent_t));
  return batch->events
             ? 0
             : kl__gw_bad(bad, 503, -1, "out of memory for %zu events", n);
}

static int event_bad(kl__gw_bad_t *bad, kl_err_t e, size_t i, const char *err) {
  if (e == KL_ENOMEM)
    return kl__gw_bad(bad, 503, (long)i, "out of memory reading event %zu", i);
  return kl__gw_bad(bad, 400, (long)i, "event %zu: %s", i, err);
}

static int batch_json(kl__gw_batch_t *batch, const char *body, size_t len,
                      size_t max_events, kl__gw_bad_t *bad) {
  int status = body_json(body, len, &batch->doc, bad);
  if (status)
    return status;
  json_t *doc = batch->doc;
  bool one = json_is_object(doc);
  size_t n = one ? 1 : json_array_size(doc);
  status = body_count(one, json_is_array(doc), n, max_events, bad);
  status = status ? status : batch_alloc(batch, n, bad);
  kl__gw_arena_t *arena = batch->arena;
  for (size_t i = 0; i < n && !status; i++) {
    char err[400];
    json_t *root = one ? doc : json_array_get(doc, i);
    kl_err_t e = kl__jevent_parse_in(&batch->events[i], root,
                                     arena ? kl__gw_arena_alloc : NULL, arena,
                                     err, sizeof(err));
    if (e)
      return event_bad(bad, e, i, err);
    batch->n = i + 1;
  }
  return status;
}

static int batch_msgpack(kl__gw_batch_t *batch, const char *body, size_t len,
                         size_t max_events, kl__gw_bad_t *bad) {
  if (!batch->arena)
    batch->arena = &batch->own;
  kl__gw_arena_t *arena = batch->arena;
  kl_err_t e = kl__msgpack_check(body, len, kl__gw_arena_alloc, arena);
  if (e)
    return bad_msgpack(bad, e, body, len);
  kl__mp_reader_t rd = kl__mp_reader(body, len), head = rd;
  kl__mp_item_t it;
  uint64_t need;
  kl__mp_next(&head, &it, &need);
  bool one = it.kind == KL__MP_MAP;
  size_t n = one ? 1 : (size_t)it.n;
  int status = body_count(one, it.kind == KL__MP_ARRAY, n, max_events, bad);
  status = status ? status : batch_alloc(batch, n, bad);
  if (!one)
    rd = head; /* at the array's first event */
  for (size_t i = 0; i < n && !status; i++) {
    char err[400];
    e = kl__jevent_parse_mp(&batch->events[i], &rd, kl__gw_arena_alloc, arena,
                            err, sizeof(err));
    if (e)
      return event_bad(bad, e, i, err);
    batch->n = i + 1;
  }
  return status;
}

int kl__gw_batch_decode(kl__gw_batch_t *batch, const char *ctype,
                        const char *body, size_t len, size_t max_events,
                        kl__gw_bad_t *bad) {
  memset(batch, 0, sizeof(*batch));
  batch->arena = kl_gw_current;
  int msgpack = kl__gw_ctype_msgpack(ctype);
  int status = msgpack < 0
                   ? kl__gw_bad(bad, 415, -1,
                                "Content-Type \"%.64s\" is neither "
                                "application/json nor application/msgpack",
                                ctype)
               : msgpack ? batch_msgpack(batch, body, len, max_events, bad)
                         : batch_json(batch, body, len, max_events, bad);
  if (status)
    kl__gw_batch_free(batch);
  return status;
}

int kl__gw_batch_publishable(kl__gw_batch_t *batch,
                             const kl_producer_t *producer, kl__gw_bad_t *bad) {
  batch->stored = 0;
  for (size_t i = 0; i < batch->n; i++) {
    const kl_event_t *ev = &batch->events[i].ev;
    size_t size;
    if (kl__producer_event_check(producer, ev, &size))
      return kl__gw_bad(bad, 400, (long)i,
                        "event %zu: %s; no event of the request was "
                        "published",
                        i, kl_err_detail());
    batch->stored += ev->key_len + size;
  }
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
  kl__gw_arena_destroy(&batch->own);
  memset(batch, 0, sizeof(*batch));
}
