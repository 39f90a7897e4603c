/*
 * `--handler SPEC` (handlers/handler.h): a handler that cannot work on this
 * host or store is refused when `keylane worker` starts, with the reason
 * and exit status 2, rather than dead-lettering every event.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/run.h"
#include "support/support.h"
#include "handlers/handler.h"

/* Commands the shell can run: a program on PATH or at a path, and the
 * shell's own words, which a handler written inline uses. */
static void test_exec_commands_that_run(void **state) {
  (void)state;
  static const char *const specs[] = {
      "exec:while read -r l; do echo '{\"status\":\"ok\"}'; done",
      "exec:read -r l; sleep 1",
      "exec:  cat",
      "exec:/bin/cat -u",
      "exec:exec python3 handler.py",
      "exec:FOO=1 ./not-checked",
      "exec:'quoted program'",
      "exec:$HOME/handler",
  };
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    kl_handler_ref_t ref;
    if (kl__handler_resolve(specs[i], &ref) != KL_OK)
      fail_msg("%s refused: %s", specs[i], kl_err_detail());
    kl__handler_release(&ref);
  }
}

static void test_exec_commands_that_cannot_run(void **state) {
  (void)state;
  char dir[64], script[96], spec[160];
  kl_t_tmpdir(dir);
  snprintf(script, sizeof(script), "%s/handler.py", dir);
  FILE *f = fopen(script, "w");
  assert_non_null(f);
  fputs("print('hi')\n", f);
  fclose(f);
  chmod(script, 0644);
  struct {
    const char *spec;
    const char *says;
  } cases[] = {
      {"exec:/nonexistent/handler --flag",
       "/nonexistent/handler: No such file or directory"},
      {"exec:/tmp", "/tmp is not an executable file"},
      {spec, "is not an executable file; chmod +x it, or run it with its "
             "interpreter"},
      {"exec:no-such-command-kl30 arg", "the shell knows no command "
                                        "\"no-such-command-kl30\""},
  };
  snprintf(spec, sizeof(spec), "exec:%s", script);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl_handler_ref_t ref;
    assert_int_equal(kl__handler_resolve(cases[i].spec, &ref), KL_ECONF);
    if (!strstr(kl_err_detail(), cases[i].says))
      fail_msg("%s: \"%s\" does not say \"%s\"", cases[i].spec, kl_err_detail(),
               cases[i].says);
  }
  kl_t_rmrf(dir);
}

/* `keylane worker` refuses, before it reaches for Kafka, the inventory
 * handler on an LMDB store and an exec handler whose program is not
 * there. Issue 30 item F. */
static void test_worker_refuses_a_handler_that_cannot_work(void **state) {
  (void)state;
  char dir[64];
  kl_t_tmpdir(dir);
  static const struct {
    const char *handler;
    const char *says;
  } cases[] = {
      {"inventory", "--handler inventory runs its SQL on the batch's "
                    "PostgreSQL connection, and the lmdb store has none"},
      {"exec:/nonexistent/handler", "/nonexistent/handler: No such file"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kl_t_run_t r;
    kl_t_run_for((const char *[]){"worker", "-b", "127.0.0.1:1", "-t", "events",
                                  "--store", dir, "--handler", cases[i].handler,
                                  "--kafka-wait", "0", NULL},
                 NULL, 0, 20000, &r);
    if (r.rc != 2 || !strstr(r.err, cases[i].says))
      fail_msg("--handler %s: exit %d, stderr: %s", cases[i].handler, r.rc,
               r.err);
    kl_t_run_free(&r);
  }
  kl_t_rmrf(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exec_commands_that_run),
      cmocka_unit_test(test_exec_commands_that_cannot_run),
      cmocka_unit_test(test_worker_refuses_a_handler_that_cannot_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
