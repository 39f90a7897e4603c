/*
 * keylane-bench all [--rounds N] [--no-pg] [--compare FILE] [--json]
 *
 * Runs the benchmarks whose ratios have targets (produce, worker, gateway
 * with JSON and msgpack bodies, worker --store pg), each as a child
 * keylane-bench with --json, and prints every ratio with its target and the
 * spread of its rounds. With
 * --compare FILE (the --json output of an earlier run) each ratio is set
 * beside the one in FILE: a change larger than the noise of either run
 * (the wider spread of their rounds, at least 5 %) is "regressed" or
 * "improved", anything less "same". Regressions are listed last and in
 * the JSON's "regressed"; the exit code stays 0: a benchmark prints
 * figures, it does not judge them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define KL_BA_NAME "all"

extern char **environ;

/* The runs, each a keylane-bench command line after the name. */
static const struct {
  const char *bench;
  const char *flag, *value; /* one flag and its value, or NULL */
} kl_ba_runs[] = {
    {"produce", NULL, NULL},          {"worker", NULL, NULL},
    {"gateway", NULL, NULL},          {"worker", "--store", "pg"},
    {"gateway", "--body", "msgpack"},
};
#define KL_BA_NRUNS (sizeof(kl_ba_runs) / sizeof(kl_ba_runs[0]))
#define KL_BA_PG 3 /* the run --no-pg leaves out */

/* The figures, each a ratio of one run's JSON with its rounds. */
static const struct {
  const char *name;
  size_t run;
  const char *field, *rounds_field;
  double target;
} kl_ba_figures[] = {
    {"produce", 0, "ratio", "ratio_rounds", 0.90},
    {"worker", 1, "ratio", "ratio_rounds", KL_BENCH_TARGET_WORKER},
    {"worker_e2e", 1, "ratio_e2e", "ratio_e2e_rounds", 0.30},
    {"gateway", 2, "ratio", "ratio_rounds", 0.35},
    {"gateway_msgpack", 4, "ratio", "ratio_rounds", 0.35},
    {"worker_pg", 3, "ratio", "ratio_rounds", KL_BENCH_TARGET_WORKER_PG},
};
#define KL_BA_NFIGURES (sizeof(kl_ba_figures) / sizeof(kl_ba_figures[0]))

/* Runs keylane-bench BENCH --json [FLAG VALUE] [--rounds N] and parses
 * the one JSON object it prints; its stderr (progress, logs) passes
 * through. @returns the object, or NULL (said on stderr). */
static json_t *kl_ba_run(const char *bench, const char *flag, const char *value,
                         const char *rounds) {
  char *argv[8];
  int argc = 0;
  argv[argc++] = "keylane-bench";
  argv[argc++] = (char *)bench;
  argv[argc++] = "--json";
  if (flag) {
    argv[argc++] = (char *)flag;
    argv[argc++] = (char *)value;
  }
  if (rounds) {
    argv[argc++] = "--rounds";
    argv[argc++] = (char *)rounds;
  }
  argv[argc] = NULL;
  int out[2];
  if (pipe(out)) {
    fprintf(stderr, "keylane-bench all: pipe: %s\n", strerror(errno));
    return NULL;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc) {
    close(out[0]);
    fprintf(stderr, "keylane-bench all: cannot start keylane-bench %s: %s\n",
            bench, strerror(rc));
    return NULL;
  }
  json_error_t jerr;
  FILE *f = fdopen(out[0], "r");
  json_t *o = f ? json_loadf(f, JSON_DISABLE_EOF_CHECK, &jerr) : NULL;
  if (f)
    fclose(f);
  else
    close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !json_is_object(o)) {
    fprintf(stderr,
            "keylane-bench all: keylane-bench %s%s%s%s%s failed (exit "
            "%d)%s\n",
            bench, flag ? " " : "", flag ? flag : "", flag ? " " : "",
            flag ? value : "", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            o ? "" : ": it printed no JSON object");
    json_decref(o);
    return NULL;
  }
  return o;
}

/* A figure of @p run: its median and spread; -1 when the run lacks it. */
static int kl_ba_figure(const json_t *run, const char *field,
                        const char *rounds_field, kl_bench_figure_t *out,
                        json_t **rounds) {
  const json_t *v = json_object_get(run, field);
  json_t *a = json_object_get(run, rounds_field);
  if (!json_is_number(v) || !json_is_array(a))
    return -1;
  double r[KL_BENCH_ROUNDS_MAX];
  int n = 0;
  size_t i;
  json_t *x;
  json_array_foreach(a, i, x) {
    if (n < KL_BENCH_ROUNDS_MAX && json_is_number(x))
      r[n++] = json_number_value(x);
  }
  out->value = json_number_value(v);
  out->spread = kl_bench_spread(r, n);
  *rounds = json_incref(a);
  return 0;
}

/* A figure of the earlier run in @p before ("figures" of an `all --json`
 * output). @returns 0, or -1 when it has none of that name. */
static int kl_ba_before(const json_t *before, const char *name,
                        kl_bench_figure_t *out) {
  const json_t *f = json_object_get(json_object_get(before, "figures"), name);
  const json_t *v = json_object_get(f, "value"),
               *s = json_object_get(f, "spread");
  if (!json_is_number(v) || !json_is_number(s))
    return -1;
  out->value = json_number_value(v);
  out->spread = json_number_value(s);
  return 0;
}

