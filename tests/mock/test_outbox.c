/*
 * The transactional outbox on the embedded cluster: follow-ups a handler
 * emits (kl_txn_emit()) are published once each with their derived id and
 * removed from the store's outbox, at concurrency 1 and in key-parallel
 * lanes; a fenced owner's follow-ups are never published; and a worker
 * that takes a partition first publishes what its predecessor committed
 * and left in the outbox.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "keylane/producer.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "cli/metrics_server.h"
#include "support/cluster.h"
#include "support/http.h"
#include "support/ledger_checks.h"
#include "support/run.h"
#include "support/support.h"
#include "handlers/exec.h"
#include "worker/checks.h"
#include "worker/letters.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "worker/worker_internal.h"

#define OUT "ob-out"

/* Emits one follow-up to OUT, keyed like its event, whose payload names
 * the worker that ran it (the handler's opaque). */
static kl_handler_result_t
kl_emit_handler(void *opaque, const kl_event_t *event, const kl_fence_t *fence,
                kl_txn_t *txn, char *errbuf, size_t errbuf_size) {
  (void)fence;
  const char *who = opaque;
  kl_err_t err = kl_txn_emit(txn, OUT, event->key, event->key_len, "dst", who,
                             strlen(who));
  if (err) {
    snprintf(errbuf, errbuf_size, "%s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  return KL_HANDLER_OK;
}

typedef struct kl_fx {
  kl_t_cluster_t *cluster;
  char dir[64];
  kl_store_t *store;
  const char *topic, *out;
  int partitions;
} kl_fx_t;

static void kl_fx_up(kl_fx_t *fx, const char *topic, int partitions) {
  memset(fx, 0, sizeof(*fx));
  assert_int_equal(kl_t_cluster_new(1, topic, partitions, &fx->cluster), KL_OK);
  assert_int_equal(kl_t_cluster_topic_create(fx->cluster, OUT, 1), KL_OK);
  fx->topic = kl_t_topic(fx->cluster);
  fx->out = kl_t_name(fx->cluster, OUT);
  fx->partitions = partitions;
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
}

static void kl_fx_down(kl_fx_t *fx) {
  kl_store_destroy(fx->store);
  kl_t_rmrf(fx->dir);
  kl_t_cluster_destroy(fx->cluster);
}

static kl_worker_t *kl_worker(kl_fx_t *fx, const char *group, const char *who,
                              const char *concurrency) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)),
      KL_OK);
  assert_int_equal(
      kl_conf_set(conf, "worker.group", kl_t_group(fx->cluster, group)), KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.concurrency", concurrency), KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.fenced.retake.ms", "0"), KL_OK);
  kl_worker_t *worker;
  assert_int_equal(kl_worker_new(conf, fx->topic, fx->store, kl_emit_handler,
                                 (void *)who, &worker),
                   KL_OK);
  kl_conf_destroy(conf);
  return worker;
}

typedef struct kl_run {
  kl_worker_t *worker;
  pthread_t thread;
  kl_err_t result;
} kl_run_t;

static void *kl_run_main(void *opaque) {
  kl_run_t *r = opaque;
  r->result = kl_worker_run(r->worker);
  return NULL;
}

static void kl_go(kl_run_t *r) {
  assert_int_equal(pthread_create(&r->thread, NULL, kl_run_main, r), 0);
}

static void kl_halt(kl_run_t *r) {
  kl_worker_stop(r->worker);
  pthread_join(r->thread, NULL);
  assert_int_equal(r->result, KL_OK);
  kl_worker_destroy(r->worker);
}

/* Publishes event i with id "src-i" to key "k-i". */
/* Source event i's W3C traceparent, which its follow-ups carry on. */
static void kl_trace_of(int i, char out[56]) {
  snprintf(out, 56, "00-%032x-%016x-01", (unsigned)i + 1, (unsigned)i + 1);
}

static void kl_publish_n(kl_fx_t *fx, int from, int n) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)),
      KL_OK);
  kl_producer_t *producer;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &producer), KL_OK);
  kl_conf_destroy(conf);
  for (int i = from; i < from + n; i++) {
    char key[32], id[32];
    snprintf(key, sizeof(key), "k-%d", i);
    snprintf(id, sizeof(id), "src-%d", i);
    char tp[56];
    kl_trace_of(i, tp);
    kl_header_t trace = {KL_TRACEPARENT, strlen(KL_TRACEPARENT), tp,
                         strlen(tp)};
    kl_event_t ev = {.headers = &trace,
                     .header_count = 1,
                     .key = key,
                     .key_len = strlen(key),
                     .id = id,
                     .id_len = strlen(id),
                     .type = "src",
                     .type_len = 3};
    assert_int_equal(kl_publish(producer, fx->topic, &ev, NULL), KL_OK);
  }
  assert_int_equal(kl_flush(producer, 10000), KL_OK);
  kl_producer_destroy(producer);
}

