#include "prom.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KL_P_FAMILIES 256
#define KL_P_SERIES 256
#define KL_P_LINE 4096

typedef struct kl_p_hist {
  char key[KL_P_LINE]; /* the labels but le */
  double last_le;
  double last_count;
  double inf;
  double count;
  bool has_bucket, has_inf, has_count, has_sum;
} kl_p_hist_t;

typedef struct kl_p_family {
  char name[256];
  char type[16];
  bool helped, typed, sampled, closed;
  kl_p_hist_t *hist;
  size_t nhist;
} kl_p_family_t;

typedef struct kl_p {
  kl_p_family_t fam[KL_P_FAMILIES];
  size_t nfam;
  kl_p_family_t *last; /* the family of the previous sample */
  int lineno;
  char *err;
  size_t size;
} kl_p_t;

static int kl_p_fail(kl_p_t *p, const char *why, const char *line) {
  snprintf(p->err, p->size, "line %d: %s: %.120s", p->lineno, why, line);
  return -1;
}

static bool kl_p_name_char(char c, bool first, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (colon && c == ':') || (!first && c >= '0' && c <= '9');
}

/* Reads a name at *s; @returns its length (0: none). */
static size_t kl_p_name(const char *s, bool colon) {
  size_t n = 0;
  while (s[n] && kl_p_name_char(s[n], n == 0, colon))
    n++;
  return n;
}

static kl_p_family_t *kl_p_family(kl_p_t *p, const char *name, size_t len) {
  for (size_t i = 0; i < p->nfam; i++)
    if (strlen(p->fam[i].name) == len && !strncmp(p->fam[i].name, name, len))
      return &p->fam[i];
  if (p->nfam == KL_P_FAMILIES || len >= sizeof(p->fam[0].name))
    return NULL;
  kl_p_family_t *f = &p->fam[p->nfam++];
  memcpy(f->name, name, len);
  f->name[len] = '\0';
  strcpy(f->type, "untyped");
  return f;
}

static bool kl_p_number(const char *s, size_t len, double *v) {
  char buf[64];
  if (len == 0 || len >= sizeof(buf))
    return false;
  memcpy(buf, s, len);
  buf[len] = '\0';
  if (!strcmp(buf, "+Inf") || !strcmp(buf, "-Inf") || !strcmp(buf, "NaN")) {
    *v = !strcmp(buf, "NaN") ? NAN : buf[0] == '+' ? INFINITY : -INFINITY;
    return true;
  }
  if (strspn(buf, "0123456789.eE+-") != len)
    return false;
  char *end;
  *v = strtod(buf, &end);
  return *end == '\0';
}

static int kl_p_meta(kl_p_t *p, const char *line) {
  bool help = !strncmp(line, "# HELP ", 7), type = !strncmp(line, "# TYPE ", 7);
  if (!help && !type)
    return 0; /* a comment */
  const char *s = line + 7;
  size_t n = kl_p_name(s, true);
  if (n == 0 || (s[n] != ' ' && !(help && s[n] == '\0')))
    return kl_p_fail(p, "bad metric name", line);
  kl_p_family_t *f = kl_p_family(p, s, n);
  if (!f)
    return kl_p_fail(p, "too many families", line);
  const char *rest = s[n] ? s + n + 1 : s + n;
  if (help) {
    if (f->helped)
      return kl_p_fail(p, "second HELP", line);
    for (const char *c = rest; *c; c++)
      if (*c == '\\' && c[1] != '\\' && c[1] != 'n')
        return kl_p_fail(p, "bad escape in HELP", line);
      else if (*c == '\\')
        c++;
    f->helped = true;
    return 0;
  }
  static const char *const types[] = {"counter", "gauge", "histogram",
                                      "summary", "untyped"};
  bool known = false;
  for (size_t i = 0; i < 5; i++)
    known |= !strcmp(rest, types[i]);
  if (!known || f->typed || f->sampled)
    return kl_p_fail(p, !known ? "unknown type" : "TYPE twice or after samples",
                     line);
  snprintf(f->type, sizeof(f->type), "%s", rest);
  f->typed = true;
  return 0;
}

