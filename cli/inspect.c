/*
 * keylane inspect: the records of a topic as JSON lines, envelopes
 * decoded, for operators looking at what the log holds (a poison event, a
 * dead letter, a key's history). It only reads: no group, no commits.
 */
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "cli/cli.h"
#include "cli/inspect.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/json_msgpack.h"
#include "common/kafka_pos.h"
#include "keylane/event.h"
#include "keylane/producer.h"

#define SUB "inspect"
#define KL_INSPECT_TIMEOUT_MS 10000

typedef struct kl_inspect {
  kl_conf_t *conf;
  const char *topic, *partitions, *key;
  kl__cli_pos_t from, to;
  int64_t count; /* 0: no limit */
  uint64_t printed;
  rd_kafka_t *rk;
  kl_decoder_t *decoder;
} kl_inspect_t;

/* ---- one record ---------------------------------------------------------- */

static json_t *b64_json(const void *data, size_t len) {
  char *text = malloc(kl__base64_encoded_len(len) + 1);
  if (!text)
    return json_null();
  kl__base64_encode(data, len, text);
  json_t *s = json_string(text);
  free(text);
  return s;
}

/* Sets "name" to the bytes as text, or "name_b64" when they are not. */
static void set_bytes(json_t *o, const char *name, const void *data,
                      size_t len) {
  const unsigned char *p = data;
  int text = data != NULL;
  for (size_t i = 0; text && i < len; i++)
    text = p[i] >= 0x20 && p[i] != 0x7f;
  json_t *s = text ? json_stringn(data, len) : NULL; /* NULL: not UTF-8 */
  if (s) {
    json_object_set_new(o, name, s);
    return;
  }
  char b64name[64];
  snprintf(b64name, sizeof(b64name), "%s_b64", name);
  json_object_set_new(o, b64name, data ? b64_json(data, len) : json_null());
}

/* The worker's dead-letter headers (worker/dlq.h): "keylane.dlq.NAME". */
#define KL_DLQ_PREFIX "keylane.dlq."

static void dlq_field(json_t *dlq, const char *name, const char *value,
                      size_t len) {
  static const struct {
    const char *name, *key;
    int integer;
  } fields[] = {{"reason", "reason", 0},
                {"error", "error", 0},
                {"attempts", "attempts", 1},
                {"topic", "origin_topic", 0},
                {"partition", "origin_partition", 1},
                {"offset", "origin_offset", 1},
                {"first_failure_ms", "first_failure_ms", 1},
                {"last_failure_ms", "last_failure_ms", 1}};
  size_t plen = sizeof(KL_DLQ_PREFIX) - 1;
  if (strncmp(name, KL_DLQ_PREFIX, plen) != 0)
    return;
  name += plen;
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    if (strcmp(name, fields[i].name) != 0)
      continue;
    int64_t v = 0;
    int is_int = fields[i].integer && kl__units_digits(value, len, &v) == 0;
    json_object_set_new(dlq, fields[i].key,
                        is_int ? json_integer(v)
                               : json_stringn(value ? value : "", len));
    return;
  }
}

static void kafka_headers(json_t *o, const rd_kafka_message_t *m) {
  rd_kafka_headers_t *hdrs;
  if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
    return;
  json_t *all = json_object(), *dlq = json_object();
  const char *name;
  const void *val;
  size_t size;
  for (size_t i = 0; !rd_kafka_header_get_all(hdrs, i, &name, &val, &size);
       i++) {
    json_t *s = val ? json_stringn(val, size) : json_null();
    if (!s)
      s = json_pack("{so}", "$base64", b64_json(val, size));
    json_object_set_new(all, name, s);
    dlq_field(dlq, name, val, val ? size : 0);
  }
  json_object_set_new(o, "kafka_headers", all);
  if (json_object_size(dlq))
    json_object_set_new(o, "dead_letter", dlq);
  else
    json_decref(dlq);
}

