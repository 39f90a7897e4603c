/*
 * keylane store stats | keys | get: what a store holds, read from
 * consistent snapshots, also while workers commit. Nothing is written.
 */
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/json_msgpack.h"
#include "common/strbuf.h"
#include "keylane/store.h"
#include "cli/store.h"
#include "handlers/ledger.h"
#include "store/store_internal.h"
#include "store/location.h"
#include "store/timers.h"

static void inspect_iso(int64_t ms, char *buf, size_t size) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void inspect_bytes(uint64_t n, char *buf, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0]))
    v /= 1024, u++;
  snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* A JSON string of bytes when they are UTF-8 without control bytes, else
 * NULL (the caller shows base64). */
static json_t *text_or_null(const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++)
    if (p[i] < 0x20 || p[i] == 0x7f)
      return NULL;
  return json_stringn(data, len);
}

static json_t *inspect_b64(const void *data, size_t len) {
  char *text = malloc(kl__base64_encoded_len(len) + 1);
  if (!text)
    return NULL;
  kl__base64_encode(data, len, text);
  json_t *s = json_string(text);
  free(text);
  return s;
}

/* ---- stats ------------------------------------------------------------ */

typedef struct kl_stats {
  kl_store_t *store;
  const char *topic; /* NULL: all */
  json_t *parts;
  uint64_t ids, applied, dead, data_keys;
  int64_t oldest, newest;
  int ids_walked;
} kl_stats_t;

static int stats_timer(void *opaque, const kl__timer_t *t, const void *key,
                       size_t key_len, const void *env, size_t env_len) {
  (void)t, (void)key, (void)key_len, (void)env, (void)env_len;
  (*(uint64_t *)opaque)++;
  return 0;
}

static int stats_part(void *opaque, const char *topic, int32_t partition,
                      const kl_partition_state_t *st) {
  kl_stats_t *s = opaque;
  if (s->topic && strcmp(s->topic, topic) != 0)
    return 0;
  /* One walk of the partition's due index, as the whole store is walked
   * for its keys below. */
  uint64_t timers = 0;
  kl_err_t err =
      kl__timers_scan(s->store, topic, partition, stats_timer, &timers, NULL);
  json_array_append_new(
      s->parts,
      json_pack("{sssIsIsIsIsIsIsI}", "topic", topic, "partition",
                (json_int_t)partition, "epoch", (json_int_t)st->epoch,
                "watermark", (json_int_t)st->watermark, "applied",
                (json_int_t)st->applied, "duplicates",
                (json_int_t)st->duplicates, "dead_letters",
                (json_int_t)st->dead_letters, "timers", (json_int_t)timers));
  return err != KL_OK;
}

static int stats_id(void *opaque, const char *topic, const void *key,
                    size_t key_len, const char *id, size_t id_len,
                    int64_t time_ms, kl_mark_t mark) {
  kl_stats_t *s = opaque;
  (void)key, (void)key_len, (void)id, (void)id_len;
  if (s->topic && strcmp(s->topic, topic) != 0)
    return 0;
  if (s->ids == 0 || time_ms < s->oldest)
    s->oldest = time_ms;
  if (s->ids == 0 || time_ms > s->newest)
    s->newest = time_ms;
  s->ids++;
  s->applied += mark == KL_MARK_APPLIED;
  s->dead += mark == KL_MARK_DEAD_LETTER;
  return 0;
}

static int stats_key(void *opaque, const void *key, size_t key_len,
                     const void *val, size_t val_len) {
  /* keylane's own records (its timers) are counted per partition */
  if (!key_len || *(const char *)key != KL__STORE_OWN)
    ((kl_stats_t *)opaque)->data_keys++;
  return 0;
}

static json_t *stats_size(kl_store_t *store, const char *location) {
  kl__store_usage_t u;
  if (kl__store_lmdb_usage(store, &u) != KL_OK)
    return json_null(); /* PostgreSQL: ask the database */
  char path[4200];
  struct stat st;
  snprintf(path, sizeof(path), "%s/data.mdb", location);
  int have = stat(path, &st) == 0;
  return json_pack("{sIsIsIsI}", "disk_bytes",
                   (json_int_t)(have ? (uint64_t)st.st_blocks * 512 : 0),
                   "file_bytes", (json_int_t)(have ? st.st_size : 0),
                   "used_bytes", (json_int_t)(u.file_pages * u.page_size),
                   "map_bytes", (json_int_t)u.map_size);
}

