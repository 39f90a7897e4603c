/* keylane store timers: the delayed events a store holds waiting for their
 * time (docs/design.md, "Timers"), per partition in due order, read from
 * one snapshot per partition. Nothing is written. */
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/units.h"
#include "keylane/event.h"
#include "keylane/store.h"
#include "cli/store.h"
#include "cli/store_timers_row.h"
#include "cli/store_list.h"
#include "store/store_internal.h"
#include "store/location.h"
#include "store/timers.h"

#define SUB "store timers"

typedef struct kl_tm_args {
  const char *location, *topic, *key;
  int64_t partition, limit;
  int json;
} kl_tm_args_t;

/* --partition N: the field is an int64_t, -1 (every partition) until
 * given, so that partition 0 can be asked for. */
static kl_err_t tm_partition_arg(const kl__opt_t *opt, const char *arg,
                                 void *field) {
  (void)opt;
  return kl__units_parse("--partition", arg, KL__UNITS_COUNT, 0, INT32_MAX,
                         field)
             ? KL_EINVAL
             : KL_OK;
}

static const kl__opt_t timers_opts[] = {
    KL__STORE_OPT(kl_tm_args_t),
    KL__STORE_LIST_TOPIC_OPT(kl_tm_args_t, "the topic whose timers to list"),
    {.name = "partition",
     .meta = "N",
     .shown = "every partition",
     .off = offsetof(kl_tm_args_t, partition),
     .parse = tm_partition_arg,
     .help = "only partition N"},
    {.name = "key",
     .kind = KL__OPT_STRING,
     .parse = kl__cli_key_parse,
     .meta = "KEY",
     .off = offsetof(kl_tm_args_t, key),
     .shown = "every key",
     .help = "only the timers of entity key KEY"},
    KL__STORE_LIST_LIMIT_OPT(kl_tm_args_t, "100",
                             "list at most N timers in all; the rest are "
                             "counted"),
    KL__STORE_LIST_JSON_OPT(kl_tm_args_t),
    {0}};

static const kl__cmd_t timers_cmd = {
    .name = SUB,
    .usage = "--store STORE [-t TOPIC] [--partition N] [--key KEY] "
             "[--limit N] [--json]",
    .about =
        "Lists the delayed events (not_before) the store holds as timers, "
        "per\n"
        "topic and partition in due order: the key, the id, when it is due "
        "(UTC,\n"
        "and ms since the Unix epoch), the offset of the record that "
        "scheduled it,\n"
        "and whether it is due now by this host's clock. The partition's "
        "owner\n"
        "runs a due timer within a second; one that stays due here waits "
        "for its\n"
        "owner (none is running, or it is behind). A handler cancels one "
        "with\n"
        "kl_txn_cancel().\n",
    .opts = timers_opts,
    .notes = "Exit 0; 1 when the store fails, holds no partition of -t TOPIC "
             "(the error\nnames the topics it holds), or no partition N of "
             "--partition (the error\nsays how many it holds).\n",
    .examples = "  keylane store timers --store /var/lib/keylane\n"
                "  keylane store timers --store /var/lib/keylane -t events "
                "--key acct-42 --json\n"};

typedef struct kl_tm_list {
  const kl_tm_args_t *args;
  kl_store_t *store;
  kl_decoder_t *decoder;
  const char *topic; /* of the partition being read */
  int32_t partition;
  int64_t now;
  json_t *rows, *parts;
  size_t pending; /* of the partition being read */
  uint64_t listed, more, bad;
  /* of the partitions of -t TOPIC (every topic): how many, the highest */
  size_t held;
  int32_t highest;
  bool found; /* --partition N is one of them */
  kl_err_t err;
} kl_tm_list_t;

static int tm_row(void *opaque, const kl__timer_t *t, const void *key,
                  size_t key_len, const void *env, size_t env_len) {
  kl_tm_list_t *l = opaque;
  const char *want = l->args->key;
  if (want && (strlen(want) != key_len || memcmp(want, key, key_len) != 0))
    return 0;
  l->pending++;
  if (l->listed >= (uint64_t)l->args->limit) {
    l->more++;
    return 0;
  }
  bool malformed = false;
  json_t *row =
      kl__store_timers_row(l->decoder, l->topic, l->partition, t, key, key_len,
                           env, env_len, l->now, false, &malformed);
  l->bad += malformed; /* its owner dead-letters it when it fires */
  json_array_append_new(l->rows, row);
  l->listed++;
  return 0;
}

