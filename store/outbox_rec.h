/*
 * Follow-up events as the outbox keeps them: a batch's emits (kl_txn_emit())
 * buffered in its txn, then one store record each, encoded the same way in
 * the buffer, in LMDB and in PostgreSQL:
 *
 *   u8 topic_len, u16 key_len, u8 id_len, u8 type_len (big-endian),
 *   i64 ts (big-endian), u32 payload_len (big-endian),
 *   then topic, key, id, type, payload;
 *   then, when the source event had a W3C trace context: u8 traceparent_len,
 *   u16 tracestate_len (big-endian), traceparent, tracestate.
 *
 * An empty topic stands for the source event's topic. Not installed.
 */
#ifndef KEYLANE_WORKER_OUTBOX_REC_H
#define KEYLANE_WORKER_OUTBOX_REC_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"
#include "keylane/event.h"

/** Follow-ups one event may emit (kl_txn_emit() refuses more). */
#define KL__EMIT_MAX 64
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
  kl_event_t event;     /* key, id, type, ts, payload; headers: trace only */
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

/*
 * A follow-up's id names the event that emitted it, by its place in the
 * log: "~<topic>/<partition>/<offset>/<index>", the source event's topic,
 * partition and offset and the emit's index in that event's run (0, 1,
 * ...). Two applied events never share a place, and clients may not
 * publish ids beginning with KL_ID_RESERVED ('~'), so a follow-up's id
 * can collide neither with another follow-up's nor with a client's. A
 * source topic's name may have at most KL__EMIT_TOPIC_MAX bytes, so that
 * the id fits in KL_ID_MAX whatever the partition and offset.
 */
#define KL__EMIT_TOPIC_MAX (KL_ID_MAX - 36)

/** The place a follow-up's id names. */
typedef struct kl__emit_src {
  const char *topic; /* borrowed; not NUL-terminated by kl__emit_id_parse() */
  size_t topic_len;
  int32_t partition;
  int64_t offset;
  unsigned index;
} kl__emit_src_t;

/** Writes the id of @p src into @p out. @returns its length; 0 when the
 *  topic is longer than KL__EMIT_TOPIC_MAX (or empty). */
size_t kl__emit_id(const kl__emit_src_t *src, char out[KL_ID_MAX + 1]);

/** The inverse of kl__emit_id(): 0 with @p src set (its topic borrowed
 *  from @p id), or -1 when @p id is no follow-up's id. */
int kl__emit_id_parse(const char *id, size_t id_len, kl__emit_src_t *src);

#endif
