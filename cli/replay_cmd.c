/*
 * keylane replay: re-applies a range of partitions through the worker's
 * batch path; and the command line that `keylane store rebuild` shares.
 */
#include "cli/replay_cmd.h"

#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/progress.h"
#include "common/strbuf.h"
#include "handlers/handler.h"
#include "worker/dlq.h"
#include "worker/redrive.h"
#include "worker/replay.h"
#include "store/location.h"

/* Reason @p r of worker/dlq.c's one list (kl__dlq_reason_name()), or
 * NULL past its end, so that a reason added there is offered and taken
 * here too. */
static const char *dlq_reason_at(int r) {
  const char *name = kl__dlq_reason_name((kl__dlq_reason_t)r);
  return strcmp(name, "unknown") == 0 ? NULL : name;
}

/* "decode, handler_fail, ...", filled before the options are parsed or
 * shown. */
static char dlq_reasons[256];

static void dlq_reasons_fill(void) {
  size_t len = 0;
  const char *name;
  for (int r = 0; (name = dlq_reason_at(r)) && len < sizeof(dlq_reasons); r++)
    len += (size_t)snprintf(dlq_reasons + len, sizeof(dlq_reasons) - len,
                            "%s%s", r ? ", " : "", name);
}

static char reason_help[sizeof(dlq_reasons) + 32];

static kl_err_t reason_parse(const kl__opt_t *opt, const char *text,
                             void *field) {
  const char *name;
  for (int r = 0; (name = dlq_reason_at(r)); r++)
    if (strcmp(name, text) == 0) {
      *(const char **)field = text;
      return KL_OK;
    }
  char got[KL__ESCAPED_SIZE(64)];
  return kl__err(KL_EINVAL, "--%s takes one of %s; got \"%s\"", opt->name,
                 dlq_reasons, kl__escape(got, sizeof(got), text, strlen(text)));
}

static const kl__opt_t replay_opts[] = {
    KL__OPT_BOOTSTRAP(NULL),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl__replay_cmd_args_t, opts.topic),
     .help = "topic to replay"},
    {.name = "partition",
     .letter = 'p',
     .kind = KL__OPT_LIST,
     .off = offsetof(kl__replay_cmd_args_t, opts.partitions),
     .help = "partitions: 0,2,5-7 or all"},
    {.name = "from",
     .meta = "POS",
     .parse = kl__cli_pos_parse,
     .off = offsetof(kl__replay_cmd_args_t, from),
     .help = "first offset: N, beginning, watermark (the store's), @MS, "
             "@2024-05-01T12:00:00Z, @-2h"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(kl__replay_cmd_args_t, location),
     .help = "LMDB directory or postgresql://... URI of an existing store "
             "(none is created)"},
    {.name = "handler",
     .kind = KL__OPT_STRING,
     .meta = "HANDLER",
     .off = offsetof(kl__replay_cmd_args_t, handler),
     .help = "ledger | inventory | so:PATH[:SYMBOL] | exec:COMMAND"},
    {.name = "dry-run",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl__replay_cmd_args_t, opts.dry_run),
     .help = "report what would apply and be skipped; change nothing, run "
             "no exec:/so: handler"},
    {.name = "allow-gap",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl__replay_cmd_args_t, opts.allow_gap),
     .help = "start above the store's watermark on purpose (the events "
             "between are skipped for good); refused without it"},
    KL__REPLAY_CMD_OPTS_SHARED,
    {.kind = KL__OPT_TEXT, .help = "Dead-letter redrive (the second usage):\n"},
    {.name = "from-dlq",
     .kind = KL__OPT_STRING,
     .meta = "TOPIC.dlq",
     .off = offsetof(kl__replay_cmd_args_t, dlq),
     .help = "send the dead letters back through the handler, with their "
             "original ids, each into its origin partition (taken by "
             "epoch); each applies at most once: its id is then recorded as "
             "applied"},
    {.name = "reason",
     .kind = KL__OPT_STRING,
     .meta = "R",
     .off = offsetof(kl__replay_cmd_args_t, reason),
     .parse = reason_parse,
     .help = reason_help},
    {.name = "key",
     .kind = KL__OPT_STRING,
     .parse = kl__cli_key_parse,
     .meta = "K",
     .off = offsetof(kl__replay_cmd_args_t, key),
     .help = "only letters of entity key K"},
    {.kind = KL__OPT_TEXT,
     .help = "With it, -t names the origin topic (default: TOPIC), and "
             "--from and\n"
             "--to are positions in TOPIC.dlq (default: all of it). Each "
             "letter's\n"
             "outcome is printed: applied, duplicate (applied before), "
             "failed (it\n"
             "stays a dead letter), pending (its owner has not passed it "
             "yet).\n"},
    {0}};

