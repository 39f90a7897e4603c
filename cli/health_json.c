/* /healthz as JSON with a Burrow-style status per partition
 * (cli/health_json.h). */
#include "cli/health_json.h"

#include <string.h>

#include <jansson.h>

static int is_stopped(const kl__health_t *health, int32_t partition) {
  for (size_t i = 0; i < health->stopped_count; i++)
    if (health->stopped[i] == partition)
      return 1;
  return 0;
}

static json_t *partition_json(const kl__health_t *health,
                              const kl__stall_t *stall, const char *status) {
  return json_pack(
      "{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:f}", "topic", health->topic,
      "partition", (int)stall->partition, "status", status, "watermark",
      (json_int_t)stall->watermark, "records", (json_int_t)stall->records,
      "waiting", (json_int_t)stall->waiting, "unmoved_ms",
      (json_int_t)(stall->records ? stall->for_ms : 0), "lag_seconds",
      kl__health_lag_seconds(stall, health->now_ms));
}

/* A stopped partition the worker no longer lists as owned: ERR still. */
static json_t *stopped_json(const kl__health_t *health, int32_t partition) {
  return json_pack("{s:s, s:i, s:s}", "topic", health->topic, "partition",
                   (int)partition, "status", "ERR");
}

static int is_owned(const kl__health_t *health, int32_t partition) {
  for (size_t i = 0; i < health->stall_count; i++)
    if (health->stalls[i].partition == partition)
      return 1;
  return 0;
}

/* Fills @p parts; @returns 1 when a partition is not OK. */
static int health_partitions(const kl__health_t *health, json_t *parts,
                             double *maxlag) {
  int not_ok = 0;
  for (size_t i = 0; i < health->stall_count; i++) {
    const kl__stall_t *stall = &health->stalls[i];
    const char *status = kl__health_partition_status(
        stall, is_stopped(health, stall->partition), health->stall_ms);
    not_ok |= strcmp(status, "OK") != 0;
    double lag = kl__health_lag_seconds(stall, health->now_ms);
    if (lag > *maxlag)
      *maxlag = lag;
    json_array_append_new(parts, partition_json(health, stall, status));
  }
  for (size_t i = 0; i < health->stopped_count; i++)
    if (!is_owned(health, health->stopped[i])) {
      not_ok = 1;
      json_array_append_new(parts, stopped_json(health, health->stopped[i]));
    }
  return not_ok;
}

char *kl__health_json(const kl__health_t *health, size_t *len) {
  json_t *parts = json_array();
  double maxlag = 0;
  int not_ok = parts ? health_partitions(health, parts, &maxlag) : 0;
  not_ok |= strncmp(health->message, KL__HEALTH_DEGRADED,
                    strlen(KL__HEALTH_DEGRADED)) == 0;
  const char *status = health->http_status != 200 ? "ERR"
                       : not_ok                   ? "WARN"
                                                  : "OK";
  size_t mlen = strlen(health->message);
  while (mlen && health->message[mlen - 1] == '\n')
    mlen--;
  json_t *doc = json_pack(
      "{s:b, s:s%, s:{s:s, s:s, s:s, s:I, s:f, s:o}}", "error",
      health->http_status != 200, "message", health->message, mlen, "status",
      "topic", health->topic, "group", health->group, "status", status,
      "partition_count", (json_int_t)json_array_size(parts), "maxlag_seconds",
      maxlag, "partitions", parts);
  char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  if (text)
    *len = strlen(text);
  return text;
}
