/*
 * The LMDB store's outbox: kl_txn_emit() is part of the batch (rolled
 * back by an abort and by a fenced commit, written by a commit under seqs
 * that only grow), ids derive from the source id and the emit's index,
 * and the limits are refused with a reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/handlers.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "worker/apply.h"
#include "worker/rebuild.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"

typedef struct kl_seen {
  size_t n;
  uint64_t seqs[128];
  char ids[128][KL_ID_MAX + 1];
} kl_seen_t;

static int kl_seen_cb(void *opaque, uint64_t seq, const void *rec, size_t len) {
  kl_seen_t *s = opaque;
  kl__outbox_rec_t r;
  assert_int_equal(kl__outbox_rec_decode(rec, len, &r), 0);
  s->seqs[s->n] = seq;
  memcpy(s->ids[s->n], r.event.id, r.event.id_len);
  s->ids[s->n][r.event.id_len] = '\0';
  s->n++;
  return 0;
}

static void kl_list(kl_store_t *store, kl_seen_t *s) {
  memset(s, 0, sizeof(*s));
  assert_int_equal(kl__store_outbox_list(store, "t", 0, 0, 128, kl_seen_cb, s),
                   KL_OK);
}

/* A new LMDB store in @p dir (made here) with partition 0 of "t" taken. */
static kl_store_t *kl_open_t0(char dir[64], kl_partition_state_t *st) {
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  assert_int_equal(kl_store_acquire(store, "t", 0, st), KL_OK);
  return store;
}

/* A batch whose event at @p offset of "t" [0] emits @p n follow-ups. */
static kl_txn_t *kl_begin_emit(kl_store_t *store, uint64_t epoch,
                               int64_t offset, int n) {
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, epoch, &txn), KL_OK);
  kl__txn_source(txn, "t", 0, offset);
  for (int i = 0; i < n; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "credit", "p", 1), KL_OK);
  kl__txn_source(txn, NULL, 0, 0);
  return txn;
}

/* @p id is the follow-up id of @p place ("~t/0/11/0") with a nonce;
 * @returns the nonce. */
static uint64_t kl_assert_place(const char *id, const char *place) {
  kl__emit_src_t src;
  size_t n = strlen(place);
  if (strncmp(id, place, n) != 0 || strlen(id) != n + 17 || id[n] != '/')
    fail_msg("follow-up id %s is not %s/<16 hex digits>", id, place);
  assert_int_equal(kl__emit_id_parse(id, strlen(id), &src), 0);
  assert_true(src.has_nonce);
  return src.nonce;
}