static const kl__cmd_t replay_cmd = {
    .name = "replay",
    .usage = "-b BOOTSTRAP -t TOPIC -p P[,P...|all] --from POS [--to POS] "
             "--store STORE --handler H [--dry-run] [--json] [options]\n"
             "-b BOOTSTRAP --from-dlq TOPIC.dlq [--reason R] [--key K] "
             "--store STORE --handler H [--dry-run]",
    .about =
        "Reads a range of partitions again and applies it through the "
        "worker's\n"
        "own batch path: events at or above the store's watermark whose\n"
        "idempotency key is new run the handler, once; the others are "
        "skipped\n"
        "and counted (below the watermark: skipped_applied; key seen:\n"
        "skipped_duplicate). Replaying a range that was applied applies 0.\n"
        "A record the handler refuses is recorded as a dead letter when the\n"
        "fleet dead-lettered it (it is in TOPIC.dlq: dead_letter), else the\n"
        "partition stops there (failed) and says where to resume.\n\n"
        "Beside a live fleet: replay takes each partition by epoch, as a new\n"
        "owner does, so the worker that owned it is fenced (it commits "
        "nothing\n"
        "more of the partition until replay has left it alone for\n"
        "worker.fenced.retake.ms, default 30 s, or the group moves it; then "
        "it\n"
        "resumes from the watermark replay left). A worker that takes a\n"
        "partition back while replay runs fences the replay of that "
        "partition\n"
        "instead. While replay works it writes a heartbeat into each "
        "partition\n"
        "it holds, every third of worker.fenced.retake.ms (at most 1 s; pass\n"
        "the fleet's with -X), so a slow handler is not taken for a replay\n"
        "that went away; one paused that long is taken back, and its late\n"
        "commit refused. No event applies twice.\n"
        "--dry-run takes no epoch and commits nothing: it fences nobody and\n"
        "leaves the store byte-identical. It never runs an exec: or so: "
        "handler\n"
        "(it may act outside the store: files, HTTP calls, its own "
        "database):\n"
        "events that would run it count as applied, and whether the handler\n"
        "would accept them is not known (JSON: \"handler_run\": false). The\n"
        "built-in handlers, whose only effects are in the store, do run.\n",
    .opts = replay_opts,
    .notes =
        "Progress (events, rate, ETA per partition) is drawn on stderr when "
        "it\n"
        "is a terminal, else a line every 5 s (KEYLANE_PROGRESS_INTERVAL_MS).\n"
        "Ctrl-C stops after the batch in flight and prints, per partition, "
        "the\n"
        "offset to resume from. Exit 0 when every partition was read to its "
        "end,\n"
        "1 when one stopped, was fenced or failed, 2 for bad usage.\n",
    .examples =
        "  # what would a re-run of partition 3 since this morning apply?\n"
        "  keylane replay -b kafka:9092 -t events -p 3 \\\n"
        "      --from @2024-05-01T06:00:00Z --store /var/lib/keylane \\\n"
        "      --handler ledger --dry-run\n"
        "  # apply whatever the fleet has not applied yet, all partitions\n"
        "  keylane replay -b kafka:9092 -t events -p all --from watermark \\\n"
        "      --store /var/lib/keylane --handler ledger --json\n"
        "  # after fixing the handler: redrive what it failed\n"
        "  keylane replay -b kafka:9092 --from-dlq events.dlq \\\n"
        "      --reason handler_fail --store /var/lib/keylane --handler "
        "ledger\n",
    .conf = true};