static int64_t kl_watermarks(kl_fx_t *fx) {
  int64_t sum = 0;
  for (int p = 0; p < fx->partitions; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx->store, fx->topic, p, &st), KL_OK);
    sum += st.watermark;
  }
  return sum;
}

/* The records of OUT: their ids (malloc'd) and payloads' first byte. */
typedef struct kl_out {
  int n;
  char *ids[512];
  char *trace[512]; /* traceparent, or NULL */
  char who[512];
} kl_out_t;

/* Reads OUT's partition 0 from its start to its end: the high watermark
 * when called, after the workers that publish to it stopped, so every
 * record published, a second copy included, is read without waiting for
 * the topic to stay quiet; @p ms bounds the read. */
static void kl_read_out(kl_fx_t *fx, int ms, kl_out_t *out) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", kl_t_bootstrap(fx->cluster),
                    errstr, sizeof(errstr));
  rd_kafka_conf_set(conf, "group.id", "reader", errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  assert_non_null(rk);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, fx->out, 0)->offset =
      RD_KAFKA_OFFSET_BEGINNING;
  assert_int_equal(rd_kafka_assign(rk, l), 0);
  rd_kafka_topic_partition_list_destroy(l);
  int64_t low = 0, end = 0, next = 0;
  assert_int_equal(
      rd_kafka_query_watermark_offsets(rk, fx->out, 0, &low, &end, 10000), 0);
  kl_decoder_t *dec = kl_decoder_new();
  memset(out, 0, sizeof(*out));
  for (int t = 0; t < ms && next < end && out->n < 512;) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m) {
      t += 100;
      continue;
    }
    if (!m->err)
      next = m->offset + 1;
    kl_event_t ev;
    if (!m->err && kl_event_decode(dec, m->key, m->key_len, m->payload, m->len,
                                   &ev) == KL_OK) {
      const kl_header_t *tp = kl_event_header(&ev, KL_TRACEPARENT);
      out->trace[out->n] = tp ? strndup(tp->value, tp->value_len) : NULL;
      out->ids[out->n] = strndup(ev.id, ev.id_len);
      out->who[out->n++] = ev.payload_len ? *(const char *)ev.payload : '?';
    }
    rd_kafka_message_destroy(m);
  }
  kl_decoder_destroy(dec);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  if (next < end)
    fail_msg("read OUT to offset %" PRId64 " of %" PRId64 " in %d ms", next,
             end, ms);
}

static void kl_out_free(kl_out_t *out) {
  for (int i = 0; i < out->n; i++) {
    free(out->ids[i]);
    free(out->trace[i]);
  }
}

static void kl_published_once(const char *concurrency) {
  kl_fx_t fx;
  kl_fx_up(&fx, "ob", 3);
  kl_run_t r = {kl_worker(&fx, "g", "W", concurrency), 0, KL_OK};
  kl_go(&r);
  enum { N = 60 };
  kl_publish_n(&fx, 0, N);
  kl_worker_stats_t st = {0};
  for (int i = 0;
       i < 600 && !(kl_watermarks(&fx) == N && st.outbox_published == N &&
                    !kl_t_outbox_held(fx.store, fx.topic, fx.partitions));
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(kl_watermarks(&fx), N);
  assert_int_equal(st.outbox_published, N);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 0);
  kl_halt(&r);
  kl_out_t out;
  kl_read_out(&fx, 30000, &out);
  assert_int_equal(out.n, N); /* none twice: no crash, no fence here */
  int seen[N] = {0};
  for (int i = 0; i < out.n; i++) {
    /* Its id names its source's place; the source's trace context went on
     * with it, and names the source. */
    kl__emit_src_t src;
    assert_int_equal(kl__emit_id_parse(out.ids[i], strlen(out.ids[i]), &src),
                     0);
    assert_int_equal(src.index, 0);
    assert_int_equal(src.topic_len, strlen(fx.topic));
    assert_memory_equal(src.topic, fx.topic, src.topic_len);
    unsigned k1 = 0;
    assert_non_null(out.trace[i]);
    assert_int_equal(sscanf(out.trace[i], "00-%32x-", &k1), 1);
    int k = (int)k1 - 1;
    assert_true(k >= 0 && k < N);
    char tp[56];
    kl_trace_of(k, tp);
    assert_string_equal(out.trace[i], tp);
    seen[k]++;
  }
  for (int k = 0; k < N; k++)
    assert_int_equal(seen[k], 1);
  kl_out_free(&out);
  kl_fx_down(&fx);
}

