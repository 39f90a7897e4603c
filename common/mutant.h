/*
 * Test-only switches that each break one rule of keylane, so that the
 * simulator (tests/sim/sim.c) can show that it catches the break:
 * `keylane-sim --mutant NAME` sets one. Zero in production: nothing else
 * writes it, and each use site is one `if` on it, commented where it is.
 * Not installed.
 */
#ifndef KEYLANE_COMMON_MUTANT_H
#define KEYLANE_COMMON_MUTANT_H

typedef enum kl__mutant {
  KL__MUTANT_NONE = 0,
  KL__MUTANT_EPOCH,     /* store/lmdb_txn.c: a commit skips the epoch check */
  KL__MUTANT_SEEN,      /* worker/apply.c: an event skips the seen check */
  KL__MUTANT_OUTBOX,    /* store/lmdb_txn.c: a fenced batch's follow-ups are
                           written to the outbox all the same */
  KL__MUTANT_WATERMARK, /* worker/apply.c: a batch goes on past an event
                           that said RETRY, and commits past it */
  KL__MUTANT_CACHE,     /* store/cache.c: the owner cache survives a fence */
} kl__mutant_t;

/** The one switched on (a kl__mutant_t); KL__MUTANT_NONE but in
 *  keylane-sim. A plain int: read on the paths it breaks, never locked. */
extern int kl__sim_mutant;

#endif
