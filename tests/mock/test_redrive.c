/*
 * Dead letters after the fact, on the embedded cluster: a worker
 * dead-letters the events its handler refuses; a rebuild records them as
 * the fleet did; a redrive with a fixed handler applies each of them once
 * (again: duplicates), a dry run changes nothing, a letter the owner has
 * not passed yet stays pending, on LMDB and on PostgreSQL (skipped, saying
 * why, when PostgreSQL is not installed); and keylane replay --from-dlq's
 * JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "common/internal.h"
#include "support/pg_group.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "cli/ledger_gen.h"
#include "worker/redrive.h"
#include "store/outbox_rec.h"
#include "store/store_internal.h"
#include "keylane/handlers.h"

#define KL_KEYS 10
#define KL_REFUNDS 5 /* acct-0..4 get a refund, which the ledger refuses */

typedef struct kl_fx {
  char dir[64], dir2[64];
  char uri[256]; /* the PostgreSQL store's, when the fixture uses one */
  kl_embedded_t *cluster;
  const char *boot;
  kl_store_t *store;
  kl_conf_t *conf;
} kl_fx_t;

static void kl_send(kl_producer_t *producer, const char *key, const char *type,
                    int64_t amount, int64_t seq) {
  assert_int_equal(kl__ledger_gen_send(producer, "rd", key, strlen(key), NULL,
                                       type, amount, seq, NULL),
                   KL_OK);
}

/* Whether the store applied both partitions to their high watermarks. */
static int kl_caught_up(const char *boot, kl_store_t *store) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", boot, errstr, sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
  int ok = rk != NULL;
  for (int32_t p = 0; ok && p < 2; p++) {
    int64_t low, high;
    kl_partition_state_t st;
    ok =
        rd_kafka_query_watermark_offsets(rk, "rd", p, &low, &high, 5000) == 0 &&
        kl_store_partition(store, "rd", p, &st) == KL_OK &&
        st.watermark >= high;
  }
  if (rk)
    rd_kafka_destroy(rk);
  return ok;
}

static uint64_t kl_sum(kl_store_t *store, int dead) {
  uint64_t n = 0;
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(store, "rd", p, &st), KL_OK);
    n += dead ? st.dead_letters : st.applied;
  }
  return n;
}

/* Credits, refunds the ledger refuses, more credits, and a record that is
 * no envelope; a worker runs until it dead-lettered them all. */
