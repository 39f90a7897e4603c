/* The simulator's test-only switch (common/mutant.h): built into
 * keylane-sim only, never into the library. */
#include "common/mutant.h"

int kl__sim_mutant = KL__MUTANT_NONE;
