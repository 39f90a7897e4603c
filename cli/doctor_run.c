/*
 * keylane doctor's run: every check of worker/checks.h and
 * worker/checks_log.h in turn, one line each (doctor_run.h).
 */
#include "cli/doctor_run.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "worker/checks.h"
#include "worker/dlq.h"
#include "worker/checks_log.h"
#include "store/location.h"

#define KL_DOCTOR_TIMEOUT_MS 10000

typedef struct kl_doctor {
  const kl_conf_t *conf;
  const char *topic, *location;
  FILE *out;
  rd_kafka_t *rk;     /* a reader: metadata, offsets, the sample */
  int32_t partitions; /* TOPIC's count; 0 when it cannot be read */
  char dlq[300];      /* the dead-letter topic; "" when it is missing */
  json_t *checks;     /* --json: the checks so far */
  kl__check_status_t worst;
  size_t sample;
  volatile int *stop;
} kl_doctor_t;

/* One check's line, or its entry in the JSON. */
static void doctor_say(kl_doctor_t *d, const char *name, const kl__check_t *c) {
  if (c->status > d->worst)
    d->worst = c->status;
  const char *status = kl__check_status_name(c->status);
  char said[KL__LOCATION_MAX]; /* no store password, whatever quotes it */
  const char *msg =
      d->location ? kl__location_scrub(d->location, c->msg, said, sizeof(said))
                  : c->msg;
  if (d->checks) {
    json_array_append_new(
        d->checks,
        json_pack("{ssssss}", "check", name, "status", status, "message", msg));
    return;
  }
  fprintf(d->out, "%s %s: %s\n", status, name, msg);
  fflush(d->out);
}

/* The partition count, read once for the checks that need it; a topic that
 * cannot be read is the partitions check's FAIL. */
static void doctor_partitions(kl_doctor_t *d) {
  kl__check_t c = {KL__CHECK_FAIL, ""};
  kl_err_t err = kl__kafka_partition_count(
      d->rk, d->topic, KL_DOCTOR_TIMEOUT_MS, &d->partitions);
  if (err == KL_ENOTFOUND)
    snprintf(c.msg, sizeof(c.msg),
             "topic %s does not exist: check -t and -b, or create it with "
             "the partition count the fleet expects",
             d->topic);
  else if (err)
    snprintf(c.msg, sizeof(c.msg), "%s", kl_err_detail());
  else
    kl__check_partitions(
        d->rk, d->topic,
        (int32_t)kl__conf_int(d->conf, "worker.expect.partitions"),
        KL_DOCTOR_TIMEOUT_MS, &c);
  if (err)
    d->partitions = 0;
  doctor_say(d, "partitions", &c);
}

/* The dead-letter topic exists (the worker's own start check). */
static void doctor_dlq(kl_doctor_t *d) {
  kl__dlq_t *dlq;
  kl__check_t c = {KL__CHECK_FAIL, ""};
  kl_err_t err = kl__dlq_new(d->conf, d->topic, NULL, NULL, &dlq);
  if (err) {
    snprintf(c.msg, sizeof(c.msg), "%s", kl_err_detail());
    doctor_say(d, "dlq", &c);
    return;
  }
  if ((err = kl__dlq_check(dlq, d->topic))) {
    c.status = err == KL_ENOTFOUND ? KL__CHECK_FAIL : KL__CHECK_WARN;
    snprintf(c.msg, sizeof(c.msg), "%s", kl_err_detail());
  } else {
    c.status = KL__CHECK_OK;
    snprintf(d->dlq, sizeof(d->dlq), "%s", kl__dlq_topic(dlq));
    snprintf(c.msg, sizeof(c.msg), "dead-letter topic %s exists", d->dlq);
  }
  kl__dlq_destroy(dlq);
  doctor_say(d, "dlq", &c);
}

/* Whether every bootstrap server of @p boot is a loopback address. */
static int doctor_loopback(const char *boot) {
  for (const char *s = boot; s && *s;) {
    size_t n = strcspn(s, ",");
    if (strncmp(s, "127.", 4) != 0 && strncmp(s, "localhost:", 10) != 0 &&
        strncmp(s, "[::1]:", 6) != 0)
      return 0;
    s += n + (s[n] == ',');
  }
  return 1;
}

/* How keylane talks to Kafka, and whether Kafka took its credentials and
 * TLS handshake: a refusal is said with what to check (common/kafka.h). */