static void test_published_once_inline(void **state) {
  (void)state;
  kl_published_once("1");
}

static void test_published_once_lanes(void **state) {
  (void)state;
  kl_published_once("4");
}

/* ---- a fenced owner ---------------------------------------------------- */

typedef struct kl_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int entered, open;
} kl_gate_t;

static kl_gate_t kl_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                            0, 0};

/* Holds the first commit until the test opens the gate. */
static void kl_hold_commit(void *opaque, const char *topic, int32_t partition,
                           uint64_t epoch) {
  (void)opaque, (void)topic, (void)partition, (void)epoch;
  pthread_mutex_lock(&kl_gate.mu);
  kl_gate.entered++;
  pthread_cond_broadcast(&kl_gate.cv);
  while (!kl_gate.open)
    pthread_cond_wait(&kl_gate.cv, &kl_gate.mu);
  pthread_mutex_unlock(&kl_gate.mu);
}

static void test_fenced_follow_ups_never_published(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obf", 1);
  kl_run_t a = {kl_worker(&fx, "g", "A", "1"), 0, KL_OK};
  kl__worker_set_before_commit(a.worker, kl_hold_commit, NULL);
  kl_go(&a);
  kl_publish_n(&fx, 0, 5);
  pthread_mutex_lock(&kl_gate.mu);
  while (!kl_gate.entered)
    pthread_cond_wait(&kl_gate.cv, &kl_gate.mu);
  pthread_mutex_unlock(&kl_gate.mu);
  /* A newer owner takes the partition while A sits before its commit. */
  kl_partition_state_t taken;
  assert_int_equal(kl_store_acquire(fx.store, fx.topic, 0, &taken), KL_OK);
  pthread_mutex_lock(&kl_gate.mu);
  kl_gate.open = 1;
  pthread_cond_broadcast(&kl_gate.cv);
  pthread_mutex_unlock(&kl_gate.mu);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 400 && !st.fenced; i++) {
    kl_t_sleep_ms(25);
    kl_worker_stats(a.worker, &st, sizeof(st));
  }
  assert_true(st.fenced >= 1);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions),
                   0); /* rolled back with the batch */
  kl_halt(&a);
  assert_int_equal(st.outbox_published, 0);

  /* The next owner applies the same events: only its follow-ups exist. */
  kl_run_t b = {kl_worker(&fx, "g", "B", "1"), 0, KL_OK};
  kl_go(&b);
  for (int i = 0;
       i < 600 && !(kl_watermarks(&fx) == 5 && st.outbox_published == 5); i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(b.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 5);
  kl_halt(&b);
  kl_out_t out;
  kl_read_out(&fx, 30000, &out);
  assert_int_equal(out.n, 5);
  for (int i = 0; i < out.n; i++)
    assert_int_equal(out.who[i], 'B');
  kl_out_free(&out);
  kl_fx_down(&fx);
}

/* ---- a predecessor's leftovers ---------------------------------------- */

static void test_next_owner_publishes_leftovers(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obl", 1);
  /* A predecessor's committed follow-ups, as a crash leaves them: in the
   * store, not published. */
  kl_partition_state_t st0;
  assert_int_equal(kl_store_acquire(fx.store, fx.topic, 0, &st0), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(fx.store, fx.topic, 0, st0.epoch, &txn),
                   KL_OK);
  assert_int_equal(kl_txn_emit(txn, OUT, "x", 1, "dst", "P", 1), KL_EINVAL);
  kl__txn_source(txn, fx.topic, 0, 0);
  assert_int_equal(kl_txn_emit(txn, OUT, "x", 1, "dst", "P", 1), KL_OK);
  kl__txn_source(txn, NULL, 0, 0);
  /* The second as a store written before follow-ups' ids had a nonce
   * holds it: an id of the first form, published as it is. */
  char old[KL_ID_MAX + 1];
  snprintf(old, sizeof(old), "~%s/0/0/1", fx.topic);
  kl__emits_t emits = {0};
  kl__outbox_rec_t rec = {.topic = OUT, .topic_len = strlen(OUT)};
  rec.event = (kl_event_t){.key = "y",
                           .key_len = 1,
                           .id = old,
                           .id_len = strlen(old),
                           .type = "dst",
                           .type_len = 3,
                           .ts = 1,
                           .payload = "P",
                           .payload_len = 1};
  assert_int_equal(kl__emits_add(&emits, &rec), KL_OK);
  assert_int_equal(kl__txn_add_emits(txn, &emits), KL_OK);
  free(emits.bytes);
  assert_int_equal(kl_store_commit(txn, 0), KL_OK);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 2);

  kl_run_t r = {kl_worker(&fx, "g", "W", "1"), 0, KL_OK};
  kl_go(&r);
  /* Published on taking the partition, before any event of its own. */
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !(st.outbox_published == 2); i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 2);
  assert_int_equal(kl_watermarks(&fx), 0);
  kl_publish_n(&fx, 0, 3);
  for (int i = 0;
       i < 600 && !(kl_watermarks(&fx) == 3 && st.outbox_published == 5); i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 5);
  kl_halt(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 0);
  kl_out_t out;
  kl_read_out(&fx, 30000, &out);
  assert_int_equal(out.n, 5);
  /* The leftovers first, in commit order, then this owner's. */
  kl__emit_src_t src;
  assert_int_equal(kl__emit_id_parse(out.ids[0], strlen(out.ids[0]), &src), 0);
  assert_true(src.has_nonce && src.offset == 0 && src.index == 0);
  assert_string_equal(out.ids[1], old);
  assert_int_equal(out.who[2], 'W');
  kl_out_free(&out);
  kl_fx_down(&fx);
}

