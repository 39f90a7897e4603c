/* keylane store reset: a partition whose log went backwards starts again
 * from the log's beginning (worker/log_guard.h stops it until then). */
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/kafka_pos.h"
#include "common/strbuf.h"
#include "keylane/store.h"
#include "cli/store.h"
#include "store/store_internal.h"
#include "store/location.h"
#include "worker/checks.h"

#define SUB "store reset"

typedef struct kl_reset_args {
  const char *topic, *partitions, *location, *group;
  int json, dry_run;
  kl_conf_t *conf;
} kl_reset_args_t;

static const kl__opt_t reset_opts[] = {
    KL__OPT_BOOTSTRAP(NULL),
    {.name = "group",
     .letter = 'g',
     .kind = KL__OPT_STRING,
     .meta = "GROUP",
     .off = offsetof(kl_reset_args_t, group),
     .help = "with -b: record BOOTSTRAP's cluster and GROUP as the topic's "
             "owner (as `keylane store bind` does), for a log that moved to "
             "another cluster or group"},
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl_reset_args_t, topic),
     .required = "",
     .help = "the topic"},
    {.name = "partition",
     .letter = 'p',
     .kind = KL__OPT_LIST,
     .meta = "PARTITIONS",
     .off = offsetof(kl_reset_args_t, partitions),
     .required = "0,2,5-7, or all",
     .help = "partitions: 0,2,5-7, or all (every partition of TOPIC the "
             "store knows)"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(kl_reset_args_t, location),
     .required = "",
     .help = "LMDB directory or postgresql://... URI of an existing store "
             "(none is created)"},
    {.name = "dry-run",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_reset_args_t, dry_run),
     .help = "check the partitions and show what a reset would change; "
             "change nothing (no epoch is taken: no owner is fenced)"},
    {.name = "json",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_reset_args_t, json),
     .help = "one JSON object"},
    {0}};

static const kl__cmd_t reset_cmd = {
    .name = SUB,
    .about =
        "Starts partitions of TOPIC again from the beginning of their log, "
        "for\n"
        "a log that went backwards: a topic deleted and created again, a\n"
        "truncated log, a store restored next to another cluster. A worker\n"
        "stops such a partition (ERROR \"went backwards\", /healthz 503,\n"
        "keylane_worker_partition_stopped) rather than take the new records\n"
        "for ones it applied; this is the operator's word that the new log "
        "is\n"
        "the one to apply.\n\n"
        "Each partition gets a new owner epoch, so a worker that still owns "
        "it\n"
        "is fenced, and its watermark is set to 0: its next owner reads the "
        "log\n"
        "from its earliest retained offset. A running worker that stopped "
        "the\n"
        "partition sees the reset within a second and starts it again "
        "itself.\n"
        "The idempotency keys, the handlers' state and the counters stay: "
        "an\n"
        "event the store applied before is still skipped by its id.\n"
        "With -b and -g, the reset also records BOOTSTRAP's cluster and "
        "GROUP\n"
        "as the topic's owner: the new log's workers may take it then.\n",
    .conf = true,
    .opts = reset_opts,
    .notes =
        "Exit 0 when every partition was reset; 1 when one is unknown to the\n"
        "store (nothing is reset then) or the store fails.\n",
    .examples =
        "  keylane store reset -t events -p 3 --store /var/lib/keylane "
        "--dry-run\n"
        "  keylane store reset -t events -p 3 --store /var/lib/keylane\n"
        "  keylane store reset -t events -p all --store "
        "postgresql://kl@db/kl --json\n"};

/* The partitions of one topic the store knows, as a bitmap by number. */
typedef struct kl_known {
  const char *topic;
  unsigned char *has;
  int32_t count; /* highest known + 1 */
  int oom;
} kl_known_t;

static int known_cb(void *opaque, const char *topic, int32_t partition,
                    const kl_partition_state_t *state) {
  kl_known_t *k = opaque;
  (void)state;
  if (strcmp(topic, k->topic) != 0)
    return 0;
  if (partition >= k->count) {
    unsigned char *has =
        kl__grow_zeroed(k->has, (size_t)k->count, (size_t)partition + 1, 1);
    if (!has)
      return k->oom = 1;
    k->has = has;
    k->count = partition + 1;
  }
  k->has[partition] = 1;
  return 0;
}

/* Resolves -p against what the store knows; every listed partition must
 * be known, so that a typo resets nothing. @returns 0, or an exit code. */
static int reset_targets(kl_store_t *store, const kl_reset_args_t *a,
                         int32_t **parts, size_t *n) {
  kl_known_t known = {a->topic, NULL, 0, 0};
  if (kl_store_foreach_partition(store, known_cb, &known) || known.oom) {
    free(known.has);
    return kl__cli_fail(SUB, "cannot list the store's partitions: %s",
                        known.oom ? "out of memory" : kl_err_detail());
  }
  int rc = 0;
  if (!known.count) { /* a typo of -t, or of --store: say what it holds */
    rc = kl__cli_store_topic_known(SUB, store, a->location, a->topic);
    if (!rc)
      rc = kl__cli_fail(SUB,
                        "topic %s appeared in the store while it was read: "
                        "nothing was reset; run it again",
                        a->topic);
  } else if (kl__pos_partitions(a->partitions, known.count, parts, n))
    rc = kl__cli_usage(
        SUB, "-p %s: %s (the store knows partitions 0..%" PRId32 " of %s)",
        a->partitions, kl_err_detail(), known.count - 1, a->topic);
  for (size_t i = 0; !rc && i < *n; i++) {
    if (known.has[(*parts)[i]])
      continue;
    if (strcmp(a->partitions, "all") == 0) { /* only the known ones */
      memmove(*parts + i, *parts + i + 1, (*n - i - 1) * sizeof(**parts));
      (*n)--, i--;
      continue;
    }
    rc = kl__cli_fail(SUB,
                      "the store has no state for topic %s partition %" PRId32
                      ": nothing was reset; leave it out of -p",
                      a->topic, (*parts)[i]);
    free(*parts);
  }
  free(known.has);
  return rc;
}