static int doctor_security(kl_doctor_t *d) {
  kl__check_t c = {KL__CHECK_OK, ""};
  const char *proto = kl_conf_get(d->conf, "kafka.security.protocol");
  const char *mech = kl_conf_get(d->conf, "kafka.sasl.mechanism");
  if (!mech)
    mech = kl_conf_get(d->conf, "kafka.sasl.mechanisms");
  const char *boot = kl_conf_get(d->conf, "kafka.bootstrap.servers");
  char how[128];
  int sasl = proto && strncasecmp(proto, "sasl_", 5) == 0;
  snprintf(how, sizeof(how), "security.protocol %s%s%s",
           proto ? proto : "plaintext (the default)",
           sasl ? ", sasl.mechanism " : "",
           sasl ? (mech ? mech : "GSSAPI (the default)") : "");
  const struct rd_kafka_metadata *md = NULL;
  kl_err_t err = kl__kafka_metadata(d->rk, NULL, KL_DOCTOR_TIMEOUT_MS, &md);
  if (err) {
    /* a refusal is the security check's; no answer at all is Kafka's */
    int refused = err != KL_EKAFKA_TRANSIENT;
    c.status = KL__CHECK_FAIL;
    snprintf(c.msg, sizeof(c.msg), "%s: %s", how, kl_err_detail());
    doctor_say(d, refused ? "security" : "kafka", &c);
    return -1;
  }
  int brokers = md->broker_cnt;
  rd_kafka_metadata_destroy(md);
  int encrypted = proto && (strcasecmp(proto, "ssl") == 0 ||
                            strcasecmp(proto, "sasl_ssl") == 0);
  if (!sasl && kl_conf_get(d->conf, "kafka.sasl.username")) {
    c.status = KL__CHECK_WARN;
    snprintf(c.msg, sizeof(c.msg),
             "%s: kafka.sasl.username is set, but without a SASL protocol "
             "no credential is sent: set kafka.security.protocol to "
             "SASL_SSL (or SASL_PLAINTEXT)",
             how);
  } else if (!encrypted && !doctor_loopback(boot)) {
    c.status = KL__CHECK_WARN;
    snprintf(c.msg, sizeof(c.msg),
             "%s: connected to %d brokers without TLS off loopback: events%s "
             "cross the network in clear; use SASL_SSL or SSL "
             "(kafka.security.protocol)",
             how, brokers, sasl ? " and credentials" : "");
  } else {
    snprintf(c.msg, sizeof(c.msg), "%s: %s, %d brokers answered", how,
             sasl        ? "authenticated"
             : encrypted ? "TLS handshake done"
                         : "connected",
             brokers);
  }
  doctor_say(d, "security", &c);
  return 0;
}

/* The checks that read Kafka only. */
static void doctor_kafka(kl_doctor_t *d) {
  kl__check_t c;
  int64_t dedup_ms = kl__conf_int(d->conf, "store.dedup.retention");
  if (doctor_security(d))
    return; /* nothing more can be read */
  doctor_partitions(d);
  if (d->partitions) {
    kl__check_routing(d->rk, d->topic, d->partitions, d->sample,
                      KL_DOCTOR_TIMEOUT_MS, d->stop, &c);
    doctor_say(d, "routing", &c);
  }
  doctor_dlq(d);
  if (d->partitions) {
    kl__check_retention(d->rk, "topic", d->topic, dedup_ms,
                        KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "retention", &c);
  }
  if (d->dlq[0]) {
    kl__check_retention(d->rk, "dead-letter topic", d->dlq, dedup_ms,
                        KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "dlq-retention", &c);
  }
  if (d->partitions) {
    kl__check_timer_retention(d->rk, d->topic,
                              kl__conf_int(d->conf, "timer.max.delay"),
                              KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "timer-retention", &c);
  }
  if (d->partitions) {
    kl__check_replication(d->rk, "topic", d->topic, KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "replication", &c);
  }
  if (d->dlq[0]) {
    kl__check_replication(d->rk, "dead-letter topic", d->dlq,
                          KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "dlq-replication", &c);
  }
}

/* The checks of a store: one of another version does not open, which is
 * the store-version check's FAIL; one that does not open otherwise (a
 * typo: it is never created) the store check's. */
static void doctor_store(kl_doctor_t *d) {
  kl__check_t c = {KL__CHECK_FAIL, ""};
  kl_store_t *store;
  char shown[KL__LOCATION_MAX];
  kl__location_redact(d->location, shown, sizeof(shown));
  kl_err_t err = kl_store_open(d->location, d->conf, &store);
  if (err) {
    snprintf(c.msg, sizeof(c.msg), "cannot open the store %.256s: %s", shown,
             kl_err_detail());
    doctor_say(d, err == KL_ESTORE_VERSION ? "store-version" : "store", &c);
    return;
  }
  kl__check_store_version(store, shown, &c);
  doctor_say(d, "store-version", &c);
  kl__check_owner(d->rk, store, d->topic, kl_conf_get(d->conf, "worker.group"),
                  KL_DOCTOR_TIMEOUT_MS, &c);
  doctor_say(d, "owner", &c);
  if (d->partitions) {
    kl__check_log(d->rk, store, d->topic, d->partitions, KL_DOCTOR_TIMEOUT_MS,
                  &c);
    doctor_say(d, "log", &c);
    kl__check_epochs(store, d->conf, kl_conf_get(d->conf, "worker.group"),
                     d->topic, d->partitions, KL_DOCTOR_TIMEOUT_MS, &c);
    doctor_say(d, "epochs", &c);
  }
  if (kl__check_sweeps(store, d->topic,
                       kl__conf_int(d->conf, "store.dedup.retention"), &c))
    doctor_say(d, "sweep", &c);
  if (kl__check_clock(store, KL__CLOCK_SKEW_WARN_MS, &c))
    doctor_say(d, "clock", &c);
  kl_store_destroy(store);
}

kl_err_t kl__doctor_run(const kl__doctor_opts_t *opts, FILE *out,
                        kl__check_status_t *worst) {
  kl_doctor_t d = {.conf = opts->conf,
                   .topic = opts->topic,
                   .location = opts->location,
                   .out = out,
                   .sample = opts->sample ? opts->sample : KL__DOCTOR_SAMPLE,
                   .stop = opts->stop};
  kl_err_t err =
      kl__kafka_reader_new(d.conf, "keylane-doctor", "earliest", &d.rk);
  if (err)
    return err;
  d.checks = opts->json ? json_array() : NULL;
  doctor_kafka(&d);
  if (d.location)
    doctor_store(&d);
  rd_kafka_destroy(d.rk);
  if (d.checks) {
    json_t *o = json_pack("{ssssso}", "topic", d.topic, "status",
                          kl__check_status_name(d.worst), "checks", d.checks);
    json_dumpf(o, out, JSON_COMPACT);
    fputc('\n', out);
    fflush(out);
    json_decref(o);
  }
  *worst = d.worst;
  return KL_OK;
}
