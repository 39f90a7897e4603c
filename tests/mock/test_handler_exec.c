/*
 * The exec handler (handlers/exec.h): a child that answers ok, one
 * that crashes, one that hangs past the timeout, one that answers garbage
 * or too long a line, driven directly; and a worker on the embedded
 * cluster whose child crashes mid-stream, with every event applied once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/internal.h"
#include "support/cluster.h"
#include "support/support.h"
#include "worker/checks.h"
#include "handlers/exec.h"
#include "handlers/exec_line.h"
#include "store/outbox_rec.h"
#include "worker/replay.h"
#include "store/store_internal.h"
#include "store/timers.h"

static const kl_event_t kl_event = {.key = "acct-1",
                                    .key_len = 6,
                                    .id = "id-1",
                                    .id_len = 4,
                                    .type = "credit",
                                    .type_len = 6,
                                    .ts = 1700000000000,
                                    .payload = "\x81\xa6"
                                               "amount"
                                               "\x05",
                                    .payload_len = 9};
static const kl_fence_t kl_fence = {"events", 3, 7, 42};

static kl__exec_t *kl_exec(const char *command, int timeout_ms) {
  kl__exec_t *exec;
  assert_int_equal(kl__exec_new(command, &exec), KL_OK);
  kl__exec_set_timeout_ms(exec, timeout_ms);
  return exec;
}

static kl_handler_result_t kl_call(kl__exec_t *exec, char *err, size_t size) {
  err[0] = '\0';
  return kl__exec_handler(exec, &kl_event, &kl_fence, NULL, err, size);
}

static void test_ok_and_the_line(void **state) {
  char dir[64], cmd[256], path[128], err[256];
  kl_t_tmpdir(dir);
  snprintf(path, sizeof(path), "%s/lines", dir);
  snprintf(cmd, sizeof(cmd),
           "while read -r l; do printf '%%s\\n' \"$l\" >> "
           "%s; echo '{\"status\":\"ok\"}'; done",
           path);
  kl__exec_t *exec = kl_exec(cmd, 5000);
  for (int i = 0; i < 3; i++)
    assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl__exec_starts(exec), 1);
  kl__exec_destroy(exec);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1024];
  assert_non_null(fgets(line, sizeof(line), f));
  fclose(f);
  const char *want[] = {"\"key\":\"acct-1\"",  "\"id\":\"id-1\"",
                        "\"type\":\"credit\"", "\"ts\":1700000000000",
                        "\"partition\":3",     "\"offset\":42",
                        "\"epoch\":7",         "\"payload\":{\"amount\":5}",
                        "\"topic\":\"events\""};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (!strstr(line, want[i]))
      fail_msg("%s not in %s", want[i], line);
  kl_t_rmrf(dir);
}

/* A child holds its stdin, stdout and stderr and no other descriptor of
 * its worker's: not the store's files (an open one here), not
 * librdkafka's sockets and pipes. */
static void test_child_inherits_no_descriptor(void **state) {
  (void)state;
  char dir[64], cmd[512], path[96], err[256];
  kl_t_tmpdir(dir);
  snprintf(path, sizeof(path), "%s/fds", dir);
  FILE *held = fopen(path, "w"); /* a descriptor the worker has open */
  assert_non_null(held);
  snprintf(cmd, sizeof(cmd),
           "ls /proc/$$/fd > %s.new && mv %s.new %s; "
           "while read -r l; do echo '{\"status\":\"ok\"}'; done",
           path, path, path);
  kl__exec_t *exec = kl_exec(cmd, 5000);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_OK);
  kl__exec_destroy(exec);
  fclose(held);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char fd[32], seen[256] = "";
  int n = 0;
  while (fgets(fd, sizeof(fd), f)) {
    fd[strcspn(fd, "\n")] = '\0';
    if (atoi(fd) > 2 && strlen(seen) + strlen(fd) + 2 < sizeof(seen))
      strcat(seen, " "), strcat(seen, fd), n++;
  }
  fclose(f);
  /* the shell's ls has one of its own for the directory it lists */
  if (n > 1)
    fail_msg("the child inherited descriptors:%s", seen);
  kl_t_rmrf(dir);
}

static void test_fail_and_retry_verdicts(void **state) {
  char err[256];
  kl__exec_t *exec = kl_exec(
      "read -r l; echo '{\"status\":\"fail\",\"error\":\"no such account\"}';"
      "read -r l; echo '{\"status\":\"retry\",\"error\":\"db busy\"}';"
      "while read -r l; do echo '{\"status\":\"ok\"}'; done",
      5000);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "no such account"));
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "db busy"));
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl__exec_starts(exec), 1);
  kl__exec_destroy(exec);
}

static void test_crash_restarts(void **state) {
  char err[256];
  kl__exec_t *exec = kl_exec("read -r l; echo '{\"status\":\"ok\"}'; "
                             "read -r l; echo dying >&2; exit 3",
                             5000);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "exited"));
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl__exec_starts(exec), 2);
  kl__exec_destroy(exec);
}

static void test_hang_is_killed(void **state) {
  char err[256];
  kl__exec_t *exec = kl_exec("read -r l; sleep 30", 300);
  int64_t t0 = kl__mono_ns();
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  int64_t ms = (kl__mono_ns() - t0) / 1000000;
  assert_true(ms >= 250 && ms < 5000);
  assert_non_null(strstr(err, "did not answer within 300 ms"));
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_int_equal(kl__exec_starts(exec), 2);
  kl__exec_destroy(exec);
}

static void test_garbage_and_long_lines(void **state) {
  char err[256];
  kl__exec_t *exec = kl_exec("read -r l; echo hello; "
                             "while read -r l; do echo '{\"status\":\"ok\"}';"
                             " done",
                             5000);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "garbage"));
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_int_equal(kl__exec_starts(exec), 2);
  kl__exec_destroy(exec);
  exec = kl_exec("read -r l; head -c 2000000 /dev/zero | tr '\\0' x", 5000);
  assert_int_equal(kl_call(exec, err, sizeof(err)), KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "over 1048576 bytes"));
  kl__exec_destroy(exec);
  assert_int_equal(kl__exec_new("", &exec), KL_ECONF);
}

static kl_handler_result_t kl_call_id(kl__exec_t *exec, const char *id,
                                      char *err, size_t size) {
  kl_event_t event = kl_event;
  event.id = id;
  event.id_len = strlen(id);
  err[0] = '\0';
  return kl__exec_handler(exec, &event, &kl_fence, NULL, err, size);
}

/* A handler that prints one line too many must not shift its answers onto
 * later events: the event it refuses ("bad") is never recorded as applied.
 * Issue 14 item 2. */
static void test_extra_line_does_not_shift_answers(void **state) {
  char err[256];
  kl__exec_t *exec = kl_exec(
      "while read -r l; do case \"$l\" in *'\"id\":\"bad\"'*) "
      "echo '{\"status\":\"fail\",\"error\":\"refused\"}';; *) "
      "printf '{\"status\":\"ok\"}\\n{\"status\":\"ok\"}\\n';; esac; done",
      5000);
  assert_int_equal(kl_call_id(exec, "good", err, sizeof(err)), KL_HANDLER_OK);
  assert_int_not_equal(kl_call_id(exec, "bad", err, sizeof(err)),
                       KL_HANDLER_OK);
  assert_int_equal(kl_call_id(exec, "bad", err, sizeof(err)), KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "refused"));
  kl__exec_destroy(exec);
}

