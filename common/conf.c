/*
 * Configuration: a table of keylane's own keys, each with a type, a default
 * and a range, checked when set; and "kafka.*" keys kept in order for
 * librdkafka.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conf.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "common/units.h"

#define KL_I64_MAX INT64_MAX
#define KL_GW_DURATION_MAX 86400000 /* a day */
static const kl__conf_key_t kl_keys[] = {
    {"producer.inflight.max", KL__CONF_INT, "100000", 1, 10000000, NULL,
     "events awaiting a delivery report before kl_publish() waits"},
    {"producer.enqueue.timeout.ms", KL__CONF_MS, "5000", 0, 3600000, NULL,
     "how long kl_publish() waits for room in a full budget"},
    {"producer.expect.partitions", KL__CONF_INT, "0", 0, 100000, NULL,
     "refuse to publish when a topic's partition count differs (0: the count "
     "seen at its first publish)"},
    {"producer.partitions.check.ms", KL__CONF_MS, "10000", 100, 3600000, NULL,
     "how often the producer reads its topics' partition counts; on a change "
     "it refuses to publish to the topic"},
    {"producer.follow_ups", KL__CONF_ENUM, "false", 0, 0, "false|true",
     "true only in the worker's outbox, whose producer publishes follow-ups "
     "with the ids keylane derived for them, which begin with '~'; a service "
     "leaves it false, and kl_publish() refuses such ids"},
    {"store.durability", KL__CONF_ENUM, "full", 0, 0, "full|meta|none",
     "full: fsync each commit; meta: skip the metadata fsync (an OS crash may "
     "undo the last commit); none: no fsync (an OS crash may undo recent "
     "commits)"},
    {"store.map.size", KL__CONF_SIZE, "256M", 1 << 20, KL_I64_MAX, NULL,
     "initial LMDB map size; it grows as needed up to store.map.max"},
    {"store.map.max", KL__CONF_SIZE, "64G", 1 << 20, KL_I64_MAX, NULL,
     "largest LMDB map size; past it commits fail with KL_ESTORE_FULL"},
    {"store.dedup.retention", KL__CONF_DURATION, "7d", 1000, KL_I64_MAX, NULL,
     "how long idempotency keys are kept (a waiting timer's until it fires "
     "or is cancelled); at least the topic's retention"},
    {"timer.max.delay", KL__CONF_DURATION, "7d", 1000, KL_I64_MAX, NULL,
     "the longest a delayed event may wait (its not_before less now): "
     "kl_publish() refuses a later one, a worker dead-letters it; at most "
     "store.dedup.retention (a worker and keylane replay refuse a longer "
     "one); a worker warns at start when the topic keeps records for less"},
    {"worker.retention.check", KL__CONF_ENUM, "refuse", 0, 0, "refuse|warn",
     "refuse: the worker does not run when the topic or its dead-letter "
     "topic keeps records longer than store.dedup.retention; warn: it runs, "
     "with a WARN and keylane_worker_retention_override 1"},
    {"store.create", KL__CONF_ENUM, "yes", 0, 0, "yes|no",
     "no: open an existing store only, never create one (what read-only "
     "commands use); a missing store is KL_ENOTFOUND"},
    {"store.pg.migrate", KL__CONF_ENUM, "auto", 0, 0, "auto|never",
     "PostgreSQL store: a database without keylane's schema is given it "
     "at open (auto), or refused, naming `keylane store migrate` (never: "
     "keylane worker's default, whose role creates nothing); an older "
     "schema is refused either way"},
    {"store.pg.pool", KL__CONF_INT, "4", 1, 64, NULL,
     "PostgreSQL store: connections per process at most, one per open batch; "
     "a worker keeps pool - 1 batches open and commits early past it, and "
     "refuses 1: it reads its outbox and timers on a second connection "
     "while a batch is open"},
    {"store.pg.idle.timeout", KL__CONF_DURATION, "60s", 0, KL_I64_MAX, NULL,
     "PostgreSQL store: the server ends a batch idle this long, releasing the "
     "row locks of a paused owner (0: the server's setting, read at open: "
     "batches and the handler timeout keep under it too)"},
    {"store.pg.connect.timeout", KL__CONF_DURATION, "10s", 0, 3600000, NULL,
     "PostgreSQL store: how long a connection attempt waits for the server "
     "(whole seconds, rounded up, at least 2: libpq's unit; 0: no bound but "
     "the OS's); a connect_timeout in the URI wins"},
    {"store.cache.max", KL__CONF_SIZE, "64M", 0, KL_I64_MAX, NULL,
     "PostgreSQL store: bytes of handler keys and values an owner keeps in "
     "memory between batches (LRU; dropped on a fence, a failed commit, an "
     "epoch change and a revoke); 0: off"},
    {"worker.group", KL__CONF_STR, "keylane", 0, 0, NULL, "consumer group id"},
    {"worker.group.protocol", KL__CONF_ENUM, "classic", 0, 0,
     "classic|consumer",
     "consumer: KIP-848's group protocol (librdkafka 2.12+, Apache Kafka "
     "4.0+); the broker then sets the session and the assignment"},
    {"worker.session.timeout.ms", KL__CONF_MS, "10000", 100, 3600000, NULL,
     "consumer group session timeout"},
    {"worker.instance.id", KL__CONF_STR, "", 0, 0, NULL,
     "static group membership (KIP-345, librdkafka group.instance.id): a "
     "name unique in the group and kept across restarts (a StatefulSet's pod "
     "name, a systemd unit's instance); a worker restarted within "
     "worker.session.timeout.ms gets its partitions back without a "
     "rebalance, and does not leave the group at SIGTERM (empty: dynamic "
     "membership)"},
    {"worker.shutdown.timeout", KL__CONF_DURATION, "30s", 1000, 3600000, NULL,
     "at SIGTERM or SIGINT, how long keylane worker may take to finish and "
     "commit the events in flight and hand its partitions over; past it, or "
     "at a second signal, it aborts them uncommitted and exits 1 (the next "
     "owner applies them); give the supervisor's grace period more"},
    {"worker.fenced.retake.ms", KL__CONF_MS, "30000", 0, 3600000, NULL,
     "a lane fenced by something outside the group (replay, redrive) takes "
     "its partition back once the partition's state in the store (with the "
     "heartbeats such a fencer writes while it works) has not changed for "
     "this long (more than worker.session.timeout.ms); 0: never (it waits "
     "for the group to move it)"},
    {"worker.acquire.wait", KL__CONF_DURATION, "60s", 0, 3600000, NULL,
     "how long a worker keeps trying to take a partition the group assigned "
     "it while the store refuses (read-only, a revoked privilege) or does "
     "not answer; then it stops and exits 3 naming the cause (keep it "
     "under kafka.max.poll.interval.ms)"},
    {"worker.kafka.wait", KL__CONF_DURATION, "5m", 0, 7 * 86400000LL, NULL,
     "at start, how long a worker waits, with backoff, for Kafka to answer "
     "for its topic before it gives up (0: try once); /healthz is 503 "
     "meanwhile"},
    {"worker.store.wait", KL__CONF_DURATION, "5m", 0, 7 * 86400000LL, NULL,
     "at start, how long a worker tries again, with backoff, to open a "
     "PostgreSQL store that does not answer or refuses it (a server that "
     "starts after the worker, a role not yet made), logging each try with "
     "its cause, before it exits 1 (0: try once); a location that does not "
     "read and an LMDB store are not waited for"},
    {"worker.batch.max", KL__CONF_INT, "1000", 1, 100000, NULL,
     "events per store commit at most"},
    {"worker.batch.wait.ms", KL__CONF_MS, "20", 0, 10000, NULL,
     "how long a batch waits to fill while other events are still ready or "
     "running; with none left it is committed at once"},
    {"worker.expect.partitions", KL__CONF_INT, "0", 0, 100000, NULL,
     "refuse to run when the topic's partition count differs (0: the count "
     "seen at start)"},
    {"worker.misrouted", KL__CONF_ENUM, "dlq", 0, 0, "dlq|forward|apply",
     "a record whose key routes (murmur2) to another partition: dlq: "
     "dead-letter it (reason misrouted); forward: re-publish it to its key's "
     "partition; apply: apply it here (producers with one custom "
     "partitioner)"},
    {"worker.partitions.check.ms", KL__CONF_MS, "10000", 100, 3600000, NULL,
     "how often a running worker reads the topic's partition count; on a "
     "change it stops taking the topic"},
    {"worker.concurrency", KL__CONF_INT, "1", 1, 1024, NULL,
     "handler threads per worker; events of one key stay in order"},
    {"worker.handler.timeout.ms", KL__CONF_MS, "0", 0, 3600000, NULL,
     "the longest one handler call takes, declared, at most half of "
     "kafka.max.poll.interval.ms (300000) and below store.pg.idle.timeout "
     "on PostgreSQL (keylane worker --handler-timeout-ms sets it); 0: none "
     "declared. For an exec handler it is also the answer timeout, after "
     "which the child is killed and the event retried: 0 there means "
     "30000, an exec handler always has one"},
    {"worker.exec.window", KL__CONF_INT, "1", 1, 1024, NULL,
     "exec handler: events in flight to one child at most (pipelining, for "
     "children that echo \"seq\"; others get one at a time); the worker "
     "runs worker.concurrency children and concurrency x window executors"},
    {"worker.stall.ms", KL__CONF_MS, "300000", 0, 86400000, NULL,
     "a partition that holds records and whose watermark has not moved for "
     "this long is stalled: /healthz answers 503 and "
     "keylane_worker_partition_stalled is 1 (0: never)"},
    {"worker.retry.initial.ms", KL__CONF_MS, "100", 1, 3600000, NULL,
     "first retry backoff"},
    {"worker.retry.max.ms", KL__CONF_MS, "10000", 1, 3600000, NULL,
     "largest retry backoff"},
    {"worker.max.attempts", KL__CONF_INT, "5", 1, 1000, NULL,
     "attempts before an event is dead-lettered"},
    {"worker.dlq.topic", KL__CONF_STR, "", 0, 0, NULL,
     "dead-letter topic (default: <topic>.dlq)"},
    {"worker.on.gap", KL__CONF_ENUM, "stop", 0, 0, "stop|skip",
     "a partition whose log starts above the store's watermark (retention "
     "deleted records before they were applied): stop it (/healthz 503) or "
     "skip the lost records, counted in keylane_worker_gap_records_total"},
    {"worker.window.max", KL__CONF_INT, "10000", 2, 10000000, NULL,
     "records a partition holds in memory at most; past it it is paused"},
    {"worker.waiting.max", KL__CONF_INT, "1000", 1, 10000000, NULL,
     "keys in retry backoff per worker at most; past it their partitions "
     "are paused"},
    {"worker.outbox.max", KL__CONF_INT, "10000", 1, 10000000, NULL,
     "follow-up events (kl_txn_emit) a partition holds committed and not "
     "yet acknowledged by Kafka at most; past it the partition is paused"},
    {"worker.outbox.stall.ms", KL__CONF_MS, "300000", 0, 86400000, NULL,
     "a partition whose outbox holds follow-ups and has had none "
     "acknowledged for this long is stalled: /healthz answers 503 and "
     "keylane_worker_outbox_stalled_seconds shows it (0: never)"},
    /* The HTTP publish gateway (keylane broker --listen); each has a flag
     * of its own there. Its limits bound memory whatever clients do. */
    {"gateway.listen", KL__CONF_STR, "127.0.0.1:8080", 0, 0, NULL,
     "the address it serves, ADDR:PORT or [V6]:PORT (loopback by "
     "default; port 0 picks a free one)"},
    {"gateway.tokens.file", KL__CONF_STR, "", 0, 0, NULL,
     "a file of bearer tokens, one per line, one of which a client "
     "must send (401 otherwise); empty: no token is asked for. Tokens are "
     "never logged"},
    {"gateway.max.connections", KL__CONF_INT, "1024", 1, 1000000, NULL,
     "open client connections at most; past it a new one gets 503 "
     "and is closed"},
    {"gateway.max.header", KL__CONF_SIZE, "16K", 1, KL_I64_MAX, NULL,
     "bytes of a request line and its headers at most (at least "
     "256); past it the request gets 431 and the connection is closed"},
    {"gateway.max.body", KL__CONF_SIZE, "1M", 1, KL_I64_MAX, NULL,
     "bytes of a request body at most; past it the request gets 413 "
     "and the connection is closed"},
    {"gateway.max.inflight", KL__CONF_INT, "10000", 1, 10000000, NULL,
     "events produced and not yet acknowledged by Kafka at most; a "
     "request that does not fit gets 429 with Retry-After"},
    {"gateway.max.inflight.bytes", KL__CONF_SIZE, "64M", 1, KL_I64_MAX, NULL,
     "bytes of the events in flight at most (at least gateway.max.body); "
     "a request counts its body or its events' size as stored in Kafka, "
     "the larger; one that does not fit gets 429 with Retry-After, one "
     "that never could 413"},
    {"gateway.max.pipeline", KL__CONF_INT, "32", 1, 100000, NULL,
     "pipelined requests queued per connection at most; past it "
     "the connection is not read until its client reads"},
    {"gateway.max.output", KL__CONF_SIZE, "1M", 1, KL_I64_MAX, NULL,
     "unsent response bytes per connection at most; past it the "
     "connection is not read until its client reads"},
    {"gateway.max.topics", KL__CONF_INT, "1024", 1, 100000, NULL,
     "distinct topics served at most (each holds a librdkafka topic "
     "handle); another gets 403 unless one was unused for "
     "gateway.topic.idle. The gateway creates no topic: one that does not "
     "exist is 404 and takes no place"},
    {"gateway.topic.idle", KL__CONF_DURATION, "60s", 1, KL_GW_DURATION_MAX,
     NULL,
     "a topic no request used for this long gives its place to a "
     "new one once gateway.max.topics are served"},
    {"gateway.idle.timeout", KL__CONF_DURATION, "30s", 1, KL_GW_DURATION_MAX,
     NULL,
     "a connection idle this long, or whose client reads nothing "
     "this long while responses wait, is closed"},
    {"gateway.request.timeout", KL__CONF_DURATION, "30s", 1, KL_GW_DURATION_MAX,
     NULL,
     "a request whose line, headers and body take longer than this "
     "to arrive gets 408"},
    {"gateway.produce.timeout", KL__CONF_DURATION, "10s", 1, KL_GW_DURATION_MAX,
     NULL,
     "how long Kafka has to acknowledge an event; past it the "
     "request gets 503 with the events' ids, to send again with the same "
     "ids (kafka.message.timeout.ms, unless set)"},
    {"gateway.drain.timeout", KL__CONF_DURATION, "10s", 1, KL_GW_DURATION_MAX,
     NULL,
     "at SIGINT or SIGTERM, how long it waits for the "
     "acknowledgements of the requests in flight before it closes every "
     "connection"},
    {"gateway.retry.after", KL__CONF_DURATION, "1s", 0, 3600000, NULL,
     "the Retry-After of its 429 and 503 answers (whole seconds, "
     "rounded up)"},
    {"gateway.allow.origins", KL__CONF_STR, "", 0, 0, NULL,
     "browser origins, scheme://host[:port], comma-separated, whose "
     "requests are served; a request with any other Origin header gets 403 "
     "(empty: none, so no web page can publish)"},
    {"gateway.allow.topics", KL__CONF_STR, "*", 0, 0, NULL,
     "topics clients may publish to and route on: names or fnmatch "
     "patterns (orders-*), comma-separated; any other gets 403 (*: any "
     "topic). A list that names none is refused"},
    {"gateway.allow.internal.topics", KL__CONF_ENUM, "false", 0, 0,
     "false|true",
     "true lets clients use dead-letter topics (*.dlq) and Kafka's "
     "internal ones (__*), which get 403 otherwise"},
};
#define KL_NKEYS (sizeof(kl_keys) / sizeof(kl_keys[0]))

