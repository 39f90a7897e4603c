/*
 * What the store actions that list rows share (`keylane store timers`,
 * `keylane store outbox`): their options, opening the store and checking
 * -t TOPIC, and printing the rows, as one JSON object or as a table whose
 * text is escaped (common/strbuf.h's kl__escape()), so that a key holding
 * a control or direction character cannot drive the terminal or reverse
 * its row.
 */
#ifndef KEYLANE_CLI_STORE_LIST_H
#define KEYLANE_CLI_STORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "keylane/store.h"

/* -t TOPIC, into the field topic of the args struct @p type, with @p what
 * as its help (a kl__opt_t of cli/opts.h). */
#define KL__STORE_LIST_TOPIC_OPT(type, what)                                   \
  {                                                                            \
    .name = "topic", .letter = 't', .kind = KL__OPT_STRING, .meta = "TOPIC",   \
    .off = offsetof(type, topic), .shown = "every topic", .help = (what)       \
  }

/* --limit N, into the int64_t field limit of @p type: at most N rows,
 * @p def unless given, as @p what says. */
#define KL__STORE_LIST_LIMIT_OPT(type, def_, what)                             \
  {                                                                            \
    .name = "limit", .kind = KL__OPT_COUNT, .min = 1, .max = 10000000,         \
    .def = (def_), .off = offsetof(type, limit), .help = (what)                \
  }

/* --json, into the int field json of @p type. */
#define KL__STORE_LIST_JSON_OPT(type)                                          \
  {                                                                            \
    .name = "json", .kind = KL__OPT_FLAG, .off = offsetof(type, json),         \
    .help = "one JSON object"                                                  \
  }

/** One column of a table of JSON rows. */
typedef struct kl__store_col {
  const char *head;  /**< its title */
  const char *field; /**< the row's field it shows */
  int width;         /**< printf's: < 0 left-aligns; 0 for the last column */
  const char *none;  /**< shown for a null or absent field, or false */
  const char *yes;   /**< shown for true */
  bool escaped;      /**< the field is kl__escape()'s text already */
} kl__store_col_t;

/**
 * Prints @p rows (a JSON array of objects) as a table of @p cols (ended
 * by one whose head is NULL) on stdout: a string escaped, unless its
 * column says it is already; an integer in decimal. @p empty is printed
 * instead when there is no row.
 */
void kl__store_list_table(const kl__store_col_t *cols, const json_t *rows,
                          const char *empty);

/** Prints @p o on stdout as one line of compact JSON and releases it. */
void kl__store_list_json(json_t *o);

/** A store action's work on the store it was given, with its args. */
typedef int(kl__store_list_fn)(kl_store_t *store, const void *args);

/**
 * Opens the existing store at @p location, checks that it holds a
 * partition of @p topic (when not NULL: a typo is an error naming the
 * topics it does hold), and runs @p run on it.
 * @returns @p run's exit code, or KL_EXIT_FAIL when the store fails or
 *          holds no partition of @p topic (the problem printed for
 *          @p sub).
 */
int kl__store_list_open(const char *sub, const char *location,
                        const char *topic, kl__store_list_fn *run,
                        const void *args);

#endif
