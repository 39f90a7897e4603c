/*
 * The exec handler (`--handler exec:COMMAND`): events handled by a
 * long-lived child process in any language, like git's long-running
 * filter processes.
 *
 * Protocol, one JSON object per line, strictly in turn:
 *   keylane -> child stdin:  {"topic","key","id","type","ts","partition",
 *                             "offset","epoch","payload"} ("payload" is the
 *                             msgpack payload as JSON; a payload that is
 *                             not msgpack JSON can say goes as "payload_b64";
 *                             a key that is not UTF-8 goes as "key_b64")
 *   child stdout -> keylane: {"status":"ok"|"retry"|"fail","error":"..."}
 * (partition, epoch, offset) is the fence: a handler passes it to its own
 * database, which refuses writes whose epoch is older than the one it
 * stored AND applies each event id once (kl_fence_t says why both).
 *
 * Failures: a child that exits, closes its stdout, answers a line that is
 * not such an object, answers a line over KL_EXEC_LINE_MAX bytes, or does
 * not answer within the timeout (default 30 s) is killed (SIGKILL to its
 * process group) and started again for the next event; the event in flight
 * returns KL_HANDLER_RETRY, so its batch's writes are not committed and
 * keylane never applies it twice. The child may have acted on it, and a
 * write it sent may land after the retry's, with the same fence: the
 * resource's unique event id is what applies it once. RETRY counts against worker.max.attempts like any
 * other. The child's stderr goes to the worker's log, one line per line,
 * prefixed "exec[PID]:".
 *
 * Caveats:
 * - One child per handler: calls from several executor threads
 *   (worker.concurrency > 1) are serialized by a mutex, so the child sees
 *   one event at a time and concurrency buys nothing for exec handlers.
 * - SIGPIPE cannot hit the worker: the child's stdin is a socket written
 *   with MSG_NOSIGNAL.
 */
#ifndef KEYLANE_WORKER_HANDLER_EXEC_H
#define KEYLANE_WORKER_HANDLER_EXEC_H

#include "keylane/worker.h"

/** The longest answer line accepted, newline included. */
#define KL_EXEC_LINE_MAX (1024 * 1024)
/** The default answer timeout. */
#define KL_EXEC_TIMEOUT_MS 30000

typedef struct kl__exec kl__exec_t;

/**
 * Creates the handler for @p command (run by /bin/sh -c, started lazily by
 * the first event). @p command is copied.
 * @param out  receives the handler, freed with kl__exec_destroy().
 * @returns KL_OK, KL_ECONF for an empty command, KL_ENOMEM.
 */
kl_err_t kl__exec_new(const char *command, kl__exec_t **out);

/** Sets the answer timeout (> 0), before the worker runs. */
void kl__exec_set_timeout_ms(kl__exec_t *exec, int timeout_ms);

/** Times the child was started (a restart counts one more). */
unsigned kl__exec_starts(kl__exec_t *exec);

/** Kills the child, if any, and frees @p exec; accepts NULL. */
void kl__exec_destroy(kl__exec_t *exec);

/** The kl_handler_fn_t; @p opaque is the kl__exec_t. Thread safe. */
kl_handler_result_t kl__exec_handler(void *opaque, const kl_event_t *event,
                                     const kl_fence_t *fence, kl_txn_t *txn,
                                     char *errbuf, size_t errbuf_size);

#endif
