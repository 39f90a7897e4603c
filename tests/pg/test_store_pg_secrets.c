/*
 * No command prints a PostgreSQL store's password (store/location.h): the
 * executable (KEYLANE_BIN) is run with a store location that holds a known
 * password, as a URI (in its user info and as a password= parameter) and
 * as a keyword/value connection string, and every byte it writes is
 * searched for it: store stats (text and --json), store outbox --json,
 * doctor (text and --json), every "cannot open the store" error (worker,
 * ledger, store stats, doctor: a port nobody listens on) and the errors
 * of a location libpq cannot read. The keyword form opens as PostgreSQL,
 * not as an LMDB path (tests/unit/test_location.c checks the redaction
 * itself). Skips, saying why, when PostgreSQL is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/embedded.h"
#include "keylane/store.h"
#include "support/pg_group.h"
#include "support/run.h"

#define T_PW "Pw-s3cr3t-71"

/* Runs keylane @p args and fails, showing everything it wrote, when its
 * output holds the password or lacks @p want (NULL: anything). */
static void t_run_clean(const char *const *args, const char *want) {
  kl_t_run_t r;
  kl_t_run_for(args, NULL, 0, 60000, &r);
  char cmd[256] = "";
  for (size_t i = 0; args[i] && i < 3; i++)
    snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), "%s ", args[i]);
  if (strstr(r.out, T_PW) || strstr(r.err, T_PW))
    fail_msg("keylane %sprinted the password (exit %d):\nstdout: %s\n"
             "stderr: %s",
             cmd, r.rc, r.out, r.err);
  if (want && !strstr(r.out, want) && !strstr(r.err, want))
    fail_msg("keylane %s(exit %d) did not say \"%s\":\nstdout: %s\n"
             "stderr: %s",
             cmd, r.rc, want, r.out, r.err);
  kl_t_run_free(&r);
}

/* Every command on one location: @p good opens the store, @p bad (the
 * same with a port nobody listens on) does not. */
static void t_commands(const char *good, const char *bad, const char *boot) {
  t_run_clean((const char *[]){"store", "stats", "--store", good, NULL},
              "(postgresql)");
  t_run_clean(
      (const char *[]){"store", "stats", "--store", good, "--json", NULL},
      "\"store\":");
  t_run_clean(
      (const char *[]){"store", "outbox", "--store", good, "--json", NULL},
      "\"follow_ups\"");
  t_run_clean((const char *[]){"doctor", "-b", boot, "-t", "events", "--store",
                               good, NULL},
              "store-version: store ");
  t_run_clean((const char *[]){"doctor", "-b", boot, "-t", "events", "--store",
                               good, "--json", NULL},
              "store-version");
  t_run_clean((const char *[]){"store", "stats", "--store", bad, NULL},
              "cannot open the store");
  t_run_clean((const char *[]){"ledger", "--store", bad, NULL},
              "cannot open the store");
  t_run_clean((const char *[]){"doctor", "-b", boot, "-t", "events", "--store",
                               bad, NULL},
              "cannot open the store");
  t_run_clean((const char *[]){"worker", "-b", boot, "-t", "events", "--store",
                               bad, "--handler", "ledger", "--store-wait", "1s",
                               NULL},
              "cannot open the store");
}

static void test_no_command_prints_the_password(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char uri[256];
  assert_int_equal(kl_t_pg_createdb(pg, "secrets", uri, sizeof(uri)), 0);
  kl_store_t *store;
  assert_int_equal(kl_store_open(uri, NULL, &store), KL_OK); /* the schema */
  kl_store_destroy(store);
  kl_embedded_t *cluster;
  assert_int_equal(kl_embedded_new(1, "events", 1, &cluster), KL_OK);
  const char *boot = kl_embedded_bootstrap(cluster);

  /* The server trusts its clients: the password is sent, never checked. */
  char good[512], bad[512];
  snprintf(good, sizeof(good),
           "postgresql://keylane:" T_PW "@127.0.0.1:%d/secrets", pg->port);
  snprintf(bad, sizeof(bad), "postgresql://keylane:" T_PW "@127.0.0.1:1/x");
  t_commands(good, bad, boot);
  snprintf(good, sizeof(good),
           "postgresql://keylane@127.0.0.1:%d/secrets?password=" T_PW,
           pg->port);
  t_commands(good, bad, boot);
  snprintf(good, sizeof(good),
           "host=127.0.0.1 port=%d dbname=secrets user=keylane password=" T_PW,
           pg->port);
  snprintf(bad, sizeof(bad),
           "host=127.0.0.1 port=1 dbname=x user=keylane password='" T_PW "'");
  t_commands(good, bad, boot);

  /* Locations libpq cannot read: a keyword without a value, a parameter
   * it does not know. Refused as PostgreSQL locations, never echoed. */
  t_run_clean((const char *[]){"store", "stats", "--store",
                               "host=127.0.0.1 password=" T_PW " port", NULL},
              "cannot read the store location: missing \"=\"");
  t_run_clean((const char *[]){"store", "stats", "--store",
                               "postgresql://kl:" T_PW "@db/kl?bogus=1", NULL},
              "cannot read the store location: invalid URI query parameter");
  kl_embedded_destroy(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_command_prints_the_password),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
