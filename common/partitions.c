/* Partition counts: read, and checked (partitions.h). */
#include "common/partitions.h"

#include "common/internal.h"

kl_err_t kl__partitions_check(const char *topic, int32_t live,
                              const kl__partitions_expect_t *expect) {
  int32_t want = expect->count;
  if (live == want)
    return KL_OK;
  if (expect->configured)
    return kl__err(KL_EPARTITIONS,
                   "topic %s has %d partitions, the fleet expects %d: keys "
                   "would move between owners; recreate the topic or pass "
                   "--partitions %d (%s)",
                   topic, (int)live, (int)want, (int)live, expect->setting);
  return kl__err(KL_EPARTITIONS,
                 "topic %s has %d partitions now, %d when this %s started: "
                 "keys moved between owners, and two workers could own one "
                 "key; stop its producers, let the workers drain it, then "
                 "restart the fleet with --partitions %d (%s=%d)",
                 topic, (int)live, (int)want, expect->who, (int)live,
                 expect->setting, (int)live);
}
