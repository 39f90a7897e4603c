/* The simulator's test-only switch (common/mutant.h). */
#include "common/mutant.h"

int kl__sim_mutant = KL__MUTANT_NONE;
