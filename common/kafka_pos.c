#include "common/kafka_pos.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/log.h"
#include "common/units.h"

#define KL_POS_FORMS                                                           \
  "an offset, beginning, end, watermark, @MS (ms since 1970), "                \
  "@YYYY-MM-DDTHH:MM:SSZ or @-DURATION (@-15m, @-2h, @-7d)"

static int parse_i64(const char *s, int64_t *out) {
  return kl__units_digits(s, strlen(s), out);
}

/* The fields of "YYYY-MM-DDTHH:MM:SS" at fixed places, digits only (no
 * signs or spaces, which sscanf's %d would take). */
static int parse_iso_fields(const char *s, int64_t f[6]) {
  static const char form[] = "dddd-dd-ddTdd:dd:dd";
  static const unsigned char at[6] = {0, 5, 8, 11, 14, 17};
  if (strlen(s) < sizeof(form) - 1)
    return -1;
  for (size_t i = 0; i + 1 < sizeof(form); i++)
    if (form[i] != 'd' && s[i] != form[i])
      return -1;
  for (int i = 0; i < 6; i++)
    if (kl__units_digits(s + at[i], i ? 2 : 4, &f[i]) != 0)
      return -1;
  return 0;
}

/* "2024-05-01T12:00:00Z" or with ".123" before the Z, UTC only. */
static int parse_iso(const char *s, int64_t *ms) {
  int64_t f[6];
  int frac = 0;
  if (parse_iso_fields(s, f) != 0 || f[1] < 1 || f[1] > 12 || f[2] < 1 ||
      f[2] > 31 || f[3] > 23 || f[4] > 59 || f[5] > 60)
    return -1;
  s += 19;
  if (*s == '.') {
    int digits = 0;
    for (s++; *s >= '0' && *s <= '9'; s++, digits++)
      if (digits < 3)
        frac = frac * 10 + (*s - '0');
    if (digits == 0)
      return -1;
    for (; digits < 3; digits++)
      frac *= 10;
  }
  if (strcmp(s, "Z") != 0)
    return -1;
  struct tm tm;
  memset(&tm, 0, sizeof(tm));
  tm.tm_year = (int)f[0] - 1900;
  tm.tm_mon = (int)f[1] - 1;
  tm.tm_mday = (int)f[2];
  tm.tm_hour = (int)f[3];
  tm.tm_min = (int)f[4];
  tm.tm_sec = (int)f[5];
  time_t t = timegm(&tm);
  if (t < 0)
    return -1;
  *ms = (int64_t)t * 1000 + frac;
  return 0;
}

/* "90s", "15m", "2h", "7d", "500ms" into ms: common/units.h's rules. */
static int parse_duration(const char *s, int64_t *ms) {
  return kl__units_parse("@-DURATION", s, KL__UNITS_DURATION, 0, INT64_MAX,
                         ms) == KL_OK
             ? 0
             : -1;
}

static kl_err_t parse_time(const char *text, int64_t now_ms, int64_t *ms) {
  const char *t = text + 1;
  int64_t d;
  if (*t == '-' && parse_duration(t + 1, &d) == 0 && d <= now_ms) {
    *ms = now_ms - d;
    return KL_OK;
  }
  if (parse_i64(t, ms) == 0 || parse_iso(t, ms) == 0)
    return KL_OK;
  return kl__err(KL_EINVAL,
                 "position \"%s\" is not a time: use @MS (ms "
                 "since 1970), @YYYY-MM-DDTHH:MM:SSZ or "
                 "@-DURATION (@-15m, @-2h, @-7d)",
                 text);
}

kl_err_t kl__pos_parse(const char *text, int64_t now_ms, kl__pos_t *pos) {
  static const struct {
    const char *name;
    kl__pos_kind_t kind;
  } names[] = {{"beginning", KL__POS_BEGINNING},
               {"earliest", KL__POS_BEGINNING},
               {"end", KL__POS_END},
               {"latest", KL__POS_END},
               {"watermark", KL__POS_WATERMARK}};
  if (!text || !*text)
    return kl__err(KL_EINVAL, "position is empty: use " KL_POS_FORMS);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strcmp(text, names[i].name) == 0) {
      *pos = (kl__pos_t){names[i].kind, 0};
      return KL_OK;
    }
  if (text[0] == '@') {
    int64_t ms;
    kl_err_t err = parse_time(text, now_ms, &ms);
    if (!err)
      *pos = (kl__pos_t){KL__POS_TIME, ms};
    return err;
  }
  int64_t off;
  if (parse_i64(text, &off) != 0)
    return kl__err(KL_EINVAL, "position \"%s\" is not one of " KL_POS_FORMS,
                   text);
  *pos = (kl__pos_t){KL__POS_OFFSET, off};
  return KL_OK;
}

