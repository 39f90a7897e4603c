/*
 * The built-in ledger handler through a worker on the embedded cluster:
 * amounts that are not positive and balances that would leave int64 are
 * dead letters with their reason; and `keylane ledger` reading the store
 * that worker wrote.
 */
#include <inttypes.h>
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
#include <unistd.h>

#include "common/internal.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/kafka_read.h"
#include "support/ledger_checks.h"
#include "support/run.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "cli/ledger_gen.h"
#include "store/outbox_rec.h"

typedef struct kl_fx {
  kl_t_cluster_t *cluster;
  char dir[64];
  kl_store_t *store;
  kl_producer_t *producer;
  int64_t sent;
} kl_fx_t;

static void kl_fx_up(kl_fx_t *fx, const char *topic) {
  memset(fx, 0, sizeof(*fx));
  assert_int_equal(kl_t_cluster_new(1, topic, 1, &fx->cluster), KL_OK);
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(fx->cluster)),
      KL_OK);
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &fx->producer), KL_OK);
  kl_conf_destroy(conf);
}

static void kl_fx_down(kl_fx_t *fx) {
  kl_producer_destroy(fx->producer);
  kl_store_destroy(fx->store);
  kl_t_rmrf(fx->dir);
  kl_t_cluster_destroy(fx->cluster);
}

/* Publishes a ledger event for @p key (@p key_len bytes: it may hold a
 * NUL). */
static void kl_send(kl_fx_t *fx, const char *key, size_t key_len,
                    const char *type, int64_t amount, int64_t seq) {
  assert_int_equal(kl__ledger_gen_send(fx->producer, kl_t_topic(fx->cluster),
                                       key, key_len, NULL, type, amount, seq,
                                       NULL),
                   KL_OK);
  fx->sent++;
}

/* Runs a ledger worker until every event sent is past the watermark. */
static void kl_apply_all(kl_fx_t *fx) {
  assert_int_equal(kl_flush(fx->producer, 10000), KL_OK);
  kl_t_worker_t *w =
      kl_t_worker_start(kl_t_bootstrap(fx->cluster), kl_t_topic(fx->cluster),
                        kl_t_group(fx->cluster, "ledger"), fx->store, NULL);
  kl_partition_state_t st = {0};
  for (int i = 0; i < 600 && st.watermark < fx->sent; i++) {
    kl_t_sleep_ms(50);
    kl_store_partition(fx->store, kl_t_topic(fx->cluster), 0, &st);
  }
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(st.watermark, fx->sent);
}

static int64_t kl_balance(kl_fx_t *fx, const char *key) {
  kl_ledger_entry_t e;
  assert_true(kl_t_ledger_find(fx->store, NULL, key, &e));
  return e.balance;
}

typedef struct kl_letter {
  char key[64], reason[64], error[512];
} kl_letter_t;

static void kl_letter_read(void *opaque, const rd_kafka_message_t *m, int i) {
  kl_letter_t *letter = (kl_letter_t *)opaque + i;
  rd_kafka_headers_t *h = NULL;
  rd_kafka_message_headers(m, &h);
  snprintf(letter->key, sizeof(letter->key), "%.*s", (int)m->key_len,
           (const char *)m->key);
  kl_t_header(h, "keylane.dlq.reason", letter->reason, sizeof(letter->reason));
  kl_t_header(h, "keylane.dlq.error", letter->error, sizeof(letter->error));
}

/* Reads @p want dead letters from the topic's .dlq (at most 20 s). */
static int kl_read_letters(kl_fx_t *fx, kl_letter_t *out, int want) {
  char topic[160];
  snprintf(topic, sizeof(topic), "%s.dlq", kl_t_topic(fx->cluster));
  rd_kafka_t *rk = kl_t_consumer(kl_t_bootstrap(fx->cluster),
                                 kl_t_group(fx->cluster, "letters"), topic);
  assert_non_null(rk);
  int n = kl_t_consume(rk, want, 20000, kl_letter_read, out);
  kl_t_consumer_destroy(rk);
  return n;
}

/* Two credits of INT64_MAX gave -2; a negative credit was a debit. Each
 * such event is now a dead letter saying why, and balances stay exact. */
