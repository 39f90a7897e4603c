/* `keylane replay` and `keylane store rebuild`: one engine (worker/replay.h),
 * one command line, one report. */
#ifndef KEYLANE_CLI_REPLAY_CMD_H
#define KEYLANE_CLI_REPLAY_CMD_H

#include <stddef.h>

#include <jansson.h>

#include "cli/cli.h"
#include "worker/replay.h"

/** The options of `keylane replay` and `keylane store rebuild`. */
typedef struct kl__replay_cmd_args {
  kl_conf_t *conf;
  kl__replay_opts_t opts; /* topic, partitions, dry_run, allow_gap */
  const char *location, *handler;
  kl__cli_pos_t from, to;
  int64_t batch_max; /* 0: the engine's */
  int json, no_progress;
  const char *dlq, *reason, *key; /* --from-dlq: a redrive */
} kl__replay_cmd_args_t;

/* The options both commands take, with the same meaning. */
#define KL__REPLAY_CMD_OPTS_SHARED                                             \
  {.name = "to",                                                               \
   .meta = "POS",                                                              \
   .parse = kl__cli_pos_parse,                                                 \
   .off = offsetof(kl__replay_cmd_args_t, to),                                 \
   .shown = "end, the high watermark at the start",                            \
   .help = "stop before: N, @TIME or end"},                                    \
      {.name = "batch-max",                                                    \
       .kind = KL__OPT_COUNT,                                                  \
       .min = 1,                                                               \
       .max = 1000000,                                                         \
       .off = offsetof(kl__replay_cmd_args_t, batch_max),                      \
       .shown = "1000; a dry run's window: 100000",                            \
       .help = "events per store commit"},                                     \
      {.name = "json",                                                         \
       .kind = KL__OPT_FLAG,                                                   \
       .off = offsetof(kl__replay_cmd_args_t, json),                           \
       .help = "print one JSON object"},                                       \
      {.name = "partitions",                                                   \
       .key = "worker.expect.partitions",                                      \
       .shown = "",                                                            \
       .help = "refuse unless TOPIC has N partitions"},                        \
  {                                                                            \
    .name = "no-progress", .kind = KL__OPT_FLAG,                               \
    .off = offsetof(kl__replay_cmd_args_t, no_progress),                       \
    .help = "no progress on stderr"                                            \
  }

/**
 * Parses the options of a replay (@p rebuild 0) or a rebuild (1: every
 * partition from its earliest retained offset into an empty store) by
 * @p cmd, whose options fill a kl__replay_cmd_args_t, runs it with a progress
 * bar on stderr, and prints the report: a table, or one JSON object with
 * --json.
 * @returns the exit code: 0 when every partition was read to its end.
 */
int kl__replay_cmd_run(const kl__cmd_t *cmd, int argc, char **argv,
                       int rebuild);

/**
 * Redrives the dead letters @p opts selects (its store, handler and stop
 * are filled in here) and prints each letter's outcome: a table, or one
 * JSON object with @p json.
 * @returns the exit code: 0 when every selected letter was applied or had
 *          been applied before.
 */
struct kl__redrive_opts;
struct kl__redrive;
/**
 * The outcome of a redrive as `keylane replay --from-dlq --json` prints
 * it (the console's POST /api/redrive answers it too): the counts and each
 * selected letter's outcome.
 * @returns a new reference, json_decref()ed by the caller.
 */
json_t *kl__redrive_cmd_json(const struct kl__redrive *r,
                             const struct kl__redrive_opts *opts);

int kl__redrive_cmd_run(const char *sub, struct kl__redrive_opts *opts,
                        const char *location, const char *handler, int json);

/**
 * A dry run's note on stderr, when it did not run @p handler (its effects
 * may reach outside the store): what "applied" then counts. Nothing when
 * @p handler_run or not @p dry_run.
 */
void kl__dry_run_note(const char *sub, int dry_run, int handler_run,
                      const char *handler);

#endif
