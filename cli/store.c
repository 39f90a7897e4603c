/* keylane store: operations on a store, one action per file, from one
 * table (migrate first; stats, keys and get follow). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/store.h"

static const struct {
  const char *name;
  kl_cmd_fn *fn;
  const char *summary;
} kl_store_actions[] = {
    {"migrate", kl__cmd_store_migrate,
     "create or upgrade a PostgreSQL store's schema"},
    {"stats", kl__cmd_store_stats,
     "epochs, watermarks, key counts and ages, size"},
    {"keys", kl__cmd_store_keys, "list the handlers' keys"},
    {"get", kl__cmd_store_get, "print one key's record"},
    {"rebuild", kl__cmd_store_rebuild, "rebuild a lost store from the log"},
    {"reset", kl__cmd_store_reset,
     "start partitions again from the log's beginning"},
    {"bind", kl__cmd_store_bind,
     "record the cluster and group that own a topic"},
    {"outbox", kl__cmd_store_outbox,
     "list, or drop, follow-ups not yet published"},
    {"timers", kl__cmd_store_timers,
     "list delayed events waiting for their time"},
};
#define KL_NACTIONS (sizeof(kl_store_actions) / sizeof(kl_store_actions[0]))

static void store_usage(FILE *out) {
  fprintf(out, "usage: keylane store ACTION [ARGS]\n\nactions:\n");
  for (size_t i = 0; i < KL_NACTIONS; i++)
    fprintf(out, "  %-10s %s\n", kl_store_actions[i].name,
            kl_store_actions[i].summary);
  fprintf(out, "\n'keylane store ACTION --help' describes one.\n");
}

int kl__cmd_store(int argc, char **argv) {
  if (argc < 2) {
    store_usage(stderr);
    return KL_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    store_usage(stdout);
    return KL_EXIT_OK;
  }
  for (size_t i = 0; i < KL_NACTIONS; i++)
    if (strcmp(argv[1], kl_store_actions[i].name) == 0)
      return kl_store_actions[i].fn(argc - 1, argv + 1);
  return kl__cli_usage("store", "unknown action \"%s\"", argv[1]);
}
