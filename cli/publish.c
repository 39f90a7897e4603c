/*
 * keylane publish: JSON lines on stdin, one event each, published with the
 * keylane producer; one JSON line per delivered event on stdout, in input
 * order.
 *
 * stdout lists exactly the events Kafka acknowledged, so a caller whose
 * run stopped (a bad line, a delivery failure, a signal) knows what to
 * send again. That is why a bad line is reported only after every line
 * before it was delivered (or failed) and printed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "event/event_json.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "common/internal.h"
#include "common/json_msgpack.h"
#include "keylane/producer.h"

#define KL_PUB_SUB "publish"
#define KL_PUB_LINE_MAX (2 * 1024 * 1024)
#define KL_PUB_FLUSH_NS (50 * 1000000LL) /* stdout is flushed this often */

/* One published line, from kl_publish() until it is printed. */
typedef struct kl_pub_entry {
  long line;
  char *key;
  size_t key_len;
  char *id; /* from the delivery report */
  size_t id_len;
  int state; /* 0 in flight, 1 delivered, 2 failed */
  int32_t partition;
  int64_t offset;
  char *reason;
} kl_pub_entry_t;

/* Entries in publish order: a ring of seq numbers [head, tail). */
typedef struct kl_pub {
  kl_producer_t *producer;
  const char *topic;
  kl_pub_entry_t *ring;
  size_t cap;
  uint64_t head, tail;
  long failed;
  int64_t flushed_ns;
} kl_pub_t;

/* ---- the ring of entries ---- */

static kl_pub_entry_t *pub_entry(kl_pub_t *pub, uint64_t seq) {
  return &pub->ring[seq % pub->cap];
}

static int pub_grow(kl_pub_t *pub) {
  size_t cap = pub->cap ? pub->cap * 2 : 1024;
  kl_pub_entry_t *ring = calloc(cap, sizeof(*ring));
  if (!ring)
    return -1;
  for (uint64_t seq = pub->head; seq < pub->tail; seq++)
    ring[seq % cap] = *pub_entry(pub, seq);
  free(pub->ring);
  pub->ring = ring;
  pub->cap = cap;
  return 0;
}

static void pub_entry_free(kl_pub_entry_t *e) {
  free(e->key);
  free(e->id);
  free(e->reason);
  memset(e, 0, sizeof(*e));
}

/* ---- delivery and output ---- */

/* Runs on the publishing thread, from inside the producer's calls. */
static void pub_dr(void *opaque, const kl_delivery_t *d) {
  kl_pub_t *pub = opaque;
  kl_pub_entry_t *e = pub_entry(pub, (uint64_t)(uintptr_t)d->opaque);
  e->id = malloc(d->id_len + 1);
  if (e->id) {
    memcpy(e->id, d->id, d->id_len + 1);
    e->id_len = d->id_len;
  }
  e->partition = d->partition;
  e->offset = d->offset;
  e->state = d->err == KL_OK && e->id ? 1 : 2;
  if (d->err)
    e->reason = strdup(d->errmsg ? d->errmsg : kl_strerror(d->err));
}