/* ---- exec handlers answer with "emit" --------------------------------- */

static kl_worker_t *kl_exec_worker(kl_fx_t *fx, const char *answer,
                                   kl__exec_t **exec) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "while read -r l; do echo '%s'; done", answer);
  assert_int_equal(kl__exec_new(cmd, exec), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)),
      KL_OK);
  assert_int_equal(
      kl_conf_set(conf, "worker.group", kl_t_group(fx->cluster, "x")), KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.max.attempts", "1"), KL_OK);
  assert_int_equal(kl__exec_configure(*exec, conf), KL_OK);
  kl_worker_t *worker;
  assert_int_equal(kl_worker_new(conf, fx->topic, fx->store, kl__exec_handler,
                                 *exec, &worker),
                   KL_OK);
  kl_conf_destroy(conf);
  return worker;
}

static void test_exec_answer_emits(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obx", 1);
  char answer[256];
  snprintf(answer, sizeof(answer),
           "{\"status\":\"ok\",\"emit\":[{\"topic\":\"%s\","
           "\"key\":\"to\",\"type\":\"dst\",\"payload\":\"E\"}]}",
           fx.out);
  kl__exec_t *exec;
  kl_run_t r = {kl_exec_worker(&fx, answer, &exec), 0, KL_OK};
  kl_go(&r);
  kl_publish_n(&fx, 0, 5);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && st.outbox_published < 5; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 5);
  kl_halt(&r);
  kl__exec_destroy(exec);
  kl_out_t out;
  kl_read_out(&fx, 30000, &out);
  assert_int_equal(out.n, 5);
  for (int i = 0; i < out.n; i++) {
    kl__emit_src_t src;
    assert_int_equal(kl__emit_id_parse(out.ids[i], strlen(out.ids[i]), &src),
                     0);
    assert_int_equal(src.index, 0);
    for (int j = 0; j < i; j++)
      assert_string_not_equal(out.ids[i], out.ids[j]);
    assert_int_equal(out.who[i], (char)0xa1); /* msgpack str "E" */
  }
  kl_out_free(&out);
  kl_fx_down(&fx);
}

static void test_exec_bad_emit_is_a_dead_letter(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "oby", 1);
  kl__exec_t *exec;
  kl_run_t r = {
      kl_exec_worker(&fx, "{\"status\":\"ok\",\"emit\":[{\"key\":1}]}", &exec),
      0, KL_OK};
  kl_go(&r);
  kl_publish_n(&fx, 0, 3);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && st.dead_letters < 3; i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.dead_letters, 3);
  assert_int_equal(st.applied, 0);
  assert_int_equal(st.outbox_published, 0);
  kl_halt(&r);
  kl__exec_destroy(exec);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 0);
  kl_fx_down(&fx);
}

/* ---- the bound ----------------------------------------------------------- */

