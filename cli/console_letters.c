/* The console's dead letters (cli/console.h): the newest of the
 * dead-letter topic, one letter opened, and a redrive of a selection
 * through the one redrive (worker/redrive.h), as `keylane replay
 * --from-dlq` runs it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/console.h"
#include "cli/inspect.h"
#include "cli/replay_cmd.h"
#include "common/http.h"
#include "common/strbuf.h"
#include "common/units.h"
#include "handlers/handler.h"
#include "worker/dlq.h"
#include "worker/redrive.h"

static const char *const cletters_reasons[] = {
    "decode", "handler_fail", "max_attempts", "misrouted", "outbox"};
#define CLETTERS_REASONS "decode, handler_fail, max_attempts, misrouted, outbox"

static json_t *cletters_header(const rd_kafka_message_t *m, const char *name) {
  rd_kafka_headers_t *h = NULL;
  const void *val;
  size_t len;
  if (rd_kafka_message_headers(m, &h) ||
      rd_kafka_header_get_last(h, name, &val, &len) || !val)
    return json_null();
  return kl__console_text(val, len);
}

typedef struct cletters_done {
  const char *want; /* the letter's record key */
  const kl_event_t *ev;
  bool done;
} cletters_done_t;

static int cletters_found(void *opaque, const void *key, size_t key_len,
                          const void *val, size_t val_len) {
  cletters_done_t *d = opaque;
  d->done = key_len == strlen(d->want) && memcmp(key, d->want, key_len) == 0 &&
            kl__letter_done_by(val, val_len, d->ev->key, d->ev->key_len,
                               d->ev->id, d->ev->id_len);
  return 1; /* the scan starts at the key: the first row decides */
}

/* Whether a redrive applied @p l: its record (letters.h), naming the
 * letter's event, is in the store. */
static bool cletters_redriven(kl__console_t *c, const kl__letter_t *l) {
  char key[KL__LETTER_KEY_MAX];
  size_t len = kl__letter_key(c->dlq_topic, l, key);
  const rd_kafka_message_t *m = l->msg;
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t ev;
  cletters_done_t d = {key, &ev, false};
  if (decoder &&
      !kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev))
    kl_store_scan(c->store, key, len, cletters_found, &d);
  kl_decoder_destroy(decoder);
  return d.done;
}

static json_t *cletters_row(kl__console_t *c, const kl__letter_t *l) {
  const rd_kafka_message_t *m = l->msg;
  int64_t attempts = -1;
  json_t *a = cletters_header(m, "keylane.dlq.attempts");
  if (json_is_string(a))
    kl__units_digits(json_string_value(a), json_string_length(a), &attempts);
  json_decref(a);
  return json_pack(
      "{s:i, s:I, s:I, s:o, s:s, s:o, s:I, s:s, s:i, s:I, s:b, s:s?}",
      "dlq_partition", (int)l->dlq_partition, "dlq_offset",
      (json_int_t)l->dlq_offset, "timestamp_ms",
      (json_int_t)rd_kafka_message_timestamp(m, NULL), "key",
      m->key ? kl__console_text(m->key, m->key_len) : json_null(), "reason",
      l->reason, "error", cletters_header(m, "keylane.dlq.error"), "attempts",
      (json_int_t)attempts, "topic", l->topic, "partition", (int)l->partition,
      "offset", (json_int_t)l->offset, "redriven", cletters_redriven(c, l),
      "truncated", l->truncated[0] ? l->truncated : NULL);
}

/* ---- GET /api/letters ---- */

typedef struct cletters_filter {
  const char *reason; /* NULL: any */
  const char *key;
  long key_len; /* -1: any */
} cletters_filter_t;

static bool cletters_keep(void *opaque, const kl__letter_t *l) {
  const cletters_filter_t *f = opaque;
  if (f->reason && strcmp(l->reason, f->reason) != 0)
    return false;
  return f->key_len < 0 || (l->msg->key_len == (size_t)f->key_len &&
                            memcmp(l->msg->key, f->key, l->msg->key_len) == 0);
}

/* The query: reason=R, key=K (percent-encoded), limit=N; anything else is
 * refused. @returns NULL, or the error document. */
static json_t *cletters_query(const char *query, cletters_filter_t *f,
                              char *key, long *limit, int *status) {
  size_t vlen;
  const char *v;
  for (const char *q = query; *q; q += strcspn(q, "&"), q += *q == '&')
    if (*q != '&' && strncmp(q, "reason=", 7) && strncmp(q, "key=", 4) &&
        strncmp(q, "limit=", 6))
      return kl__console_err(status, 400,
                             "/api/letters takes reason=, key= and limit= "
                             "only; drop \"%.*s\"",
                             (int)(strcspn(q, "&") > 64 ? 64 : strcspn(q, "&")),
                             q);
  if ((v = kl__http_query(query, "reason", &vlen))) {
    for (size_t i = 0; i < sizeof(cletters_reasons) / sizeof(*cletters_reasons);
         i++)
      if (strlen(cletters_reasons[i]) == vlen &&
          memcmp(cletters_reasons[i], v, vlen) == 0)
        f->reason = cletters_reasons[i];
    if (!f->reason)
      return kl__console_err(
          status, 400,
          "reason=%.*s is not a dead-letter reason: give one "
          "of " CLETTERS_REASONS,
          (int)(vlen > 32 ? 32 : vlen), v);
  }
  if ((v = kl__http_query(query, "key", &vlen))) {
    size_t len;
    json_t *bad = kl__console_key_param(v, vlen, key, &len, status);
    if (bad)
      return bad;
    f->key = key;
    f->key_len = (long)len;
  }
  if ((v = kl__http_query(query, "limit", &vlen)))
    return kl__console_limit(v, vlen, "letters", KL__CONSOLE_LETTERS_MAX, limit,
                             status);
  return NULL;
}

