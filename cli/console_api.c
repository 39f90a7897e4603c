/* The console's JSON (cli/console.h): the fleet, a key, the stuck keys. */
#include "cli/console.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/store.h"
#include "cli/worker_api.h"
#include "common/http.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "common/units.h"
#include "common/kafka.h"
#include "handlers/ledger.h"
#include "keylane/event.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"

json_t *kl__console_err(int *status, int code, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  *status = code;
  return json_pack("{s:s}", "error", msg);
}

/* Fetches @p path of every worker, at once. */
static kl__fetch_t *capi_fetch_all(kl__console_t *c, const char *path) {
  kl__fetch_t *f = calloc(c->nworkers ? c->nworkers : 1, sizeof(*f));
  if (!f)
    return NULL;
  for (size_t i = 0; i < c->nworkers; i++)
    f[i] = (kl__fetch_t){.to = &c->workers[i], .path = path};
  kl__console_fetch(f, c->nworkers, KL__CONSOLE_WAIT_MS);
  return f;
}

/* The answer of one worker as JSON (200 or @p also), or NULL with why in
 * f->error. */
static json_t *capi_answer(kl__fetch_t *f, int also) {
  if (!f->status || (f->status != 200 && f->status != also)) {
    if (f->status)
      snprintf(f->error, sizeof(f->error), "answered %d", f->status);
    return NULL;
  }
  json_error_t jerr;
  json_t *doc = json_loadb(f->body, f->body_len, 0, &jerr);
  if (!doc)
    snprintf(f->error, sizeof(f->error), "its answer is not JSON: %.100s",
             jerr.text);
  return doc;
}

static json_t *capi_worker_row(const kl__fetch_t *f, bool ok) {
  return json_pack("{s:s, s:b, s:s?}", "url", f->to->url, "ok", ok, "error",
                   ok ? NULL : f->error);
}

/* ---- /api/fleet ---- */

typedef struct capi_part {
  int64_t epoch, watermark, committed, end;
  bool in_store;
  const char *owner; /* a worker's URL, borrowed */
  json_t *report;    /* the worker's row, borrowed from its document */
} capi_part_t;

typedef struct capi_fleet {
  kl__console_t *console;
  capi_part_t *parts;
  int32_t n;       /* partitions listed */
  int32_t highest; /* + 1: the store's partitions of the topic */
} capi_fleet_t;

void kl__console_epoch_seen(kl__console_t *c, int32_t partition, uint64_t epoch,
                            const char *by) {
  if (partition < 0 || partition >= KL__CONSOLE_PARTS_MAX)
    return;
  uint64_t seen = c->seen_epoch[partition];
  c->seen_epoch[partition] = epoch;
  if (!seen || seen == epoch)
    return;
  kl__console_fence_t *f = &c->fences[c->nfences++ % KL__CONSOLE_FENCES_MAX];
  *f = (kl__console_fence_t){kl__now_ms(), partition, seen, epoch, ""};
  snprintf(f->by, sizeof(f->by), "%s", by);
}

static int capi_store_part(void *opaque, const char *topic, int32_t partition,
                           const kl_partition_state_t *state) {
  capi_fleet_t *fl = opaque;
  if (strcmp(topic, fl->console->topic) != 0 || partition < 0 ||
      partition >= KL__CONSOLE_PARTS_MAX)
    return 0;
  kl__console_epoch_seen(fl->console, partition, state->epoch, "");
  fl->parts[partition].epoch = (int64_t)state->epoch;
  fl->parts[partition].watermark = state->watermark;
  fl->parts[partition].in_store = true;
  if (partition + 1 > fl->highest)
    fl->highest = partition + 1;
  return 0;
}

