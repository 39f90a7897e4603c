#include "worker/letters.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/strbuf.h"
#include "common/units.h"

#define KL_LETTERS_TIMEOUT_MS 10000

/* Copies header @p name into @p buf; 0 when present. */
static int letters_header(rd_kafka_headers_t *h, const char *name, char *buf,
                          size_t size) {
  const void *val;
  size_t len;
  if (!h || rd_kafka_header_get_last(h, name, &val, &len) || !val ||
      len >= size)
    return -1;
  memcpy(buf, val, len);
  buf[len] = '\0';
  return 0;
}

static int header_i64(rd_kafka_headers_t *h, const char *name, int64_t *out) {
  char buf[32];
  if (letters_header(h, name, buf, sizeof(buf)))
    return -1;
  return kl__units_digits(buf, strlen(buf), out);
}

/* Parses the origin of @p l->msg from its headers. */
static void letter_parse(kl__letter_t *l) {
  rd_kafka_headers_t *h = NULL;
  rd_kafka_message_headers(l->msg, &h);
  int64_t partition, offset;
  l->dlq_partition = l->msg->partition;
  l->dlq_offset = l->msg->offset;
  l->partition = -1;
  l->offset = -1;
  if (letters_header(h, "keylane.dlq.topic", l->topic, sizeof(l->topic)) ||
      header_i64(h, "keylane.dlq.partition", &partition) ||
      header_i64(h, "keylane.dlq.offset", &offset) || partition > INT32_MAX) {
    l->topic[0] = '\0';
    return;
  }
  l->partition = (int32_t)partition;
  l->offset = offset;
  if (letters_header(h, "keylane.dlq.reason", l->reason, sizeof(l->reason)))
    l->reason[0] = '\0';
  if (letters_header(h, "keylane.dlq.destination", l->destination,
                     sizeof(l->destination)))
    l->destination[0] = '\0';
  /* Present at all, however long or empty its text: the letter is cut. */
  const void *why;
  size_t why_len;
  if (h &&
      !rd_kafka_header_get_last(h, "keylane.dlq.truncated", &why, &why_len))
    snprintf(l->truncated, sizeof(l->truncated), "%.*s",
             why && why_len ? (int)(why_len < 127 ? why_len : 127) : 2,
             why && why_len ? (const char *)why : "?");
  if (header_i64(h, "keylane.dlq.original_size", &l->original_size))
    l->original_size = -1;
}

static int letters_add(void *opaque, rd_kafka_message_t *m) {
  kl__letters_t *ls = opaque;
  kl__letter_t *v = kl__grow(ls->v, &ls->cap, ls->n, sizeof(*v), 64);
  if (!v)
    return KL__READ_STOP; /* reported by the caller as ENOMEM */
  ls->v = v;
  kl__letter_t *l = &ls->v[ls->n++];
  memset(l, 0, sizeof(*l));
  l->msg = m;
  letter_parse(l);
  return KL__READ_KEEP;
}

static int letter_cmp(const void *a, const void *b) {
  const kl__letter_t *x = a, *y = b;
  int c = strcmp(x->topic, y->topic);
  if (c)
    return c;
  if (x->partition != y->partition)
    return x->partition < y->partition ? -1 : 1;
  if (x->offset != y->offset)
    return x->offset < y->offset ? -1 : 1;
  return (x->dlq_offset > y->dlq_offset) - (x->dlq_offset < y->dlq_offset);
}

/* A dead-letter topic that does not exist is a typo: said so, with the
 * dead-letter topics there are, before a request that names it makes a
 * cluster that creates topics on first use create an empty one. */
static kl_err_t letters_topic_check(rd_kafka_t *rk, const char *topic) {
  const struct rd_kafka_metadata *md = NULL;
  kl_err_t err = kl__kafka_metadata_all(rk, KL_LETTERS_TIMEOUT_MS, &md);
  if (err || kl__kafka_metadata_find(md, topic)) {
    if (md)
      rd_kafka_metadata_destroy(md);
    return err;
  }
  kl__strbuf_t sb = KL__STRBUF_INIT;
  for (int i = 0; i < md->topic_cnt; i++) {
    const char *name = md->topics[i].topic;
    size_t len = strlen(name);
    if (len > 4 && strcmp(name + len - 4, ".dlq") == 0)
      kl__strbuf_printf(&sb, "%s%s", sb.len ? ", " : "", name);
  }
  char *list = kl__strbuf_take(&sb, NULL);
  err = kl__err(KL_ENOTFOUND,
                "dead-letter topic %s does not exist; the cluster's "
                "dead-letter topics are: %s",
                topic, list && *list ? list : "none");
  free(list);
  rd_kafka_metadata_destroy(md);
  return err;
}

