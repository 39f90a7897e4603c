/*
 * keylane route: which partition a key lands on, computed exactly as the
 * producer (and the Java client) computes it. For operators asking "which
 * worker owns account 42?" without publishing anything.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keylane/event.h"
#include "keylane/producer.h"

#define KL_ROUTE_SUB "route"

static void route_help(void) {
  printf(
      "usage: keylane route --partitions N [KEY...]\n"
      "\n"
      "Prints KEY<TAB>PARTITION for each key, in input order: the partition\n"
      "keylane's producer and the Java client's default partitioner pick,\n"
      "(murmur2(key) & 0x7fffffff) %% N.\n"
      "With no KEY arguments, reads keys from stdin, one per line (the\n"
      "newline is not part of the key; a carriage return is).\n"
      "\n"
      "flags:\n"
      "  --partitions N   the topic's partition count (1..100000), required\n"
      "  -h, --help       this text\n"
      "\n"
      "A key is 1..%d bytes; an empty or longer key stops the run with\n"
      "exit 2 after the keys before it were printed.\n"
      "\n"
      "examples:\n"
      "  keylane route --partitions 12 account-42 account-43\n"
      "  cut -f1 accounts.tsv | keylane route --partitions 12\n",
      KL_KEY_MAX);
}

static int route_parse_partitions(const char *arg, int32_t *out) {
  int64_t v = 0;
  int rc = kl__cli_units(KL_ROUTE_SUB, "--partitions", arg, KL__UNITS_COUNT, 1,
                         100000, &v);
  *out = rc ? *out : (int32_t)v;
  return rc;
}

static void route_print(const char *key, size_t len, int32_t partitions) {
  fwrite(key, 1, len, stdout);
  printf("\t%d\n", (int)kl_partition(key, len, partitions));
}

static int route_check(const char *where, size_t len) {
  if (len == 0)
    return kl__cli_usage(KL_ROUTE_SUB,
                         "%s: the key is empty; a key is 1..%d "
                         "bytes",
                         where, KL_KEY_MAX);
  if (len > KL_KEY_MAX)
    return kl__cli_usage(KL_ROUTE_SUB,
                         "%s: the key is %zu bytes, the limit is %d", where,
                         len, KL_KEY_MAX);
  return KL_EXIT_OK;
}

static int route_args(char **keys, int count, int32_t partitions) {
  for (int i = 0; i < count; i++) {
    char where[48];
    snprintf(where, sizeof(where), "argument %d", i + 1);
    size_t len = strlen(keys[i]);
    if (route_check(where, len) != KL_EXIT_OK)
      return KL_EXIT_USAGE;
    route_print(keys[i], len, partitions);
  }
  return KL_EXIT_OK;
}

static int route_stdin(int32_t partitions) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int rc = KL_EXIT_OK;
  for (long lineno = 1; (n = getline(&line, &cap, stdin)) >= 0; lineno++) {
    size_t len = (size_t)n;
    if (len > 0 && line[len - 1] == '\n')
      len--;
    char where[48];
    snprintf(where, sizeof(where), "stdin line %ld", lineno);
    fflush(stdout); /* earlier keys come out before the error */
    if ((rc = route_check(where, len)) != KL_EXIT_OK)
      break;
    route_print(line, len, partitions);
  }
  if (rc == KL_EXIT_OK && ferror(stdin))
    rc = kl__cli_fail(KL_ROUTE_SUB, "reading stdin: %s", strerror(errno));
  free(line);
  return rc;
}

int kl__cmd_route(int argc, char **argv) {
  static const struct option opts[] = {
      {"partitions", required_argument, NULL, 'n'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int32_t partitions = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c == 'h') {
      route_help();
      return KL_EXIT_OK;
    }
    if (c != 'n')
      return kl__cli_usage(KL_ROUTE_SUB, "unknown flag");
    if (route_parse_partitions(optarg, &partitions) != KL_EXIT_OK)
      return KL_EXIT_USAGE;
  }
  if (partitions == 0)
    return kl__cli_usage(KL_ROUTE_SUB, "--partitions N is required: pass the "
                                       "topic's partition count");
  int rc = optind < argc ? route_args(argv + optind, argc - optind, partitions)
                         : route_stdin(partitions);
  if (fflush(stdout) != 0 && rc == KL_EXIT_OK)
    rc = kl__cli_fail(KL_ROUTE_SUB, "writing stdout: %s", strerror(errno));
  return rc;
}
