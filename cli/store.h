/* `keylane store ACTION`: the actions the dispatcher in store.c runs. */
#ifndef KEYLANE_CLI_STORE_H
#define KEYLANE_CLI_STORE_H

/* --store STORE of a store action, into the field location of its args
 * struct @p type (a kl__opt_t of cli/opts.h). */
#define KL__STORE_OPT(type)                                                    \
  {                                                                            \
    .name = "store", .kind = KL__OPT_STRING, .meta = "STORE",                  \
    .off = offsetof(type, location), .required = "",                           \
    .help = "LMDB directory or postgresql://... URI"                           \
  }

/* argv[0] is the action's name, as for a subcommand. */
int kl__cmd_store_migrate(int argc, char **argv);
int kl__cmd_store_stats(int argc, char **argv);
int kl__cmd_store_keys(int argc, char **argv);
int kl__cmd_store_get(int argc, char **argv);
int kl__cmd_store_rebuild(int argc, char **argv);
int kl__cmd_store_reset(int argc, char **argv);
int kl__cmd_store_bind(int argc, char **argv);
int kl__cmd_store_outbox(int argc, char **argv);
int kl__cmd_store_timers(int argc, char **argv);

/* One handler row as `keylane store get --json` shows it (and the console,
 * cli/console_api.c): the key, the value's length and base64, and the value
 * decoded when it can be (a ledger entry, msgpack, text). The caller
 * json_decref()s it; NULL when out of memory. */
struct json_t;
struct json_t *kl__store_inspect_value_json(const void *key, size_t key_len,
                                            const void *val, size_t val_len);

#endif