typedef struct kl_kv {
  char *name;
  char *value;
} kl_kv_t;

struct kl_conf {
  char *values[KL_NKEYS]; /* NULL: default */
  kl_kv_t *kafka;
  size_t kafka_cnt, kafka_cap;
};

kl_conf_t *kl_conf_new(void) {
  return calloc(1, sizeof(kl_conf_t));
}

void kl_conf_destroy(kl_conf_t *conf) {
  if (!conf)
    return;
  for (size_t i = 0; i < KL_NKEYS; i++)
    free(conf->values[i]);
  for (size_t i = 0; i < conf->kafka_cnt; i++) {
    free(conf->kafka[i].name);
    free(conf->kafka[i].value);
  }
  free(conf->kafka);
  free(conf);
}

static const kl__conf_key_t *conf_key(const char *name, size_t *idx) {
  for (size_t i = 0; i < KL_NKEYS; i++)
    if (strcmp(kl_keys[i].name, name) == 0) {
      *idx = i;
      return &kl_keys[i];
    }
  return NULL;
}

static int conf_is_num(const kl__conf_key_t *k) {
  return k->type != KL__CONF_ENUM && k->type != KL__CONF_STR;
}

const kl__conf_key_t *kl__conf_key_at(size_t i) {
  return i < KL_NKEYS ? &kl_keys[i] : NULL;
}

