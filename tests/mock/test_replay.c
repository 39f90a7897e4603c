/*
 * Replay and rebuild on the embedded cluster: a rebuilt store equals the
 * one the fleet built; replaying an applied range applies 0; a dry run
 * changes nothing; replay beside a live worker never double-applies;
 * truncated history is reported; gaps are refused; a stopped or fenced
 * replay says where to resume. And the parsers under them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/internal.h"
#include "common/kafka.h"
#include "common/kafka_pos.h"
#include "support/history.h"
#include "support/ledger_checks.h"
#include "support/support.h"
#include "handlers/ledger.h"
#include "worker/replay.h"
#include "store/store_internal.h"
#include "keylane/handlers.h"

typedef kl_t_ledger_fx_t kl_fx_t;

static const char *const kl_fast[] = {"worker.session.timeout.ms=3000", NULL};

static void kl_fx_up(kl_fx_t *fx, const char *topic, int partitions) {
  kl_t_ledger_fx_up(fx, topic, partitions, 40, 7, NULL);
}

/* A fleet of one worker applies everything published so far. */
static void kl_fx_fleet(kl_fx_t *fx, const char *group) {
  kl_t_worker_t *w =
      kl_t_worker_start(fx->boot, fx->topic, group, fx->store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx->gen, fx->store, fx->topic, 0, 30000),
                   0);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
}

static void kl_assert_ledger(kl_fx_t *fx, kl_store_t *store) {
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(fx->gen, store, fx->topic, &v), KL_OK);
  assert_int_equal(v.keys_bad, 0);
  assert_int_equal(v.violations, 0);
  assert_int_equal(v.applied, kl__ledger_gen_published(fx->gen));
  assert_int_equal(v.duplicates, kl__ledger_gen_republished(fx->gen));
  assert_true(v.ok);
}

/* ---- a store as text, to compare two ----------------------------------- */

enum { KL_DUMP_EPOCHS = 1, KL_DUMP_TIMES = 2 };

typedef struct kl_dump {
  FILE *f;
  int flags;
} kl_dump_t;

static void kl_hex(FILE *f, const void *data, size_t len) {
  for (size_t i = 0; i < len; i++)
    fprintf(f, "%02x", ((const unsigned char *)data)[i]);
}

static int kl_dump_part(void *opaque, const char *topic, int32_t partition,
                        const kl_partition_state_t *st) {
  kl_dump_t *d = opaque;
  fprintf(d->f,
          "part %s/%d watermark=%lld applied=%llu duplicates=%llu "
          "dead=%llu",
          topic, (int)partition, (long long)st->watermark,
          (unsigned long long)st->applied, (unsigned long long)st->duplicates,
          (unsigned long long)st->dead_letters);
  if (d->flags & KL_DUMP_EPOCHS)
    fprintf(d->f, " epoch=%llu", (unsigned long long)st->epoch);
  fputc('\n', d->f);
  return 0;
}

static int kl_dump_row(void *opaque, const void *key, size_t key_len,
                       const void *val, size_t val_len) {
  kl_dump_t *d = opaque;
  fputs("data ", d->f);
  kl_hex(d->f, key, key_len);
  fputc(' ', d->f);
  kl_hex(d->f, val, val_len);
  fputc('\n', d->f);
  return 0;
}

static int kl_dump_id(void *opaque, const char *topic, const void *key,
                      size_t key_len, const char *id, size_t id_len,
                      int64_t time_ms, kl_mark_t mark) {
  kl_dump_t *d = opaque;
  fprintf(d->f, "id %s/%.*s/%.*s mark=%d", topic, (int)key_len,
          key ? (const char *)key : "", (int)id_len, id, (int)mark);
  if (d->flags & KL_DUMP_TIMES)
    fprintf(d->f, " t=%lld", (long long)time_ms);
  fputc('\n', d->f);
  return 0;
}

/* Partitions, handler state and idempotency keys, in order. */
static char *kl_dump(kl_store_t *store, int flags) {
  char *text = NULL;
  size_t len = 0;
  kl_dump_t d = {open_memstream(&text, &len), flags};
  assert_non_null(d.f);
  assert_int_equal(kl_store_foreach_partition(store, kl_dump_part, &d), KL_OK);
  assert_int_equal(kl_store_scan(store, NULL, 0, kl_dump_row, &d), KL_OK);
  assert_int_equal(kl__store_ids_walk(store, kl_dump_id, &d), KL_OK);
  fclose(d.f);
  return text;
}