static void kl_fx_up_on(kl_fx_t *fx, int pg) {
  memset(fx, 0, sizeof(*fx));
  kl_t_pg_t *server = pg ? kl_t_pg_need() : NULL;
  assert_int_equal(kl_embedded_new(1, "rd", 2, &fx->cluster), KL_OK);
  assert_int_equal(kl_embedded_topic_create(fx->cluster, "rd.dlq", 2), KL_OK);
  fx->boot = kl_embedded_bootstrap(fx->cluster);
  kl_t_tmpdir(fx->dir);
  kl_t_tmpdir(fx->dir2);
  if (pg)
    assert_int_equal(
        kl_t_pg_createdb(server, "redrive", fx->uri, sizeof(fx->uri)), 0);
  assert_int_equal(kl_store_open(pg ? fx->uri : fx->dir, NULL, &fx->store),
                   KL_OK);
  fx->conf = kl_conf_new();
  assert_int_equal(kl_conf_set(fx->conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  kl_producer_t *producer = NULL;
  assert_int_equal(kl_producer_new(fx->conf, NULL, NULL, &producer), KL_OK);
  char key[16];
  for (int k = 0; k < KL_KEYS; k++) {
    snprintf(key, sizeof(key), "acct-%d", k);
    kl_send(producer, key, "credit", 10, 1);
    if (k < KL_REFUNDS)
      kl_send(producer, key, "refund", 5, 2);
    kl_send(producer, key, "credit", 1, k < KL_REFUNDS ? 3 : 2);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);
  /* not a map */
  assert_int_equal(
      kl_t_produce_raw(fx->boot, "rd", 0, "acct-0", "\x92\x01", 2, NULL), 0);

  static const char *const extra[] = {"worker.session.timeout.ms=3000", NULL};
  kl_t_worker_t *w = kl_t_worker_start(fx->boot, "rd", "g", fx->store, extra);
  for (int i = 0; i < 300 && !kl_caught_up(fx->boot, fx->store); i++)
    kl_t_sleep_ms(100);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_sum(fx->store, 0), 2 * KL_KEYS);
  /* The store counts marked ids: the record that is no envelope has none. */
  assert_int_equal(kl_sum(fx->store, 1), KL_REFUNDS);
}

static void kl_fx_up(kl_fx_t *fx) {
  kl_fx_up_on(fx, 0);
}

static void kl_fx_down(kl_fx_t *fx) {
  kl_store_destroy(fx->store);
  kl_conf_destroy(fx->conf);
  kl_embedded_destroy(fx->cluster);
  kl_t_rmrf(fx->dir);
  kl_t_rmrf(fx->dir2);
}

/* The fixed handler: a refund is a debit. It counts its calls, as an effect
 * outside the store would show. */
static int kl_fixed_calls;

static kl_handler_result_t kl_fixed(void *opaque, const kl_event_t *event,
                                    const kl_fence_t *fence, kl_txn_t *txn,
                                    char *errbuf, size_t errbuf_size) {
  kl_event_t ev = *event;
  kl_fixed_calls++;
  if (ev.type_len == 6 && memcmp(ev.type, "refund", 6) == 0) {
    ev.type = "debit";
    ev.type_len = 5;
  }
  return kl_ledger_handler(opaque, &ev, fence, txn, errbuf, errbuf_size);
}

static kl_ledger_entry_t kl_entry(kl_store_t *store, int k) {
  char name[16];
  int nlen = snprintf(name, sizeof(name), "acct-%d", k);
  unsigned char key[KL_LEDGER_STORE_KEY_MAX];
  size_t len = kl__ledger_key("rd", name, (size_t)nlen, key);
  kl_partition_state_t st;
  int32_t p = kl_partition(name, (size_t)nlen, 2);
  assert_int_equal(kl_store_partition(store, "rd", p, &st), KL_OK);
  kl_txn_t *txn;
  assert_int_equal(kl_store_begin(store, "rd", p, st.epoch, &txn), KL_OK);
  const void *val;
  size_t vlen;
  kl_ledger_entry_t e = {0};
  assert_int_equal(kl_txn_get(txn, key, len, &val, &vlen), KL_OK);
  assert_int_equal(kl__ledger_decode(val, vlen, &e), 0);
  kl_store_abort(txn);
  return e;
}

static kl__redrive_t *kl_redrive(kl_fx_t *fx, const char *reason, int dry) {
  kl__redrive_opts_t o = {.conf = fx->conf,
                          .dlq_topic = "rd.dlq",
                          .reason = reason,
                          .store = fx->store,
                          .handler = kl_fixed,
                          .dry_run = dry,
                          .from = {KL__POS_BEGINNING, 0},
                          .to = {KL__POS_END, 0}};
  kl__redrive_t *r = NULL;
  assert_int_equal(kl__redrive_run(&o, &r), KL_OK);
  return r;
}

static int kl_count_marks(void *opaque, const char *topic, const void *key,
                          size_t key_len, const char *id, size_t id_len,
                          int64_t time_ms, kl_mark_t mark) {
  (void)topic, (void)key, (void)key_len;
  ((uint64_t *)opaque)[mark]++;
  return 0;
}

/* The fleet dead-lettered 6 records; a rebuild records the same 6 as dead
 * letters (it does not stop at them), and its store equals the fleet's. */
static void test_rebuild_records_the_fleets_dead_letters(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx);
  kl_store_t *copy;
  assert_int_equal(kl_store_open(fx.dir2, NULL, &copy), KL_OK);
  kl__replay_part_t t;
  kl_t_rebuild_into(fx.conf, "rd", copy, kl_ledger_handler, NULL, &t);
  assert_int_equal(t.status, KL__REPLAY_DONE);
  assert_int_equal(t.applied, 2 * KL_KEYS);
  assert_int_equal(t.skipped_dead_letter, KL_REFUNDS + 1);
  assert_int_equal(t.failed, 0);
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t a, b;
    assert_int_equal(kl_store_partition(fx.store, "rd", p, &a), KL_OK);
    assert_int_equal(kl_store_partition(copy, "rd", p, &b), KL_OK);
    assert_int_equal(a.watermark, b.watermark);
    assert_int_equal(a.applied, b.applied);
    assert_int_equal(a.dead_letters, b.dead_letters);
  }
  uint64_t ma[3] = {0}, mb[3] = {0};
  assert_int_equal(kl__store_ids_walk(fx.store, kl_count_marks, ma), KL_OK);
  assert_int_equal(kl__store_ids_walk(copy, kl_count_marks, mb), KL_OK);
  assert_memory_equal(ma, mb, sizeof(ma));
  assert_int_equal(ma[KL_MARK_DEAD_LETTER], KL_REFUNDS); /* garbage: no id */
  for (int k = 0; k < KL_KEYS; k++) {
    kl_ledger_entry_t ea = kl_entry(fx.store, k), eb = kl_entry(copy, k);
    assert_memory_equal(&ea, &eb, sizeof(ea));
  }
  kl_store_destroy(copy);
  kl_fx_down(&fx);
}