static int replay_check(const char *sub, const kl__replay_cmd_args_t *a,
                        int rebuild) {
  if ((a->reason || a->key) && !a->dlq)
    return kl__cli_usage(sub, "--reason and --key select dead letters: they "
                              "need --from-dlq TOPIC.dlq");
  if (!kl_conf_get(a->conf, "kafka.bootstrap.servers"))
    return kl__cli_usage(sub, "-b BOOTSTRAP is required");
  /* Two offsets or two times compare; --to is the first not read. */
  if (a->from.given && a->to.given && a->from.pos.kind == a->to.pos.kind &&
      (a->from.pos.kind == KL__POS_OFFSET ||
       a->from.pos.kind == KL__POS_TIME) &&
      a->from.pos.value > a->to.pos.value) {
    char from[64], to[64];
    return kl__cli_usage(sub,
                         "--from %s is after --to %s: the range is "
                         "empty; --to is the first position not read, "
                         "so give --from POS no later than it",
                         kl__pos_format(&a->from.pos, from, sizeof(from)),
                         kl__pos_format(&a->to.pos, to, sizeof(to)));
  }
  if (a->dlq && a->opts.partitions)
    return kl__cli_usage(sub, "-p does not go with --from-dlq: a dead letter "
                              "goes back to its own origin partition");
  if (a->dlq) {
    if (!a->location)
      return kl__cli_usage(sub, "--store STORE is required");
    return a->handler ? -1
                      : kl__cli_usage(sub, "--handler is required (ledger "
                                           "or so:PATH)");
  }
  if (!a->opts.topic)
    return kl__cli_usage(sub, "-t TOPIC is required");
  if (!rebuild && !a->opts.partitions)
    return kl__cli_usage(sub, "-p is required: name the partitions "
                              "(-p 0,3 or -p all)");
  if (!rebuild && !a->from.given)
    return kl__cli_usage(sub, "--from is required: an offset, beginning, "
                              "watermark or @TIME");
  if (!a->location)
    return kl__cli_usage(sub, rebuild ? "--store NEW_STORE is required: the "
                                        "empty store to rebuild into"
                                      : "--store STORE is required");
  if (!a->handler)
    return kl__cli_usage(sub, "--handler is required (ledger or so:PATH)");
  return -1;
}

/* ---- progress ---------------------------------------------------------- */

static void replay_on_progress(void *opaque, const kl__replay_t *replay) {
  kl__progress_t *progress = opaque;
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(replay, &n);
  for (size_t i = 0; i < n; i++) {
    const kl__replay_part_t *p = &parts[i];
    uint64_t total = (uint64_t)(p->end > p->start ? p->end - p->start : 0);
    uint64_t done = (uint64_t)(p->position - p->start);
    if (p->status == KL__REPLAY_DONE)
      done = total;
    kl__progress_set(progress, i, p->partition, done, total,
                     p->status >= KL__REPLAY_DONE);
  }
  kl__progress_draw(progress, 0);
}

static kl__progress_t *progress_new(const char *sub, size_t rows) {
  const char *env = getenv("KEYLANE_PROGRESS_INTERVAL_MS");
  int64_t interval = 0; /* progress.h's default */
  if (env && kl__units_parse("KEYLANE_PROGRESS_INTERVAL_MS", env, KL__UNITS_MS,
                             1, 3600000, &interval) != KL_OK)
    KL_LOG_W(sub, "%s; using the default", kl_err_detail());
  return kl__progress_new(stderr, sub, rows, -1, (int)interval);
}

/* ---- the report -------------------------------------------------------- */

