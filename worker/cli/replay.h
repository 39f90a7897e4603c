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

#endif
