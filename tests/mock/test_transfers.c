/*
 * The bank test on the embedded cluster: the ledger's transfers debit one
 * account and emit the other's credit through the outbox (kl_txn_emit()),
 * so money moves between two partitions' owners without a lock. Every
 * balance verifies and the total is conserved, at concurrency 1 and in
 * key-parallel lanes; a worker killed right after a commit that wrote
 * follow-ups, before it published them, loses none and applies none
 * twice; a follow-up published twice is applied once; bad transfers are
 * dead letters with their reason.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <cmocka.h>

#include "common/kafka_pos.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/cluster.h"
#include "support/ledger_checks.h"
#include "support/support.h"
#include "cli/ledger_gen.h"
#include "store/store_internal.h"

#define PARTS 4
#define KEYS 20

/* Publishes @p n events: every third a transfer, the others credits and
 * debits, with a re-published one every tenth. */
static void kl_publish_bank(kl__ledger_gen_t *gen, kl_producer_t *producer,
                            const char *topic, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(i % 3 == 2 ? kl__ledger_gen_transfer(gen, producer, topic)
                                : kl__ledger_gen_publish(gen, producer, topic),
                     KL_OK);
    if (i % 10 == 9)
      assert_int_equal(kl__ledger_gen_republish(gen, producer, topic), KL_OK);
  }
  assert_int_equal(kl_flush(producer, 30000), KL_OK);
}

static void kl_assert_conserved(kl__ledger_gen_t *gen, kl_store_t *store,
                                const char *topic) {
  assert_int_equal(kl__ledger_gen_wait(gen, store, topic, 0, 60000), 0);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(gen, store, topic, &v), KL_OK);
  assert_true(v.transfers > 0);
  assert_int_equal(v.total, v.total_expected);
  assert_true(v.total_ok);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.violations, 0);
  /* Each transfer's credit applied exactly once: no more, no less. */
  assert_int_equal(v.applied, kl__ledger_gen_published(gen) + v.transfers);
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(gen));
  assert_true(v.ok);
}

static void kl_bank(const char *concurrency, const char *store_uri) {
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "bank", PARTS, KEYS, 11, store_uri);
  const char *extra[] = {concurrency, NULL};
  kl_t_worker_t *w[2];
  for (int i = 0; i < 2; i++)
    w[i] = kl_t_worker_start(fx.boot, fx.topic, kl_t_group(fx.cluster, "bank"),
                             fx.store, extra);
  kl_publish_bank(fx.gen, fx.producer, fx.topic, 300);
  kl_assert_conserved(fx.gen, fx.store, fx.topic);
  for (int i = 0; i < 2; i++)
    assert_int_equal(kl_t_worker_stop(w[i]), KL_OK);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, PARTS), 0);
  kl_t_ledger_fx_down(&fx);
}

static void test_bank_inline(void **state) {
  (void)state;
  kl_bank("worker.concurrency=1", NULL);
}

static void test_bank_lanes(void **state) {
  (void)state;
  kl_bank("worker.concurrency=4", NULL);
}

/* ---- a crash between the commit and the publish ---------------------- */

static pid_t kl_spawn_crashing(const char *boot, const char *topic,
                               const char *group, const char *dir) {
  char log[128];
  snprintf(log, sizeof(log), "%s/worker.log", dir);
  pid_t pid = fork();
  if (pid)
    return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  setenv("KEYLANE_TEST_EXIT_AFTER_COMMIT", "75", 1);
  execl(kl_t_bin(), "keylane", "worker", "-b", boot, "-t", topic, "-g", group,
        "--store", dir, "--handler", "ledger", (char *)NULL);
  _exit(127);
}

static void test_crash_between_commit_and_publish(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "crash", PARTS, KEYS, 13, NULL);
  kl_publish_bank(fx.gen, fx.producer, fx.topic, 120);
  const char *group = kl_t_group(fx.cluster, "crash");
  pid_t pid = kl_spawn_crashing(fx.boot, fx.topic, group, fx.dir);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 75);
  /* It died with committed follow-ups that nobody published. */
  assert_true(kl_t_outbox_held(fx.store, fx.topic, PARTS) > 0);
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, group, fx.store, NULL);
  kl_assert_conserved(fx.gen, fx.store, fx.topic);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, PARTS), 0);
  kl_t_ledger_fx_down(&fx);
}

