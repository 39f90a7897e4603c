/*
 * keylane-sim: a deterministic simulator of a keylane fleet, for the
 * schedules nobody writes down.
 *
 * WHAT RUNS FOR REAL. The store API on LMDB (a directory on /dev/shm,
 * store.durability=none: commits are cheap) or on a throwaway PostgreSQL
 * (tests/support/pg.h). Each owner runs the worker's own engine as a
 * worker in inline mode (worker.concurrency=1) does: its lanes
 * (worker/lanes*.c: windows, per-key order, retries with backoff, dead
 * letters, fencing, rewinds after a failed commit, the group commit of
 * every due lane in one store commit), the pool's inline run
 * (worker/lanes_pool.c, store/child.c), the per-event step kl__apply_event()
 * (worker/apply.c: decode, the reserved-id and routing checks, the seen
 * check of the key-scoped id, the handler, the mark) and the outbox
 * publisher (worker/outbox.c: listing, publishing, removing what Kafka
 * acknowledged), with the ledger handler (handlers/ledger.c; a transfer
 * emits its credit through kl_txn_emit()) and, on PostgreSQL, the begin
 * ahead, prefetch and owner cache. The tools run what their commands run:
 * replay and redrive kl__apply_batch(), rebuild worker/rebuild.c.
 *
 * WHAT IS SIMULATED (sim_seams.c, through the linker's --wrap). Kafka:
 * per partition an array of records built with kl_event_encode(), handed
 * to the lanes as rd_kafka_message_t filled by hand; the dead-letter
 * topic: an array the lanes' kl__dlq_send() appends to, its acks served
 * at the owner's next kl__dlq_poll(); the outbox's producer: kl_publish()
 * appends to the log, its delivery reports come when a step says so.
 * Time: a clock the steps move, which the store (kl__store_set_clock()),
 * kl__now_ms() and the lanes' kl__mono_ns() read (the engine's waits move
 * it on). Processes: 2 to 4 owners, each with its own store handle on
 * PostgreSQL (its connections and its owner cache), sharing the one LMDB
 * environment as processes of one host do. A paused owner keeps its own
 * stack (ucontext): it stops in the lanes' before_commit hook and other
 * steps run until it is resumed or dies. Every choice comes from one seed
 * (splitmix64): the schedule's shape (2-4 partitions, 2-4 owners, 4-8 keys,
 * batches of 1-8) from the seed, and one 64-bit choice per step, whose bits the
 * step decodes against the state it finds (an owner "among those that can").
 *
 * TWO TOPICS ON ONE STORE (`--topics 2`, the default; issue 39): each
 * schedule runs two topics of the same partition count and the same key
 * names over its one store, as two fleets sharing a store do. Each has its
 * log, its dead-letter topic, its epochs, watermarks, counters and marks,
 * and its ledger entries (`ledger:TOPIC/KEY`, kl__ledger_key()); an owner
 * may hold partitions of both, so that on PostgreSQL its owner cache holds
 * a segment per (topic, partition). A client's event goes to either topic,
 * a transfer's credit stays in its own, an id may repeat on the other
 * topic's key of the same name (two events). On PostgreSQL each applied
 * event also counts itself in one row per key name that both topics write
 * (sim_world.c, sim_shared_count()): a handler that does not scope its
 * state by topic, as the ledger did before issue 39, whose owners' caches
 * must find the other topic's write at their commit. `--topics 1` runs
 * the single topic of before.
 *
 * STEPS (weights out of 8900; sim_steps.c):
 *  - publish (2000): the client appends a credit, debit or transfer to
 *    its key's partition, 4% of them ones the ledger refuses (amount 0, a
 *    transfer to itself), 10% with an id another key's event has (ids are
 *    scoped by key: two events); or (15%) appends an earlier event again,
 *    same key, same id. One valid event in six is delayed (its
 *    not_before, envelope version 2): most up to 3 s ahead of the wall
 *    clock, a quarter already past, some 5 to 20 s ahead, some an hour
 *    (they wait until the end's jump); a delayed transfer emits its
 *    credit from the firing record that runs it. An owner's lanes
 *    schedule it as a timer; its worker/fire.c writes the due ones back through
 *    kl__dlq_timer() (sim_seams.c: a firing record in the log, with the
 *    header keylane.timer and the owner's clock as its timestamp), which
 *    runs it when read. One new client event in about twenty is a cancel,
 *    one a defer (sim_steps.c, client_timers(); their handler is
 *    sim_timers.c's, called by the owners' handler in the event's own
 *    txn): a cancel's handler cancels a delayed event of its key through
 *    kl_txn_cancel() (one whose timer waited when it was published, one
 *    of any state, or an id no event has; and tries another key's, which
 *    must be refused); a defer's emits a credit with a time (as delay_of()
 *    draws it: mostly seconds ahead, some past, some an hour) through
 *    kl_txn_emit_opts(), to its own key or another of its topic, which the
 *    outbox publishes and its key's owner keeps as a timer.
 *  - batch (3300): the consumer hands an owner that holds a partition up
 *    to batch_max records from where its lane is (none while the lane is
 *    paused: its window of 12 or its outbox of 6 full), and the owner
 *    turns once: the ready events run, the dead-letter acks are served,
 *    the lanes tick (retries due, group commits due, letters, the outbox
 *    publisher), and a lane the store fenced is given up. Faults the
 *    choice may add: a handler says RETRY (4%) or FAIL (2%); the owner
 *    pauses between its handlers and its commit (12%); its first commit
 *    fails (3%), its answer is lost (3%: it committed, the lanes believe
 *    it failed and run the events again), the owner dies at the commit
 *    (4%, half of them after it committed); no report comes back this
 *    turn (25%), or the first one says the broker did not answer (sent
 *    again). Kafka refuses one follow-up in 200 for good (too large): the
 *    outbox sets it aside as a dead letter of reason outbox, which Kafka
 *    refuses too half the time (the follow-up then stays in the store
 *    and is published again 10 s later); a redrive of such a letter
 *    publishes the follow-up. After RETRY the lane waits a backoff of
 *    simulated time (100 to 400 ms), and after 3 runs dead-letters the
 *    record; after FAIL it dead-letters it (the lanes' path: the letter,
 *    its ack, then its mark and the watermark in a group commit).
 *  - acquire (500): an owner takes a partition with kl_store_acquire(), a
 *    rebalance; the previous owner is not told: a zombie until fenced. One
 *    that holds it already gives it up first (kl__lanes_release(), half
 *    the time committing what is final).
 *  - outbox (800) and ack (500): an owner turns without new records, its
 *    reports withheld (outbox) or served (ack): its outbox publisher
 *    publishes what its commits left and removes what was acknowledged.
 *    An owner that dies between the two leaves them for the next owner,
 *    which publishes them again (same id).
 *  - resume (700): a paused owner commits (fenced if someone took over),
 *    or its commit fails, or its answer is lost, or it dies.
 *  - crash (250): an owner dies at any point: its memory is gone, a paused
 *    batch's txn is aborted, on PostgreSQL its store handle is closed.
 *  - tick (500): the clock moves up to 1 s (each step moves it 1 ms); in
 *    one tick of four the wall clock (the store's, kl__now_ms(), the
 *    firing records' stamps; not the lanes' monotonic one) also jumps up
 *    to 4 s forward or back.
 *  - redrive (150): a dead letter is redriven as `keylane redrive` does: a
 *    new epoch, the applier's redrive mode, the letter's own record.
 *  - replay (97): a replay beside the live owner: a new epoch, the
 *    partition from its watermark to the log's end; it stops at a record
 *    that fails and that the fleet did not dead-letter.
 *  - sweep (40): a fleet of a third topic on the same store applies an
 *    event and sweeps its expired ids with a retention of 1 s (the two
 *    topics' ids are older): it must remove none of theirs, or their
 *    re-published events are applied again (the mutant `sweep`).
 *  - foreign (60): a fleet of another Kafka cluster with the same topic
 *    name (a wrong -b), or of another group (a typo'd -g), tries to take a
 *    partition as a worker of it does (kl__store_acquire_owned(), which
 *    the owners take with too, as the fleet's cluster and group): the
 *    store recorded the fleet's with its first take and must refuse,
 *    moving no epoch (issue 39, second attack; the mutant `owner`).
 *  - with --hostile, 48 publishes of 256 are a hostile producer's instead
 *    (sim_steps.c, hostile_publish()): a credit with an id of any form;
 *    5 in 8 a follow-up's id: the one the credit of a transfer in the log
 *    will get (`~topic/p/offset/0`) when the choice finds such a transfer,
 *    a copy of a published follow-up's when it finds one, else a guess at
 *    a record still to come; the rest `~` ids of no follow-up's form, and
 *    plain ones. keylane's publish paths refuse reserved ids; a raw
 *    producer does not. A quarter of them are against timers instead
 *    (hostile_timer()): a record naming a pending timer (keylane.timer,
 *    the offset that scheduled it) stamped before its time, a copy of a
 *    delayed event, or a copy of a waiting one without its `nb`.
 *  - in one schedule of eight on LMDB, of three on PostgreSQL (with
 *    --recreate, in each), once, at a step of its first half that its
 *    seed says (sim_steps.c, topic_recreate()): the fleet settles as
 *    at the end (drain, redrive, checks), the topics are deleted and created
 *    again (their logs start at offset 0; the dead-letter topics stay), the
 *    group loses it (every owner restarts), and an operator runs `keylane
 *    store reset` on every partition (kl__store_reset(): a new epoch,
 *    watermark 0; ids, balances and counters stay). No rebuild follows
 *    (the log no longer holds the store's past).
 *  - rebuild (3, LMDB, once a schedule at most): the fleet stops (every
 *    owner dies); a fresh store is built by applying the whole log in
 *    order (dead letters as the fleet decided), each partition's epoch
 *    above the highest the fleet used (kl__store_acquire_above()), and the
 *    fleet goes on with it.
 * A step is one choice. A choice that finds nothing to do (no owner can
 * resume, say) runs a batch instead, or when no owner has work, a publish;
 * the report counts them. After the steps comes the drain (no faults; the
 * paused resume; one owner takes every partition, applies every record,
 * publishes and removes every follow-up until nothing moves), the checks
 * of a settled store and of its rebuild, then an operator redrives every
 * dead letter, the drain runs again and the final checks follow. None of
 * this counts as steps.
 *
 * INVARIANTS, and where each is checked (sim_world.c unless said):
 *  1. each (key, id) is applied at most once: at every commit that
 *     succeeded (what the handler wrapper saw is counted only then; a
 *     commit whose answer was lost counts, an aborted or fenced one not);
 *     exactly once when the run ends: after the drain every event is
 *     applied or dead-lettered, and after every letter is redriven and
 *     the drain ran again, every event the ledger accepts is applied
 *     (final checks);
 *  2. per key, application follows log order: at every commit, each
 *     application finds every earlier event of its key applied or
 *     dead-lettered (redrives are exempt: that is what they are); an event
 *     recorded dead is never applied but by a redrive;
 *  3. no commit with an epoch older than the store's succeeds: at every
 *     commit; the store's epochs and watermarks equal the model's: after
 *     every step that committed or acquired;
 *  4. epochs only grow, per partition, across rebuilds: at every acquire;
 *  5. every follow-up published comes from an event whose batch
 *     committed (none of a fenced or aborted batch): at every publish
 *     (sim_seams.c); every applied transfer's credit is published and
 *     applied exactly once: final checks;
 *  6. money: after every step that committed, each balance (per topic and
 *     key) equals what the committed events of its topic make it, and each
 *     topic's sum equals its applied client credits less debits less the
 *     transfers whose credit is in flight (or dead-lettered); at the end
 *     none is. One topic's commits that changed the other's entries,
 *     epochs, watermarks or counters fail this or invariant 3;
 *  7. the store's marks equal the model's: at every dead letter's lookup,
 *     and for every event at the end; the outbox is empty and every
 *     watermark at the log's end after the drain;
 *  8. a store rebuilt from the log after the first drain decides as the
 *     fleet did (applied, dead letter) and holds the same balances, its
 *     epochs above the fleet's: final checks (into a fresh LMDB for both
 *     backends);
 *  9. a record is skipped as a duplicate only when its own event was
 *     applied or dead-lettered: at every commit; a hostile record that
 *     has a follow-up's id fails it ("suppressed"), and so does a credit
 *     whose id an old log's follow-up had (`--recreate`); the mutants
 *     `reserved` and `nonce` must fail it;
 * 11. a topic's partitions are taken only by its recorded owner's fleet:
 *     a foreign fleet's take is refused and moves no epoch ("foreign", at
 *     the step; the mutant `owner` must fail it);
 * 12. timers (sim_world.c, timer_*()): a delayed event runs only from a
 *     firing record of its timer stamped at or after its time, and the
 *     run takes the timer ("timer-run", "timer-early"); only a first
 *     reading schedules it ("timer-scheduled"); a firing record of a
 *     waiting timer stamped at its time is not skipped ("timer-skipped");
 *     in key order among the key's events where its first firing record
 *     is ("order"): at every commit; the store's pending timers equal the
 *     model's ("timers"): after every step that committed, and a
 *     rebuild's the fleet's ("rebuild"); before the last drain the wall
 *     clock jumps two hours, and no timer may be left ("timer-left"); an
 *     owner writes a firing record only once due by its clock
 *     ("fire-early", sim_seams.c).
 *     A cancel takes the timer that waits at its place in its key's order
 *     (kl_txn_cancel() answers KL_OK), else finds none (KL_ENOTFOUND): its
 *     handler's answer against the model's at every commit ("cancel"); a
 *     cancelled timer never runs ("timer-run", "timers"), and a copy read
 *     after the cancel is a duplicate (its id keeps the timer's mark). A
 * delayed follow-up is held to the time its defer gave it, whatever its
 * published record carries: it runs once, from a firing record of its timer,
 * never before that time ("timer-run", "timer-early", "twice"), also when the
 * outbox publishes it again; every applied defer's credit is applied or
 *     cancelled at the end ("lost-followup"); a rebuild cancels what the
 *     fleet cancelled ("rebuild"); a record of a cancelled event read
 *     again never schedules it ("cancel-undone"). The dead letter of a
 *     firing record takes its timer in its commit, the fleet's and a
 *     rebuild's alike, so that the record read again finds none: every
 *     schedule compares its rebuild ("timers", "rebuild").
 *     The mutants `timer_early` and `timer_copy` (hunted with the hostile
 *     producer),
 *     `timer_twice`, `timer_cancel` (a cancel that leaves its timer),
 *     `timer_emit` (a delayed follow-up published without its time) and
 *     `timer_dead` (a firing record's dead letter leaves its timer) must
 *     fail them.
 * 10. a row both topics write (PostgreSQL, two topics) loses no update: it
 *     counts every event applied on either topic, after every step that
 *     committed ("shared"): the owner cache finds a second writer of a row
 *     it knows and the commit is refused as busy and run again (the report
 *     counts those commits); the mutant `update` must fail it.
 * The handler wrapper also checks that the ledger accepts exactly the
 * valid events, and that the event it runs is the log's at that offset.
 *
 * A FAILURE prints the seed, the invariant and the command that replays
 * it (`keylane-sim --seed N --backend B`), then shrinks its choices (delta
 * debugging: drop chunks while the same invariant still fails), writes
 * the shortest schedule found to a file (`keylane-sim --replay FILE`) and
 * prints its steps.
 *
 * 10. nothing below a watermark waits: at every group commit, each record
 *     below the watermark it commits was applied or dead-lettered, or is
 *     a duplicate of one that was.
 *
 * MUTANTS: common/mutant.h's switches each break one rule at its real
 * place (the commit's epoch check, the seen check, the outbox of a fenced
 * batch, a watermark past a RETRY, the owner cache across a fence, the
 * consumed-side reserved-id check, the follow-up id's nonce, the
 * rebuild's match of a follow-up, a follow-up removed though its letter
 * was refused, the condition of the owner cache's UPDATE, a sweep of every
 * topic's ids, the take's owner check, a timer's due check, the deletion
 * of a timer that ran, a cancel's deletion, a delayed follow-up's time in
 * the outbox's publish, a lane held while its commit is in flight); with
 * one on,
 * the simulator must fail. The default run ends with each for a short
 * budget; a mutant that survives fails the run. `cache` and `update` are
 * hunted on PostgreSQL, where the owner cache is; `update` with two
 * topics.
 *
 * WHAT STAYS WITH THE FAULT SUITE (tests/fault/test_fault.c, a real Apache
 * Kafka) and tests/mock/test_lanes.c: librdkafka's own threads, group
 * rebalances as Kafka runs them, the real network and broker restarts,
 * the lanes' key-parallel executors (worker.concurrency > 1: threads), the
 * worker's poll loop around the lanes, its real producers and consumer.
 * The simulator runs the engine those feed, on one thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/mutant.h"
#include "common/strbuf.h"
#include "sim/sim.h"
#include "support/pg.h"
#include "support/skips.h"

#define LMDB_STEPS 1000 /* per schedule */
#define PG_STEPS 300