static json_t *part_json(const kl__replay_part_t *p) {
  json_t *o = json_pack(
      "{sIss sIsIsIsI sIsIsI sIsI sIsIsIsIsI}", "partition",
      (json_int_t)p->partition, "status", kl__replay_status_name(p->status),
      "from", (json_int_t)p->start, "to", (json_int_t)p->end, "low",
      (json_int_t)p->low, "high", (json_int_t)p->high, "watermark_before",
      (json_int_t)p->watermark_before, "watermark_after",
      (json_int_t)p->watermark, "resume_offset", (json_int_t)p->next, "epoch",
      (json_int_t)p->epoch, "previous_epoch", (json_int_t)p->previous_epoch,
      "read", (json_int_t)p->read, "applied", (json_int_t)p->applied,
      "skipped_applied", (json_int_t)p->skipped_applied, "skipped_duplicate",
      (json_int_t)p->skipped_duplicate, "failed", (json_int_t)p->failed);
  json_object_set_new(o, "skipped_dead_letter",
                      json_integer((json_int_t)p->skipped_dead_letter));
  if (p->why[0])
    json_object_set_new(o, "error", json_string(p->why));
  if (p->scratch)
    json_object_set_new(o, "scratch", json_true());
  return o;
}

static json_t *truncated_json(const kl__replay_part_t *p) {
  return json_pack("{sIsIsIsIss}", "partition", (json_int_t)p->partition,
                   "earliest_offset", (json_int_t)p->history_from, "watermark",
                   (json_int_t)p->watermark_before, "missing",
                   (json_int_t)(p->history_from - p->watermark_before),
                   "reason", p->history_skipped ? "from" : "retention");
}

static void print_json(const kl__replay_t *replay, const char *location) {
  const kl__replay_opts_t *opts = kl__replay_opts(replay);
  char shown[KL__LOCATION_MAX];
  kl__location_redact(location, shown, sizeof(shown));
  kl__replay_part_t t;
  kl__replay_totals(replay, &t);
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(replay, &n);
  json_t *list = json_array(), *trunc = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(list, part_json(&parts[i]));
    if (parts[i].history_from >= 0)
      json_array_append_new(trunc, truncated_json(&parts[i]));
  }
  json_t *o = json_pack(
      "{sssssbsIsIsIsIsIssso so}", "topic", opts->topic, "store", shown,
      "dry_run", opts->dry_run, "read", (json_int_t)t.read, "applied",
      (json_int_t)t.applied, "skipped_applied", (json_int_t)t.skipped_applied,
      "skipped_duplicate", (json_int_t)t.skipped_duplicate, "failed",
      (json_int_t)t.failed, "status", kl__replay_status_name(t.status),
      "history_truncated", trunc, "partitions", list);
  json_object_set_new(o, "skipped_dead_letter",
                      json_integer((json_int_t)t.skipped_dead_letter));
  json_object_set_new(o, "stopped",
                      json_boolean(t.status == KL__REPLAY_STOPPED));
  if (opts->dry_run) {
    json_object_set_new(o, "exact", json_boolean(t.exact));
    json_object_set_new(o, "handler_run", json_boolean(opts->dry_run_handler));
  }
  json_dumpf(o, stdout, JSON_COMPACT);
  putchar('\n');
  json_decref(o);
}

static void table_row(const char *name, const char *range, const char *wm,
                      const kl__replay_part_t *p) {
  printf("%-9s %-15s %-17s %8" PRIu64 " %8" PRIu64 " %15" PRIu64 " %17" PRIu64
         " %11" PRIu64 " %6" PRIu64 "  %s\n",
         name, range, wm, p->read, p->applied, p->skipped_applied,
         p->skipped_duplicate, p->skipped_dead_letter, p->failed,
         kl__replay_status_name(p->status));
}

