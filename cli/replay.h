/* `keylane replay` and `keylane store rebuild`: one engine (worker/replay.h),
 * one command line, one report. */
#ifndef KEYLANE_WORKER_CLI_REPLAY_H
#define KEYLANE_WORKER_CLI_REPLAY_H

/**
 * Parses the options of a replay (@p rebuild 0) or a rebuild (1: every
 * partition from its earliest retained offset into an empty store), runs
 * it with a progress bar on stderr, and prints the report: a table, or one
 * JSON object with --json. @p usage is printed for --help.
 * @returns the exit code: 0 when every partition was read to its end.
 */
int kl__replay_cli(const char *sub, const char *usage, int argc, char **argv,
                   int rebuild);

/**
 * Redrives the dead letters @p opts selects (its store, handler and stop
 * are filled in here) and prints each letter's outcome: a table, or one
 * JSON object with @p json.
 * @returns the exit code: 0 when every selected letter was applied or had
 *          been applied before.
 */
struct kl__redrive_opts;
int kl__redrive_cli(const char *sub, struct kl__redrive_opts *opts,
                    const char *location, const char *handler, int json);

/**
 * A dry run's note on stderr, when it did not run @p handler (its effects
 * may reach outside the store): what "applied" then counts. Nothing when
 * @p handler_run or not @p dry_run.
 */
void kl__dry_run_note(const char *sub, int dry_run, int handler_run,
                      const char *handler);

#endif
