/*
 * The publish-side subcommands through the real executable (KEYLANE_BIN):
 * keylane route, keylane broker --embedded, keylane publish.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keylane/producer.h"

/* ---- running the binary ---- */

typedef struct kl_run {
  int rc;
  char *out; /* NUL terminated */
  char *err;
} kl_run_t;

static const char *kl_bin(void) {
  const char *bin = getenv("KEYLANE_BIN");
  if (!bin)
    fail_msg("KEYLANE_BIN is not set: run this through ctest");
  return bin;
}

static int kl_tmpfile(const char *data, size_t len) {
  char path[] = "/tmp/keylane-cli-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  if (len)
    assert_int_equal(write(fd, data, len), (ssize_t)len);
  lseek(fd, 0, SEEK_SET);
  return fd;
}

static char *kl_slurp(int fd) {
  off_t size = lseek(fd, 0, SEEK_END);
  char *buf = malloc((size_t)size + 1);
  assert_non_null(buf);
  assert_int_equal(pread(fd, buf, (size_t)size, 0), (ssize_t)size);
  buf[size] = '\0';
  close(fd);
  return buf;
}

/* Runs keylane with @p args (NULL-terminated, without argv[0]); stdin,
 * stdout and stderr are files, so no pipe can fill up and block. */
static void kl_run(const char *const *args, const char *input, kl_run_t *r) {
  const char *argv[32] = {kl_bin()};
  for (size_t i = 0; args[i]; i++)
    argv[i + 1] = args[i];
  int in = kl_tmpfile(input, input ? strlen(input) : 0);
  int out = kl_tmpfile(NULL, 0), err = kl_tmpfile(NULL, 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(in);
  r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r->out = kl_slurp(out);
  r->err = kl_slurp(err);
}

static void kl_run_free(kl_run_t *r) {
  free(r->out);
  free(r->err);
}

/* ---- keylane route ---- */

static void test_route_args(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "50", "foobar", "21",
                          "abc", NULL},
         NULL, &r);
  assert_int_equal(r.rc, 0);
  char want[128];
  snprintf(want, sizeof(want), "foobar\t16\n21\t%d\nabc\t%d\n",
           (int)kl_partition("21", 2, 50), (int)kl_partition("abc", 3, 50));
  assert_string_equal(r.out, want);
  kl_run_free(&r);
}

static void test_route_stdin(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "7", NULL},
         "acct-1\nacct-2\nlast-no-newline", &r);
  assert_int_equal(r.rc, 0);
  char want[128];
  snprintf(want, sizeof(want), "acct-1\t%d\nacct-2\t%d\nlast-no-newline\t%d\n",
           (int)kl_partition("acct-1", 6, 7), (int)kl_partition("acct-2", 6, 7),
           (int)kl_partition("last-no-newline", 15, 7));
  assert_string_equal(r.out, want);
  kl_run_free(&r);
}

static void test_route_bad_key_names_line(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"route", "--partitions", "7", NULL}, "a\n\nb\n", &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "stdin line 2"));
  assert_non_null(strstr(r.err, "empty"));
  assert_int_equal(strncmp(r.out, "a\t", 2), 0); /* line 1 came out */
  kl_run_free(&r);

  char *big = malloc(2000);
  memset(big, 'k', 1025);
  strcpy(big + 1025, "\n");
  kl_run((const char *[]){"route", "--partitions", "7", NULL}, big, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "stdin line 1: the key is 1025 bytes, the "
                                "limit is 1024"));
  kl_run_free(&r);
  free(big);

  kl_run((const char *[]){"route", "k", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--partitions N is required"));
  kl_run_free(&r);
}

static void test_help_everywhere(void **state) {
  (void)state;
  const char *subs[] = {"route", "broker"};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    kl_run_t r;
    kl_run((const char *[]){subs[i], "--help", NULL}, NULL, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "usage: keylane"));
    assert_non_null(strstr(r.out, "examples:"));
    kl_run_free(&r);
  }
}

/* ---- keylane broker --embedded ---- */

typedef struct kl_broker {
  pid_t pid;
  FILE *out;
  char bootstrap[600];
} kl_broker_t;

/* Starts `keylane broker --embedded ARGS...` and reads its first line. */
static void kl_broker_start(kl_broker_t *b, const char *const *args) {
  const char *argv[32] = {kl_bin(), "broker", "--embedded"};
  for (size_t i = 0; args && args[i]; i++)
    argv[i + 3] = args[i];
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  b->pid = fork();
  assert_true(b->pid >= 0);
  if (b->pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  b->out = fdopen(fds[0], "r");
  char line[600];
  assert_non_null(fgets(line, sizeof(line), b->out));
  assert_int_equal(strncmp(line, "bootstrap=127.0.0.1:", 20), 0);
  line[strcspn(line, "\n")] = '\0';
  snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", line + 10);
}

static int kl_broker_stop(kl_broker_t *b, int sig) {
  kill(b->pid, sig);
  int status;
  assert_int_equal(waitpid(b->pid, &status, 0), b->pid);
  fclose(b->out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_broker_embedded_sigterm(void **state) {
  (void)state;
  char file[64];
  snprintf(file, sizeof(file), "/tmp/keylane-bootstrap-%d", (int)getpid());
  kl_broker_t b;
  kl_broker_start(&b, (const char *[]){"-t", "orders", "--partitions", "5",
                                       "--brokers", "2", "--bootstrap-file",
                                       file, NULL});
  assert_non_null(strchr(b.bootstrap, ',')); /* two brokers */
  FILE *f = fopen(file, "r");
  assert_non_null(f);
  char line[600];
  assert_non_null(fgets(line, sizeof(line), f));
  fclose(f);
  char want[700];
  snprintf(want, sizeof(want), "bootstrap=%s\n", b.bootstrap);
  assert_string_equal(line, want);
  assert_int_equal(kl_broker_stop(&b, SIGTERM), 0);
  assert_int_equal(access(file, F_OK), -1); /* removed at exit */
}

static void test_broker_embedded_sigint(void **state) {
  (void)state;
  kl_broker_t b;
  kl_broker_start(&b, NULL);
  assert_int_equal(kl_broker_stop(&b, SIGINT), 0);
}

static void test_broker_bad_flags(void **state) {
  (void)state;
  kl_run_t r;
  kl_run((const char *[]){"broker", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--embedded"));
  kl_run_free(&r);
  kl_run((const char *[]){"broker", "--embedded", "--brokers", "0", NULL}, NULL,
         &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--brokers takes a number from 1 to 16"));
  kl_run_free(&r);
  kl_run((const char *[]){"broker", "--embedded", "-t", "a b", NULL}, NULL, &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "topic \"a b\""));
  kl_run_free(&r);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_route_args),
      cmocka_unit_test(test_route_stdin),
      cmocka_unit_test(test_route_bad_key_names_line),
      cmocka_unit_test(test_help_everywhere),
      cmocka_unit_test(test_broker_embedded_sigterm),
      cmocka_unit_test(test_broker_embedded_sigint),
      cmocka_unit_test(test_broker_bad_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
