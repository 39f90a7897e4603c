/* `keylane store ACTION`: the actions the dispatcher in store.c runs. */
#ifndef KEYLANE_CLI_STORE_H
#define KEYLANE_CLI_STORE_H

/* argv[0] is the action's name, as for a subcommand. */
int kl__cmd_store_migrate(int argc, char **argv);
int kl__cmd_store_stats(int argc, char **argv);
int kl__cmd_store_keys(int argc, char **argv);
int kl__cmd_store_get(int argc, char **argv);
int kl__cmd_store_rebuild(int argc, char **argv);
int kl__cmd_store_reset(int argc, char **argv);
int kl__cmd_store_outbox(int argc, char **argv);

#endif