static char *kl_slurp_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(*len + 1);
  assert_int_equal(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

/* ---- running a replay -------------------------------------------------- */

typedef struct kl_rp {
  kl__replay_opts_t opts;
  kl_conf_t *conf;
  kl__replay_t *replay;
  kl__replay_part_t total;
} kl_rp_t;

static void kl_rp_init(kl_rp_t *rp, kl_fx_t *fx, kl_store_t *store,
                       const char *from) {
  memset(rp, 0, sizeof(*rp));
  rp->conf = kl_conf_new();
  assert_int_equal(kl_conf_set(rp->conf, "kafka.bootstrap.servers", fx->boot),
                   KL_OK);
  rp->opts.conf = rp->conf;
  rp->opts.topic = fx->topic;
  rp->opts.store = store;
  rp->opts.handler = kl_ledger_handler;
  assert_int_equal(kl__pos_parse(from, kl__now_ms(), &rp->opts.from), KL_OK);
  rp->opts.to = (kl__pos_t){KL__POS_END, 0};
}

/* Runs it; @returns what kl__replay_run() returned. */
static kl_err_t kl_rp_run(kl_rp_t *rp) {
  assert_int_equal(kl__replay_new(&rp->opts, &rp->replay), KL_OK);
  kl_err_t err = kl__replay_run(rp->replay);
  kl__replay_totals(rp->replay, &rp->total);
  return err;
}

static const kl__replay_part_t *kl_rp_part(kl_rp_t *rp, int32_t partition) {
  size_t n;
  const kl__replay_part_t *parts = kl__replay_parts(rp->replay, &n);
  for (size_t i = 0; i < n; i++)
    if (parts[i].partition == partition)
      return &parts[i];
  fail_msg("partition %d is not in the replay", (int)partition);
  return NULL;
}

static void kl_rp_done(kl_rp_t *rp) {
  kl__replay_destroy(rp->replay);
  kl_conf_destroy(rp->conf);
}

static uint64_t kl_fx_records(kl_fx_t *fx) {
  return kl__ledger_gen_published(fx->gen) +
         kl__ledger_gen_republished(fx->gen);
}

/* ---- rebuild ------------------------------------------------------------ */

/* The issue's test: delete the store of a finished run, rebuild it from the
 * log, and compare balances, seen keys and watermarks with the original. */
static void test_rebuild_equals_the_fleets_store(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "rebuild", 4);
  kl_t_ledger_fx_publish(&fx, 1500);
  kl_fx_fleet(&fx, "fleet");
  kl_assert_ledger(&fx, fx.store);
  char *before = kl_dump(fx.store, 0);
  uint64_t ids_before;
  assert_int_equal(kl_store_id_count(fx.store, &ids_before), KL_OK);
  assert_int_equal(ids_before, kl__ledger_gen_published(fx.gen));

  /* The disk is lost. */
  kl_store_destroy(fx.store);
  kl_t_rmrf(fx.dir);
  kl_t_tmpdir(fx.dir);
  snprintf(fx.where, sizeof(fx.where), "%s", fx.dir);
  assert_int_equal(kl_store_open(fx.where, NULL, &fx.store), KL_OK);

  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.rebuild = 1;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.read, kl_fx_records(&fx));
  assert_int_equal(rp.total.applied, kl__ledger_gen_published(fx.gen));
  assert_int_equal(rp.total.skipped_duplicate,
                   kl__ledger_gen_republished(fx.gen));
  assert_int_equal(rp.total.skipped_applied, 0);
  assert_int_equal(rp.total.failed, 0);
  for (int32_t p = 0; p < fx.partitions; p++) {
    assert_int_equal(kl_rp_part(&rp, p)->history_from, -1);
    assert_int_equal(kl_rp_part(&rp, p)->previous_epoch, 0);
  }
  kl_rp_done(&rp);

  char *after = kl_dump(fx.store, 0);
  assert_string_equal(before, after); /* balances, ids, watermarks, counters */
  kl_assert_ledger(&fx, fx.store);

  /* A rebuild into a store that holds the topic is refused, untouched. */
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.rebuild = 1;
  assert_int_equal(kl_rp_run(&rp), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "empty store"));
  kl_rp_done(&rp);
  char *again = kl_dump(fx.store, KL_DUMP_EPOCHS);
  assert_non_null(strstr(again, "epoch=1\n"));
  assert_null(strstr(again, "epoch=2"));
  free(before);
  free(after);
  free(again);
  kl_t_ledger_fx_down(&fx);
}

