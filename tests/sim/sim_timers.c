/*
 * Cancels and delayed follow-ups (issue 36): the handler of the client's
 * two events that reach timers through a handler's own calls, run on the
 * path the worker runs (kl__apply_event() calls sim_owner.c's handler,
 * which calls these in the event's child txn):
 *
 * - a cancel: its payload is the id of a delayed event of its key, which
 *   it cancels with the real kl_txn_cancel(); what the call answered is
 *   kept until the commit that holds the run, where the model predicts it
 *   (sim_world.c, sim_view_cancel()): KL_OK when the timer waits there,
 *   else KL_ENOTFOUND; a cancel of another key's timer must be refused;
 * - a defer: it emits a credit to its `to` (its own key or another of its
 *   topic) with a time, through the real kl_txn_emit_opts(); the outbox
 *   publishes it, its key's owner keeps it as a timer, and the model holds
 *   it to the rules of any delayed event (the credit's time is the one
 *   the client chose, not the published record's).
 */
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "common/strbuf.h"
#include "handlers/ledger.h"
#include "sim/sim.h"

static kl_handler_result_t cancel_run(uint32_t e, const kl_event_t *event,
                                      kl_txn_t *txn, int *seen, char *errbuf,
                                      size_t errbuf_size) {
  const sim_key_t *other = &W->keys[W->events[e].to];
  const char *id = event->payload;
  /* Only the running event's key: another key's timer has another lane. */
  kl_err_t err =
      kl_txn_cancel(txn, other->name, other->name_len, id, event->payload_len);
  if (err != KL_EINVAL)
    sim_fail("cancel",
             "kl_txn_cancel() of key %s's timer from the handler of key %s "
             "answered %s, not KL_EINVAL",
             other->name, W->keys[W->events[e].key].name, kl_err_name(err));
  err = kl_txn_cancel(txn, event->key, event->key_len, id, event->payload_len);
  if (err && err != KL_ENOTFOUND) {
    snprintf(errbuf, errbuf_size, "sim: kl_txn_cancel: %s", kl_err_detail());
    return KL_HANDLER_RETRY;
  }
  *seen = (int)err;
  return KL_HANDLER_OK;
}

static kl_handler_result_t defer_run(uint32_t e, const kl_event_t *event,
                                     kl_txn_t *txn, char *errbuf,
                                     size_t errbuf_size) {
  const sim_event_t *ev = &W->events[e];
  const sim_key_t *to = &W->keys[ev->to];
  kl_ledger_args_t credit = {
      .amount = ev->amount, .from = event->key, .from_len = event->key_len};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kl__ledger_encode(&sb, &credit);
  kl_emit_opts_t opts = {.size = sizeof(opts), .not_before = ev->emit_nb};
  kl_err_t err = kl_txn_emit_opts(txn, NULL, to->name, to->name_len, "credit",
                                  sb.data, sb.size, &opts);
  msgpack_sbuffer_destroy(&sb);
  if (!err)
    return KL_HANDLER_OK;
  snprintf(errbuf, errbuf_size, "sim: kl_txn_emit_opts: %s", kl_err_detail());
  return err == KL_ENOMEM ? KL_HANDLER_RETRY : KL_HANDLER_FAIL;
}

/* The owner's record of what its handler saw: its latest run of the
 * cancel at (part, offset) is the one its next commit holds (a run that
 * failed to commit is run again before a commit holds it). */
static void seen_keep(sim_owner_t *o, int32_t part, int64_t offset, int err) {
  for (size_t i = 0; i < o->nseen; i++)
    if (o->seen[i].part == part && o->seen[i].offset == offset) {
      o->seen[i].err = err;
      return;
    }
  o->seen = kl__grow(o->seen, &o->seen_cap, o->nseen, sizeof(*o->seen), 16);
  o->seen[o->nseen++] = (sim_seen_t){part, offset, err};
}

kl_handler_result_t sim_timers_handle(sim_batch_t *b, uint32_t e, int32_t part,
                                      int64_t offset, const kl_event_t *event,
                                      kl_txn_t *txn, int *seen, char *errbuf,
                                      size_t errbuf_size) {
  *seen = -1;
  if (W->events[e].kind == SIM_DEFER)
    return defer_run(e, event, txn, errbuf, errbuf_size);
  kl_handler_result_t r = cancel_run(e, event, txn, seen, errbuf, errbuf_size);
  if (r == KL_HANDLER_OK && b->owner)
    seen_keep(b->owner, part, offset, *seen);
  return r;
}

int sim_timers_seen(const sim_owner_t *o, int32_t part, int64_t offset) {
  for (size_t i = 0; i < o->nseen; i++)
    if (o->seen[i].part == part && o->seen[i].offset == offset)
      return o->seen[i].err;
  return -1;
}

void sim_timers_forget(sim_owner_t *o) {
  o->nseen = 0;
}
