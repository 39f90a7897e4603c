/*
 * keylane worker's stop at SIGTERM, mid-batch, on a real broker: an exec
 * handler that takes seconds holds the batch while the signal arrives.
 *  - One SIGTERM: the worker takes no new record, lets the handler finish,
 *    commits the batch and exits 0 (a static member, it stays in the
 *    group).
 *  - A second SIGTERM, or worker.shutdown.timeout, aborts: exit 1 at once,
 *    the batch uncommitted; the worker started again applies the event,
 *    which the handler then saw twice and the store applied once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/cluster.h"
#include "support/spawn.h"
#include "support/support.h"

#define PARTS 2

/* The handler: notes each event's id in DIR/ran, and while DIR/slow holds
 * a number of seconds, takes that long to answer (it gives up when its
 * worker is gone). */
static const char handler_py[] =
    "import json, os, sys, time\n"
    "d, parent = sys.argv[1], os.getppid()\n"
    "for line in sys.stdin:\n"
    "    ev = json.loads(line)\n"
    "    with open(os.path.join(d, 'ran'), 'a') as f:\n"
    "        f.write(ev['id'] + '\\n')\n"
    "    try:\n"
    "        end = time.time() + float(open(os.path.join(d, 'slow')).read())\n"
    "    except OSError:\n"
    "        end = 0\n"
    "    while time.time() < end:\n"
    "        if os.getppid() != parent:\n"
    "            sys.exit(0)\n"
    "        time.sleep(0.05)\n"
    "    print(json.dumps({'seq': ev['seq'], 'status': 'ok'}), flush=True)\n";

typedef struct stage {
  kl_t_cluster_t *cluster;
  const char *boot, *topic, *group;
  char dir[64], handler[256];
  kl_store_t *store;
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
} stage_t;