/* @returns the topic's partition count from Kafka, or 0 with why. */
static int32_t capi_partitions(kl__console_t *c, char *why, size_t size) {
  const struct rd_kafka_metadata *md = NULL;
  if (kl__kafka_metadata(c->rk, c->topic, KL__CONSOLE_WAIT_MS, &md)) {
    snprintf(why, size, "%s", kl_err_detail());
    return 0;
  }
  const rd_kafka_metadata_topic_t *t = kl__kafka_metadata_find(md, c->topic);
  int32_t n = t ? t->partition_cnt : 0;
  if (!t)
    snprintf(why, size, "Kafka has no topic %s", c->topic);
  rd_kafka_metadata_destroy(md);
  return n;
}

/* The group's committed offsets. */
static void capi_committed(capi_fleet_t *fl, char *why, size_t size) {
  kl__console_t *c = fl->console;
  rd_kafka_topic_partition_list_t *list =
      rd_kafka_topic_partition_list_new(fl->n);
  for (int32_t p = 0; p < fl->n; p++)
    rd_kafka_topic_partition_list_add(list, c->topic, p);
  rd_kafka_resp_err_t err =
      rd_kafka_committed(c->rk, list, KL__CONSOLE_WAIT_MS);
  if (err)
    snprintf(why, size, "committed offsets of group %s: %s", c->group,
             rd_kafka_err2str(err));
  for (int i = 0; !err && i < list->cnt; i++)
    fl->parts[list->elems[i].partition].committed =
        list->elems[i].offset >= 0 ? list->elems[i].offset : -1;
  rd_kafka_topic_partition_list_destroy(list);
}

/* The log's end offsets. */
static void capi_ends(capi_fleet_t *fl) {
  kl__console_t *c = fl->console;
  int64_t until = kl__now_ms() + KL__CONSOLE_WAIT_MS;
  for (int32_t p = 0; p < fl->n; p++) {
    int64_t low, high, left = until - kl__now_ms();
    if (left <= 0 || rd_kafka_query_watermark_offsets(c->rk, c->topic, p, &low,
                                                      &high, (int)left))
      break;
    fl->parts[p].end = high;
  }
}

/* Who owns or stopped each partition, from the workers' /v1/partitions. */
static json_t *capi_fleet_workers(capi_fleet_t *fl, kl__fetch_t *f,
                                  json_t **docs) {
  json_t *rows = json_array();
  for (size_t i = 0; i < fl->console->nworkers; i++) {
    docs[i] = capi_answer(&f[i], 0);
    json_t *parts = json_object_get(docs[i], "partitions");
    json_array_append_new(rows, capi_worker_row(&f[i], docs[i] != NULL));
    size_t j;
    json_t *row;
    json_array_foreach(parts, j, row) {
      json_int_t p = json_integer_value(json_object_get(row, "partition"));
      bool owned = json_is_true(json_object_get(row, "owned"));
      bool stopped = json_is_true(json_object_get(row, "stopped"));
      if (p < 0 || p >= fl->n || (!owned && !stopped) ||
          (fl->parts[p].report && !owned))
        continue;
      fl->parts[p].owner = f[i].to->url;
      fl->parts[p].report = row;
    }
  }
  return rows;
}

static json_t *capi_fleet_row(const capi_fleet_t *fl, int32_t p) {
  const capi_part_t *x = &fl->parts[p];
  /* The store's watermark is the group's position (keylane commits Kafka
   * offsets after the store); a partition neither knows starts at 0. */
  int64_t at = x->in_store ? x->watermark : x->committed;
  if (at < 0)
    at = 0;
  json_t *o = json_pack("{s:i, s:s?, s:I, s:I, s:I, s:I}", "partition", (int)p,
                        "owner", x->owner, "epoch", (json_int_t)x->epoch,
                        "watermark", (json_int_t)x->watermark, "committed",
                        (json_int_t)x->committed, "end", (json_int_t)x->end);
  json_object_set_new(o, "lag",
                      x->end >= 0 ? json_integer(x->end > at ? x->end - at : 0)
                                  : json_null());
  const char *status = "unowned";
  if (x->report && json_is_true(json_object_get(x->report, "stopped")))
    status = "STOPPED";
  else if (x->report)
    status = json_string_value(json_object_get(x->report, "status"));
  json_object_set_new(o, "status", json_string(status ? status : "?"));
  static const char *const copied[] = {
      "stop_reason", "stop_detail", "records",       "retrying",
      "running",     "outbox",      "last_commit_ms"};
  for (size_t i = 0; x->report && i < sizeof(copied) / sizeof(copied[0]); i++)
    if (json_object_get(x->report, copied[i]))
      json_object_set(o, copied[i], json_object_get(x->report, copied[i]));
  return o;
}

