/*
 * keylane-bench fsync: the floor under a durable store commit.
 *
 * A durable LMDB commit (store.durability=full) writes its pages and
 * fdatasync()s them, then writes the meta page through a descriptor
 * opened O_DSYNC: two synchronous writes. No keylane setting makes a
 * durable commit faster than this file system's sync, so the latency
 * bench's p99 cannot go below this one's. It writes --size bytes at a
 * rotating offset of a file in --dir (default: where the latency bench's
 * store lives, /tmp) and fdatasync()s, --count times, and prints
 * p50/p99/p999/max of one write+fdatasync and of two in a row (an LMDB
 * commit).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define KL_BF_NAME "fsync"
#define KL_BF_SPAN 256 /* offsets it rotates over, in --size units */

typedef struct kl_bf_opts {
  const char *dir;
  int64_t count, size;
  int json;
} kl_bf_opts_t;

/* Times @p o->count write+fdatasync calls into @p ms. @returns 0, or -1
 * with the failing call printed. */
static int kl_bf_run(const kl_bf_opts_t *o, double *ms) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/keylane-fsync-XXXXXX", o->dir);
  int fd = mkstemp(path);
  if (fd < 0) {
    fprintf(stderr,
            "keylane-bench fsync: cannot create a file in %s: %s; pass "
            "--dir with a writable directory on the store's file system\n",
            o->dir, strerror(errno));
    return -1;
  }
  unlink(path);
  char *buf = calloc(1, (size_t)o->size);
  int rc = buf ? 0 : -1;
  for (int64_t i = 0; !rc && i < o->count; i++) {
    memset(buf, (int)(i & 0xff), (size_t)o->size);
    off_t at = (off_t)((i % KL_BF_SPAN) * o->size);
    double t0 = kl_bench_now();
    if (pwrite(fd, buf, (size_t)o->size, at) != (ssize_t)o->size ||
        fdatasync(fd)) {
      fprintf(stderr, "keylane-bench fsync: write+fdatasync in %s: %s\n",
              o->dir, strerror(errno));
      rc = -1;
    }
    ms[i] = (kl_bench_now() - t0) * 1e3;
  }
  free(buf);
  close(fd);
  return rc;
}

static int kl_bf_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The @p q quantile of @p n sorted values (nearest rank). */
static double kl_bf_quantile(const double *v, int64_t n, double q) {
  int64_t i = (int64_t)(q * (double)n + 0.5);
  return v[i < 1 ? 0 : i > n ? n - 1 : i - 1];
}

static const double kl_bf_q[] = {0.5, 0.99, 0.999, 1.0};
static const char *const kl_bf_qname[] = {"p50", "p99", "p999", "max"};

static void kl_bf_print(const char *what, const double *v, int64_t n) {
  printf("  %-28s", what);
  for (int i = 0; i < 4; i++)
    printf(" %s %7.2f ms", kl_bf_qname[i], kl_bf_quantile(v, n, kl_bf_q[i]));
  printf("\n");
}

static json_t *kl_bf_json(const double *v, int64_t n) {
  json_t *o = json_object();
  for (int i = 0; i < 4; i++) {
    char key[16];
    snprintf(key, sizeof(key), "%s_ms", kl_bf_qname[i]);
    json_object_set_new(o, key, json_real(kl_bf_quantile(v, n, kl_bf_q[i])));
  }
  return o;
}

static void kl_bf_report(const kl_bf_opts_t *o, double *one, double *two) {
  int64_t pairs = o->count / 2;
  for (int64_t i = 0; i < pairs; i++)
    two[i] = one[2 * i] + one[2 * i + 1];
  qsort(one, (size_t)o->count, sizeof(*one), kl_bf_cmp);
  qsort(two, (size_t)pairs, sizeof(*two), kl_bf_cmp);
  if (o->json) {
    json_t *j = json_pack("{sssIsI}", "dir", o->dir, "count",
                          (json_int_t)o->count, "size", (json_int_t)o->size);
    json_object_set_new(j, "write_fdatasync", kl_bf_json(one, o->count));
    json_object_set_new(j, "two_in_a_row", kl_bf_json(two, pairs));
    json_dumpf(j, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(j);
    return;
  }
  printf("fsync, %s, %" PRId64 " x write(%" PRId64 " bytes)+fdatasync\n",
         o->dir, o->count, o->size);
  kl_bf_print("write+fdatasync:", one, o->count);
  kl_bf_print("two in a row (LMDB commit):", two, pairs);
}

static void kl_bf_usage(void) {
  printf("usage: keylane-bench fsync [--dir D] [--count N] [--size B] "
         "[--json]\n\n"
         "Times N (default 2000) write(B bytes, default 4096)+fdatasync\n"
         "calls on a file in D (default /tmp, where the latency bench's\n"
         "store lives) and prints p50/p99/p999/max of one and of two in a\n"
         "row, which a durable LMDB commit (store.durability=full) makes:\n"
         "the floor under a durable commit's latency on that disk.\n");
}

static int kl_bf_opts(int argc, char **argv, kl_bf_opts_t *o) {
  *o = (kl_bf_opts_t){.dir = "/tmp", .count = 2000, .size = 4096};
  const kl_bench_flag_t flags[] = {
      {.name = "dir", .text = &o->dir},
      {.name = "count", .max = 10000000, .out = &o->count},
      {.name = "size", .max = 1 << 24, .out = &o->size},
      {0}};
  int rc = kl_bench_flags(KL_BF_NAME, argc, argv, flags, &o->json, kl_bf_usage);
  if (rc < 0)
    return -1;
  if (!rc && o->count < 2) {
    fprintf(stderr, "keylane-bench fsync: --count takes at least 2\n");
    rc = 2;
  }
  return rc;
}

int kl_bench_fsync(int argc, char **argv) {
  kl_bf_opts_t o;
  int rc = kl_bf_opts(argc, argv, &o);
  if (rc)
    return rc < 0 ? 0 : rc;
  double *one = calloc((size_t)o.count, sizeof(*one));
  double *two = calloc((size_t)o.count / 2, sizeof(*two));
  rc = one && two && kl_bf_run(&o, one) == 0 ? 0 : 1;
  if (!rc)
    kl_bf_report(&o, one, two);
  free(one);
  free(two);
  return rc;
}