static void print_table(const kl__replay_t *replay) {
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(replay, &n);
  printf("%-9s %-15s %-17s %8s %8s %15s %17s %11s %6s  %s\n", "partition",
         "range", "watermark", "read", "applied", "skipped_applied",
         "skipped_duplicate", "dead_letter", "failed", "status");
  for (size_t i = 0; i < n; i++) {
    const kl__replay_part_t *p = &parts[i];
    char name[16], range[48], wm[48];
    snprintf(name, sizeof(name), "%d", (int)p->partition);
    snprintf(range, sizeof(range), "%" PRId64 "..%" PRId64, p->start, p->end);
    snprintf(wm, sizeof(wm), "%" PRId64 " -> %" PRId64, p->watermark_before,
             p->watermark);
    table_row(name, range, wm, p);
  }
  kl__replay_part_t t;
  kl__replay_totals(replay, &t);
  table_row("total", "", "", &t);
}

void kl__dry_run_note(const char *sub, int dry_run, int handler_run,
                      const char *handler) {
  if (dry_run && !handler_run)
    fprintf(stderr,
            "keylane %s: dry run: the handler %s was not run (it may act "
            "outside the store); \"applied\" counts the events that would "
            "run it, and whether it would accept them is not known\n",
            sub, handler);
}

/* What an operator must not miss, on stderr: lost history, fenced owners,
 * and where to resume. */
static void print_notes(const char *sub, const kl__replay_t *replay) {
  const kl__replay_opts_t *opts = kl__replay_opts(replay);
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(replay, &n);
  for (size_t i = 0; i < n; i++) {
    const kl__replay_part_t *p = &parts[i];
    if (p->history_from >= 0 && !p->history_skipped)
      fprintf(stderr,
              "keylane %s: WARNING: history truncated: %s partition %d "
              "begins at offset %" PRId64
              ", the store had applied up to %" PRId64
              ": retention deleted %" PRId64
              " events that were never applied here, and cannot be "
              "replayed\n",
              sub, opts->topic, (int)p->partition, p->history_from,
              p->watermark_before, p->history_from - p->watermark_before);
    else if (p->history_from >= 0)
      fprintf(stderr,
              "keylane %s: WARNING: partition %d starts at offset %" PRId64
              " as asked (--from), above the store's watermark %" PRId64
              ": events %" PRId64 "..%" PRId64 " are skipped for good\n",
              sub, (int)p->partition, p->history_from, p->watermark_before,
              p->watermark_before, p->history_from - 1);
    if (p->previous_epoch > 0)
      fprintf(stderr,
              "keylane %s: partition %d: took ownership with epoch %" PRIu64
              "; its owner of epoch %" PRIu64 ", if it still runs, is fenced "
              "and takes partition %d back once this replay has left it alone "
              "for worker.fenced.retake.ms (default 30 s), resuming from the "
              "watermark (%" PRId64 ")\n",
              sub, (int)p->partition, p->epoch, p->previous_epoch,
              (int)p->partition, p->watermark);
    if (p->scratch)
      fprintf(stderr,
              "keylane %s: partition %d was never owned: its dry run ran "
              "against an empty scratch store\n",
              sub, (int)p->partition);
    if (p->status > KL__REPLAY_DONE)
      fprintf(stderr,
              "keylane %s: partition %d %s at offset %" PRId64 "%s%s; resume "
              "with -p %d --from %" PRId64 "\n",
              sub, (int)p->partition, kl__replay_status_name(p->status),
              p->next, p->why[0] ? ": " : "", p->why, (int)p->partition,
              p->next);
  }
  kl__replay_part_t t;
  kl__replay_totals(replay, &t);
  if (opts->dry_run && !t.exact)
    fprintf(stderr,
            "keylane %s: dry run: a partition needed more than one window of "
            "--batch-max events; its counts past the first window are "
            "estimates (raise --batch-max for exact ones)\n",
            sub);
}

