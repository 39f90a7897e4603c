#include "common/kafka.h"

#include <string.h>

#include "common/log.h"

kl_err_t kl__kafka_set(void *rkconf, const char *name, const char *value) {
  char errstr[256];
  if (rd_kafka_conf_set(rkconf, name, value, errstr, sizeof(errstr)) !=
      RD_KAFKA_CONF_OK)
    return kl__err(KL_ECONF, "kafka.%s=%s: %s", name, value, errstr);
  return KL_OK;
}

kl_err_t kl__kafka_conf_apply(rd_kafka_conf_t *rkconf, const kl_conf_t *conf,
                              const char *const *defaults) {
  kl_err_t err = KL_OK;
  for (size_t i = 0; !err && defaults && defaults[i]; i += 2)
    err = kl__kafka_set(rkconf, defaults[i], defaults[i + 1]);
  if (!err)
    err = kl_conf_foreach_kafka(conf, kl__kafka_set, rkconf);
  rd_kafka_conf_set_log_cb(rkconf, kl__kafka_log);
  return err;
}

void kl__kafka_log(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf) {
  (void)rk;
  kl_log_level_t l = level <= 2   ? KL_LOG_ERROR
                     : level <= 4 ? KL_LOG_WARN
                     : level == 5 ? KL_LOG_INFO
                                  : KL_LOG_DEBUG;
  if (strcmp(fac, "COMMITFAIL") == 0)
    l = KL_LOG_DEBUG;
  if (kl__log_enabled(l))
    kl__log(l, "rdkafka", "%s: %s", fac, buf);
}