static json_t *cletters_list(kl__console_t *c, const char *query, int *status) {
  cletters_filter_t f = {NULL, NULL, -1};
  char *key = malloc(3 * KL_KEY_MAX);
  long limit = KL__CONSOLE_LETTERS_PAGE;
  json_t *bad = key ? cletters_query(query, &f, key, &limit, status)
                    : kl__console_err(status, 503, "out of memory");
  if (bad) {
    free(key);
    return bad;
  }
  kl__letters_t ls;
  size_t scanned = 0;
  bool more = false;
  kl_err_t err = kl__letters_tail(
      c->conf, c->dlq_topic, KL__CONSOLE_LETTERS_TAIL, (size_t)limit,
      cletters_keep, &f, &kl__cli_stop, &ls, &scanned, &more);
  free(key);
  if (err == KL_ENOTFOUND) /* no letter yet: the worker makes it on the first */
    return *status = 200,
           json_pack("{s:s, s:[], s:i, s:i, s:i, s:b, s:s}", "dlq_topic",
                     c->dlq_topic, "letters", "scanned", 0, "tail",
                     KL__CONSOLE_LETTERS_TAIL, "limit", (int)limit, "more", 0,
                     "note", "the dead-letter topic does not exist yet");
  if (err)
    return kl__console_err(status, 503, "cannot read %s: %s", c->dlq_topic,
                           kl_err_detail());
  json_t *rows = json_array();
  for (size_t i = 0; i < ls.n; i++)
    json_array_append_new(rows, cletters_row(c, &ls.v[i]));
  kl__letters_clear(&ls);
  *status = 200;
  return json_pack("{s:s, s:o, s:I, s:i, s:i, s:b}", "dlq_topic", c->dlq_topic,
                   "letters", rows, "scanned", (json_int_t)scanned, "tail",
                   KL__CONSOLE_LETTERS_TAIL, "limit", (int)limit, "more", more);
}

/* ---- GET /api/letters/P/OFFSET ---- */

/* "P/OFFSET" (or "P@OFFSET" in a body) into @p ref; 0 when it is one. */
static int cletters_ref(const char *text, size_t len, char sep,
                        kl__letter_ref_t *ref) {
  const char *mid = memchr(text, sep, len);
  int64_t p, off;
  if (!mid || kl__units_digits(text, (size_t)(mid - text), &p) ||
      kl__units_digits(mid + 1, len - (size_t)(mid + 1 - text), &off) ||
      p > INT32_MAX)
    return -1;
  *ref = (kl__letter_ref_t){(int32_t)p, off};
  return 0;
}

static json_t *cletters_open(kl__console_t *c, const char *ref_text,
                             int *status) {
  kl__letter_ref_t ref;
  if (cletters_ref(ref_text, strlen(ref_text), '/', &ref))
    return kl__console_err(status, 400,
                           "/api/letters/%.64s is not a letter: give "
                           "/api/letters/PARTITION/OFFSET, the dead letter's "
                           "place in %s as /api/letters lists it",
                           ref_text, c->dlq_topic);
  kl__letters_t ls;
  kl_err_t err =
      kl__letters_read_at(c->conf, c->dlq_topic, &ref, 1, &kl__cli_stop, &ls);
  if (err)
    return kl__console_err(status, err == KL_ENOTFOUND ? 404 : 503,
                           "cannot read %s: %s", c->dlq_topic, kl_err_detail());
  if (!ls.n) {
    kl__letters_clear(&ls);
    return kl__console_err(
        status, 404,
        "%s has no record at partition %" PRId32 " offset %" PRId64
        " (not written yet, or past its retention): list the "
        "letters there are with /api/letters",
        c->dlq_topic, ref.partition, ref.offset);
  }
  kl_decoder_t *decoder = kl_decoder_new();
  json_t *doc = decoder ? kl__inspect_record_json(decoder, ls.v[0].msg) : NULL;
  if (doc)
    json_object_set_new(doc, "letter", cletters_row(c, &ls.v[0]));
  kl_decoder_destroy(decoder);
  kl__letters_clear(&ls);
  if (!doc)
    return kl__console_err(status, 503, "out of memory");
  *status = 200;
  return doc;
}

int kl__console_letters(kl__console_t *c, const char *path, const char *query,
                        json_t **doc) {
  int status = 0;
  if (strcmp(path, "/api/letters") == 0)
    *doc = cletters_list(c, query, &status);
  else if (*query)
    *doc = kl__console_err(&status, 400,
                           "/api/letters/PARTITION/OFFSET takes no parameters");
  else
    *doc = cletters_open(c, path + strlen("/api/letters/"), &status);
  return status;
}