static void test_emit_is_part_of_the_batch(void **state) {
  (void)state;
  char dir[64];
  kl_partition_state_t st;
  kl_store_t *store = kl_open_t0(dir, &st);
  kl_seen_t s;

  kl_store_abort(kl_begin_emit(store, st.epoch, 10, 2)); /* rolled back */
  kl_list(store, &s);
  assert_int_equal(s.n, 0);

  assert_int_equal(kl_store_commit(kl_begin_emit(store, st.epoch, 11, 2), 1),
                   KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 2);
  /* One event's follow-ups share its run's nonce. */
  assert_true(kl_assert_place(s.ids[0], "~t/0/11/0") ==
              kl_assert_place(s.ids[1], "~t/0/11/1"));
  assert_true(s.seqs[0] < s.seqs[1]);
  uint64_t last = s.seqs[1];

  /* A fenced commit writes none of its follow-ups. */
  kl_txn_t *stale = kl_begin_emit(store, st.epoch, 12, 1);
  kl_partition_state_t newer;
  assert_int_equal(kl_store_acquire(store, "t", 0, &newer), KL_OK);
  assert_int_equal(kl_store_commit(stale, 2), KL_EFENCED);
  kl_list(store, &s);
  assert_int_equal(s.n, 2);

  /* Removed once published; later seqs still grow past the removed. */
  kl__outbox_ack_t acks[3] = {{0, s.seqs[0]}, {0, s.seqs[1]}, {1, 99}};
  assert_int_equal(kl__store_outbox_del(store, "t", acks, 3), KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 0);
  assert_int_equal(kl_store_commit(kl_begin_emit(store, newer.epoch, 13, 1), 3),
                   KL_OK);
  kl_list(store, &s);
  assert_int_equal(s.n, 1);
  assert_true(s.seqs[0] > last);
  kl_assert_place(s.ids[0], "~t/0/13/0");
  /* Listing from a seq on. */
  memset(&s, 0, sizeof(s));
  assert_int_equal(kl__store_outbox_list(store, "t", 0, s.seqs[0] + 1000, 128,
                                         kl_seen_cb, &s),
                   KL_OK);
  assert_int_equal(s.n, 0);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

static void test_emit_limits(void **state) {
  (void)state;
  char dir[64];
  kl_partition_state_t st;
  kl_store_t *store = kl_open_t0(dir, &st);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, st.epoch, &txn), KL_OK);
  /* Outside a handler there is no source event to derive an id from. */
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_EINVAL);
  kl__txn_source(txn, "t", 0, 5);
  for (int i = 0; i < KL__EMIT_MAX; i++)
    assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_OK);
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "at most 64"));
  /* The next event counts from 0 again. */
  kl__txn_source(txn, "t", 0, 6);
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_OK);
  /* A source topic too long for the id to hold is refused by name. */
  char topic[KL__EMIT_TOPIC_MAX + 2];
  memset(topic, 'x', sizeof(topic) - 1), topic[sizeof(topic) - 1] = 0;
  kl__txn_source(txn, topic, 0, 7);
  assert_int_equal(kl_txn_emit(txn, NULL, "k", 1, "t", NULL, 0), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "at most 203"));
  kl__txn_source(txn, "t", 0, 8);
  assert_int_not_equal(kl_txn_emit(txn, NULL, NULL, 0, "t", NULL, 0), KL_OK);
  /* Topics no client may publish to, and names Kafka refuses. */
  static const char *const bad[] = {"events.dlq", "__consumer_offsets",
                                    "bad topic", "..", "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(kl_txn_emit(txn, bad[i], "k", 1, "t", NULL, 0), KL_EINVAL);
    assert_non_null(strstr(kl_err_detail(), "kl_txn_emit: "));
  }
  assert_int_not_equal(kl_txn_emit(txn, NULL, "k", 1, "", NULL, 0), KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* The probe that wedged an outbox: a follow-up with the longest key, id
 * and type and a payload at the limit passes the event's own limits, but the
 * source's trace context it carries on makes the record too large for
 * Kafka. The emit is refused now, not after its commit. */
static void test_emit_counts_the_trace_context(void **state) {
  (void)state;
  char dir[64];
  kl_partition_state_t st;
  kl_store_t *store = kl_open_t0(dir, &st);
  static char key[KL_KEY_MAX], type[KL_TYPE_MAX + 1], payload[KL_PAYLOAD_MAX];
  static char state_hdr[513];
  memset(key, 'k', sizeof(key));
  memset(type, 't', KL_TYPE_MAX);
  memset(payload, 'p', sizeof(payload));
  memset(state_hdr, 'a', 512);
  memcpy(state_hdr, "vendor=", 7);
  const char *tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  kl_header_t trace[2] = {
      {KL_TRACEPARENT, strlen(KL_TRACEPARENT), tp, strlen(tp)},
      {KL_TRACESTATE, strlen(KL_TRACESTATE), state_hdr, 512}};
  kl_event_t src = {.key = "s",
                    .key_len = 1,
                    .id = "i",
                    .id_len = 1,
                    .type = "x",
                    .type_len = 1,
                    .headers = trace,
                    .header_count = 2};
  /* A long source topic makes the longest follow-up ids. */
  static char topic[KL__EMIT_TOPIC_MAX + 1];
  memset(topic, 'x', KL__EMIT_TOPIC_MAX);
  kl_fence_t fence = {topic, 0, st.epoch, 4};
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "t", 0, st.epoch, &txn), KL_OK);
  kl__txn_source_event(txn, &src, &fence);
  assert_int_equal(
      kl_txn_emit(txn, NULL, key, sizeof(key), type, payload, sizeof(payload)),
      KL_EDECODE_OVERSIZE);
  assert_non_null(strstr(kl_err_detail(), "as a Kafka record"));
  assert_null(strstr(kl_err_detail(), "kl_txn_emit: kl_txn_emit"));
  /* Without the trace context it fits. */
  kl__txn_source(txn, topic, 0, 4);
  assert_int_equal(
      kl_txn_emit(txn, NULL, key, sizeof(key), type, payload, sizeof(payload)),
      KL_OK);
  kl_store_abort(txn);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* A follow-up's id names its source's place in the log and its run's
 * nonce, fits KL_ID_MAX for the longest topic, partition and offset
 * allowed, and parses back; an id of the first form (no nonce), as stores
 * written before hold, parses too; nothing a client may publish parses as
 * one. */