static void test_replaying_an_applied_range_applies_nothing(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "applied", 3);
  kl_t_ledger_fx_publish(&fx, 900);
  kl_fx_fleet(&fx, "fleet");
  char *before = kl_dump(fx.store, KL_DUMP_TIMES);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.applied, 0);
  assert_int_equal(rp.total.read, kl_fx_records(&fx));
  assert_int_equal(rp.total.skipped_applied, kl_fx_records(&fx));
  assert_int_equal(rp.total.skipped_duplicate, 0);
  kl_rp_done(&rp);
  char *after = kl_dump(fx.store, KL_DUMP_TIMES);
  assert_string_equal(before, after); /* only the epochs moved */
  kl_assert_ledger(&fx, fx.store);
  free(before);
  free(after);
  kl_t_ledger_fx_down(&fx);
}

/* ---- dry run ------------------------------------------------------------ */

static void test_dry_run_changes_nothing(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "dry", 3);
  kl_t_ledger_fx_publish(&fx, 600);
  kl_fx_fleet(&fx, "fleet");
  uint64_t published = kl__ledger_gen_published(fx.gen);
  uint64_t republished = kl__ledger_gen_republished(fx.gen);
  kl_t_ledger_fx_publish(&fx,
                         400); /* not applied yet; 40 re-publish older events */

  char path[128];
  snprintf(path, sizeof(path), "%s/data.mdb", fx.dir);
  size_t len_before, len_after;
  char *file_before = kl_slurp_file(path, &len_before);
  char *before = kl_dump(fx.store, KL_DUMP_EPOCHS | KL_DUMP_TIMES);

  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.dry_run = 1;
  rp.opts.dry_run_handler = 1; /* the ledger's effects are the store's */
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  kl__replay_part_t dry = rp.total;
  assert_int_equal(dry.status, KL__REPLAY_DONE);
  assert_true(dry.exact);
  assert_int_equal(dry.applied, kl__ledger_gen_published(fx.gen) - published);
  assert_int_equal(dry.skipped_duplicate,
                   kl__ledger_gen_republished(fx.gen) - republished);
  assert_int_equal(dry.skipped_applied, published + republished);
  for (int32_t p = 0; p < fx.partitions; p++)
    assert_int_equal(kl_rp_part(&rp, p)->previous_epoch, 0); /* took none */
  kl_rp_done(&rp);

  char *after = kl_dump(fx.store, KL_DUMP_EPOCHS | KL_DUMP_TIMES);
  assert_string_equal(before, after); /* epochs and times included */
  char *file_after = kl_slurp_file(path, &len_after);
  assert_int_equal(len_before, len_after);
  assert_memory_equal(file_before, file_after, len_before);

  /* What the dry run reported is what the replay does. */
  kl_rp_init(&rp, &fx, fx.store, "watermark");
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.applied, dry.applied);
  assert_int_equal(rp.total.skipped_duplicate, dry.skipped_duplicate);
  kl_rp_done(&rp);
  kl_assert_ledger(&fx, fx.store);
  free(before);
  free(after);
  free(file_before);
  free(file_after);
  kl_t_ledger_fx_down(&fx);
}

/* A handler with an effect outside the store: it counts its calls. */
static int kl_outside_calls;

static kl_handler_result_t kl_outside(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  kl_outside_calls++;
  return kl_ledger_handler(opaque, event, fence, txn, errbuf, errbuf_size);
}

/* A dry run never calls a handler that may act outside the store; it
 * reports what the replay then applies and skips. */