typedef struct kl_aside {
  size_t n;
  int32_t partition;
  void *rec; /* the last follow-up listed, copied */
  size_t len;
} kl_aside_t;

static int kl_aside_cb(void *opaque, uint64_t seq, const void *rec,
                       size_t len) {
  kl_aside_t *a = opaque;
  (void)seq;
  a->n++;
  free(a->rec);
  a->rec = malloc(len);
  memcpy(a->rec, rec, len);
  a->len = len;
  return 0;
}

/* The follow-ups @p store's outbox holds for rd; the last one's record
 * stays in @p a. */
static size_t kl_outbox_of(kl_store_t *store, kl_aside_t *a) {
  a->n = 0;
  for (int32_t p = 0; p < 2; p++) {
    size_t before = a->n;
    assert_int_equal(
        kl__store_outbox_list(store, "rd", p, 0, 100, kl_aside_cb, a), KL_OK);
    if (a->n > before)
      a->partition = p;
  }
  return a->n;
}

/* A store rebuilt from the log derives every follow-up again, under new
 * ids. One the fleet set aside (Kafka refused it: its dead letter of
 * reason outbox holds it, and a redrive publishes it) was kept: a worker
 * on the rebuilt store published it under a second id beside the
 * letter's, and the credit was applied twice. The rebuild finds it in the
 * dead-letter topic and keeps it no more. */
static void test_rebuild_keeps_no_follow_up_set_aside(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx);
  kl_producer_t *producer = NULL;
  assert_int_equal(kl_producer_new(fx.conf, NULL, NULL, &producer), KL_OK);
  assert_int_equal(kl__ledger_gen_send_transfer(producer, "rd", "acct-7",
                                                "acct-8", NULL, 3, 3, NULL),
                   KL_OK); /* after acct-7's two credits; no worker runs */
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
  kl_producer_destroy(producer);

  /* What a rebuild derives: the transfer's credit, which no log holds. */
  kl_store_t *first;
  assert_int_equal(kl_store_open(fx.dir2, NULL, &first), KL_OK);
  kl_t_rebuild_into(fx.conf, "rd", first, kl_ledger_handler, NULL, NULL);
  kl_aside_t a = {0};
  assert_int_equal(kl_outbox_of(first, &a), 1);
  kl_store_destroy(first);
  kl__outbox_rec_t rec;
  assert_int_equal(kl__outbox_rec_decode(a.rec, a.len, &rec), KL_OK);
  kl__emit_src_t src;
  assert_int_equal(kl__emit_id_parse(rec.event.id, rec.event.id_len, &src),
                   KL_OK);

  /* The fleet had set it aside, with the id it had then. */
  char id[KL_ID_MAX + 1], part[16], off[24];
  snprintf(id, sizeof(id), "~rd/%d/%lld/0/0123456789abcdef", (int)src.partition,
           (long long)src.offset);
  snprintf(part, sizeof(part), "%d", (int)src.partition);
  snprintf(off, sizeof(off), "%lld", (long long)src.offset);
  kl_event_t ev = rec.event;
  ev.id = id;
  ev.id_len = strlen(id);
  void *env;
  size_t env_len;
  assert_int_equal(kl_event_encode(&ev, &env, &env_len), KL_OK);
  const char *const hdrs[] = {"keylane.dlq.reason",
                              "outbox",
                              "keylane.dlq.error",
                              "Broker: Message size too large",
                              "keylane.dlq.topic",
                              "rd",
                              "keylane.dlq.partition",
                              part,
                              "keylane.dlq.offset",
                              off,
                              "keylane.dlq.destination",
                              "rd",
                              NULL};
  char key[64];
  snprintf(key, sizeof(key), "%.*s", (int)ev.key_len, (const char *)ev.key);
  assert_int_equal(
      kl_t_produce_raw(fx.boot, "rd.dlq", 0, key, env, env_len, hdrs), 0);
  free(env);
  free(a.rec);
  a.rec = NULL;

  char dir3[64];
  kl_t_tmpdir(dir3);
  kl_store_t *second;
  assert_int_equal(kl_store_open(dir3, NULL, &second), KL_OK);
  kl_t_rebuild_into(fx.conf, "rd", second, kl_ledger_handler, NULL, NULL);
  assert_int_equal(kl_outbox_of(second, &a), 0);
  free(a.rec);
  kl_store_destroy(second);
  kl_t_rmrf(dir3);
  kl_fx_down(&fx);
}