static void test_emit_ids(void **state) {
  (void)state;
  char out[KL_ID_MAX + 1], topic[KL__EMIT_TOPIC_MAX_V1 + 1];
  kl__emit_src_t src = {"events", 6, 3, 1042, 7, 0x00c0ffee0000beefu, 1};
  kl__emit_src_t back;
  assert_int_equal(kl__emit_id(&src, out), 33);
  assert_string_equal(out, "~events/3/1042/7/00c0ffee0000beef");
  assert_int_equal(kl__emit_id_parse(out, 33, &back), 0);
  assert_int_equal(back.topic_len, 6);
  assert_memory_equal(back.topic, "events", 6);
  assert_int_equal(back.partition, 3);
  assert_int_equal(back.offset, 1042);
  assert_int_equal(back.index, 7);
  assert_true(back.has_nonce && back.nonce == 0x00c0ffee0000beefu);
  /* the first form */
  assert_int_equal(kl__emit_id_parse("~events/3/1042/7", 16, &back), 0);
  assert_true(!back.has_nonce && back.offset == 1042 && back.index == 7);
  src.has_nonce = 0;
  assert_int_equal(kl__emit_id(&src, out), 16);
  assert_string_equal(out, "~events/3/1042/7");
  memset(topic, 'a', sizeof(topic));
  for (int v1 = 0; v1 < 2; v1++) {
    size_t max = v1 ? KL__EMIT_TOPIC_MAX_V1 : KL__EMIT_TOPIC_MAX;
    src = (kl__emit_src_t){
        topic, max, INT32_MAX, INT64_MAX, KL__EMIT_MAX - 1, UINT64_MAX, !v1};
    size_t n = kl__emit_id(&src, out);
    assert_int_equal(n, KL_ID_MAX);
    assert_int_equal(kl__emit_id_parse(out, n, &back), 0);
    assert_int_equal(back.offset, INT64_MAX);
    assert_true(back.nonce == (v1 ? 0 : UINT64_MAX));
    src.topic_len++;
    assert_int_equal(kl__emit_id(&src, out), 0);
  }
  static const char *const none[] = {"invoice/42/0",
                                     "events/3/1042/7",
                                     "~events/3/1042",
                                     "~/3/1/0",
                                     "~t/03/1/0",
                                     "~t/3/-1/0",
                                     "~t/3/1/64",
                                     "~t/3/1/",
                                     "~t/3//0",
                                     "~t/x/1/0",
                                     "~t/99999999999/1/0",
                                     "~t/5/9999999999999999996/7",
                                     "~t/5/9223372036854775808/7",
                                     "~ev\xffnt/0/1/0",
                                     "~a b/0/1/0", /* no topic Kafka allows */
                                     "~t/3/1/0/",
                                     "~t/3/1/0/00c0ffee0000beeF",
                                     "~t/3/1/0/00c0ffee0000bee",
                                     "~t/3/1/0/00c0ffee0000beef0",
                                     "~t/3/1/0/00c0ffee0000beeg",
                                     "~t/3/1/0/0/00c0ffee0000beef",
                                     "~t/3/1/00c0ffee0000beef"};
  /* the two 19-digit offsets are past INT64_MAX (fuzz_ids found one) */
  for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++)
    if (kl__emit_id_parse(none[i], strlen(none[i]), &back) == 0)
      fail_msg("\"%s\" parsed as a follow-up's id", none[i]);
}

/* ---- follow-ups across a recreated topic and `keylane store reset` ---- */

typedef struct kl_log {
  rd_kafka_message_t m[2];
  void *value[2];
} kl_log_t;

/* Record @p offset of the log: a transfer of @p amount (< 128) from "a"
 * to "c" with id @p id. */