static kl_err_t letters_ranges(rd_kafka_t *rk, const char *topic,
                               const kl__pos_t *from, const kl__pos_t *to,
                               kl__tp_range_t **out, size_t *count) {
  int32_t n;
  kl_err_t err = letters_topic_check(rk, topic);
  if (!err)
    err = kl__kafka_partition_count(rk, topic, KL_LETTERS_TIMEOUT_MS, &n);
  if (err)
    return err;
  kl__tp_range_t *ranges = calloc((size_t)n, sizeof(*ranges));
  if (!ranges)
    return KL_ENOMEM;
  for (int32_t i = 0; i < n; i++)
    ranges[i].partition = i;
  err = kl__kafka_resolve(rk, topic, ranges, (size_t)n, from, to,
                          KL_LETTERS_TIMEOUT_MS);
  if (err) {
    free(ranges);
    return err;
  }
  *out = ranges;
  *count = (size_t)n;
  return KL_OK;
}

/* A reader of @p topic and its partitions' ranges resolved from @p from
 * and @p to; on failure nothing is left to free. */
static kl_err_t letters_open(const kl_conf_t *conf, const char *topic,
                             const kl__pos_t *from, const kl__pos_t *to,
                             rd_kafka_t **rk, kl__tp_range_t **ranges,
                             size_t *count) {
  *rk = NULL;
  *ranges = NULL;
  *count = 0;
  kl_err_t err = kl__kafka_reader_new(conf, "keylane-letters", "earliest", rk);
  if (!err && (err = letters_ranges(*rk, topic, from, to, ranges, count))) {
    rd_kafka_destroy(*rk);
    *rk = NULL;
  }
  return err;
}

/* Hands @p rk to @p out (its messages hold it) and sorts the letters by
 * @p cmp; on @p err, frees them instead. @returns @p err. */
static kl_err_t letters_done(kl__letters_t *out, rd_kafka_t *rk,
                             kl__tp_range_t *ranges, kl_err_t err,
                             int (*cmp)(const void *, const void *)) {
  free(ranges);
  out->rk = rk;
  if (err)
    kl__letters_clear(out);
  else if (out->n)
    qsort(out->v, out->n, sizeof(*out->v), cmp);
  return err;
}

kl_err_t kl__letters_read(const kl_conf_t *conf, const char *dlq_topic,
                          const kl__pos_t *from, const kl__pos_t *to,
                          volatile int *stop, kl__letters_t *out) {
  memset(out, 0, sizeof(*out));
  rd_kafka_t *rk;
  kl__tp_range_t *ranges;
  size_t count;
  kl_err_t err = letters_open(conf, dlq_topic, from, to, &rk, &ranges, &count);
  if (err)
    return err;
  err = kl__kafka_read(rk, dlq_topic, ranges, count, letters_add, out, stop);
  for (size_t i = 0; !err && i < count; i++)
    if (ranges[i].start < ranges[i].end && !(stop && *stop))
      err = kl__err(KL_ENOMEM, "out of memory reading the dead letters of %s",
                    dlq_topic);
  return letters_done(out, rk, ranges, err, letter_cmp);
}

/* ---- a bounded tail, newest first ---- */

typedef struct letters_tail {
  kl__letters_t *out;
  size_t max, scanned;
  kl__letters_keep_fn *keep;
  void *opaque;
  bool more;
} letters_tail_t;

/* Newer first: the record's timestamp, then its place. */
static int letter_newer(const kl__letter_t *x, const kl__letter_t *y) {
  int64_t tx = rd_kafka_message_timestamp(x->msg, NULL);
  int64_t ty = rd_kafka_message_timestamp(y->msg, NULL);
  if (tx != ty)
    return tx > ty ? -1 : 1;
  if (x->dlq_partition != y->dlq_partition)
    return x->dlq_partition < y->dlq_partition ? -1 : 1;
  return (x->dlq_offset < y->dlq_offset) - (x->dlq_offset > y->dlq_offset);
}

static int letter_newer_cmp(const void *a, const void *b) {
  return letter_newer(a, b);
}

static int letters_tail_add(void *opaque, rd_kafka_message_t *m) {
  letters_tail_t *t = opaque;
  kl__letter_t l;
  memset(&l, 0, sizeof(l));
  l.msg = m;
  letter_parse(&l);
  t->scanned++;
  if (t->keep && !t->keep(t->opaque, &l))
    return 0; /* destroyed by the reader */
  kl__letters_t *ls = t->out;
  if (ls->n == t->max) { /* full: the oldest of the kept and l goes */
    t->more = true;
    size_t oldest = 0;
    for (size_t i = 1; i < ls->n; i++)
      if (letter_newer(&ls->v[i], &ls->v[oldest]) > 0)
        oldest = i;
    if (!ls->n || letter_newer(&l, &ls->v[oldest]) > 0)
      return 0;
    rd_kafka_message_destroy(ls->v[oldest].msg);
    ls->v[oldest] = l;
    return KL__READ_KEEP;
  }
  kl__letter_t *v = kl__grow(ls->v, &ls->cap, ls->n, sizeof(*v), 64);
  if (!v)
    return KL__READ_STOP;
  ls->v = v;
  ls->v[ls->n++] = l;
  return KL__READ_KEEP;
}

