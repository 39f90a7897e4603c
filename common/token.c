/*
 * Bearer tokens; see token.h.
 *
 * Each token is kept zero-padded in a KL_TOKEN_MAX slot with its length, and
 * the candidate is copied into a slot of its own: comparing whole slots plus
 * the lengths makes every comparison the same amount of work.
 */
#include "common/token.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct kl_token_slot {
  unsigned char bytes[KL_TOKEN_MAX];
  size_t len;
} kl_token_slot_t;

struct kl__tokens {
  kl_token_slot_t *slots;
  size_t count;
  char warning[512]; /* kl__tokens_warning(); "" when none */
};

/* A volatile pointer stops the compiler from dropping the wipe of memory
 * that is about to be freed. */
static void token_wipe(void *p, size_t len) {
  volatile unsigned char *v = p;
  while (len--)
    *v++ = 0;
}

bool kl__ct_equal(const void *a, const void *b, size_t len) {
  const volatile unsigned char *x = a, *y = b;
  unsigned char diff = 0;
  for (size_t i = 0; i < len; i++)
    diff |= (unsigned char)(x[i] ^ y[i]);
  return diff == 0;
}

static void token_trim(char **s, size_t *len) {
  while (*len && strchr(" \t\r\n", (*s)[*len - 1]))
    (*len)--;
  while (*len && strchr(" \t", **s)) {
    (*s)++;
    (*len)--;
  }
}

static bool token_printable(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
      return false;
  return true;
}

/* Adds the token on @p line (line number @p lineno) unless it is a blank or
 * comment line. */
static kl_err_t tokens_add_line(kl__tokens_t *tokens, const char *path,
                                char *line, size_t lineno) {
  size_t len = strlen(line);
  token_trim(&line, &len);
  if (len == 0 || line[0] == '#')
    return KL_OK;
  if (len > KL_TOKEN_MAX || !token_printable(line, len))
    return kl__err(KL_ECONF,
                   "tokens file %s line %zu: a token is 1..%d bytes "
                   "of visible ASCII without spaces",
                   path, lineno, KL_TOKEN_MAX);
  if (tokens->count == KL_TOKENS_MAX)
    return kl__err(KL_ECONF, "tokens file %s has more than %d tokens", path,
                   KL_TOKENS_MAX);
  kl_token_slot_t *slot = &tokens->slots[tokens->count++];
  memcpy(slot->bytes, line, len);
  slot->len = len;
  return KL_OK;
}

/* Reads at most KL_TOKENS_FILE_MAX bytes (+1, to see that there are more)
 * into a buffer the caller frees: a tokens file that never ends (/dev/zero,
 * a device, a stuck pipe's writer) is refused, not read forever. */
static kl_err_t tokens_slurp(FILE *f, const char *path, char **out,
                             size_t *len) {
  char *buf = malloc(KL_TOKENS_FILE_MAX + 1);
  if (!buf)
    return KL_ENOMEM;
  size_t n = fread(buf, 1, KL_TOKENS_FILE_MAX + 1, f);
  kl_err_t err = KL_OK;
  if (ferror(f))
    err = kl__err(KL_EIO, "cannot read tokens file %s: %s", path,
                  strerror(errno));
  else if (n > KL_TOKENS_FILE_MAX)
    err = kl__err(KL_ECONF,
                  "tokens file %s is larger than %d bytes: is it the "
                  "right file?",
                  path, KL_TOKENS_FILE_MAX);
  if (err) {
    token_wipe(buf, n);
    free(buf);
    return err;
  }
  *out = buf;
  *len = n;
  return KL_OK;
}

static kl_err_t tokens_read(kl__tokens_t *tokens, FILE *f, const char *path) {
  char line[KL_TOKEN_MAX + 64], *buf = NULL;
  size_t size = 0, lineno = 0;
  kl_err_t err = tokens_slurp(f, path, &buf, &size);
  for (size_t at = 0; err == KL_OK && at < size; lineno++) {
    const char *nl = memchr(buf + at, '\n', size - at);
    size_t len = nl ? (size_t)(nl - (buf + at)) : size - at;
    if (memchr(buf + at, '\0', len))
      err = kl__err(KL_ECONF,
                    "tokens file %s line %zu holds a NUL byte: "
                    "is it a text file?",
                    path, lineno + 1);
    else if (len >= sizeof(line))
      err = kl__err(KL_ECONF,
                    "tokens file %s line %zu is longer than %zu "
                    "bytes",
                    path, lineno + 1, sizeof(line) - 1);
    if (err)
      break;
    memcpy(line, buf + at, len);
    line[len] = '\0';
    err = tokens_add_line(tokens, path, line, lineno + 1);
    at += len + 1;
  }
  token_wipe(line, sizeof(line));
  if (buf) {
    token_wipe(buf, size);
    free(buf);
  }
  if (err == KL_OK && tokens->count == 0)
    err = kl__err(KL_ECONF,
                  "tokens file %s holds no token: every client "
                  "would get 401; add one token per line",
                  path);
  return err;
}