static void kl_log_transfer(kl_log_t *log, int64_t offset, const char *id,
                            int amount) {
  static const unsigned char head[] = {0x83, 0xa2, 't', 'o', 0xa1, 'c', 0xa6,
                                       'a',  'm',  'o', 'u', 'n',  't'};
  unsigned char payload[sizeof(head) + 6];
  memcpy(payload, head, sizeof(head));
  memcpy(payload + sizeof(head), "\x00\xa3seq\x01", 6);
  payload[sizeof(head)] = (unsigned char)amount;
  kl_event_t ev = {.key = "a",
                   .key_len = 1,
                   .id = id,
                   .id_len = strlen(id),
                   .type = "transfer",
                   .type_len = 8,
                   .ts = 1,
                   .payload = payload,
                   .payload_len = sizeof(payload)};
  size_t len;
  assert_int_equal(kl_event_encode(&ev, &log->value[offset], &len), KL_OK);
  log->m[offset] = (rd_kafka_message_t){.partition = 0,
                                        .payload = log->value[offset],
                                        .len = len,
                                        .key = "a",
                                        .key_len = 1,
                                        .offset = offset};
}

static int kl_take_rec(void *opaque, uint64_t seq, const void *rec,
                       size_t len) {
  kl_log_t *log = opaque;
  kl__outbox_rec_t r;
  assert_int_equal(kl__outbox_rec_decode(rec, len, &r), 0);
  assert_int_equal(r.topic_len, 0); /* the source's own topic */
  size_t n;
  assert_int_equal(kl_event_encode(&r.event, &log->value[1], &n), KL_OK);
  log->m[1] = (rd_kafka_message_t){.partition = 0,
                                   .payload = log->value[1],
                                   .len = n,
                                   .key = (void *)"c",
                                   .key_len = 1,
                                   .offset = 1};
  (void)seq;
  return 0;
}

/* Applies record @p offset of @p log as the worker does. */
static void kl_log_apply(kl_store_t *store, uint64_t epoch, kl_log_t *log,
                         int64_t offset) {
  kl__applier_t a = {.store = store,
                     .topic = "t",
                     .handler = kl_ledger_handler,
                     .decoder = kl_decoder_new()};
  kl__apply_result_t res;
  rd_kafka_message_t *m = &log->m[offset];
  assert_int_equal(kl__apply_batch(&a, 0, epoch, offset, &m, 1, &res), KL_OK);
  assert_int_equal(res.verdict, KL_HANDLER_OK);
  kl_decoder_destroy(a.decoder);
}

/* The outbox's one follow-up becomes record 1 of @p log: published. */
static void kl_log_publish(kl_store_t *store, kl_log_t *log) {
  assert_int_equal(kl__store_outbox_list(store, "t", 0, 0, 2, kl_take_rec, log),
                   KL_OK);
  kl_seen_t s;
  kl_list(store, &s);
  assert_int_equal(s.n, 1);
  kl__outbox_ack_t ack = {0, s.seqs[0]};
  assert_int_equal(kl__store_outbox_del(store, "t", &ack, 1), KL_OK);
}

static int64_t kl_balance_c(kl_store_t *store, uint64_t epoch) {
  const void *v;
  size_t n;
  kl_txn_t *txn;
  kl_ledger_entry_t e;
  unsigned char key[KL_LEDGER_STORE_KEY_MAX];
  size_t key_len = kl__ledger_key("t", "c", 1, key);
  assert_int_equal(kl_store_begin(store, "t", 0, epoch, &txn), KL_OK);
  assert_int_equal(kl_txn_get(txn, key, key_len, &v, &n), KL_OK);
  assert_int_equal(kl__ledger_decode(v, n, &e), 0);
  kl_store_abort(txn);
  return e.balance;
}

static void kl_log_free(kl_log_t *log) {
  free(log->value[0]);
  free(log->value[1]);
}

/* The probe that lost money (issue 33, finding 2): transfer a -> c 100,
 * applied with its credit; the topic is recreated (its log starts at 0
 * again) and `keylane store reset` starts the partition over; transfer
 * a -> c 50, at offset 0 again. Its credit had the first one's id,
 * "~t/0/0/0", and was suppressed as its duplicate: c = 100. With the
 * nonce its id is new, and it applies: c = 150. */
