/*
 * keylane-bench worker --breakdown: what one event costs on the apply
 * path, step by step, measured in memory without Kafka.
 *
 * The events are ledger credits as kl_publish() writes them (a fresh id
 * each, 1,000 keys, per-key seq), held as records of one partition. Each
 * step is the difference between two runs of the worker's own batch step,
 * kl__apply_batch() (worker/apply.c), on a durable LMDB store:
 *   decode   kl_event_decode() of every record, alone;
 *   checks   a dry run without the handler (decode again, the id rules,
 *            the routing check, the dedup lookup and the mark), minus
 *            decode;
 *   handler  a dry run with the ledger (its get and put of the balance),
 *            minus the run without it;
 *   commit   the run that commits each batch durably, minus the dry run:
 *            the store commit's share per event.
 * The worker's own figure, from the same keylane-bench worker run, is
 * beside them: what is left is Kafka's consume, the lanes' queues and
 * locks, and the threads between them.
 */
#include <librdkafka/rdkafka.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "keylane/event.h"
#include "keylane/handlers.h"
#include "keylane/store.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "worker/apply.h"

#define KL_BS_TOPIC "steps"
#define KL_BS_KEYS 1000

static kl_handler_result_t kl_bs_none(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)event, (void)fence, (void)txn, (void)errbuf;
  (void)errbuf_size;
  return KL_HANDLER_OK;
}

/* @p n credits as records of partition 0 at offsets 0..n-1. */
static rd_kafka_message_t *kl_bs_records(int64_t n) {
  rd_kafka_message_t *m = calloc((size_t)n, sizeof(*m));
  int64_t *seq = calloc(KL_BS_KEYS, sizeof(*seq));
  if (!m || !seq) {
    free(m);
    free(seq);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++) {
    char key[16], id[37];
    int k = (int)(i % KL_BS_KEYS);
    int key_len = snprintf(key, sizeof(key), "acct-%d", k);
    kl_event_make_id(id);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kl_ledger_args_t a = {.amount = 1, .has_seq = 1, .seq = ++seq[k]};
    kl__ledger_encode(&sb, &a);
    kl_event_t ev = {.key = key,
                     .key_len = (size_t)key_len,
                     .id = id,
                     .id_len = strlen(id),
                     .type = "credit",
                     .type_len = 6,
                     .payload = sb.data,
                     .payload_len = sb.size};
    void *value = NULL;
    size_t len = 0;
    kl_err_t err = kl_event_encode(&ev, &value, &len);
    msgpack_sbuffer_destroy(&sb);
    if (err) {
      fprintf(stderr, "keylane-bench worker --breakdown: encode: %s\n",
              kl_err_detail());
      free(seq);
      return m; /* the rest stays empty: it fails to decode, and says so */
    }
    m[i].payload = value;
    m[i].len = len;
    m[i].key = strdup(key);
    m[i].key_len = (size_t)key_len;
    m[i].offset = i;
  }
  free(seq);
  return m;
}

static void kl_bs_records_free(rd_kafka_message_t *m, int64_t n) {
  for (int64_t i = 0; m && i < n; i++) {
    free(m[i].payload);
    free(m[i].key);
  }
  free(m);
}

/* Seconds for kl__apply_batch() over every record, @p batch at a time.
 * @returns < 0 when a batch failed (said on stderr). */
static double kl_bs_run(kl__applier_t *a, uint64_t epoch, rd_kafka_message_t *m,
                        int64_t n, int64_t batch) {
  rd_kafka_message_t **ptrs = malloc((size_t)batch * sizeof(*ptrs));
  if (!ptrs)
    return -1;
  int64_t watermark = 0;
  double t0 = kl_bench_now();
  for (int64_t off = 0; off < n; off += batch) {
    int64_t count = n - off < batch ? n - off : batch;
    for (int64_t i = 0; i < count; i++)
      ptrs[i] = &m[off + i];
    kl__apply_result_t res;
    kl_err_t err = kl__apply_batch(a, 0, epoch, a->dry_run ? off : watermark,
                                   ptrs, (size_t)count, &res);
    if (err || res.verdict != KL_HANDLER_OK) {
      fprintf(stderr,
              "keylane-bench worker --breakdown: a batch at offset %lld "
              "failed: %s %s\n",
              (long long)off, kl_err_name(err), res.why);
      free(ptrs);
      return -1;
    }
    watermark = res.next;
  }
  double s = kl_bench_now() - t0;
  free(ptrs);
  return s;
}

int kl_bench_steps(int64_t events, int64_t batch, kl_bench_steps_t *out) {
  memset(out, 0, sizeof(*out));
  out->events = events;
  out->batch = batch;
  rd_kafka_message_t *m = kl_bs_records(events);
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store = NULL;
  kl_decoder_t *decoder = kl_decoder_new();
  kl_partition_state_t st;
  int rc = -1;
  if (!m || !decoder || kl_store_open(dir, NULL, &store) ||
      kl_store_acquire(store, KL_BS_TOPIC, 0, &st)) {
    fprintf(stderr, "keylane-bench worker --breakdown: %s\n", kl_err_detail());
    goto done;
  }
  kl_event_t ev;
  double t0 = kl_bench_now();
  for (int64_t i = 0; i < events; i++)
    if (kl_event_decode(decoder, m[i].key, m[i].key_len, m[i].payload, m[i].len,
                        &ev)) {
      fprintf(stderr, "keylane-bench worker --breakdown: decode: %s\n",
              kl_err_detail());
      goto done;
    }
  double decode_s = kl_bench_now() - t0;
  kl__applier_t a = {.store = store,
                     .topic = KL_BS_TOPIC,
                     .handler = kl_bs_none,
                     .decoder = decoder,
                     .partitions = 1,
                     .dry_run = 1};
  double checks_s = kl_bs_run(&a, st.epoch, m, events, batch);
  a.handler = kl_ledger_handler;
  a.dry_run_handler = 1;
  double handler_s = kl_bs_run(&a, st.epoch, m, events, batch);
  a.dry_run = 0;
  double commit_s = kl_bs_run(&a, st.epoch, m, events, batch);
  if (checks_s < 0 || handler_s < 0 || commit_s < 0)
    goto done;
  double per = 1e9 / (double)events;
  out->decode_ns = decode_s * per;
  out->checks_ns = (checks_s - decode_s) * per;
  out->handler_ns = (handler_s - checks_s) * per;
  out->commit_ns = (commit_s - handler_s) * per;
  out->apply_ns = commit_s * per;
  rc = 0;
done:
  kl_store_destroy(store);
  kl_decoder_destroy(decoder);
  kl_t_rmrf(dir);
  kl_bs_records_free(m, events);
  return rc;
}
