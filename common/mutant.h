/*
 * Test-only switches that each break one rule of keylane, so that the
 * simulator (tests/sim/sim.c) can show that it catches the break:
 * `keylane-sim --mutant NAME` sets one. They exist only in the
 * simulator's build: keylane-sim compiles the files that use them a
 * second time with KL_SIM_MUTANTS defined (tests/CMakeLists.txt); in
 * every other build, libkeylane.so included, KL__MUTANT() is the constant
 * 0, the branches compile away and no mutant symbol exists (test_layout
 * checks the library). Not installed.
 */
#ifndef KEYLANE_COMMON_MUTANT_H
#define KEYLANE_COMMON_MUTANT_H

typedef enum kl__mutant {
  KL__MUTANT_NONE = 0,
  KL__MUTANT_EPOCH,     /* store/lmdb_txn.c: a commit skips the epoch check */
  KL__MUTANT_SEEN,      /* worker/apply.c: an event skips the seen check */
  KL__MUTANT_OUTBOX,    /* store/lmdb_txn.c: a fenced batch's follow-ups are
                           written to the outbox all the same */
  KL__MUTANT_WATERMARK, /* worker/apply.c, worker/lanes_commit.c: a batch
                           goes on past an event that said RETRY, a group
                           commit's watermark passes one waiting to retry */
  KL__MUTANT_CACHE,     /* store/cache.c: the owner cache survives a fence */
  KL__MUTANT_RESERVED,  /* worker/apply.c: a consumed record's `~` id is
                           not checked (issue 33 finding 1) */
  KL__MUTANT_NONCE,     /* store/emit.c: a follow-up's id is its source's
                           place alone, as before the nonce (finding 2) */
  KL__MUTANT_REBUILD,   /* worker/rebuild.c: a rebuild takes any record of a
                           follow-up's place in the log for it, whatever it
                           carries */
  KL__MUTANT_ASIDE,     /* worker/outbox.c: a follow-up whose dead letter
                           Kafka refused is removed all the same, as when
                           letters were cut short (issue 33 finding 3) */
  KL__MUTANT_UPDATE,    /* store/pg_txn.c: a put over a key the owner cache
                           knows is written whatever the row holds now, as
                           before issue 39 (finding 1) */
  KL__MUTANT_SWEEP,     /* store/lmdb_sweep.c, store/pg_sweep.c: a topic's
                           sweep removes every topic's expired ids by its
                           own retention, as before issue 39's sweep fix */
  KL__MUTANT_OWNER,     /* store/store.c: a worker's take neither records
                           nor compares the topic's owner (its Kafka
                           cluster and group), as before issue 39's second
                           attack (HIGH-2, LOW-7) */

  /* worker/apply.c: a firing record runs its timer whatever its
   * timestamp, before its time too (issue 36) */
  KL__MUTANT_TIMER_EARLY,
  /* worker/apply.c: a timer's run leaves the timer in the store, so that
   * it fires again (issue 36) */
  KL__MUTANT_TIMER_TWICE,
  /* worker/apply.c: a record without `nb` of an id that waits as a timer
   * runs at once, as before the timer's mark (issue 36 H1) */
  KL__MUTANT_TIMER_COPY,
  /* store/store.c: kl_txn_cancel() answers KL_OK and leaves the timer, so
   * that a cancelled timer fires all the same (issue 36) */
  KL__MUTANT_TIMER_CANCEL,
  /* worker/outbox.c: a delayed follow-up (kl_txn_emit_opts()) is published
   * without its not_before, so that it is applied when read (issue 36) */
  KL__MUTANT_TIMER_EMIT,
  /* worker/apply.c: the dead letter of a firing record leaves its timer,
   * which a rebuild takes where the fleet did not (issue 36) */
  KL__MUTANT_TIMER_DEAD,
  /* worker/lanes.c: a lane whose group commit is in flight runs its next
   * events, whose reads miss the writes in flight (issue 37) */
  KL__MUTANT_FLIGHT,
} kl__mutant_t;

#ifdef KL_SIM_MUTANTS
/** The one switched on (a kl__mutant_t); defined in common/mutant.c, which
 *  only keylane-sim links. A plain int: read on the paths it breaks, never
 *  locked. */
extern int kl__sim_mutant;
/** Nonzero when mutant @p m is switched on. */
#define KL__MUTANT(m) (kl__sim_mutant == (m))
#else
#define KL__MUTANT(m) 0
#endif

#endif
