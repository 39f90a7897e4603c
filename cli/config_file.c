/* --config FILE and KEYLANE_CONFIG (config_file.h). */
#include "cli/config_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/conf.h"
#include "common/internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "store/location.h"

#define LINE_MAX_BYTES 65536
#define SECRET_FILE_MAX 65536
#define COMP "config"

static char *xstrdup(const char *s) {
  char *d = strdup(s);
  if (!d)
    kl__oom(COMP);
  return d;
}

/* ---- where each setting came from --------------------------------------- */

typedef struct note {
  char *key, *source;
} note_t;

static note_t *notes;
static size_t notes_n, notes_cap;
static char *kl_store_uri; /* the file's store.uri, for --store's default */

void kl__config_note(const char *key, const char *source) {
  for (size_t i = 0; i < notes_n; i++)
    if (strcmp(notes[i].key, key) == 0) {
      free(notes[i].source);
      notes[i].source = xstrdup(source);
      return;
    }
  note_t *grown = kl__grow(notes, &notes_cap, notes_n, sizeof(*notes), 16);
  if (!grown)
    kl__oom(COMP);
  notes = grown;
  notes[notes_n++] = (note_t){xstrdup(key), xstrdup(source)};
}

const char *kl__config_source(const char *key) {
  for (size_t i = 0; i < notes_n; i++)
    if (strcmp(notes[i].key, key) == 0)
      return notes[i].source;
  return NULL;
}

const char *kl__config_noted(size_t i) {
  return i < notes_n ? notes[i].key : NULL;
}

/* ---- what may be shown --------------------------------------------------- */

const char *kl__config_shown(const char *key, const char *value, char *buf,
                             size_t size) {
  if (kl__conf_is_secret(key))
    return "(secret)";
  if (strcmp(key, "store.uri") == 0)
    return kl__location_redact(value, buf, size);
  return value;
}

/* ---- reading the file ---------------------------------------------------- */

typedef struct reader {
  const char *sub, *path;
  int line;
  struct stat st;
  int secret; /* a secret's value is written in the file itself */
} reader_t;

static int line_fail(const reader_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int line_fail(const reader_t *r, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return kl__cli_usage(r->sub, "%s:%d: %s", r->path, r->line, msg);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' ||
               s[n - 1] == '\n'))
    s[--n] = '\0';
  return s;
}

static void warn_loose(const reader_t *r, const char *path, mode_t mode) {
  fprintf(stderr,
          "keylane %s: warning: %s holds a secret and others may read it "
          "(mode %04o): chmod 600 %s\n",
          r->sub, path, (unsigned)(mode & 07777), path);
}

/* A file keylane reads settings or secrets from must be a regular file
 * that only its owner and group may change: one others may write decides
 * what keylane reads, and where it sends it (a bootstrap of theirs, a
 * password read from any file keylane can read). @returns an error
 * naming the problem and the fix, or NULL. */
static const char *file_refused(const struct stat *st, char *why, size_t size) {
  if (!S_ISREG(st->st_mode))
    return snprintf(why, size, "it is not a regular file"), why;
  if (st->st_mode & 002)
    return snprintf(why, size,
                    "any user may write it (mode %04o): chmod o-w it, or "
                    "keylane would read what they put there",
                    (unsigned)(st->st_mode & 07777)),
           why;
  return NULL;
}

/* The contents of @p path, less one trailing newline (a secret file). */
static int read_secret(const reader_t *r, const char *key, const char *path,
                       char **out) {
  if (!*path)
    return line_fail(r, "%s: '@' names no file: write @/path/to/file", key);
  FILE *f = fopen(path, "r");
  if (!f)
    return line_fail(r, "%s: cannot read its file %s: %s", key, path,
                     strerror(errno));
  struct stat st;
  char why[160];
  const char *refused =
      fstat(fileno(f), &st) == 0 ? file_refused(&st, why, sizeof(why)) : NULL;
  if (refused) {
    fclose(f);
    return line_fail(r, "%s: %s: %s", key, path, refused);
  }
  if ((st.st_mode & 007) && kl__conf_is_secret(key))
    warn_loose(r, path, st.st_mode);
  char *v = kl__xcalloc(SECRET_FILE_MAX + 1, 1, COMP);
  size_t n = fread(v, 1, SECRET_FILE_MAX + 1, f);
  fclose(f);
  if (n > SECRET_FILE_MAX) {
    free(v);
    return line_fail(r, "%s: %s is over %d bytes", key, path, SECRET_FILE_MAX);
  }
  v[n] = '\0';
  if (memchr(v, '\0', n)) {
    free(v);
    return line_fail(r, "%s: %s holds a NUL byte, which no setting takes", key,
                     path);
  }
  if (n && v[n - 1] == '\n')
    v[--n] = '\0';
  if (n && v[n - 1] == '\r')
    v[--n] = '\0';
  *out = v;
  return -1;
}

