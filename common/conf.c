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

#include "common/internal.h"

typedef enum { KL_CT_INT, KL_CT_DURATION, KL_CT_SIZE, KL_CT_ENUM, KL_CT_STR } kl_conf_type_t;

typedef struct kl_conf_key {
  const char *name;
  kl_conf_type_t type;
  const char *def;
  int64_t min, max;   /* for INT, DURATION (ms) and SIZE (bytes) */
  const char *values; /* for ENUM: "a|b|c" */
  const char *doc;
} kl_conf_key_t;

#define KL_I64_MAX INT64_MAX
static const kl_conf_key_t kl_keys[] = {
    {"producer.inflight.max", KL_CT_INT, "100000", 1, 10000000, NULL,
     "events awaiting a delivery report before kl_publish() waits"},
    {"producer.enqueue.timeout.ms", KL_CT_INT, "5000", 0, 3600000, NULL,
     "how long kl_publish() waits for room in a full budget"},
    {"producer.expect.partitions", KL_CT_INT, "0", 0, 100000, NULL,
     "refuse to publish when a topic's partition count differs (0: no check)"},
    {"store.durability", KL_CT_ENUM, "full", 0, 0, "full|meta|none",
     "full: fsync each commit; meta: skip the metadata fsync (an OS crash may "
     "undo the last commit); none: no fsync (an OS crash may undo recent "
     "commits)"},
    {"store.map.size", KL_CT_SIZE, "256M", 1 << 20, KL_I64_MAX, NULL,
     "initial LMDB map size; it grows as needed up to store.map.max"},
    {"store.map.max", KL_CT_SIZE, "64G", 1 << 20, KL_I64_MAX, NULL,
     "largest LMDB map size; past it commits fail with KL_ESTORE_FULL"},
    {"store.dedup.retention", KL_CT_DURATION, "7d", 1000, KL_I64_MAX, NULL,
     "how long idempotency keys are kept; at least the topic's retention"},
    {"worker.retention.check", KL_CT_ENUM, "refuse", 0, 0, "refuse|warn",
     "refuse: the worker does not run when the topic or its dead-letter "
     "topic keeps records longer than store.dedup.retention; warn: it runs, "
     "with a WARN and keylane_worker_retention_override 1"},
    {"store.pg.pool", KL_CT_INT, "4", 1, 64, NULL,
     "PostgreSQL store: connections per process at most, one per open batch"},
    {"store.pg.idle.timeout", KL_CT_DURATION, "60s", 0, KL_I64_MAX, NULL,
     "PostgreSQL store: the server ends a batch idle this long, releasing the "
     "row locks of a paused owner (0: the server's setting)"},
    {"worker.group", KL_CT_STR, "keylane", 0, 0, NULL, "consumer group id"},
    {"worker.session.timeout.ms", KL_CT_INT, "10000", 100, 3600000, NULL,
     "consumer group session timeout"},
    {"worker.fenced.retake.ms", KL_CT_INT, "30000", 0, 3600000, NULL,
     "a lane fenced by something outside the group (replay, redrive) takes "
     "its partition back once the partition's state in the store has not "
     "changed for this long (more than worker.session.timeout.ms); 0: "
     "never (it waits for the group to move it)"},
    {"worker.batch.max", KL_CT_INT, "1000", 1, 100000, NULL,
     "events per store commit at most"},
    {"worker.batch.wait.ms", KL_CT_INT, "20", 0, 10000, NULL,
     "how long a batch waits to fill before it is committed"},
    {"worker.expect.partitions", KL_CT_INT, "0", 0, 100000, NULL,
     "refuse to run when the topic's partition count differs (0: no check)"},
    {"worker.concurrency", KL_CT_INT, "1", 1, 1024, NULL,
     "handler threads per worker; events of one key stay in order"},
    {"worker.exec.window", KL_CT_INT, "1", 1, 1024, NULL,
     "exec handler: events in flight to one child at most (pipelining, for "
     "children that echo \"seq\"; others get one at a time); the worker "
     "runs worker.concurrency children and concurrency x window executors"},
    {"worker.stall.ms", KL_CT_INT, "300000", 0, 86400000, NULL,
     "a partition that holds records and whose watermark has not moved for "
     "this long is stalled: /healthz answers 503 and "
     "keylane_worker_partition_stalled is 1 (0: never)"},
    {"worker.retry.initial.ms", KL_CT_INT, "100", 1, 3600000, NULL,
     "first retry backoff"},
    {"worker.retry.max.ms", KL_CT_INT, "10000", 1, 3600000, NULL,
     "largest retry backoff"},
    {"worker.max.attempts", KL_CT_INT, "5", 1, 1000, NULL,
     "attempts before an event is dead-lettered"},
    {"worker.dlq.topic", KL_CT_STR, "", 0, 0, NULL,
     "dead-letter topic (default: <topic>.dlq)"},
    {"worker.window.max", KL_CT_INT, "10000", 2, 10000000, NULL,
     "records a partition holds in memory at most; past it it is paused"},
    {"worker.waiting.max", KL_CT_INT, "1000", 1, 10000000, NULL,
     "keys in retry backoff per worker at most; past it their partitions "
     "are paused"},
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

static const kl_conf_key_t *kl_conf_key(const char *name, size_t *idx) {
  for (size_t i = 0; i < KL_NKEYS; i++)
    if (strcmp(kl_keys[i].name, name) == 0) {
      *idx = i;
      return &kl_keys[i];
    }
  return NULL;
}

/* Parses "123", with a unit suffix for durations (ms s m h d) and sizes
 * (K M G T, powers of 1024). Durations come out in ms. */
static int kl_conf_parse_num(const kl_conf_key_t *k, const char *s,
                             int64_t *out) {
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || v < 0)
    return -1;
  int64_t mul = 1;
  if (k->type == KL_CT_DURATION) {
    const char *units[] = {"ms", "s", "m", "h", "d"};
    const int64_t muls[] = {1, 1000, 60000, 3600000, 86400000};
    mul = *end ? 0 : 1000; /* a bare number is seconds */
    for (int i = 0; i < 5 && *end; i++)
      if (strcmp(end, units[i]) == 0)
        mul = muls[i];
  } else if (k->type == KL_CT_SIZE) {
    const char *units = "KMGT";
    if (*end) {
      const char *u = strchr(units, *end);
      if (!u || end[1])
        return -1;
      for (int i = 0; i <= u - units; i++)
        mul *= 1024;
    }
  } else if (*end) {
    return -1;
  }
  if (mul == 0 || (v > 0 && v > INT64_MAX / mul))
    return -1;
  *out = v * mul;
  return 0;
}

