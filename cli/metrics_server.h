/*
 * The worker's /metrics and /healthz (`keylane worker --metrics-listen`):
 * a small HTTP/1.1 server on its own thread and libuv loop.
 *
 * GET /metrics renders, per scrape, the worker's counters and gauges
 * (kl_worker_stats()), for every partition of the topic the store knows,
 * its watermark and owner epoch, and for each partition the worker owns,
 * its lag (the high watermark the worker's consumer last fetched minus
 * the store's watermark). A scrape asks Kafka nothing. A store
 * commit-latency histogram is not exported: the commit happens inside
 * the worker, which has no hook for it.
 *
 * The store is read through the worker's store reader
 * (worker/store_read.h), cached: after the first read the server answers
 * from the last read and never waits for the store; a store that accepts
 * and never answers makes /healthz 503 "the store has not answered a read
 * for N ms" once that read is 2 s old, and
 * keylane_worker_store_read_age_seconds grow, and /livez and /metrics
 * still answer.
 *
 * For dashboards built on kafka_exporter, the same lag is also
 * kafka_consumergroup_lag{consumergroup,topic,partition} (worker.group as
 * consumergroup), and keylane_worker_lag_seconds{topic,partition} is the
 * age of each owned partition's oldest unapplied event taken in, from its
 * envelope ts (0 when none waits).
 *
 * The log guard's partitions (log_guard.h) are series too:
 * keylane_worker_partition_stopped{topic,partition,reason} (1 while the
 * partition is stopped because its log went backwards or lost records)
 * and keylane_worker_gap_records_total{topic,partition}.
 *
 * GET /healthz answers kl_worker_health()'s verdict (keylane/worker.h,
 * worker/worker_health.c says what it checks): 200 with its reason when
 * OK or DEGRADED, 503 when FAILING.
 *
 * GET /healthz?format=json, or with an Accept header naming
 * application/json, answers the same status code with a JSON document and
 * a Burrow-style status per partition (cli/health_json.h);
 * ?format=text forces the plain answer, another format= is a 400.
 *
 * The connections are common/http.h's, with its strict framing: 32
 * waiting for their request (a new one past them closes the oldest
 * waiting one, so idle clients cannot lock a liveness probe out), 64 held
 * at all; a head of 8 KiB (431), a body of 8 KiB (413), 10 s for a
 * request to arrive (408) and for an idle connection; one request per
 * connection (Connection: close). Errors are text, like the answers.
 *
 * Caveats: the server reads @p worker and @p store from its own thread;
 * both are borrowed and must outlive kl__metrics_server_stop().
 */
#ifndef KEYLANE_CLI_METRICS_SERVER_H
#define KEYLANE_CLI_METRICS_SERVER_H

#include "keylane/conf.h"
#include "keylane/store.h"
#include "keylane/worker.h"

typedef struct kl__metrics_server kl__metrics_server_t;
struct kl__strbuf;

/**
 * Listens on @p listen ("HOST:PORT", "[V6]:PORT" or ":PORT" for
 * 127.0.0.1; port 0 picks a free one) and serves on a new thread.
 * @param conf  read for kafka.bootstrap.servers (the lag query); copied.
 * @param out   receives the server, stopped with kl__metrics_server_stop().
 * @returns KL_OK; KL_ECONF for a bad address; KL_EIO when it cannot bind.
 */
kl_err_t kl__metrics_server_start(const char *listen, const kl_conf_t *conf,
                                  const char *topic, kl_worker_t *worker,
                                  kl_store_t *store,
                                  kl__metrics_server_t **out);

/**
 * Appends to @p sb the metrics reference's rows (kl__metrics_describe())
 * of every family the worker's /metrics has, for docs/metrics.md.
 */
void kl__metrics_server_describe(kl__metrics_server_t *server,
                                 struct kl__strbuf *sb);

/** @returns the port it listens on. */
int kl__metrics_server_port(const kl__metrics_server_t *server);

/** Stops the thread, closes every connection and frees; accepts NULL. */
void kl__metrics_server_stop(kl__metrics_server_t *server);

#endif