/* The request carries "seq"; a child that echoes it may answer in any
 * order, and an answer whose seq no event has kills the child: the event
 * is retried, never applied. */
static void test_seq_echo_and_unknown_seq(void **state) {
  char err[256];
  kl__exec_t *exec =
      kl_exec("while read -r l; do s=${l#*'\"seq\":'}; s=${s%%,*}; "
              "case \"$l\" in *'\"id\":\"stray\"'*) s=$((s+100));; esac; "
              "echo \"{\\\"status\\\":\\\"ok\\\",\\\"seq\\\":$s}\"; done",
              5000);
  assert_int_equal(kl_call_id(exec, "a", err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl_call_id(exec, "b", err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl_call_id(exec, "stray", err, sizeof(err)),
                   KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "which no event in flight has"));
  assert_int_equal(kl_call_id(exec, "c", err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl__exec_starts(exec), 2);
  kl__exec_destroy(exec);
}

/* A child that has echoed "seq" must keep echoing it: an extra line
 * without it is caught even when it comes late. */
static void test_echoing_child_must_echo(void **state) {
  char err[256];
  kl__exec_t *exec =
      kl_exec("read -r l; s=${l#*'\"seq\":'}; s=${s%%,*}; "
              "echo \"{\\\"status\\\":\\\"ok\\\",\\\"seq\\\":$s}\"; "
              "read -r l; echo '{\"status\":\"ok\"}'; sleep 30",
              5000);
  assert_int_equal(kl_call_id(exec, "a", err, sizeof(err)), KL_HANDLER_OK);
  assert_int_equal(kl_call_id(exec, "b", err, sizeof(err)), KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "without \"seq\" after echoing it"));
  kl__exec_destroy(exec);
}

typedef struct kl_pipe_call {
  kl__exec_t *exec;
  char id[16];
  kl_handler_result_t result;
  char err[256];
} kl_pipe_call_t;

static void *kl_pipe_call_main(void *opaque) {
  kl_pipe_call_t *c = opaque;
  c->result = kl_call_id(c->exec, c->id, c->err, sizeof(c->err));
  return NULL;
}

/* Pipelining: a child that reads 4 requests before it answers any, then
 * answers them in reverse order, serves 4 callers at once with one
 * process; each caller gets its own verdict. */
static void test_pipelined_answers_out_of_order(void **state) {
  char dir[64], path[128], cmd[256];
  kl_t_tmpdir(dir);
  snprintf(path, sizeof(path), "%s/h.py", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("import json, sys\n"
        "r = json.loads(sys.stdin.readline())\n"
        "print(json.dumps({'seq': r['seq'], 'status': 'ok'}), flush=True)\n"
        "while True:\n"
        "    reqs = [json.loads(sys.stdin.readline()) for _ in range(4)]\n"
        "    for r in reversed(reqs):\n"
        "        st = 'fail' if r['id'].startswith('f') else 'ok'\n"
        "        print(json.dumps({'seq': r['seq'], 'status': st,\n"
        "                          'error': 'refused ' + r['id']}),\n"
        "              flush=True)\n",
        f);
  fclose(f);
  snprintf(cmd, sizeof(cmd), "exec python3 %s", path);
  kl__exec_t *exec = kl_exec(cmd, 10000);
  assert_int_equal(kl__exec_set_children(exec, 1, 4), KL_OK);
  /* The first answer tells keylane the child echoes seq: until then it
   * gets one event at a time. */
  char err[256];
  assert_int_equal(kl_call_id(exec, "warm-up", err, sizeof(err)),
                   KL_HANDLER_OK);
  kl_pipe_call_t calls[4];
  pthread_t threads[4];
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 4; i++) {
      calls[i].exec = exec;
      snprintf(calls[i].id, sizeof(calls[i].id), "%s-%d-%d", i % 2 ? "f" : "ok",
               round, i);
      pthread_create(&threads[i], NULL, kl_pipe_call_main, &calls[i]);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(threads[i], NULL);
      assert_int_equal(calls[i].result,
                       i % 2 ? KL_HANDLER_FAIL : KL_HANDLER_OK);
      if (i % 2)
        assert_non_null(strstr(calls[i].err, calls[i].id));
    }
  }
  assert_int_equal(kl__exec_starts(exec), 1);
  kl__exec_destroy(exec);
  kl_t_rmrf(dir);
}

/* The example handler (deploy/examples/handler_fence_sqlite.py) refuses an
 * older epoch and applies an event id once per key. */
static void test_python_fence_example(void **state) {
  if (system("python3 -c 'import sqlite3' 2>/dev/null") != 0)
    skip();
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char dir[64], cmd[512], err[256];
  kl_t_tmpdir(dir);
  snprintf(cmd, sizeof(cmd),
           "exec python3 %s/deploy/examples/"
           "handler_fence_sqlite.py %s/app.db",
           src ? src : ".", dir);
  kl__exec_t *exec = kl_exec(cmd, 10000);
  kl_fence_t fence = kl_fence;
  assert_int_equal(
      kl__exec_handler(exec, &kl_event, &fence, NULL, err, sizeof(err)),
      KL_HANDLER_OK);
  assert_int_equal(
      kl__exec_handler(exec, &kl_event, &fence, NULL, err, sizeof(err)),
      KL_HANDLER_OK);
  fence.epoch = 5; /* a deposed owner */
  assert_int_equal(
      kl__exec_handler(exec, &kl_event, &fence, NULL, err, sizeof(err)),
      KL_HANDLER_RETRY);
  assert_non_null(strstr(err, "fenced"));
  /* Ids are scoped by key: the same id on another key is another event. */
  kl_event_t other = kl_event;
  other.key = "acct-2";
  other.key_len = 6;
  fence.epoch = kl_fence.epoch;
  assert_int_equal(
      kl__exec_handler(exec, &other, &fence, NULL, err, sizeof(err)),
      KL_HANDLER_OK);
  kl__exec_destroy(exec);
  snprintf(cmd, sizeof(cmd),
           "python3 -c \"import sqlite3,sys; d=sqlite3."
           "connect('%s/app.db'); sys.exit(d.execute('select key, amount "
           "from balance order by key').fetchall() != [('acct-1', 5), "
           "('acct-2', 5)])\"",
           dir);
  assert_int_equal(system(cmd), 0); /* credited once each, not twice */
  kl_t_rmrf(dir);
}

/* A hung child is killed and its event retried with the same fence
 * (partition, epoch, offset); a write the killed child had sent still
 * lands after the retry's. The fence's epoch cannot refuse it (it is the
 * same), so the example resource answers it "ok", and its `applied` table
 * (the event's id kept unique) is what applies the credit once. */