const char *kl__pos_format(const kl__pos_t *pos, char *buf, size_t size) {
  switch (pos->kind) {
  case KL__POS_BEGINNING:
    snprintf(buf, size, "beginning");
    break;
  case KL__POS_END:
    snprintf(buf, size, "end");
    break;
  case KL__POS_WATERMARK:
    snprintf(buf, size, "watermark");
    break;
  case KL__POS_TIME:
    snprintf(buf, size, "@%" PRId64, pos->value);
    break;
  default:
    snprintf(buf, size, "%" PRId64, pos->value);
    break;
  }
  return buf;
}

/* ---- partition lists --------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Parses one "N" or "N-M" item into [*lo, *hi]. */
static int parse_item(const char *item, size_t len, int64_t *lo, int64_t *hi) {
  char buf[32];
  if (len == 0 || len >= sizeof(buf))
    return -1;
  memcpy(buf, item, len);
  buf[len] = '\0';
  char *dash = strchr(buf, '-');
  if (dash)
    *dash = '\0';
  if (parse_i64(buf, lo) != 0)
    return -1;
  if (!dash)
    *hi = *lo;
  else if (parse_i64(dash + 1, hi) != 0 || *hi < *lo)
    return -1;
  return 0;
}

static kl_err_t partitions_all(int32_t partitions, int32_t **out,
                               size_t *count) {
  int32_t *list = malloc((size_t)partitions * sizeof(*list));
  if (!list)
    return KL_ENOMEM;
  for (int32_t i = 0; i < partitions; i++)
    list[i] = i;
  *out = list;
  *count = (size_t)partitions;
  return KL_OK;
}

kl_err_t kl__pos_partitions(const char *text, int32_t partitions, int32_t **out,
                            size_t *count) {
  if (!text || strcmp(text, "all") == 0)
    return partitions_all(partitions, out, count);
  int32_t *list = malloc((size_t)partitions * sizeof(*list));
  char *seen = calloc((size_t)partitions, 1);
  size_t n = 0;
  kl_err_t err = list && seen ? KL_OK : KL_ENOMEM;
  for (const char *s = text; !err && *s;) {
    size_t len = strcspn(s, ",");
    int64_t lo = 0, hi = -1; /* set by parse_item; -O2 cannot tell */
    if (parse_item(s, len, &lo, &hi) != 0)
      err = kl__err(KL_EINVAL,
                    "partition list \"%s\": \"%.*s\" is not a "
                    "partition or a range N-M; use 0,2,5-7 or all",
                    text, (int)len, s);
    else if (hi >= partitions)
      err = kl__err(KL_EINVAL,
                    "partition %" PRId64 " does not exist: the "
                    "topic has partitions 0..%" PRId32,
                    hi, partitions - 1);
    for (int64_t p = lo; !err && p <= hi; p++)
      if (!seen[p]) {
        seen[p] = 1;
        list[n++] = (int32_t)p;
      }
    s += len;
    if (*s == ',')
      s++;
  }
  free(seen);
  if (!err && n == 0)
    err = kl__err(KL_EINVAL, "partition list \"%s\" is empty", text);
  if (err) {
    free(list);
    return err;
  }
  qsort(list, n, sizeof(*list), cmp_i32);
  *out = list;
  *count = n;
  return KL_OK;
}

/* ---- resolution ------------------------------------------------------- */

kl_err_t kl__kafka_partition_count(rd_kafka_t *rk, const char *topic,
                                   int timeout_ms, int32_t *count) {
  const struct rd_kafka_metadata *md = NULL;
  kl_err_t err = kl__kafka_metadata(rk, topic, timeout_ms, &md);
  if (err)
    return err;
  rd_kafka_resp_err_t kerr = md->topic_cnt == 1
                                 ? md->topics[0].err
                                 : RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
  if (!kerr && md->topics[0].partition_cnt == 0)
    kerr = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
  err = kl__kafka_err(kerr);
  if (err == KL_ENOTFOUND)
    kl__err(err, "topic %s does not exist: check -t and -b", topic);
  else if (err)
    kl__err(err, "topic %s: %s", topic, rd_kafka_err2str(kerr));
  else
    *count = md->topics[0].partition_cnt;
  rd_kafka_metadata_destroy(md);
  return err;
}