const kl__conf_key_t *kl__conf_key_find(const char *name) {
  size_t idx;
  return conf_key(name, &idx);
}

bool kl__conf_keylane_prefix(const char *name) {
  const char *dot = strchr(name, '.');
  size_t n = dot ? (size_t)(dot - name) + 1 : 0;
  for (size_t i = 0; n && i < KL_NKEYS; i++)
    if (strncmp(kl_keys[i].name, name, n) == 0)
      return true;
  return false;
}

/* Levenshtein distance of @p a and @p b, both shorter than 64 bytes. */
static size_t conf_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[64];
  if (la >= 64 || lb >= 64)
    return SIZE_MAX;
  for (size_t j = 0; j <= lb; j++)
    row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

const char *kl__conf_key_nearest(const char *name) {
  const char *best = NULL;
  size_t best_d = strlen(name) / 5 + 1; /* farther is no typo */
  for (size_t i = 0; i < KL_NKEYS; i++) {
    size_t d = conf_distance(name, kl_keys[i].name);
    if (d <= best_d) {
      best = kl_keys[i].name;
      best_d = d;
    }
  }
  return best;
}

static kl_err_t conf_parse_num(const kl__conf_key_t *k, const char *s,
                               int64_t *out) {
  return kl__units_parse(k->name, s, (kl__units_kind_t)k->type, k->min, k->max,
                         out);
}