static void reset_print(const char *topic, int32_t p, int dry_run,
                        const kl_partition_state_t *before,
                        const kl_partition_state_t *after, json_t *list) {
  if (list) {
    json_array_append_new(
        list,
        json_pack("{sisIsIsIsI}", "partition", (int)p, "epoch_before",
                  (json_int_t)before->epoch, "epoch", (json_int_t)after->epoch,
                  "watermark_before", (json_int_t)before->watermark,
                  "watermark", (json_int_t)after->watermark));
    return;
  }
  printf("%stopic %s partition %" PRId32 ": watermark %" PRId64 " -> %" PRId64
         ", epoch %" PRIu64 " -> %" PRIu64 " (an owner of epoch %" PRIu64
         " %s fenced); its next owner %s at the log's beginning, and the "
         "%" PRIu64 " events applied so far stay recorded by their ids\n",
         dry_run ? "would reset " : "", topic, p, before->watermark,
         after->watermark, before->epoch, after->epoch, before->epoch,
         dry_run ? "would be" : "is", dry_run ? "would start" : "starts",
         after->applied);
}

static int reset_run(kl_store_t *store, const kl_reset_args_t *a) {
  int32_t *parts = NULL;
  size_t n = 0;
  int rc = reset_targets(store, a, &parts, &n);
  if (rc)
    return rc;
  json_t *list = a->json ? json_array() : NULL;
  for (size_t i = 0; i < n && !rc; i++) {
    kl_partition_state_t before, after;
    if (kl_store_partition(store, a->topic, parts[i], &before) ||
        (!a->dry_run && kl__store_reset(store, a->topic, parts[i], &after))) {
      rc = kl__cli_fail(SUB, "partition %" PRId32 ": %s", parts[i],
                        kl_err_detail());
      break;
    }
    if (a->dry_run) { /* what kl__store_reset() does: a new epoch, 0 */
      after = before;
      after.epoch = before.epoch + 1;
      after.watermark = 0;
    }
    reset_print(a->topic, parts[i], a->dry_run, &before, &after, list);
  }
  if (a->dry_run && !rc)
    fprintf(stderr, "keylane %s: --dry-run: nothing was reset\n", SUB);
  if (list && !rc) {
    json_t *out = json_pack("{sssbso}", "topic", a->topic, "dry_run",
                            a->dry_run, "reset", list);
    json_dumpf(out, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(out);
  } else {
    json_decref(list);
  }
  free(parts);
  return rc;
}

/* -b and -g: the owner the reset records, read before anything is reset
 * (a cluster that does not answer resets nothing). @returns 0, or an exit
 * code. */
static int reset_owner(const kl_reset_args_t *a, kl__store_owner_t *owner,
                       int *has) {
  const char *boot = kl_conf_get(a->conf, "kafka.bootstrap.servers");
  *has = 0;
  if (!boot && !a->group)
    return 0;
  if (!boot || !a->group)
    return kl__cli_usage(SUB, "-b and -g go together: they name the owner "
                              "the reset records; give both, or neither");
  rd_kafka_t *rk;
  kl_err_t err =
      kl__kafka_reader_new(a->conf, "keylane-store-reset", "earliest", &rk);
  if (!err) {
    err = kl__checks_kafka_owner(rk, a->group, 10000, owner);
    rd_kafka_destroy(rk);
  }
  if (err)
    return kl__cli_fail(SUB, "%s; nothing was reset: check -b and -g",
                        kl_err_detail());
  *has = 1;
  return 0;
}

int kl__cmd_store_reset(int argc, char **argv) {
  kl_reset_args_t a = {.conf = kl_conf_new()};
  int first, has = 0;
  kl__store_owner_t owner;
  int rc = a.conf ? kl__opts_parse(&reset_cmd, argc, argv, &a, a.conf, &first)
                  : kl__cli_fail(SUB, "out of memory");
  if (rc >= 0) { /* --help, or a usage error */
    kl_conf_destroy(a.conf);
    return rc;
  }
  rc = reset_owner(&a, &owner, &has);
  kl_store_t *store; /* a reset changes a store: it never starts one */
  if (!rc && !(rc = kl__cli_store_existing(SUB, a.location, &store))) {
    rc = reset_run(store, &a);
    if (!rc && has && !a.dry_run && kl__store_bind(store, a.topic, &owner))
      rc = kl__cli_fail(SUB,
                        "the partitions were reset, but the owner "
                        "was not recorded: %s; run `keylane store "
                        "bind`",
                        kl_err_detail());
    else if (!rc && has && !a.json)
      printf("topic %s: %s owner: cluster %s, group %s\n", a.topic,
             a.dry_run ? "would record" : "recorded", owner.cluster,
             owner.group);
    kl_store_destroy(store);
  }
  kl_conf_destroy(a.conf);
  return rc;
}