static void write_file(const stage_t *s, const char *name, const char *text) {
  char path[128];
  snprintf(path, sizeof(path), "%s/%s", s->dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

static void stage_new(stage_t *s, const char *name) {
  memset(s, 0, sizeof(*s));
  assert_int_equal(kl_t_cluster_new(1, name, PARTS, &s->cluster), KL_OK);
  s->boot = kl_t_bootstrap(s->cluster);
  s->topic = kl_t_topic(s->cluster);
  s->group = kl_t_group(s->cluster, name);
  kl_t_tmpdir(s->dir);
  assert_int_equal(kl_store_open(s->dir, NULL, &s->store), KL_OK);
  s->gen = kl__ledger_gen_new(10, PARTS, 5);
  s->producer = kl_t_producer(s->boot, s->gen);
  write_file(s, "handler.py", handler_py);
  snprintf(s->handler, sizeof(s->handler), "exec:python3 %s/handler.py %s",
           s->dir, s->dir);
}

static void stage_destroy(stage_t *s) {
  kl_producer_destroy(s->producer);
  kl__ledger_gen_destroy(s->gen);
  kl_store_destroy(s->store);
  kl_t_cluster_destroy(s->cluster);
  kl_t_rmrf(s->dir);
}

/* Worker number @p i, a static member; owns every partition on return. */
static pid_t start(const stage_t *s, int i, const char *shutdown_timeout) {
  const char *argv[] = {kl_t_bin(),
                        "worker",
                        "-b",
                        s->boot,
                        "-t",
                        s->topic,
                        "-g",
                        s->group,
                        "--store",
                        s->dir,
                        "--handler",
                        s->handler,
                        "--instance-id",
                        "graceful",
                        "--shutdown-timeout",
                        shutdown_timeout,
                        "-X",
                        "worker.retention.check=warn",
                        NULL};
  pid_t pid = kl_t_spawn_worker(s->dir, i, argv);
  uint64_t epochs[PARTS] = {0};
  int owned = 0;
  for (int t = 0; t < 600 && owned < PARTS; t++) {
    kl_t_sleep_ms(100);
    kl_t_log_owned(s->dir, i, epochs, PARTS);
    owned = (epochs[0] != 0) + (epochs[1] != 0);
  }
  assert_int_equal(owned, PARTS);
  return pid;
}

/* Lines of DIR/ran: the handler calls so far. */
static int handler_calls(const stage_t *s) {
  char path[128], line[128];
  snprintf(path, sizeof(path), "%s/ran", s->dir);
  FILE *f = fopen(path, "r");
  int n = 0;
  while (f && fgets(line, sizeof(line), f))
    n++;
  if (f)
    fclose(f);
  return n;
}

/* Publishes one event and waits until the handler has it. */
static void publish_one(stage_t *s) {
  int before = handler_calls(s);
  assert_int_equal(kl__ledger_gen_publish(s->gen, s->producer, s->topic),
                   KL_OK);
  assert_int_equal(kl_flush(s->producer, 30000), KL_OK);
  for (int i = 0; i < 300 && handler_calls(s) == before; i++)
    kl_t_sleep_ms(50);
  assert_int_equal(handler_calls(s), before + 1);
}

/* The store's applied (or, with @p dups, duplicate) events. */
static uint64_t applied(const stage_t *s, int dups) {
  uint64_t n = 0;
  for (int p = 0; p < PARTS; p++) {
    kl_partition_state_t st;
    assert_int_equal(kl_store_partition(s->store, s->topic, p, &st), KL_OK);
    n += dups ? st.duplicates : st.applied;
  }
  return n;
}

/* Waits for @p pid; @returns its exit status, and the ms it took. */
static int reap(pid_t pid, int64_t *ms) {
  int64_t t0 = kl__mono_ns();
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  *ms = (kl__mono_ns() - t0) / 1000000;
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static void test_sigterm_mid_batch_commits(void **state) {
  (void)state;
  stage_t s;
  stage_new(&s, "graceful");
  pid_t pid = start(&s, 0, "30s");
  write_file(&s, "slow", "3");
  publish_one(&s);
  kill(pid, SIGTERM);
  /* Published after the signal: the worker takes it no more. */
  assert_int_equal(kl__ledger_gen_publish(s.gen, s.producer, s.topic), KL_OK);
  assert_int_equal(kl_flush(s.producer, 30000), KL_OK);
  int64_t ms;
  assert_int_equal(reap(pid, &ms), 0);
  print_message("exited 0 %" PRId64 " ms after SIGTERM\n", ms);
  assert_true(ms >= 1000 && ms < 20000); /* it waited for the handler */
  assert_int_equal(applied(&s, 0), 1);
  assert_int_equal(handler_calls(&s), 1);
  char line[1024];
  assert_true(kl_t_log_find(s.dir, 0, "SIGTERM: stopping", line, sizeof(line)));
  assert_true(kl_t_log_find(s.dir, 0, "staying in group", line, sizeof(line)));
  stage_destroy(&s);
}

/* After an abort: the event is not applied, and the worker started again
 * applies it once, although the handler sees it twice. */
static void assert_applied_once_after(stage_t *s) {
  assert_int_equal(applied(s, 0), 0);
  char slow[128];
  snprintf(slow, sizeof(slow), "%s/slow", s->dir);
  assert_int_equal(remove(slow), 0);
  pid_t pid = start(s, 1, "30s");
  assert_int_equal(kl__ledger_gen_wait(s->gen, s->store, s->topic, 0, 30000),
                   0);
  kill(pid, SIGTERM);
  int64_t ms;
  assert_int_equal(reap(pid, &ms), 0);
  assert_int_equal(handler_calls(s), 2);
  assert_int_equal(applied(s, 0), 1);
  assert_int_equal(applied(s, 1), 0);
}

static void test_second_sigterm_aborts(void **state) {
  (void)state;
  stage_t s;
  stage_new(&s, "abort");
  pid_t pid = start(&s, 0, "30s");
  write_file(&s, "slow", "20");
  publish_one(&s);
  kill(pid, SIGTERM);
  kl_t_sleep_ms(300);
  kill(pid, SIGTERM);
  int64_t ms;
  assert_int_equal(reap(pid, &ms), 1);
  assert_true(ms < 5000);
  char line[1024];
  assert_true(kl_t_log_find(s.dir, 0,
                            "aborting the stop: a second signal (SIGTERM) "
                            "arrived",
                            line, sizeof(line)));
  assert_non_null(strstr(line, "not committed"));
  assert_applied_once_after(&s);
  stage_destroy(&s);
}

static void test_shutdown_timeout_aborts(void **state) {
  (void)state;
  stage_t s;
  stage_new(&s, "timeout");
  pid_t pid = start(&s, 0, "2s");
  write_file(&s, "slow", "20");
  publish_one(&s);
  kill(pid, SIGTERM);
  int64_t ms;
  assert_int_equal(reap(pid, &ms), 1);
  print_message("exited 1 %" PRId64 " ms after SIGTERM\n", ms);
  assert_true(ms >= 1500 && ms < 10000);
  char line[1024];
  assert_true(kl_t_log_find(s.dir, 0,
                            "aborting the stop: worker.shutdown.timeout "
                            "(2000 ms) passed",
                            line, sizeof(line)));
  assert_applied_once_after(&s);
  stage_destroy(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_mid_batch_commits),
      cmocka_unit_test(test_second_sigterm_aborts),
      cmocka_unit_test(test_shutdown_timeout_aborts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