/* ---- an outbox's copy ------------------------------------------------ */

typedef struct kl_copy {
  kl_decoder_t *decoder;
  char key[KL_KEY_MAX], id[KL_ID_MAX + 1], payload[256];
  kl_event_t ev;
} kl_copy_t;

/* Keeps the first follow-up it is given. */
static int kl_take_follow_up(void *opaque, rd_kafka_message_t *m) {
  kl_copy_t *c = opaque;
  kl_event_t ev;
  if (!kl__ledger_gen_decode_follow_up(c->decoder, m, &ev))
    return 0;
  assert_true(ev.payload_len <= sizeof(c->payload));
  memcpy(c->key, ev.key, ev.key_len);
  memcpy(c->id, ev.id, ev.id_len);
  memcpy(c->payload, ev.payload, ev.payload_len);
  c->ev = (kl_event_t){.key = c->key,
                       .key_len = ev.key_len,
                       .id = c->id,
                       .id_len = ev.id_len,
                       .type = "credit",
                       .type_len = 6,
                       .payload = c->payload,
                       .payload_len = ev.payload_len};
  return KL__READ_STOP;
}

/* A follow-up read back from @p topic, as an outbox would publish it. */
static void kl_read_follow_up(const char *boot, const char *topic,
                              kl_copy_t *c) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", boot), KL_OK);
  rd_kafka_t *rk;
  assert_int_equal(kl__kafka_reader_new(conf, "copy", "earliest", &rk), KL_OK);
  kl__tp_range_t ranges[PARTS];
  const kl__pos_t from = {KL__POS_BEGINNING, 0}, to = {KL__POS_END, 0};
  for (int p = 0; p < PARTS; p++)
    ranges[p].partition = p;
  assert_int_equal(
      kl__kafka_resolve(rk, topic, ranges, PARTS, &from, &to, 10000), KL_OK);
  c->decoder = kl_decoder_new();
  assert_int_equal(
      kl__kafka_read(rk, topic, ranges, PARTS, kl_take_follow_up, c, NULL),
      KL_OK);
  assert_non_null(c->ev.id);
  rd_kafka_destroy(rk);
  kl_conf_destroy(conf);
}

/* A follow-up published twice (its worker died between Kafka's
 * acknowledgement and the outbox's removal) is applied once and counted
 * as a duplicate; the ledger check finds the copy in the log and expects
 * it there, where it would otherwise take it for a fenced owner's. */
static void test_outbox_copy_is_a_duplicate(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "copy", PARTS, KEYS, 17, NULL);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "copy"), fx.store, NULL);
  kl_publish_bank(fx.gen, fx.producer, fx.topic, 60);
  kl_assert_conserved(fx.gen, fx.store, fx.topic);
  kl_copy_t copy = {0};
  kl_read_follow_up(fx.boot, fx.topic, &copy);
  kl_conf_t *conf = kl_conf_new(); /* publishes as the outbox does */
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "producer.follow_ups", "true"), KL_OK);
  kl_producer_t *outbox;
  assert_int_equal(kl_producer_new(conf, NULL, NULL, &outbox), KL_OK);
  kl_conf_destroy(conf);
  assert_int_equal(kl_publish(outbox, fx.topic, &copy.ev, NULL), KL_OK);
  assert_int_equal(kl_flush(outbox, 30000), KL_OK);
  kl_producer_destroy(outbox);
  assert_int_equal(kl_flush(fx.producer, 30000), KL_OK);
  uint64_t dups = kl__ledger_gen_republished(fx.gen) + 1;
  kl__ledger_verdict_t v = {0};
  for (int t = 0; t < 300 && v.duplicates < dups; t++) {
    kl_t_sleep_ms(100);
    assert_int_equal(kl__ledger_gen_verify(fx.gen, fx.store, fx.topic, &v),
                     KL_OK);
  }
  assert_int_equal(v.duplicates, dups);
  assert_false(v.ok); /* the copy is unexplained until the log is read */
  assert_int_equal(
      kl__ledger_gen_read_follow_ups(fx.gen, fx.store, fx.boot, fx.topic),
      KL_OK);
  assert_int_equal(kl__ledger_gen_verify(fx.gen, fx.store, fx.topic, &v),
                   KL_OK);
  assert_int_equal(v.follow_up_copies, 1);
  assert_int_equal(v.applied, kl__ledger_gen_published(fx.gen) + v.transfers);
  assert_true(v.ok);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_decoder_destroy(copy.decoder);
  kl_t_ledger_fx_down(&fx);
}

