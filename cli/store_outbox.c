/* keylane store outbox: the follow-ups a store holds committed and not yet
 * published (kl_txn_emit()), listed, and dropped by an operator. */
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/units.h"
#include "keylane/store.h"
#include "cli/store.h"
#include "cli/store_list.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "store/location.h"

#define SUB "store outbox"
#define KL_DROP_MAX 64

typedef struct kl_ob_args {
  const char *location, *topic;
  int64_t limit;
  int json, dry_run;
  kl__outbox_ack_t drop[KL_DROP_MAX];
  size_t ndrop;
} kl_ob_args_t;

/* --drop P:SEQ, once per follow-up; the field is the whole kl_ob_args_t.
 * Both numbers go through the one number parser (common/units.h), so that
 * a seq past INT64_MAX is refused, not wrapped. */
static kl_err_t ob_drop_arg(const kl__opt_t *opt, const char *arg,
                            void *field) {
  kl_ob_args_t *a = field;
  const char *colon = strchr(arg, ':');
  char part[16], what[96];
  int64_t p, seq;
  (void)opt;
  if (a->ndrop == KL_DROP_MAX)
    return kl__err(KL_EINVAL, "--drop is given more than %d times",
                   KL_DROP_MAX);
  size_t plen = colon ? (size_t)(colon - arg) : sizeof(part);
  if (plen >= sizeof(part))
    return kl__err(KL_EINVAL,
                   "--drop \"%.64s\": expected PARTITION:SEQ, as `keylane "
                   "store outbox` lists them (e.g. 3:1042)",
                   arg);
  memcpy(part, arg, plen);
  part[plen] = '\0';
  snprintf(what, sizeof(what), "the PARTITION of --drop %.48s", arg);
  if (kl__units_parse(what, part, KL__UNITS_COUNT, 0, INT32_MAX, &p))
    return KL_EINVAL;
  snprintf(what, sizeof(what), "the SEQ of --drop %.48s", arg);
  if (kl__units_parse(what, colon + 1, KL__UNITS_COUNT, 1, INT64_MAX, &seq))
    return KL_EINVAL;
  a->drop[a->ndrop++] = (kl__outbox_ack_t){(int32_t)p, (uint64_t)seq};
  return KL_OK;
}

static const kl__opt_t outbox_opts[] = {
    KL__STORE_LIST_TOPIC_OPT(kl_ob_args_t, "the source topic"),
    KL__STORE_OPT(kl_ob_args_t),
    KL__STORE_LIST_LIMIT_OPT(kl_ob_args_t, "1000",
                             "at most N follow-ups per partition"),
    {.name = "drop",
     .meta = "P:SEQ",
     .parse = ob_drop_arg,
     .help = "remove follow-up SEQ of partition P of TOPIC; repeatable"},
    {.name = "dry-run",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_ob_args_t, dry_run),
     .help = "with --drop: check and show what would be dropped; change "
             "nothing"},
    KL__STORE_LIST_JSON_OPT(kl_ob_args_t),
    {0}};

static const kl__cmd_t outbox_cmd = {
    .name = SUB,
    .usage = "--store STORE [-t TOPIC] [--limit N] [--json]\n"
             "--store STORE -t TOPIC --drop P:SEQ [--drop P:SEQ ...] "
             "[--dry-run] [--json]",
    .about =
        "Lists the follow-up events (kl_txn_emit(), exec \"emit\") the store\n"
        "holds committed and not yet acknowledged by Kafka: per source topic "
        "and\n"
        "partition, in commit order, with the destination, key, id, type and\n"
        "size. A running worker publishes them within a second; one that "
        "stays\n"
        "here is waiting for Kafka (the worker's log and\n"
        "keylane_worker_outbox_stalled_seconds say why). A follow-up Kafka\n"
        "refuses for good is set aside by the worker as a whole dead letter\n"
        "(reason outbox) and leaves the outbox by itself; one whose letter\n"
        "Kafka refuses too stays here (keylane_worker_outbox_kept, /healthz\n"
        "degraded) and is published again every 10 s, until the limits let\n"
        "it through or it is dropped.\n\n"
        "--drop removes follow-ups by source partition and seq, as listed: "
        "they\n"
        "are never published, so their effect (a transfer's credit) is "
        "lost.\n"
        "For a record the worker cannot even read; anything else is better\n"
        "fixed where Kafka refuses it. A worker that already listed it may "
        "still\n"
        "publish it: stop the partition's owner first.\n",
    .opts = outbox_opts,
    .notes = "Exit 0; 1 when the store fails, holds no partition of -t TOPIC "
             "(the error\nnames the topics it holds) or a follow-up to drop is "
             "not there (then\nnothing is dropped).\n",
    .examples =
        "  keylane store outbox --store /var/lib/keylane\n"
        "  keylane store outbox --store /var/lib/keylane -t events --drop "
        "3:1042 --dry-run\n"
        "  keylane store outbox --store /var/lib/keylane -t events --drop "
        "3:1042\n"};

