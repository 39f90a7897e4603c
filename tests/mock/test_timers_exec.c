/*
 * An exec handler cancels a timer of its own key (issue 36, "Cancel and
 * inspect"): on the embedded cluster, on LMDB and on PostgreSQL, a handler
 * written in Python answers a later event of the key with "cancel"
 * (docs/exec-protocol.md). The store's clock is the test's
 * (kl_t_store_clock_set()), so time moves without sleeping:
 *  - two delayed events of one key wait as timers, and `keylane store
 *    timers --json` lists both;
 *  - answers that cancel another key's timer, or name an id that is not a
 *    string or is too long, fail their events (dead letters saying why)
 *    and cancel nothing;
 *  - the answer that cancels the first timer applies, `keylane store
 *    timers` no longer lists it, and once the clock passed both times only
 *    the second fires: the handler never sees the first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "keylane/producer.h"
#include "keylane/store.h"
#include "support/ledger_checks.h"
#include "support/pg_group.h"
#include "support/run.h"
#include "support/store_contract.h"
#include "support/support.h"
#include "support/timer_checks.h"
#include "common/internal.h"
#include "handlers/exec.h"
#include "store/store_internal.h"

/* The handler: logs "TYPE ID" of each event it runs to argv[1]; answers
 * ok, with the "cancel" its event's type names. */
static const char handler_py[] =
    "import json, sys\n"
    "log = open(sys.argv[1], 'a')\n"
    "cancels = {\n"
    "    'cancel': [{'id': 'later'}],\n"
    "    'cancel-other-key': [{'id': 'later', 'key': 'other'}],\n"
    "    'cancel-number': [{'id': 7}],\n"
    "    'cancel-long': [{'id': 'x' * 256}],\n"
    "}\n"
    "for line in sys.stdin:\n"
    "    req = json.loads(line)\n"
    "    print(req['type'], req['id'], file=log, flush=True)\n"
    "    ans = {'seq': req['seq'], 'status': 'ok'}\n"
    "    if req['type'] in cancels:\n"
    "        ans['cancel'] = cancels[req['type']]\n"
    "    print(json.dumps(ans), flush=True)\n";

static void publish(kl_t_ledger_fx_t *fx, const char *id, const char *type,
                    int64_t not_before) {
  kl_t_timers_publish(fx, "d", id, type, NULL, 0, not_before);
}

/* Waits for the counters this test checks (not duplicates, nor failed);
 * none early. */
static void wait_stats(kl_t_worker_t *w, kl_t_timers_want_t want) {
  want.duplicates = want.failed = KL_T_ANY;
  kl_t_timers_wait(w, want);
}
/* The ids `keylane store timers --json` lists for the store at
 * @p where, in its order, joined by spaces ("" for none). */
static void listed(const char *where, char *ids, size_t size) {
  const char *args[] = {"store", "timers", "--store", where, "--json", NULL};
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 30000, &r);
  if (r.rc != 0)
    fail_msg("keylane store timers: exit %d\n%s", r.rc, r.err);
  json_t *doc = kl_t_run_json(&r);
  size_t i, n = 0;
  json_t *row;
  ids[0] = '\0';
  json_array_foreach(json_object_get(doc, "timers"), i, row) {
    assert_string_equal(json_string_value(json_object_get(row, "key")), "d");
    n += (size_t)snprintf(ids + n, size - n, "%s%s", n ? " " : "",
                          json_string_value(json_object_get(row, "id")));
  }
  json_decref(doc);
  kl_t_run_free(&r);
}

/* Lines of the handler's log that are @p line. */
static int ran(const char *log, const char *line) {
  FILE *f = fopen(log, "r");
  char text[512];
  int n = 0;
  while (f && fgets(text, sizeof(text), f))
    n += strcmp(strtok(text, "\n"), line) == 0;
  if (f)
    fclose(f);
  return n;
}

static void cancel_case(const char *name, const char *store_uri) {
  int64_t t0 = kl__now_ms();
  kl_t_store_clock_set(t0);
  kl_t_ledger_fx_t fx;
  kl_t_ledger_fx_up(&fx, name, 1, 1, 3, store_uri);
  char dir[64], py[128], log[128], cmd[320], ids[256];
  kl_t_tmpdir(dir);
  snprintf(py, sizeof(py), "%s/handler.py", dir);
  snprintf(log, sizeof(log), "%s/ran.log", dir);
  FILE *f = fopen(py, "w");
  assert_non_null(f);
  fputs(handler_py, f);
  fclose(f);
  snprintf(cmd, sizeof(cmd), "exec python3 %s %s", py, log);
  kl__exec_t *exec;
  assert_int_equal(kl__exec_new(cmd, &exec), KL_OK);

  publish(&fx, "later", "credit", t0 + 30000);
  publish(&fx, "witness", "credit", t0 + 60000);
  kl_t_worker_t *w =
      kl_t_worker_new_with(fx.boot, fx.topic, kl_t_group(fx.cluster, name),
                           fx.store, NULL, kl__exec_handler, exec);
  kl_t_worker_go(w);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 2});
  listed(fx.where, ids, sizeof(ids));
  assert_string_equal(ids, "later witness");

  /* refused answers: dead letters that say why, nothing cancelled */
  kl_t_stderr_t err;
  kl_t_stderr_begin(&err);
  publish(&fx, "c-other", "cancel-other-key", 0);
  publish(&fx, "c-number", "cancel-number", 0);
  publish(&fx, "c-long", "cancel-long", 0);
  wait_stats(w, (kl_t_timers_want_t){.scheduled = 2, .dead = 3});
  char *text = kl_t_stderr_end(&err);
  assert_non_null(strstr(text, "key \"other\" is not the event's"));
  assert_non_null(strstr(text, "\"cancel\"[0]: \"id\" is not a string"));
  assert_non_null(strstr(text, "\"cancel\"[0]: \"id\" is 256 bytes"));
  free(text);
  listed(fx.where, ids, sizeof(ids));
  assert_string_equal(ids, "later witness");

  publish(&fx, "c-1", "cancel", 0);
  wait_stats(w, (kl_t_timers_want_t){.applied = 1, .scheduled = 2, .dead = 3});
  listed(fx.where, ids, sizeof(ids));
  assert_string_equal(ids, "witness");

  /* past both times: the witness fires, the cancelled one never does */
  kl_t_store_clock_set(t0 + 60000);
  wait_stats(w, (kl_t_timers_want_t){
                    .applied = 2, .scheduled = 2, .dead = 3, .fired = 1});
  listed(fx.where, ids, sizeof(ids));
  assert_string_equal(ids, "");
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  assert_int_equal(ran(log, "credit witness"), 1);
  assert_int_equal(ran(log, "credit later"), 0);
  assert_int_equal(ran(log, "cancel c-1"), 1);
  kl__exec_destroy(exec);
  kl_t_rmrf(dir);
  kl_t_ledger_fx_down(&fx);
  kl__store_set_clock(NULL);
}

static void test_exec_cancel_lmdb(void **state) {
  (void)state;
  cancel_case("tmrxcancel", NULL);
}

static void test_exec_cancel_pg(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "tmrxcancel", uri, sizeof(uri)), 0);
  cancel_case("tmrxcancelpg", uri);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exec_cancel_lmdb),
      cmocka_unit_test(test_exec_cancel_pg),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