static void test_late_write_of_a_killed_child_applies_once(void **state) {
  if (system("python3 -c 'import sqlite3' 2>/dev/null") != 0)
    skip();
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  src = src ? src : ".";
  char dir[64], cmd[768], err[256], path[128];
  kl_t_tmpdir(dir);
  snprintf(cmd, sizeof(cmd),
           "exec python3 %s/tests/support/"
           "exec_late_write.py %s/deploy/examples/handler_fence_sqlite.py "
           "%s/app.db %s/marker",
           src, src, dir, dir);
  /* The child hangs once it has started its late writer; keylane kills it
   * at the timeout. Under load a child may be killed before it even read
   * the event (python's start alone can pass 1 s), so no late writer
   * exists and the next child would be the one to hang: the test failed
   * that way under load. Each such call doubles the timeout, until the
   * late writer is on its way (the marker). */
  snprintf(path, sizeof(path), "%s/marker", dir);
  kl__exec_t *exec = kl_exec(cmd, 1000);
  int timeout = 1000, calls = 0;
  do {
    kl__exec_set_timeout_ms(exec, timeout);
    assert_int_equal(
        kl__exec_handler(exec, &kl_event, &kl_fence, NULL, err, sizeof(err)),
        KL_HANDLER_RETRY);
    assert_non_null(strstr(err, "did not answer within"));
    calls++;
    timeout *= 2;
  } while (access(path, F_OK) != 0 && timeout <= 32000);
  assert_int_equal(access(path, F_OK), 0);
  /* The worker's retry: the same event, the same fence; its child may
   * take its time to start. */
  kl__exec_set_timeout_ms(exec, KL_EXEC_TIMEOUT_MS);
  assert_int_equal(
      kl__exec_handler(exec, &kl_event, &kl_fence, NULL, err, sizeof(err)),
      KL_HANDLER_OK);
  assert_int_equal(kl__exec_starts(exec), calls + 1);
  kl__exec_destroy(exec);
  snprintf(path, sizeof(path), "%s/marker.late", dir);
  FILE *f = NULL;
  for (int i = 0; i < 300 && !(f = fopen(path, "r")); i++)
    kl_t_sleep_ms(50);
  assert_non_null(f); /* the late write landed */
  char answer[256] = "";
  assert_non_null(fgets(answer, sizeof(answer), f));
  fclose(f);
  if (!strstr(answer, "\"status\": \"ok\""))
    fail_msg("the late write was answered %s, not ok: the epoch is the "
             "retry's and cannot refuse it",
             answer);
  snprintf(cmd, sizeof(cmd),
           "python3 -c \"import sqlite3,sys; d=sqlite3."
           "connect('%s/app.db'); sys.exit(d.execute('select amount from "
           "balance').fetchall() != [(5,)] or d.execute('select count(*) "
           "from applied').fetchall() != [(1,)])\"",
           dir);
  assert_int_equal(system(cmd), 0); /* credited once, not twice */
  kl_t_rmrf(dir);
}

/* ---- answers: each key once, "seq" in range ---- */

/* A key given twice would be read last-wins (which "seq", which
 * "status"?), and a "seq" keylane never gives (0, past 2^63-1) is no
 * echo: such lines are no answers, and say why. Issue 30 items C, D. */
static void test_answer_keys_once_and_seq_in_range(void **state) {
  static const struct {
    const char *line;
    const char *says;
  } bad[] = {
      {"{\"status\":\"ok\",\"status\":\"fail\"}", "duplicate object key"},
      {"{\"seq\":1,\"seq\":2,\"status\":\"ok\"}", "duplicate object key"},
      {"{\"status\":\"fail\",\"error\":\"a\",\"error\":\"b\"}",
       "duplicate object key"},
      {"{\"status\":\"ok\",\"emit\":[{\"key\":\"a\",\"key\":\"b\","
       "\"type\":\"t\"}]}",
       "duplicate object key"},
      {"{\"seq\":18446744073709551615,\"status\":\"ok\"}",
       "too big integer near '18446744073709551615'"},
      {"{\"seq\":0,\"status\":\"ok\"}", "from 1 to 2^63-1"},
      {"{\"seq\":-1,\"status\":\"ok\"}", "from 1 to 2^63-1"},
      {"{\"seq\":1.5,\"status\":\"ok\"}", "from 1 to 2^63-1"},
  };
  kl__exec_answer_t a;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (kl__exec_answer_parse(bad[i].line, strlen(bad[i].line), &a) != -1)
      fail_msg("%s was taken for an answer", bad[i].line);
    json_decref(a.emit);
    if (!strstr(a.error, bad[i].says))
      fail_msg("%s: \"%s\" does not say \"%s\"", bad[i].line, a.error,
               bad[i].says);
  }
  const char *top = "{\"seq\":9223372036854775807,\"status\":\"ok\"}";
  assert_int_equal(kl__exec_answer_parse(top, strlen(top), &a), 0);
  assert_true(a.has_seq);
  assert_true(a.seq == (uint64_t)INT64_MAX);
}

/* ---- "emit": follow-ups in the event's txn ---- */

typedef struct kl_emit_fx {
  char dir[64];
  kl_store_t *store;
  kl_txn_t *txn;
} kl_emit_fx_t;

static void kl_emit_fx_up(kl_emit_fx_t *fx) {
  kl_t_tmpdir(fx->dir);
  assert_int_equal(kl_store_open(fx->dir, NULL, &fx->store), KL_OK);
  kl_partition_state_t st;
  assert_int_equal(kl_store_acquire(fx->store, "events", 3, &st), KL_OK);
  assert_int_equal(kl_store_begin(fx->store, "events", 3, st.epoch, &fx->txn),
                   KL_OK);
  kl__txn_source_event(fx->txn, &kl_event, &kl_fence);
}

static void kl_emit_fx_down(kl_emit_fx_t *fx) {
  kl_store_abort(fx->txn);
  kl_store_destroy(fx->store);
  kl_t_rmrf(fx->dir);
}

/* kl__exec_emit() of the "emit" array @p text, with "dead-letters" as the
 * worker's dead-letter topic; @returns its verdict, and in @p rec the one
 * follow-up it emitted (its bytes, freed with kl__emits_free(*emits)), or
 * nothing when it emitted none. */
static kl_handler_result_t kl_emit(kl_emit_fx_t *fx, const char *text,
                                   kl__emits_t **emits, kl__outbox_rec_t *rec,
                                   char *err, size_t size) {
  json_error_t jerr;
  json_t *emit = json_loads(text, JSON_ALLOW_NUL, &jerr); /* as answers */
  if (!emit)
    fail_msg("%s: %s", text, jerr.text);
  err[0] = '\0';
  kl_handler_result_t r =
      kl__exec_emit(emit, "dead-letters", fx->txn, err, size);
  json_decref(emit);
  *emits = kl__txn_take_emits(fx->txn);
  kl__txn_source_event(fx->txn, &kl_event,
                       &kl_fence); /* the next call's index 0 */
  size_t off = 0, len;
  const void *bytes;
  if (kl__emits_next(*emits, &off, &bytes, &len))
    assert_int_equal(kl__outbox_rec_decode(bytes, len, rec), 0);
  assert_int_equal(kl__emits_next(*emits, &off, &bytes, &len), 0);
  return r;
}

/* An emit carries "payload_b64" as its raw bytes, and "payload" as its
 * msgpack, to the topic it names or the event's own. Issue 30 item A. */