kl_err_t kl__kafka_partition_count_new(rd_kafka_t *rk, const char *topic,
                                       int timeout_ms, int32_t *count) {
  int64_t deadline = kl__mono_ns() + (int64_t)KL__TOPIC_NEW_GRACE_MS * 1000000;
  kl_err_t err;
  while ((err = kl__kafka_partition_count(rk, topic, timeout_ms, count)) ==
             KL_ENOTFOUND &&
         kl__mono_ns() < deadline)
    kl__sleep_ms(250);
  return err;
}

/* Looks up the first offset at or after @p ms for every range; -1 (no such
 * record) becomes the high watermark. */
static kl_err_t resolve_time(rd_kafka_t *rk, const char *topic,
                             kl__tp_range_t *ranges, size_t count, int64_t ms,
                             int for_end, int timeout_ms) {
  rd_kafka_topic_partition_list_t *l =
      rd_kafka_topic_partition_list_new((int)count);
  for (size_t i = 0; i < count; i++)
    rd_kafka_topic_partition_list_add(l, topic, ranges[i].partition)->offset =
        ms;
  rd_kafka_resp_err_t kerr = rd_kafka_offsets_for_times(rk, l, timeout_ms);
  kl_err_t err = KL_OK;
  for (int i = 0; !kerr && i < l->cnt; i++) {
    rd_kafka_topic_partition_t *tp = &l->elems[i];
    kl__tp_range_t *r = &ranges[i];
    if (tp->err) {
      err = kl__err(kl__kafka_err(tp->err),
                    "offset of time %" PRId64 " in %s "
                    "partition %" PRId32 ": %s",
                    ms, topic, tp->partition, rd_kafka_err2str(tp->err));
      break;
    }
    int64_t off = tp->offset < 0 ? r->high : tp->offset;
    off = off < r->low ? r->low : off > r->high ? r->high : off;
    if (for_end)
      r->end = off;
    else
      r->start = off;
  }
  if (kerr)
    err = kl__err(kl__kafka_err(kerr),
                  "offsets of time %" PRId64 " in %s: "
                  "%s",
                  ms, topic, rd_kafka_err2str(kerr));
  rd_kafka_topic_partition_list_destroy(l);
  return err;
}

static int64_t pos_clamp(int64_t v, const kl__tp_range_t *r) {
  return v < r->low ? r->low : v > r->high ? r->high : v;
}

static void resolve_plain(kl__tp_range_t *r, const kl__pos_t *from,
                          const kl__pos_t *to) {
  switch (from->kind) {
  case KL__POS_BEGINNING:
    r->start = r->low;
    break;
  case KL__POS_END:
    r->start = r->high;
    break;
  case KL__POS_WATERMARK:
    r->start = -1;
    break;
  case KL__POS_OFFSET:
    r->start = pos_clamp(from->value, r);
    break;
  default:
    break; /* times are looked up together */
  }
  switch (to->kind) {
  case KL__POS_BEGINNING:
    r->end = r->low;
    break;
  case KL__POS_OFFSET:
    r->end = pos_clamp(to->value, r);
    break;
  case KL__POS_TIME:
    break;
  default:
    r->end = r->high;
    break;
  }
}

kl_err_t kl__kafka_resolve(rd_kafka_t *rk, const char *topic,
                           kl__tp_range_t *ranges, size_t count,
                           const kl__pos_t *from, const kl__pos_t *to,
                           int timeout_ms) {
  if (to->kind == KL__POS_WATERMARK)
    return kl__err(KL_EINVAL, "--to watermark is not a position to stop at: "
                              "use an offset, @TIME or end");
  for (size_t i = 0; i < count; i++) {
    kl__tp_range_t *r = &ranges[i];
    rd_kafka_resp_err_t kerr = rd_kafka_query_watermark_offsets(
        rk, topic, r->partition, &r->low, &r->high, timeout_ms);
    if (kerr)
      return kl__err(kl__kafka_err(kerr),
                     "cannot read the offsets of %s "
                     "partition %" PRId32 ": %s; check -b",
                     topic, r->partition, rd_kafka_err2str(kerr));
    resolve_plain(r, from, to);
  }
  kl_err_t err = KL_OK;
  if (from->kind == KL__POS_TIME)
    err = resolve_time(rk, topic, ranges, count, from->value, 0, timeout_ms);
  if (!err && to->kind == KL__POS_TIME)
    err = resolve_time(rk, topic, ranges, count, to->value, 1, timeout_ms);
  return err;
}