static int kl_conf_enum_has(const char *values, const char *v) {
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

static kl_err_t kl_conf_fail(char *errstr, size_t size, const char *fmt,
                             const char *a, const char *b, const char *c) {
  char buf[512];
  snprintf(buf, sizeof(buf), fmt, a, b, c);
  if (errstr && size)
    snprintf(errstr, size, "%s", buf);
  return kl__err(KL_ECONF, "%s", buf);
}

static kl_err_t kl_conf_set_kafka(kl_conf_t *conf, const char *name,
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
  if (conf->kafka_cnt == conf->kafka_cap) {
    size_t cap = conf->kafka_cap ? conf->kafka_cap * 2 : 8;
    kl_kv_t *kv = realloc(conf->kafka, cap * sizeof(*kv));
    if (!kv)
      return KL_ENOMEM;
    conf->kafka = kv;
    conf->kafka_cap = cap;
  }
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

kl_err_t kl_conf_set(kl_conf_t *conf, const char *key, const char *value,
                     char *errstr, size_t errstr_size) {
  if (!conf || !key || !value)
    return kl__err(KL_EINVAL, "kl_conf_set: conf, key and value are required");
  if (strncmp(key, "kafka.", 6) == 0) {
    if (!key[6])
      return kl_conf_fail(errstr, errstr_size,
                          "configuration key \"%s\" names no Kafka property: "
                          "use kafka.<librdkafka property>%s%s",
                          key, "", "");
    return kl_conf_set_kafka(conf, key + 6, value);
  }
  size_t idx;
  const kl_conf_key_t *k = kl_conf_key(key, &idx);
  if (!k)
    return kl_conf_fail(errstr, errstr_size,
                        "unknown configuration key \"%s\"%s%s: librdkafka "
                        "properties take the prefix kafka.",
                        key, "", "");
  if (k->type == KL_CT_ENUM && !kl_conf_enum_has(k->values, value))
    return kl_conf_fail(errstr, errstr_size,
                        "%s=%s is not one of %s", key, value, k->values);
  if (k->type != KL_CT_ENUM && k->type != KL_CT_STR) {
    int64_t v;
    char range[96];
    snprintf(range, sizeof(range), "%" PRId64 "..%" PRId64, k->min, k->max);
    if (kl_conf_parse_num(k, value, &v) != 0 || v < k->min || v > k->max)
      return kl_conf_fail(errstr, errstr_size,
                          "%s=%s is not a valid value: expected %s",
                          key, value,
                          k->type == KL_CT_DURATION ? "a duration such as 500ms, 30s, 7d"
                          : k->type == KL_CT_SIZE   ? "a size such as 512M or 4G"
                                                    : range);
  }
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
  const kl_conf_key_t *k = kl_conf_key(key, &idx);
  if (!k)
    return NULL;
  return conf && conf->values[idx] ? conf->values[idx] : k->def;
}

int64_t kl__conf_int(const kl_conf_t *conf, const char *key) {
  size_t idx;
  const kl_conf_key_t *k = kl_conf_key(key, &idx);
  int64_t v = 0;
  if (k)
    kl_conf_parse_num(k, kl_conf_get(conf, key), &v);
  return v;
}

kl_conf_t *kl_conf_dup(const kl_conf_t *conf) {
  kl_conf_t *dup = kl_conf_new();
  if (!dup)
    return NULL;
  for (size_t i = 0; i < KL_NKEYS; i++)
    if (conf->values[i] && !(dup->values[i] = strdup(conf->values[i])))
      goto fail;
  for (size_t i = 0; i < conf->kafka_cnt; i++)
    if (kl_conf_set_kafka(dup, conf->kafka[i].name, conf->kafka[i].value))
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
  for (size_t i = 0; conf && i < conf->kafka_cnt; i++) {
    kl_err_t err = fn(opaque, conf->kafka[i].name, conf->kafka[i].value);
    if (err)
      return err;
  }
  return KL_OK;
}

void kl__conf_print_keys(FILE *out);
void kl__conf_print_keys(FILE *out) {
  for (size_t i = 0; i < KL_NKEYS; i++)
    fprintf(out, "  %-28s default %-8s %s\n", kl_keys[i].name, kl_keys[i].def,
            kl_keys[i].doc);
}