static const char usage[] =
    "usage: keylane-sim [options]\n\n"
    "Without options: the run `make test` makes: at least 2 million steps on\n"
    "LMDB and a share on a throwaway PostgreSQL, then every mutant.\n\n"
    "  --seed N            run schedule N once and print its steps\n"
    "  --backend lmdb|pg   the backend of --seed (default lmdb)\n"
    "  --replay FILE       run a schedule a failure wrote\n"
    "  --mutant NAME       only hunt with a mutant on: epoch, seen, outbox,\n"
    "                      watermark, cache, reserved, nonce, rebuild,\n"
    "                      aside, update, sweep, owner, timer_early,\n"
    "                      timer_twice, timer_copy, timer_cancel, timer_emit,\n"
    "                      timer_dead, flight, or all\n"
    "  --topics 1|2        topics on the schedules' store (default 2: two\n"
    "                      fleets of the same key names share it)\n"
    "  --seconds N         soak: random schedules for N seconds\n"
    "  --steps N           steps per schedule (default 1000 on LMDB, 300\n"
    "                      on PostgreSQL)\n"
    "  --lmdb-steps N      the default run's LMDB steps (default 2000000)\n"
    "  --pg-steps N        its PostgreSQL steps (default 3000)\n"
    "  --jobs N            processes running LMDB schedules (default: the\n"
    "                      cores, at most 2)\n"
    "  --mutant-seconds N  each mutant's budget (default 15; the cache\n"
    "                      mutant 8 times it)\n"
    "  --no-mutants        the default run only\n"
    "  --hostile           a hostile producer writes too: credits with ids of\n"
    "                      any form, reserved `~` ids copying a follow-up's\n"
    "                      included\n"
    "  --recreate          each schedule creates its topic again once (its\n"
    "                      logs start at 0) and resets the store\n"
    "  -h, --help          this text\n";

