/*
 * The worker's state API on its metrics listener (cli/worker_api.h) and
 * kl_worker_foreach_key() under it, on the embedded cluster: a worker
 * applies three keys, then five keys whose handler keeps asking to retry
 * hold their partition. /v1/partitions lists the partition with its
 * epoch, watermark, committed offset and lag; /v1/keys?state=retrying
 * lists the five with their attempts and error, a page of two at a time
 * whose "next" leads through all five once; /v1/keys/KEY finds one,
 * percent-encoded too, and 404s a key that holds nothing. Bad input (an
 * unknown state, limits out of range, a bad cursor, a bad escape, an
 * empty or over-long key, a POST) is refused with a status and a message
 * that names the fix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli/metrics_server.h"
#include "keylane/worker.h"
#include "support/cluster.h"
#include "support/http.h"
#include "support/support.h"

static atomic_int kl_poison = 1; /* keys "poison*" ask to retry while set */

static kl_handler_result_t kl_handler(void *opaque, const kl_event_t *event,
                                      const kl_fence_t *fence, kl_txn_t *txn,
                                      char *errbuf, size_t errbuf_size) {
  (void)opaque, (void)fence, (void)txn;
  if (!atomic_load(&kl_poison) || event->key_len < 6 ||
      memcmp(event->key, "poison", 6) != 0)
    return KL_HANDLER_OK;
  snprintf(errbuf, errbuf_size, "the test's handler says retry");
  return KL_HANDLER_RETRY;
}

/* GET @p path: the answer must be @p status; @returns its JSON body. */
static json_t *kl_get(int port, const char *method, const char *path,
                      int status) {
  kl_t_http_resp_t resp = {0};
  assert_int_equal(kl_t_http_once(port, method, path, NULL, NULL, &resp), 0);
  if (resp.status != status)
    fail_msg("%s %s: wanted %d, got %d: %s", method, path, status, resp.status,
             resp.body ? resp.body : "");
  char ctype[128];
  assert_non_null(kl_t_http_header(&resp, "content-type", ctype, 128));
  assert_string_equal(ctype, "application/json");
  json_error_t jerr;
  json_t *doc = json_loads(resp.body ? resp.body : "", 0, &jerr);
  if (!doc)
    fail_msg("%s: not JSON (%s): %s", path, jerr.text, resp.body);
  if (status == 405) {
    char allow[32];
    assert_non_null(kl_t_http_header(&resp, "allow", allow, sizeof(allow)));
    assert_string_equal(allow, "GET");
  }
  kl_t_http_resp_free(&resp);
  return doc;
}

/* A refusal: @p status with an error that says @p says. */
static void kl_refused(int port, const char *method, const char *path,
                       int status, const char *says) {
  json_t *doc = kl_get(port, method, path, status);
  const char *error = json_string_value(json_object_get(doc, "error"));
  if (!error || !strstr(error, says))
    fail_msg("%s %s: the error does not say \"%s\": %s", method, path, says,
             error ? error : "(none)");
  json_decref(doc);
}

static json_int_t kl_int(json_t *o, const char *name) {
  json_t *v = json_object_get(o, name);
  if (!json_is_integer(v))
    fail_msg("\"%s\" is not a number", name);
  return json_integer_value(v);
}

