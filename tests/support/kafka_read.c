#include "support/kafka_read.h"

#include <stdio.h>
#include <stdlib.h>

rd_kafka_t *kl_t_consumer(const char *bootstrap, const char *group,
                          const char *topic) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  const char *props[][2] = {{"bootstrap.servers", bootstrap},
                            {"group.id", group},
                            {"auto.offset.reset", "earliest"}};
  for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++)
    if (rd_kafka_conf_set(conf, props[i][0], props[i][1], errstr,
                          sizeof(errstr)) != RD_KAFKA_CONF_OK) {
      fprintf(stderr, "consumer of %s: %s\n", topic, errstr);
      rd_kafka_conf_destroy(conf);
      return NULL;
    }
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  if (!rk) {
    fprintf(stderr, "consumer of %s: %s\n", topic, errstr);
    rd_kafka_conf_destroy(conf);
    return NULL;
  }
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t err = rd_kafka_subscribe(rk, list);
  rd_kafka_topic_partition_list_destroy(list);
  if (err) {
    fprintf(stderr, "subscribe to %s: %s\n", topic, rd_kafka_err2str(err));
    kl_t_consumer_destroy(rk);
    return NULL;
  }
  return rk;
}

int kl_t_consume(rd_kafka_t *rk, int want, int ms,
                 void (*fn)(void *opaque, const rd_kafka_message_t *m, int i),
                 void *opaque) {
  int n = 0;
  for (int waited = 0; waited < ms && n < want; waited += 100) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (m && !m->err)
      fn(opaque, m, n++);
    if (m)
      rd_kafka_message_destroy(m);
  }
  return n;
}

int64_t kl_t_committed(const char *bootstrap, const char *group,
                       const char *topic, int32_t partition) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                    sizeof(errstr));
  rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr));
  rd_kafka_conf_set(conf, "log_level", "0", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  if (!rk) {
    fprintf(stderr, "kl_t_committed: %s\n", errstr);
    return -1;
  }
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, partition);
  int64_t offset = -1;
  if (rd_kafka_committed(rk, l, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
      !l->elems[0].err)
    offset = l->elems[0].offset;
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_destroy(rk);
  return offset;
}

void kl_t_consumer_destroy(rd_kafka_t *rk) {
  if (!rk)
    return;
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
}

void kl_t_header(const rd_kafka_headers_t *h, const char *name, char *out,
                 size_t size) {
  const void *v;
  size_t len;
  out[0] = '\0';
  if (h && rd_kafka_header_get_last(h, name, &v, &len) == 0 && v)
    snprintf(out, size, "%.*s", (int)len, (const char *)v);
}

int64_t kl_t_header_i64(const rd_kafka_headers_t *h, const char *name) {
  char buf[32];
  kl_t_header(h, name, buf, sizeof(buf));
  return buf[0] ? strtoll(buf, NULL, 10) : -1;
}
