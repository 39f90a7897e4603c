/* Bearer tokens: the file format, refusals, and matching. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/token.h"

static kl_err_t kl_load_n(const char *text, size_t len, kl__tokens_t **out) {
  char path[] = "/tmp/keylane-tokens-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, len), (ssize_t)len);
  close(fd);
  kl_err_t err = kl__tokens_load(path, out);
  unlink(path);
  return err;
}

static kl_err_t kl_load(const char *text, kl__tokens_t **out) {
  return kl_load_n(text, strlen(text), out);
}

static void test_match(void **state) {
  kl__tokens_t *t = NULL;
  assert_int_equal(kl_load("# ops\n\nalpha\r\n  beta  \n\tgamma\n", &t), KL_OK);
  assert_int_equal(kl__tokens_count(t), 3);
  assert_true(kl__tokens_check(t, "alpha", 5));
  assert_true(kl__tokens_check(t, "beta", 4));
  assert_true(kl__tokens_check(t, "gamma", 5));
  assert_false(kl__tokens_check(t, "alph", 4));
  assert_false(kl__tokens_check(t, "alphaa", 6));
  assert_false(kl__tokens_check(t, "Alpha", 5));
  assert_false(kl__tokens_check(t, "", 0));
  assert_false(kl__tokens_check(t, "# ops", 5));
  char big[KL_TOKEN_MAX + 2];
  memset(big, 'a', sizeof(big));
  assert_false(kl__tokens_check(t, big, sizeof(big)));
  kl__tokens_destroy(t);
}

static void test_refused_files(void **state) {
  kl__tokens_t *t = NULL;
  assert_int_equal(kl_load("# nothing\n\n", &t), KL_ECONF);
  assert_int_equal(kl_load("two words\n", &t), KL_ECONF);
  /* The detail names the line, never the secret. */
  assert_null(strstr(kl_err_detail(), "words"));
  char big[KL_TOKEN_MAX + 8];
  memset(big, 'x', sizeof(big) - 2);
  big[sizeof(big) - 2] = '\n';
  big[sizeof(big) - 1] = '\0';
  assert_int_equal(kl_load(big, &t), KL_ECONF);
  assert_int_equal(kl__tokens_load("/nonexistent/tokens", &t), KL_EIO);
  assert_null(t);
}

/* A file that never ends is refused at once, not read forever; NUL bytes
 * and oversize files too. */
static void test_unbounded_files_refused(void **state) {
  kl__tokens_t *t = NULL;
  assert_int_equal(kl__tokens_load("/dev/zero", &t), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "larger than"));
  assert_null(t);
  static const char nul[] = "good-token-000001\nbad\0token\n";
  assert_int_equal(kl_load_n(nul, sizeof(nul) - 1, &t), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "line 2"));
  char *big = malloc(KL_TOKENS_FILE_MAX + 2);
  memset(big, '#', KL_TOKENS_FILE_MAX + 1);
  big[KL_TOKENS_FILE_MAX + 1] = '\0';
  assert_int_equal(kl_load(big, &t), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "larger than"));
  free(big);
}

/* A file every user can read, or a short token, loads with a warning that
 * says what to do and never shows a token. */
static void test_warnings(void **state) {
  kl__tokens_t *t = NULL;
  char path[] = "/tmp/keylane-tokens-XXXXXX";
  int fd = mkstemp(path); /* mode 0600 */
  const char *good = "0123456789abcdef0123\n";
  assert_int_equal(write(fd, good, strlen(good)), (ssize_t)strlen(good));
  close(fd);
  assert_int_equal(kl__tokens_load(path, &t), KL_OK);
  assert_null(kl__tokens_warning(t));
  kl__tokens_destroy(t);
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(kl__tokens_load(path, &t), KL_OK);
  assert_non_null(kl__tokens_warning(t));
  assert_non_null(strstr(kl__tokens_warning(t), "chmod 600"));
  assert_null(strstr(kl__tokens_warning(t), "0123456789abcdef"));
  kl__tokens_destroy(t);
  unlink(path);
  assert_int_equal(kl_load("0123456789abcdef0123\nshort-secret\n", &t), KL_OK);
  assert_non_null(kl__tokens_warning(t));
  assert_non_null(strstr(kl__tokens_warning(t), "12 bytes"));
  assert_null(strstr(kl__tokens_warning(t), "short-secret"));
  kl__tokens_destroy(t);
}

/* Tokens from text (an environment variable): the file's format, and
 * refusals that name the variable and never the secret. */
static void test_parse_text(void **state) {
  kl__tokens_t *t = NULL;
  assert_int_equal(kl__tokens_parse("KL_ENV", "  console-secret-0123\n", &t),
                   KL_OK);
  assert_int_equal(kl__tokens_count(t), 1);
  assert_true(kl__tokens_check(t, "console-secret-0123", 19));
  assert_false(kl__tokens_check(t, "  console-secret-0123", 21));
  kl__tokens_destroy(t);
  t = NULL;
  assert_int_equal(kl__tokens_parse("KL_ENV", "", &t), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "KL_ENV is empty"));
  assert_int_equal(kl__tokens_parse("KL_ENV", "two words", &t), KL_ECONF);
  assert_non_null(strstr(kl_err_detail(), "KL_ENV"));
  assert_null(strstr(kl_err_detail(), "words"));
  assert_null(t);
  (void)state;
}

static void test_ct_equal(void **state) {
  assert_true(kl__ct_equal("abc", "abc", 3));
  assert_false(kl__ct_equal("abc", "abd", 3));
  assert_true(kl__ct_equal("", "", 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_match),
      cmocka_unit_test(test_refused_files),
      cmocka_unit_test(test_unbounded_files_refused),
      cmocka_unit_test(test_warnings),
      cmocka_unit_test(test_parse_text),
      cmocka_unit_test(test_ct_equal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
