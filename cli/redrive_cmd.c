/* keylane replay --from-dlq: dead letters back through the handler, and
 * each letter's outcome. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "common/json_msgpack.h"
#include "cli/replay_cmd.h"
#include "handlers/handler.h"
#include "worker/redrive.h"

static void set_key(json_t *o, const rd_kafka_message_t *m) {
  json_t *s = m->key ? json_stringn(m->key, m->key_len) : NULL;
  if (s) {
    json_object_set_new(o, "key", s);
    return;
  }
  char *b64 = malloc(kl__base64_encoded_len(m->key_len) + 1);
  if (b64 && m->key)
    kl__base64_encode(m->key, m->key_len, b64);
  json_object_set_new(o, "key_b64",
                      b64 && m->key ? json_string(b64) : json_null());
  free(b64);
}

static json_t *letter_json(const kl__redriven_t *x) {
  const kl__letter_t *l = x->letter;
  json_t *o = json_pack(
      "{sIsIsIsIsssssssI}", "dlq_partition", (json_int_t)l->dlq_partition,
      "dlq_offset", (json_int_t)l->dlq_offset, "partition",
      (json_int_t)l->partition, "offset", (json_int_t)l->offset, "id", x->id,
      "reason", l->reason, "outcome", kl__outcome_name(x->outcome), "epoch",
      (json_int_t)x->epoch);
  set_key(o, l->msg);
  if (x->why[0])
    json_object_set_new(o, "error", json_string(x->why));
  return o;
}

json_t *kl__redrive_cmd_json(const kl__redrive_t *r,
                             const kl__redrive_opts_t *opts) {
  size_t n;
  const kl__redriven_t *res = kl__redrive_results(r, &n);
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++)
    if (res[i].outcome != KL__OUT_FILTERED)
      json_array_append_new(list, letter_json(&res[i]));
  json_t *o = json_pack(
      "{sssssbsIsIsIsIsIsIsIsIsIsIsIso}", "dlq_topic", opts->dlq_topic, "topic",
      kl__redrive_topic(r), "dry_run", opts->dry_run, "read", (json_int_t)n,
      "letters", (json_int_t)(n - kl__redrive_count(r, KL__OUT_FILTERED)),
      "applied", (json_int_t)kl__redrive_count(r, KL__OUT_APPLIED),
      "republished", (json_int_t)kl__redrive_count(r, KL__OUT_REPUBLISHED),
      "scheduled", (json_int_t)kl__redrive_count(r, KL__OUT_SCHEDULED),
      "skipped_duplicate", (json_int_t)kl__redrive_count(r, KL__OUT_DUPLICATE),
      "failed", (json_int_t)kl__redrive_count(r, KL__OUT_FAILED), "pending",
      (json_int_t)kl__redrive_count(r, KL__OUT_PENDING), "fenced",
      (json_int_t)kl__redrive_count(r, KL__OUT_FENCED), "errors",
      (json_int_t)kl__redrive_count(r, KL__OUT_ERROR), "filtered",
      (json_int_t)kl__redrive_count(r, KL__OUT_FILTERED), "results", list);
  if (opts->dry_run)
    json_object_set_new(o, "handler_run", json_boolean(opts->dry_run_handler));
  return o;
}

static void redrive_json(const kl__redrive_t *r,
                         const kl__redrive_opts_t *opts) {
  json_t *o = kl__redrive_cmd_json(r, opts);
  json_dumpf(o, stdout, JSON_COMPACT);
  putchar('\n');
  json_decref(o);
}

static void redrive_table(const kl__redrive_t *r) {
  size_t n;
  const kl__redriven_t *res = kl__redrive_results(r, &n);
  printf("%-14s %-22s %-36s %-13s %s\n", "dead letter", "origin", "id",
         "reason", "outcome");
  for (size_t i = 0; i < n; i++) {
    const kl__letter_t *l = res[i].letter;
    if (res[i].outcome == KL__OUT_FILTERED)
      continue;
    char where[32], origin[48];
    snprintf(where, sizeof(where), "%d@%" PRId64, (int)l->dlq_partition,
             l->dlq_offset);
    snprintf(origin, sizeof(origin), "%d@%" PRId64, (int)l->partition,
             l->offset);
    printf("%-14s %-22s %-36s %-13s %s\n", where, origin, res[i].id, l->reason,
           kl__outcome_name(res[i].outcome));
  }
  printf("letters: %zu applied, %zu republished, %zu scheduled, %zu "
         "duplicate, %zu failed, "
         "%zu pending, %zu fenced, %zu errors; %zu not selected\n",
         kl__redrive_count(r, KL__OUT_APPLIED),
         kl__redrive_count(r, KL__OUT_REPUBLISHED),
         kl__redrive_count(r, KL__OUT_SCHEDULED),
         kl__redrive_count(r, KL__OUT_DUPLICATE),
         kl__redrive_count(r, KL__OUT_FAILED),
         kl__redrive_count(r, KL__OUT_PENDING),
         kl__redrive_count(r, KL__OUT_FENCED),
         kl__redrive_count(r, KL__OUT_ERROR),
         kl__redrive_count(r, KL__OUT_FILTERED));
}

static void redrive_notes(const char *sub, const kl__redrive_t *r) {
  size_t n;
  const kl__replay_part_t *taken = kl__redrive_taken(r, &n);
  for (size_t i = 0; i < n; i++)
    fprintf(stderr,
            "keylane %s: partition %d: took ownership with epoch %" PRIu64
            "; its owner of epoch %" PRIu64 ", if it still runs, is fenced "
            "and takes partition %d back once this redrive has left it alone "
            "for worker.fenced.retake.ms (default 30 s)\n",
            sub, (int)taken[i].partition, taken[i].epoch,
            taken[i].previous_epoch, (int)taken[i].partition);
  const kl__redriven_t *res = kl__redrive_results(r, &n);
  for (size_t i = 0; i < n; i++)
    if (res[i].why[0])
      fprintf(stderr,
              "keylane %s: dead letter %d@%" PRId64 " (origin %d@%" PRId64
              ") %s: %s\n",
              sub, (int)res[i].letter->dlq_partition, res[i].letter->dlq_offset,
              (int)res[i].letter->partition, res[i].letter->offset,
              kl__outcome_name(res[i].outcome), res[i].why);
}

int kl__redrive_cmd_run(const char *sub, kl__redrive_opts_t *opts,
                        const char *location, const char *handler_spec,
                        int json) {
  kl_handler_ref_t handler;
  if (kl__handler_resolve(handler_spec, &handler))
    return kl__cli_usage(sub, "%s", kl_err_detail());
  kl_store_t *store; /* a redrive changes a store: it never starts one */
  if (kl__cli_store_open(sub, location, opts->conf, false, &store)) {
    kl__handler_release(&handler);
    return KL_EXIT_FAIL;
  }
  opts->store = store;
  opts->handler = handler.fn;
  opts->handler_opaque = handler.opaque;
  opts->dry_run_handler = handler.store_only;
  opts->stop = &kl__cli_stop;
  kl__cli_on_signals();
  kl__redrive_t *r = NULL;
  kl_err_t err = kl__redrive_run(opts, &r);
  int rc;
  if (err) {
    rc = err == KL_EINVAL || err == KL_ENOTFOUND
             ? kl__cli_usage(sub, "%s", kl_err_detail())
             : kl__cli_fail(sub, "%s", kl_err_detail());
  } else {
    json ? redrive_json(r, opts) : redrive_table(r);
    redrive_notes(sub, r);
    kl__dry_run_note(sub, opts->dry_run, opts->dry_run_handler, handler_spec);
    size_t n, done = kl__redrive_count(r, KL__OUT_FILTERED) +
                     kl__redrive_count(r, KL__OUT_APPLIED) +
                     kl__redrive_count(r, KL__OUT_REPUBLISHED) +
                     kl__redrive_count(r, KL__OUT_SCHEDULED) +
                     kl__redrive_count(r, KL__OUT_DUPLICATE);
    kl__redrive_results(r, &n);
    rc = done == n ? KL_EXIT_OK : KL_EXIT_FAIL;
  }
  kl__redrive_destroy(r);
  kl_store_destroy(store);
  kl__handler_release(&handler);
  return rc;
}