/* The store's clock, eight days on: past the default dedup retention. */
static int64_t kl_in_8_days(void) {
  return kl__now_ms() + 8 * 86400000LL;
}

/* Writes a handler_fail letter of a credit of 1 (seq 9) with @p id, for
 * @p key, from offset @p origin of partition 0 of rd, to rd.dlq. */
static void kl_send_letter(kl_fx_t *fx, const char *origin, const char *key,
                           const char *id) {
  const char *const hdrs[] = {"keylane.dlq.reason",
                              "handler_fail",
                              "keylane.dlq.topic",
                              "rd",
                              "keylane.dlq.partition",
                              "0",
                              "keylane.dlq.offset",
                              origin,
                              NULL};
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = "credit",
                   .type_len = 6,
                   .ts = 1,
                   .payload = "\x82\xa6"
                              "amount\x01\xa3seq\x09",
                   .payload_len = 14};
  void *env;
  size_t env_len;
  assert_int_equal(kl_event_encode(&ev, &env, &env_len), KL_OK);
  assert_int_equal(
      kl_t_produce_raw(fx->boot, "rd.dlq", 0, key, env, env_len, hdrs), 0);
  free(env);
}

static void kl_redrive_applies_each_letter_once(int pg) {
  kl_fx_t fx;
  kl_fx_up_on(&fx, pg);
  /* A letter whose origin the owner has not passed yet. */
  kl_send_letter(&fx, "999", "acct-0", "ahead-1");

  /* Dry run: what would apply; nothing changes, and the handler (which
   * may act outside the store) is never called. */
  kl_fixed_calls = 0;
  kl__redrive_t *r = kl_redrive(&fx, NULL, 1);
  assert_int_equal(kl_fixed_calls, 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), KL_REFUNDS);
  assert_int_equal(kl__redrive_count(r, KL__OUT_FAILED), 1); /* decode */
  assert_int_equal(kl__redrive_count(r, KL__OUT_PENDING), 1);
  kl__redrive_destroy(r);
  kl_ledger_entry_t e = kl_entry(fx.store, 0);
  assert_int_equal(e.balance, 11);
  uint64_t marks[3] = {0};
  assert_int_equal(kl__store_ids_walk(fx.store, kl_count_marks, marks), KL_OK);
  assert_int_equal(marks[KL_MARK_DEAD_LETTER], KL_REFUNDS);

  /* The redrive, for the handler's failures only. */
  r = kl_redrive(&fx, "handler_fail", 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), KL_REFUNDS);
  assert_int_equal(kl__redrive_count(r, KL__OUT_PENDING), 1);
  assert_int_equal(kl__redrive_count(r, KL__OUT_FILTERED), 1); /* decode */
  size_t n;
  const kl__redriven_t *res = kl__redrive_results(r, &n);
  for (size_t i = 0; i < n; i++)
    if (res[i].outcome == KL__OUT_APPLIED)
      assert_true(res[i].epoch >= 2); /* taken from the worker */
  kl__redrive_destroy(r);
  for (int k = 0; k < KL_KEYS; k++) {
    e = kl_entry(fx.store, k);
    /* The fleet saw seq 3 after 1 (the refund was dead-lettered); the
     * redrive applies seq 2 after 3: two order violations. */
    assert_int_equal(e.balance, k < KL_REFUNDS ? 6 : 11);
    assert_int_equal(e.violations, k < KL_REFUNDS ? 2 : 0);
  }
  memset(marks, 0, sizeof(marks));
  assert_int_equal(kl__store_ids_walk(fx.store, kl_count_marks, marks), KL_OK);
  assert_int_equal(marks[KL_MARK_DEAD_LETTER], 0);
  assert_int_equal(marks[KL_MARK_APPLIED], 2 * KL_KEYS + KL_REFUNDS);

  /* Again: each letter applied once already. */
  r = kl_redrive(&fx, "handler_fail", 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_DUPLICATE), KL_REFUNDS);
  kl__redrive_destroy(r);
  assert_int_equal(kl_entry(fx.store, 0).balance, 6);

  /* Past the ids' retention (7d): the sweep takes every id, yet the
   * letters, which the dead-letter topic still holds, stay applied once. */
  kl__store_set_clock(kl_in_8_days);
  uint64_t ids = 1;
  for (int i = 0; i < 10 && ids; i++) {
    assert_int_equal(kl_store_sweep(fx.store, 1000, NULL), KL_OK);
    assert_int_equal(kl_store_id_count(fx.store, &ids), KL_OK);
  }
  assert_int_equal(ids, 0);
  r = kl_redrive(&fx, "handler_fail", 0);
  kl__store_set_clock(NULL);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_DUPLICATE), KL_REFUNDS);
  kl__redrive_destroy(r);
  for (int k = 0; k < KL_REFUNDS; k++)
    assert_int_equal(kl_entry(fx.store, k).balance, 6);
  kl_fx_down(&fx);
}