static void test_dry_run_never_calls_an_outside_handler(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "dryoutside", 2);
  kl_t_ledger_fx_publish(&fx, 200);
  kl_fx_fleet(&fx, "fleet");
  uint64_t published = kl__ledger_gen_published(fx.gen);
  uint64_t republished = kl__ledger_gen_republished(fx.gen);
  kl_t_ledger_fx_publish(&fx, 100); /* 10 of them re-publish older events */

  kl_outside_calls = 0;
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.handler = kl_outside;
  rp.opts.dry_run = 1;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  kl__replay_part_t dry = rp.total;
  kl_rp_done(&rp);
  assert_int_equal(kl_outside_calls, 0);
  assert_int_equal(dry.status, KL__REPLAY_DONE);
  assert_int_equal(dry.read, kl_fx_records(&fx));
  assert_int_equal(dry.applied, kl__ledger_gen_published(fx.gen) - published);
  assert_int_equal(dry.skipped_duplicate,
                   kl__ledger_gen_republished(fx.gen) - republished);
  assert_int_equal(dry.skipped_applied, published + republished);

  /* The replay calls it once per event it applies: as the dry run said. */
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.handler = kl_outside;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.applied, dry.applied);
  assert_int_equal(rp.total.skipped_duplicate, dry.skipped_duplicate);
  assert_int_equal(rp.total.skipped_applied, dry.skipped_applied);
  kl_rp_done(&rp);
  assert_int_equal(kl_outside_calls, dry.applied);
  kl_assert_ledger(&fx, fx.store);
  kl_t_ledger_fx_down(&fx);
}

/* A never-owned partition has no epoch for a batch: its dry run runs in a
 * scratch store, and the real one stays empty. */
static void test_dry_run_of_a_rebuild(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "dryempty", 2);
  kl_t_ledger_fx_publish(&fx, 300);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.dry_run = 1;
  rp.opts.rebuild = 1;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.applied, kl__ledger_gen_published(fx.gen));
  assert_int_equal(rp.total.skipped_duplicate,
                   kl__ledger_gen_republished(fx.gen));
  assert_true(kl_rp_part(&rp, 0)->scratch);
  kl_rp_done(&rp);
  char *after = kl_dump(fx.store, KL_DUMP_EPOCHS);
  assert_string_equal(after, "");
  free(after);
  kl_t_ledger_fx_down(&fx);
}

/* ---- beside a live fleet ------------------------------------------------ */

static void kl_wait_fenced(kl_t_worker_t *w, uint64_t n) {
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 300; i++) {
    kl_worker_stats(w->worker, &st, sizeof(st));
    if (st.fenced >= n)
      return;
    kl_t_sleep_ms(50);
  }
  fail_msg("the live worker was fenced %llu times, expected %llu",
           (unsigned long long)st.fenced, (unsigned long long)n);
}

/* The documented rule: replay takes each partition by epoch, so the live
 * owner is fenced; a member that gets the partition later resumes from the
 * watermark replay left. Every event applies once across all three. */
static void test_replay_beside_a_live_worker(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "live", 4);
  const char *boot = fx.boot;
  kl_t_ledger_fx_publish(&fx, 500);
  kl_t_worker_t *w1 = kl_t_worker_start(boot, fx.topic, "g", fx.store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);

  /* More events while the worker runs; replay races it for them. */
  kl_t_ledger_fx_publish(&fx, 1000);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.batch_max = 50;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.read, kl_fx_records(&fx));
  int64_t ends[4];
  for (int32_t p = 0; p < 4; p++) {
    const kl__replay_part_t *part = kl_rp_part(&rp, p);
    assert_true(part->previous_epoch >= 1); /* it took them from w1 */
    ends[p] = part->end;
  }
  uint64_t replay_applied = rp.total.applied;
  kl_rp_done(&rp);

  /* The live owner's next batches are rejected: it is fenced, and applies
   * nothing more of its partitions. */
  kl_t_ledger_fx_publish(&fx, 200);
  kl_wait_fenced(w1, 4);
  for (int32_t p = 0; p < 4; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx.store, fx.topic, p, &st), KL_OK);
    assert_int_equal(st.watermark, ends[p]);
  }
  kl_worker_stats_t s1, s2;
  kl_worker_stats(w1->worker, &s1, sizeof(s1));
  assert_int_equal(kl_t_worker_stop(w1), KL_OK);

  /* The group hands the partitions to a member again. */
  kl_t_worker_t *w2 = kl_t_worker_start(boot, fx.topic, "g", fx.store, kl_fast);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  kl_worker_stats(w2->worker, &s2, sizeof(s2));
  assert_int_equal(kl_t_worker_stop(w2), KL_OK);
  assert_int_equal(s1.applied + replay_applied + s2.applied,
                   kl__ledger_gen_published(fx.gen));
  kl_assert_ledger(&fx, fx.store);
  kl_t_ledger_fx_down(&fx);
}

