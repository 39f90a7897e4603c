/*
 * Store locations: which backend, and the password a PostgreSQL one may
 * hold, found the way libpq finds it (location.h), so that no output,
 * log or error prints it.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "store/location.h"

/* Where a password lies in a location: its bytes as written, and its
 * value once libpq has decoded them (percent-escapes, quotes). */
typedef struct kl_secret {
  size_t off, len;
  char value[256];
} kl_secret_t;

#define KL_SECRETS_MAX 8

static size_t location_scheme(const char *s) {
  if (strncmp(s, "postgresql://", 13) == 0)
    return 13;
  return strncmp(s, "postgres://", 11) == 0 ? 11 : 0;
}

/* A connection string starts with a keyword, then '=' (spaces allowed). */
static int location_keywords(const char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyz_");
  if (!n)
    return 0;
  s += n;
  while (isspace((unsigned char)*s))
    s++;
  return *s == '=';
}

int kl__location_is_pg(const char *location) {
  return location && (location_scheme(location) || location_keywords(location));
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  c = (char)tolower((unsigned char)c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Records @p s[off, off + len) as a password; its value percent-decoded
 * when @p pct (a URI's), else taken as it is. */
static void secret_add(kl_secret_t *secrets, size_t *n, const char *s,
                       size_t off, size_t len, int pct) {
  if (*n >= KL_SECRETS_MAX || !len)
    return;
  kl_secret_t *sec = &secrets[(*n)++];
  sec->off = off;
  sec->len = len;
  size_t v = 0;
  for (size_t i = off; i < off + len && v < sizeof(sec->value) - 1; i++) {
    int hi, lo;
    if (pct && s[i] == '%' && i + 2 < off + len &&
        (hi = hex_digit(s[i + 1])) >= 0 && (lo = hex_digit(s[i + 2])) >= 0) {
      sec->value[v++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      sec->value[v++] = s[i];
    }
  }
  sec->value[v] = '\0';
}

/* Whether libpq's keyword @p k (@p len bytes) holds a password: password,
 * or sslpassword (the client key's passphrase). */
static int location_pw_key(const char *k, size_t len) {
  return (len == 8 && strncmp(k, "password", 8) == 0) ||
         (len == 11 && strncmp(k, "sslpassword", 11) == 0);
}

/* A URI's passwords: libpq reads user info up to the first '@' before any
 * '/', the password after its first ':', and password= in the query. */
static void uri_secrets(const char *s, kl_secret_t *secrets, size_t *n) {
  size_t p = location_scheme(s);
  size_t q = p + strcspn(s + p, "@/");
  if (s[q] == '@') {
    size_t colon = p + strcspn(s + p, ":@");
    if (s[colon] == ':')
      secret_add(secrets, n, s, colon + 1, q - colon - 1, 1);
  }
  const char *query = strchr(s + q, '?');
  for (const char *k = query; k && *k;) {
    k++;
    size_t len = strcspn(k, "&");
    size_t eq = strcspn(k, "=&");
    if (k[eq] == '=' && location_pw_key(k, eq))
      secret_add(secrets, n, s, (size_t)(k - s) + eq + 1, len - eq - 1, 1);
    k += len;
  }
}

/* One value of a connection string from @p s[*i]: quoted ('...', with
 * backslash escapes) or up to a space. Its decoded text into @p value. */
static void conninfo_value(const char *s, size_t *i, size_t *off, size_t *len,
                           char *value, size_t size) {
  size_t v = 0, j = *i;
  int quoted = s[j] == '\'';
  if (quoted)
    j++;
  *off = j;
  while (s[j] && (quoted ? s[j] != '\'' : !isspace((unsigned char)s[j]))) {
    if (s[j] == '\\' && s[j + 1])
      j++;
    if (v < size - 1)
      value[v++] = s[j];
    j++;
  }
  value[v] = '\0';
  *len = j - *off;
  *i = j + (quoted && s[j] == '\'');
}

/* A connection string's passwords: password=..., and those of a URI
 * given as dbname=... (libpq expands it). */
static void conninfo_secrets(const char *s, kl_secret_t *secrets, size_t *n) {
  size_t i = 0;
  char value[256];
  while (s[i]) {
    while (isspace((unsigned char)s[i]))
      i++;
    size_t key = i;
    while (s[i] && s[i] != '=' && !isspace((unsigned char)s[i]))
      i++;
    size_t key_len = i - key;
    while (isspace((unsigned char)s[i]))
      i++;
    if (s[i] != '=')
      return;
    i++;
    while (isspace((unsigned char)s[i]))
      i++;
    size_t off, len;
    conninfo_value(s, &i, &off, &len, value, sizeof(value));
    if (location_pw_key(s + key, key_len) && *n < KL_SECRETS_MAX && len) {
      secrets[*n].off = off;
      secrets[*n].len = len;
      snprintf(secrets[*n].value, sizeof(secrets[*n].value), "%s", value);
      (*n)++;
    } else if (key_len == 6 && strncmp(s + key, "dbname", 6) == 0 &&
               location_scheme(value)) {
      size_t before = *n;
      uri_secrets(value, secrets, n);
      for (size_t k = before; k < *n; k++) /* value is s[off..] unquoted */
        secrets[k].off += off;
    }
  }
}

static size_t location_secrets(const char *location, kl_secret_t *secrets) {
  size_t n = 0;
  if (location_scheme(location))
    uri_secrets(location, secrets, &n);
  else if (location_keywords(location))
    conninfo_secrets(location, secrets, &n);
  return n;
}

static int secret_cmp(const void *a, const void *b) {
  const kl_secret_t *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* The redacted location into @p sb. */
static void location_redacted(const char *location, kl__strbuf_t *sb) {
  kl_secret_t secrets[KL_SECRETS_MAX];
  size_t n = location_secrets(location, secrets);
  qsort(secrets, n, sizeof(secrets[0]), secret_cmp);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    if (secrets[i].off < at)
      continue;
    kl__strbuf_add(sb, location + at, secrets[i].off - at);
    kl__strbuf_puts(sb, KL__LOCATION_HIDDEN);
    at = secrets[i].off + secrets[i].len;
  }
  kl__strbuf_puts(sb, location + at);
}

/* The redacted location, malloc()ed; NULL when out of memory. */
static char *location_redacted_dup(const char *location) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  location_redacted(location ? location : "", &sb);
  return kl__strbuf_take(&sb, NULL);
}

const char *kl__location_redact(const char *location, char *out, size_t size) {
  char *red = location_redacted_dup(location);
  snprintf(out, size, "%s", red ? red : "(a store location; out of memory)");
  free(red);
  return out;
}

/*
 * Whether @p text[at, at + len) stands where a password stands in a
 * location, or in a message that quotes one: after ':' (a URI's user
 * info), '=' (password=) or a quote, or at the text's start; and before
 * '@', '&', a quote or a space, or at the text's end. Only such an
 * occurrence is masked: a short password ("a", "pg") is also a piece of
 * many words ("cannot", "pg_hba.conf"), and masking those would garble
 * the message without hiding anything.
 */
static int secret_stands_alone(const char *text, size_t at, size_t len) {
  char before = at ? text[at - 1] : '\0', after = text[at + len];
  return (!at || strchr(":=\"'", before)) &&
         (!after || strchr("@&\"'", after) || isspace((unsigned char)after));
}

/* @p text with each @p find replaced by @p with (when @p alone, only
 * those that stand alone); @returns a malloc()ed string, or NULL when out
 * of memory. */
static char *replace_all(const char *text, const char *find, size_t find_len,
                         const char *with, int alone) {
  kl__strbuf_t sb = KL__STRBUF_INIT;
  const char *from = text, *at = text;
  while (find_len && (at = strstr(at, find)) != NULL) {
    if (alone && !secret_stands_alone(text, (size_t)(at - text), find_len)) {
      at++;
      continue;
    }
    kl__strbuf_add(&sb, from, (size_t)(at - from));
    kl__strbuf_puts(&sb, with);
    from = at += find_len;
  }
  kl__strbuf_puts(&sb, from);
  return kl__strbuf_ok(&sb) ? kl__strbuf_take(&sb, NULL) : NULL;
}

const char *kl__location_scrub(const char *location, const char *text,
                               char *out, size_t size) {
  char *red = location_redacted_dup(location);
  char *s = red && location && *location
                ? replace_all(text, location, strlen(location), red, 0)
            : red ? strdup(text)
                  : NULL;
  free(red);
  kl_secret_t secrets[KL_SECRETS_MAX];
  size_t n = location ? location_secrets(location, secrets) : 0;
  for (size_t i = 0; i < n && s; i++) {
    char raw[256];
    snprintf(raw, sizeof(raw), "%.*s", (int)secrets[i].len,
             location + secrets[i].off);
    const char *forms[2] = {raw, secrets[i].value};
    for (int f = 0; f < 2 && s; f++) {
      char *next =
          replace_all(s, forms[f], strlen(forms[f]), KL__LOCATION_HIDDEN, 1);
      free(s);
      s = next;
    }
  }
  /* Out of memory: nothing of the text, rather than the password. */
  snprintf(out, size, "%s", s ? s : "(a store error; out of memory)");
  free(s);
  return out;
}
