/* keylane ledger: the ledger handler's balances, from one store snapshot. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>

#include "common/cli/cli.h"
#include "keylane/store.h"
#include "worker/ledger.h"

#define SUB "ledger"

static const char kl_ledger_usage[] =
    "usage: keylane ledger --store STORE [--json]\n\n"
    "Prints KEY<TAB>BALANCE<TAB>LAST_SEQ per key of the ledger handler,\n"
    "sorted by key, then a totals line; read from one consistent snapshot,\n"
    "also while workers run.\n\n"
    "      --store STORE   LMDB directory or postgresql://... URI\n"
    "      --json          one JSON object: keys, order_violations, balances\n"
    "  -h, --help          this text\n";

typedef struct kl_ledger_walk {
  json_t *balances; /* NULL: print text */
  uint64_t keys, violations;
  int64_t total;
} kl_ledger_walk_t;

static int kl_ledger_row(void *opaque, const void *key, size_t key_len,
                         const void *val, size_t val_len) {
  kl_ledger_walk_t *walk = opaque;
  kl_ledger_entry_t e;
  size_t plen = sizeof(KL_LEDGER_PREFIX) - 1;
  if (kl__ledger_decode(val, val_len, &e) != 0)
    return 0;
  const char *k = (const char *)key + plen;
  int klen = (int)(key_len - plen);
  walk->keys++;
  walk->violations += (uint64_t)e.violations;
  walk->total += e.balance;
  if (!walk->balances) {
    printf("%.*s\t%" PRId64 "\t%" PRId64 "\n", klen, k, e.balance, e.last_seq);
    return 0;
  }
  char name[KL_LEDGER_KEY_TEXT_MAX];
  snprintf(name, sizeof(name), "%.*s", klen, k);
  json_object_set_new(walk->balances, name,
                      json_pack("{sIsI}", "balance", (json_int_t)e.balance,
                                "last_seq", (json_int_t)e.last_seq));
  return 0;
}

int kl__ledger_print(kl_store_t *store, int json);
int kl__ledger_print(kl_store_t *store, int json) {
  kl_ledger_walk_t walk = {json ? json_object() : NULL, 0, 0, 0};
  kl_err_t err = kl_store_scan(store, KL_LEDGER_PREFIX,
                               sizeof(KL_LEDGER_PREFIX) - 1, kl_ledger_row,
                               &walk);
  if (err) {
    json_decref(walk.balances);
    return kl__cli_fail(SUB, "cannot read the store: %s", kl_err_detail());
  }
  if (json) {
    json_t *out = json_pack("{sIsIso}", "keys", (json_int_t)walk.keys,
                            "order_violations", (json_int_t)walk.violations,
                            "balances", walk.balances);
    json_dumpf(out, stdout, JSON_COMPACT | JSON_SORT_KEYS);
    putchar('\n');
    json_decref(out);
  } else {
    printf("total\tkeys=%" PRIu64 "\tbalance=%" PRId64
           "\torder_violations=%" PRIu64 "\n",
           walk.keys, walk.total, walk.violations);
  }
  return KL_EXIT_OK;
}

int kl__cmd_ledger(int argc, char **argv) {
  static const struct option opts[] = {{"store", required_argument, NULL, 's'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  const char *location = NULL;
  int json = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 's': location = optarg; break;
    case 'j': json = 1; break;
    case 'h': fputs(kl_ledger_usage, stdout); return KL_EXIT_OK;
    default: return kl__cli_usage(SUB, "unknown option");
    }
  }
  if (!location)
    return kl__cli_usage(SUB, "--store STORE is required");
  kl_store_t *store;
  if (kl_store_open(location, NULL, &store))
    return kl__cli_fail(SUB, "cannot open the store %s: %s", location,
                        kl_err_detail());
  int rc = kl__ledger_print(store, json);
  kl_store_destroy(store);
  return rc;
}