/* What a person should hear about a file that loads: readable by every
 * user of the host, or tokens short enough to guess. Never a token. */
static void tokens_advise(kl__tokens_t *tokens, FILE *f, const char *path) {
  struct stat st;
  size_t n = 0;
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) &&
      (st.st_mode & S_IROTH))
    n += (size_t)snprintf(tokens->warning, sizeof(tokens->warning),
                          "tokens file %s can be read by every user of the "
                          "host (mode %04o): chmod 600 it; ",
                          path, (unsigned)(st.st_mode & 07777));
  size_t shortest = 0;
  for (size_t i = 0; i < tokens->count; i++)
    if (!shortest || tokens->slots[i].len < shortest)
      shortest = tokens->slots[i].len;
  if (shortest < KL_TOKEN_MIN_ADVISED && n < sizeof(tokens->warning))
    snprintf(tokens->warning + n, sizeof(tokens->warning) - n,
             "tokens file %s holds a token of %zu bytes, short enough to "
             "guess: use %d bytes or more (openssl rand -hex 16)",
             path, shortest, KL_TOKEN_MIN_ADVISED);
}

/* Reads the tokens of @p f, named @p path in messages. */
static kl_err_t tokens_from(FILE *f, const char *path, kl__tokens_t **out) {
  kl__tokens_t *tokens = calloc(1, sizeof(*tokens));
  if (tokens)
    tokens->slots = calloc(KL_TOKENS_MAX, sizeof(kl_token_slot_t));
  kl_err_t err =
      tokens && tokens->slots ? tokens_read(tokens, f, path) : KL_ENOMEM;
  if (!err)
    tokens_advise(tokens, f, path);
  fclose(f);
  if (err) {
    kl__tokens_destroy(tokens);
    return err;
  }
  *out = tokens;
  return KL_OK;
}

kl_err_t kl__tokens_load(const char *path, kl__tokens_t **out) {
  if (!path || !out)
    return kl__err(KL_EINVAL, "kl__tokens_load needs a path and out");
  FILE *f = fopen(path, "r");
  if (!f)
    return kl__err(KL_EIO, "cannot open tokens file %s: %s", path,
                   strerror(errno));
  return tokens_from(f, path, out);
}

kl_err_t kl__tokens_parse(const char *name, const char *text,
                          kl__tokens_t **out) {
  FILE *f = text && *text ? fmemopen((void *)text, strlen(text), "r") : NULL;
  if (!f)
    return kl__err(KL_ECONF, "%s is empty: give a token of 16 bytes or more",
                   name);
  return tokens_from(f, name, out);
}

const char *kl__tokens_warning(const kl__tokens_t *tokens) {
  return tokens && tokens->warning[0] ? tokens->warning : NULL;
}

size_t kl__tokens_count(const kl__tokens_t *tokens) {
  return tokens ? tokens->count : 0;
}

bool kl__tokens_check(const kl__tokens_t *tokens, const void *candidate,
                      size_t len) {
  if (!tokens || !candidate || len == 0 || len > KL_TOKEN_MAX)
    return false; /* the candidate's own length is no secret */
  kl_token_slot_t cand;
  memset(&cand, 0, sizeof(cand));
  memcpy(cand.bytes, candidate, len);
  unsigned match = 0;
  for (size_t i = 0; i < tokens->count; i++) {
    const kl_token_slot_t *slot = &tokens->slots[i];
    unsigned same = kl__ct_equal(slot->bytes, cand.bytes, KL_TOKEN_MAX);
    same &= kl__ct_equal(&slot->len, &len, sizeof(len));
    match |= same;
  }
  token_wipe(&cand, sizeof(cand));
  return match != 0;
}

void kl__tokens_destroy(kl__tokens_t *tokens) {
  if (!tokens)
    return;
  if (tokens->slots) {
    token_wipe(tokens->slots, KL_TOKENS_MAX * sizeof(kl_token_slot_t));
    free(tokens->slots);
  }
  free(tokens);
}