static void test_redrive_applies_each_letter_once(void **state) {
  kl_redrive_applies_each_letter_once(0);
}

/* PostgreSQL keeps an id's mark unless a dead letter becomes applied. */
static void test_redrive_applies_each_letter_once_on_pg(void **state) {
  kl_redrive_applies_each_letter_once(1);
}

static int kl_count_keys(void *opaque, const void *key, size_t key_len,
                         const void *val, size_t val_len) {
  ++*(size_t *)opaque;
  return 0;
}

/* The letters' own records in the store. */
static size_t kl_letter_records(kl_store_t *store) {
  size_t n = 0;
  const char *prefix = KL__LETTER_KEY_PREFIX "rd.dlq/";
  assert_int_equal(
      kl_store_scan(store, prefix, strlen(prefix), kl_count_keys, &n), KL_OK);
  return n;
}

/* A letter's record is kept while the dead-letter topic holds the letter,
 * and goes with the next redrive once retention dropped it (the embedded
 * cluster keeps 5 MiB per partition). */
static void test_redrive_forgets_letters_the_topic_dropped(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx);
  kl__redrive_t *r = kl_redrive(&fx, "handler_fail", 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), KL_REFUNDS);
  kl__redrive_destroy(r);
  assert_int_equal(kl_letter_records(fx.store), KL_REFUNDS);

  /* 6 MiB more in each dead-letter partition: the letters are gone. */
  size_t big = 256 * 1024;
  char *filler = calloc(1, big);
  for (int32_t p = 0; p < 2; p++)
    for (int i = 0; i < 24; i++)
      assert_int_equal(
          kl_t_produce_raw(fx.boot, "rd.dlq", p, "filler", filler, big, NULL),
          0);
  free(filler);
  /* One new letter, of a record the owner passed (origin offset 0). */
  kl_send_letter(&fx, "0", "acct-9", "late-1");
  r = kl_redrive(&fx, "handler_fail", 0);
  assert_int_equal(kl__redrive_count(r, KL__OUT_APPLIED), 1);
  kl__redrive_destroy(r);
  assert_int_equal(kl_letter_records(fx.store), 1); /* the late letter's */
  kl_fx_down(&fx);
}

/* Runs keylane replay --from-dlq rd.dlq --json through the binary with
 * @p extra (options, redirections), its output into @p out.
 * @returns its exit code. */
static int kl_replay_cli(kl_fx_t *fx, const char *extra, char *out,
                         size_t size) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "'%s' replay -b %s --from-dlq rd.dlq --store %s --handler ledger "
           "--json %s",
           kl_t_bin(), fx->boot, fx->dir, extra);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t len = fread(out, 1, size - 1, f);
  out[len] = '\0';
  return WEXITSTATUS(pclose(f));
}