bool kl__conf_enum_has(const char *values, const char *v) {
  size_t n = strlen(v);
  for (const char *p = values; p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, v, n) == 0)
      return 1;
    p = bar ? bar + 1 : NULL;
  }
  return 0;
}

static kl_err_t conf_set_kafka(kl_conf_t *conf, const char *name,
                               const char *value) {
  for (size_t i = 0; i < conf->kafka_cnt; i++)
    if (strcmp(conf->kafka[i].name, name) == 0) {
      char *v = strdup(value);
      if (!v)
        return KL_ENOMEM;
      free(conf->kafka[i].value);
      conf->kafka[i].value = v;
      return KL_OK;
    }
  kl_kv_t *grown = kl__grow(conf->kafka, &conf->kafka_cap, conf->kafka_cnt,
                            sizeof(*grown), 8);
  if (!grown)
    return KL_ENOMEM;
  conf->kafka = grown;
  kl_kv_t *kv = &conf->kafka[conf->kafka_cnt];
  kv->name = strdup(name);
  kv->value = strdup(value);
  if (!kv->name || !kv->value) {
    free(kv->name);
    free(kv->value);
    return KL_ENOMEM;
  }
  conf->kafka_cnt++;
  return KL_OK;
}

bool kl__conf_is_secret(const char *name) {
  static const char *const words[] = {"pass",    "secret",     "token",
                                      "private", "credential", "jaas"};
  if (strncmp(name, "kafka.", 6) == 0)
    name += 6;
  for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
    if (strstr(name, words[i]))
      return true; /* a misspelt key too: sasl.pasword */
  return strncmp(name, "sasl.oauthbearer.", 17) == 0 ||
         strncmp(name, "ssl.key.", 8) == 0 ||
         strncmp(name, "https.client.key.", 17) == 0;
}

