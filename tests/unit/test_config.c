/*
 * The configuration reference: docs/configuration.md is exactly what
 * `keylane config --markdown` prints from the key table, and every key of
 * the table says what it does, with a default its own checks accept.
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

#include "common/conf.h"
#include "common/internal.h"
#include "support/run.h"

/* The file at @p rel under KEYLANE_SOURCE_DIR, whole (the caller frees). */
static char *kl_source_file(const char *rel) {
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", src ? src : ".", rel);
  FILE *f = fopen(path, "r");
  if (!f)
    fail_msg("cannot read %s (KEYLANE_SOURCE_DIR)", path);
  char *text = NULL;
  size_t cap = 0, len = 0, n;
  do {
    if (len + 4096 + 1 > cap)
      text = realloc(text, cap = (len + 4096 + 1) * 2);
    n = fread(text + len, 1, 4096, f);
    len += n;
  } while (n > 0);
  fclose(f);
  text[len] = '\0';
  return text;
}

/* The first line where @p a and @p b differ, for the message. */
static int kl_first_diff(const char *a, const char *b, const char **where) {
  int line = 1;
  const char *start = a;
  for (; *a && *a == *b; a++, b++)
    if (*a == '\n')
      line++, start = a + 1;
  *where = start;
  return line;
}

static void test_reference_is_current(void **state) {
  (void)state;
  char *doc = kl_source_file("docs/configuration.md");
  kl_t_run_t r;
  kl_t_run((const char *[]){"config", "--markdown", NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  if (strcmp(doc, r.out) != 0) {
    const char *where;
    int line = kl_first_diff(r.out, doc, &where);
    fail_msg("docs/configuration.md differs from `keylane config --markdown` "
             "from line %d (\"%.*s\"): the key table changed; run "
             "build/bin/keylane config --markdown > docs/configuration.md",
             line, (int)strcspn(where, "\n"), where);
  }
  kl_t_run_free(&r);
  free(doc);
}

static size_t kl_words(const char *s) {
  size_t n = 0;
  for (const char *p = s; *p; p++)
    n += (p == s || p[-1] == ' ') && *p != ' ';
  return n;
}

/* Every key: a description of a few words at least, a default that its
 * own type and range accept, and for a number the unit the reference
 * shows (milliseconds, a duration or a size). */
static void test_every_key_is_described(void **state) {
  (void)state;
  const kl__conf_key_t *k;
  size_t n = 0;
  kl_conf_t *conf = kl_conf_new();
  for (size_t i = 0; (k = kl__conf_key_at(i)); i++, n++) {
    if (!k->doc || kl_words(k->doc) < 3)
      fail_msg("%s has no description of what it does", k->name);
    if (kl_conf_set(conf, k->name, k->def) != KL_OK)
      fail_msg("%s's default \"%s\" is refused: %s", k->name, k->def,
               kl_err_detail());
    assert_ptr_equal(kl__conf_key_find(k->name), k);
    if (k->type == KL__CONF_ENUM)
      assert_true(kl__conf_enum_has(k->values, k->def));
    if (k->type != KL__CONF_ENUM && k->type != KL__CONF_STR)
      assert_true(k->min <= k->max);
  }
  kl_conf_destroy(conf);
  assert_true(n >= 55); /* the table and the gateway's keys */
  assert_null(kl__conf_key_find("kafka.linger.ms"));
  /* The reference gives each number's unit: its type and its range. */
  kl_t_run_t r;
  kl_t_run((const char *[]){"config", "--markdown", NULL}, NULL, 0, &r);
  for (size_t i = 0; (k = kl__conf_key_at(i)); i++) {
    char row[256];
    snprintf(row, sizeof(row), "| `%s` | ", k->name);
    const char *at = strstr(r.out, row);
    if (!at)
      fail_msg("the reference has no row for %s", k->name);
    at += strlen(row);
    static const char *const units[] = {[KL__CONF_MS] = "milliseconds |",
                                        [KL__CONF_DURATION] = "duration |",
                                        [KL__CONF_SIZE] = "size |"};
    if (k->type >= KL__CONF_MS && k->type <= KL__CONF_SIZE &&
        strncmp(at, units[k->type], strlen(units[k->type])) != 0)
      fail_msg("%s's row does not give its unit: %.60s", k->name, at);
  }
  kl_t_run_free(&r);
}

/* --json lists the same keys, each with its description; the text lists
 * every key too. */
static void test_json_and_text(void **state) {
  (void)state;
  kl_t_run_t r;
  kl_t_run((const char *[]){"config", "--json", NULL}, NULL, 0, &r);
  json_t *o = kl_t_run_json(&r);
  json_t *keys = json_object_get(o, "keys");
  const kl__conf_key_t *k;
  size_t i;
  for (i = 0; (k = kl__conf_key_at(i)); i++) {
    json_t *e = json_array_get(keys, i);
    assert_string_equal(json_string_value(json_object_get(e, "name")), k->name);
    assert_string_equal(json_string_value(json_object_get(e, "doc")), k->doc);
    assert_string_equal(json_string_value(json_object_get(e, "default")),
                        k->def);
  }
  assert_int_equal(json_array_size(keys), i);
  json_decref(o);
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"config", NULL}, NULL, 0, &r);
  assert_int_equal(r.rc, 0);
  for (i = 0; (k = kl__conf_key_at(i)); i++) {
    char head[160];
    snprintf(head, sizeof(head), "%s (", k->name);
    if (!strstr(r.out, head))
      fail_msg("`keylane config` does not list %s", k->name);
  }
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"config", "--json", "--markdown", NULL}, NULL, 0,
           &r);
  assert_int_equal(r.rc, 2);
  assert_non_null(strstr(r.err, "--json and --markdown"));
  kl_t_run_free(&r);
  kl_t_run((const char *[]){"--help", NULL}, NULL, 0, &r);
  assert_non_null(strstr(r.out, "  config "));
  kl_t_run_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_is_current),
      cmocka_unit_test(test_every_key_is_described),
      cmocka_unit_test(test_json_and_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