static kl_worker_t *kl_bound_worker(kl_fx_t *fx, const char *expect) {
  kl_conf_t *conf = kl_conf_new();
  const char *kv[][2] = {
      {"kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)},
      {"worker.group", kl_t_group(fx->cluster, "b")},
      {"worker.outbox.max", "2"},
      /* The outbox's producer refuses OUT (1 partition) while this says 7:
       * nothing of it can be published. */
      {"producer.expect.partitions", expect}};
  for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
    assert_int_equal(kl_conf_set(conf, kv[i][0], kv[i][1]), KL_OK);
  kl_worker_t *worker;
  assert_int_equal(kl_worker_new(conf, fx->topic, fx->store, kl_emit_handler,
                                 (void *)"W", &worker),
                   KL_OK);
  kl_conf_destroy(conf);
  return worker;
}

static void test_bound_pauses_until_published(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obb", 1);
  kl_run_t r = {kl_bound_worker(&fx, "7"), 0, KL_OK};
  kl_go(&r);
  kl_publish_n(&fx, 0, 3);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !(st.paused == 1 && kl_watermarks(&fx) == 3);
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  /* Held at the bound, unpublished: the partition takes nothing more, and
   * the outbox's stall grows (/healthz fails past worker.outbox.stall.ms). */
  assert_int_equal(st.paused, 1);
  assert_int_equal(st.outbox_pending, 2);
  assert_int_equal(st.outbox_published, 0);
  assert_int_equal(st.outbox_aside, 0); /* a wrong count is no record's fault */
  kl_publish_n(&fx, 3, 3);
  kl_t_sleep_ms(1500);
  assert_int_equal(kl_watermarks(&fx), 3);
  kl_worker_stats(r.worker, &st, sizeof(st));
  assert_true(st.outbox_stalled_ms >= 1400);
  kl_halt(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 3);
  /* An owner that can publish takes it: all go out, nothing is paused. */
  r = (kl_run_t){kl_bound_worker(&fx, "1"), 0, KL_OK};
  kl_go(&r);
  /* Until the acknowledged are removed too: the stall is measured before
   * the tick's removal. */
  for (int i = 0;
       i < 600 && !(st.outbox_published == 6 && kl_watermarks(&fx) == 6 &&
                    st.paused == 0 && st.outbox_stalled_ms == 0);
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 6);
  assert_int_equal(st.paused, 0);
  assert_int_equal(st.outbox_stalled_ms, 0);
  kl_halt(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 0);
  kl_fx_down(&fx);
}

/* ---- keylane store outbox ---------------------------------------------- */

static json_t *kl_cli_outbox(kl_fx_t *fx) {
  kl_t_run_t r;
  kl_t_run(
      (const char *[]){"store", "outbox", "--store", fx->dir, "--json", NULL},
      NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  json_t *o = kl_t_run_json(&r);
  kl_t_run_free(&r);
  return o;
}

/* Lists the outbox with `keylane store outbox`: @p n follow-ups, the
 * first to OUT with key @p key and an id that begins with @p id_fmt (its
 * %s the topic); its
 * "P:SEQ", for --drop, into @p drop. */
static void kl_cli_first(kl_fx_t *fx, size_t n, const char *key,
                         const char *id_fmt, char drop[64]) {
  json_t *o = kl_cli_outbox(fx);
  json_t *rows = json_object_get(o, "follow_ups");
  assert_int_equal(json_array_size(rows), n);
  json_t *first = json_array_get(rows, 0);
  assert_string_equal(json_string_value(json_object_get(first, "key")), key);
  assert_string_equal(json_string_value(json_object_get(first, "destination")),
                      fx->out);
  char want[KL_ID_MAX + 1];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  snprintf(want, sizeof(want), id_fmt, fx->topic);
#pragma GCC diagnostic pop
  const char *id = json_string_value(json_object_get(first, "id"));
  if (strncmp(id, want, strlen(want)) != 0)
    fail_msg("the follow-up's id %s does not begin with %s", id, want);
  snprintf(drop, 64, "0:%" JSON_INTEGER_FORMAT,
           json_integer_value(json_object_get(first, "seq")));
  json_decref(o);
}

/* Commits, as partition 0's handler of the event at @p offset would, @p n
 * follow-ups to OUT keyed "x", "y", ..., with payloads @p payloads of
 * @p lens bytes, and the watermark past that event. */
static void kl_commit_emits(kl_fx_t *fx, int64_t offset,
                            const char *const *payloads, const size_t *lens,
                            size_t n) {
  kl_partition_state_t st0;
  assert_int_equal(kl_store_acquire(fx->store, fx->topic, 0, &st0), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(fx->store, fx->topic, 0, st0.epoch, &txn),
                   KL_OK);
  kl__txn_source(txn, fx->topic, 0, offset);
  for (size_t i = 0; i < n; i++) {
    char key[2] = {(char)('x' + i), '\0'};
    assert_int_equal(kl_txn_emit(txn, OUT, key, 1, "dst", payloads[i], lens[i]),
                     KL_OK);
  }
  kl__txn_source(txn, NULL, 0, 0);
  assert_int_equal(kl_store_commit(txn, offset + 1), KL_OK);
}

/* Lists what the outbox holds, drops one follow-up by partition and seq,
 * and refuses a drop of one that is not there. */
static void test_cli_store_outbox(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obc", 1);
  kl_commit_emits(&fx, 7, (const char *[]){"P", "Q"}, (size_t[]){1, 1}, 2);

  char drop[64];
  kl_cli_first(&fx, 2, "x", "~%s/0/7/0/", drop); /* and its nonce */

  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                            fx.topic, "--drop", drop, NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "will not be published"));
  kl_t_run_free(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 1);
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                            fx.topic, "--drop", drop, NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 1); /* gone now */
  assert_non_null(strstr(r.err, "nothing dropped"));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "--drop",
                            "x:1", NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 2);
  kl_t_run_free(&r);
  json_t *o = kl_cli_outbox(&fx);
  assert_int_equal(json_array_size(json_object_get(o, "follow_ups")), 1);
  json_decref(o);
  kl_fx_down(&fx);
}

