/*
 * Store locations (store/location.h): which are PostgreSQL's, their
 * redaction, and the scrubbing of messages that may quote them. A
 * password is masked where it stands as a password, however short, and
 * nowhere else: "a" or "pg" inside a word of libpq's message stays. The
 * end-to-end half opens a PostgreSQL location on a port nobody listens
 * on (no server needed) and reads the error a user reads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keylane/store.h"
#include "store/location.h"

#define T_PW "Pw-s3cr3t-71"

static void t_assert_redacted(const char *location, const char *want) {
  char out[KL__LOCATION_MAX];
  kl__location_redact(location, out, sizeof(out));
  if (strcmp(out, want) != 0)
    fail_msg("redacted \"%s\" as \"%s\", want \"%s\"", location, out, want);
}

static void t_assert_scrubbed(const char *location, const char *text,
                              const char *want) {
  char out[KL__LOCATION_MAX];
  kl__location_scrub(location, text, out, sizeof(out));
  if (strcmp(out, want) != 0)
    fail_msg("scrubbed for %s:\n  \"%s\"\nas\n  \"%s\"\nwant\n  \"%s\"",
             location, text, out, want);
}

static void test_redact(void **state) {
  (void)state;
  t_assert_redacted("postgresql://kl:" T_PW "@db:5432/kl",
                    "postgresql://kl:****@db:5432/kl");
  t_assert_redacted("postgres://kl:" T_PW "@db/kl?sslmode=require&password=x1y",
                    "postgres://kl:****@db/kl?sslmode=require&password=****");
  t_assert_redacted("postgresql://kl@db/kl", "postgresql://kl@db/kl");
  t_assert_redacted("host=db password=" T_PW " dbname=kl",
                    "host=db password=**** dbname=kl");
  t_assert_redacted("host=db password = 'a b\\' c' user=kl",
                    "host=db password = '****' user=kl");
  t_assert_redacted("dbname=postgresql://kl:" T_PW "@db/kl",
                    "dbname=postgresql://kl:****@db/kl");
  t_assert_redacted("postgresql://kl:a@db/kl", "postgresql://kl:****@db/kl");
  t_assert_redacted("/var/lib/keylane", "/var/lib/keylane");
  assert_true(kl__location_is_pg("host=db dbname=kl"));
  assert_true(kl__location_is_pg(" dbname = kl"));
  assert_true(kl__location_is_pg("postgres://db/kl"));
  assert_false(kl__location_is_pg("/var/lib/keylane"));
  assert_false(kl__location_is_pg("./host=db"));
  assert_false(kl__location_is_pg("data"));
}

/* A long password, in each way libpq quotes one: the location, a query
 * parameter, a percent-encoded token, as written and decoded. */
static void test_scrub_long(void **state) {
  (void)state;
  t_assert_scrubbed("postgresql://kl:" T_PW "@db/kl",
                    "unexpected character \"!\" at position 9 in URI: "
                    "\"postgresql://kl:" T_PW "@db/kl\"",
                    "unexpected character \"!\" at position 9 in URI: "
                    "\"postgresql://kl:****@db/kl\"");
  t_assert_scrubbed("postgresql://kl:P%41ss-w0rd@db/kl",
                    "at postgresql://kl:P%41ss-w0rd@db/kl: invalid "
                    "percent-encoded token: \"P%41ss-w0rd\"; \"PAss-w0rd\"",
                    "at postgresql://kl:****@db/kl: invalid percent-encoded "
                    "token: \"****\"; \"****\"");
  t_assert_scrubbed("postgresql://db/kl?password=" T_PW "&x=1",
                    "missing key/value separator in \"password=" T_PW "\"",
                    "missing key/value separator in \"password=****\"");
  t_assert_scrubbed("host=db password='" T_PW "' port=x",
                    "invalid integer value \"x\" for connection option "
                    "\"port\" ('" T_PW "')",
                    "invalid integer value \"x\" for connection option "
                    "\"port\" ('****')");
}

/* Short passwords: masked where they stand as the password, and the
 * words that hold their letters left whole. */
static void test_scrub_short(void **state) {
  (void)state;
  const char *refused =
      "connection to server at \"127.0.0.1\", port 1 failed: Connection "
      "refused Is the server running on that host and accepting TCP/IP "
      "connections?";
  t_assert_scrubbed("postgresql://kl:a@127.0.0.1:1/x", refused, refused);
  t_assert_scrubbed("postgresql://kl:on@127.0.0.1:1/x", refused, refused);
  t_assert_scrubbed("postgresql://kl:the@127.0.0.1:1/x", refused, refused);
  const char *hba = "connection to server at \"db\", port 5432 failed: FATAL: "
                    "no pg_hba.conf entry for host \"10.0.0.2\", user "
                    "\"keylane\", database \"kl\", SSL off";
  t_assert_scrubbed("host=db user=keylane password=pg dbname=kl", hba, hba);
  t_assert_scrubbed("postgresql://keylane:key@db/kl", hba, hba);
  t_assert_scrubbed("postgresql://kl:a@db/kl?x",
                    "invalid URI query parameter: \"x\" in "
                    "\"postgresql://kl:a@db/kl?x\"",
                    "invalid URI query parameter: \"x\" in "
                    "\"postgresql://kl:****@db/kl?x\"");
  t_assert_scrubbed("postgresql://kl:pg%zz@db/kl",
                    "invalid percent-encoded token: \"pg%zz\"",
                    "invalid percent-encoded token: \"****\"");
  t_assert_scrubbed("postgresql://db/kl?password=a=b",
                    "extra key/value separator \"=\" in URI query parameter: "
                    "\"password=a=b\"",
                    "extra key/value separator \"=\" in URI query parameter: "
                    "\"password=****\"");
}

/* What a user reads when the server is not there: libpq's message whole,
 * whatever the password's letters. */
static void test_open_error_reads_whole(void **state) {
  (void)state;
  static const char *const pws[] = {"a", "on", "the", T_PW};
  for (size_t i = 0; i < sizeof(pws) / sizeof(pws[0]); i++) {
    char uri[128];
    snprintf(uri, sizeof(uri), "postgresql://kl:%s@127.0.0.1:1/x", pws[i]);
    kl_store_t *store = NULL;
    assert_int_not_equal(kl_store_open(uri, NULL, &store), KL_OK);
    const char *detail = kl_err_detail();
    if (!strstr(detail, "Is the server running on that host and accepting"))
      fail_msg("password \"%s\": the error reads \"%s\"", pws[i], detail);
    if (strstr(detail, T_PW))
      fail_msg("the error holds the password: \"%s\"", detail);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_redact),
      cmocka_unit_test(test_scrub_long),
      cmocka_unit_test(test_scrub_short),
      cmocka_unit_test(test_open_error_reads_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
