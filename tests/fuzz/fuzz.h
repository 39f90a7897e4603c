/* What the fuzz targets share: the entry point and a check that aborts,
 * which libFuzzer reports as a finding with the input that caused it. */
#ifndef KEYLANE_TESTS_FUZZ_H
#define KEYLANE_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "keylane/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__,    \
              #cond, kl_err_detail());                                         \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#endif