/* Parses {a="x",...}; copies the labels but le into key and le's value.
 * @returns the bytes read, or -1. */
static int kl_p_labels(const char *s, char *key, size_t cap, char *le,
                       bool *has_le) {
  const char *c = s + 1;
  char names[32][64];
  size_t nnames = 0, klen = 0;
  *has_le = false;
  while (*c != '}') {
    size_t n = kl_p_name(c, false);
    if (n == 0 || n >= 64 || c[n] != '=' || c[n + 1] != '"' || nnames == 32)
      return -1;
    for (size_t i = 0; i < nnames; i++)
      if (strlen(names[i]) == n && !strncmp(names[i], c, n))
        return -1; /* a label twice */
    memcpy(names[nnames], c, n);
    names[nnames++][n] = '\0';
    bool is_le = n == 2 && !strncmp(c, "le", 2);
    const char *v = c + n + 2, *e = v;
    while (*e && *e != '"') {
      if (*e == '\\' && e[1] != '\\' && e[1] != '"' && e[1] != 'n')
        return -1;
      e += *e == '\\' ? 2 : 1;
    }
    if (*e != '"')
      return -1;
    if (is_le) {
      *has_le = true;
      snprintf(le, 64, "%.*s", (int)(e - v), v);
    } else if (klen + (size_t)(e - c) + 2 < cap) {
      memcpy(key + klen, c, (size_t)(e - c + 1));
      klen += (size_t)(e - c + 1);
      key[klen++] = ',';
    }
    c = e + 1;
    if (*c == ',' && c[1] != '}')
      c++;
    else if (*c != '}')
      return -1;
  }
  key[klen] = '\0';
  return (int)(c - s + 1);
}

static kl_p_hist_t *kl_p_hist(kl_p_family_t *f, const char *key) {
  for (size_t i = 0; i < f->nhist; i++)
    if (!strcmp(f->hist[i].key, key))
      return &f->hist[i];
  if (f->nhist == KL_P_SERIES)
    return NULL;
  if (!f->hist)
    f->hist = calloc(KL_P_SERIES, sizeof(kl_p_hist_t));
  kl_p_hist_t *h = &f->hist[f->nhist++];
  snprintf(h->key, sizeof(h->key), "%s", key);
  h->last_le = -INFINITY;
  return h;
}

static int kl_p_hist_sample(kl_p_t *p, kl_p_family_t *f, const char *suffix,
                            const char *key, const char *le, bool has_le,
                            double v, const char *line) {
  kl_p_hist_t *h = kl_p_hist(f, key);
  double bound;
  if (!h)
    return kl_p_fail(p, "too many series", line);
  if (!strcmp(suffix, "_bucket")) {
    if (!has_le || !kl_p_number(le, strlen(le), &bound) || isnan(bound))
      return kl_p_fail(p, "bucket without a numeric le", line);
    if (bound <= h->last_le || v < h->last_count || h->has_inf)
      return kl_p_fail(p, "buckets not increasing or not cumulative", line);
    h->last_le = bound;
    h->last_count = v;
    h->has_bucket = true;
    if (isinf(bound) && bound > 0) {
      h->has_inf = true;
      h->inf = v;
    }
  } else if (has_le) {
    return kl_p_fail(p, "le outside a bucket", line);
  } else if (!strcmp(suffix, "_count")) {
    h->has_count = true;
    h->count = v;
  } else {
    h->has_sum = true;
  }
  return 0;
}

static int kl_p_close(kl_p_t *p, kl_p_family_t *f) {
  if (!f || f->closed)
    return 0;
  f->closed = true;
  for (size_t i = 0; i < f->nhist; i++) {
    kl_p_hist_t *h = &f->hist[i];
    if (!h->has_inf || !h->has_count || !h->has_sum || h->inf != h->count) {
      snprintf(p->err, p->size,
               "histogram %s{%s}: needs a +Inf bucket equal "
               "to _count, and _sum",
               f->name, h->key);
      return -1;
    }
  }
  return 0;
}

