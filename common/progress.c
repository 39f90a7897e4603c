#include "common/progress.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"

#define KL_BAR_WIDTH 24
#define KL_TTY_REDRAW_NS (100 * 1000000LL)

typedef struct kl_row {
  int32_t partition;
  uint64_t done, total;
  int finished;
} kl_row_t;

struct kl__progress {
  FILE *out;
  char *label;
  kl_row_t *rows;
  size_t count;
  int tty;
  int64_t interval_ns;
  int64_t start_ns, last_ns;
  size_t drawn; /* lines of the last terminal draw */
};

kl__progress_t *kl__progress_new(FILE *out, const char *label, size_t rows,
                                 int tty, int interval_ms) {
  kl__progress_t *p = calloc(1, sizeof(*p));
  if (!p)
    return NULL;
  p->rows = calloc(rows ? rows : 1, sizeof(*p->rows));
  p->label = strdup(label);
  if (!p->rows || !p->label) {
    kl__progress_destroy(p);
    return NULL;
  }
  p->out = out;
  p->count = rows;
  p->tty = tty >= 0 ? tty : isatty(fileno(out));
  p->interval_ns = (interval_ms > 0 ? interval_ms : 5000) * 1000000LL;
  p->start_ns = p->last_ns = kl__mono_ns();
  return p;
}

void kl__progress_destroy(kl__progress_t *p) {
  if (!p)
    return;
  free(p->rows);
  free(p->label);
  free(p);
}

void kl__progress_set(kl__progress_t *p, size_t row, int32_t partition,
                      uint64_t done, uint64_t total, int finished) {
  if (row >= p->count)
    return;
  p->rows[row] =
      (kl_row_t){partition, done > total ? total : done, total, finished};
}

const char *kl__progress_eta(double seconds, char *buf, size_t size) {
  if (seconds < 0) {
    snprintf(buf, size, "?");
    return buf;
  }
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else if (s >= 60)
    snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
  else
    snprintf(buf, size, "%lds", s);
  return buf;
}

/* Events per second since the start, and the seconds left at that rate. */
static double progress_rate(const kl__progress_t *p, uint64_t done) {
  double elapsed = (double)(kl__mono_ns() - p->start_ns) / 1e9;
  return elapsed > 0 ? (double)done / elapsed : 0;
}

static double progress_eta(double rate, uint64_t done, uint64_t total) {
  if (done >= total)
    return 0;
  return rate > 0 ? (double)(total - done) / rate : -1;
}

static void rate_text(double rate, char *buf, size_t size) {
  if (rate >= 10000)
    snprintf(buf, size, "%.1fk/s", rate / 1000);
  else
    snprintf(buf, size, "%.0f/s", rate);
}

static void bar_line(kl__progress_t *p, const char *name, uint64_t done,
                     uint64_t total, int finished) {
  char bar[KL_BAR_WIDTH + 1], eta[32], rate[32];
  size_t fill = total ? (size_t)(done * KL_BAR_WIDTH / total) : KL_BAR_WIDTH;
  for (size_t i = 0; i < KL_BAR_WIDTH; i++)
    bar[i] = i < fill ? '#' : '-';
  bar[KL_BAR_WIDTH] = '\0';
  double r = progress_rate(p, done);
  rate_text(r, rate, sizeof(rate));
  unsigned pct = total ? (unsigned)(done * 100 / total) : 100;
  fprintf(p->out,
          "\r\033[2K%-6s [%s] %3u%%  %" PRIu64 "/%" PRIu64 "  %s  %s%s\n", name,
          bar, pct, done, total, rate, finished ? "done" : "ETA ",
          finished ? ""
                   : kl__progress_eta(progress_eta(r, done, total), eta,
                                      sizeof(eta)));
}

static void progress_totals(const kl__progress_t *p, uint64_t *done,
                            uint64_t *total, size_t *finished) {
  *done = *total = 0;
  *finished = 0;
  for (size_t i = 0; i < p->count; i++) {
    *done += p->rows[i].done;
    *total += p->rows[i].total;
    *finished += p->rows[i].finished != 0;
  }
}

static void draw_tty(kl__progress_t *p) {
  if (p->drawn)
    fprintf(p->out, "\033[%zuA", p->drawn);
  size_t shown = 0;
  /* Running rows first: those are the ones whose ETA matters. */
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < p->count && shown < KL__PROGRESS_ROWS_MAX; i++) {
      const kl_row_t *r = &p->rows[i];
      if ((r->finished != 0) != pass)
        continue;
      char name[16];
      snprintf(name, sizeof(name), "p%d", (int)r->partition);
      bar_line(p, name, r->done, r->total, r->finished);
      shown++;
    }
  uint64_t done, total;
  size_t finished;
  progress_totals(p, &done, &total, &finished);
  bar_line(p, "total", done, total, finished == p->count);
  p->drawn = shown + 1;
  fflush(p->out);
}

static void draw_plain(kl__progress_t *p, int final) {
  uint64_t done, total;
  size_t finished;
  progress_totals(p, &done, &total, &finished);
  double r = progress_rate(p, done);
  char rate[32], eta[32], slow[96] = "";
  rate_text(r, rate, sizeof(rate));
  /* The partition that finishes last decides when the work ends; one
   * with no rate yet (ETA -1) is the slowest of all. */
  double worst = 0;
  for (size_t i = 0; i < p->count && worst >= 0; i++) {
    const kl_row_t *row = &p->rows[i];
    double e = row->finished ? 0
                             : progress_eta(progress_rate(p, row->done),
                                            row->done, row->total);
    if (e < 0 || e > worst) {
      worst = e;
      snprintf(slow, sizeof(slow), ", slowest p%d at %" PRIu64 "/%" PRIu64,
               (int)row->partition, row->done, row->total);
    }
  }
  unsigned pct = total ? (unsigned)(done * 100 / total) : 100;
  if (final)
    fprintf(p->out,
            "%s: finished %" PRIu64 "/%" PRIu64 " events (%u%%) in %s, %s, "
            "%zu/%zu partitions done\n",
            p->label, done, total, pct,
            kl__progress_eta((double)(kl__mono_ns() - p->start_ns) / 1e9, eta,
                             sizeof(eta)),
            rate, finished, p->count);
  else
    fprintf(p->out,
            "%s: %" PRIu64 "/%" PRIu64 " events (%u%%), %s, ETA %s, %zu/%zu "
            "partitions done%s\n",
            p->label, done, total, pct, rate,
            kl__progress_eta(worst, eta, sizeof(eta)), finished, p->count,
            slow);
  fflush(p->out);
}

void kl__progress_draw(kl__progress_t *p, int force) {
  int64_t now = kl__mono_ns();
  int64_t every = p->tty ? KL_TTY_REDRAW_NS : p->interval_ns;
  if (!force && now - p->last_ns < every)
    return;
  p->last_ns = now;
  if (p->tty)
    draw_tty(p);
  else
    draw_plain(p, 0);
}

void kl__progress_finish(kl__progress_t *p) {
  if (p->tty)
    draw_tty(p);
  else
    draw_plain(p, 1);
}