/* ---- a rebuilt store ---------------------------------------------------- */

/* The probe that republished every follow-up (issue 39, finding 7): a
 * store rebuilt from the log derives every follow-up again, now under a
 * new nonce; kept in its outbox, a worker on it published them all again,
 * and each credit applied twice. The rebuild finds them in the log and
 * keeps none; a worker on the rebuilt store goes on exact, and the log
 * holds each transfer's credit under one id. */
static void test_rebuild_keeps_no_published_follow_up(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "rebuilt", PARTS, KEYS, 23, NULL);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "live"), fx.store, NULL);
  kl_publish_bank(fx.gen, fx.producer, fx.topic, 60);
  kl_assert_conserved(fx.gen, fx.store, fx.topic);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(kl_t_outbox_held(fx.store, fx.topic, PARTS), 0);

  /* a new directory in the live store's temporary one, gone with it */
  char rebuilt[96];
  snprintf(rebuilt, sizeof(rebuilt), "%s/rebuilt", fx.dir);
  /* the fleet that goes on from it: a new group, with no Kafka offsets */
  const char *next = kl_t_group(fx.cluster, "next");
  kl_store_t *copy =
      kl_t_ledger_fx_rebuild(&fx, rebuilt, next, "it does not hold are kept");
  assert_int_equal(kl_t_outbox_held(copy, fx.topic, PARTS), 0);

  w = kl_t_worker_start(fx.boot, fx.topic, next, copy, NULL);
  kl_publish_bank(fx.gen, fx.producer, fx.topic, 30);
  kl_assert_conserved(fx.gen, copy, fx.topic);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(
      kl__ledger_gen_read_follow_ups(fx.gen, copy, fx.boot, fx.topic), KL_OK);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(fx.gen, copy, fx.topic, &v), KL_OK);
  assert_int_equal(v.follow_up_copies, 0);
  assert_true(v.ok);
  kl_store_destroy(copy);
  kl_t_ledger_fx_down(&fx);
}

/* ---- bad transfers ------------------------------------------------------ */

static void test_bad_transfers_are_dead_letters(void **state) {
  (void)state;
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, "badxfer", 1, 2, 17, NULL);
  kl_t_worker_t *w = kl_t_worker_start(
      fx.boot, fx.topic, kl_t_group(fx.cluster, "b"), fx.store, NULL);
  kl_producer_t *p = fx.producer;
  assert_int_equal(
      kl__ledger_gen_send(p, fx.topic, "a", 1, NULL, "credit", 10, 1, NULL),
      KL_OK);
  assert_int_equal(
      kl__ledger_gen_send_transfer(p, fx.topic, "a", "a", NULL, 5, 2, NULL),
      KL_OK); /* to itself */
  assert_int_equal(
      kl__ledger_gen_send_transfer(p, fx.topic, "a", "b", NULL, 0, 2, NULL),
      KL_OK); /* not positive */
  assert_int_equal(
      kl__ledger_gen_send_transfer(p, fx.topic, "a", "b", NULL, 4, 2, NULL),
      KL_OK); /* fine */
  assert_int_equal(kl_flush(p, 10000), KL_OK);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 600 && !(st.dead_letters == 2 && st.applied == 3); i++) {
    kl_t_sleep_ms(50);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  assert_int_equal(st.dead_letters, 2);
  assert_int_equal(st.applied, 3); /* the credit, the transfer, its credit */
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_t_ledger_fx_down(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bank_inline),
      cmocka_unit_test(test_bank_lanes),
      cmocka_unit_test(test_crash_between_commit_and_publish),
      cmocka_unit_test(test_outbox_copy_is_a_duplicate),
      cmocka_unit_test(test_rebuild_keeps_no_published_follow_up),
      cmocka_unit_test(test_bad_transfers_are_dead_letters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
