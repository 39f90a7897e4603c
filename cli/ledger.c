/* keylane ledger: the ledger handler's balances, from one store snapshot. */
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/strbuf.h"
#include "common/topic.h"
#include "keylane/store.h"
#include "handlers/ledger.h"

#define SUB "ledger"

typedef struct kl_ledger_walk {
  json_t *balances; /* NULL: print text */
  uint64_t keys, violations;
  __int128 total, held; /* a sum of int64 balances can leave int64 */
} kl_ledger_walk_t;

/* A key as text: escaped (common/strbuf.h), so that a key's control bytes
 * reach no terminal and two keys never print alike, in text or as JSON
 * object names (a NUL would end a C string: "k\0a" and "k\0b" were one). */
static char *ledger_key_text(const char *k, size_t len) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  kl__strbuf_escaped(&sb, k, len);
  kl__strbuf_add(&sb, "", 1);
  size_t n;
  return kl__strbuf_take(&sb, &n);
}

static int ledger_row(void *opaque, const void *key, size_t key_len,
                      const kl_ledger_entry_t *e) {
  kl_ledger_walk_t *walk = opaque;
  char *name = ledger_key_text(key, key_len);
  if (!name)
    return -1;
  walk->keys++;
  walk->violations += (uint64_t)e->violations;
  walk->total += e->balance;
  walk->held += e->held;
  /* held only while a scheduled transfer waits for its settle */
  if (!walk->balances && e->held)
    printf("%s\t%" PRId64 "\t%" PRId64 "\theld=%" PRId64 "\n", name, e->balance,
           e->last_seq, e->held);
  else if (!walk->balances)
    printf("%s\t%" PRId64 "\t%" PRId64 "\n", name, e->balance, e->last_seq);
  else {
    json_t *o = json_pack("{sIsI}", "balance", (json_int_t)e->balance,
                          "last_seq", (json_int_t)e->last_seq);
    if (e->held)
      json_object_set_new(o, "held", json_integer((json_int_t)e->held));
    json_object_set_new(walk->balances, name, o);
  }
  free(name);
  return 0;
}

/* Writes @p v in decimal into @p buf (at least 41 bytes). */
static const char *i128_text(__int128 v, char *buf, size_t size) {
  char digits[48];
  size_t n = 0;
  unsigned __int128 u = v < 0 ? -(unsigned __int128)v : (unsigned __int128)v;
  do
    digits[n++] = (char)('0' + (int)(u % 10));
  while ((u /= 10) && n < sizeof(digits));
  size_t o = 0;
  if (v < 0 && o + 1 < size)
    buf[o++] = '-';
  while (n && o + 1 < size)
    buf[o++] = digits[--n];
  buf[o] = '\0';
  return buf;
}

static int ledger_print(kl_store_t *store, const char *topic, int json) {
  kl_ledger_walk_t walk = {json ? json_object() : NULL, 0, 0, 0, 0};
  kl_err_t err = kl__ledger_walk(store, topic, ledger_row, &walk);
  if (err) {
    json_decref(walk.balances);
    return kl__cli_fail(SUB, "cannot read the store: %s", kl_err_detail());
  }
  if (json) {
    json_t *out =
        json_pack("{sIsIso}", "keys", (json_int_t)walk.keys, "order_violations",
                  (json_int_t)walk.violations, "balances", walk.balances);
    if (topic) /* absent: every topic's */
      json_object_set_new(out, "topic", json_string(topic));
    json_dumpf(out, stdout, JSON_COMPACT | JSON_SORT_KEYS);
    putchar('\n');
    json_decref(out);
  } else {
    char total[48], held[48];
    printf("total\tkeys=%" PRIu64 "\tbalance=%s\torder_violations=%" PRIu64
           "%s%s\n",
           walk.keys, i128_text(walk.total, total, sizeof(total)),
           walk.violations, walk.held ? "\theld=" : "",
           walk.held ? i128_text(walk.held, held, sizeof(held)) : "");
  }
  return KL_EXIT_OK;
}

typedef struct ledger_args {
  const char *location;
  const char *topic;
  int json;
} ledger_args_t;

static const kl__opt_t ledger_opts[] = {
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(ledger_args_t, location),
     .required = "",
     .help = "LMDB directory or postgresql://... URI"},
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(ledger_args_t, topic),
     .help = "only TOPIC's entries, as its owners keep them (default: "
             "every topic's, summed per key)"},
    {.name = "json",
     .kind = KL__OPT_FLAG,
     .off = offsetof(ledger_args_t, json),
     .help = "one JSON object: keys, order_violations, balances (and "
             "topic with -t)"},
    {0}};

static const kl__cmd_t ledger_cmd = {
    .name = SUB,
    .usage = "--store STORE [-t TOPIC] [--json]",
    .about =
        "Prints KEY<TAB>BALANCE<TAB>LAST_SEQ per key of the ledger handler,\n"
        "sorted by key, then a totals line; read from one consistent "
        "snapshot\n"
        "of the topics' entries, also while workers run. Each topic keeps "
        "its\n"
        "own entry of a key. Without -t the line sums every topic's entry\n"
        "of the key in the store, and the entry an older keylane kept for\n"
        "the key without a topic once; LAST_SEQ is the largest of them.\n"
        "A key that holds the amount of a scheduled transfer not settled\n"
        "yet (a transfer with \"at\") prints a fourth column held=N, and\n"
        "\"held\" in --json; the totals line then sums them as held=N.\n"
        "With -t TOPIC only that topic's entries count (with what each "
        "took\n"
        "over from an older keylane's entry): one fleet's balances in a\n"
        "store that several topics share.\n"
        "A key's backslash, control bytes and bytes\n"
        "that are not UTF-8 print as \\\\ and \\xHH (in --json too). A "
        "store\n"
        "that does not exist is an error: this command never creates one.\n",
    .opts = ledger_opts,
    .examples = "  keylane ledger --store /var/lib/keylane\n"
                "  keylane ledger --store /var/lib/keylane -t payments\n"
                "  keylane ledger --store /var/lib/keylane --json | jq "
                ".order_violations\n"};

int kl__cmd_ledger(int argc, char **argv) {
  ledger_args_t a = {0};
  int first;
  int rc = kl__opts_parse(&ledger_cmd, argc, argv, &a, NULL, &first);
  if (rc >= 0)
    return rc;
  if (a.topic && kl__topic_check(a.topic, strlen(a.topic)))
    return kl__cli_usage(SUB, "-t %s: %s", a.topic, kl_err_detail());
  kl_store_t *store;
  if (kl__cli_store_existing(SUB, a.location, &store))
    return KL_EXIT_FAIL;
  /* A typo'd -t is an error naming the store's topics, not an empty
   * ledger read as "no balances" by a reconciliation. */
  rc = a.topic ? kl__cli_store_topic_known(SUB, store, a.location, a.topic)
               : KL_EXIT_OK;
  if (rc == KL_EXIT_OK)
    rc = ledger_print(store, a.topic, a.json);
  kl_store_destroy(store);
  return rc;
}
