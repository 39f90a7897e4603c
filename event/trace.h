/*
 * W3C trace context in an event's headers (keylane/event.h "Trace
 * context"): the checks kl_event_validate() runs, and what the gateway
 * and the worker's log need. Not installed.
 */
#ifndef KEYLANE_EVENT_TRACE_H
#define KEYLANE_EVENT_TRACE_H

#include <stddef.h>

#include "keylane/event.h"

/** A traceparent's length in version 00; later versions may be longer. */
#define KL__TRACEPARENT_LEN 55

/**
 * Checks @p event's traceparent and tracestate headers, if it has them.
 * @returns KL_OK, or KL_EDECODE_TYPE naming the header, its value and the
 *          format it must have.
 */
kl_err_t kl__trace_check(const kl_event_t *event);

/**
 * @returns @p event's traceparent header when it is valid, else NULL: what
 *          a worker hands on (an invalid one is ignored, as W3C says).
 */
const kl_header_t *kl__trace_parent(const kl_event_t *event);

#endif