static void test_emit_payload_b64(void **state) {
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  char err[512];
  kl__emits_t *emits;
  kl__outbox_rec_t rec;
  assert_int_equal(kl_emit(&fx,
                           "[{\"key\":\"k\",\"type\":\"t\","
                           "\"payload_b64\":\"AAEC/w==\"}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_OK);
  assert_int_equal(rec.event.payload_len, 4);
  assert_memory_equal(rec.event.payload, "\x00\x01\x02\xff", 4);
  assert_int_equal(rec.topic_len, 0); /* the event's own */
  /* the source's place (kl_fence), then the nonce's 16 hex digits */
  assert_int_equal(rec.event.id_len, 15 + 16);
  assert_memory_equal(rec.event.id, "~events/3/42/0/", 15);
  kl__emits_free(emits);
  assert_int_equal(kl_emit(&fx,
                           "[{\"topic\":\"other-topic\",\"key\":\"k\","
                           "\"type\":\"t\",\"payload\":{\"a\":1}}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_OK);
  assert_int_equal(rec.event.payload_len, 4);
  assert_memory_equal(rec.event.payload,
                      "\x81\xa1"
                      "a\x01",
                      4);
  assert_int_equal(rec.topic_len, 11);
  assert_memory_equal(rec.topic, "other-topic", 11);
  kl__emits_free(emits);
  kl_emit_fx_down(&fx);
}

#define KL_DAY_MS (24 * 3600 * 1000LL)

static kl_err_t emit_at(kl_txn_t *txn, int64_t not_before) {
  kl_emit_opts_t opts = {.size = sizeof(opts), .not_before = not_before};
  return kl_txn_emit_opts(txn, NULL, "dest", 4, "credit", NULL, 0, &opts);
}

/* The not_before of the one follow-up @p txn emitted since its event
 * began, which begins again. */
static int64_t last_not_before(kl_txn_t *txn) {
  kl__emits_t *emits = kl__txn_take_emits(txn);
  size_t off = 0, len;
  const void *bytes, *last = NULL;
  size_t last_len = 0, n = 0;
  while (kl__emits_next(emits, &off, &bytes, &len))
    last = bytes, last_len = len, n++;
  kl__outbox_rec_t rec;
  assert_int_equal(n, 1);
  assert_int_equal(kl__outbox_rec_decode(last, last_len, &rec), 0);
  int64_t nb = rec.event.not_before;
  kl__emits_free(emits);
  kl__txn_source_event(txn, &kl_event, &kl_fence);
  return nb;
}

/* kl_txn_emit_opts() refuses a not_before past timer.max.delay from the
 * source record's time (or now, when that is earlier), and opts without
 * their size; NULL opts is kl_txn_emit(). */
static void test_emit_not_before_limits(void **state) {
  (void)state;
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  int64_t now = kl__now_ms(), src = now - 3600000; /* read an hour late */
  kl__txn_set_timer_max(fx.txn, 7 * KL_DAY_MS, src);
  /* at most timer.max.delay after the source record's time */
  assert_int_equal(emit_at(fx.txn, src + 7 * KL_DAY_MS), KL_OK);
  assert_int_equal(last_not_before(fx.txn), src + 7 * KL_DAY_MS);
  kl__txn_set_timer_max(fx.txn, 7 * KL_DAY_MS, src);
  assert_int_equal(emit_at(fx.txn, src + 7 * KL_DAY_MS + 1000), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "kl_txn_emit: not_before "));
  assert_non_null(
      strstr(kl_err_detail(), "more than timer.max.delay (7d) allows"));
  /* a record stamped ahead of this host: judged from now, which
   * kl_publish() and the follow-up's worker judge it by later */
  kl__txn_set_timer_max(fx.txn, 7 * KL_DAY_MS, now + KL_DAY_MS);
  assert_int_equal(emit_at(fx.txn, now + 7 * KL_DAY_MS + 60000), KL_EINVAL);
  assert_int_equal(emit_at(fx.txn, -1), KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "not_before is -1"));
  kl_emit_opts_t sizeless = {.not_before = now};
  assert_int_equal(
      kl_txn_emit_opts(fx.txn, NULL, "dest", 4, "credit", NULL, 0, &sizeless),
      KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "sizeof(kl_emit_opts_t)"));
  /* none of the refused ones was emitted; NULL opts is kl_txn_emit() */
  assert_int_equal(
      kl_txn_emit_opts(fx.txn, NULL, "dest", 4, "credit", NULL, 0, NULL),
      KL_OK);
  assert_int_equal(last_not_before(fx.txn), 0);
  kl_emit_fx_down(&fx);
}

/* An emit's "not_before" (ms) or "delay" (a duration, as a `keylane
 * publish` line takes it), not both, gives the follow-up its time, under
 * timer.max.delay; a delayed event's request carries its "not_before".
 * Issue 36, follow-ups with a delay. */
static void test_emit_not_before_and_delay(void **state) {
  (void)state;
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  char err[512];
  kl__emits_t *emits;
  kl__outbox_rec_t rec;
  assert_int_equal(kl_emit(&fx,
                           "[{\"key\":\"k\",\"type\":\"t\","
                           "\"not_before\":1767225600000}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_OK);
  assert_int_equal(rec.event.not_before, 1767225600000);
  kl__emits_free(emits);
  int64_t before = kl__now_ms();
  assert_int_equal(kl_emit(&fx,
                           "[{\"key\":\"k\",\"type\":\"t\",\"delay\":\"15m\"}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_OK);
  assert_in_range(rec.event.not_before, before + 900000, kl__now_ms() + 900000);
  kl__emits_free(emits);
  assert_int_equal(kl_emit(&fx,
                           "[{\"key\":\"k\",\"type\":\"t\",\"delay\":\"1m\","
                           "\"not_before\":1767225600000}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "\"emit\"[0]: both \"not_before\" and "
                              "\"delay\" are given"));
  assert_null(emits);
  /* the worker's timer.max.delay (7 days here) */
  kl__txn_set_timer_max(fx.txn, 7 * KL_DAY_MS, 0);
  assert_int_equal(kl_emit(&fx,
                           "[{\"key\":\"k\",\"type\":\"t\",\"delay\":\"8d\"}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "more than timer.max.delay (7d) allows"));
  assert_null(emits);
  kl_emit_fx_down(&fx);

  kl_event_t delayed = kl_event;
  for (int i = 0; i < 2; i++) {
    size_t len;
    char *line = kl__exec_request(&delayed, &kl_fence, &len);
    assert_non_null(line);
    json_error_t jerr;
    line[KL__EXEC_SEQ_ROOM - 1] = '{'; /* the text, without its "seq" */
    json_t *req = json_loadb(line + KL__EXEC_SEQ_ROOM - 1, len + 1, 0, &jerr);
    assert_non_null(req);
    json_t *nb = json_object_get(req, "not_before");
    if (i == 0)
      assert_null(nb);
    else
      assert_int_equal(json_integer_value(nb), 1767225600000);
    json_decref(req);
    free(line);
    delayed.not_before = 1767225600000;
  }
}

/* What an emit may not say is refused, naming it: the event fails (a dead
 * letter with the reason), nothing is emitted silently wrong. Issue 30
 * items A (fields) and B (topics). */
static void test_emit_refusals(void **state) {
  static const struct {
    const char *emit;
    const char *says;
  } refused[] = {
      {"{\"key\":\"k\",\"type\":\"t\",\"id\":\"mine\"}",
       "\"id\" is not allowed"},
      {"{\"key\":\"k\",\"type\":\"t\",\"headers\":{\"a\":\"b\"}}",
       "headers on follow-ups are not supported yet"},
      {"{\"key\":\"k\",\"type\":\"t\",\"paylod\":1}",
       "unknown field \"paylod\""},
      {"{\"key\":\"k\",\"type\":\"t\",\"payload\":1,\"payload_b64\":\"AA==\"}",
       "both \"payload\" and \"payload_b64\""},
      {"{\"key\":\"k\",\"type\":\"t\",\"payload_b64\":\"A!==\"}",
       "\"payload_b64\""},
      {"{\"key\":\"k\"}", "\"type\" is missing"},
      {"{\"key\":\"\",\"type\":\"t\"}", "\"key\" is empty"},
      {"7", "not an object"},
      {"{\"topic\":\"events.dlq\",\"key\":\"k\",\"type\":\"t\"}",
       "topic \"events.dlq\" is a dead-letter topic"},
      {"{\"topic\":\"x.dlq\",\"key\":\"k\",\"type\":\"t\"}",
       "a dead-letter topic"},
      {"{\"topic\":\"dead-letters\",\"key\":\"k\",\"type\":\"t\"}",
       "the worker's dead-letter topic"},
      {"{\"topic\":\"__consumer_offsets\",\"key\":\"k\",\"type\":\"t\"}",
       "internal to Kafka"},
      {"{\"topic\":\"no spaces\",\"key\":\"k\",\"type\":\"t\"}",
       "has the byte 0x20 at 2"},
      {"{\"topic\":\"..\",\"key\":\"k\",\"type\":\"t\"}", "reserved by Kafka"},
      {"{\"topic\":\"\",\"key\":\"k\",\"type\":\"t\"}",
       "omit it to emit to the event's own topic"},
      {"{\"topic\":7,\"key\":\"k\",\"type\":\"t\"}", "must be a topic name"},
  };
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  char text[512], err[512];
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    kl__emits_t *emits;
    kl__outbox_rec_t rec;
    snprintf(text, sizeof(text), "[%s]", refused[i].emit);
    if (kl_emit(&fx, text, &emits, &rec, err, sizeof(err)) != KL_HANDLER_FAIL)
      fail_msg("%s was not refused", text);
    if (!strstr(err, refused[i].says) || !strstr(err, "\"emit\"[0]"))
      fail_msg("%s: \"%s\" does not say \"%s\"", text, err, refused[i].says);
    assert_true(!emits || emits->count == 0);
    kl__emits_free(emits);
  }
  kl_emit_fx_down(&fx);
}

/* ---- "cancel": timers of the event's own key ---- */

/* Schedules the delayed event @p id of the fixture's event key in its
 * txn, as a worker's first reading of it would. */
static void cancel_timer_put(kl_emit_fx_t *fx, const char *id) {
  kl__timer_t t = {kl__now_ms() + 60000, 40, 0};
  assert_int_equal(kl__timer_put(fx->txn, kl_fence.topic, kl_fence.partition,
                                 kl_event.key, kl_event.key_len, id, strlen(id),
                                 &t, "env", 3),
                   KL_OK);
}

static int cancel_timer_waits(kl_emit_fx_t *fx, const char *id) {
  kl__timer_t t;
  kl_err_t err =
      kl__timer_get(fx->txn, kl_fence.topic, kl_fence.partition, kl_event.key,
                    kl_event.key_len, id, strlen(id), &t);
  assert_true(err == KL_OK || err == KL_ENOTFOUND);
  return err == KL_OK;
}

static kl_handler_result_t cancel_json(kl_emit_fx_t *fx, const char *text,
                                       char *err, size_t size) {
  json_error_t jerr;
  json_t *cancel = json_loads(text, 0, &jerr);
  if (!cancel)
    fail_msg("%s: %s", text, jerr.text);
  err[0] = '\0';
  kl_handler_result_t r =
      kl__exec_cancel(cancel, &kl_event, fx->txn, err, size);
  json_decref(cancel);
  return r;
}

/* An answer's "cancel" deletes timers of the event's key by id, its
 * "key" optional; a timer that no longer waits is no error; a "cancel"
 * with "retry" or "fail" is not read. Issue 36, cancel from exec. */
static void test_cancel_deletes_the_keys_timers(void **state) {
  (void)state;
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  cancel_timer_put(&fx, "r-1");
  cancel_timer_put(&fx, "r-2");
  cancel_timer_put(&fx, "r-3");
  char err[512];
  assert_int_equal(cancel_json(&fx,
                               "[{\"id\":\"r-1\"},"
                               "{\"id\":\"r-2\",\"key\":\"acct-1\"},"
                               "{\"id\":\"gone\"}]",
                               err, sizeof(err)),
                   KL_HANDLER_OK);
  assert_false(cancel_timer_waits(&fx, "r-1"));
  assert_false(cancel_timer_waits(&fx, "r-2"));
  assert_true(cancel_timer_waits(&fx, "r-3"));
  assert_int_equal(cancel_json(&fx, "[]", err, sizeof(err)), KL_HANDLER_OK);
  kl_emit_fx_down(&fx);

  const char *ok = "{\"status\":\"ok\",\"cancel\":[{\"id\":\"x\"}]}";
  const char *fail = "{\"status\":\"fail\",\"error\":\"e\","
                     "\"cancel\":[{\"id\":\"x\"}]}";
  kl__exec_answer_t a;
  assert_int_equal(kl__exec_answer_parse(ok, strlen(ok), &a), 0);
  assert_true(json_is_array(a.cancel));
  json_decref(a.cancel);
  assert_int_equal(kl__exec_answer_parse(fail, strlen(fail), &a), 0);
  assert_null(a.cancel);
}

/* What a cancel may not say is refused, naming it and the fix: the event
 * fails, and no timer is cancelled by a part of it. */
static void test_cancel_refusals(void **state) {
  (void)state;
  char long_id[300], text[512];
  memset(long_id, 'i', 256);
  long_id[256] = '\0';
  static const struct {
    const char *cancel;
    const char *says;
  } refused[] = {
      {"{\"id\":\"r-1\",\"key\":\"acct-2\"}",
       "key \"acct-2\" is not the event's (\"acct-1\"): a handler cancels its "
       "own key's timers; to cancel another key's, emit a follow-up"},
      {"{\"id\":\"r-1\",\"key\":7}", "\"key\" is not a string"},
      {"{\"id\":7}", "\"id\" is not a string: give the delayed event's id, "
                     "a string of 1 to 255 bytes"},
      {"{\"id\":[\"r-1\"]}", "\"id\" is not a string"},
      {"{\"id\":\"\"}", "\"id\" is 0 bytes; an event's id is 1 to 255"},
      {NULL, /* an id of 256 bytes */ "\"id\" is 256 bytes; an event's id is 1 "
                                      "to 255"},
      {"{\"key\":\"acct-1\"}", "\"id\" is missing"},
      {"{\"id\":\"r-1\",\"due\":1}", "unknown field \"due\"; a cancel "
                                     "takes \"id\" and, optionally, \"key\""},
      {"\"r-1\"", "not an object {\"id\", \"key\"?}"},
  };
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  cancel_timer_put(&fx, "r-1");
  char err[512], entry[400];
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    if (refused[i].cancel)
      snprintf(entry, sizeof(entry), "%s", refused[i].cancel);
    else
      snprintf(entry, sizeof(entry), "{\"id\":\"%s\"}", long_id);
    snprintf(text, sizeof(text), "[%s]", entry);
    if (cancel_json(&fx, text, err, sizeof(err)) != KL_HANDLER_FAIL)
      fail_msg("%s was not refused", text);
    if (!strstr(err, refused[i].says) ||
        !strstr(err, "exec handler: \"cancel\"[0]: "))
      fail_msg("%s: \"%s\" does not say \"%s\"", text, err, refused[i].says);
  }
  assert_true(cancel_timer_waits(&fx, "r-1"));
  assert_int_equal(cancel_json(&fx, "{\"id\":\"r-1\"}", err, sizeof(err)),
                   KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "\"cancel\" must be an array of at most 64"));
  char many[64 * 12 + 8] = "[";
  for (int i = 0; i < 65; i++)
    strcat(many, i ? ",{\"id\":\"a\"}" : "{\"id\":\"a\"}");
  strcat(many, "]");
  assert_int_equal(cancel_json(&fx, many, err, sizeof(err)), KL_HANDLER_FAIL);
  assert_non_null(strstr(err, "cancel the rest from a follow-up"));
  assert_true(cancel_timer_waits(&fx, "r-1"));
  kl_emit_fx_down(&fx);
}

/* A string of an answer may hold \u0000, as JSON allows: the field that
 * cannot carry it fails the event by name, and the answer keeps its seq,
 * so the child that answered in step is not killed and retried as if it
 * had written garbage (the attacker's M2). A status holding one is no
 * status. */
static void test_nul_in_an_answer_fails_the_event_by_name(void **state) {
  (void)state;
  static const char line[] = "{\"seq\":3,\"status\":\"ok\","
                             "\"cancel\":[{\"id\":\"r-\\u00001\"}]}";
  kl__exec_answer_t a;
  assert_int_equal(kl__exec_answer_parse(line, strlen(line), &a), 0);
  assert_true(a.has_seq);
  assert_true(a.seq == 3);
  assert_int_equal(a.result, KL_HANDLER_OK);
  kl_emit_fx_t fx;
  kl_emit_fx_up(&fx);
  cancel_timer_put(&fx, "r-");
  char err[512];
  assert_int_equal(
      kl__exec_cancel(a.cancel, &kl_event, fx.txn, err, sizeof(err)),
      KL_HANDLER_FAIL);
  json_decref(a.cancel);
  if (!strstr(err, "\"cancel\"[0]: kl_txn_cancel: idempotency key holds a "
                   "NUL byte"))
    fail_msg("\"%s\" does not name the NUL", err);
  assert_true(cancel_timer_waits(&fx, "r-"));
  kl__emits_t *emits;
  kl__outbox_rec_t rec;
  assert_int_equal(kl_emit(&fx,
                           "[{\"topic\":\"other\\u0000x\",\"key\":\"k\","
                           "\"type\":\"t\"}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_FAIL);
  kl__emits_free(emits);
  assert_non_null(strstr(err, "\"topic\" must be a topic name (with no NUL)"));
  assert_int_equal(kl_emit(&fx, "[{\"key\":\"k\\u0000\",\"type\":\"t\"}]",
                           &emits, &rec, err, sizeof(err)),
                   KL_HANDLER_FAIL);
  kl__emits_free(emits);
  assert_non_null(strstr(err, "\"key\" holds a NUL byte at byte 1"));
  kl_emit_fx_down(&fx);
  static const char status[] = "{\"seq\":4,\"status\":\"ok\\u0000x\"}";
  assert_int_equal(kl__exec_answer_parse(status, strlen(status), &a), -1);
  assert_non_null(strstr(a.error, "garbage"));
  /* an error text is shown whole, its NUL escaped (attack 2, M4) */
  static const char error[] =
      "{\"status\":\"fail\",\"error\":\"bad\\u0000tail\"}";
  assert_int_equal(kl__exec_answer_parse(error, strlen(error), &a), 0);
  assert_string_equal(a.error, "exec handler: bad\\x00tail");
}

/* ---- a worker on the embedded cluster ---- */

static kl_worker_t *kl_exec_worker(const char *bootstrap, const char *topic,
                                   kl_store_t *store, kl__exec_t *exec,
                                   const char *attempts,
                                   const char *concurrency) {
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.session.timeout.ms", "3000"),
                   KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.retry.initial.ms", "10"), KL_OK);
  assert_int_equal(kl_conf_set(conf, "worker.max.attempts", attempts), KL_OK);
  if (concurrency) {
    assert_int_equal(kl_conf_set(conf, "worker.concurrency", concurrency),
                     KL_OK);
    assert_int_equal(kl_conf_set(conf, "worker.exec.window", "4"), KL_OK);
    assert_int_equal(kl__exec_configure(exec, conf), KL_OK);
  }
  kl_worker_t *worker;
  assert_int_equal(
      kl_worker_new(conf, topic, store, kl__exec_handler, exec, &worker),
      KL_OK);
  kl_conf_destroy(conf);
  return worker;
}

static void *kl_run(void *opaque) {
  kl_worker_run(opaque);
  return NULL;
}

typedef struct kl_case {
  const char *script; /* printf format; %1$s is a marker file path */
  int timeout_ms;
  const char *attempts;
  int events;
  int dead;                /* events expected dead-lettered (all or none) */
  const char *concurrency; /* NULL: one child, one event at a time */
} kl_case_t;

/* An embedded cluster with topic @p name of @p partitions and its
 * dead-letter topic, a store, and @p events ledger events published. */
typedef struct kl_exec_fx {
  char dir[64];
  kl_t_cluster_t *cluster;
  const char *topic;
  kl_store_t *store;
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
} kl_exec_fx_t;

static void kl_exec_fx_up(kl_exec_fx_t *fx, const char *name, int partitions,
                          int events) {
  char sdir[80], dlq[64];
  kl_t_tmpdir(fx->dir);
  snprintf(sdir, sizeof(sdir), "%s/store", fx->dir);
  snprintf(dlq, sizeof(dlq), "%s.dlq", name);
  assert_int_equal(kl_t_cluster_new(1, name, partitions, &fx->cluster), KL_OK);
  fx->topic = kl_t_topic(fx->cluster);
  assert_int_equal(kl_t_cluster_topic_create(fx->cluster, dlq, 1), KL_OK);
  assert_int_equal(kl_store_open(sdir, NULL, &fx->store), KL_OK);
  fx->gen = kl__ledger_gen_new(20, 2, 7);
  fx->producer = kl_t_producer(kl_t_bootstrap(fx->cluster), fx->gen);
  for (int i = 0; i < events; i++)
    assert_int_equal(kl__ledger_gen_publish(fx->gen, fx->producer, fx->topic),
                     KL_OK);
  assert_int_equal(kl_flush(fx->producer, 30000), KL_OK);
}

static void kl_exec_fx_down(kl_exec_fx_t *fx) {
  kl_producer_destroy(fx->producer);
  kl__ledger_gen_destroy(fx->gen);
  kl_store_destroy(fx->store);
  kl_t_cluster_destroy(fx->cluster);
  kl_t_rmrf(fx->dir);
}

/* Runs a worker with the exec handler over @p c->events events until they
 * are applied (or dead-lettered); checks each was applied at most once. */
static void kl_worker_case(const kl_case_t *c) {
  kl_exec_fx_t fx;
  kl_exec_fx_up(&fx, "exec", 2, c->events);
  char cmd[768], marker[128];
  snprintf(marker, sizeof(marker), "%s/marker", fx.dir);
/* The table's scripts are literals with one %s, the marker's path. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  snprintf(cmd, sizeof(cmd), c->script, marker);
#pragma GCC diagnostic pop
  kl__exec_t *exec = kl_exec(cmd, c->timeout_ms);
  kl_worker_t *worker =
      kl_exec_worker(kl_t_bootstrap(fx.cluster), fx.topic, fx.store, exec,
                     c->attempts, c->concurrency);
  pthread_t thread;
  pthread_create(&thread, NULL, kl_run, worker);
  kl_worker_stats_t st;
  for (int i = 0; i < 400; i++) {
    kl_worker_stats(worker, &st, sizeof(st));
    if (st.applied + st.failed >= (uint64_t)c->events &&
        (!c->dead || st.dead_letters >= (uint64_t)c->dead))
      break;
    kl_t_sleep_ms(100);
  }
  kl_t_sleep_ms(300); /* the last batch commits */
  kl_worker_stop(worker);
  pthread_join(thread, NULL);
  kl_worker_stats(worker, &st, sizeof(st));
  assert_int_equal(st.applied, c->events - c->dead);
  assert_int_equal(st.failed, c->dead);
  assert_int_equal(st.duplicates, 0);
  assert_true(kl__exec_starts(exec) >= 2);
  kl__ledger_verdict_t v;
  assert_int_equal(kl__ledger_gen_verify(fx.gen, fx.store, fx.topic, &v),
                   KL_OK);
  assert_int_equal(v.applied, c->events - c->dead); /* none twice */
  kl_worker_destroy(worker);
  kl__exec_destroy(exec);
  kl_exec_fx_down(&fx);
}

/* The child crashes once, at its 50th event (the marker says it did). */
static void test_worker_child_crash_applies_once(void **state) {
  kl_case_t c = {"n=0; while read -r l; do n=$((n+1)); if [ $n -eq 50 ] && "
                 "[ ! -e %1$s ]; then touch %1$s; exit 1; fi; "
                 "echo '{\"status\":\"ok\"}'; done",
                 5000,
                 "5",
                 200,
                 0,
                 NULL};
  kl_worker_case(&c);
}

/* The child hangs once, at its 10th event: killed after 500 ms. */
static void test_worker_child_hang_applies_once(void **state) {
  kl_case_t c = {"n=0; while read -r l; do n=$((n+1)); if [ $n -eq 10 ] && "
                 "[ ! -e %1$s ]; then touch %1$s; sleep 60; fi; "
                 "echo '{\"status\":\"ok\"}'; done",
                 500,
                 "5",
                 50,
                 0,
                 NULL};
  kl_worker_case(&c);
}

/* Children that echo "seq" get 4 events in flight each, 2 children; one
 * crashes at its 50th event with several in flight: each is retried and
 * every event is applied once. */
static void test_worker_pipelined_children_apply_once(void **state) {
  kl_case_t c = {"n=0; while read -r l; do n=$((n+1)); if [ $n -eq 50 ] && "
                 "[ ! -e %1$s ]; then touch %1$s; exit 1; fi; "
                 "s=${l#*'\"seq\":'}; s=${s%%%%,*}; "
                 "echo \"{\\\"status\\\":\\\"ok\\\",\\\"seq\\\":$s}\"; "
                 "done",
                 5000,
                 "5",
                 300,
                 0,
                 "2"};
  kl_worker_case(&c);
}

/* A child that only answers garbage: each event is retried, restarted
 * each time, until worker.max.attempts sends it to the dead letters. */
static void test_worker_child_garbage_dead_letters(void **state) {
  kl_case_t c = {"while read -r l; do echo 'not json %1$s'; done",
                 5000,
                 "2",
                 10,
                 10,
                 NULL};
  kl_worker_case(&c);
}

/* Runs a worker with the exec handler @p command (the SQLite example)
 * until it has applied or dead-lettered @p events; @returns its stats. */
typedef struct kl_fence_worker {
  kl_worker_t *worker;
  atomic_int done;
} kl_fence_worker_t;

static void *kl_fence_main(void *opaque) {
  kl_fence_worker_t *run = opaque;
  kl_worker_run(run->worker);
  atomic_store(&run->done, 1);
  return NULL;
}

static kl_worker_stats_t kl_fence_run(const char *bootstrap, const char *topic,
                                      kl_store_t *store, const char *command,
                                      int events) {
  kl__exec_t *exec = kl_exec(command, 10000);
  kl_worker_t *worker =
      kl_exec_worker(bootstrap, topic, store, exec, "2", NULL);
  pthread_t thread;
  kl_fence_worker_t run = {worker, 0};
  pthread_create(&thread, NULL, kl_fence_main, &run);
  kl_worker_stats_t st;
  for (int i = 0; i < 600; i++) {
    kl_worker_stats(worker, &st, sizeof(st));
    if (st.applied + st.dead_letters >= (uint64_t)events ||
        atomic_load(&run.done)) /* it stopped on its own */
      break;
    kl_t_sleep_ms(100);
  }
  kl_worker_stop(worker);
  pthread_join(thread, NULL);
  kl_worker_stats(worker, &st, sizeof(st));
  kl_worker_destroy(worker);
  kl__exec_destroy(exec);
  return st;
}

/* A handler's error and its child's stderr are client text: a newline or
 * an ESC in them comes out escaped in the worker's log, so they can
 * neither forge a log line nor drive the terminal of whoever reads it.
 * Issue 30 item E. */
static void test_log_escapes_exec_text(void **state) {
  kl_exec_fx_t fx;
  kl_exec_fx_up(&fx, "esc", 1, 2);
  kl_t_stderr_t log;
  kl_t_stderr_begin(&log);
  kl_worker_stats_t st =
      kl_fence_run(kl_t_bootstrap(fx.cluster), fx.topic, fx.store,
                   "while read -r l; do printf 'warn\\033[2J\\n' >&2; "
                   "printf '%s\\n' '{\"status\":\"fail\",\"error\":"
                   "\"bad\\nFORGED \\u001b[2J\"}'; done",
                   2);
  kl_t_sleep_ms(300); /* the stderr reader's last lines */
  char *text = kl_t_stderr_end(&log);
  assert_int_equal(st.dead_letters, 2);
  assert_non_null(strstr(text, "exec handler: bad\\x0aFORGED \\x1b[2J"));
  assert_non_null(strstr(text, "]: warn\\x1b[2J"));
  assert_null(memchr(text, 0x1b, strlen(text)));
  assert_null(strstr(text, "\nFORGED")); /* no line of its own */
  free(text);
  kl_exec_fx_down(&fx);
}

/* Epochs outlive the store: a fleet whose store is lost is refused a new
 * empty one, and rebuilds it from the log, under epochs above the
 * group's; the SQLite fence example, which kept the old owners' epochs,
 * refuses none of the rebuild's events as fenced. */
static void test_fence_example_accepts_a_new_store(void **state) {
  if (system("python3 -c 'import sqlite3' 2>/dev/null") != 0)
    skip();
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char dir[64], old_dir[80], new_dir[80], cmd[512];
  kl_t_tmpdir(dir);
  snprintf(old_dir, sizeof(old_dir), "%s/old", dir);
  snprintf(new_dir, sizeof(new_dir), "%s/new", dir);
  snprintf(cmd, sizeof(cmd),
           "exec python3 %s/deploy/examples/"
           "handler_fence_sqlite.py %s/app.db",
           src ? src : ".", dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "epochs", 2, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster);
  assert_int_equal(kl_t_cluster_topic_create(cluster, "epochs.dlq", 1), KL_OK);
  kl__ledger_gen_t *gen = kl__ledger_gen_new(20, 2, 7);
  kl_producer_t *producer = kl_t_producer(kl_t_bootstrap(cluster), gen);
  for (int i = 0; i < 40; i++)
    assert_int_equal(kl__ledger_gen_publish(gen, producer, topic), KL_OK);
  assert_int_equal(kl_flush(producer, 30000), KL_OK);

  /* The old store has seen owners before: its next epochs are 3. */
  kl_store_t *store;
  assert_int_equal(kl_store_open(old_dir, NULL, &store), KL_OK);
  kl_partition_state_t ps;
  for (int32_t p = 0; p < 2; p++)
    for (int i = 0; i < 2; i++)
      assert_int_equal(kl_store_acquire(store, topic, p, &ps), KL_OK);
  kl_worker_stats_t st =
      kl_fence_run(kl_t_bootstrap(cluster), topic, store, cmd, 40);
  assert_int_equal(st.applied, 40);
  assert_int_equal(st.dead_letters, 0);
  kl_conf_t *conf = kl_conf_new();
  assert_int_equal(
      kl_conf_set(conf, "kafka.bootstrap.servers", kl_t_bootstrap(cluster)),
      KL_OK);
  kl__check_t check; /* keylane doctor's view */
  kl__check_epochs(store, conf, "keylane", topic, 2, 10000, &check);
  assert_int_equal(check.status, KL__CHECK_OK);
  kl_store_destroy(store);

  /* The store is lost; a worker on a new one refuses the partitions the
   * group's offsets say were owned (store_unknown), and doctor says why:
   * the fix is to rebuild the store from the log. */
  assert_int_equal(kl_store_open(new_dir, NULL, &store), KL_OK);
  kl__check_epochs(store, conf, "keylane", topic, 2, 10000, &check);
  assert_int_equal(check.status, KL__CHECK_FAIL);
  assert_non_null(strstr(check.msg, "keylane store rebuild"));
  st = kl_fence_run(kl_t_bootstrap(cluster), topic, store, cmd, 40);
  assert_int_equal(st.applied, 0);
  kl_store_destroy(store);

  /* `keylane store rebuild` makes the new store, running the handler
   * under epochs above the fleet's. */
  kl_t_rmrf(new_dir);
  assert_int_equal(kl_store_open(new_dir, NULL, &store), KL_OK);
  kl__exec_t *exec = kl_exec(cmd, 10000);
  kl__replay_opts_t opts = {.conf = conf,
                            .topic = topic,
                            .store = store,
                            .handler = kl__exec_handler,
                            .handler_opaque = exec,
                            .rebuild = 1,
                            .from = {KL__POS_BEGINNING, 0},
                            .to = {KL__POS_END, 0}};
  kl__replay_t *replay;
  assert_int_equal(kl__replay_new(&opts, &replay), KL_OK);
  assert_int_equal(kl__replay_run(replay), KL_OK);
  kl__replay_part_t total;
  kl__replay_totals(replay, &total);
  assert_int_equal(total.status, KL__REPLAY_DONE); /* none fenced */
  assert_int_equal(total.applied, 40);
  size_t nparts;
  const kl__replay_part_t *parts = kl__replay_parts(replay, &nparts);
  assert_int_equal(nparts, 2);
  for (size_t i = 0; i < nparts; i++) {
    assert_int_equal(parts[i].previous_epoch, 0); /* a new store: no owner */
    assert_true(parts[i].epoch > 3);              /* above the group's 3 */
  }
  kl__replay_destroy(replay);
  kl__exec_destroy(exec);
  kl_conf_destroy(conf);
  kl_store_destroy(store);
  snprintf(cmd, sizeof(cmd),
           "python3 -c \"import sqlite3,sys; d=sqlite3."
           "connect('%s/app.db'); sys.exit(d.execute('select count(*) from "
           "applied').fetchall() != [(40,)])\"",
           dir);
  assert_int_equal(system(cmd), 0); /* each event once in the resource */
  kl_producer_destroy(producer);
  kl__ledger_gen_destroy(gen);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ok_and_the_line),
      cmocka_unit_test(test_child_inherits_no_descriptor),
      cmocka_unit_test(test_fail_and_retry_verdicts),
      cmocka_unit_test(test_crash_restarts),
      cmocka_unit_test(test_hang_is_killed),
      cmocka_unit_test(test_garbage_and_long_lines),
      cmocka_unit_test(test_answer_keys_once_and_seq_in_range),
      cmocka_unit_test(test_emit_payload_b64),
      cmocka_unit_test(test_emit_refusals),
      cmocka_unit_test(test_emit_not_before_and_delay),
      cmocka_unit_test(test_emit_not_before_limits),
      cmocka_unit_test(test_cancel_deletes_the_keys_timers),
      cmocka_unit_test(test_cancel_refusals),
      cmocka_unit_test(test_nul_in_an_answer_fails_the_event_by_name),
      cmocka_unit_test(test_extra_line_does_not_shift_answers),
      cmocka_unit_test(test_seq_echo_and_unknown_seq),
      cmocka_unit_test(test_echoing_child_must_echo),
      cmocka_unit_test(test_pipelined_answers_out_of_order),
      cmocka_unit_test(test_python_fence_example),
      cmocka_unit_test(test_late_write_of_a_killed_child_applies_once),
      cmocka_unit_test(test_worker_child_crash_applies_once),
      cmocka_unit_test(test_worker_child_hang_applies_once),
      cmocka_unit_test(test_worker_child_garbage_dead_letters),
      cmocka_unit_test(test_log_escapes_exec_text),
      cmocka_unit_test(test_fence_example_accepts_a_new_store),
      cmocka_unit_test(test_worker_pipelined_children_apply_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