static int ob_parse(int argc, char **argv, kl_ob_args_t *a) {
  int first;
  int rc = kl__opts_parse(&outbox_cmd, argc, argv, a, NULL, &first);
  if (rc < 0 && a->ndrop && !a->topic)
    return kl__cli_usage(SUB, "--drop needs -t TOPIC: seqs are per topic");
  return rc;
}

/* ---- listing ----------------------------------------------------------- */

typedef struct kl_ob_list {
  const char *topic;
  int32_t partition;
  json_t *rows;
  int bad; /* a record that does not decode */
} kl_ob_list_t;

static json_t *ob_text(const void *s, size_t len) {
  json_t *t = json_stringn(s, len);
  return t ? t : json_string("(not UTF-8)");
}

static int ob_row(void *opaque, uint64_t seq, const void *rec, size_t len) {
  kl_ob_list_t *l = opaque;
  kl__outbox_rec_t r;
  json_t *o;
  if (kl__outbox_rec_decode(rec, len, &r)) {
    l->bad = 1;
    o = json_pack("{sssIsIsssbsI}", "topic", l->topic, "partition",
                  (json_int_t)l->partition, "seq", (json_int_t)seq, "error",
                  "not a follow-up record", "damaged", 1, "bytes",
                  (json_int_t)len);
  } else {
    const kl_event_t *e = &r.event;
    o = json_pack(
        "{sssIsIsososososIsI}", "topic", l->topic, "partition",
        (json_int_t)l->partition, "seq", (json_int_t)seq, "destination",
        r.topic_len ? ob_text(r.topic, r.topic_len) : json_string(l->topic),
        "key", ob_text(e->key, e->key_len), "id", ob_text(e->id, e->id_len),
        "type", ob_text(e->type, e->type_len), "payload_bytes",
        (json_int_t)e->payload_len, "emitted_ms", (json_int_t)e->ts);
  }
  json_array_append_new(l->rows, o);
  return 0;
}

typedef struct kl_ob_walk {
  kl_store_t *store;
  const kl_ob_args_t *args;
  json_t *rows;
  int bad;
  kl_err_t err;
} kl_ob_walk_t;

static int sob_ob_part(void *opaque, const char *topic, int32_t partition,
                       const kl_partition_state_t *state) {
  kl_ob_walk_t *w = opaque;
  (void)state;
  if (w->args->topic && strcmp(w->args->topic, topic) != 0)
    return 0;
  kl_ob_list_t l = {topic, partition, w->rows, 0};
  w->err = kl__store_outbox_list(w->store, topic, partition, 0,
                                 (uint64_t)w->args->limit, ob_row, &l);
  w->bad |= l.bad;
  return w->err != KL_OK;
}

static const kl__store_col_t ob_cols[] = {
    {"TOPIC", "topic", -20, NULL, NULL, false},
    {"PART", "partition", 4, NULL, NULL, false},
    {"SEQ", "seq", 10, NULL, NULL, false},
    {"DESTINATION", "destination", -20, "(not a follow-up record)", NULL,
     false},
    {"KEY", "key", -24, NULL, NULL, false},
    {"ID", "id", 0, NULL, NULL, false},
    {0}};

