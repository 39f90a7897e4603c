/* The console's timers (cli/console.h): the delayed events the store holds
 * for the topic, the soonest first, in the rows `keylane store timers
 * --json` prints (cli/store_timers_row.h); and those of one key. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/console.h"
#include "cli/store_timers_row.h"
#include "common/http.h"
#include "common/internal.h"
#include "common/units.h"
#include "store/timers.h"

#define CTIMERS_PARAMS "partition=, key=, limit= and payload="

typedef struct ctimers_kept {
  int64_t due;
  int32_t partition;
  uint64_t h;
  json_t *row;
} ctimers_kept_t;

/* A page being read: the soonest @p limit timers seen so far, in (due,
 * partition, h) order, the order each partition's are read in; its memory
 * is the page's, whatever the store holds. */
typedef struct ctimers_page {
  kl__console_t *console;
  kl_decoder_t *decoder;
  const char *key; /* NULL: every key */
  size_t key_len;
  int32_t only;          /* the partition asked for; -1: every one */
  int32_t partition;     /* being read */
  int32_t held, highest; /* the topic's partitions the store holds */
  bool found;            /* .only is one of them */
  bool payload, more, malformed;
  size_t limit, n;
  ctimers_kept_t *kept;
  int64_t now;
  kl_err_t err;
} ctimers_page_t;

/* Whether @p a comes before (@p due, @p partition, @p h). */
static bool ctimers_before(const ctimers_kept_t *a, int64_t due,
                           int32_t partition, uint64_t h) {
  if (a->due != due)
    return a->due < due;
  if (a->partition != partition)
    return a->partition < partition;
  return a->h < h;
}

static int ctimers_row(void *opaque, const kl__timer_t *t, const void *key,
                       size_t key_len, const void *env, size_t env_len) {
  ctimers_page_t *pg = opaque;
  if (pg->key && (key_len != pg->key_len || memcmp(key, pg->key, key_len) != 0))
    return 0;
  size_t lo = 0, hi = pg->n; /* the first kept one that comes after t */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ctimers_before(&pg->kept[mid], t->due_ms, pg->partition, t->h))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == pg->limit) { /* so are the rest of this partition's */
    pg->more = true;
    return 1;
  }
  json_t *row = kl__store_timers_row(
      pg->decoder, pg->console->topic, pg->partition, t, key, key_len, env,
      env_len, pg->now, pg->payload, &pg->malformed);
  if (!row) {
    pg->err = kl__err(KL_ENOMEM, "out of memory for a timer's row");
    return 1;
  }
  if (pg->n == pg->limit) {
    json_decref(pg->kept[--pg->n].row);
    pg->more = true;
  }
  memmove(&pg->kept[lo + 1], &pg->kept[lo], (pg->n - lo) * sizeof(*pg->kept));
  pg->kept[lo] = (ctimers_kept_t){t->due_ms, pg->partition, t->h, row};
  pg->n++;
  return 0;
}

static int ctimers_part(void *opaque, const char *topic, int32_t partition,
                        const kl_partition_state_t *state) {
  ctimers_page_t *pg = opaque;
  (void)state;
  if (strcmp(topic, pg->console->topic) != 0)
    return 0;
  pg->held++;
  pg->highest = partition > pg->highest ? partition : pg->highest;
  if (pg->only >= 0 && partition != pg->only)
    return 0;
  pg->found = true;
  pg->partition = partition;
  pg->err = kl__timers_scan(pg->console->store, topic, partition, ctimers_row,
                            pg, NULL);
  return pg->err != KL_OK;
}

/* Reads @p pg's page; @returns its rows, or NULL with kl_err_detail(). */
static json_t *ctimers_read(ctimers_page_t *pg) {
  pg->kept = calloc(pg->limit, sizeof(*pg->kept));
  pg->decoder = kl_decoder_new();
  pg->now = kl__now_ms();
  kl_err_t err =
      pg->kept && pg->decoder
          ? kl_store_foreach_partition(pg->console->store, ctimers_part, pg)
          : kl__err(KL_ENOMEM, "out of memory");
  json_t *rows = err || pg->err ? NULL : json_array();
  for (size_t i = 0; i < pg->n; i++)
    if (rows)
      json_array_append_new(rows, pg->kept[i].row);
    else
      json_decref(pg->kept[i].row);
  free(pg->kept);
  kl_decoder_destroy(pg->decoder);
  return rows;
}

