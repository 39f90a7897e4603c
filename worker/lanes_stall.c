/* Stalled partitions (worker/lanes_stall.h). */
#include "worker/lanes_stall.h"

#include <inttypes.h>

#include "common/internal.h"
#include "common/log.h"
#include "keylane/event.h"
#include "worker/lanes_internal.h"

#define KL_COMP "worker"

/* Whether the lane holds records and nothing moved since the last watch. */
static int lane_unmoved(const kl__lane_t *lane) {
  return lane->state == KL__LANE_OWNED && lane->ring_count > 0 &&
         lane->watermark == lane->stall_watermark &&
         lane->gen == lane->stall_gen;
}

static void lane_watch(kl__lane_t *lane, int64_t now_ns, int64_t stall_ms) {
  if (!lane_unmoved(lane)) {
    if (lane->stalled)
      KL_LOG_I(KL_COMP, "partition=%" PRId32 " moves again: watermark=%" PRId64,
               lane->partition, lane->watermark);
    lane->stall_watermark = lane->watermark;
    lane->stall_gen = lane->gen;
    lane->stall_since_ns = now_ns;
    lane->stalled = 0;
    return;
  }
  if (!lane->stalled && now_ns - lane->stall_since_ns >= stall_ms * 1000000) {
    lane->stalled = 1;
    KL_LOG_E(KL_COMP,
             "partition=%" PRId32 " is stalled: it holds %zu "
             "records and its watermark (%" PRId64
             ") has not moved for %" PRId64
             " ms (worker.stall.ms); the log above says what fails",
             lane->partition, lane->ring_count, lane->watermark, stall_ms);
  }
}

void kl__lanes_watch_stalls(kl__lanes_t *lanes, int64_t now_ns,
                            int64_t stall_ms) {
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; p < lanes->count; p++)
    if (lanes->lanes[p])
      lane_watch(lanes->lanes[p], now_ns, stall_ms);
  pthread_mutex_unlock(&lanes->mu);
}

/* The envelope ts of the lane's first record not yet committed: what
 * keylane_worker_lag_seconds measures. A record that does not decode has
 * no ts; the next one that does stands for it, among the first
 * KL_AGE_SCAN (the lanes' mutex is held: a window of undecodable records
 * must not make a scrape decode all of it). */
#define KL_AGE_SCAN 64
static int64_t lane_oldest_ts(const kl__lane_t *lane, kl_decoder_t *decoder) {
  size_t n = lane->ring_count < KL_AGE_SCAN ? lane->ring_count : KL_AGE_SCAN;
  for (size_t i = 0; decoder && i < n; i++) {
    const kl__slot_t *slot = kl__lane_at(lane, i);
    const rd_kafka_message_t *m = slot->msg;
    kl_event_t event;
    if (slot->committed || !m ||
        kl_event_decode(decoder, m->key, m->key ? m->key_len : 0, m->payload,
                        m->len, &event) != KL_OK)
      continue;
    return event.ts;
  }
  return 0;
}

size_t kl__lanes_stalls(kl__lanes_t *lanes, int64_t stall_ms, kl__stall_t *out,
                        size_t max) {
  size_t n = 0;
  int64_t now = kl__mono_ns();
  kl_decoder_t *decoder = kl_decoder_new();
  pthread_mutex_lock(&lanes->mu);
  for (int32_t p = 0; p < lanes->count; p++) {
    kl__lane_t *lane = lanes->lanes[p];
    if (!lane || lane->state != KL__LANE_OWNED)
      continue;
    /* Stalled also when the watch has not run: a poll thread stuck in
     * the store watches nothing, and its lanes are the ones to report. */
    int stalled =
        lane->stalled || (stall_ms > 0 && lane_unmoved(lane) &&
                          now - lane->stall_since_ns >= stall_ms * 1000000);
    if (n < max)
      out[n] = (kl__stall_t){lane->partition,
                             stalled,
                             (now - lane->stall_since_ns) / 1000000,
                             lane->ring_count,
                             lane->watermark,
                             lane_oldest_ts(lane, decoder),
                             lane->waiting.n,
                             lane->kafka_watermark,
                             lane->running,
                             lane->outbox_held,
                             lane->last_commit_ms,
                             lane->epoch};
    n++;
  }
  pthread_mutex_unlock(&lanes->mu);
  kl_decoder_destroy(decoder);
  return n;
}

void kl__failing_note(kl__failing_t *f, const char *text) {
  if (!f->n++)
    f->since_ns = kl__mono_ns();
  snprintf(f->why, sizeof(f->why), "%.480s", text);
}

static uint64_t failing_read(kl__lanes_t *lanes, const kl__failing_t *f,
                             int64_t *for_ms, char *why, size_t size) {
  pthread_mutex_lock(&lanes->mu);
  uint64_t n = f->n;
  *for_ms = n ? (kl__mono_ns() - f->since_ns) / 1000000 : 0;
  snprintf(why, size, "%s", n ? f->why : "");
  pthread_mutex_unlock(&lanes->mu);
  return n;
}

uint64_t kl__lanes_commits_failing(kl__lanes_t *lanes, int64_t *for_ms,
                                   char *why, size_t size) {
  return failing_read(lanes, &lanes->commits_failing, for_ms, why, size);
}

uint64_t kl__lanes_store_failing(kl__lanes_t *lanes, int64_t *for_ms, char *why,
                                 size_t size) {
  return failing_read(lanes, &lanes->runs_failing, for_ms, why, size);
}