/* ---- reading ranges ----------------------------------------------------- */

kl_err_t kl__kafka_reader_new(const kl_conf_t *conf, const char *client_id,
                              const char *reset, rd_kafka_t **out) {
  const char *const defaults[] = {"client.id",
                                  client_id,
                                  "group.id",
                                  client_id,
                                  "enable.auto.commit",
                                  "false",
                                  "enable.auto.offset.store",
                                  "false",
                                  "enable.partition.eof",
                                  "true",
                                  "auto.offset.reset",
                                  reset,
                                  NULL};
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  kl_err_t err = kl__kafka_conf_apply(kconf, conf, defaults);
  if (err) {
    rd_kafka_conf_destroy(kconf);
    return err;
  }
  char errstr[512];
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, sizeof(errstr));
  if (!rk) {
    rd_kafka_conf_destroy(kconf);
    return kl__err(KL_EKAFKA, "cannot create a consumer: %s", errstr);
  }
  rd_kafka_poll_set_consumer(rk);
  *out = rk;
  return KL_OK;
}

static kl_err_t read_assign(rd_kafka_t *rk, const char *topic,
                            const kl__tp_range_t *ranges, size_t count,
                            size_t *open) {
  rd_kafka_topic_partition_list_t *l =
      rd_kafka_topic_partition_list_new((int)count);
  *open = 0;
  for (size_t i = 0; i < count; i++)
    if (ranges[i].start < ranges[i].end) {
      rd_kafka_topic_partition_list_add(l, topic, ranges[i].partition)->offset =
          ranges[i].start;
      (*open)++;
    }
  rd_kafka_resp_err_t kerr = *open ? rd_kafka_assign(rk, l) : 0;
  rd_kafka_topic_partition_list_destroy(l);
  return kerr ? kl__err(kl__kafka_err(kerr),
                        "cannot assign the partitions of %s: %s", topic,
                        rd_kafka_err2str(kerr))
              : KL_OK;
}

/* The range of @p partition still being read, or NULL. */
static kl__tp_range_t *read_range(kl__tp_range_t *ranges, size_t count,
                                  int32_t partition) {
  for (size_t i = 0; i < count; i++)
    if (ranges[i].partition == partition && ranges[i].start < ranges[i].end)
      return &ranges[i];
  return NULL;
}

/* One polled message; returns nonzero to stop. The range's start moves
 * with the reading, up to its end (done). */
static int read_one(rd_kafka_message_t *m, kl__tp_range_t *r, size_t *open,
                    kl__kafka_read_fn *cb, void *opaque) {
  int flags = 0;
  if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    if (r && m->offset >= r->end)
      r->start = r->end;
  } else if (m->err) {
    KL_LOG_W("kafka", "consume: %s", rd_kafka_message_errstr(m));
  } else if (r && m->offset < r->end) {
    r->start = m->offset + 1;
    flags = cb(opaque, m);
  } else if (r) {
    r->start = r->end;
  }
  if (r && r->start >= r->end)
    (*open)--;
  if (!(flags & KL__READ_KEEP))
    rd_kafka_message_destroy(m);
  return flags & KL__READ_STOP;
}

kl_err_t kl__kafka_read(rd_kafka_t *rk, const char *topic,
                        kl__tp_range_t *ranges, size_t count,
                        kl__kafka_read_fn *cb, void *opaque,
                        volatile int *stop) {
  size_t open;
  kl_err_t err = read_assign(rk, topic, ranges, count, &open);
  while (!err && open > 0 && !(stop && *stop)) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
    if (m &&
        read_one(m, read_range(ranges, count, m->partition), &open, cb, opaque))
      break;
  }
  rd_kafka_assign(rk, NULL);
  return err;
}