kl_err_t kl_conf_set(kl_conf_t *conf, const char *key, const char *value) {
  kl__err_clear();
  if (!conf || !key || !value)
    return kl__err(KL_EINVAL, "kl_conf_set: conf, key and value are required");
  if (strncmp(key, "kafka.", 6) == 0) {
    if (!key[6])
      return kl__err(KL_ECONF,
                     "configuration key \"%s\" names no Kafka property: "
                     "use kafka.<librdkafka property>",
                     key);
    return conf_set_kafka(conf, key + 6, value);
  }
  size_t idx;
  const kl__conf_key_t *k = conf_key(key, &idx);
  if (!k) {
    const char *near = kl__conf_key_nearest(key);
    return kl__err(KL_ECONF,
                   "unknown configuration key \"%s\"%s%s%s: `keylane "
                   "config` lists the keys; librdkafka properties take "
                   "the prefix kafka.",
                   key, near ? " (did you mean " : "", near ? near : "",
                   near ? "?)" : "");
  }
  if (k->type == KL__CONF_ENUM && !kl__conf_enum_has(k->values, value))
    return kl__err(KL_ECONF, "%s=%s is not one of %s", key, value, k->values);
  int64_t num;
  if (conf_is_num(k) && conf_parse_num(k, value, &num) != KL_OK)
    return kl__err(KL_ECONF, "%s", kl_err_detail());
  char *v = strdup(value);
  if (!v)
    return KL_ENOMEM;
  free(conf->values[idx]);
  conf->values[idx] = v;
  return KL_OK;
}