static json_t *stats_ids(const kl_stats_t *s) {
  if (!s->ids_walked)
    return json_pack("{sIsnsnsnsn}", "count", (json_int_t)s->ids, "applied",
                     "dead_letters", "oldest_ms", "newest_ms");
  int64_t now = kl__now_ms();
  json_t *o =
      json_pack("{sIsIsI}", "count", (json_int_t)s->ids, "applied",
                (json_int_t)s->applied, "dead_letters", (json_int_t)s->dead);
  json_object_set_new(o, "oldest_ms",
                      s->ids ? json_integer(s->oldest) : json_null());
  json_object_set_new(o, "newest_ms",
                      s->ids ? json_integer(s->newest) : json_null());
  json_object_set_new(o, "oldest_age_s",
                      s->ids ? json_integer((now - s->oldest) / 1000)
                             : json_null());
  return o;
}

static void stats_text(const char *location, const char *backend,
                       const json_t *size, const kl_stats_t *s) {
  printf("store %s (%s)\n", location, backend);
  if (json_is_object(size)) {
    char disk[32], used[32], map[32];
    inspect_bytes(
        (uint64_t)json_integer_value(json_object_get(size, "disk_bytes")), disk,
        sizeof(disk));
    inspect_bytes(
        (uint64_t)json_integer_value(json_object_get(size, "used_bytes")), used,
        sizeof(used));
    inspect_bytes(
        (uint64_t)json_integer_value(json_object_get(size, "map_bytes")), map,
        sizeof(map));
    printf("size: %s on disk, %s in use, map %s\n", disk, used, map);
  }
  printf("handler keys: %" PRIu64 "\n", s->data_keys);
  printf("idempotency keys: %" PRIu64, s->ids);
  if (s->ids_walked && s->ids) {
    char oldest[32], newest[32];
    int64_t now = kl__now_ms();
    inspect_iso(s->oldest, oldest, sizeof(oldest));
    inspect_iso(s->newest, newest, sizeof(newest));
    printf(" (applied %" PRIu64 ", dead letters %" PRIu64
           "); oldest %s (%" PRId64 " s ago), newest %s (%" PRId64 " s ago)",
           s->applied, s->dead, oldest, (now - s->oldest) / 1000, newest,
           (now - s->newest) / 1000);
  }
  printf("\n\n%-20s %9s %7s %10s %9s %10s %12s %8s\n", "topic", "partition",
         "epoch", "watermark", "applied", "duplicates", "dead_letters",
         "timers");
  size_t i;
  json_t *p;
  json_array_foreach(s->parts, i, p) {
    printf("%-20s %9" JSON_INTEGER_FORMAT " %7" JSON_INTEGER_FORMAT
           " %10" JSON_INTEGER_FORMAT " %9" JSON_INTEGER_FORMAT
           " %10" JSON_INTEGER_FORMAT " %12" JSON_INTEGER_FORMAT
           " %8" JSON_INTEGER_FORMAT "\n",
           json_string_value(json_object_get(p, "topic")),
           json_integer_value(json_object_get(p, "partition")),
           json_integer_value(json_object_get(p, "epoch")),
           json_integer_value(json_object_get(p, "watermark")),
           json_integer_value(json_object_get(p, "applied")),
           json_integer_value(json_object_get(p, "duplicates")),
           json_integer_value(json_object_get(p, "dead_letters")),
           json_integer_value(json_object_get(p, "timers")));
  }
}

/* The owner each topic of @p parts has recorded (kl__store_owner()):
 * [{"topic", "cluster", "group"}], null for a topic without one. */
static json_t *stats_owners(kl_store_t *store, const json_t *parts) {
  json_t *owners = json_array();
  const char *last = "";
  size_t i;
  json_t *p;
  json_array_foreach(parts, i, p) { /* in topic order: one each */
    const char *topic = json_string_value(json_object_get(p, "topic"));
    if (strcmp(topic, last) == 0)
      continue;
    last = topic;
    kl__store_owner_t o;
    int has = kl__store_owner(store, topic, &o) == KL_OK;
    json_array_append_new(owners, json_pack("{ssss?ss?}", "topic", topic,
                                            "cluster", has ? o.cluster : NULL,
                                            "group", has ? o.group : NULL));
  }
  return owners;
}

