/* Static group membership: worker.instance.id (membership.h). */
#include <string.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_features.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "worker/membership.h"

#define KL_COMP "worker"

kl_err_t kl__membership_id_check(const char *key, const char *id) {
  size_t len = id ? strlen(id) : 0;
  size_t ok = id ? strspn(id, "abcdefghijklmnopqrstuvwxyz"
                              "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
                 : 0;
  if (ok == len && len < KL__INSTANCE_ID_MAX)
    return KL_OK;
  /* Escaped: a newline in it must not start a line of its own. */
  char shown[KL__ESCAPED_SIZE(64)];
  return kl__err(KL_ECONF,
                 "%s=\"%s\" is not an instance id Kafka takes: use 1-%d "
                 "characters of a-z, A-Z, 0-9, '.', '_' and '-' (a pod name, "
                 "a host name and a number), or leave it empty for dynamic "
                 "membership",
                 key, kl__escape(shown, sizeof(shown), id, len),
                 KL__INSTANCE_ID_MAX - 1);
}

kl_err_t kl__membership_check(const kl_conf_t *conf) {
  return kl__membership_id_check("worker.instance.id",
                                 kl_conf_get(conf, "worker.instance.id"));
}

void kl__membership_defaults(const kl_conf_t *conf, const char **defaults) {
  const char *id = kl_conf_get(conf, "worker.instance.id");
  if (!id || !*id)
    return;
  size_t n = 0;
  while (defaults[n])
    n += 2;
  if (n + 2 < KL__RDK_DEFAULTS_MAX) {
    defaults[n] = "group.instance.id";
    defaults[n + 1] = id;
    defaults[n + 2] = NULL;
  }
}

void kl__membership_instance(const rd_kafka_conf_t *kconf, char *out,
                             size_t size) {
  size_t len = size;
  if (rd_kafka_conf_get(kconf, "group.instance.id", out, &len) !=
      RD_KAFKA_CONF_OK)
    out[0] = '\0';
}

kl_err_t kl__membership_fatal(rd_kafka_t *rk, const char *group,
                              const char *instance_id) {
  char why[512];
  rd_kafka_resp_err_t cause = rd_kafka_fatal_error(rk, why, sizeof(why));
  kl_err_t err;
  if (cause == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID)
    err = kl__err(
        KL_EFENCED,
        "worker.instance.id=%s is used by another live worker of "
        "group %s: Kafka gave the id to the one that joined last "
        "and fenced this one (FENCED_INSTANCE_ID), which stopped "
        "without committing more; give each worker an instance id "
        "of its own (a StatefulSet's pod name, worker-%%i in a systemd unit), "
        "or stop the other process",
        *instance_id ? instance_id : "?", group);
  else
    err = kl__err(KL_EKAFKA,
                  "the consumer of group %s raised a fatal error (%s: %s); "
                  "it stopped without committing more: restart the worker",
                  group, rd_kafka_err2name(cause), why);
  KL_LOG_E(KL_COMP, "%s", kl_err_detail());
  return err;
}

void kl__membership_check_cluster(rd_kafka_t *rk, const char *group,
                                  const char *instance_id) {
  if (!*instance_id || kl__kafka_has_controller(rk, 5000) != 0)
    return;
  KL_LOG_W(KL_COMP,
           "worker.instance.id=%s: this cluster names no controller, as "
           "librdkafka's mock cluster (the embedded one) does not, and that "
           "one keeps no static members: a second live worker with this id "
           "in group %s is not refused here but joins as another member "
           "(each partition still has one owner at a time, by its epoch); "
           "Kafka fences the older of two, which exits 1",
           instance_id, group);
}