/* letters_open() of the partitions' retained logs, for reads that place
 * their ranges themselves; empties @p out. */
static kl_err_t letters_open_ends(const kl_conf_t *conf, const char *topic,
                                  kl__letters_t *out, rd_kafka_t **rk,
                                  kl__tp_range_t **ranges, size_t *count) {
  const kl__pos_t end = {KL__POS_END, 0};
  memset(out, 0, sizeof(*out));
  return letters_open(conf, topic, &end, &end, rk, ranges, count);
}

kl_err_t kl__letters_tail(const kl_conf_t *conf, const char *dlq_topic,
                          int64_t tail, size_t max, kl__letters_keep_fn *keep,
                          void *opaque, volatile int *stop, kl__letters_t *out,
                          size_t *scanned, bool *more) {
  letters_tail_t t = {out, max, 0, keep, opaque, false};
  rd_kafka_t *rk;
  kl__tp_range_t *ranges;
  size_t count;
  kl_err_t err = letters_open_ends(conf, dlq_topic, out, &rk, &ranges, &count);
  if (err)
    return err;
  for (size_t i = 0; i < count; i++) {
    ranges[i].end = ranges[i].high;
    ranges[i].start = ranges[i].high - ranges[i].low > tail
                          ? ranges[i].high - tail
                          : ranges[i].low;
  }
  if (max)
    err = kl__kafka_read(rk, dlq_topic, ranges, count, letters_tail_add, &t,
                         stop);
  if (scanned)
    *scanned = t.scanned;
  if (more)
    *more = t.more;
  return letters_done(out, rk, ranges, err, letter_newer_cmp);
}

kl_err_t kl__letters_read_at(const kl_conf_t *conf, const char *dlq_topic,
                             const kl__letter_ref_t *refs, size_t n,
                             volatile int *stop, kl__letters_t *out) {
  rd_kafka_t *rk;
  kl__tp_range_t *ranges;
  size_t count;
  kl_err_t err = letters_open_ends(conf, dlq_topic, out, &rk, &ranges, &count);
  for (size_t i = 0; !err && i < n && !(stop && *stop); i++) {
    const kl__letter_ref_t *ref = &refs[i];
    if (ref->partition < 0 || (size_t)ref->partition >= count ||
        ref->offset < ranges[ref->partition].low ||
        ref->offset >= ranges[ref->partition].high)
      continue;
    kl__tp_range_t one = ranges[ref->partition];
    one.start = ref->offset;
    one.end = ref->offset + 1;
    err = kl__kafka_read(rk, dlq_topic, &one, 1, letters_add, out, stop);
  }
  return rk ? letters_done(out, rk, ranges, err, letter_cmp) : err;
}

void kl__letters_clear(kl__letters_t *ls) {
  for (size_t i = 0; i < ls->n; i++)
    rd_kafka_message_destroy(ls->v[i].msg);
  free(ls->v);
  if (ls->rk)
    rd_kafka_destroy(ls->rk);
  memset(ls, 0, sizeof(*ls));
}

const kl__letter_t *kl__letters_find(const kl__letters_t *ls, const char *topic,
                                     int32_t partition, int64_t offset) {
  kl__letter_t key;
  memset(&key, 0, sizeof(key));
  snprintf(key.topic, sizeof(key.topic), "%s", topic);
  key.partition = partition;
  key.offset = offset;
  key.dlq_offset = -1; /* sorts before every letter of that origin */
  size_t lo = 0, hi = ls->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (letter_cmp(&ls->v[mid], &key) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  const kl__letter_t *l = lo < ls->n ? &ls->v[lo] : NULL;
  return l && l->partition == partition && l->offset == offset &&
                 strcmp(l->topic, topic) == 0
             ? l
             : NULL;
}

size_t kl__letter_key(const char *dlq_topic, const kl__letter_t *letter,
                      char *key) {
  int len = snprintf(key, KL__LETTER_KEY_MAX,
                     KL__LETTER_KEY_PREFIX "%s/%" PRId32 "/%" PRId64, dlq_topic,
                     letter->dlq_partition, letter->dlq_offset);
  return len < (int)KL__LETTER_KEY_MAX ? (size_t)len : KL__LETTER_KEY_MAX - 1;
}