static void stats_owners_text(const json_t *owners) {
  size_t i;
  json_t *o;
  json_array_foreach(owners, i, o) {
    const char *cluster = json_string_value(json_object_get(o, "cluster"));
    const char *group = json_string_value(json_object_get(o, "group"));
    printf("owner of topic %s: ",
           json_string_value(json_object_get(o, "topic")));
    /* Escaped: a group is any text `store bind -g` was given, and a
     * newline in it must not print a line of its own. */
    char c[KL__ESCAPED_SIZE(KL__OWNER_CLUSTER_MAX)],
        g[KL__ESCAPED_SIZE(KL__OWNER_GROUP_MAX)];
    if (cluster)
      printf("Kafka cluster %s, group %s\n",
             kl__escape(c, sizeof(c), cluster, strlen(cluster)),
             kl__escape(g, sizeof(g), group, strlen(group)));
    else
      printf("none recorded (its next worker records its own)\n");
  }
}

static kl_err_t stats_collect(kl_store_t *store, kl_stats_t *s) {
  kl_err_t err = kl_store_foreach_partition(store, stats_part, s);
  if (!err)
    err = kl_store_scan(store, NULL, 0, stats_key, s);
  if (err)
    return err;
  if (kl__store_ids_walk(store, stats_id, s) == KL_OK) {
    s->ids_walked = 1;
    return KL_OK;
  }
  s->ids = s->applied = s->dead = 0; /* the backend cannot walk: count */
  return kl_store_id_count(store, &s->ids);
}

static int stats_run(const char *location, const char *topic, int json) {
  kl_store_t *store;
  char shown[KL__LOCATION_MAX];
  kl__location_redact(location, shown, sizeof(shown));
  int rc = kl__cli_store_existing("store stats", location, &store);
  if (rc)
    return rc;
  if (topic &&
      (rc = kl__cli_store_topic_known("store stats", store, location, topic))) {
    kl_store_destroy(store);
    return rc;
  }
  kl_stats_t s = {.store = store, .topic = topic, .parts = json_array()};
  kl_err_t err = stats_collect(store, &s);
  if (err) {
    rc = kl__cli_fail("store stats", "cannot read the store %s: %s", shown,
                      kl_err_detail());
  } else {
    const char *backend = kl__location_is_pg(location) ? "postgresql" : "lmdb";
    json_t *size = stats_size(store, location);
    json_t *owners = stats_owners(store, s.parts);
    if (json) {
      json_t *o = json_pack(
          "{sssssOsIsosOso}", "store", shown, "backend", backend, "size", size,
          "handler_keys", (json_int_t)s.data_keys, "ids", stats_ids(&s),
          "owners", owners, "partitions", json_incref(s.parts));
      json_dumpf(o, stdout, JSON_COMPACT);
      putchar('\n');
      json_decref(o);
    } else {
      stats_text(shown, backend, size, &s);
      stats_owners_text(owners);
    }
    json_decref(owners);
    json_decref(size);
  }
  json_decref(s.parts);
  kl_store_destroy(store);
  return rc;
}

/* ---- keys ------------------------------------------------------------- */

typedef struct kl_keys {
  int json;
  uint64_t limit, shown;
  int own; /* list keylane's own records too: --prefix asked for them */
} kl_keys_t;