/* After replay, the live owner that it fenced, still assigned the
 * partitions by the group, takes them back once replay has been quiet for
 * worker.fenced.retake.ms and applies what was published since, once, with
 * no restart and no rebalance. */
static void test_fenced_live_worker_takes_its_partitions_back(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "retake", 2);
  kl_t_ledger_fx_publish(&fx, 300);
  static const char *const retake[] = {"worker.session.timeout.ms=3000",
                                       "worker.fenced.retake.ms=3500", NULL};
  kl_t_worker_t *w =
      kl_t_worker_start(fx.boot, fx.topic, "g", fx.store, retake);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.applied, 0); /* all of it applied already */
  kl_rp_done(&rp);

  kl_t_ledger_fx_publish(&fx, 300);
  kl_wait_fenced(w, 2);
  assert_int_equal(kl__ledger_gen_wait(fx.gen, fx.store, fx.topic, 0, 30000),
                   0);
  uint64_t published = kl__ledger_gen_published(fx.gen);
  assert_int_equal(kl_t_workers_applied(&w, 1, published, 5000), published);
  kl_worker_stats_t st;
  kl_worker_stats(w->worker, &st, sizeof(st));
  assert_int_equal(st.fenced, 2); /* once per partition, then taken back */
  assert_int_equal(st.owned, 2);
  for (int32_t p = 0; p < 2; p++) {
    kl_partition_state_t ps;
    assert_int_equal(kl_store_partition(fx.store, fx.topic, p, &ps), KL_OK);
    assert_int_equal(ps.epoch, 3); /* the worker's, replay's, the retake's */
  }
  /* The group's offsets carry the retaken epochs (common/kafka.h). */
  const int32_t parts[2] = {0, 1};
  uint64_t epochs[2];
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", fx.boot),
                   KL_OK);
  assert_int_equal(kl__kafka_group_epochs(conf, "g", fx.topic, parts, 2, epochs,
                                          NULL, 10000),
                   KL_OK);
  kl_conf_destroy(conf);
  assert_int_equal(epochs[0], 3);
  assert_int_equal(epochs[1], 3);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_assert_ledger(&fx, fx.store);
  kl_t_ledger_fx_down(&fx);
}

typedef struct kl_hook {
  kl_store_t *store;
  int32_t partition;
  int calls;
  int at;             /* act on this call for the partition */
  volatile int *stop; /* set it, or else take the partition */
} kl_hook_t;

static void kl_hook_fn(void *opaque, const char *topic, int32_t partition,
                       uint64_t epoch) {
  kl_hook_t *h = opaque;
  if (partition != h->partition || ++h->calls != h->at)
    return;
  if (h->stop) {
    *h->stop = 1;
    return;
  }
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(h->store, topic, partition, &st), KL_OK);
}

/* A member that takes a partition while replay runs fences the replay,
 * which stops there and says where; the member applies the rest, once. */
static void test_replay_fenced_by_a_new_owner(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "refence", 2);
  kl_t_ledger_fx_publish(&fx, 800);
  kl_hook_t hook = {fx.store, 0, 0, 2, NULL};
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.batch_max = 100;
  rp.opts.before_commit = kl_hook_fn;
  rp.opts.hook_opaque = &hook;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  const kl__replay_part_t *p0 = kl_rp_part(&rp, 0);
  assert_int_equal(p0->status, KL__REPLAY_FENCED);
  assert_int_equal(p0->next, 100); /* the first batch committed */
  assert_non_null(strstr(p0->why, "fenced"));
  assert_int_equal(kl_rp_part(&rp, 1)->status, KL__REPLAY_DONE);
  assert_int_equal(rp.total.status, KL__REPLAY_FENCED);
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &st), KL_OK);
  assert_int_equal(st.watermark, 100); /* nothing of the fenced batch */
  kl_rp_done(&rp);
  kl_fx_fleet(&fx, "fleet");
  kl_assert_ledger(&fx, fx.store);
  kl_t_ledger_fx_down(&fx);
}

/* Ctrl-C: the batch in flight commits, the replay stops and each partition
 * says where to resume; resuming there finishes the job, once. */