static void test_amounts_positive_and_checked(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "amounts");
  kl_send(&fx, "big", 3, "credit", INT64_MAX, 1);
  kl_send(&fx, "big", 3, "credit", INT64_MAX, 2); /* overflow */
  kl_send(&fx, "big", 3, "debit", 5, 3);
  kl_send(&fx, "neg", 3, "credit", -5, 1); /* not positive */
  kl_send(&fx, "neg", 3, "debit", 0, 2);   /* not positive */
  kl_send(&fx, "neg", 3, "credit", 3, 3);
  kl_send(&fx, "low", 3, "debit", INT64_MAX, 1);
  kl_send(&fx, "low", 3, "debit", INT64_MAX, 2); /* overflow */
  kl_send(&fx, "low", 3, "debit", 1, 3);         /* INT64_MIN: fits */
  kl_send(&fx, "low", 3, "debit", 1, 4);         /* overflow */
  kl_apply_all(&fx);
  assert_int_equal(kl_balance(&fx, "big"), INT64_MAX - 5);
  assert_int_equal(kl_balance(&fx, "neg"), 3);
  assert_int_equal(kl_balance(&fx, "low"), INT64_MIN);
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx.store, kl_t_topic(fx.cluster), 0, &st),
                   KL_OK);
  assert_int_equal(st.dead_letters, 5);
  kl_letter_t letters[5];
  assert_int_equal(kl_read_letters(&fx, letters, 5), 5);
  static const char *const want[5][2] = {{"big", "int64"},
                                         {"neg", "-5 is not positive"},
                                         {"neg", "0 is not positive"},
                                         {"low", "int64"},
                                         {"low", "int64"}};
  int used[5] = {0}; /* letters of different keys come in any order */
  for (int w = 0; w < 5; w++) {
    int i = 0;
    while (i < 5 && (used[i] || strcmp(letters[i].key, want[w][0]) != 0 ||
                     !strstr(letters[i].error, want[w][1])))
      i++;
    if (i == 5)
      fail_msg("no dead letter of key %s says \"%s\"", want[w][0], want[w][1]);
    used[i] = 1;
    assert_string_equal(letters[i].reason, "handler_fail");
  }
  kl_fx_down(&fx);
}

/* A payload with a field the ledger reads given twice is a dead letter
 * (msgpack maps take the last one silently: which amount was meant?); and
 * a key with a newline and an ESC comes out escaped in the log line of the
 * transfer it refuses. Issue 30 items C and E. */
static void test_duplicate_fields_and_keys_in_the_log(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "dupes");
  /* {"amount": 1, "amount": 1000, "seq": 1} */
  static const char twice[] = "\x83\xa6"
                              "amount\x01\xa6"
                              "amount\xcd\x03\xe8\xa3"
                              "seq\x01";
  kl_event_t ev = {.key = "dup",
                   .key_len = 3,
                   .type = "credit",
                   .type_len = 6,
                   .payload = twice,
                   .payload_len = sizeof(twice) - 1};
  assert_int_equal(kl_publish(fx.producer, kl_t_topic(fx.cluster), &ev, NULL),
                   KL_OK);
  fx.sent++;
  kl_send(&fx, "dup", 3, "credit", 5, 1);
  static const char self[] = "self\nFORGED \x1b[2J";
  assert_int_equal(kl__ledger_gen_send_transfer(fx.producer,
                                                kl_t_topic(fx.cluster), self,
                                                self, NULL, 1, 1, NULL),
                   KL_OK);
  fx.sent++;
  kl_t_stderr_t log;
  kl_t_stderr_begin(&log);
  kl_apply_all(&fx);
  char *text = kl_t_stderr_end(&log);
  assert_int_equal(kl_balance(&fx, "dup"), 5);
  kl_letter_t letters[2];
  assert_int_equal(kl_read_letters(&fx, letters, 2), 2);
  int i = strcmp(letters[0].key, "dup") == 0 ? 0 : 1;
  assert_string_equal(letters[i].key, "dup");
  assert_non_null(strstr(letters[i].error, "\"amount\" twice"));
  assert_non_null(strstr(letters[1 - i].error, "to itself"));
  assert_non_null(strstr(text, "transfer from self\\x0aFORGED \\x1b[2J to"));
  assert_null(memchr(text, 0x1b, strlen(text)));
  assert_null(strstr(text, "\nFORGED"));
  free(text);
  kl_fx_down(&fx);
}

/* `keylane ledger` prints keys as escaped text: no control byte reaches the
 * terminal, and keys that differ after a NUL stay apart, in --json too. */