static int keys_row(void *opaque, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  kl_keys_t *k = opaque;
  if (k->limit && k->shown >= k->limit)
    return 1;
  if (!k->own && key_len && *(const char *)key == KL__STORE_OWN)
    return 0; /* its timers: `keylane store timers` lists them */
  k->shown++;
  json_t *text = text_or_null(key, key_len);
  if (k->json) {
    json_t *o = json_pack("{soso}", text ? "key" : "key_b64",
                          text ? text : inspect_b64(key, key_len), "value_len",
                          json_integer((json_int_t)val_len));
    json_dumpf(o, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(o);
    return 0;
  }
  if (text) {
    fwrite(key, 1, key_len, stdout);
    putchar('\n');
  } else {
    json_t *b = inspect_b64(key, key_len);
    printf("b64:%s\n", json_string_value(b));
    json_decref(b);
  }
  json_decref(text);
  return 0;
}

static int keys_run(const char *location, const char *prefix, uint64_t limit,
                    int json) {
  kl_store_t *store;
  int rc = kl__cli_store_existing("store keys", location, &store);
  char shown[KL__LOCATION_MAX];
  kl__location_redact(location, shown, sizeof(shown));
  if (rc)
    return rc;
  kl_keys_t k = {json, limit, 0, prefix && *prefix == KL__STORE_OWN};
  if (kl_store_scan(store, prefix, prefix ? strlen(prefix) : 0, keys_row, &k))
    rc = kl__cli_fail("store keys", "cannot read the store %s: %s", shown,
                      kl_err_detail());
  kl_store_destroy(store);
  return rc;
}

/* ---- get -------------------------------------------------------------- */

typedef struct kl_get {
  const char *key;
  size_t key_len;
  json_t *out;  /* the record found */
  size_t found; /* --id: the entity keys that hold the id */
} kl_get_t;

json_t *kl__store_inspect_value_json(const void *key, size_t key_len,
                                     const void *val, size_t val_len) {
  json_t *o =
      json_pack("{sosIso}", "key", json_stringn(key, key_len), "value_len",
                (json_int_t)val_len, "value_b64", inspect_b64(val, val_len));
  size_t plen = sizeof(KL_LEDGER_PREFIX) - 1; /* and the legacy one's */
  kl_ledger_entry_t e;
  json_t *decoded = NULL;
  if (key_len > plen &&
      (memcmp(key, KL_LEDGER_PREFIX, plen) == 0 ||
       memcmp(key, KL_LEDGER_LEGACY_PREFIX, plen) == 0) &&
      kl__ledger_decode(val, val_len, &e) == 0)
    json_object_set_new(
        o, "ledger",
        json_pack("{sIsIsIsI}", "balance", (json_int_t)e.balance, "last_seq",
                  (json_int_t)e.last_seq, "violations",
                  (json_int_t)e.violations, "base", (json_int_t)e.base));
  else if (kl__msgpack_to_json(val, val_len, &decoded) == KL_OK)
    json_object_set_new(o, "value", decoded);
  else if ((decoded = text_or_null(val, val_len)) != NULL)
    json_object_set_new(o, "value_text", decoded);
  return o;
}

static int get_row(void *opaque, const void *key, size_t key_len,
                   const void *val, size_t val_len) {
  kl_get_t *g = opaque;
  if (key_len == g->key_len && memcmp(key, g->key, key_len) == 0)
    g->out = kl__store_inspect_value_json(key, key_len, val, val_len);
  return 1; /* the scan starts at the key: the first row decides */
}

/* An id is scoped by entity key: the first record of it is shown, and the
 * others counted for a note. */
static int get_id_row(void *opaque, const char *topic, const void *key,
                      size_t key_len, const char *id, size_t id_len,
                      int64_t time_ms, kl_mark_t mark) {
  kl_get_t *g = opaque;
  if (id_len != g->key_len || memcmp(id, g->key, id_len) != 0 || g->found++ > 0)
    return 0;
  char when[32];
  inspect_iso(time_ms, when, sizeof(when));
  json_t *k = key ? text_or_null(key, key_len) : json_null();
  g->out =
      json_pack("{s:s,s:o,s:s%,s:s,s:I,s:s}", "topic", topic,
                k || !key ? "key" : "key_b64",
                k ? k : inspect_b64(key, key_len), "id", id, id_len, "mark",
                mark == KL_MARK_DEAD_LETTER  ? "dead_letter"
                : mark == KL__MARK_TIMER     ? "timer" /* waits */
                : mark == KL__MARK_CANCELLED ? "cancelled"
                                             : "applied",
                "recorded_ms", (json_int_t)time_ms, "recorded", when);
  return 0;
}

/* One "name value" line per member; a number or an object as JSON (jansson
 * dumps anything but an array or object only with JSON_ENCODE_ANY), a
 * string escaped (kl__escape()): a key or an id may hold a terminal's
 * control sequence or a direction mark, which must not reach it. */
static void get_text(const json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    size_t len = json_string_length(v);
    char *text = json_is_string(v)
                     ? malloc(KL__ESCAPED_SIZE(len))
                     : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (text && json_is_string(v))
      kl__escape(text, KL__ESCAPED_SIZE(len), json_string_value(v), len);
    printf("%-12s %s\n", k, text ? text : "(out of memory)");
    free(text);
  }
}