const char *kl_conf_get(const kl_conf_t *conf, const char *key) {
  if (strncmp(key, "kafka.", 6) == 0) {
    for (size_t i = 0; conf && i < conf->kafka_cnt; i++)
      if (strcmp(conf->kafka[i].name, key + 6) == 0)
        return conf->kafka[i].value;
    return NULL;
  }
  size_t idx;
  const kl__conf_key_t *k = conf_key(key, &idx);
  if (!k)
    return NULL;
  return conf && conf->values[idx] ? conf->values[idx] : k->def;
}

int64_t kl__conf_int(const kl_conf_t *conf, const char *key) {
  size_t idx;
  const kl__conf_key_t *k = conf_key(key, &idx);
  int64_t v = 0;
  if (k && conf_is_num(k))
    conf_parse_num(k, kl_conf_get(conf, key), &v);
  return v;
}

kl_err_t kl__conf_timer_check(const kl_conf_t *conf) {
  int64_t max_ms = kl__conf_int(conf, "timer.max.delay");
  int64_t dedup_ms = kl__conf_int(conf, "store.dedup.retention");
  if (max_ms <= dedup_ms)
    return KL_OK;
  char max[32], dedup[32];
  return kl__err(
      KL_ECONF,
      "timer.max.delay (%s) is longer than store.dedup.retention (%s): lower "
      "timer.max.delay, or raise store.dedup.retention (and keep the "
      "topic's retention.ms at least timer.max.delay, so that a rebuild "
      "finds every pending timer's record)",
      kl__units_format(KL__UNITS_DURATION, max_ms, max, sizeof(max)),
      kl__units_format(KL__UNITS_DURATION, dedup_ms, dedup, sizeof(dedup)));
}

kl_conf_t *kl_conf_dup(const kl_conf_t *conf) {
  kl_conf_t *dup = kl_conf_new();
  if (!dup)
    return NULL;
  for (size_t i = 0; i < KL_NKEYS; i++)
    if (conf->values[i] && !(dup->values[i] = strdup(conf->values[i])))
      goto fail;
  for (size_t i = 0; i < conf->kafka_cnt; i++)
    if (conf_set_kafka(dup, conf->kafka[i].name, conf->kafka[i].value))
      goto fail;
  return dup;
fail:
  kl_conf_destroy(dup);
  return NULL;
}

kl_err_t kl_conf_foreach_kafka(const kl_conf_t *conf,
                               kl_err_t (*fn)(void *, const char *,
                                              const char *),
                               void *opaque) {
  kl__err_clear();
  for (size_t i = 0; conf && i < conf->kafka_cnt; i++) {
    kl_err_t err = fn(opaque, conf->kafka[i].name, conf->kafka[i].value);
    if (err)
      return err;
  }
  return KL_OK;
}