static void test_ledger_cli_escapes_keys(void **state) {
  (void)state;
  kl_fx_t fx;
  kl_fx_up(&fx, "escapes");
  static const struct {
    const char *key;
    size_t len;
    const char *shown;
  } keys[] = {
      {"esc\x1b[2J", 7, "esc\\x1b[2J"},
      {"nul\0a", 5, "nul\\x00a"},
      {"nul\0b", 5, "nul\\x00b"},
      {"nul\\x00a", 8, "nul\\\\x00a"}, /* a backslash: still one-to-one */
      {"line\nbreak", 10, "line\\x0abreak"},
      {"caf\xc3\xa9", 5, "caf\xc3\xa9"},
      {"bad\xff", 4, "bad\\xff"},
  };
  size_t n = sizeof(keys) / sizeof(keys[0]);
  for (size_t i = 0; i < n; i++)
    kl_send(&fx, keys[i].key, keys[i].len, "credit", (int64_t)i + 1, 1);
  kl_apply_all(&fx);
  kl_t_run_t r;
  kl_t_run((const char *[]){"ledger", "--store", fx.dir, NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  for (const char *p = r.out; *p; p++)
    if ((unsigned char)*p < 0x20 && *p != '\t' && *p != '\n')
      fail_msg("a raw control byte 0x%02x in:\n%s", *p, r.out);
  for (size_t i = 0; i < n; i++) {
    char line[64];
    snprintf(line, sizeof(line), "%s\t%zu\t1\n", keys[i].shown, i + 1);
    if (!strstr(r.out, line))
      fail_msg("no line \"%s\" in:\n%s", line, r.out);
  }
  assert_non_null(strstr(r.out, "total\tkeys=7\tbalance=28\t"));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"ledger", "--store", fx.dir, "--json", NULL}, NULL,
           0, &r);
  assert_int_equal(r.rc, 0);
  json_error_t jerr;
  json_t *doc = json_loads(r.out, 0, &jerr);
  assert_non_null(doc);
  json_t *balances = json_object_get(doc, "balances");
  assert_int_equal(json_object_size(balances), n);
  for (size_t i = 0; i < n; i++) {
    json_t *b = json_object_get(balances, keys[i].shown);
    if (!b)
      fail_msg("no key \"%s\" in %s", keys[i].shown, r.out);
    assert_int_equal(json_integer_value(json_object_get(b, "balance")),
                     (json_int_t)i + 1);
  }
  json_decref(doc);
  kl_t_run_free(&r);
  kl_fx_down(&fx);
}

/* Read-only commands never create a store: a typo is an error. */
static void test_read_only_commands_create_nothing(void **state) {
  (void)state;
  char dir[64], typo[96], marker[128];
  kl_t_tmpdir(dir);
  snprintf(typo, sizeof(typo), "%s/typo", dir);
  const char *const runs[][5] = {{"ledger", "--store", typo, NULL},
                                 {"store", "stats", "--store", typo, NULL},
                                 {"store", "keys", "--store", typo, NULL},
                                 {"ledger", "--store", dir, NULL}};
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    kl_t_run_t r;
    kl_t_run(runs[i], NULL, 0, &r);
    if (r.rc != 1 || !strstr(r.err, "does not exist"))
      fail_msg("keylane %s %s: exit %d, stderr: %s", runs[i][0], runs[i][1],
               r.rc, r.err);
    kl_t_run_free(&r);
  }
  assert_int_not_equal(access(typo, F_OK), 0);
  snprintf(marker, sizeof(marker), "%s/data.mdb", dir);
  assert_int_not_equal(access(marker, F_OK), 0); /* an empty directory too */
  kl_t_rmrf(dir);
}

/* Whether the record whose event has id @p id is a follow-up, by
 * kl__ledger_gen_decode_follow_up(). */
static int kl_is_follow_up(kl_decoder_t *decoder, const char *id,
                           size_t id_len) {
  kl_event_t in = {.key = "k",
                   .key_len = 1,
                   .id = id,
                   .id_len = id_len,
                   .type = "credit",
                   .type_len = 6,
                   .payload = "{}",
                   .payload_len = 2};
  void *value;
  size_t len;
  assert_int_equal(kl_event_encode(&in, &value, &len), KL_OK);
  rd_kafka_message_t m = {
      .key = "k", .key_len = 1, .payload = value, .len = len};
  kl_event_t ev;
  int yes = kl__ledger_gen_decode_follow_up(decoder, &m, &ev);
  free(value);
  return yes;
}

/* A follow-up is a record whose id kl__emit_id() made; an id a client
 * could publish, or a record that does not decode, is none. */
static void test_follow_up_ids(void **state) {
  (void)state;
  kl_decoder_t *decoder = kl_decoder_new();
  assert_non_null(decoder);
  char id[KL_ID_MAX + 1];
  kl__emit_src_t src = {"events", 6, 2, 17, 0, 42, 1};
  size_t len = kl__emit_id(&src, id);
  assert_true(kl_is_follow_up(decoder, id, len));
  /* and one a store written before the nonce holds */
  assert_true(kl_is_follow_up(decoder, "~events/2/17/0", 14));
  static const char *const none[] = {"a/0/1", "src/12", "invoice/42/0",
                                     "~events/2/17"};
  for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++)
    if (kl_is_follow_up(decoder, none[i], strlen(none[i])))
      fail_msg("id \"%s\" taken for a follow-up's", none[i]);
  kl_event_t ev;
  rd_kafka_message_t junk = {
      .key = "k", .key_len = 1, .payload = "a/1", .len = 3};
  assert_int_equal(kl__ledger_gen_decode_follow_up(decoder, &junk, &ev), 0);
  kl_decoder_destroy(decoder);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_follow_up_ids),
      cmocka_unit_test(test_amounts_positive_and_checked),
      cmocka_unit_test(test_duplicate_fields_and_keys_in_the_log),
      cmocka_unit_test(test_ledger_cli_escapes_keys),
      cmocka_unit_test(test_read_only_commands_create_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