static int get_run(const char *location, const char *key, int by_id, int json) {
  kl_store_t *store;
  int rc = kl__cli_store_existing("store get", location, &store);
  char shown[KL__LOCATION_MAX];
  kl__location_redact(location, shown, sizeof(shown));
  if (rc)
    return rc;
  kl_get_t g = {key, strlen(key), NULL, 0};
  kl_err_t err = by_id ? kl__store_ids_walk(store, get_id_row, &g)
                       : kl_store_scan(store, key, g.key_len, get_row, &g);
  if (err)
    rc = kl__cli_fail("store get", "cannot read the store %s: %s", shown,
                      kl_err_detail());
  else if (!g.out) {
    char escaped[KL__ESCAPED_SIZE(256)];
    rc = kl__cli_fail("store get",
                      by_id ? "no idempotency key \"%s\" in %s: no event with "
                              "this id was applied, dead-lettered or "
                              "scheduled (or it expired)"
                            : "no handler key \"%s\" in %s; list them with "
                              "keylane store keys --prefix",
                      kl__escape(escaped, sizeof(escaped), key, strlen(key)),
                      shown);
  } else if (json) {
    if (g.found > 1)
      json_object_set_new(g.out, "entity_keys",
                          json_integer((json_int_t)g.found));
    json_dumpf(g.out, stdout, JSON_COMPACT);
    putchar('\n');
  } else {
    get_text(g.out);
    if (g.found > 1)
      printf("(ids are scoped by entity key: %zu keys hold this id; the "
             "first is shown)\n",
             g.found);
  }
  json_decref(g.out);
  kl_store_destroy(store);
  return rc;
}

/* ---- the actions' command lines ----------------------------------------- */

typedef struct kl_sargs {
  const char *location, *topic, *prefix;
  int64_t limit;
  int json, by_id;
} kl_sargs_t;

#define KL_JSON_OPT(what)                                                      \
  {                                                                            \
    .name = "json", .kind = KL__OPT_FLAG, .off = offsetof(kl_sargs_t, json),   \
    .help = (what)                                                             \
  }

static const kl__opt_t stats_opts[] = {KL__STORE_OPT(kl_sargs_t),
                                       {.name = "topic",
                                        .letter = 't',
                                        .kind = KL__OPT_STRING,
                                        .meta = "TOPIC",
                                        .off = offsetof(kl_sargs_t, topic),
                                        .help = "only this topic's partitions"},
                                       KL_JSON_OPT("one JSON object"),
                                       {0}};

static const kl__cmd_t stats_cmd = {
    .name = "store stats",
    .usage = "--store STORE [-t TOPIC] [--json]",
    .about =
        "Per partition: owner epoch, watermark (next offset to apply) and "
        "the\n"
        "applied, duplicate and dead-letter counters, and the timers (delayed\n"
        "events) waiting: `keylane store timers` lists them. The dead letters\n"
        "counted are events with an id; a record whose id could not be read\n"
        "is dead-lettered without one, and only the worker's metrics count\n"
        "it (keylane_worker_dead_letters_total). Idempotency keys: "
        "how\n"
        "many, by mark, and the oldest and newest (their age tells whether\n"
        "store.dedup.retention sweeps keep up). Handler keys, and the size "
        "on\n"
        "disk (LMDB: the data file, allocated and in use, and the map this\n"
        "command opened, at least store.map.size: a worker's own map grows\n"
        "from its store.map.size as the data does).\n"
        "Per topic, its owner: the Kafka cluster and consumer group whose\n"
        "workers may take its partitions (`keylane store bind` changes it).\n",
    .opts = stats_opts,
    .notes = "Exit 0; 1 when the store fails, or holds no partition of -t "
             "TOPIC (the\nerror names the topics it holds).\n",
    .examples =
        "  keylane store stats --store /var/lib/keylane\n"
        "  keylane store stats --store /var/lib/keylane --json | jq .ids\n"};