/* keylane replay --from-dlq through the binary: one JSON object with each
 * letter's outcome; the shipped ledger refuses refunds again. */
static void test_redrive_cli_json(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx);
  kl_store_destroy(fx.store); /* the binary opens it */
  fx.store = NULL;
  char out[16384];
  /* not everything applied */
  assert_int_equal(kl_replay_cli(&fx, "2>/dev/null", out, sizeof(out)), 1);
  json_error_t je;
  json_t *o = json_loads(out, 0, &je);
  if (!o)
    fail_msg("not JSON: %s", out);
  assert_string_equal(json_string_value(json_object_get(o, "topic")), "rd");
  assert_int_equal(json_integer_value(json_object_get(o, "letters")),
                   KL_REFUNDS + 1);
  assert_int_equal(json_integer_value(json_object_get(o, "failed")),
                   KL_REFUNDS + 1);
  assert_int_equal(json_integer_value(json_object_get(o, "applied")), 0);
  json_t *results = json_object_get(o, "results");
  assert_int_equal(json_array_size(results), KL_REFUNDS + 1);
  size_t i;
  json_t *x;
  json_array_foreach(results, i, x) {
    static const char *const ints[] = {
        "dlq_partition", "dlq_offset", "partition", "offset", "epoch", NULL};
    for (size_t j = 0; ints[j]; j++)
      assert_true(json_is_integer(json_object_get(x, ints[j])));
    assert_string_equal(json_string_value(json_object_get(x, "outcome")),
                        "failed");
    assert_true(json_is_string(json_object_get(x, "error")));
  }
  json_decref(o);
  assert_int_equal(kl_store_open(fx.dir, NULL, &fx.store), KL_OK);
  assert_int_equal(kl_entry(fx.store, 0).balance, 11); /* nothing applied */
  kl_fx_down(&fx);
}

/* A letter an older keylane cut short (keylane.dlq.truncated) holds the
 * first 1 KiB of a record, not the event: the probe's redrive republished
 * such a follow-up's stump, said "its owner applies it once" and exited 0,
 * and the credit was gone. keylane replay --from-dlq refuses it, says why,
 * and exits 1; nothing is republished. */
static void test_redrive_refuses_a_truncated_letter(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx);
  kl_store_destroy(fx.store); /* the binary opens it */
  fx.store = NULL;
  char stump[1024];
  memset(stump, 0x82, sizeof(stump)); /* the start of an envelope, cut */
  const char *const hdrs[] = {"keylane.dlq.reason",
                              "outbox",
                              "keylane.dlq.error",
                              "Broker: Message size too large",
                              "keylane.dlq.truncated",
                              "Broker: Message size too large",
                              "keylane.dlq.original_size",
                              "1040000",
                              "keylane.dlq.topic",
                              "rd",
                              "keylane.dlq.partition",
                              "0",
                              "keylane.dlq.offset",
                              "3",
                              "keylane.dlq.destination",
                              "rd",
                              NULL};
  assert_int_equal(kl_t_produce_raw(fx.boot, "rd.dlq", 0, "acct-1", stump,
                                    sizeof(stump), hdrs),
                   0);
  char out[16384];
  assert_int_equal(kl_replay_cli(&fx, "--reason outbox 2>&1", out, sizeof(out)),
                   1);
  if (!strstr(out, "\"republished\":0") || !strstr(out, "\"errors\":1") ||
      !strstr(out, "cut short by an older keylane") ||
      !strstr(out, "1024 bytes of a 1040000-byte record"))
    fail_msg("the truncated letter was not refused: %s", out);
  kl_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rebuild_records_the_fleets_dead_letters),
      cmocka_unit_test(test_rebuild_keeps_no_follow_up_set_aside),
      cmocka_unit_test(test_redrive_applies_each_letter_once),
      cmocka_unit_test(test_redrive_applies_each_letter_once_on_pg),
      cmocka_unit_test(test_redrive_cli_json),
      cmocka_unit_test(test_redrive_refuses_a_truncated_letter),
      cmocka_unit_test(test_redrive_forgets_letters_the_topic_dropped),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
