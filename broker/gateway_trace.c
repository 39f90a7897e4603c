/*
 * The request's W3C trace context into its events (gateway_internal.h):
 * a service that calls the gateway inside a span sends traceparent (and
 * tracestate) as HTTP headers, and every event of the request carries
 * them in its envelope headers, where the worker hands them to the
 * handler. An event that names its own traceparent in the body keeps it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/gateway_internal.h"
#include "event/trace.h"

/* @returns 0, or 400 naming the header that is not W3C trace context. */
static int trace_headers_check(const kl__http_parse_t *parse,
                               kl__gw_bad_t *bad) {
  if (parse->traceparent_bad ||
      !kl_traceparent_valid(parse->traceparent, parse->traceparent_len))
    return kl__gw_bad(
        bad, 400, -1,
        "the traceparent header \"%.*s\" is not one W3C traceparent: send "
        "\"00-<32 lower-case hex trace id>-<16 hex parent id>-<2 hex "
        "flags>\" once, or leave it out",
        (int)(parse->traceparent_len < 80 ? parse->traceparent_len : 80),
        parse->traceparent);
  if (parse->tracestate_long ||
      !kl_tracestate_valid(parse->tracestate, parse->tracestate_len))
    return kl__gw_bad(bad, 400, -1,
                      "the tracestate header is over %d characters or "
                      "holds one outside printable ASCII (W3C's limit); "
                      "shorten it or leave it out",
                      KL_TRACESTATE_MAX);
  return 0;
}

/* Appends the trace headers to @p je's; they borrow @p parse's buffers,
 * which live until the request's events are produced. The headers are
 * the arena's when the batch's events are, else the jevent's. */
static int trace_add(kl__jevent_t *je, kl__gw_arena_t *arena,
                     const kl__http_parse_t *parse, long index,
                     kl__gw_bad_t *bad) {
  size_t n = je->ev.header_count;
  kl_header_t *h = arena ? kl__gw_arena_alloc(arena, (n + 2) * sizeof(*h))
                         : realloc(je->headers, (n + 2) * sizeof(*h));
  if (!h)
    return kl__gw_bad(bad, 503, index,
                      "out of memory for event %ld's "
                      "headers",
                      index);
  if (arena && n)
    memcpy(h, je->ev.headers, n * sizeof(*h));
  if (!arena)
    je->headers = h;
  h[n++] = (kl_header_t){KL_TRACEPARENT, sizeof(KL_TRACEPARENT) - 1,
                         parse->traceparent, parse->traceparent_len};
  if (parse->tracestate_len)
    h[n++] = (kl_header_t){KL_TRACESTATE, sizeof(KL_TRACESTATE) - 1,
                           parse->tracestate, parse->tracestate_len};
  je->ev.headers = h;
  je->ev.header_count = n;
  if (kl_event_validate(&je->ev, 1) != KL_OK)
    return kl__gw_bad(bad, 400, index,
                      "event %ld with the request's "
                      "trace context: %s",
                      index, kl_err_detail());
  return 0;
}

int kl__gw_batch_trace(kl__gw_batch_t *batch, const kl__http_parse_t *parse,
                       kl__gw_bad_t *bad) {
  if (!parse->traceparent_len && !parse->traceparent_bad)
    return 0; /* a tracestate alone means nothing (W3C): not carried */
  int status = trace_headers_check(parse, bad);
  for (size_t i = 0; !status && i < batch->n; i++)
    if (!kl_event_header(&batch->events[i].ev, KL_TRACEPARENT))
      status = trace_add(&batch->events[i], batch->arena, parse, (long)i, bad);
  return status;
}