static void test_stop_reports_where_to_resume(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "stop", 2);
  kl_t_ledger_fx_publish(&fx, 800);
  volatile int stop = 0;
  kl_hook_t hook = {fx.store, 1, 0, 1, &stop};
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.batch_max = 100;
  rp.opts.stop = &stop;
  rp.opts.before_commit = kl_hook_fn;
  rp.opts.hook_opaque = &hook;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  assert_int_equal(rp.total.status, KL__REPLAY_STOPPED);
  int64_t resume[2];
  for (int32_t p = 0; p < 2; p++) {
    const kl__replay_part_t *part = kl_rp_part(&rp, p);
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(fx.store, fx.topic, p, &st), KL_OK);
    if (part->status == KL__REPLAY_STOPPED)
      assert_int_equal(part->next, st.watermark);
    resume[p] = part->next;
  }
  assert_int_equal(kl_rp_part(&rp, 1)->status, KL__REPLAY_STOPPED);
  assert_int_equal(resume[1], 100);
  kl_rp_done(&rp);

  for (int32_t p = 0; p < 2; p++) {
    char from[32], list[8];
    snprintf(from, sizeof(from), "%lld", (long long)resume[p]);
    snprintf(list, sizeof(list), "%d", (int)p);
    kl_rp_init(&rp, &fx, fx.store, from);
    rp.opts.partitions = list;
    assert_int_equal(kl_rp_run(&rp), KL_OK);
    assert_int_equal(rp.total.status, KL__REPLAY_DONE);
    assert_int_equal(rp.total.skipped_applied, 0);
    kl_rp_done(&rp);
  }
  kl_assert_ledger(&fx, fx.store);
  kl_t_ledger_fx_down(&fx);
}

/* ---- history ------------------------------------------------------------ */

static void test_gap_above_the_watermark_is_refused(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "gap", 1);
  kl_t_ledger_fx_publish(&fx, 200);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "50");
  assert_int_equal(kl_rp_run(&rp), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "--allow-gap"));
  kl_rp_done(&rp);
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &st), KL_OK);
  assert_int_equal(st.epoch, 0); /* refused before taking anything */

  kl_rp_init(&rp, &fx, fx.store, "50");
  rp.opts.allow_gap = 1;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  const kl__replay_part_t *p = kl_rp_part(&rp, 0);
  assert_int_equal(p->history_from, 50);
  assert_true(p->history_skipped);
  assert_int_equal(p->read, (uint64_t)(p->end - 50));
  kl_rp_done(&rp);
  kl_t_ledger_fx_down(&fx);
}

/* Retention cut the log: a rebuild applies what is left and reports the
 * rest as lost, with the earliest offset. */
static void test_truncated_history_is_reported(void **state) {
  kl_fx_t fx;
  kl_fx_up(&fx, "trunc", 1);
  int64_t low = kl_t_publish_truncated(fx.boot, fx.topic, "acct-7", 60);
  assert_true(low > 0);
  kl_rp_t rp;
  kl_rp_init(&rp, &fx, fx.store, "beginning");
  rp.opts.rebuild = 1;
  assert_int_equal(kl_rp_run(&rp), KL_OK);
  const kl__replay_part_t *p = kl_rp_part(&rp, 0);
  assert_int_equal(p->status, KL__REPLAY_DONE);
  assert_int_equal(p->low, low);
  assert_int_equal(p->history_from, low);
  assert_false(p->history_skipped);
  assert_int_equal(p->applied, (uint64_t)(60 - low));
  kl_rp_done(&rp);
  const void *val = NULL;
  size_t len = 0;
  kl_txn_t *txn;
  kl_partition_state_t st;
  assert_int_equal(kl_store_partition(fx.store, fx.topic, 0, &st), KL_OK);
  assert_int_equal(st.watermark, 60);
  assert_int_equal(kl_store_begin(fx.store, fx.topic, 0, st.epoch, &txn),
                   KL_OK);
  unsigned char key[KL_LEDGER_STORE_KEY_MAX];
  size_t klen = kl__ledger_key(fx.topic, "acct-7", 6, key);
  assert_int_equal(kl_txn_get(txn, key, klen, &val, &len), KL_OK);
  kl_ledger_entry_t e;
  assert_int_equal(kl__ledger_decode(val, len, &e), 0);
  assert_int_equal(e.balance, 60 - low);
  assert_int_equal(e.last_seq, 60);
  assert_int_equal(e.violations, 1); /* the first event left is seq low+1 */
  kl_store_abort(txn);
  kl_t_ledger_fx_down(&fx);
}