static void test_follow_up_after_reset_is_applied(void **state) {
  (void)state;
  char dir[64];
  kl_partition_state_t st;
  kl_store_t *store = kl_open_t0(dir, &st);
  kl_log_t first = {0}, second = {0};
  kl_log_transfer(&first, 0, "t1", 100);
  kl_log_apply(store, st.epoch, &first, 0);
  kl_log_publish(store, &first);
  kl_log_apply(store, st.epoch, &first, 1);
  assert_int_equal(kl_balance_c(store, st.epoch), 100);

  assert_int_equal(kl__store_reset(store, "t", 0, &st), KL_OK);
  assert_int_equal(st.watermark, 0);
  kl_log_transfer(&second, 0, "t2", 50);
  kl_log_apply(store, st.epoch, &second, 0);
  kl_log_publish(store, &second);
  kl_log_apply(store, st.epoch, &second, 1);
  assert_int_equal(kl_balance_c(store, st.epoch), 150);
  kl_log_free(&first);
  kl_log_free(&second);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* A rebuilt outbox against the log (worker/rebuild.h): a follow-up whose
 * source place the destination's log holds, under any nonce, is not kept;
 * one the log does not hold, or holds in another topic, is. */
static void test_rebuild_keeps_what_the_log_lacks(void **state) {
  (void)state;
  char dir[64];
  kl_partition_state_t st;
  kl_store_t *store = kl_open_t0(dir, &st);
  kl_txn_t *txn = kl_begin_emit(store, st.epoch, 5, 2); /* to "t" */
  kl__txn_source(txn, "t", 0, 6);
  assert_int_equal(kl_txn_emit(txn, "u", "k", 1, "credit", "p", 1), KL_OK);
  kl__txn_source(txn, NULL, 0, 0);
  assert_int_equal(kl_store_commit(txn, 7), KL_OK);
  int32_t part = 0;
  kl__rebuild_t *rb;
  assert_int_equal(kl__rebuild_new(store, "t", &part, 1, &rb), KL_OK);
  assert_string_equal(kl__rebuild_topic(rb, 0), "t");
  assert_string_equal(kl__rebuild_topic(rb, 1), "u");
  assert_null(kl__rebuild_topic(rb, 2));
  kl_event_t ev = {.key = "k",
                   .key_len = 1,
                   .type = "credit",
                   .type_len = 6,
                   .payload = "p",
                   .payload_len = 1};
  /* the first as the fleet published it, under its own nonce */
  ev.id = "~t/0/5/0/0123456789abcdef", ev.id_len = strlen(ev.id);
  kl__rebuild_see(rb, "t", &ev);
  /* the second's place, written by another producer with another payload
   * (or key): not it, so its credit stays to be published */
  ev.id = "~t/0/5/1", ev.id_len = strlen(ev.id), ev.payload = "q";
  kl__rebuild_see(rb, "t", &ev);
  ev.payload = "p", ev.key = "j";
  kl__rebuild_see(rb, "t", &ev);
  ev.key = "k";
  /* the third's place, but in "t" where it was not for: not it */
  ev.id = "~t/0/6/0/0123456789abcdef", ev.id_len = strlen(ev.id);
  kl__rebuild_see(rb, "t", &ev);
  ev.id = "client-id", ev.id_len = strlen(ev.id);
  kl__rebuild_see(rb, "u", &ev);
  uint64_t dropped, kept;
  assert_int_equal(kl__rebuild_prune(rb, &dropped, &kept), KL_OK);
  assert_int_equal(dropped, 1);
  assert_int_equal(kept, 2);
  kl__rebuild_destroy(rb);
  kl_seen_t s;
  kl_list(store, &s);
  assert_int_equal(s.n, 2);
  kl_assert_place(s.ids[0], "~t/0/5/1");
  kl_assert_place(s.ids[1], "~t/0/6/0");
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_emit_is_part_of_the_batch),
      cmocka_unit_test(test_emit_limits),
      cmocka_unit_test(test_emit_ids),
      cmocka_unit_test(test_emit_counts_the_trace_context),
      cmocka_unit_test(test_follow_up_after_reset_is_applied),
      cmocka_unit_test(test_rebuild_keeps_what_the_log_lacks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
