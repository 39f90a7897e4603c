/*
 * Follow-up events as the outbox keeps them: a batch's emits (kl_txn_emit())
 * buffered in its txn, then one store record each, encoded the same way in
 * the buffer, in LMDB and in PostgreSQL:
 *
 *   u8 topic_len, u16 key_len, u8 id_len, u8 type_len (big-endian),
 *   i64 ts (big-endian), u32 payload_len (big-endian),
 *   then topic, key, id, type, payload;
 *   then, when the source event had a W3C trace context: u8 traceparent_len,
 *   u16 tracestate_len (big-endian), traceparent, tracestate;
 *   then, when the follow-up has a not_before (kl_txn_emit_opts()): that
 *   trace section, or an empty one (u8 0, u16 0) when the source had none,
 *   and i64 not_before (big-endian, > 0).
 *
 * An empty topic stands for the source event's topic. The format grows at
 * its end, so a record written by an older keylane (no not_before: its
 * length ends at the body or at its trace context) reads as it was
 * written; an older keylane refuses a record with a not_before (an empty
 * trace section, or bytes past it) as damaged rather than publish the
 * follow-up without its time. Not installed.
 */
#ifndef KEYLANE_STORE_OUTBOX_REC_H
#define KEYLANE_STORE_OUTBOX_REC_H

#include <stddef.h>
#include <stdint.h>

#include "event/emit_id.h"
#include "keylane/error.h"
#include "keylane/event.h"

#define KL__OUTBOX_REC_HEAD 17

/** A batch's emits in commit order: records, each behind a u32 length. */
typedef struct kl__emits {
  unsigned char *bytes;
  size_t len, cap;
  size_t count;
} kl__emits_t;

/** A decoded record; borrows from the bytes it was decoded from. */
typedef struct kl__outbox_rec {
  const char *topic; /* "" (topic_len 0): the source's topic */
  size_t topic_len;
  kl_event_t event;     /* key, id, type, ts, payload, not_before;
                           headers: trace only */
  kl_header_t trace[2]; /* traceparent, then tracestate: event.headers */
} kl__outbox_rec_t;

/** Appends @p rec. @returns KL_OK or KL_ENOMEM (then unchanged). */
kl_err_t kl__emits_add(kl__emits_t *emits, const kl__outbox_rec_t *rec);

/** Appends every record of @p from (unchanged) to @p to. */
kl_err_t kl__emits_join(kl__emits_t *to, const kl__emits_t *from);

/**
 * Walks the records: start with *off = 0; @returns 1 with the next record's
 * bytes in @p rec / @p len (borrowed), 0 at the end.
 */
int kl__emits_next(const kl__emits_t *emits, size_t *off, const void **rec,
                   size_t *len);

/** Empties @p emits, keeping its memory. */
void kl__emits_reset(kl__emits_t *emits);

/** Frees @p emits and what it holds; accepts NULL. */
void kl__emits_free(kl__emits_t *emits);

/** @returns 0 with @p out filled (borrowing @p rec), or -1 when the bytes
 *  are not one record. */
int kl__outbox_rec_decode(const void *rec, size_t len, kl__outbox_rec_t *out);

#endif
