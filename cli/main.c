/* keylane: one executable, subcommands dispatched from one table. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/log.h"
#include "store/store_internal.h"
#include "common/log.h"

static const struct {
  const char *name;
  kl_cmd_fn *fn;
  const char *summary;
} kl_cmds[] = {
    /* {"name", kl__cmd_name, "one-line summary"}, one per subcommand */
    {"route", kl__cmd_route, "print the partition each key routes to"},
    {"publish", kl__cmd_publish, "publish JSON-line events from stdin"},
    {"broker", kl__cmd_broker,
     "run the HTTP publish gateway or the embedded cluster"},
    {"worker", kl__cmd_worker, "run one worker of the fleet"},
    {"console", kl__cmd_console,
     "serve the fleet's web page: partitions, keys, stuck keys"},
    {"ledger", kl__cmd_ledger, "print the ledger handler's balances"},
    {"demo", kl__cmd_demo, "run the whole system on an embedded cluster"},
    {"store", kl__cmd_store, "a store: stats, keys, get, rebuild, migrate"},
    {"replay", kl__cmd_replay, "re-apply a range of partitions, once"},
    {"inspect", kl__cmd_inspect, "print a topic's records as JSON lines"},
    {"doctor", kl__cmd_doctor, "check what keylane's guarantees rest on"},
    {"config", kl__cmd_config,
     "the configuration keys: type, default, range, what each does"},
    {"help", NULL, "this list"},
};

static void main_usage(FILE *out) {
  fprintf(out,
          "usage: keylane [--version] [--help] SUBCOMMAND [ARGS]\n\n"
          "keylane: a single-writer-per-key work queue on Apache Kafka.\n\n"
          "subcommands:\n");
  for (size_t i = 0; i < sizeof(kl_cmds) / sizeof(kl_cmds[0]); i++)
    fprintf(out, "  %-10s %s\n", kl_cmds[i].name, kl_cmds[i].summary);
  fprintf(out, "\n'keylane SUBCOMMAND --help' describes one.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    main_usage(stderr);
    return KL_EXIT_USAGE;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    printf("keylane %s\n", KEYLANE_VERSION);
    return KL_EXIT_OK;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    main_usage(stdout);
    return KL_EXIT_OK;
  }
  /* Sessions in pg_stat_activity say which command holds them. */
  static const char *const roles[] = {"worker", "replay", "doctor"};
  const char *role = "cli";
  for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
    if (strcmp(argv[1], roles[i]) == 0)
      role = roles[i];
  kl__pg_set_application(role, NULL);
  if (kl__log_env_check()) {
    fprintf(stderr, "keylane: %s\n", kl_err_detail());
    return KL_EXIT_USAGE;
  }
  for (size_t i = 0; i < sizeof(kl_cmds) / sizeof(kl_cmds[0]); i++)
    if (kl_cmds[i].fn && strcmp(argv[1], kl_cmds[i].name) == 0)
      return kl_cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "keylane: unknown subcommand \"%s\"\n", argv[1]);
  main_usage(stderr);
  return KL_EXIT_USAGE;
}
