/*
 * libFuzzer target for the one parser of numbers, durations and sizes
 * (common/units.h). The first byte picks the kind and a range; the rest is
 * the text. Whatever the text:
 * - a value accepted lies in the range asked for, and the text was digits
 *   and at most a unit;
 * - a refusal leaves the output alone and says why, naming the flag;
 * - a value accepted, written back with kl__units_format(), reads back as
 *   the same value (what the error messages print is what the parser takes).
 * kl__units_digits() gets the raw bytes too (lengths, not NULs, bound it).
 * The same text goes to the positions of replay and inspect (--from, --to:
 * offsets, times, @-DURATION, built on this parser) and to partition lists:
 * a position accepted is never negative and reads back from its printed
 * form; a partition list accepted is sorted, unique and in range.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kafka_pos.h"
#include "tests/fuzz/fuzz.h"
#include "common/units.h"

static const int64_t kl_bounds[][2] = {
    {0, INT64_MAX}, {1, 86400000}, {1, 100000}, {1 << 20, INT64_MAX},
    {100, 3600000}, {0, 0},        {7, 7},      {1, INT64_MAX / 2}};

static void kl_check_positions(const char *text) {
  const int64_t now = 1700000000000LL;
  kl__pos_t pos, again;
  if (kl__pos_parse(text, now, &pos) == KL_OK) {
    CHECK(pos.kind >= KL__POS_OFFSET && pos.kind <= KL__POS_TIME);
    CHECK(pos.value >= 0);
    char back[64];
    CHECK(kl__pos_parse(kl__pos_format(&pos, back, sizeof(back)), now,
                        &again) == KL_OK);
    CHECK(again.kind == pos.kind && again.value == pos.value);
  }
  int32_t *list = NULL;
  size_t count = 0;
  if (kl__pos_partitions(text, 8, &list, &count) == KL_OK) {
    for (size_t i = 0; i < count; i++)
      CHECK(list[i] >= 0 && list[i] < 8 && (i == 0 || list[i] > list[i - 1]));
    free(list);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  kl__units_kind_t kind = (kl__units_kind_t)(data[0] & 3);
  const int64_t *range = kl_bounds[(data[0] >> 2) & 7];
  char *text = malloc(size);
  CHECK(text);
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  int64_t v = -12345, digits = -1;
  kl_err_t err = kl__units_parse("--flag", text, kind, range[0], range[1], &v);
  if (err == KL_OK) {
    CHECK(v >= range[0] && v <= range[1]);
    CHECK(text[0] >= '0' && text[0] <= '9');
    char back[64];
    int64_t again = -1;
    kl__units_format(kind, v, back, sizeof(back));
    CHECK(kl__units_parse("--flag", back, kind, range[0], range[1], &again) ==
          KL_OK);
    CHECK(again == v);
  } else {
    CHECK(err == KL_EINVAL);
    CHECK(v == -12345);
    CHECK(strstr(kl_err_detail(), "--flag") != NULL);
  }
  if (kl__units_digits((const char *)data + 1, size - 1, &digits) == 0)
    CHECK(digits >= 0); /* leading zeros may make it long */
  kl_check_positions(text);
  free(text);
  return 0;
}