/* --drop --dry-run checks and shows what it would drop and drops nothing;
 * a seq or partition out of range is refused, not wrapped. */
static void test_cli_store_outbox_dry_run(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obd", 1);
  kl_commit_emits(&fx, 7, (const char *[]){"P"}, (size_t[]){1}, 1);
  json_t *o = kl_cli_outbox(&fx);
  char drop[64];
  snprintf(drop, sizeof(drop), "0:%" JSON_INTEGER_FORMAT,
           json_integer_value(json_object_get(
               json_array_get(json_object_get(o, "follow_ups"), 0), "seq")));
  json_decref(o);

  kl_t_run_t r;
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                            fx.topic, "--drop", drop, "--dry-run", NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  if (!strstr(r.out, "would drop follow-up") ||
      !strstr(r.err, "nothing was dropped"))
    fail_msg("stdout: %s stderr: %s", r.out, r.err);
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                            fx.topic, "--drop", drop, "--dry-run", "--json",
                            NULL},
           NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  o = kl_t_run_json(&r);
  assert_true(json_is_true(json_object_get(o, "dry_run")));
  assert_int_equal(json_array_size(json_object_get(o, "dropped")), 1);
  json_decref(o);
  kl_t_run_free(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 1);

  static const char *const bad[][2] = {
      {"0:99999999999999999999", "the SEQ of --drop"},
      {"0:18446744073709551617", "the SEQ of --drop"},
      {"0:-1", "the SEQ of --drop"},
      {"0:0", "at least 1"},
      {"4294967296:1", "the PARTITION of --drop"},
      {"1:", "the SEQ of --drop"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                              fx.topic, "--drop", bad[i][0], NULL},
             NULL, 0, &r);
    if (r.rc != 2 || !strstr(r.err, bad[i][1]))
      fail_msg("--drop %s: exit %d, stderr: %s", bad[i][0], r.rc, r.err);
    kl_t_run_free(&r);
  }
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 1);
  kl_fx_down(&fx);
}

/* ---- a follow-up Kafka refuses for good ----------------------------- */

/* A worker of @p fx with kafka.message.max.bytes at @p max (NULL:
 * keylane's default), running @p handler; @p conf receives its
 * configuration (for reading letters). */