static void envelope_json(json_t *o, const kl_event_t *ev) {
  set_bytes(o, "key", ev->key, ev->key_len);
  json_object_set_new(o, "id", json_stringn(ev->id, ev->id_len));
  json_object_set_new(o, "type", json_stringn(ev->type, ev->type_len));
  json_object_set_new(o, "ts", json_integer(ev->ts));
  if (ev->not_before > 0)
    json_object_set_new(o, "not_before", json_integer(ev->not_before));
  json_t *payload = NULL;
  if (kl__msgpack_to_json(ev->payload, ev->payload_len, &payload) == KL_OK)
    json_object_set_new(o, "payload", payload);
  else
    json_object_set_new(o, "payload_b64",
                        b64_json(ev->payload, ev->payload_len));
  json_t *h = json_object();
  for (size_t i = 0; i < ev->header_count; i++) {
    char name[KL_HEADER_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%.*s", (int)ev->headers[i].name_len,
             ev->headers[i].name);
    json_object_set_new(
        h, name, json_stringn(ev->headers[i].value, ev->headers[i].value_len));
  }
  json_object_set_new(o, "headers", h);
}

json_t *kl__inspect_record_json(kl_decoder_t *decoder,
                                const rd_kafka_message_t *m) {
  json_t *o = json_pack("{sIsI}", "partition", (json_int_t)m->partition,
                        "offset", (json_int_t)m->offset);
  kl_event_t ev;
  kl_err_t err =
      kl_event_decode(decoder, m->key, m->key_len, m->payload, m->len, &ev);
  if (err) {
    char why[600];
    snprintf(why, sizeof(why), "%s: %s", kl_err_name(err), kl_err_detail());
    json_object_set_new(o, "key_b64",
                        m->key ? b64_json(m->key, m->key_len) : json_null());
    json_object_set_new(o, "value_b64",
                        m->payload ? b64_json(m->payload, m->len)
                                   : json_null());
    json_object_set_new(o, "error", json_string(why));
  } else {
    envelope_json(o, &ev);
  }
  kafka_headers(o, m);
  return o;
}

static int key_matches(const kl_inspect_t *in, const rd_kafka_message_t *m) {
  if (!in->key)
    return 1;
  size_t len = strlen(in->key);
  return m->key_len == len && memcmp(m->key, in->key, len) == 0;
}

static void print_record(kl_inspect_t *in, const rd_kafka_message_t *m) {
  if (!key_matches(in, m))
    return;
  json_t *o = kl__inspect_record_json(in->decoder, m);
  json_dumpf(o, stdout, JSON_COMPACT);
  putchar('\n');
  json_decref(o);
  in->printed++;
}

/* ---- reading ---------------------------------------------------------- */

/* The partitions to read: -p, else the partition --key routes to, else
 * all. */
static kl_err_t inspect_ranges(kl_inspect_t *in, kl__tp_range_t **out,
                               size_t *count) {
  int32_t n;
  kl_err_t err =
      kl__kafka_partition_count(in->rk, in->topic, KL_INSPECT_TIMEOUT_MS, &n);
  if (err)
    return err;
  char routed[16];
  const char *list = in->partitions;
  if (!list && in->key) {
    snprintf(routed, sizeof(routed), "%d",
             (int)kl_partition(in->key, strlen(in->key), n));
    list = routed;
  }
  int32_t *parts;
  size_t cnt;
  if ((err = kl__pos_partitions(list, n, &parts, &cnt)) != KL_OK)
    return err;
  kl__tp_range_t *ranges = calloc(cnt, sizeof(*ranges));
  for (size_t i = 0; ranges && i < cnt; i++)
    ranges[i].partition = parts[i];
  free(parts);
  if (!ranges)
    return KL_ENOMEM;
  err = kl__kafka_resolve(in->rk, in->topic, ranges, cnt, &in->from.pos,
                          &in->to.pos, KL_INSPECT_TIMEOUT_MS);
  if (err) {
    free(ranges);
    return err;
  }
  *out = ranges;
  *count = cnt;
  return KL_OK;
}

static int inspect_record(void *opaque, rd_kafka_message_t *m) {
  kl_inspect_t *in = opaque;
  print_record(in, m);
  return in->count && in->printed >= (uint64_t)in->count ? KL__READ_STOP : 0;
}