static void test_state_api(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  kl_t_cluster_t *cluster;
  assert_int_equal(kl_t_cluster_new(1, "wapi", 1, &cluster), KL_OK);
  const char *topic = kl_t_topic(cluster), *boot = kl_t_bootstrap(cluster);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  static const char *const conf[] = {
      "worker.session.timeout.ms=3000", "worker.max.attempts=1000",
      "worker.retry.initial.ms=50", "worker.retry.max.ms=100", NULL};
  kl_t_worker_t *w = kl_t_worker_new_with(boot, topic, kl_t_group(cluster, "g"),
                                          store, conf, kl_handler, NULL);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL, topic,
                                            w->worker, store, &server),
                   KL_OK);
  int port = kl__metrics_server_port(server);

  /* The C API's misuse. */
  kl_worker_keys_query_t unset = {0};
  assert_int_equal(kl_worker_foreach_key(w->worker, &unset, NULL, NULL, NULL),
                   KL_EINVAL);
  unset.size = sizeof(unset);
  unset.limit = KL_WORKER_KEYS_MAX + 1;
  assert_int_equal(kl_worker_foreach_key(w->worker, &unset,
                                         (kl_worker_key_cb_t *)abort, NULL,
                                         NULL),
                   KL_EINVAL);
  assert_non_null(strstr(kl_err_detail(), "at most 1000"));

  /* The server's store reads are cached: one before the worker took the
   * partition is the last read when it has just taken it. The epoch it
   * took it with shows at once all the same. */
  json_decref(kl_get(port, "GET", "/v1/partitions", 200));
  kl_t_worker_go(w);
  kl_worker_stats_t st = {0};
  for (int i = 0; i < 300 && st.owned < 1; i++) {
    kl_t_sleep_ms(20);
    kl_worker_stats(w->worker, &st, sizeof(st));
  }
  assert_int_equal(st.owned, 1);
  json_t *taken = kl_get(port, "GET", "/v1/partitions", 200);
  json_t *p0 = json_array_get(json_object_get(taken, "partitions"), 0);
  assert_non_null(p0);
  assert_true(kl_int(p0, "epoch") > 0);
  json_decref(taken);
  char id[40];
  for (int i = 0; i < 3; i++) {
    char key[8];
    snprintf(key, sizeof(key), "k%d", i);
    snprintf(id, sizeof(id), "0190a0a0-0000-7000-8000-00000000000%d", i);
    assert_int_equal(kl_t_produce_credit(boot, topic, 0, key, id, 5), 0);
  }
  json_t *doc = NULL, *p = NULL;
  for (int i = 0; i < 300; i++) { /* until applied and the lag known */
    json_decref(doc);
    doc = kl_get(port, "GET", "/v1/partitions", 200);
    p = json_array_get(json_object_get(doc, "partitions"), 0);
    if (p && kl_int(p, "watermark") == 3 && kl_int(p, "lag") == 0 &&
        kl_int(p, "committed") == 3)
      break;
    kl_t_sleep_ms(100);
  }
  assert_non_null(p);
  assert_string_equal(json_string_value(json_object_get(doc, "topic")), topic);
  assert_string_equal(json_string_value(json_object_get(p, "topic")), topic);
  assert_int_equal(kl_int(p, "partition"), 0);
  assert_true(json_is_true(json_object_get(p, "owned")));
  assert_string_equal(json_string_value(json_object_get(p, "status")), "OK");
  assert_true(kl_int(p, "epoch") > 0);
  assert_int_equal(kl_int(p, "watermark"), 3);
  assert_int_equal(kl_int(p, "committed"), 3);
  assert_int_equal(kl_int(p, "high"), 3);
  assert_int_equal(kl_int(p, "lag"), 0);
  assert_true(kl_int(p, "last_commit_ms") > 1700000000000LL);
  assert_int_equal(kl_int(p, "records"), 0);
  assert_null(json_object_get(p, "stop_reason"));
  json_decref(doc);
  doc = kl_get(port, "GET", "/v1/keys", 200);
  assert_int_equal(kl_int(doc, "total"), 0);
  assert_true(json_is_null(json_object_get(doc, "next")));
  json_decref(doc);

  /* Five keys whose handler asks to retry, two events on the first. */
  for (int i = 0; i < 6; i++) {
    char key[16];
    snprintf(key, sizeof(key), "poison%d", i ? i - 1 : 0);
    snprintf(id, sizeof(id), "0190a0a0-0000-7000-8000-00000000001%d", i);
    assert_int_equal(kl_t_produce_credit(boot, topic, 0, key, id, 5), 0);
  }
  for (int i = 0; i < 300; i++) {
    doc = kl_get(port, "GET", "/v1/keys?state=retrying", 200);
    if (kl_int(doc, "total") == 5)
      break;
    json_decref(doc);
    doc = NULL;
    kl_t_sleep_ms(100);
  }
  assert_non_null(doc);
  json_t *keys = json_object_get(doc, "keys");
  assert_int_equal(json_array_size(keys), 5);
  json_t *k = json_array_get(keys, 0);
  assert_string_equal(json_string_value(json_object_get(k, "key")), "poison0");
  assert_string_equal(json_string_value(json_object_get(k, "state")),
                      "retrying");
  assert_int_equal(kl_int(k, "partition"), 0);
  assert_int_equal(kl_int(k, "offset"), 3);
  assert_int_equal(kl_int(k, "pending"), 2);
  assert_true(kl_int(k, "attempts") >= 1);
  assert_true(kl_int(k, "first_failure_ms") > 1700000000000LL);
  assert_non_null(strstr(json_string_value(json_object_get(k, "error")),
                         "the test's handler says retry"));
  json_decref(doc);
  doc = kl_get(port, "GET", "/v1/keys?state=waiting,parked", 200);
  assert_int_equal(kl_int(doc, "total"), 0);
  json_decref(doc);
  doc = kl_get(port, "GET", "/v1/partitions", 200);
  p = json_array_get(json_object_get(doc, "partitions"), 0);
  assert_int_equal(kl_int(p, "watermark"), 3);
  assert_int_equal(kl_int(p, "records"), 6);
  assert_true(json_is_true(json_object_get(p, "has_retries")));
  json_decref(doc);

  /* Pages of two lead through the five once, in offset order. */
  char path[128] = "/v1/keys?state=retrying&limit=2";
  int seen = 0, pages = 0;
  json_int_t last = -1;
  for (;;) {
    doc = kl_get(port, "GET", path, 200);
    assert_int_equal(kl_int(doc, "total"), 5);
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(doc, "keys"), i, v) {
      assert_true(kl_int(v, "offset") > last);
      last = kl_int(v, "offset");
      seen++;
    }
    pages++;
    const char *next = json_string_value(json_object_get(doc, "next"));
    if (!next) {
      json_decref(doc);
      break;
    }
    snprintf(path, sizeof(path), "/v1/keys?state=retrying&limit=2&from=%s",
             next);
    json_decref(doc);
    assert_true(pages < 10);
  }
  assert_int_equal(seen, 5);
  assert_int_equal(pages, 3);

  /* One key, plain and percent-encoded; one that holds nothing. */
  doc = kl_get(port, "GET", "/v1/keys/poison3", 200);
  assert_string_equal(json_string_value(json_object_get(doc, "key")),
                      "poison3");
  json_decref(doc);
  doc = kl_get(port, "GET", "/v1/keys/p%6Fison%33", 200);
  assert_string_equal(json_string_value(json_object_get(doc, "key")),
                      "poison3");
  json_decref(doc);
  kl_refused(port, "GET", "/v1/keys/k1", 404, "holds no event");

  /* Bad input. */
  kl_refused(port, "GET", "/v1/keys?state=stuck", 400,
             "use waiting, retrying or parked");
  kl_refused(port, "GET", "/v1/keys?state=waiting,", 400, "not a key state");
  kl_refused(port, "GET", "/v1/keys?limit=0", 400, "from 1 to 1000");
  kl_refused(port, "GET", "/v1/keys?limit=1001", 400, "from 1 to 1000");
  kl_refused(port, "GET", "/v1/keys?limit=99999999999999999999", 400,
             "from 1 to 1000");
  kl_refused(port, "GET", "/v1/keys?from=3", 400, "PARTITION:OFFSET");
  kl_refused(port, "GET", "/v1/keys?from=-1:0", 400, "PARTITION:OFFSET");
  kl_refused(port, "GET", "/v1/keys/%zz", 400, "percent-encoded");
  kl_refused(port, "GET", "/v1/keys/a%4", 400, "percent-encoded");
  kl_refused(port, "GET", "/v1/keys/", 400, "1 to 1024 bytes");
  char *big = malloc(10 + 1025 + 1);
  strcpy(big, "/v1/keys/");
  memset(big + 9, 'a', 1025);
  big[9 + 1025] = '\0';
  kl_refused(port, "GET", big, 400, "1 to 1024 bytes");
  free(big);
  kl_refused(port, "POST", "/v1/keys", 405, "read-only");
  kl_refused(port, "DELETE", "/v1/partitions", 405, "read-only");
  kl_refused(port, "POST", "/v1/fences", 405, "read-only");
  /* Never fenced: no fence listed, and the ring's bound said. */
  doc = kl_get(port, "GET", "/v1/fences", 200);
  assert_int_equal(json_array_size(json_object_get(doc, "fences")), 0);
  assert_int_equal(kl_int(doc, "kept"), KL_WORKER_FENCES_MAX);
  json_decref(doc);

  atomic_store(&kl_poison, 0); /* let it drain, so that it stops */
  kl__metrics_server_stop(server);
  assert_int_equal(kl_t_worker_stop(w), KL_OK);
  kl_store_destroy(store);
  kl_t_cluster_destroy(cluster);
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
