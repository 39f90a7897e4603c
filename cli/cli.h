/*
 * The keylane command line: one executable, one function per subcommand.
 * Exit codes: 0 success, 1 failure at run time, 2 bad usage or bad input.
 */
#ifndef KEYLANE_CLI_H
#define KEYLANE_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "cli/opts.h"
#include "common/kafka_pos.h"
#include "common/units.h"
#include "keylane/conf.h"
#include "keylane/store.h"

#define KL_EXIT_OK 0
#define KL_EXIT_FAIL 1
#define KL_EXIT_USAGE 2
/* The worker could not take a partition it was assigned within
 * worker.acquire.wait (the store refused it): a restart may help once the
 * store is fixed, so it is not 1's "see the message". */
#define KL_EXIT_UNOWNED 3

typedef int(kl_cmd_fn)(int argc, char **argv);

/* Subcommands; argv[0] is the subcommand's name. */
int kl__cmd_route(int argc, char **argv);
int kl__cmd_publish(int argc, char **argv);
int kl__cmd_broker(int argc, char **argv);
int kl__cmd_worker(int argc, char **argv);
int kl__cmd_ledger(int argc, char **argv);
int kl__cmd_demo(int argc, char **argv);
int kl__cmd_store(int argc, char **argv);
int kl__cmd_replay(int argc, char **argv);
int kl__cmd_inspect(int argc, char **argv);
int kl__cmd_doctor(int argc, char **argv);
int kl__cmd_config(int argc, char **argv);
int kl__cmd_console(int argc, char **argv);

/* Prints "keylane SUB: message" to stderr and returns KL_EXIT_USAGE. */
int kl__cli_usage(const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "keylane SUB: message" to stderr and returns KL_EXIT_FAIL. */
int kl__cli_fail(const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Applies "-X name=value" to conf; prints the problem and returns nonzero. */
int kl__cli_conf_x(const char *sub, kl_conf_t *conf, const char *arg);

/* Sets key=value on conf; prints the problem and returns nonzero. */
int kl__cli_conf_set(const char *sub, kl_conf_t *conf, const char *key,
                     const char *value);

/* The value of a log position option (--from, --to: common/kafka_pos.h),
 * read by kl__cli_pos_parse() as an option's .parse. */
typedef struct kl__cli_pos {
  kl__pos_t pos;
  int given; /* set by the parse: 0 while the option was not given */
} kl__cli_pos_t;

kl__opt_parse_fn kl__cli_pos_parse;

/* An entity key option (--key), a `const char *` field: 1 to KL_KEY_MAX
 * bytes, as every key keylane stores and the console's key= (so that the
 * listing of a key no event can have is an error, not an empty list). */
kl__opt_parse_fn kl__cli_key_parse;

/* Opens the store at @p location with @p conf (NULL: the defaults). Unless
 * @p create, a location holding no store (an LMDB directory without
 * data.mdb, a PostgreSQL database without keylane's schema) is refused and
 * nothing is created there (store.create=no), so a typo is an error, not
 * an empty store: only commands that start a store (worker, store rebuild)
 * pass @p create. Prints the problem and returns KL_EXIT_FAIL, or
 * KL_EXIT_OK and *store. */
int kl__cli_store_open(const char *sub, const char *location,
                       const kl_conf_t *conf, bool create, kl_store_t **store);

/* kl__cli_store_open() of an existing store with the defaults, for the
 * commands that only read one. */
int kl__cli_store_existing(const char *sub, const char *location,
                           kl_store_t **store);

/* Checks that the store at @p location holds a partition of @p topic (-t
 * TOPIC of a store action); when it does not, prints, for @p sub, the
 * topics it does hold, so that a typo is an error and not an empty answer.
 * @returns KL_EXIT_OK, or KL_EXIT_FAIL (also when the store fails). */
int kl__cli_store_topic_known(const char *sub, kl_store_t *store,
                              const char *location, const char *topic);

/* Installs SIGINT/SIGTERM handlers that set the flag kl__cli_stop. */
void kl__cli_on_signals(void);
extern volatile int kl__cli_stop;

/* Path of the running keylane executable (for spawning workers). */
const char *kl__cli_self(void);

#endif
