/*
 * Static group membership (KIP-345): worker.instance.id, given to
 * librdkafka as group.instance.id. A static member that closes does not
 * leave the group: Kafka keeps its partitions for it for the session
 * timeout, and a process that joins with the same id within it gets them
 * back without a rebalance. It still takes a new epoch for each (the old
 * process may live on as a zombie), and resumes from the store.
 *
 * Two live processes with one id: Kafka hands the id to the one that
 * joined last and answers the other FENCED_INSTANCE_ID, which librdkafka
 * raises as a fatal consumer error (RD_KAFKA_RESP_ERR__FATAL from
 * rd_kafka_consumer_poll(), the cause from rd_kafka_fatal_error(), 2.0.2
 * and later alike). The worker stops at once, commits nothing more, and
 * kl_worker_run() returns the error kl__membership_fatal() words.
 */
#ifndef KEYLANE_WORKER_MEMBERSHIP_H
#define KEYLANE_WORKER_MEMBERSHIP_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "keylane/conf.h"
#include "keylane/error.h"

/** Longest instance id Kafka takes (a group id's bound), plus the NUL. */
#define KL__INSTANCE_ID_MAX 250

/**
 * Checks worker.instance.id: empty (dynamic membership) or 1-249
 * characters of a-z, A-Z, 0-9, '.', '_' and '-', as Kafka requires.
 * @returns KL_OK, or KL_ECONF naming the value and the fix.
 */
kl_err_t kl__membership_check(const kl_conf_t *conf);

/** Checks @p id, the value of @p key (worker.instance.id, or the
 *  group.instance.id librdkafka is given), as kl__membership_check();
 *  the message shows it escaped. NULL is "". */
kl_err_t kl__membership_id_check(const char *key, const char *id);

/**
 * Appends group.instance.id = worker.instance.id to @p defaults (key,
 * value pairs, NULL-terminated, room for KL__RDK_DEFAULTS_MAX) when set;
 * the value is borrowed from @p conf. A kafka.group.instance.id setting
 * still wins, as every kafka.* one does.
 */
void kl__membership_defaults(const kl_conf_t *conf, const char **defaults);

/**
 * The instance id @p kconf gives librdkafka, into @p out (@p size bytes;
 * "" for a dynamic member). Read from the final configuration, so that
 * kafka.group.instance.id counts too.
 */
void kl__membership_instance(const rd_kafka_conf_t *kconf, char *out,
                             size_t size);

/**
 * Words the fatal error @p rk raised (after RD_KAFKA_RESP_ERR__FATAL came
 * from its consumer poll) for a person: for FENCED_INSTANCE_ID, which
 * @p instance_id is used twice in @p group and how to fix it. Logs it and
 * sets it as kl_err_detail().
 * @returns KL_EFENCED for a fenced instance, else KL_EKAFKA.
 */
kl_err_t kl__membership_fatal(rd_kafka_t *rk, const char *group,
                              const char *instance_id);

/**
 * Says (a WARN) when @p instance_id is set but the cluster @p rk reaches
 * cannot keep static members: librdkafka 2.0.2's mock cluster, the
 * embedded one, told by its missing controller (kl__kafka_has_controller())
 * reads group.instance.id and ignores it, so two live workers with one id
 * both run there, as dynamic members. Silent for "" and on Kafka.
 */
void kl__membership_check_cluster(rd_kafka_t *rk, const char *group,
                                  const char *instance_id);

#endif
