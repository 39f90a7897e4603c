/*
 * A follow-up's id (kl_txn_emit()): the one kind of id beginning with
 * KL_ID_RESERVED ('~'), made by the store's emit and recognised by the
 * producer, the worker (event/envelope.c, kl__id_check()), the outbox
 * and the tools that read the log. Not installed.
 *
 * It names the event that emitted it, by its place in the log, and a
 * nonce: "~<topic>/<partition>/<offset>/<index>/<nonce>", the source
 * event's topic, partition and offset, the emit's index in that event's
 * run (0, 1, ...) and 16 lowercase hex digits of a random 64-bit number
 * drawn for that run. The place alone is not unique: after a recreated
 * topic and `keylane store reset` offsets repeat, and a new follow-up
 * would take an old one's id and be suppressed as its duplicate; nor is
 * it secret: a producer that writes records itself could write a future
 * follow-up's id first. The nonce makes the id neither repeatable nor
 * predictable (docs/design.md, "Follow-ups").
 *
 * Stores written before the nonce hold follow-ups of the first form,
 * "~<topic>/<partition>/<offset>/<index>": they are still parsed (and
 * published), has_nonce 0.
 *
 * Thread safety: pure.
 */
#ifndef KEYLANE_EVENT_EMIT_ID_H
#define KEYLANE_EVENT_EMIT_ID_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/event.h"

/** Follow-ups one event may emit (kl_txn_emit() refuses more). */
#define KL__EMIT_MAX 64

/** The longest source topic name whose follow-ups' ids fit in KL_ID_MAX
 *  whatever the partition, offset and index: "~" and "/" * 4, 10 + 19 + 2
 *  digits and the 16 of the nonce take 52 bytes. */
#define KL__EMIT_TOPIC_MAX (KL_ID_MAX - 52)
/** The same for ids of the first form, without the nonce (17 bytes). */
#define KL__EMIT_TOPIC_MAX_V1 (KL_ID_MAX - 35)

/** The place and nonce a follow-up's id names. */
typedef struct kl__emit_src {
  const char *topic; /* borrowed; not NUL-terminated by kl__emit_id_parse() */
  size_t topic_len;
  int32_t partition;
  int64_t offset;
  unsigned index;
  uint64_t nonce;
  int has_nonce; /* 0: an id of the first form, written before the nonce */
} kl__emit_src_t;

/** Writes the id of @p src into @p out, of the first form when
 *  !src->has_nonce (tests write such ids as older stores hold them).
 *  @returns its length; 0 when the topic is empty or longer than
 *  KL__EMIT_TOPIC_MAX (KL__EMIT_TOPIC_MAX_V1 without a nonce). */
size_t kl__emit_id(const kl__emit_src_t *src, char out[KL_ID_MAX + 1]);

/** The inverse of kl__emit_id(): 0 with @p src set (its topic borrowed
 *  from @p id), or -1 when @p id is no follow-up's id of either form. */
int kl__emit_id_parse(const char *id, size_t id_len, kl__emit_src_t *src);

#endif