/* The value of @p text: ${NAME}, @/path, or itself; *@p how says which. */
static int value_of(reader_t *r, const char *key, const char *text, char **out,
                    char *how, size_t how_size) {
  size_t n = strlen(text);
  how[0] = '\0';
  if (n > 3 && text[0] == '$' && text[1] == '{' && text[n - 1] == '}') {
    char name[256];
    snprintf(name, sizeof(name), "%.*s", (int)(n - 3), text + 2);
    const char *v = getenv(name);
    if (!v)
      return line_fail(r,
                       "%s = ${%s}: the environment has no such variable: "
                       "export it, or set the key another way",
                       key, name);
    snprintf(how, how_size, " (${%s})", name);
    *out = xstrdup(v);
  } else if (text[0] == '@') {
    snprintf(how, how_size, " (@%s)", text + 1);
    return read_secret(r, key, text + 1, out);
  } else if (strstr(text, "${")) {
    return line_fail(r,
                     "%s: ${NAME} stands for a whole value only (a value "
                     "holding \"${\" is refused rather than taken as it is): "
                     "write %s = ${NAME}, or put the value in a file and "
                     "write @/path",
                     key, key);
  } else {
    char shown[KL__LOCATION_MAX];
    r->secret |=
        kl__conf_is_secret(key) ||
        (strcmp(key, "store.uri") == 0 &&
         strcmp(kl__location_redact(text, shown, sizeof(shown)), text) != 0);
    *out = xstrdup(text);
  }
  return -1;
}

/* One "key = value" line into @p conf. */
static int take_line(reader_t *r, char *line, kl_conf_t *conf,
                     const char **store_uri) {
  char *s = trim(line);
  if (!*s || *s == '#')
    return -1;
  char *eq = strchr(s, '=');
  if (!eq)
    return line_fail(r, "no '=' on the line: write key = value");
  *eq = '\0';
  char *key = trim(s), *text = trim(eq + 1);
  if (!*key)
    return line_fail(r, "a line has no key before '='");
  if (strspn(key, "abcdefghijklmnopqrstuvwxyz0123456789._-") != strlen(key))
    return line_fail(r, "the key holds a character no key has (keys are "
                        "lower-case letters, digits, '.', '_' and '-')");
  char full[300];
  /* Like -X, a librdkafka property may come without its kafka. prefix. */
  if (strcmp(key, "store.uri") != 0 && strncmp(key, "kafka.", 6) != 0 &&
      !kl__conf_keylane_prefix(key) && strlen(key) < sizeof(full) - 6) {
    snprintf(full, sizeof(full), "kafka.%s", key);
    key = full;
  }
  char *value = NULL, how[300], source[4400];
  int rc = value_of(r, key, text, &value, how, sizeof(how));
  if (rc >= 0)
    return rc;
  if (strcmp(key, "store.uri") == 0) {
    /* kept for the life of the process, reachable from here */
    free(kl_store_uri);
    *store_uri = kl_store_uri = value;
  } else {
    kl_err_t err = kl_conf_set(conf, key, value);
    free(value);
    if (err && kl__conf_is_secret(key)) /* the detail may hold the value */
      return line_fail(r, "%s: its value is refused (not shown: a secret)",
                       key);
    if (err)
      return line_fail(r, "%s", kl_err_detail());
  }
  snprintf(source, sizeof(source), "%s:%d%s", r->path, r->line, how);
  kl__config_note(key, source);
  return -1;
}

int kl__config_load(const char *sub, const char *path, kl_conf_t *conf,
                    const char **store_uri) {
  reader_t r = {.sub = sub, .path = path};
  *store_uri = NULL;
  FILE *f = fopen(path, "r");
  if (!f || fstat(fileno(f), &r.st) != 0) {
    int e = errno;
    if (f)
      fclose(f);
    return kl__cli_usage(sub, "--config %s: cannot read it: %s", path,
                         strerror(e));
  }
  char why[160];
  const char *refused = file_refused(&r.st, why, sizeof(why));
  if (refused) {
    fclose(f);
    return kl__cli_usage(sub, "--config %s: %s", path, refused);
  }
  kl_conf_t *scratch = conf ? NULL : kl_conf_new();
  if (!conf && !scratch)
    kl__oom(COMP);
  char *line = kl__xcalloc(LINE_MAX_BYTES, 1, COMP);
  int rc = -1;
  while (rc < 0 && fgets(line, LINE_MAX_BYTES, f)) {
    r.line++;
    if (r.line == 1 && strncmp(line, "\xef\xbb\xbf", 3) == 0)
      memmove(line, line + 3, strlen(line + 3) + 1); /* a UTF-8 BOM */
    if (!strchr(line, '\n') && !feof(f))
      rc = line_fail(&r, "the line is over %d bytes", LINE_MAX_BYTES - 1);
    else
      rc = take_line(&r, line, conf ? conf : scratch, store_uri);
  }
  free(line);
  fclose(f);
  kl_conf_destroy(scratch);
  if (rc < 0 && r.secret && (r.st.st_mode & 007))
    warn_loose(&r, path, r.st.st_mode);
  return rc;
}