static kl_worker_t *kl_limited_worker(kl_fx_t *fx, const char *max,
                                      kl_handler_fn_t *handler, void *opaque,
                                      kl_conf_t **conf) {
  *conf = kl_conf_new();
  const char *kv[][2] = {
      {"kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)},
      {"worker.group", kl_t_group(fx->cluster, "a")},
      {"worker.max.attempts", "2"},
      {"kafka.message.max.bytes", max}};
  for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
    if (kv[i][1])
      assert_int_equal(kl_conf_set(*conf, kv[i][0], kv[i][1]), KL_OK);
  kl_worker_t *worker;
  assert_int_equal(
      kl_worker_new(*conf, fx->topic, fx->store, handler, opaque, &worker),
      KL_OK);
  return worker;
}

/* Emits to OUT a follow-up of *opaque bytes for key k-1, and a small one
 * for the others. */
static kl_handler_result_t kl_big_emit_handler(void *opaque,
                                               const kl_event_t *event,
                                               const kl_fence_t *fence,
                                               kl_txn_t *txn, char *errbuf,
                                               size_t errbuf_size) {
  (void)fence;
  size_t size = *(const size_t *)opaque;
  int is_big = event->key_len == 3 && memcmp(event->key, "k-1", 3) == 0;
  char *big = is_big ? malloc(size) : NULL;
  if (big)
    memset(big, 'b', size);
  kl_err_t err = kl_txn_emit(txn, OUT, event->key, event->key_len, "dst",
                             is_big ? big : "s", is_big ? size : 1);
  free(big);
  if (err) {
    snprintf(errbuf, errbuf_size, "%s", kl_err_detail());
    return KL_HANDLER_FAIL;
  }
  return KL_HANDLER_OK;
}

/* The dead letters of @p fx's topic, read from its start to its end. */
static void kl_letters(kl_fx_t *fx, const kl_conf_t *conf,
                       kl__letters_t *letters) {
  char dlq[300];
  snprintf(dlq, sizeof(dlq), "%s.dlq", fx->topic);
  kl__pos_t from = {KL__POS_BEGINNING, 0}, to = {KL__POS_END, 0};
  memset(letters, 0, sizeof(*letters));
  assert_int_equal(kl__letters_read(conf, dlq, &from, &to, NULL, letters),
                   KL_OK);
}

/* @returns the last value of header @p name of @p m, "" when none. */
static const char *kl_header_of(const rd_kafka_message_t *m, const char *name,
                                char *buf, size_t size) {
  rd_kafka_headers_t *h = NULL;
  const void *v;
  size_t len;
  buf[0] = '\0';
  if (rd_kafka_message_headers(m, &h) == 0 &&
      rd_kafka_header_get_last(h, name, &v, &len) == 0 && v)
    snprintf(buf, size, "%.*s", (int)len, (const char *)v);
  return buf;
}

/* A worker of a topic @p name with kafka.message.max.bytes at @p max runs
 * a handler that emits @p size bytes for the second of 4 events: that
 * event fails whole, its dead letter naming the limit, @p named; the
 * others' follow-ups go out. */
static void kl_emit_over_a_limit(const char *name, const char *max, size_t size,
                                 const char *named) {
  kl_fx_t fx;
  kl_fx_up(&fx, name, 1);
  kl_conf_t *conf;
  kl_run_t r = {kl_limited_worker(&fx, max, kl_big_emit_handler, &size, &conf),
                0, KL_OK};
  kl_go(&r);
  kl_publish_n(&fx, 0, 4); /* k-1 is the second: two are behind it */
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !(st.outbox_published == 3 &&
                               st.dead_letters == 1 && kl_watermarks(&fx) == 4);
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 3);
  assert_int_equal(st.dead_letters, 1);
  assert_int_equal(st.outbox_aside, 0);
  assert_int_equal(st.outbox_kept, 0);
  assert_int_equal(kl_watermarks(&fx), 4);
  kl_halt(&r);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 0);

  kl__letters_t letters;
  kl_letters(&fx, conf, &letters);
  assert_int_equal(letters.n, 1);
  const kl__letter_t *l = &letters.v[0];
  assert_string_equal(l->reason, "handler_fail");
  assert_int_equal(l->offset, 1);
  assert_string_equal(l->truncated, "");
  kl_decoder_t *decoder = kl_decoder_new();
  kl_event_t ev;
  assert_int_equal(kl_event_decode(decoder, l->msg->key, l->msg->key_len,
                                   l->msg->payload, l->msg->len, &ev),
                   KL_OK); /* the whole source event */
  assert_memory_equal(ev.id, "src-1", 5);
  kl_decoder_destroy(decoder);
  char error[1024];
  kl_header_of(l->msg, "keylane.dlq.error", error, sizeof(error));
  if (!strstr(error, "kl_txn_emit") || !strstr(error, named))
    fail_msg("the letter does not say which limit refused it (%s): %s", named,
             error);
  kl__letters_clear(&letters);
  kl_conf_destroy(conf);
  kl_fx_down(&fx);
}

/* The probe: with kafka.message.max.bytes at 100,000 a handler emitted a
 * follow-up over it; the outbox could never publish it, set it aside as a
 * letter cut short and deleted it, and the credit was gone. kl_txn_emit()
 * refuses it now, naming the limit: the event fails whole, its dead letter
 * is the whole source record (redrivable once the handler or the limit is
 * fixed), and the other events' follow-ups go out. */
static void test_emit_over_the_limit_fails_its_event(void **state) {
  (void)state;
  kl_emit_over_a_limit("obl", "100000", 150000,
                       "the worker's kafka.message.max.bytes, 100000");
}

/* The topic's max.message.bytes, as DescribeConfigs tells it. */
static const char *kl_topic_max(const char *topic, const char *name) {
  (void)topic;
  return strcmp(name, "max.message.bytes") == 0 ? "50000" : NULL;
}

/* A topic that takes less than the producer: its limit refuses the emit. */
static void test_emit_over_the_topic_limit_fails_its_event(void **state) {
  (void)state;
  kl__checks_set_topic_config(kl_topic_max);
  kl_emit_over_a_limit("obt", NULL, 60000,
                       "topic obt's max.message.bytes, 50000");
  kl__checks_set_topic_config(NULL);
}

/* GETs @p path of @p port until it answers @p status (10 s at most);
 * @returns the last body (free it). */
