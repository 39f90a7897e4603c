#include "support/paused_owner.h"

void kl_t_pause_hook(void *opaque, const char *topic, int32_t partition,
                     uint64_t epoch) {
  kl_t_pause_t *p = opaque;
  if (!p->armed)
    return;
  p->armed = 0;
  kl_partition_state_t at, now;
  kl_store_partition(p->store, topic, partition, &at);
  for (int i = 0; i < 600 && !p->saw_new_owner; i++) {
    kl_t_sleep_ms(50);
    p->saw_new_owner =
        kl_store_partition(p->store, topic, partition, &now) == KL_OK &&
        now.epoch > epoch && now.watermark > at.watermark;
  }
  if (p->stop)
    kl_worker_stop(p->stop);
}

uint64_t kl_t_worker_fenced(kl_t_worker_t *tw, int ms) {
  kl_worker_stats_t st;
  kl_worker_stats(tw->worker, &st, sizeof(st));
  for (int waited = 0; !st.fenced && waited < ms; waited += 50) {
    kl_t_sleep_ms(50);
    kl_worker_stats(tw->worker, &st, sizeof(st));
  }
  return st.fenced;
}