/* The family a sample belongs to, and its suffix for histograms. */
static kl_p_family_t *kl_p_owner(kl_p_t *p, const char *name, size_t n,
                                 const char **suffix) {
  static const char *const sfx[] = {"_bucket", "_count", "_sum"};
  *suffix = "";
  for (size_t i = 0; i < 3; i++) {
    size_t sl = strlen(sfx[i]);
    if (n > sl && !strncmp(name + n - sl, sfx[i], sl))
      for (size_t j = 0; j < p->nfam; j++)
        if (strlen(p->fam[j].name) == n - sl &&
            !strncmp(p->fam[j].name, name, n - sl) &&
            (!strcmp(p->fam[j].type, "histogram") ||
             !strcmp(p->fam[j].type, "summary"))) {
          *suffix = sfx[i];
          return &p->fam[j];
        }
  }
  return kl_p_family(p, name, n);
}

static int kl_p_sample(kl_p_t *p, const char *line) {
  size_t n = kl_p_name(line, true);
  if (n == 0)
    return kl_p_fail(p, "bad metric name", line);
  const char *suffix;
  kl_p_family_t *f = kl_p_owner(p, line, n, &suffix);
  if (!f)
    return kl_p_fail(p, "too many families", line);
  bool hist = !strcmp(f->type, "histogram");
  if (hist && !*suffix)
    return kl_p_fail(p, "histogram sample without _bucket/_sum/_count", line);
  if (f != p->last && (f->closed || kl_p_close(p, p->last)))
    return f->closed ? kl_p_fail(p, "family interleaved", line) : -1;
  p->last = f;
  f->sampled = true;
  const char *c = line + n;
  char key[KL_P_LINE], le[64] = "";
  bool has_le = false;
  key[0] = '\0';
  if (*c == '{') {
    int used = kl_p_labels(c, key, sizeof(key), le, &has_le);
    if (used < 0)
      return kl_p_fail(p, "bad labels", line);
    c += used;
  }
  if (*c != ' ')
    return kl_p_fail(p, "no space before the value", line);
  c++;
  size_t vlen = strcspn(c, " ");
  double v;
  if (!kl_p_number(c, vlen, &v))
    return kl_p_fail(p, "bad value", line);
  if (c[vlen] && strspn(c + vlen + 1, "-0123456789") != strlen(c + vlen + 1))
    return kl_p_fail(p, "bad timestamp", line);
  if (!strcmp(f->type, "counter") && v < 0)
    return kl_p_fail(p, "negative counter", line);
  return hist ? kl_p_hist_sample(p, f, suffix, key, le, has_le, v, line) : 0;
}

int kl_t_prom_check(const char *text, char *err, size_t size) {
  kl_p_t *p = calloc(1, sizeof(*p));
  p->err = err;
  p->size = size;
  int rc = 0;
  for (const char *s = text; rc == 0 && s && *s;) {
    const char *nl = strchr(s, '\n');
    char line[KL_P_LINE];
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    p->lineno++;
    if (!nl)
      rc = kl_p_fail(p, "the last line has no newline", s);
    else if (len == 0 || len >= sizeof(line))
      rc = kl_p_fail(p, len ? "line too long" : "empty line", "");
    if (rc)
      break;
    memcpy(line, s, len);
    line[len] = '\0';
    rc = line[0] == '#' ? kl_p_meta(p, line) : kl_p_sample(p, line);
    s = nl + 1;
  }
  for (size_t i = 0; rc == 0 && i < p->nfam; i++)
    rc = kl_p_close(p, &p->fam[i]);
  for (size_t i = 0; i < p->nfam; i++)
    free(p->fam[i].hist);
  free(p);
  return rc;
}