/* ---- the parsers -------------------------------------------------------- */

static void test_gap_kinds(void **state) {
  assert_int_equal(kl__replay_gap(0, 0, 0), 0);
  assert_int_equal(kl__replay_gap(100, 0, 40), 0); /* below: skipped */
  assert_int_equal(kl__replay_gap(100, 0, 100), 0);
  assert_int_equal(kl__replay_gap(0, 512, 512), 1); /* retention */
  assert_int_equal(kl__replay_gap(100, 512, 512), 1);
  assert_int_equal(kl__replay_gap(100, 0, 150), 2); /* --from skips */
  assert_int_equal(kl__replay_gap(0, 512, 600), 2);
}

static void test_positions(void **state) {
  kl__pos_t pos;
  assert_int_equal(kl__pos_parse("1200", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_OFFSET);
  assert_int_equal(pos.value, 1200);
  assert_int_equal(kl__pos_parse("beginning", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_BEGINNING);
  assert_int_equal(kl__pos_parse("earliest", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_BEGINNING);
  assert_int_equal(kl__pos_parse("end", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_END);
  assert_int_equal(kl__pos_parse("watermark", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_WATERMARK);
  assert_int_equal(kl__pos_parse("@1714564800000", 0, &pos), KL_OK);
  assert_int_equal(pos.kind, KL__POS_TIME);
  assert_int_equal(pos.value, 1714564800000LL);
  assert_int_equal(kl__pos_parse("@2024-05-01T12:00:00Z", 0, &pos), KL_OK);
  assert_int_equal(pos.value, 1714564800000LL);
  assert_int_equal(kl__pos_parse("@2024-05-01T12:00:00.25Z", 0, &pos), KL_OK);
  assert_int_equal(pos.value, 1714564800250LL);
  assert_int_equal(kl__pos_parse("@-2h", 10000000, &pos), KL_OK);
  assert_int_equal(pos.value, 10000000 - 7200000);
  assert_int_equal(kl__pos_parse("@-15m", 10000000, &pos), KL_OK);
  assert_int_equal(pos.value, 10000000 - 900000);
  static const char *const bad[] = {
      "", "-1", "12x", "@", "@yesterday", "@2024-05-01 12:00", "@-2w", "start"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(kl__pos_parse(bad[i], 0, &pos), KL_EINVAL);
    assert_true(strlen(kl_err_detail()) > 0);
  }
}

static void test_partition_lists(void **state) {
  int32_t *list;
  size_t n;
  assert_int_equal(kl__pos_partitions("5-7,0,2,6", 8, &list, &n), KL_OK);
  assert_int_equal(n, 5);
  int32_t want[] = {0, 2, 5, 6, 7};
  assert_memory_equal(list, want, sizeof(want));
  free(list);
  assert_int_equal(kl__pos_partitions("all", 3, &list, &n), KL_OK);
  assert_int_equal(n, 3);
  free(list);
  assert_int_equal(kl__pos_partitions("8", 8, &list, &n), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "0..7"));
  assert_int_equal(kl__pos_partitions("1,,2", 8, &list, &n), KL_EINVAL);
  assert_int_equal(kl__pos_partitions("3-1", 8, &list, &n), KL_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gap_kinds),
      cmocka_unit_test(test_positions),
      cmocka_unit_test(test_partition_lists),
      cmocka_unit_test(test_rebuild_equals_the_fleets_store),
      cmocka_unit_test(test_replaying_an_applied_range_applies_nothing),
      cmocka_unit_test(test_dry_run_changes_nothing),
      cmocka_unit_test(test_dry_run_of_a_rebuild),
      cmocka_unit_test(test_dry_run_never_calls_an_outside_handler),
      cmocka_unit_test(test_replay_beside_a_live_worker),
      cmocka_unit_test(test_replay_fenced_by_a_new_owner),
      cmocka_unit_test(test_fenced_live_worker_takes_its_partitions_back),
      cmocka_unit_test(test_stop_reports_where_to_resume),
      cmocka_unit_test(test_gap_above_the_watermark_is_refused),
      cmocka_unit_test(test_truncated_history_is_reported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