typedef struct opts {
  int has_seed, soak, no_mutants, jobs, mutant, hostile, recreate, topics;
  uint64_t seed;
  sim_backend_t backend;
  const char *replay;
  double seconds, mutant_seconds;
  size_t steps, lmdb_steps, pg_steps;
} opts_t;

static const char *const mutant_names[] = {
    "none",       "epoch",        "seen",       "outbox",      "watermark",
    "cache",      "reserved",     "nonce",      "rebuild",     "aside",
    "update",     "sweep",        "owner",      "timer_early", "timer_twice",
    "timer_copy", "timer_cancel", "timer_emit", "timer_dead",  "flight"};
#define MUTANTS 20

static const char *backend_name(sim_backend_t b) {
  return b == SIM_PG ? "pg" : "lmdb";
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t steps_of(const opts_t *o, sim_backend_t b) {
  return o->steps ? o->steps : b == SIM_PG ? PG_STEPS : LMDB_STEPS;
}

/* ---- PostgreSQL ---------------------------------------------------------- */

static kl_t_pg_t *pg;
static char pg_uri[512];

/* @returns 0 with sim_pg_uri set; 1 when PostgreSQL is missing and not
 * required (the share is skipped); -1 when it is required. */
static int pg_start(void) {
  char why[512];
  if (sim_pg_uri)
    return 0;
  if (!(pg = kl_t_pg_start(0, why, sizeof(why))) ||
      kl_t_pg_createdb(pg, "sim", pg_uri, sizeof(pg_uri))) {
    const char *need_why;
    int required = kl_t_missing_required(&need_why) != NULL;
    fprintf(stderr,
            "keylane-sim: no PostgreSQL (%s): the PostgreSQL share "
            "%s\n",
            why,
            required ? "is required (KEYLANE_TEST_REQUIRE)" : "is skipped");
    return required ? -1 : 1;
  }
  sim_pg_uri = pg_uri;
  return 0;
}

static void pg_stop(void) {
  if (pg)
    kl_t_pg_stop(pg);
  pg = NULL;
  sim_pg_uri = NULL;
}

/* ---- one schedule, shrinking, replay files ------------------------------- */

typedef struct failure {
  uint64_t seed;
  sim_backend_t backend;
  char code[32];
  char msg[1024];
} failure_t;

static int run_words(uint64_t seed, sim_backend_t b, const uint64_t *words,
                     size_t n, int verbose, sim_stats_t *stats, failure_t *f) {
  failure_t scratch;
  if (!f)
    f = &scratch;
  f->seed = seed;
  f->backend = b;
  return sim_run(seed, b, words, n, verbose, stats, f->code, sizeof(f->code),
                 f->msg, sizeof(f->msg));
}

/* Whether @p words still fail with the same invariant. */
static int still_fails(const failure_t *f, const uint64_t *words, size_t n) {
  failure_t g;
  return run_words(f->seed, f->backend, words, n, 0, NULL, &g) &&
         strcmp(g.code, f->code) == 0;
}

/* Delta debugging (ddmin) of the choices, for at most @p budget seconds:
 * drop chunks, then single choices, while the failure persists. */
static size_t shrink(const failure_t *f, uint64_t *words, size_t n,
                     double budget, unsigned *trials) {
  double deadline = now_s() + budget;
  uint64_t *tmp = malloc((n ? n : 1) * sizeof(*tmp));
  size_t gran = 2;
  *trials = 0;
  while (n >= 2 && now_s() < deadline) {
    size_t chunk = (n + gran - 1) / gran;
    int reduced = 0;
    for (size_t start = 0; start < n && now_s() < deadline; start += chunk) {
      size_t end = start + chunk < n ? start + chunk : n, m = 0;
      for (size_t i = 0; i < n; i++)
        if (i < start || i >= end)
          tmp[m++] = words[i];
      ++*trials;
      if (still_fails(f, tmp, m)) {
        memcpy(words, tmp, m * sizeof(*tmp));
        n = m;
        gran = gran > 2 ? gran - 1 : 2;
        reduced = 1;
        break;
      }
    }
    if (!reduced) {
      if (gran >= n)
        break;
      gran = gran * 2 < n ? gran * 2 : n;
    }
  }
  free(tmp);
  return n;
}

static void write_replay(const char *path, const failure_t *f,
                         const uint64_t *words, size_t n) {
  FILE *fp = fopen(path, "w");
  if (!fp) {
    fprintf(stderr, "keylane-sim: cannot write %s: %s\n", path,
            strerror(errno));
    return;
  }
  fprintf(fp, "# keylane-sim schedule: keylane-sim --replay %s\n", path);
  fprintf(fp, "seed %" PRIu64 "\nbackend %s\nmutant %s\ntopics %d\n%s", f->seed,
          backend_name(f->backend), mutant_names[kl__sim_mutant], sim_topics,
          sim_hostile ? "hostile\n" : "");
  if (sim_recreate)
    fprintf(fp, "recreate\n");
  for (size_t i = 0; i < n; i++)
    fprintf(fp, "%016" PRIx64 "\n", words[i]);
  fclose(fp);
}

/* Prints a failure, the command that replays it, and its shrunk form. */
static void report_failure(const failure_t *f, const opts_t *o,
                           double shrink_budget) {
  const char *m = mutant_names[kl__sim_mutant];
  size_t n = steps_of(o, f->backend);
  printf("FAIL: schedule %" PRIu64 " on %s%s%s: %s: %s\n", f->seed,
         backend_name(f->backend), kl__sim_mutant ? ", mutant " : "",
         kl__sim_mutant ? m : "", f->code, f->msg);
  printf("  replay: keylane-sim --seed %" PRIu64 " --backend %s%s%s%s", f->seed,
         backend_name(f->backend), kl__sim_mutant ? " --mutant " : "",
         kl__sim_mutant ? m : "", sim_hostile ? " --hostile" : "");
  if (sim_recreate)
    printf(" --recreate");
  if (sim_topics != SIM_TOPICS)
    printf(" --topics %d", sim_topics);
  if (o->steps)
    printf(" --steps %zu", o->steps);
  printf("\n");
  fflush(stdout);
  uint64_t *words = malloc(n * sizeof(*words));
  sim_words(f->seed, words, n);
  unsigned trials;
  double t0 = now_s();
  size_t k = shrink(f, words, n, shrink_budget, &trials);
  char path[128];
  snprintf(path, sizeof(path), "keylane-sim-%s-%" PRIu64 "%s%s.txt",
           backend_name(f->backend), f->seed, kl__sim_mutant ? "-" : "",
           kl__sim_mutant ? m : "");
  write_replay(path, f, words, k);
  printf("  shrunk from %zu to %zu steps (%u runs, %.1f s): keylane-sim "
         "--replay %s\n",
         n, k, trials, now_s() - t0, path);
  fflush(stdout);
  run_words(f->seed, f->backend, words, k, 1, NULL, NULL);
  fflush(stdout);
  free(words);
}

static int read_replay(const char *path, opts_t *o, uint64_t **words,
                       size_t *n) {
  FILE *fp = fopen(path, "r");
  if (!fp) {
    fprintf(stderr, "keylane-sim: cannot read %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[256], word[64];
  size_t cap = 0;
  *n = 0;
  *words = NULL;
  while (fgets(line, sizeof(line), fp)) {
    if (line[0] == '#')
      continue;
    if (strcmp(line, "hostile\n") == 0 || strcmp(line, "recreate\n") == 0) {
      *(line[0] == 'h' ? &sim_hostile : &sim_recreate) = 1;
      continue;
    }
    if (sscanf(line, "seed %" SCNu64, &o->seed) == 1)
      continue;
    if (sscanf(line, "topics %d", &sim_topics) == 1)
      continue;
    if (sscanf(line, "backend %63s", word) == 1) {
      o->backend = strcmp(word, "pg") == 0 ? SIM_PG : SIM_LMDB;
      continue;
    }
    if (sscanf(line, "mutant %63s", word) == 1) {
      for (int i = 0; i < MUTANTS; i++)
        if (strcmp(word, mutant_names[i]) == 0)
          kl__sim_mutant = i;
      continue;
    }
    uint64_t w;
    if (sscanf(line, "%" SCNx64, &w) != 1)
      continue;
    *words = kl__grow(*words, &cap, *n, sizeof(**words), 256);
    (*words)[(*n)++] = w;
  }
  fclose(fp);
  return 0;
}

/* ---- runs of many schedules, in processes -------------------------------- */

typedef struct job {
  sim_backend_t backend;
  uint64_t first, stride; /* seeds first, first + stride, ... */
  uint64_t schedules;     /* 0: until the deadline */
  double deadline;        /* 0: none */
  double shrink_budget;
} job_t;

typedef struct job_result {
  sim_stats_t stats;
  double seconds;
  int failed, skipped;
  char code[32]; /* the invariant that failed */
} job_result_t;

/* Set in a job when another job failed: it stops after its schedule. */
static volatile sig_atomic_t job_stop;

static void on_stop(int sig) {
  job_stop = 1;
}

static job_result_t job_run(const job_t *j, const opts_t *o) {
  job_result_t r;
  memset(&r, 0, sizeof(r));
  double t0 = now_s();
  if (j->backend == SIM_PG) {
    int rc = pg_start();
    if (rc) {
      r.failed = rc < 0;
      r.skipped = rc > 0;
      return r;
    }
  }
  size_t n = steps_of(o, j->backend);
  uint64_t *words = malloc(n * sizeof(*words));
  for (uint64_t i = 0; !j->schedules || i < j->schedules; i++) {
    if ((j->deadline && now_s() >= j->deadline) || job_stop)
      break;
    failure_t f;
    uint64_t seed = j->first + i * j->stride;
    sim_words(seed, words, n);
    if (run_words(seed, j->backend, words, n, 0, &r.stats, &f)) {
      r.failed = 1;
      snprintf(r.code, sizeof(r.code), "%s", f.code);
      r.seconds = now_s() - t0;
      report_failure(&f, o, j->shrink_budget);
      break;
    }
  }
  if (!r.seconds)
    r.seconds = now_s() - t0;
  free(words);
  sim_lmdb_envs_close();
  pg_stop();
  return r;
}

/* Runs @p n jobs, each in a process of its own, and gives their results;
 * when one fails, the others stop after their schedule in flight. */
static void jobs_run(const job_t *jobs, size_t n, const opts_t *o,
                     job_result_t *out) {
  pid_t pids[8];
  int fds[8];
  signal(SIGUSR1, on_stop);
  for (size_t i = 0; i < n; i++) {
    int p[2];
    if (pipe(p)) {
      perror("keylane-sim: pipe");
      exit(1);
    }
    fflush(stdout);
    if ((pids[i] = fork()) == 0) {
      close(p[0]);
      job_result_t r = job_run(&jobs[i], o);
      fflush(stdout);
      if (write(p[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(2);
      _exit(0);
    }
    close(p[1]);
    fds[i] = p[0];
  }
  for (size_t left = n; left > 0; left--) {
    int status;
    pid_t pid = wait(&status);
    if (pid < 0 && errno == EINTR) {
      left++;
      continue;
    }
    if (pid < 0)
      break;
    size_t i = 0;
    while (i < n && pids[i] != pid)
      i++;
    if (i == n) {
      left++;
      continue;
    }
    job_result_t r;
    memset(&out[i], 0, sizeof(out[i]));
    if (read(fds[i], &r, sizeof(r)) == (ssize_t)sizeof(r))
      out[i] = r;
    else
      out[i].failed = 1; /* it died: its output says how */
    close(fds[i]);
    pids[i] = 0;
    for (size_t k = 0; out[i].failed && k < n; k++)
      if (pids[k])
        kill(pids[k], SIGUSR1);
  }
}

static void stats_add(sim_stats_t *to, const sim_stats_t *from) {
  uint64_t *t = (uint64_t *)to;
  const uint64_t *f = (const uint64_t *)from;
  for (size_t i = 0; i < sizeof(*to) / sizeof(uint64_t); i++)
    t[i] += f[i];
}

static void print_stats(const char *what, const sim_stats_t *s,
                        double seconds) {
  printf("%s: %" PRIu64 " steps in %" PRIu64
         " schedules, %.1f s, %.0f steps/s (%" PRIu64
         " steps whose choice found nothing to do ran a batch or a publish)\n",
         what, s->steps, s->schedules, seconds,
         seconds > 0 ? (double)s->steps / seconds : 0.0, s->noops);
  printf("  %" PRIu64 " commits (%" PRIu64 " events applied, %" PRIu64
         " duplicates skipped), %" PRIu64 " fenced, %" PRIu64
         " pauses, %" PRIu64 " crashes, %" PRIu64 " lost answers, %" PRIu64
         " failed commits,\n"
         "  %" PRIu64 " dead letters, %" PRIu64 " redriven, %" PRIu64
         " replays, %" PRIu64 " rebuilds the fleet moved to, %" PRIu64
         " follow-ups published, %" PRIu64 " drain batches\n",
         s->commits, s->applied, s->duplicates, s->fenced, s->pauses,
         s->crashes, s->lost, s->aborted, s->letters, s->redriven, s->replays,
         s->rebuilds, s->published, s->drain_batches);
  if (s->busy)
    printf("  %" PRIu64 " commits refused as busy (a second writer of the "
           "row both topics write, found at the commit)\n",
           s->busy);
  if (s->swept)
    printf("  %" PRIu64 " sweeps by a third topic's fleet (retention 1 s), "
           "%" PRIu64 " of its own ids removed\n",
           s->swept, s->swept_ids);
  if (s->foreign)
    printf("  %" PRIu64 " takes by a foreign fleet (another cluster or "
           "group), refused\n",
           s->foreign);
  if (s->delayed)
    printf("  %" PRIu64 " delayed events published, %" PRIu64
           " timers scheduled, %" PRIu64 " firing records written, %" PRIu64
           " timers run, %" PRIu64 " firing records early, %" PRIu64
           " wall clock jumps\n",
           s->delayed, s->scheduled, s->fired, s->timers_run, s->early,
           s->jumps);
  if (s->cancels || s->defers)
    printf("  %" PRIu64 " cancels applied (%" PRIu64 " took a waiting timer, "
           "the rest found none), %" PRIu64 " delayed follow-ups published, "
           "%" PRIu64 " run by their timer\n",
           s->cancels, s->cancelled, s->defers, s->deferred);
  if (s->hostile || s->recreated)
    printf("  %" PRIu64 " records a hostile producer wrote, %" PRIu64
           " topics created again\n",
           s->hostile, s->recreated);
}

/* The default run, or a soak of @p o->seconds. @returns 0 when all passed. */
static int fleet_run(const opts_t *o) {
  job_t jobs[8];
  size_t n = 0;
  int lmdb_jobs = o->jobs;
  uint64_t base = 1;
  double deadline = 0;
  if (o->soak) {
    base = sim_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    base &= 0xffffffffffffULL;
    deadline = now_s() + o->seconds;
    printf("soak: %.0f s from seed %" PRIu64 "\n", o->seconds, base);
  }
  uint64_t lmdb_schedules =
      (o->lmdb_steps + steps_of(o, SIM_LMDB) - 1) / steps_of(o, SIM_LMDB);
  /* A job of no schedule would run until a deadline there is not. */
  if (!o->soak && lmdb_schedules < (uint64_t)lmdb_jobs)
    lmdb_jobs = (int)lmdb_schedules;
  for (int i = 0; i < lmdb_jobs; i++)
    jobs[n++] =
        (job_t){SIM_LMDB,
                base + (uint64_t)i,
                (uint64_t)lmdb_jobs,
                o->soak ? 0
                        : (lmdb_schedules + (uint64_t)(lmdb_jobs - i) - 1) /
                              (uint64_t)lmdb_jobs,
                deadline,
                60};
  int with_pg = o->soak || o->pg_steps > 0;
  if (with_pg)
    jobs[n++] = (job_t){SIM_PG,
                        base + (1ULL << 40),
                        1,
                        o->soak ? 0
                                : (o->pg_steps + steps_of(o, SIM_PG) - 1) /
                                      steps_of(o, SIM_PG),
                        deadline,
                        60};
  double t0 = now_s();
  job_result_t res[8];
  jobs_run(jobs, n, o, res);
  double wall = now_s() - t0;
  sim_stats_t lmdb = {0};
  double lmdb_s = 0;
  int failed = 0;
  for (size_t i = 0; i < (size_t)lmdb_jobs; i++) {
    stats_add(&lmdb, &res[i].stats);
    lmdb_s = res[i].seconds > lmdb_s ? res[i].seconds : lmdb_s;
    failed |= res[i].failed;
  }
  printf("a step: one choice of a schedule (publish, records handed to an "
         "owner's lanes and a turn of them,\n  an acquire, a turn without "
         "records, a resume, a crash, a tick,\n  a redrive, "
         "a replay, a sweep, a foreign fleet's take, a rebuild); the drain "
         "and the final checks are not "
         "counted\n");
  print_stats("LMDB", &lmdb, lmdb_s);
  const job_result_t *pr = with_pg ? &res[n - 1] : NULL;
  if (pr && pr->skipped)
    printf("PostgreSQL: skipped (not installed)\n");
  else if (pr)
    print_stats("PostgreSQL", &pr->stats, pr->seconds);
  failed |= pr && pr->failed;
  printf("%s in %.1f s (%d LMDB processes%s)\n", failed ? "FAILED" : "passed",
         wall, lmdb_jobs, pr ? " and one PostgreSQL process" : "");
  fflush(stdout);
  return !failed && pr && pr->skipped ? 77 : failed;
}

/* Hunts with mutant @p m on until a schedule fails (caught) or the budget
 * ends (survived). @returns 0 when caught. */
static int mutant_hunt(int m, const opts_t *o) {
  kl__sim_mutant = m;
  /* What each of these breaks shows only beside a producer that
   * is not keylane, or after the topic is created again. */
  int hostile = sim_hostile, recreate = sim_recreate;
  sim_hostile |= m == KL__MUTANT_RESERVED || m == KL__MUTANT_REBUILD ||
                 m == KL__MUTANT_TIMER_EARLY || m == KL__MUTANT_TIMER_COPY;
  sim_recreate |= m == KL__MUTANT_NONCE;
  /* The owner cache is PostgreSQL's; `update` needs the two topics. */
  int topics = sim_topics;
  sim_topics = m == KL__MUTANT_UPDATE ? 2 : sim_topics;
  /* A stale owner cache costs no update since the puts of keys it knows,
   * stored or absent, are conditional (store/pg_txn.c): what shows is a
   * batch that cannot commit until the cache is dropped, which takes
   * longer to meet (the 44th schedule of its seeds, 38 s here): 8 times
   * the budget. */
  double budget = o->mutant_seconds * (m == KL__MUTANT_CACHE ? 8 : 1);
  job_t j = {m == KL__MUTANT_CACHE || m == KL__MUTANT_UPDATE ? SIM_PG
                                                             : SIM_LMDB,
             1000000 + (uint64_t)m * 100000,
             1,
             0,
             now_s() + budget,
             5};
  printf("mutant %s (%s):\n", mutant_names[m], backend_name(j.backend));
  fflush(stdout);
  job_result_t r;
  jobs_run(&j, 1, o, &r);
  kl__sim_mutant = KL__MUTANT_NONE;
  sim_hostile = hostile, sim_recreate = recreate, sim_topics = topics;
  if (r.skipped) {
    printf("mutant %s: not run (no PostgreSQL)\n", mutant_names[m]);
    return 77;
  }
  printf("mutant %s: %s after %" PRIu64 " schedules, %" PRIu64
         " steps, %.1f s\n\n",
         mutant_names[m], r.failed ? "caught" : "SURVIVED", r.stats.schedules,
         r.stats.steps, r.seconds);
  fflush(stdout);
  return !r.failed;
}

static int mutants_run(const opts_t *o, int only) {
  int survived = 0, caught = 0, skipped = 0;
  for (int m = 1; m < MUTANTS; m++) {
    if (only && m != only)
      continue;
    int rc = mutant_hunt(m, o);
    caught += rc == 0;
    skipped += rc == 77;
    survived += rc == 1;
  }
  printf("mutants: %d caught, %d survived%s\n", caught, survived,
         skipped ? ", some not run (no PostgreSQL)" : "");
  return survived ? 1 : skipped ? 77 : 0;
}

/* ---- main ---------------------------------------------------------------- */

static int parse(int argc, char **argv, opts_t *o) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  *o = (opts_t){.jobs = cores >= 2 ? 2 : 1,
                .mutant_seconds = 15,
                .lmdb_steps = 2000000,
                .pg_steps = 3000};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = 1;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      exit(0);
    } else if (strcmp(a, "--no-mutants") == 0) {
      o->no_mutants = 1, takes = 0;
    } else if (strcmp(a, "--hostile") == 0) {
      o->hostile = 1, takes = 0;
    } else if (strcmp(a, "--recreate") == 0) {
      o->recreate = 1, takes = 0;
    } else if (!v) {
      fprintf(stderr, "keylane-sim: %s needs a value, or is unknown\n%s", a,
              usage);
      return -1;
    } else if (strcmp(a, "--seed") == 0) {
      o->has_seed = 1, o->seed = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--backend") == 0) {
      o->backend = strcmp(v, "pg") == 0 ? SIM_PG : SIM_LMDB;
    } else if (strcmp(a, "--replay") == 0) {
      o->replay = v;
    } else if (strcmp(a, "--mutant") == 0) {
      o->mutant = -1;
      for (int m = 1; m < MUTANTS; m++)
        if (strcmp(v, mutant_names[m]) == 0)
          o->mutant = m;
      if (strcmp(v, "all") == 0)
        o->mutant = MUTANTS;
      if (o->mutant < 0) {
        fprintf(stderr,
                "keylane-sim: no mutant %s: epoch, seen, outbox, "
                "watermark, cache, reserved, nonce, rebuild, aside, update, "
                "sweep, owner, timer_early, timer_twice, timer_copy, "
                "timer_cancel, timer_emit, timer_dead, flight or all\n",
                v);
        return -1;
      }
    } else if (strcmp(a, "--topics") == 0) {
      o->topics = atoi(v);
      if (o->topics < 1 || o->topics > SIM_TOPICS) {
        fprintf(stderr,
                "keylane-sim: --topics %s: the schedules' store holds 1 or "
                "%d topics\n",
                v, SIM_TOPICS);
        return -1;
      }
    } else if (strcmp(a, "--seconds") == 0) {
      o->soak = 1, o->seconds = atof(v);
    } else if (strcmp(a, "--steps") == 0) {
      o->steps = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--lmdb-steps") == 0) {
      o->lmdb_steps = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--pg-steps") == 0) {
      o->pg_steps = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--jobs") == 0) {
      o->jobs = atoi(v) < 1 ? 1 : atoi(v) > 6 ? 6 : atoi(v);
    } else if (strcmp(a, "--mutant-seconds") == 0) {
      o->mutant_seconds = atof(v);
    } else {
      fprintf(stderr, "keylane-sim: unknown option %s\n%s", a, usage);
      return -1;
    }
    i += takes;
  }
  return 0;
}

/* One schedule, printed step by step. */
static int run_one(opts_t *o) {
  uint64_t *words;
  size_t n;
  if (o->replay) {
    if (read_replay(o->replay, o, &words, &n))
      return 2;
  } else {
    n = steps_of(o, o->backend);
    words = malloc(n * sizeof(*words));
    sim_words(o->seed, words, n);
    if (o->mutant > 0 && o->mutant < MUTANTS)
      kl__sim_mutant = o->mutant;
  }
  if (o->backend == SIM_PG && pg_start())
    return 2;
  failure_t f;
  sim_stats_t stats = {0};
  int failed = run_words(o->seed, o->backend, words, n, 1, &stats, &f);
  sim_lmdb_envs_close();
  pg_stop();
  printf("%s: %zu steps\n", failed ? "FAILED" : "passed", n);
  free(words);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  opts_t o;
  setenv("KEYLANE_LOG", "error", 0);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (parse(argc, argv, &o))
    return 2;
  sim_hostile = o.hostile;
  sim_recreate = o.recreate;
  if (o.topics)
    sim_topics = o.topics;
  if (o.has_seed || o.replay)
    return run_one(&o);
  if (o.hostile || o.recreate) /* the mutants hunt with them on anyway */
    return fleet_run(&o);
  if (o.mutant)
    return mutants_run(&o, o.mutant == MUTANTS ? 0 : o.mutant);
  int rc = fleet_run(&o);
  if (rc == 1 || o.soak || o.no_mutants)
    return rc;
  int mrc = mutants_run(&o, 0);
  return mrc ? mrc : rc;
}