static int ob_list_all(kl_store_t *store, const kl_ob_args_t *a) {
  kl_ob_walk_t w = {store, a, json_array(), 0, KL_OK};
  kl_err_t err = kl_store_foreach_partition(store, sob_ob_part, &w);
  if (!err)
    err = w.err;
  char shown[KL__LOCATION_MAX];
  kl__location_redact(a->location, shown, sizeof(shown));
  if (err) {
    json_decref(w.rows);
    return kl__cli_fail(SUB, "cannot read the outbox of %s: %s", shown,
                        kl_err_detail());
  }
  if (a->json)
    kl__store_list_json(
        json_pack("{sssO}", "store", shown, "follow_ups", w.rows));
  else
    kl__store_list_table(ob_cols, w.rows,
                         "the outbox is empty: every follow-up was published");
  json_decref(w.rows);
  return KL_EXIT_OK;
}

/* ---- dropping ---------------------------------------------------------- */

typedef struct kl_ob_find {
  uint64_t seq;
  int found;
} kl_ob_find_t;

static int ob_found(void *opaque, uint64_t seq, const void *rec, size_t len) {
  kl_ob_find_t *f = opaque;
  (void)rec, (void)len;
  f->found = seq == f->seq;
  return 1; /* listed from seq - 1 on: the first decides */
}

static int ob_drop(kl_store_t *store, const kl_ob_args_t *a) {
  char shown[KL__LOCATION_MAX];
  kl__location_redact(a->location, shown, sizeof(shown));
  for (size_t i = 0; i < a->ndrop; i++) {
    kl_ob_find_t f = {a->drop[i].seq, 0};
    kl_err_t err =
        a->drop[i].seq == 0
            ? KL_OK /* seqs start at 1 */
            : kl__store_outbox_list(store, a->topic, a->drop[i].partition,
                                    a->drop[i].seq - 1, 1, ob_found, &f);
    if (err)
      return kl__cli_fail(SUB, "cannot read the outbox of %s: %s", shown,
                          kl_err_detail());
    if (!f.found)
      return kl__cli_fail(SUB,
                          "no follow-up %" PRId32 ":%" PRIu64
                          " of topic %s in %s (published meanwhile, or a "
                          "typo?): nothing dropped; list them with keylane "
                          "store outbox",
                          a->drop[i].partition, a->drop[i].seq, a->topic,
                          shown);
  }
  if (!a->dry_run && kl__store_outbox_del(store, a->topic, a->drop, a->ndrop))
    return kl__cli_fail(SUB, "cannot drop from the outbox of %s: %s", shown,
                        kl_err_detail());
  json_t *list = a->json ? json_array() : NULL;
  for (size_t i = 0; i < a->ndrop; i++)
    if (list)
      json_array_append_new(list, json_pack("{sIsI}", "partition",
                                            (json_int_t)a->drop[i].partition,
                                            "seq", (json_int_t)a->drop[i].seq));
    else
      printf("%s follow-up %" PRId32 ":%" PRIu64
             " of topic %s: it %s be published\n",
             a->dry_run ? "would drop" : "dropped", a->drop[i].partition,
             a->drop[i].seq, a->topic, a->dry_run ? "would not" : "will not");
  if (list)
    kl__store_list_json(json_pack("{sssbso}", "topic", a->topic, "dry_run",
                                  a->dry_run, "dropped", list));
  if (a->dry_run)
    fprintf(stderr, "keylane %s: --dry-run: nothing was dropped\n", SUB);
  return KL_EXIT_OK;
}

static int ob_run(kl_store_t *store, const void *args) {
  const kl_ob_args_t *a = args;
  return a->ndrop ? ob_drop(store, a) : ob_list_all(store, a);
}

int kl__cmd_store_outbox(int argc, char **argv) {
  kl_ob_args_t a = {0};
  int rc = ob_parse(argc, argv, &a);
  return rc >= 0 ? rc
                 : kl__store_list_open(SUB, a.location, a.topic, ob_run, &a);
}
