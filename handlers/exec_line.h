/* The exec handler's request and answer lines (handlers/exec.h). */
#ifndef KEYLANE_HANDLERS_EXEC_LINE_H
#define KEYLANE_HANDLERS_EXEC_LINE_H

#include <stddef.h>
#include <stdint.h>

#include "handlers/exec.h"

/** Bytes kept in front of a request for its {"seq":N, prefix. */
#define KL__EXEC_SEQ_ROOM 32

/**
 * The request line of @p event without its seq: malloc()ed, the JSON from
 * offset KL__EXEC_SEQ_ROOM on, without its opening "{", newline-terminated;
 * @p len receives its length from there. NULL when out of memory.
 */
char *kl__exec_request(const kl_event_t *event, const kl_fence_t *fence,
                       size_t *len);

/**
 * Writes {"seq":@p seq, just before offset KL__EXEC_SEQ_ROOM of @p line.
 * @returns its length: the line starts that many bytes before the offset.
 */
size_t kl__exec_request_seq(char *line, uint64_t seq);

/**
 * Emits (kl_txn_emit()) into @p txn each follow-up of an answer's "emit"
 * array @p emit, as exec.h says: {"topic"?, "key", "type",
 * "payload"? | "payload_b64"?}; "id", "headers" and any other field are
 * refused, and so is a topic that is not a valid Kafka name, is reserved
 * (common/topic.h) or is @p dlq_topic (NULL: none configured).
 * @returns KL_HANDLER_OK; KL_HANDLER_FAIL with the reason in @p errbuf for
 *          one that is not such an object or past the limits;
 *          KL_HANDLER_RETRY when out of memory.
 */
kl_handler_result_t kl__exec_emit(json_t *emit, const char *dlq_topic,
                                  kl_txn_t *txn, char *errbuf,
                                  size_t errbuf_size);

/** The timers one answer's "cancel" may name at most. */
#define KL__EXEC_CANCEL_MAX 64

/**
 * Cancels (kl_txn_cancel()) in @p txn each timer an answer's "cancel"
 * array @p cancel names, as exec.h says: {"id", "key"?}, "id" a string
 * of 1..KL_ID_MAX bytes, "key" when given @p event's key; any other
 * field is refused, and so are more than KL__EXEC_CANCEL_MAX entries. A
 * timer that no longer waits (it ran, was cancelled, or never was) is
 * no error.
 * @returns KL_HANDLER_OK; KL_HANDLER_FAIL with the reason in @p errbuf
 *          for an entry refused; KL_HANDLER_RETRY with the reason when
 *          the store fails.
 */
kl_handler_result_t kl__exec_cancel(json_t *cancel, const kl_event_t *event,
                                    kl_txn_t *txn, char *errbuf,
                                    size_t errbuf_size);

#endif