static json_t *capi_fleet(kl__console_t *c, int *status) {
  capi_fleet_t fl = {c, calloc(KL__CONSOLE_PARTS_MAX, sizeof(capi_part_t)), 0,
                     0};
  kl__fetch_t *f = capi_fetch_all(c, "/v1/partitions");
  json_t **docs = calloc(c->nworkers + 1, sizeof(json_t *));
  if (!fl.parts || !f || !docs) {
    free(fl.parts), free(f), free(docs);
    return kl__console_err(status, 503, "out of memory");
  }
  for (int32_t p = 0; p < KL__CONSOLE_PARTS_MAX; p++)
    fl.parts[p].committed = fl.parts[p].end = fl.parts[p].watermark = -1;
  char kafka_why[512] = "", store_why[512] = "";
  fl.n = capi_partitions(c, kafka_why, sizeof(kafka_why));
  if (fl.n > KL__CONSOLE_PARTS_MAX)
    fl.n = KL__CONSOLE_PARTS_MAX;
  /* Read in the order the fleet writes, so that each row holds together
   * (committed <= watermark <= end): a worker commits its store before the
   * group's offset, and applies only what the log holds. So the group's
   * offsets first, the store next, the log's ends last; read the other
   * way, a commit between the reads showed an offset past the watermark. */
  bool kafka = fl.n > 0 && !kafka_why[0];
  if (kafka)
    capi_committed(&fl, kafka_why, sizeof(kafka_why));
  if (kl_store_foreach_partition(c->store, capi_store_part, &fl))
    snprintf(store_why, sizeof(store_why), "%s", kl_err_detail());
  if (kafka)
    capi_ends(&fl);
  if (fl.n <= 0)
    fl.n = fl.highest;
  if (fl.n > KL__CONSOLE_PARTS_MAX)
    fl.n = KL__CONSOLE_PARTS_MAX;
  json_t *workers = capi_fleet_workers(&fl, f, docs);
  json_t *parts = json_array();
  for (int32_t p = 0; p < fl.n; p++)
    json_array_append_new(parts, capi_fleet_row(&fl, p));
  json_t *doc = json_pack(
      "{s:s, s:s, s:I, s:o, s:o, s:{s:b, s:s?}, s:{s:b, s:s?}}", "topic",
      c->topic, "group", c->group, "generated_ms", (json_int_t)kl__now_ms(),
      "workers", workers, "partitions", parts, "kafka", "ok", !kafka_why[0],
      "error", kafka_why[0] ? kafka_why : NULL, "store", "ok", !store_why[0],
      "error", store_why[0] ? store_why : NULL);
  for (size_t i = 0; i < c->nworkers; i++)
    json_decref(docs[i]);
  kl__console_fetch_free(f, c->nworkers);
  free(docs), free(f), free(fl.parts);
  *status = 200;
  return doc;
}

/* ---- /api/keys/KEY ---- */

typedef struct capi_rows {
  const char *key;
  size_t key_len;
  json_t *rows;
} capi_rows_t;

static int capi_row(void *opaque, const void *key, size_t key_len,
                    const void *val, size_t val_len) {
  capi_rows_t *r = opaque;
  if (key_len == r->key_len && memcmp(key, r->key, key_len) == 0)
    json_array_append_new(
        r->rows, kl__store_inspect_value_json(key, key_len, val, val_len));
  return 1; /* the scan starts at the key: the first row decides */
}

/* The handler rows of @p key that keylane's handlers write: the key
 * itself (exec and so handlers choose theirs) and the ledger's row. */