static int replay_exec(const char *sub, kl__replay_cmd_args_t *a) {
  kl_handler_ref_t handler;
  if (kl__handler_resolve(a->handler, &handler))
    return kl__cli_usage(sub, "%s", kl_err_detail());
  /* Only a rebuild that writes starts a store: a replay or a dry run at a
   * mistyped path must create nothing there. */
  kl_store_t *store;
  int rc = kl__cli_store_open(sub, a->location, a->conf,
                              a->opts.rebuild && !a->opts.dry_run, &store);
  if (rc) {
    kl__handler_release(&handler);
    return rc;
  }
  a->opts.conf = a->conf;
  a->opts.store = store;
  a->opts.handler = handler.fn;
  a->opts.handler_opaque = handler.opaque;
  a->opts.dry_run_handler = handler.store_only;
  a->opts.stop = &kl__cli_stop;
  kl__cli_on_signals();
  kl__replay_t *replay = NULL;
  kl__progress_t *progress = NULL;
  kl_err_t err = kl__replay_new(&a->opts, &replay);
  if (!err && !a->no_progress) {
    size_t n;
    kl__replay_parts(replay, &n);
    progress = progress_new(sub, n);
  }
  if (err) {
    rc = err == KL_EINVAL || err == KL_EPARTITIONS || err == KL_ENOTFOUND
             ? kl__cli_usage(sub, "%s", kl_err_detail())
             : kl__cli_fail(sub, "%s", kl_err_detail());
  } else {
    kl__replay_set_progress(replay, progress ? replay_on_progress : NULL,
                            progress);
    err = kl__replay_run(replay);
    /* A run refused before it read anything (a rebuild into a store that
     * is not empty) reports no progress: only the refusal. */
    if (progress && !err)
      kl__progress_finish(progress);
    if (err) {
      rc = kl__cli_fail(sub, "%s", kl_err_detail());
    } else {
      a->json ? print_json(replay, a->location) : print_table(replay);
      print_notes(sub, replay);
      kl__dry_run_note(sub, a->opts.dry_run, a->opts.dry_run_handler,
                       a->handler);
      kl__replay_part_t t;
      kl__replay_totals(replay, &t);
      rc = t.status == KL__REPLAY_DONE ? KL_EXIT_OK : KL_EXIT_FAIL;
    }
  }
  kl__progress_destroy(progress);
  kl__replay_destroy(replay);
  kl_store_destroy(store);
  kl__handler_release(&handler);
  return rc;
}

int kl__replay_cmd_run(const kl__cmd_t *cmd, int argc, char **argv,
                       int rebuild) {
  const char *sub = cmd->name;
  kl__replay_cmd_args_t a = {.conf = kl_conf_new()};
  int first;
  dlq_reasons_fill();
  snprintf(reason_help, sizeof(reason_help), "only letters of reason R (%s)",
           dlq_reasons);
  int rc = a.conf ? kl__opts_parse(cmd, argc, argv, &a, a.conf, &first)
                  : kl__cli_fail(sub, "out of memory");
  a.opts.from = a.from.given ? a.from.pos : (kl__pos_t){KL__POS_BEGINNING, 0};
  a.opts.to = a.to.given ? a.to.pos : (kl__pos_t){KL__POS_END, 0};
  a.opts.batch_max = (size_t)a.batch_max;
  a.opts.rebuild = rebuild;

  if (rc < 0)
    rc = replay_check(sub, &a, rebuild);
  if (rc < 0 && a.dlq) {
    kl__redrive_opts_t ro = {.conf = a.conf,
                             .dlq_topic = a.dlq,
                             .topic = a.opts.topic,
                             .reason = a.reason,
                             .key = a.key,
                             .from = a.opts.from,
                             .to = a.opts.to,
                             .dry_run = a.opts.dry_run};
    rc = kl__redrive_cmd_run(sub, &ro, a.location, a.handler, a.json);
  } else if (rc < 0) {
    /* A rebuild reads everything; a --from of its own skips the history
     * before it on purpose, and says so. */
    a.opts.allow_gap = a.opts.allow_gap || rebuild;
    rc = replay_exec(sub, &a);
  }
  kl_conf_destroy(a.conf);
  return rc;
}

int kl__cmd_replay(int argc, char **argv) {
  return kl__replay_cmd_run(&replay_cmd, argc, argv, 0);
}
