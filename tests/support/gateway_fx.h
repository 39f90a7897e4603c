/*
 * The gateway tests' fixture (tests/mock/test_gateway*.c): librdkafka's
 * mock cluster made here, not through kl_embedded, so that tests can take
 * its brokers down and up again; a gateway on it; requests and their
 * answers.
 */
#ifndef KEYLANE_TESTS_SUPPORT_GATEWAY_FX_H
#define KEYLANE_TESTS_SUPPORT_GATEWAY_FX_H

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "support/http.h"

#define KL_T_GW_TOPIC "events"
#define KL_T_GW_PARTS 8
#define KL_T_GW_BROKERS 3
#define KL_T_GW_JSON_CT "Content-Type: application/json\r\n"
/* A small event, 23 bytes. */
#define KL_T_GW_SM_EV "{\"key\":\"sm\",\"type\":\"t\"}"

/* The cluster and its bootstrap list, between kl_t_gw_up() and
 * kl_t_gw_down(). */
extern rd_kafka_mock_cluster_t *kl_t_gw_mc;
extern char kl_t_gw_bootstrap[512];

/* A cmocka group setup and teardown: the cluster, with KL_T_GW_TOPIC
 * (KL_T_GW_PARTS partitions) and the other topics the tests name. */
int kl_t_gw_up(void **state);
int kl_t_gw_down(void **state);

/* Takes every broker up (@p up 1) or down (0). */
void kl_t_gw_brokers(int up);

/* Starts a gateway on the cluster: @p opts, or the defaults with a 2 s
 * produce timeout when NULL. */
kl_t_gateway_t *kl_t_gw_start(const kl__gateway_opts_t *opts);

/* Waits until /healthz says @p want (200 or 503); fails the test after
 * 10 s. */
void kl_t_gw_wait_health(int port, int want);

/* A POST of @p body to @p topic's events route; JSON unless @p extra gives
 * a Content-Type. @returns kl_t_http_once()'s. */
int kl_t_gw_post(int port, const char *topic, const char *extra,
                 const char *body, kl_t_http_resp_t *r);

/* @p r's body as JSON (the caller's to json_decref()); fails the test when
 * it is not. */
json_t *kl_t_gw_json(const kl_t_http_resp_t *r);

/* Checks a 200 body: one result per key, on kl_partition()'s partition. */
void kl_t_gw_assert_routed(const kl_t_http_resp_t *r, const char *const *keys,
                           size_t n);

/* The value of one label-less sample in /metrics, or -1. */
double kl_t_gw_metric(int port, const char *sample);

#endif