static json_t *capi_key_rows(kl__console_t *c, const char *key, size_t len) {
  json_t *rows = json_array();
  char *scoped = malloc(sizeof(KL_LEDGER_PREFIX) + strlen(c->topic) + len + 1);
  if (!scoped)
    return rows;
  size_t n = (size_t)sprintf(scoped, "%s%s/", KL_LEDGER_PREFIX, c->topic);
  memcpy(scoped + n, key, len);
  const char *names[] = {key, scoped};
  size_t lens[] = {len, n + len};
  for (size_t i = 0; i < 2; i++) {
    capi_rows_t r = {names[i], lens[i], rows};
    kl_store_scan(c->store, names[i], lens[i], capi_row, &r);
  }
  free(scoped);
  return rows;
}

/* /v1/keys/ with the key percent-encoded again, every byte that is not
 * unreserved (RFC 3986). */
static char *capi_key_path(const char *key, size_t len) {
  char *path = malloc(9 + 3 * len + 1);
  if (!path)
    return NULL;
  size_t n = (size_t)sprintf(path, "/v1/keys/");
  for (size_t i = 0; i < len; i++) {
    unsigned char b = (unsigned char)key[i];
    if ((b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') ||
        (b >= 'A' && b <= 'Z') || strchr("-._~", b))
      path[n++] = (char)b;
    else
      n += (size_t)sprintf(path + n, "%%%02X", b);
  }
  path[n] = '\0';
  return path;
}

/* What the workers say of the key: the one that holds it, or none. */
static void capi_key_workers(kl__console_t *c, json_t *doc, const char *key,
                             size_t len) {
  char *path = capi_key_path(key, len);
  kl__fetch_t *f = path ? capi_fetch_all(c, path) : NULL;
  json_t *rows = json_array(), *held = NULL;
  for (size_t i = 0; f && i < c->nworkers; i++) {
    json_t *entry = capi_answer(&f[i], 404);
    json_array_append_new(rows, capi_worker_row(&f[i], entry != NULL));
    if (entry && f[i].status == 200 && !held) {
      held = entry;
      json_object_set_new(held, "worker", json_string(f[i].to->url));
    } else {
      json_decref(entry);
    }
  }
  json_object_set_new(doc, "workers", rows);
  json_object_set_new(doc, "state",
                      held ? json_incref(json_object_get(held, "state"))
                           : json_string("idle"));
  json_object_set_new(doc, "held", held ? held : json_null());
  if (f)
    kl__console_fetch_free(f, c->nworkers);
  free(f), free(path);
}

static json_t *capi_key(kl__console_t *c, const char *encoded, int *status) {
  char key[3 * KL_KEY_MAX], why[256];
  long len = kl__worker_api_key(encoded, key, why, sizeof(why));
  if (len < 0)
    return kl__console_err(
        status, 400,
        "/api/keys/KEY takes a key of 1 to %d bytes, "
        "percent-encoded (%%XX for a byte that is not a letter, "
        "digit or -._~): encode the key (encodeURIComponent)",
        KL_KEY_MAX);
  char kwhy[512] = "";
  int32_t n = capi_partitions(c, kwhy, sizeof(kwhy));
  if (n <= 0)
    return kl__console_err(
        status, 503,
        "cannot tell the key's partition: %s; is Kafka (-b) up "
        "and the topic (-t) right?",
        kwhy);
  int32_t p = kl_partition(key, (size_t)len, n);
  kl_partition_state_t st = {0};
  kl_err_t err = kl_store_partition(c->store, c->topic, p, &st);
  char *shown = malloc(KL__ESCAPED_SIZE((size_t)len));
  json_t *doc = json_pack(
      "{s:s?, s:i, s:i, s:{s:I, s:I, s:s?, s:o}}", "key",
      shown ? kl__escape(shown, KL__ESCAPED_SIZE((size_t)len), key, (size_t)len)
            : NULL,
      "partition", (int)p, "partitions", (int)n, "store", "epoch",
      (json_int_t)st.epoch, "watermark", (json_int_t)st.watermark, "error",
      err ? kl_err_detail() : NULL, "rows", capi_key_rows(c, key, (size_t)len));
  free(shown);
  json_object_set_new(doc, "timers",
                      kl__console_key_timers(c, p, key, (size_t)len));
  capi_key_workers(c, doc, key, (size_t)len);
  *status = 200;
  return doc;
}

/* Appends each row of a worker's @p list to @p into, with its "worker". */
static void capi_gather(json_t *into, json_t *list, const char *url) {
  size_t i;
  json_t *row;
  json_array_foreach(list, i, row) {
    json_object_set_new(row, "worker", json_string(url));
    json_array_append(into, row);
  }
}

/* ---- /api/stuck ---- */

json_t *kl__console_limit(const char *v, size_t vlen, const char *what,
                          long max, long *limit, int *status) {
  int64_t n; /* digits only, as partition=: no sign, no space */
  if (!kl__units_digits(v, vlen, &n) && n >= 1 && n <= max) {
    *limit = (long)n;
    return NULL;
  }
  return kl__console_err(status, 400,
                         "limit=%.*s is not a number of %s 1..%ld; ask for "
                         "%s",
                         (int)(vlen > 32 ? 32 : vlen), v, what, max,
                         !kl__units_digits(v, vlen, &n) && n > max
                             ? "fewer"
                             : "1 or more, in digits only");
}

json_t *kl__console_key_param(const char *v, size_t vlen, char *key,
                              size_t *len, int *status) {
  long n = vlen <= 3 * KL_KEY_MAX ? kl__http_pct_decode(v, vlen, key) : -1;
  if (n >= 1 && n <= KL_KEY_MAX) {
    *len = (size_t)n;
    return NULL;
  }
  return kl__console_err(status, 400,
                         "key= takes a key of 1 to %d bytes, percent-encoded "
                         "(%%XX for a byte that is not a letter, digit or "
                         "-._~): encode the key (encodeURIComponent)",
                         KL_KEY_MAX);
}

/* The query of an endpoint that takes limit=N alone. @returns NULL, or the
 * error document. */
static json_t *capi_limit_only(const char *endpoint, const char *query,
                               const char *what, long max, long *limit,
                               int *status) {
  size_t vlen;
  const char *v = kl__http_query(query, "limit", &vlen);
  for (const char *q = query; *q; q += strcspn(q, "&"), q += *q == '&')
    if (strncmp(q, "limit=", 6) != 0 && *q != '&')
      return kl__console_err(
          status, 400, "%s takes limit=N (1..%ld) alone; drop \"%.*s\"",
          endpoint, max, (int)(strcspn(q, "&") > 64 ? 64 : strcspn(q, "&")), q);
  return v ? kl__console_limit(v, vlen, what, max, limit, status) : NULL;
}

static json_t *capi_stuck(kl__console_t *c, const char *query, int *status) {
  long limit = KL__CONSOLE_STUCK_PAGE;
  json_t *bad = capi_limit_only("/api/stuck", query, "keys per worker",
                                KL__CONSOLE_STUCK_MAX, &limit, status);
  if (bad)
    return bad;
  char path[96];
  snprintf(path, sizeof(path), "/v1/keys?state=retrying,parked&limit=%ld",
           limit);
  kl__fetch_t *f = capi_fetch_all(c, path);
  if (!f)
    return kl__console_err(status, 503, "out of memory");
  json_t *keys = json_array(), *rows = json_array();
  json_int_t total = 0;
  for (size_t i = 0; i < c->nworkers; i++) {
    json_t *doc = capi_answer(&f[i], 0);
    json_array_append_new(rows, capi_worker_row(&f[i], doc != NULL));
    total += json_integer_value(json_object_get(doc, "total"));
    capi_gather(keys, json_object_get(doc, "keys"), f[i].to->url);
    json_decref(doc);
  }
  kl__console_fetch_free(f, c->nworkers);
  free(f);
  *status = 200;
  return json_pack("{s:o, s:I, s:i, s:o}", "keys", keys, "total", total,
                   "limit", (int)limit, "workers", rows);
}

json_t *kl__console_text(const void *s, size_t len) {
  char *shown = malloc(KL__ESCAPED_SIZE(len));
  json_t *t =
      shown ? json_string(kl__escape(shown, KL__ESCAPED_SIZE(len), s, len))
            : json_null();
  free(shown);
  return t;
}

/* ---- /api/outbox ---- */

typedef struct capi_outbox {
  kl__console_t *console;
  size_t limit, listed;
  json_t *parts;
  kl_err_t err;
} capi_outbox_t;

static int capi_outbox_row(void *opaque, uint64_t seq, const void *rec,
                           size_t len) {
  json_t *rows = opaque;
  kl__outbox_rec_t r;
  if (kl__outbox_rec_decode(rec, len, &r)) {
    json_array_append_new(
        rows, json_pack("{s:I, s:s, s:I}", "seq", (json_int_t)seq, "error",
                        "not a follow-up record", "bytes", (json_int_t)len));
    return 0;
  }
  const kl_event_t *e = &r.event;
  json_array_append_new(
      rows,
      json_pack("{s:I, s:o, s:o, s:o, s:o, s:I, s:I}", "seq", (json_int_t)seq,
                "destination",
                r.topic_len ? kl__console_text(r.topic, r.topic_len)
                            : json_null(),
                "key", kl__console_text(e->key, e->key_len), "id",
                kl__console_text(e->id, e->id_len), "type",
                kl__console_text(e->type, e->type_len), "payload_bytes",
                (json_int_t)e->payload_len, "emitted_ms", (json_int_t)e->ts));
  return 0;
}

/* The store's follow-ups of each partition of the topic (as `keylane store
 * outbox` lists them), limit per partition, KL__CONSOLE_OUTBOX_ROWS in
 * all: a partition past that is listed with its rows left out. */
static int capi_outbox_part(void *opaque, const char *topic, int32_t partition,
                            const kl_partition_state_t *state) {
  capi_outbox_t *o = opaque;
  (void)state;
  if (strcmp(topic, o->console->topic) != 0)
    return 0;
  json_t *rows = json_array();
  size_t room = KL__CONSOLE_OUTBOX_ROWS - o->listed;
  if (room)
    o->err = kl__store_outbox_list(o->console->store, topic, partition, 0,
                                   o->limit < room ? o->limit : room,
                                   capi_outbox_row, rows);
  o->listed += json_array_size(rows);
  if (json_array_size(rows))
    json_array_append_new(o->parts, json_pack("{s:i, s:o}", "partition",
                                              (int)partition, "pending", rows));
  else
    json_decref(rows);
  return o->err != KL_OK;
}

static json_t *capi_outbox(kl__console_t *c, const char *query, int *status) {
  long limit = KL__CONSOLE_OUTBOX_PAGE;
  json_t *bad =
      capi_limit_only("/api/outbox", query, "follow-ups per partition",
                      KL__CONSOLE_OUTBOX_MAX, &limit, status);
  if (bad)
    return bad;
  capi_outbox_t o = {c, (size_t)limit, 0, json_array(), KL_OK};
  kl_err_t err = kl_store_foreach_partition(c->store, capi_outbox_part, &o);
  if (err || o.err) {
    json_decref(o.parts);
    return kl__console_err(status, 503, "cannot read the store's outbox: %s",
                           kl_err_detail());
  }
  *status = 200;
  return json_pack("{s:o, s:I, s:i, s:b}", "partitions", o.parts, "listed",
                   (json_int_t)o.listed, "limit", (int)limit, "cut",
                   o.listed == KL__CONSOLE_OUTBOX_ROWS);
}

/* ---- /api/fencing ---- */

/* The value of @p metric in the Prometheus text @p body; -1 without it. */
static double capi_metric(const char *body, const char *metric) {
  size_t len = strlen(metric);
  for (const char *l = body; l && *l; l = strchr(l, '\n'), l += l != NULL)
    if (strncmp(l, metric, len) == 0 && l[len] == ' ')
      return strtod(l + len + 1, NULL);
  return -1;
}

static int capi_epoch_part(void *opaque, const char *topic, int32_t partition,
                           const kl_partition_state_t *state) {
  kl__console_t *c = opaque;
  if (strcmp(topic, c->topic) == 0)
    kl__console_epoch_seen(c, partition, state->epoch, "");
  return 0;
}

static json_t *capi_fencing(kl__console_t *c, const char *query, int *status) {
  if (*query)
    return kl__console_err(status, 400, "/api/fencing takes no parameters");
  json_t *epochs = json_array();
  /* The store's epochs now: a change since the last look is a fence. */
  kl_store_foreach_partition(c->store, capi_epoch_part, c);
  kl__fetch_t *f = capi_fetch_all(c, "/metrics");
  kl__fetch_t *v = capi_fetch_all(c, "/v1/fences");
  json_t *workers = json_array(), *refused = json_array();
  for (size_t i = 0; f && v && i < c->nworkers; i++) {
    double n =
        f[i].status == 200
            ? capi_metric(f[i].body, "keylane_worker_fenced_batches_total")
            : -1;
    json_t *doc = capi_answer(&v[i], 0);
    json_t *row = capi_worker_row(&v[i], doc != NULL);
    json_object_set_new(row, "refused_commits",
                        n >= 0 ? json_integer((json_int_t)n) : json_null());
    json_array_append_new(workers, row);
    capi_gather(refused, json_object_get(doc, "fences"), v[i].to->url);
    json_decref(doc);
  }
  if (f)
    kl__console_fetch_free(f, c->nworkers);
  if (v)
    kl__console_fetch_free(v, c->nworkers);
  free(f), free(v);
  size_t n =
      c->nfences < KL__CONSOLE_FENCES_MAX ? c->nfences : KL__CONSOLE_FENCES_MAX;
  for (size_t i = 0; i < n; i++) { /* newest first */
    const kl__console_fence_t *x =
        &c->fences[(c->nfences - 1 - i) % KL__CONSOLE_FENCES_MAX];
    json_array_append_new(
        epochs, json_pack("{s:I, s:i, s:I, s:I, s:s?}", "at_ms",
                          (json_int_t)x->at_ms, "partition", (int)x->partition,
                          "fenced_epoch", (json_int_t)x->from, "epoch",
                          (json_int_t)x->to, "by", x->by[0] ? x->by : NULL));
  }
  *status = 200;
  return json_pack("{s:o, s:o, s:o, s:I, s:i}", "workers", workers, "refused",
                   refused, "changes", epochs, "seen", (json_int_t)c->nfences,
                   "kept", KL__CONSOLE_FENCES_MAX);
}

int kl__console_api(kl__console_t *console, const char *path, const char *query,
                    json_t **doc) {
  int status = 0;
  if (strcmp(path, "/api/fleet") == 0)
    *doc = capi_fleet(console, &status);
  else if (strcmp(path, "/api/stuck") == 0)
    *doc = capi_stuck(console, query, &status);
  else if (strncmp(path, "/api/keys/", 10) == 0)
    *doc = capi_key(console, path + 10, &status);
  else if (strcmp(path, "/api/outbox") == 0)
    *doc = capi_outbox(console, query, &status);
  else if (strcmp(path, "/api/fencing") == 0)
    *doc = capi_fencing(console, query, &status);
  else if (strcmp(path, "/api/timers") == 0)
    return kl__console_timers(console, query, doc);
  else if (strcmp(path, "/api/letters") == 0 ||
           strncmp(path, "/api/letters/", 13) == 0)
    return kl__console_letters(console, path, query, doc);
  else if (strncmp(path, "/api/", 5) == 0)
    *doc =
        kl__console_err(&status, 404,
                        "no such endpoint %s: GET /api/fleet, /api/keys/KEY, "
                        "/api/stuck, /api/letters, /api/letters/P/OFFSET, "
                        "/api/outbox, /api/fencing or /api/timers; POST "
                        "/api/redrive",
                        path);
  return status;
}