static void kl_ba_help(void) {
  printf(
      "usage: keylane-bench all [--rounds N] [--no-pg] [--compare FILE] "
      "[--json]\n\n"
      "Runs produce, worker, gateway (JSON and msgpack bodies) and\n"
      "worker --store pg (each as\n"
      "keylane-bench NAME --json, 3 rounds unless --rounds) and prints\n"
      "every ratio with its target and the spread of its rounds\n"
      "((max - min) / median: the run's noise).\n\n"
      "flags:\n"
      "  --rounds N      rounds of each benchmark (default: each one's own)\n"
      "  --no-pg         leave out worker --store pg (no PostgreSQL here)\n"
      "  --compare FILE  the --json output of an earlier run: each ratio is\n"
      "                  set beside it, and a change beyond the noise of\n"
      "                  either run (at least 5 %%) is 'regressed' or\n"
      "                  'improved'; the exit code stays 0\n"
      "  --json          one JSON object: figures {NAME: {value, target,\n"
      "                  rounds, spread}}, and with --compare, compare\n"
      "                  {NAME: {before, change, noise, verdict}} and\n"
      "                  regressed [NAME...]\n");
}

int kl_bench_all(int argc, char **argv) {
  int64_t rounds = 0;
  int json = 0, no_pg = 0;
  const char *compare = NULL;
  const kl_bench_flag_t flags[] = {
      {.name = "rounds", .max = KL_BENCH_ROUNDS_MAX, .out = &rounds},
      {.name = "no-pg", .on = &no_pg},
      {.name = "compare", .text = &compare},
      {0},
  };
  int parsed = kl_bench_flags(KL_BA_NAME, argc, argv, flags, &json, kl_ba_help);
  if (parsed)
    return parsed < 0 ? 0 : parsed;
  json_t *before = NULL;
  if (compare) {
    json_error_t jerr;
    before = json_load_file(compare, 0, &jerr);
    if (!json_is_object(json_object_get(before, "figures"))) {
      fprintf(stderr,
              "keylane-bench all: --compare %s: %s; give the output of an "
              "earlier `keylane-bench all --json`\n",
              compare, before ? "it has no \"figures\" object" : jerr.text);
      json_decref(before);
      return 2;
    }
  }
  char rounds_arg[24];
  snprintf(rounds_arg, sizeof(rounds_arg), "%lld", (long long)rounds);
  json_t *runs[KL_BA_NRUNS] = {0};
  for (size_t i = 0; i < KL_BA_NRUNS; i++) {
    if (no_pg && i == KL_BA_PG)
      continue;
    const char *flag = kl_ba_runs[i].flag;
    fprintf(stderr, "keylane-bench all: %zu/%zu: %s%s%s%s%s\n", i + 1,
            KL_BA_NRUNS, kl_ba_runs[i].bench, flag ? " " : "", flag ? flag : "",
            flag ? " " : "", flag ? kl_ba_runs[i].value : "");
    runs[i] = kl_ba_run(kl_ba_runs[i].bench, flag, kl_ba_runs[i].value,
                        rounds ? rounds_arg : NULL);
  }

  char date[32];
  time_t t = time(NULL);
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  json_t *figures = json_object(), *cmp = json_object(),
         *regressed = json_array();
  int failed = 0;
  if (!json)
    printf("%-15s %7s %7s %7s%s\n", "ratio", "now", "target", "spread",
           before ? "  before  change   noise  verdict" : "");
  for (size_t i = 0; i < KL_BA_NFIGURES; i++) {
    size_t r = kl_ba_figures[i].run;
    if (no_pg && r == KL_BA_PG)
      continue;
    kl_bench_figure_t now, was;
    json_t *list = NULL;
    if (!runs[r] || kl_ba_figure(runs[r], kl_ba_figures[i].field,
                                 kl_ba_figures[i].rounds_field, &now, &list)) {
      failed = 1;
      if (!json)
        printf("%-15s  (its run failed)\n", kl_ba_figures[i].name);
      continue;
    }
    json_object_set_new(figures, kl_ba_figures[i].name,
                        json_pack("{s:f, s:f, s:o, s:f}", "value", now.value,
                                  "target", kl_ba_figures[i].target, "rounds",
                                  list, "spread", now.spread));
    if (!json)
      printf("%-15s %7.3f %7.2f %6.0f%%", kl_ba_figures[i].name, now.value,
             kl_ba_figures[i].target, 100 * now.spread);
    if (before && !kl_ba_before(before, kl_ba_figures[i].name, &was)) {
      double change, noise;
      kl_bench_verdict_t v = kl_bench_compare(&was, &now, &change, &noise);
      json_object_set_new(cmp, kl_ba_figures[i].name,
                          json_pack("{s:f, s:f, s:f, s:s}", "before", was.value,
                                    "change", change, "noise", noise, "verdict",
                                    kl_bench_verdict_name(v)));
      if (v == KL_BENCH_REGRESSED)
        json_array_append_new(regressed, json_string(kl_ba_figures[i].name));
      if (!json)
        printf("  %6.3f %+6.0f%% %6.0f%%  %s", was.value, 100 * change,
               100 * noise, kl_bench_verdict_name(v));
    } else if (before && !json) {
      printf("  (not in %s)", compare);
    }
    if (!json)
      printf("\n");
  }
  if (json) {
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:o}", "bench", KL_BA_NAME, "date", date, "cpus",
        (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "figures", figures);
    if (before) {
      json_object_set_new(o, "compare", cmp);
      json_object_set_new(o, "regressed", regressed);
    } else {
      json_decref(cmp);
      json_decref(regressed);
    }
    kl_bench_json(o);
  } else {
    if (before)
      printf("%zu ratio(s) regressed beyond their noise against %s\n",
             json_array_size(regressed), compare);
    json_decref(figures);
    json_decref(cmp);
    json_decref(regressed);
  }
  for (size_t i = 0; i < KL_BA_NRUNS; i++)
    json_decref(runs[i]);
  json_decref(before);
  return failed;
}
