/*
 * libFuzzer target for what the worker's state API (cli/worker_api.h)
 * parses from a request: the query of GET /v1/keys and the KEY of
 * GET /v1/keys/KEY, on common/http.h's percent-decoding and query
 * lookup. The input is the text (cut at its first NUL). Whatever it is:
 * - a query accepted has a limit of 1..KL_WORKER_KEYS_MAX, states within
 *   the three bits, a cursor that is not negative; one refused says why;
 * - a key accepted is 1..KL_KEY_MAX bytes, no longer than its encoding,
 *   and encoded again byte by byte (%XX) it decodes to itself; one
 *   refused says why;
 * - a parameter found lies within the query.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/worker_api.h"
#include "common/http.h"
#include "tests/fuzz/fuzz.h"

static void kl_check_query(const char *text) {
  kl_worker_keys_query_t q;
  char why[256] = "";
  if (kl__worker_api_keys_query(text, &q, why, sizeof(why)) == 0) {
    CHECK(q.limit >= 1 && q.limit <= KL_WORKER_KEYS_MAX);
    CHECK((q.states & ~7u) == 0);
    CHECK(q.from_partition >= 0 && q.from_offset >= 0);
  } else {
    CHECK(why[0] != '\0');
  }
  size_t len = strlen(text), vlen;
  const char *v = kl__http_query(text, "state", &vlen);
  if (v)
    CHECK(v >= text && v + vlen <= text + len);
}

static void kl_check_key(const char *text) {
  static char out[3 * KL_KEY_MAX], again[3 * KL_KEY_MAX];
  char why[256] = "";
  long n = kl__worker_api_key(text, out, why, sizeof(why));
  if (n < 0) {
    CHECK(why[0] != '\0');
    return;
  }
  CHECK(n >= 1 && n <= KL_KEY_MAX && (size_t)n <= strlen(text));
  static char enc[3 * KL_KEY_MAX + 1];
  for (long i = 0; i < n; i++)
    snprintf(enc + 3 * i, 4, "%%%02X", (unsigned char)out[i]);
  CHECK(kl__http_pct_decode(enc, 3 * (size_t)n, again) == n);
  CHECK(memcmp(out, again, (size_t)n) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  CHECK(text != NULL);
  memcpy(text, data, size);
  text[size] = '\0';
  kl_check_query(text);
  kl_check_key(text);
  free(text);
  return 0;
}