/* ---- POST /api/redrive ---- */

/* {"letters": ["P@OFFSET", ...], "dry_run": true|false} into @p refs. */
static json_t *redrive_body(const char *body, size_t len,
                            kl__letter_ref_t *refs, size_t *n, int *dry_run,
                            int *status) {
  json_error_t jerr;
  json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
  json_t *list = json_object_get(doc, "letters");
  json_t *dry = json_object_get(doc, "dry_run");
  const char *form = "give {\"letters\": [\"PARTITION@OFFSET\", ...], "
                     "\"dry_run\": true} (dry_run false to redrive)";
  json_t *bad = NULL;
  if (!doc)
    bad = kl__console_err(status, 400, "the body is not JSON (%.100s): %s",
                          jerr.text, form);
  else if (!json_is_array(list) || !json_array_size(list) ||
           !json_is_boolean(dry) || json_object_size(doc) != 2)
    bad = kl__console_err(status, 400, "the body is not a redrive: %s", form);
  else if (json_array_size(list) > KL__CONSOLE_REDRIVE_MAX)
    bad =
        kl__console_err(status, 400,
                        "%zu letters selected, %d at most per redrive: select "
                        "fewer",
                        json_array_size(list), KL__CONSOLE_REDRIVE_MAX);
  size_t i;
  json_t *item;
  *n = 0;
  json_array_foreach(bad ? NULL : list, i, item) {
    const char *s = json_string_value(item);
    if (!s || cletters_ref(s, strlen(s), '@', &refs[*n])) {
      bad =
          kl__console_err(status, 400,
                          "letter %zu is not PARTITION@OFFSET (e.g. \"0@12\", "
                          "as /api/letters lists dlq_partition and "
                          "dlq_offset): %s",
                          i, form);
      break;
    }
    for (size_t j = 0; j < *n && !bad; j++)
      if (refs[j].partition == refs[*n].partition &&
          refs[j].offset == refs[*n].offset)
        bad = kl__console_err(status, 400,
                              "letter %s is selected twice: select each "
                              "letter once",
                              s);
    if (bad)
      break;
    (*n)++;
  }
  *dry_run = json_is_true(dry);
  json_decref(doc);
  return bad;
}

static json_t *redrive_run(kl__console_t *c, const char *body, size_t len,
                           int *status) {
  kl__letter_ref_t refs[KL__CONSOLE_REDRIVE_MAX];
  size_t n;
  int dry_run;
  json_t *bad = redrive_body(body, len, refs, &n, &dry_run, status);
  if (bad)
    return bad;
  if (!c->handler)
    return kl__console_err(status, 409,
                           "this console was started without --handler: a "
                           "redrive runs the fleet's handler on each letter; "
                           "start it with the workers' --handler SPEC");
  kl__redrive_opts_t opts = {.conf = c->conf,
                             .dlq_topic = c->dlq_topic,
                             .topic = c->topic,
                             .only = refs,
                             .nonly = n,
                             .store = c->store,
                             .handler = c->handler->fn,
                             .handler_opaque = c->handler->opaque,
                             .dry_run = dry_run,
                             .dry_run_handler = c->handler->store_only,
                             .stop = &kl__cli_stop};
  kl__redrive_t *r = NULL;
  kl_err_t err = kl__redrive_run(&opts, &r);
  if (err)
    return kl__console_err(status, err == KL_ENOTFOUND ? 404 : 503,
                           "cannot redrive: %s", kl_err_detail());
  json_t *doc = kl__redrive_cmd_json(r, &opts);
  size_t read, ntaken;
  kl__redrive_results(r, &read);
  const kl__replay_part_t *taken = kl__redrive_taken(r, &ntaken);
  json_t *fenced = json_array();
  for (size_t i = 0; i < ntaken && !dry_run; i++) {
    int32_t p = taken[i].partition;
    if (p >= 0 && p < KL__CONSOLE_PARTS_MAX && !c->seen_epoch[p])
      c->seen_epoch[p] = taken[i].previous_epoch; /* what it fenced */
    kl__console_epoch_seen(c, p, taken[i].epoch, "redrive");
  }
  for (size_t i = 0; i < ntaken; i++)
    json_array_append_new(
        fenced,
        json_pack("{s:i, s:I, s:I}", "partition", (int)taken[i].partition,
                  "epoch", (json_int_t)taken[i].epoch, "previous_epoch",
                  (json_int_t)taken[i].previous_epoch));
  json_object_set_new(doc, "taken", fenced);
  json_object_set_new(doc, "not_found", json_integer((json_int_t)(n - read)));
  kl__redrive_destroy(r);
  *status = 200;
  return doc;
}

int kl__console_post(kl__console_t *c, const char *path, const char *body,
                     size_t len, json_t **doc) {
  int status = 0;
  if (strcmp(path, "/api/redrive") == 0)
    *doc = redrive_run(c, body, len, &status);
  return status;
}