json_t *kl__console_key_timers(kl__console_t *console, int32_t partition,
                               const char *key, size_t len) {
  ctimers_page_t pg = {.console = console,
                       .key = key,
                       .key_len = len,
                       .only = partition,
                       .limit = KL__CONSOLE_TIMERS_PAGE};
  json_t *rows = ctimers_read(&pg);
  return json_pack("{s:o, s:b, s:s?}", "pending", rows ? rows : json_array(),
                   "more", pg.more, "error", rows ? NULL : kl_err_detail());
}

/* Each parameter once, and only those /api/timers takes. */
static json_t *ctimers_params(const char *query, int *status) {
  static const char *const names[] = {
      "partition=", "key=", "limit=", "payload="};
  int seen[4] = {0};
  for (const char *q = query; *q; q += strcspn(q, "&"), q += *q == '&') {
    size_t i = 0, len = strcspn(q, "&");
    while (i < 4 && strncmp(q, names[i], strlen(names[i])) != 0)
      i++;
    if (*q == '&')
      continue;
    if (i == 4)
      return kl__console_err(status, 400,
                             "/api/timers takes " CTIMERS_PARAMS " only; "
                             "drop \"%.*s\"",
                             (int)(len > 64 ? 64 : len), q);
    if (seen[i]++)
      return kl__console_err(status, 400,
                             "/api/timers: %.*s is given twice; give it once",
                             (int)strlen(names[i]) - 1, names[i]);
  }
  return NULL;
}

/* The query: partition=P, key=K (percent-encoded), limit=N, payload=0|1.
 * @returns NULL, or the error document. */
static json_t *ctimers_query(const char *query, ctimers_page_t *pg, char *key,
                             int *status) {
  json_t *bad = ctimers_params(query, status);
  size_t vlen;
  const char *v;
  int64_t n;
  if (bad)
    return bad;
  if ((v = kl__http_query(query, "partition", &vlen))) {
    if (kl__units_digits(v, vlen, &n) || n >= KL__CONSOLE_PARTS_MAX)
      return kl__console_err(status, 400,
                             "partition=%.*s is not a partition number 0..%d; "
                             "give one of the fleet's partitions",
                             (int)(vlen > 32 ? 32 : vlen), v,
                             KL__CONSOLE_PARTS_MAX - 1);
    pg->only = (int32_t)n;
  }
  if ((v = kl__http_query(query, "key", &vlen))) {
    if ((bad = kl__console_key_param(v, vlen, key, &pg->key_len, status)))
      return bad;
    pg->key = key;
  }
  if ((v = kl__http_query(query, "payload", &vlen))) {
    if (vlen != 1 || (*v != '0' && *v != '1'))
      return kl__console_err(status, 400,
                             "payload=%.*s is neither 1 (each timer's "
                             "payload too) nor 0 (without it)",
                             (int)(vlen > 32 ? 32 : vlen), v);
    pg->payload = *v == '1';
  }
  long limit = KL__CONSOLE_TIMERS_PAGE;
  if ((v = kl__http_query(query, "limit", &vlen)))
    bad = kl__console_limit(v, vlen, "timers", KL__CONSOLE_TIMERS_MAX, &limit,
                            status);
  pg->limit = (size_t)limit;
  return bad;
}

int kl__console_timers(kl__console_t *console, const char *query,
                       json_t **doc) {
  int status = 0;
  char *key = malloc(3 * KL_KEY_MAX);
  ctimers_page_t pg = {.console = console, .only = -1, .highest = -1};
  *doc = key ? ctimers_query(query, &pg, key, &status)
             : kl__console_err(&status, 503, "out of memory");
  json_t *rows = *doc ? NULL : ctimers_read(&pg);
  if (!*doc && !rows)
    *doc = kl__console_err(&status, 503, "cannot read the store's timers: %s",
                           kl_err_detail());
  else if (!*doc && pg.only >= 0 && !pg.found) {
    /* as `keylane store timers --partition` says: not an empty page */
    json_decref(rows);
    *doc = kl__console_err(
        &status, 404,
        "the store has no partition %" PRId32 " of topic %s: it has %" PRId32
        " partitions, the highest %" PRId32 "; ask for one of them",
        pg.only, console->topic, pg.held, pg.highest);
  }
  if (!*doc) {
    *doc = json_pack(
        "{s:s, s:o, s:i, s:b, s:I, s:b, s:o, s:o}", "topic", console->topic,
        "timers", rows, "limit", (int)pg.limit, "more", pg.more, "now_ms",
        (json_int_t)pg.now, "malformed", pg.malformed, "partition",
        pg.only >= 0 ? json_integer(pg.only) : json_null(), "key",
        pg.key ? kl__console_text(pg.key, pg.key_len) : json_null());
    status = 200;
  }
  free(key);
  return status;
}
