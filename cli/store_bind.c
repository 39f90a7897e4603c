/* keylane store bind: records a topic's owner, the Kafka cluster and the
 * consumer group of its fleet, for a fleet moved on purpose (a new cluster
 * after a disaster, a renamed group); a worker of another cluster or group
 * stops the topic's partitions (cluster_mismatch, group_mismatch). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/store.h"
#include "common/kafka_pos.h"
#include "store/store_internal.h"
#include "worker/checks.h"

#define SUB "store bind"
#define KL_BIND_TIMEOUT_MS 10000

typedef struct kl_bind_args {
  const char *topic, *group, *location;
  int json, dry_run;
} kl_bind_args_t;

static const kl__opt_t bind_opts[] = {
    KL__OPT_BOOTSTRAP("the cluster whose id is recorded"),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl_bind_args_t, topic),
     .required = "",
     .help = "the topic"},
    {.name = "group",
     .letter = 'g',
     .kind = KL__OPT_STRING,
     .meta = "GROUP",
     .off = offsetof(kl_bind_args_t, group),
     .required = "the fleet's worker.group",
     .help = "the fleet's consumer group (its workers' -g, worker.group)"},
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(kl_bind_args_t, location),
     .required = "",
     .help = "LMDB directory or postgresql://... URI of an existing store "
             "(none is created)"},
    {.name = "dry-run",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_bind_args_t, dry_run),
     .help = "print the recorded and the new owner; record nothing"},
    {.name = "json",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_bind_args_t, json),
     .help = "one JSON object: {\"topic\", \"dry_run\", \"recorded\", "
             "\"owner\"}, each owner {\"cluster\", \"group\"} or null"},
    {0}};

static const kl__cmd_t bind_cmd = {
    .name = SUB,
    .usage = "-b BOOTSTRAP -t TOPIC -g GROUP --store STORE [--json] "
             "[--dry-run] [options]",
    .about =
        "Records the owner of TOPIC in the store: the id of the Kafka "
        "cluster\n"
        "BOOTSTRAP belongs to, and GROUP. The first worker that takes a\n"
        "partition of the topic records its own; from then on a worker of\n"
        "another cluster (a wrong -b, with the same topic name) or another\n"
        "group (a typo'd -g) takes none of its partitions: it stops them\n"
        "(cluster_mismatch, group_mismatch) and exits 3, fencing nobody.\n\n"
        "Run this when the fleet moved on purpose: to a new cluster after a\n"
        "disaster (its log must hold what the store applied: a mirrored\n"
        "topic; else reset the partitions with `keylane store reset`), or "
        "to a\n"
        "renamed group. Stop the old fleet first: its workers keep their\n"
        "partitions until they restart. No epoch moves; the workers of the\n"
        "new owner take the partitions at their next start.\n",
    .opts = bind_opts,
    .notes = "Exit 0 when the owner is recorded (or already was); 1 when "
             "the store\nknows nothing of TOPIC, the cluster does not say "
             "its id, or the store\nfails.\n",
    .examples = "  keylane store bind -b kafka-dr:9092 -t events -g ledger "
                "--store /var/lib/keylane --dry-run\n"
                "  keylane store bind -b kafka-dr:9092 -t events -g ledger "
                "--store /var/lib/keylane\n",
    .conf = true};

static json_t *owner_json(const kl__store_owner_t *o) {
  return o ? json_pack("{ssss}", "cluster", o->cluster, "group", o->group)
           : json_null();
}

static void bind_print(const kl_bind_args_t *a, const kl__store_owner_t *was,
                       const kl__store_owner_t *now) {
  if (a->json) {
    json_t *out =
        json_pack("{sssbsoso}", "topic", a->topic, "dry_run", a->dry_run,
                  "recorded", owner_json(was), "owner", owner_json(now));
    json_dumpf(out, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(out);
    return;
  }
  if (was)
    printf("topic %s: recorded owner: cluster %s, group %s\n", a->topic,
           was->cluster, was->group);
  else
    printf("topic %s: recorded owner: none\n", a->topic);
  printf("topic %s: %s: cluster %s, group %s%s\n", a->topic,
         a->dry_run ? "new owner" : "owner now", now->cluster, now->group,
         was && kl__store_owner_equal(was, now) ? " (unchanged)" : "");
}

static int bind_run(kl_store_t *store, const kl_conf_t *conf,
                    const kl_bind_args_t *a) {
  int rc = kl__cli_store_topic_known(SUB, store, a->location, a->topic);
  if (rc)
    return rc;
  kl__store_owner_t was, now;
  kl_err_t err = kl__store_owner(store, a->topic, &was);
  if (err && err != KL_ENOTFOUND)
    return kl__cli_fail(SUB, "%s", kl_err_detail());
  int has = err == KL_OK;
  rd_kafka_t *rk;
  if (kl__kafka_reader_new(conf, "keylane-store-bind", "earliest", &rk))
    return kl__cli_fail(SUB, "%s", kl_err_detail());
  err = kl__checks_kafka_owner(rk, a->group, KL_BIND_TIMEOUT_MS, &now);
  rd_kafka_destroy(rk);
  if (err)
    return kl__cli_fail(SUB, "%s; nothing was recorded: check -b and -g",
                        kl_err_detail());
  if (!a->dry_run && kl__store_bind(store, a->topic, &now))
    return kl__cli_fail(SUB, "%s", kl_err_detail());
  bind_print(a, has ? &was : NULL, &now);
  if (a->dry_run)
    fprintf(stderr, "keylane %s: --dry-run: nothing was recorded\n", SUB);
  return KL_EXIT_OK;
}

int kl__cmd_store_bind(int argc, char **argv) {
  kl_bind_args_t a = {0};
  kl_conf_t *conf = kl_conf_new();
  int first;
  int rc = conf ? kl__opts_parse(&bind_cmd, argc, argv, &a, conf, &first)
                : kl__cli_fail(SUB, "out of memory");
  kl_store_t *store;
  if (rc < 0 && !(rc = kl__cli_store_existing(SUB, a.location, &store))) {
    rc = bind_run(store, conf, &a);
    kl_store_destroy(store);
  }
  kl_conf_destroy(conf);
  return rc;
}
