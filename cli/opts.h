/*
 * The command line's one option parser. A subcommand declares its options
 * in a table of kl__opt_t and its help in a kl__cmd_t; from them come the
 * parsing, the checks of every value (numbers, durations and sizes by
 * common/units.h, the parser the conf table uses) and the --help text, so
 * that the three cannot disagree.
 *
 * Where an option's value goes:
 * - .key: a conf key. "--session-timeout-ms 5000" is kl_conf_set(conf,
 *   "worker.session.timeout.ms", "5000"); the option takes the key's
 *   kind, range, default and description (common/conf.h) unless it gives
 *   its own. A FLAG sets its key to "true".
 * - .parse: a function of the subcommand's, for values of their own shape
 *   (a log position, PARTITION:SEQ), given the field at .off.
 * - otherwise the field at .off of the subcommand's args struct, typed by
 *   the kind: int for FLAG (set to 1), const char * for STRING, LIST and
 *   ENUM, int64_t for COUNT, MS and DURATION (milliseconds) and SIZE
 *   (bytes). The field is set from .def before argv is read, so the table
 *   holds the default --help shows.
 *
 * Every subcommand takes -h/--help, and one that takes a conf also
 * -X/--set NAME=VALUE: a key of the conf table (`keylane config` lists
 * them) or a librdkafka property, with or without the kafka. prefix.
 *
 * Syntax, as getopt_long's: -b VALUE, -bVALUE, --name VALUE, --name=VALUE,
 * an unambiguous prefix of a long name, flags together (-hj); arguments
 * may come between options, and "--" ends the options. A value may begin
 * with '-' ("--key -x"). The last of an option given twice wins.
 */
#ifndef KEYLANE_CLI_OPTS_H
#define KEYLANE_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "keylane/conf.h"
#include "keylane/error.h"

typedef enum {
  KL__OPT_KEY,      /**< the kind of its conf key (.key) */
  KL__OPT_FLAG,     /**< no value */
  KL__OPT_STRING,   /**< any text */
  KL__OPT_LIST,     /**< comma-separated items, read by the subcommand */
  KL__OPT_ENUM,     /**< one of .values, "a|b|c" */
  KL__OPT_COUNT,    /**< a whole number */
  KL__OPT_MS,       /**< a duration; a bare number is milliseconds */
  KL__OPT_DURATION, /**< a duration with a unit (ms, s, m, h, d) */
  KL__OPT_SIZE,     /**< bytes, or with K, M, G or T (powers of 1024) */
  KL__OPT_TEXT,     /**< not an option: .help is a paragraph of the help */
} kl__opt_kind_t;

typedef struct kl__opt kl__opt_t;

/** Reads @p text, the value of @p opt, into @p field. @returns KL_OK, or
 *  an error whose detail names the option, the value and the fix. */
typedef kl_err_t(kl__opt_parse_fn)(const kl__opt_t *opt, const char *text,
                                   void *field);

struct kl__opt {
  const char *name; /**< long name, without "--"; NULL for TEXT */
  char letter;      /**< short name, 0: none */
  kl__opt_kind_t kind;
  const char *meta; /**< the value's name in the help; NULL: the kind's */
  const char *help; /**< what it does; NULL: the conf key's description */
  const char *key;  /**< the conf key it sets; NULL: the field at .off */
  size_t off;       /**< offsetof(args struct, field) */
  const char *def;  /**< a field's default, read as its value; NULL: 0 */
  /** The default as --help shows it; NULL: .def, or the key's default;
   *  "": none. */
  const char *shown;
  int64_t min, max;        /**< numeric kinds; both 0: the key's range */
  const char *values;      /**< ENUM; NULL: the key's */
  const char *required;    /**< not NULL: must be given; the message adds it */
  kl__opt_parse_fn *parse; /**< not NULL: reads the value instead */
};

/** -b/--bootstrap, which sets kafka.bootstrap.servers; @p why is NULL when
 *  it is optional, else what the message adds when it is missing. */
#define KL__OPT_BOOTSTRAP(why)                                                 \
  {                                                                            \
    .name = "bootstrap", .letter = 'b', .kind = KL__OPT_STRING,                \
    .meta = "BOOTSTRAP", .key = "kafka.bootstrap.servers", .required = (why),  \
    .help = "Kafka bootstrap servers, HOST:PORT[,HOST:PORT...]"                \
  }

/** A subcommand: its name, help and options. */
typedef struct kl__cmd {
  const char *name; /**< "worker", "store rebuild" */
  /** What follows "usage: keylane NAME " (one line per form); NULL: the
   *  required options, "[options]" and .args. */
  const char *usage;
  const char *args;      /**< arguments, as usage shows them; NULL: none */
  const char *no_args;   /**< when none: said to one given, or NULL */
  const char *about;     /**< what it does: paragraphs, printed as they are */
  const kl__opt_t *opts; /**< ends with an entry of all zeros */
  const char *notes;     /**< after the options, printed as they are */
  const char *examples;  /**< command lines, indented, printed as they are */
  bool conf;             /**< takes -X/--set: kl__opts_parse() gets a conf */
} kl__cmd_t;

/**
 * Parses argv[1..argc-1] (argv[0] is the subcommand's name) into @p args
 * and @p conf (NULL unless cmd->conf). The arguments that are not options
 * are moved, in order, to the end of argv: they begin at *first.
 * @returns -1 to go on; KL_EXIT_OK after --help (printed on stdout);
 *          KL_EXIT_USAGE after a message on stderr naming the option, the
 *          value and what it takes (an unknown option, a missing value, a
 *          value out of range, a required option missing, an argument
 *          where none is taken).
 */
int kl__opts_parse(const kl__cmd_t *cmd, int argc, char **argv, void *args,
                   kl_conf_t *conf, int *first);

/** Columns of the help text. */
#define KL__OPTS_WIDTH 79

/** Writes @p text from column @p col, breaking lines at spaces (not inside
 *  [...]) before KL__OPTS_WIDTH, then a newline; a new line begins with
 *  @p indent spaces. */
void kl__opts_wrap(FILE *out, const char *text, size_t col, size_t indent);

/** Writes @p cmd's --help text to @p out. */
void kl__opts_help(const kl__cmd_t *cmd, FILE *out);

#endif