static const kl__opt_t keys_opts[] = {
    KL__STORE_OPT(kl_sargs_t),
    {.name = "prefix",
     .kind = KL__OPT_STRING,
     .meta = "P",
     .off = offsetof(kl_sargs_t, prefix),
     .help = "only keys starting with P (ledger: for balances)"},
    {.name = "limit",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = INT64_MAX,
     .off = offsetof(kl_sargs_t, limit),
     .help = "at most N keys"},
    KL_JSON_OPT("JSON lines"),
    {0}};

static const kl__cmd_t keys_cmd = {
    .name = "store keys",
    .usage = "--store STORE [--prefix P] [--limit N] [--json]",
    .about =
        "Lists the handlers' keys in key order, one per line (a key that is "
        "not\n"
        "printable text is shown as b64:BASE64). With --json, one JSON line "
        "per\n"
        "key: {\"key\": ..., \"value_len\": N} (key_b64 for binary keys).\n"
        "keylane's own records (keys beginning with '~': its timers) are left\n"
        "out unless --prefix begins with '~'; `keylane store timers` lists "
        "them.\n",
    .opts = keys_opts,
    .examples = "  keylane store keys --store /var/lib/keylane --prefix "
                "ledger:orders/acct-00\n"};

static const kl__opt_t get_opts[] = {
    KL__STORE_OPT(kl_sargs_t),
    {.name = "id",
     .kind = KL__OPT_FLAG,
     .off = offsetof(kl_sargs_t, by_id),
     .help = "KEY is an idempotency key (an event's id)"},
    KL_JSON_OPT("one JSON object"),
    {0}};

static const kl__cmd_t get_cmd = {
    .name = "store get",
    .usage = "KEY --store STORE [--json]\n--id ID --store STORE [--json]",
    .args = "KEY",
    .about =
        "Prints one handler key's record: its value decoded when it can be "
        "(a\n"
        "ledger entry's balance, last seq and order violations; msgpack as\n"
        "JSON; text), else as base64. With --id, looks up an idempotency key\n"
        "instead: how it was recorded and when: applied, dead_letter, timer\n"
        "(a delayed event that waits; kept however long it waits) or\n"
        "cancelled (its timer was cancelled; expires a retention after the\n"
        "cancel); that reads every key, so it is slow on a large store. Exit\n"
        "1 when absent.\n",
    .opts = get_opts,
    .examples =
        "  keylane store get ledger:orders/acct-0042 --store /var/lib/keylane\n"
        "  keylane store get --id 0190f6a2-8d1c-7c3e-9a4b-2f5e6d7c8b9a \\\n"
        "      --store /var/lib/keylane --json\n"};

int kl__cmd_store_stats(int argc, char **argv) {
  kl_sargs_t a = {0};
  int first;
  int rc = kl__opts_parse(&stats_cmd, argc, argv, &a, NULL, &first);
  return rc >= 0 ? rc : stats_run(a.location, a.topic, a.json);
}

int kl__cmd_store_keys(int argc, char **argv) {
  kl_sargs_t a = {0};
  int first;
  int rc = kl__opts_parse(&keys_cmd, argc, argv, &a, NULL, &first);
  return rc >= 0 ? rc
                 : keys_run(a.location, a.prefix, (uint64_t)a.limit, a.json);
}

int kl__cmd_store_get(int argc, char **argv) {
  kl_sargs_t a = {0};
  int first;
  int rc = kl__opts_parse(&get_cmd, argc, argv, &a, NULL, &first);
  if (rc >= 0)
    return rc;
  if (first + 1 != argc)
    return kl__cli_usage("store get",
                         first < argc ? "one KEY only, got \"%s\" too"
                                      : "KEY is required%s",
                         first < argc ? argv[first + 1] : "");
  if (!*argv[first])
    return kl__cli_usage("store get", "KEY is empty");
  return get_run(a.location, argv[first], a.by_id, a.json);
}
