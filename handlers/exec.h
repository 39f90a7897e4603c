/*
 * The exec handler (`--handler exec:COMMAND`): events handled by long-lived
 * child processes in any language, like git's long-running filter
 * processes.
 *
 * Protocol, one JSON object per line:
 *   keylane -> child stdin:  {"seq","topic","key","id","type","ts",
 *                             "partition","offset","epoch","payload"}
 *                            ("payload" is the msgpack payload as JSON; a
 *                             payload that is not msgpack JSON can say goes
 *                             as "payload_b64"; a key that is not UTF-8 goes
 *                             as "key_b64")
 *   child stdout -> keylane: {"seq":N,"status":"ok"|"retry"|"fail",
 *                             "error":"...", "emit":[...], "cancel":[...]}
 * "emit" (with "ok" only) lists follow-up events, each
 * {"topic"?, "key", "type", "payload"? | "payload_b64"?}: "key" and "type"
 * non-empty strings; "payload" any JSON, sent as its msgpack, or
 * "payload_b64" the raw payload bytes in base64, not both (neither: an
 * empty payload); "topic" defaults to the event's own, and must be a valid
 * Kafka name that is neither internal ("__*") nor a dead-letter topic
 * ("*.dlq", worker.dlq.topic). "id" is refused: a follow-up's id is
 * derived from its source event's place in the log
 * ("~<topic>/<partition>/<offset>/<index>"), so it cannot collide with a
 * client's; "headers" are refused (not supported yet), and so is
 * any other field. They are kl_txn_emit()ted into the event's txn, so they
 * are committed with its effects and published after the commit
 * (store.h). An "emit" with a refused entry fails the event with the
 * reason (a dead letter); nothing of it is emitted.
 * "cancel" (with "ok" only) lists pending timers of the event's own key to
 * cancel (kl_txn_cancel()), each {"id", "key"?}: "id" the delayed event's
 * id, "key" when given the event's key; a timer that no longer waits is
 * no error. A refused entry fails the event (exec_line.h).
 * "seq" is a number keylane gives each request to one child (1 to 2^63-1);
 * the answer echoes it, which ties the answer to its event. A child that echoes
 * "seq" may get up to `window` events before it answers the first (pipelining),
 * and may answer them in any order. A child that answers without "seq" is
 * run one event at a time (old handlers keep working), and must then never
 * print a line nobody asked for; once a child has echoed "seq" every one of
 * its answers must. (partition, epoch, offset) is the fence: a handler
 * passes it to its own database, which refuses writes whose epoch is
 * older than the one it stored AND applies each event id once (kl_fence_t
 * says why both).
 *
 * Failures: a child that exits, closes its stdout, answers a line that is
 * not such an object (a key given twice is no answer either: JSON's
 * last-wins would guess which one the child meant), a "seq" no event in
 * flight has, a line while no event
 * is in flight, a line over KL_EXEC_LINE_MAX bytes, or does not answer
 * within the timeout (default 30 s) is killed (SIGKILL to its process
 * group) and started again for the next event; every event in flight to it
 * returns KL_HANDLER_RETRY, so its batch's writes are not committed and
 * keylane never applies it twice. The child may have acted on it, and a
 * write it sent may land after the retry's, with the same fence: the
 * resource's unique event id is what applies it once. RETRY counts against
 * worker.max.attempts like any other. The child's stderr goes to the worker's
 * log, one line per line, prefixed "exec[PID]:". Children never outlive
 * the worker (exec_spawn.h): an aborted stop kills their process groups,
 * and the kernel kills a child whose worker ends otherwise.
 *
 * Caveats:
 * - Thread safe: the worker's executor threads call the handler at once;
 *   each call goes to the child with the fewest events in flight, at most
 *   `window` each (1 for a child that does not echo "seq").
 *   kl__exec_configure() gives a worker `children` x `window` executors.
 * - In flight together are only events of different keys (the worker never
 *   runs two events of one key at once), so a key's events reach the child
 *   in order; events of different keys may interleave out of offset order.
 * - SIGPIPE cannot hit the worker: the children's stdin are sockets written
 *   with MSG_NOSIGNAL.
 */
