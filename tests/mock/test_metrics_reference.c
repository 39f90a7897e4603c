/*
 * docs/metrics.md is generated here, from the registries themselves: the
 * worker's /metrics (cli/metrics_server.c, and the histograms the worker
 * keeps) and the gateway's (broker/gateway_routes.c). The test fails when
 * the file differs from what they register, or when a metric's help says
 * too little to be a description. KEYLANE_UPDATE_DOCS=1 rewrites the file:
 *   KEYLANE_UPDATE_DOCS=1 ctest -R '^test_metrics_reference$'
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker/gateway_internal.h"
#include "cli/metrics_server.h"
#include "common/metrics.h"
#include "common/strbuf.h"

#include "support/source.h"
#include "support/support.h"

static const char kl_head[] =
    "# Metrics reference\n"
    "\n"
    "<!-- Generated from the metrics registries by\n"
    "tests/mock/test_metrics_reference.c, which fails when this file\n"
    "differs from them: KEYLANE_UPDATE_DOCS=1 ctest -R\n"
    "'^test_metrics_reference$' rewrites it. -->\n"
    "\n"
    "Every metric keylane exports, in the Prometheus text format\n"
    "(docs/operations.md, \"Metrics, health and the dashboard\", says how to\n"
    "read them and which to alert on). A counter only grows; a gauge is a\n"
    "value now; a histogram has `_bucket{le}`, `_sum` and `_count` series.\n"
    "A family holds 256 series at most: past that, new label values go to\n"
    "one series whose labels are all `_overflow`, counted in\n"
    "`keylane_metrics_overflow_total`.\n";

static const char kl_table[] = "| metric | type | labels | meaning |\n"
                               "|---|---|---|---|\n";

/* The worker's rows: an idle worker's metrics server (nothing listens
 * at its bootstrap: the families are registered whether or not it runs). */
static void kl_worker_rows(kl__strbuf_t *doc) {
  char dir[64];
  kl_t_tmpdir(dir);
  kl_store_t *store;
  assert_int_equal(kl_store_open(dir, NULL, &store), KL_OK);
  kl_t_worker_t *w =
      kl_t_worker_new("127.0.0.1:1", "events", "reference", store, NULL);
  kl__metrics_server_t *server;
  assert_int_equal(kl__metrics_server_start("127.0.0.1:0", NULL, "events",
                                            w->worker, store, &server),
                   KL_OK);
  kl__metrics_server_describe(server, doc);
  kl__metrics_server_stop(server);
  kl_worker_destroy(w->worker);
  free(w);
  kl_store_destroy(store);
  kl_t_rmrf(dir);
}

/* The gateway's rows: its registry, registered as at its start. */
static void kl_gateway_rows(kl__strbuf_t *doc) {
  kl__gateway_t *gw = calloc(1, sizeof(*gw));
  assert_non_null(gw);
  assert_int_equal(kl__gw_metrics_init(gw), KL_OK);
  kl__metrics_describe(gw->m.registry, doc);
  kl__metrics_destroy(gw->m.registry);
  free(gw);
}

static char *kl_reference(void) {
  kl__strbuf_t doc = KL__STRBUF_INIT;
  kl__strbuf_puts(&doc, kl_head);
  kl__strbuf_puts(&doc, "\n## The worker\n\n"
                        "`keylane worker --metrics-listen ADDR:PORT`, GET "
                        "/metrics.\n\n");
  kl__strbuf_puts(&doc, kl_table);
  kl_worker_rows(&doc);
  /* The gateway's own table; the overflow counter is the worker's row. */
  kl__strbuf_t gw = KL__STRBUF_INIT;
  kl__strbuf_puts(&gw, "| `keylane_metrics_overflow_total` |");
  size_t skip = gw.len;
  kl_gateway_rows(&gw);
  kl__strbuf_puts(&doc, "\n## The gateway\n\n"
                        "`keylane broker --listen ADDR:PORT`, GET /metrics; "
                        "it has `keylane_metrics_overflow_total` too.\n\n");
  kl__strbuf_puts(&doc, kl_table);
  kl__strbuf_add(&doc, gw.data + skip, gw.len - skip);
  kl__strbuf_free(&gw);
  assert_true(kl__strbuf_ok(&doc));
  size_t len;
  return kl__strbuf_take(&doc, &len);
}

static void test_reference_is_current(void **state) {
  (void)state;
  char *want = kl_reference();
  char path[4096];
  kl_t_source_path("docs/metrics.md", path, sizeof(path));
  if (getenv("KEYLANE_UPDATE_DOCS")) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(want, f);
    assert_int_equal(fclose(f), 0);
  }
  char *doc = kl_t_source_file("docs/metrics.md");
  if (strcmp(doc, want) != 0) {
    size_t i = 0, line = 1;
    for (; doc[i] && doc[i] == want[i]; i++)
      line += doc[i] == '\n';
    fail_msg("docs/metrics.md differs from the registries from line %zu: a "
             "metric was added, renamed or redescribed; rewrite it with "
             "KEYLANE_UPDATE_DOCS=1 ctest -R '^test_metrics_reference$'",
             line);
  }
  free(doc);
  free(want);
}

/* Every row's meaning: a few words at least. */
static void test_every_metric_is_described(void **state) {
  (void)state;
  char *doc = kl_reference();
  size_t rows = 0;
  for (char *line = strtok(doc, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "| `", 3) != 0)
      continue;
    rows++;
    char *end = strrchr(line, '|');
    *end = '\0';
    const char *meaning = strrchr(line, '|') + 1;
    size_t words = 0;
    for (const char *p = meaning; *p; p++)
      words += *p != ' ' && (p == meaning || p[-1] == ' ');
    if (words < 3)
      fail_msg("%s| has no description: give it a help text of what it "
               "counts",
               line);
  }
  assert_true(rows >= 50);
  free(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_is_current),
      cmocka_unit_test(test_every_metric_is_described),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
