#include "support/skips.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char kl_need[64], kl_why[2048];

/* Whether the comma-separated @p list names @p need exactly. */
static int kl_t_listed(const char *list, const char *need) {
  size_t len = strlen(need);
  while (list && *list) {
    if (strncmp(list, need, len) == 0 && (list[len] == ',' || !list[len]))
      return 1;
    list = strchr(list, ',');
    if (list)
      list++;
  }
  return 0;
}

void kl_t_missing(const char *need, const char *why) {
  if (kl_need[0] || !kl_t_listed(getenv("KEYLANE_TEST_REQUIRE"), need))
    return;
  snprintf(kl_need, sizeof(kl_need), "%s", need);
  snprintf(kl_why, sizeof(kl_why), "%s", why);
}

const char *kl_t_missing_required(const char **why) {
  *why = kl_why;
  return kl_need[0] ? kl_need : NULL;
}