#ifndef KEYLANE_HANDLERS_EXEC_H
#define KEYLANE_HANDLERS_EXEC_H

#include <jansson.h>

#include <stdint.h>

#include "keylane/conf.h"
#include "keylane/worker.h"

/** The longest answer line accepted, newline included. */
#define KL_EXEC_LINE_MAX (1024 * 1024)
/** The default answer timeout. */
#define KL_EXEC_TIMEOUT_MS 30000

typedef struct kl__exec kl__exec_t;

/**
 * Creates the handler for @p command (run by /bin/sh -c, started lazily by
 * the first event): one child, one event in flight, until
 * kl__exec_set_children()/kl__exec_configure(). @p command is copied.
 * @param out  receives the handler, freed with kl__exec_destroy().
 * @returns KL_OK, KL_ECONF for an empty command, KL_ENOMEM.
 */
kl_err_t kl__exec_new(const char *command, kl__exec_t **out);

/**
 * Checks that /bin/sh can run @p command's program, so that a worker
 * refuses to start rather than dead-letter every event: a first word with
 * a '/' must be an executable file; another must be one the shell knows
 * (`command -v`: a program on PATH, a builtin, a reserved word such as
 * `while`). A first word the shell would expand first (quotes, '$', '=')
 * is left to it.
 * @returns KL_OK, or KL_ECONF with the reason and the fix in
 *          kl_err_detail().
 */
kl_err_t kl__exec_check_command(const char *command);

/** Sets the answer timeout (> 0), before the worker runs. */
void kl__exec_set_timeout_ms(kl__exec_t *exec, int timeout_ms);

/**
 * Sets the number of children (>= 1) and the events in flight to each at
 * most (>= 1), before the first event.
 * @returns KL_OK or KL_ENOMEM.
 */
kl_err_t kl__exec_set_children(kl__exec_t *exec, int children, int window);

/**
 * Sizes @p exec for a worker run with @p conf: worker.concurrency children,
 * worker.exec.window events in flight to each; and raises @p conf's
 * worker.concurrency to children x window (at most 1024) executor threads,
 * since each executor waits on the one event it sent. Call before
 * kl_worker_new().
 * @returns KL_OK, or an error kl_err_detail() explains.
 */
kl_err_t kl__exec_configure(kl__exec_t *exec, kl_conf_t *conf);

/** Times a child was started (a restart counts one more). */
unsigned kl__exec_starts(kl__exec_t *exec);

/** Kills the children, if any, and frees @p exec; accepts NULL. */
void kl__exec_destroy(kl__exec_t *exec);

/** The kl_handler_fn_t; @p opaque is the kl__exec_t. Thread safe. */
kl_handler_result_t kl__exec_handler(void *opaque, const kl_event_t *event,
                                     const kl_fence_t *fence, kl_txn_t *txn,
                                     char *errbuf, size_t errbuf_size);

/** One answer line, read. */
typedef struct kl__exec_answer {
  kl_handler_result_t result;
  int has_seq; /* the line echoed "seq" */
  uint64_t seq;
  char error[512]; /* "exec handler: ..." for retry and fail, else "" */
  json_t *emit;    /* "ok": its "emit" array (a reference), or NULL */
  json_t *cancel;  /* "ok": its "cancel" array (a reference), or NULL */
} kl__exec_answer_t;

/**
 * Reads the answer line @p line of @p len bytes (no newline). The caller
 * json_decref()s @p answer->emit and @p answer->cancel.
 * @returns 0, or -1 when it is not an answer (not a JSON object, a key
 *          given twice, no valid "status", a "seq" that is not a whole
 *          number from 1 to 2^63-1); then @p answer->error says why.
 */
int kl__exec_answer_parse(const char *line, size_t len,
                          kl__exec_answer_t *answer);

#endif