static void pub_print(const kl_pub_entry_t *e) {
  json_t *o = json_pack("{s:s%,s:s%,s:i,s:I}", "key", e->key, e->key_len, "id",
                        e->id, e->id_len, "partition", (int)e->partition,
                        "offset", (json_int_t)e->offset);
  if (o)
    json_dumpf(o, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  json_decref(o);
}

/* Prints the delivered prefix, in input order; failures go to stderr. */
static void pub_print_ready(kl_pub_t *pub, int force_flush) {
  int printed = 0;
  while (pub->head < pub->tail) {
    kl_pub_entry_t *e = pub_entry(pub, pub->head);
    if (e->state == 0)
      break;
    if (e->state == 1) {
      pub_print(e);
      printed = 1;
    } else {
      pub->failed++;
      fprintf(stderr,
              "keylane publish: line %ld (key %.*s): not delivered: "
              "%s\n",
              e->line, (int)e->key_len, e->key,
              e->reason ? e->reason : "out of memory");
    }
    pub_entry_free(e);
    pub->head++;
  }
  int64_t now = kl__mono_ns();
  if ((printed || force_flush) &&
      (force_flush || now - pub->flushed_ns > KL_PUB_FLUSH_NS)) {
    fflush(stdout);
    pub->flushed_ns = now;
  }
}

/* Waits for every delivery report, printing as they come. Bounded by
 * librdkafka's message.timeout.ms, after which an event is failed. */
static void pub_drain(kl_pub_t *pub) {
  while (kl_producer_inflight(pub->producer) > 0) {
    kl_producer_poll(pub->producer, 100);
    pub_print_ready(pub, 0);
  }
  pub_print_ready(pub, 1);
}

/* ---- one line ---- */

#define KL_PUB_ERR_MAX 512                   /* a line's problem */
#define KL_PUB_MSG_MAX (KL_PUB_ERR_MAX + 64) /* "line N: " + the problem */

/* Writes a line's problem into err (KL_PUB_ERR_MAX bytes); returns -1. */
static int pub_err(char *err, const char *fmt, ...) KL__PRINTF(2, 3);
static int pub_err(char *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, KL_PUB_ERR_MAX, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- the run ---- */

typedef enum { KL_PUB_NEXT, KL_PUB_BAD_LINE, KL_PUB_FAILED } kl_pub_step_t;

static kl_pub_step_t pub_send(kl_pub_t *pub, long lineno, const kl_event_t *ev,
                              char *err) {
  if (pub->tail - pub->head == pub->cap && pub_grow(pub)) {
    pub_err(err, "out of memory");
    return KL_PUB_FAILED;
  }
  kl_pub_entry_t *e = pub_entry(pub, pub->tail);
  e->line = lineno;
  e->key_len = ev->key_len;
  if (!(e->key = malloc(ev->key_len + 1))) {
    pub_err(err, "out of memory");
    return KL_PUB_FAILED;
  }
  memcpy(e->key, ev->key, ev->key_len);
  e->key[ev->key_len] = '\0';
  kl_err_t rc =
      kl_publish(pub->producer, pub->topic, ev, (void *)(uintptr_t)pub->tail);
  if (rc == KL_OK) {
    pub->tail++;
    return KL_PUB_NEXT;
  }
  pub_err(err, "%s", kl_err_detail());
  pub_entry_free(e);
  /* The event's own fault is the line's; anything else is the run's. */
  return rc == KL_EINVAL || (rc >= KL_EDECODE_TRUNCATED && rc <= KL_EDECODE_KEY)
             ? KL_PUB_BAD_LINE
             : KL_PUB_FAILED;
}

static kl_pub_step_t pub_line(kl_pub_t *pub, long lineno, const char *text,
                              size_t len, char *err) {
  json_error_t jerr;
  json_t *root =
      json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!root) {
    pub_err(err, "invalid JSON at column %d: %s", jerr.column, jerr.text);
    return KL_PUB_BAD_LINE;
  }
  /* The gateway's reading of an event: one set of rules for both. */
  kl__jevent_t je;
  kl_pub_step_t step = KL_PUB_BAD_LINE;
  kl_err_t e = kl__jevent_parse(&je, root, err, KL_PUB_ERR_MAX);
  if (e == KL_ENOMEM) {
    pub_err(err, "out of memory");
    step = KL_PUB_FAILED;
  } else if (e == KL_OK) {
    step = pub_send(pub, lineno, &je.ev, err);
  }
  kl__jevent_clear(&je);
  json_decref(root);
  return step;
}

/* Reads lines up to KL_PUB_LINE_MAX into buf (KL_PUB_LINE_MAX + 2 bytes),
 * counting bytes as they come: a line may hold a NUL (then it is invalid
 * JSON, not "empty" as strlen() would say).
 * @returns the length without the newline, -1 at the end, -2 too long. */
static long pub_read(char *buf) {
  size_t len = 0;
  int c;
  while ((c = getc_unlocked(stdin)) != EOF && c != '\n') {
    if (len == KL_PUB_LINE_MAX)
      return -2;
    buf[len++] = (char)c;
  }
  buf[len] = '\0';
  return c == EOF && len == 0 ? -1 : (long)len;
}

/* One input line, or why there is none to publish. */
static kl_pub_step_t pub_next(kl_pub_t *pub, long lineno, char *buf, long len,
                              char *err) {
  if (len == -2)
    pub_err(err, "the line is longer than %d bytes (2 MiB)", KL_PUB_LINE_MAX);
  else if (len == 0)
    pub_err(err, "the line is empty");
  else
    return pub_line(pub, lineno, buf, (size_t)len, err);
  return KL_PUB_BAD_LINE;
}

/* Publishes stdin; @returns the exit code, with msg (KL_PUB_MSG_MAX) set
 * when it is nonzero. */
static int pub_loop(kl_pub_t *pub, char *msg) {
  char *buf = malloc(KL_PUB_LINE_MAX + 2);
  if (!buf) {
    snprintf(msg, KL_PUB_MSG_MAX, "out of memory");
    return KL_EXIT_FAIL;
  }
  int rc = KL_EXIT_OK;
  long len;
  for (long lineno = 1; !kl__cli_stop && (len = pub_read(buf)) != -1;
       lineno++) {
    char problem[KL_PUB_ERR_MAX];
    kl_pub_step_t step = pub_next(pub, lineno, buf, len, problem);
    if (step != KL_PUB_NEXT) {
      snprintf(msg, KL_PUB_MSG_MAX, "line %ld: %s", lineno, problem);
      rc = step == KL_PUB_BAD_LINE ? KL_EXIT_USAGE : KL_EXIT_FAIL;
      break;
    }
    pub_print_ready(pub, 0);
  }
  if (rc == KL_EXIT_OK && kl__cli_stop) {
    snprintf(msg, KL_PUB_MSG_MAX,
             "interrupted; the events read so far were "
             "published");
    rc = KL_EXIT_FAIL;
  } else if (rc == KL_EXIT_OK && ferror(stdin)) {
    snprintf(msg, KL_PUB_MSG_MAX, "reading stdin: %s", strerror(errno));
    rc = KL_EXIT_FAIL;
  }
  free(buf);
  return rc;
}

static int pub_run(kl_conf_t *conf, const char *topic) {
  kl_pub_t pub = {.topic = topic};
  if (kl_producer_new(conf, pub_dr, &pub, &pub.producer) != KL_OK)
    return kl__cli_fail(KL_PUB_SUB, "%s", kl_err_detail());
  kl__cli_on_signals();
  char err[KL_PUB_MSG_MAX] = "";
  int rc = pub_loop(&pub, err);
  pub_drain(&pub); /* every good line before a bad one is delivered */
  kl_producer_destroy(pub.producer);
  free(pub.ring);
  if (pub.failed) {
    if (err[0])
      fprintf(stderr, "keylane publish: %s\n", err);
    return kl__cli_fail(KL_PUB_SUB,
                        "%ld events were not delivered (see "
                        "above); stdout lists those that were",
                        pub.failed);
  }
  if (rc == KL_EXIT_USAGE)
    return kl__cli_usage(KL_PUB_SUB, "%s", err);
  if (rc != KL_EXIT_OK)
    return kl__cli_fail(KL_PUB_SUB, "%s", err);
  return KL_EXIT_OK;
}

/* ---- flags ---- */

typedef struct pub_args {
  const char *topic;
} pub_args_t;

static const kl__opt_t pub_opts[] = {
    KL__OPT_BOOTSTRAP("the Kafka brokers, HOST:PORT[,HOST:PORT]"),
    {.name = "topic",
     .letter = 't',
     .kind = KL__OPT_STRING,
     .meta = "TOPIC",
     .off = offsetof(pub_args_t, topic),
     .required = "",
     .help = "the topic"},
    {.name = "partitions",
     .letter = 'p',
     .kind = KL__OPT_COUNT,
     .min = 1,
     .max = 100000,
     .key = "producer.expect.partitions",
     .shown = "",
     .help = "refuse to publish unless TOPIC has N partitions (unlike "
             "kcat's -p, not a partition to write to: keylane always routes "
             "by key)"},
    {0}};

static const kl__cmd_t pub_cmd = {
    .name = KL_PUB_SUB,
    .usage = "-b BOOTSTRAP -t TOPIC [-X NAME=VALUE ...] [-p N]",
    .no_args = "events are read from stdin",
    .about =
        "Reads one JSON object per line from stdin and publishes each as an\n"
        "event, routed by its key (acks=all, idempotent producer):\n"
        "\n"
        "  {\"key\": \"acct-42\", \"type\": \"credit\", \"id\": "
        "\"optional\",\n"
        "   \"payload\": <any JSON>, \"headers\": {\"name\": \"value\"}}\n"
        "\n"
        "  key      required, 1..1024 bytes: the entity; decides the "
        "partition\n"
        "  type     required, 1..255 bytes\n"
        "  id       optional idempotency key, 1..255 bytes; one is made\n"
        "           (UUIDv7) when it is absent\n"
        "  payload  any JSON value, stored as its msgpack encoding; or\n"
        "  payload_b64  raw bytes as base64 (not both; neither: empty)\n"
        "  headers  optional object of string values, at most 64\n"
        "  not_before  optional, ms since the Unix epoch: the event is not\n"
        "           applied before then; at most timer.max.delay (-X, 7d)\n"
        "           before or after now; or\n"
        "  delay    a duration from now, such as \"15m\" (ms, s, m, h, d;\n"
        "           not both)\n"
        "\n"
        "Prints {\"key\",\"id\",\"partition\",\"offset\"} per delivered "
        "event, in\n"
        "input order. A bad line (invalid JSON, a missing or unknown field, "
        "a\n"
        "limit exceeded, a not_before out of bounds, a line over 2 MiB) stops\n"
        "the run with exit 2 and a message naming the line, after every line\n"
        "before it was delivered and printed; the lines after it are not "
        "read.\n"
        "An event Kafka did not acknowledge is reported on stderr and the "
        "run\n"
        "exits 1; stdout lists exactly what was delivered.\n",
    .opts = pub_opts,
    .examples =
        "  echo "
        "'{\"key\":\"acct-1\",\"type\":\"credit\",\"payload\":{\"amount\":5}}' "
        "|\n"
        "    keylane publish -b 127.0.0.1:9092 -t events -p 12\n"
        "  keylane publish -b \"$BOOTSTRAP\" -t events -X linger.ms=20 "
        "< events.jsonl\n",
    .conf = true};

int kl__cmd_publish(int argc, char **argv) {
  kl_conf_t *conf = kl_conf_new();
  if (!conf)
    return kl__cli_fail(KL_PUB_SUB, "out of memory");
  pub_args_t a = {0};
  int first;
  int rc = kl__opts_parse(&pub_cmd, argc, argv, &a, conf, &first);
  if (rc < 0)
    rc = pub_run(conf, a.topic);
  kl_conf_destroy(conf);
  return rc;
}
