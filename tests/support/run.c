#include "support/run.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/support.h"

static int kl_run_tmpfile(const char *data, size_t len) {
  char path[] = "/tmp/keylane-cli-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  if (len)
    assert_int_equal(write(fd, data, len), (ssize_t)len);
  lseek(fd, 0, SEEK_SET);
  return fd;
}

static char *kl_run_slurp(int fd) {
  off_t size = lseek(fd, 0, SEEK_END);
  char *buf = malloc((size_t)size + 1);
  assert_non_null(buf);
  assert_int_equal(pread(fd, buf, (size_t)size, 0), (ssize_t)size);
  buf[size] = '\0';
  close(fd);
  return buf;
}

/* waitpid, with SIGTERM once @p term_ms and SIGKILL once @p timeout_ms
 * have passed (-1: never). */
static int kl_run_wait(pid_t pid, int term_ms, int timeout_ms) {
  int status;
  bool poll = term_ms >= 0 || timeout_ms >= 0;
  for (int waited = 0;; waited++) {
    pid_t got = waitpid(pid, &status, poll ? WNOHANG : 0);
    assert_true(got >= 0);
    if (got == pid)
      return status;
    if (waited == term_ms)
      kill(pid, SIGTERM);
    if (waited == timeout_ms)
      kill(pid, SIGKILL);
    kl_t_sleep_ms(1);
  }
}

static void kl_run(const char *const *args, const char *input, size_t len,
                   int term_ms, int timeout_ms, kl_t_run_t *r);

void kl_t_run(const char *const *args, const char *input, size_t len,
              kl_t_run_t *r) {
  kl_run(args, input, len, -1, -1, r);
}

void kl_t_run_for(const char *const *args, const char *input, size_t len,
                  int timeout_ms, kl_t_run_t *r) {
  kl_run(args, input, len, -1, timeout_ms, r);
}

void kl_t_run_term(const char *const *args, int term_ms, int timeout_ms,
                   kl_t_run_t *r) {
  kl_run(args, NULL, 0, term_ms, timeout_ms, r);
}

static void kl_run(const char *const *args, const char *input, size_t len,
                   int term_ms, int timeout_ms, kl_t_run_t *r) {
  const char *argv[48] = {kl_t_bin()};
  size_t n = 0;
  for (; args[n]; n++) {
    assert_true(n + 2 < sizeof(argv) / sizeof(argv[0]));
    argv[n + 1] = args[n];
  }
  int in = kl_run_tmpfile(input, input ? len : 0);
  int out = kl_run_tmpfile(NULL, 0), err = kl_run_tmpfile(NULL, 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = kl_run_wait(pid, term_ms, timeout_ms);
  close(in);
  r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r->out = kl_run_slurp(out);
  r->err = kl_run_slurp(err);
}

void kl_t_run_free(kl_t_run_t *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

int kl_t_run_until(const char *const *args, const char *needle,
                   int timeout_ms) {
  int found = 0;
  for (int waited = 0; !found && waited < timeout_ms; waited += 200) {
    kl_t_run_t r;
    usleep(200 * 1000);
    kl_t_run(args, NULL, 0, &r);
    found = r.rc == 0 && strstr(r.out, needle);
    kl_t_run_free(&r);
  }
  return found;
}

json_t *kl_t_run_json(const kl_t_run_t *r) {
  json_error_t jerr;
  json_t *j = json_loads(r->out, 0, &jerr);
  if (!j)
    fail_msg("not JSON (%s): %s", jerr.text, r->out);
  return j;
}
