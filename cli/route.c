/*
 * keylane route: which partition a key lands on, computed exactly as the
 * producer (and the Java client) computes it. For operators asking "which
 * worker owns account 42?" without publishing anything.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "keylane/event.h"
#include "keylane/producer.h"

#define KL_ROUTE_SUB "route"

typedef struct route_args {
  int64_t partitions;
} route_args_t;

static const kl__opt_t route_opts[] = {
    {.name = "partitions",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 100000,
     .off = offsetof(route_args_t, partitions),
     .required = "pass the topic's partition count",
     .help = "the topic's partition count"},
    {0}};

_Static_assert(KL_KEY_MAX == 1024, "route_cmd's notes give the key limit");
static const kl__cmd_t route_cmd = {
    .name = KL_ROUTE_SUB,
    .args = "[KEY...]",
    .about =
        "Prints KEY<TAB>PARTITION for each key, in input order: the partition\n"
        "keylane's producer and the Java client's default partitioner pick,\n"
        "(murmur2(key) & 0x7fffffff) % N.\n"
        "With no KEY arguments, reads keys from stdin, one per line (the\n"
        "newline is not part of the key; a carriage return is).\n",
    .opts = route_opts,
    .notes = "A key is 1..1024 bytes; an empty or longer key stops the run "
             "with\nexit 2 after the keys before it were printed.\n",
    .examples = "  keylane route --partitions 12 account-42 account-43\n"
                "  cut -f1 accounts.tsv | keylane route --partitions 12\n"};

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
  route_args_t a = {0};
  int first;
  int rc = kl__opts_parse(&route_cmd, argc, argv, &a, NULL, &first);
  if (rc >= 0)
    return rc;
  int32_t partitions = (int32_t)a.partitions;
  rc = first < argc ? route_args(argv + first, argc - first, partitions)
                    : route_stdin(partitions);
  if (fflush(stdout) != 0 && rc == KL_EXIT_OK)
    rc = kl__cli_fail(KL_ROUTE_SUB, "writing stdout: %s", strerror(errno));
  return rc;
}