static int tm_part(void *opaque, const char *topic, int32_t partition,
                   const kl_partition_state_t *state) {
  kl_tm_list_t *l = opaque;
  (void)state;
  if (l->args->topic && strcmp(l->args->topic, topic) != 0)
    return 0;
  l->held++;
  l->highest = partition > l->highest ? partition : l->highest;
  if (l->args->partition >= 0 && l->args->partition != partition)
    return 0;
  l->found = true;
  l->topic = topic;
  l->partition = partition;
  l->pending = 0;
  size_t bad = 0;
  l->err = kl__timers_scan(l->store, topic, partition, tm_row, l, &bad);
  l->bad += bad;
  json_array_append_new(l->parts, json_pack("{sssIsI}", "topic", topic,
                                            "partition", (json_int_t)partition,
                                            "pending", (json_int_t)l->pending));
  return l->err != KL_OK;
}

static const kl__store_col_t tm_cols[] = {
    {"TOPIC", "topic", -20, NULL, NULL, false},
    {"PART", "partition", 4, NULL, NULL, false},
    {"DUE", "due", -24, NULL, NULL, false},
    {"KEY", "key_escaped", -20, NULL, NULL, true},
    {"ID", "id_escaped", -24, "(not an event)", NULL, true},
    {"OFFSET", "offset", 10, NULL, NULL, false},
    {"NOW", "due_now", 0, "-", "due", false},
    {0}};

static void tm_print(const kl_tm_list_t *l) {
  kl__store_list_table(tm_cols, l->rows,
                       l->args->key ? "no timer waits for that key"
                                    : "no timer waits");
  if (l->more)
    printf("... and %" PRIu64 " more (raise --limit, or narrow with -t, "
           "--partition or --key)\n",
           l->more);
}

/* --partition N of no partition the store holds (of -t TOPIC): an error
 * saying how many it holds, as `store reset -p` says, not "no timer
 * waits". */
static int tm_no_partition(const kl_tm_list_t *l, const char *shown) {
  const kl_tm_args_t *a = l->args;
  char topic[300];
  snprintf(topic, sizeof(topic), "%s%s", a->topic ? "topic " : "any topic",
           a->topic ? a->topic : "");
  if (!l->held)
    return kl__cli_fail(SUB, "the store %s has no partition of %s", shown,
                        topic);
  return kl__cli_fail(
      SUB,
      "the store %s has no partition %" PRId64 " of %s: it "
      "has %zu partition%s, the highest %" PRId32 "; check --partition",
      shown, a->partition, topic, l->held, l->held == 1 ? "" : "s", l->highest);
}

static int tm_run(kl_store_t *store, const void *args) {
  const kl_tm_args_t *a = args;
  kl_tm_list_t l = {.args = a,
                    .highest = -1,
                    .store = store,
                    .decoder = kl_decoder_new(),
                    .now = kl__now_ms(),
                    .rows = json_array(),
                    .parts = json_array()};
  kl_err_t err = l.decoder ? kl_store_foreach_partition(store, tm_part, &l)
                           : kl__err(KL_ENOMEM, "out of memory");
  if (!err)
    err = l.err;
  kl_decoder_destroy(l.decoder);
  char shown[KL__LOCATION_MAX];
  kl__location_redact(a->location, shown, sizeof(shown));
  int rc = KL_EXIT_OK;
  if (err) {
    rc = kl__cli_fail(SUB, "cannot read the timers of %s: %s", shown,
                      kl_err_detail());
  } else if (a->partition >= 0 && !l.found) {
    rc = tm_no_partition(&l, shown);
  } else if (a->json) {
    kl__store_list_json(json_pack(
        "{sssIsOsOsI}", "store", shown, "now_ms", (json_int_t)l.now,
        "partitions", l.parts, "timers", l.rows, "more", (json_int_t)l.more));
  } else {
    tm_print(&l);
  }
  if (!rc && l.bad)
    fprintf(stderr,
            "keylane %s: %" PRIu64 " timer records are malformed (shown "
            "without an id, or skipped)\n",
            SUB, l.bad);
  json_decref(l.rows);
  json_decref(l.parts);
  return rc;
}

int kl__cmd_store_timers(int argc, char **argv) {
  kl_tm_args_t a = {.partition = -1};
  int first;
  int rc = kl__opts_parse(&timers_cmd, argc, argv, &a, NULL, &first);
  return rc >= 0 ? rc
                 : kl__store_list_open(SUB, a.location, a.topic, tm_run, &a);
}