static char *kl_get_until(int port, const char *path, int status) {
  kl_t_http_resp_t resp = {0};
  for (int i = 0; i < 100; i++) {
    kl_t_http_resp_free(&resp);
    assert_int_equal(kl_t_http_once(port, "GET", path, NULL, NULL, &resp), 0);
    if (resp.status == status)
      break;
    kl_t_sleep_ms(100);
  }
  if (resp.status != status)
    fail_msg("%s answers %d, not %d: %s", path, resp.status, status, resp.body);
  char *body = strdup(resp.body ? resp.body : "");
  kl_t_http_resp_free(&resp);
  return body;
}

/* A follow-up committed under a larger limit than the worker publishing it
 * has (an operator lowered kafka.message.max.bytes): Kafka refuses it, and
 * its dead letter too. It is kept in the store, not cut short and deleted:
 * `keylane store outbox` lists it, /healthz says "degraded" and
 * keylane_worker_outbox_kept counts it, the follow-ups behind it go out; once
 * an operator drops it, the worker forgets it. */
static void test_refused_follow_up_is_kept(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "obk", 1);
  kl_publish_n(&fx, 0, 1); /* the source event, applied below */
  static char big[3000];
  memset(big, 'b', sizeof(big));
  kl_commit_emits(&fx, 0, (const char *[]){"P", big, "Q"},
                  (size_t[]){1, sizeof(big), 1}, 3);

  size_t size = 1;
  kl_conf_t *conf;
  kl_run_t r = {
      kl_limited_worker(&fx, "2000", kl_big_emit_handler, &size, &conf), 0,
      KL_OK};
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", conf, fx.topic,
                                            r.worker, fx.store, &server),
                   KL_OK);
  kl_go(&r);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !(st.outbox_published == 2 &&
                               st.outbox_kept == 1 && st.outbox_pending == 1);
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_published, 2);
  assert_int_equal(st.outbox_kept, 1);
  assert_int_equal(st.outbox_aside, 0);
  assert_int_equal(st.outbox_pending, 1);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, fx.partitions), 1);
  int port = kl__metrics_server_port(server);
  /* Degraded, not 503: the worker runs well, and a liveness probe's
   * restart would not help. */
  char *body = kl_get_until(port, "/healthz", 200);
  if (strncmp(body, "degraded: ", 10) != 0 ||
      !strstr(body, "1 follow-ups are refused by Kafka") ||
      !strstr(body, "keylane store outbox"))
    fail_msg("/healthz does not say a follow-up is kept: %s", body);
  free(body);
  body = kl_get_until(port, "/metrics", 200);
  if (!strstr(body, "\nkeylane_worker_outbox_kept 1\n"))
    fail_msg("no keylane_worker_outbox_kept 1 in /metrics:\n%s", body);
  free(body);
  kl__letters_t letters;
  kl_letters(&fx, conf, &letters);
  assert_int_equal(letters.n, 0); /* no letter cut short */
  kl__letters_clear(&letters);

  char drop[64];
  kl_cli_first(&fx, 1, "y", "~%s/0/0/1/", drop);
  kl_t_run_t run;
  kl_t_run((const char *[]){"store", "outbox", "--store", fx.dir, "-t",
                            fx.topic, "--drop", drop, NULL},
           NULL, 0, &run);
  assert_int_equal(run.rc, 0);
  kl_t_run_free(&run);
  for (int i = 0; i < 600 && !(st.outbox_kept == 0 && st.outbox_pending == 0);
       i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(r.worker, &st, sizeof(st));
  }
  assert_int_equal(st.outbox_kept, 0); /* forgotten at its next try */
  assert_int_equal(st.outbox_pending, 0);
  body = kl_get_until(port, "/healthz", 200);
  assert_int_equal(strncmp(body, "ok: ", 4), 0);
  free(body);
  kl_halt(&r);
  kl__metrics_server_stop(server);
  kl_conf_destroy(conf);
  kl_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_published_once_inline),
      cmocka_unit_test(test_published_once_lanes),
      cmocka_unit_test(test_fenced_follow_ups_never_published),
      cmocka_unit_test(test_next_owner_publishes_leftovers),
      cmocka_unit_test(test_exec_answer_emits),
      cmocka_unit_test(test_exec_bad_emit_is_a_dead_letter),
      cmocka_unit_test(test_bound_pauses_until_published),
      cmocka_unit_test(test_cli_store_outbox),
      cmocka_unit_test(test_emit_over_the_limit_fails_its_event),
      cmocka_unit_test(test_emit_over_the_topic_limit_fails_its_event),
      cmocka_unit_test(test_refused_follow_up_is_kept),
      cmocka_unit_test(test_cli_store_outbox_dry_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