static int inspect_run(kl_inspect_t *in) {
  kl__tp_range_t *ranges = NULL;
  size_t count = 0;
  in->decoder = kl_decoder_new();
  kl_err_t err = in->decoder ? kl__kafka_reader_new(in->conf, "keylane-inspect",
                                                    "earliest", &in->rk)
                             : KL_ENOMEM;
  if (!err)
    err = inspect_ranges(in, &ranges, &count);
  if (!err) {
    kl__cli_on_signals();
    err = kl__kafka_read(in->rk, in->topic, ranges, count, inspect_record, in,
                         &kl__cli_stop);
    fflush(stdout);
  }
  int rc = KL_EXIT_OK;
  if (err)
    rc = err == KL_EINVAL || err == KL_ENOTFOUND
             ? kl__cli_usage(SUB, "%s", kl_err_detail())
             : kl__cli_fail(SUB, "%s", kl_err_detail());
  free(ranges);
  if (in->rk)
    rd_kafka_destroy(in->rk);
  kl_decoder_destroy(in->decoder);
  return rc;
}

static const kl__opt_t inspect_opts[] = {
    KL__OPT_BOOTSTRAP(""),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(kl_inspect_t, topic),
     .required = "",
     .help = "topic to read (TOPIC.dlq: dead letters)"},
    {.name = "partition",
     .letter = 'p',
     .kind = KL__OPT_LIST,
     .off = offsetof(kl_inspect_t, partitions),
     .shown = "all, or the partition of --key",
     .help = "0,2,5-7 or all"},
    {.name = "from",
     .meta = "POS",
     .parse = kl__cli_pos_parse,
     .off = offsetof(kl_inspect_t, from),
     .def = "beginning",
     .help = "N, beginning, end, @MS, @2024-05-01T12:00:00Z or @-2h"},
    {.name = "to",
     .meta = "POS",
     .parse = kl__cli_pos_parse,
     .off = offsetof(kl_inspect_t, to),
     .def = "end",
     .help = "stop before: N, @TIME or end"},
    {.name = "count",
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = INT64_MAX,
     .off = offsetof(kl_inspect_t, count),
     .help = "print at most N records"},
    {.name = "key",
     .kind = KL__OPT_STRING,
     .parse = kl__cli_key_parse,
     .meta = "K",
     .off = offsetof(kl_inspect_t, key),
     .help = "only records of entity key K"},
    {0}};

static const kl__cmd_t inspect_cmd = {
    .name = SUB,
    .usage = "-b BOOTSTRAP -t TOPIC [-p P[,P...|all]] [--from POS] [--to POS] "
             "[--count N] [--key K]",
    .about =
        "Prints the records of TOPIC as JSON lines, one per record:\n"
        "  {\"partition\", \"offset\", \"key\", \"id\", \"type\", "
        "\"ts\",\n"
        "   \"not_before\" (a delayed event's, ms since the epoch),\n"
        "   \"payload\" (JSON when it is msgpack, else \"payload_b64\"),\n"
        "   \"headers\" (the envelope's), \"kafka_headers\" (the record's),\n"
        "   \"dead_letter\" {reason, error, attempts, origin_topic,\n"
        "                  origin_partition, origin_offset, "
        "first_failure_ms,\n"
        "                  last_failure_ms}: the worker's keylane.dlq.* "
        "headers,\n"
        "                  on records of the dead-letter topic}\n"
        "A record that is not a valid envelope prints its raw key and value "
        "as\n"
        "\"key_b64\" and \"value_b64\" with the decoder's \"error\". A key "
        "that\n"
        "is not text is printed as \"key_b64\". Reads up to the high "
        "watermark\n"
        "at the start; it joins no group and commits nothing.\n",
    .opts = inspect_opts,
    .examples =
        "  keylane inspect -b kafka:9092 -t events --key acct-42\n"
        "  keylane inspect -b kafka:9092 -t events -p 3 --from 1200 --count "
        "5\n"
        "  keylane inspect -b kafka:9092 -t events.dlq | jq .dead_letter\n",
    .conf = true};

int kl__cmd_inspect(int argc, char **argv) {
  kl_inspect_t in = {.conf = kl_conf_new()};
  int first;
  int rc = in.conf
               ? kl__opts_parse(&inspect_cmd, argc, argv, &in, in.conf, &first)
               : kl__cli_fail(SUB, "out of memory");
  if (rc < 0) {
    if (in.from.pos.kind == KL__POS_WATERMARK)
      rc = kl__cli_usage(SUB, "--from watermark needs a store; inspect reads "
                              "only the log: use an offset or @TIME");
    else
      rc = inspect_run(&in);
  }
  kl_conf_destroy(in.conf);
  return rc;
}
