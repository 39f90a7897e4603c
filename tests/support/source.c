#include "support/source.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/strbuf.h"

void kl_t_source_path(const char *rel, char *path, size_t size) {
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  snprintf(path, size, "%s/%s", src ? src : ".", rel);
}

char *kl_t_source_file(const char *rel) {
  char path[4096];
  kl_t_source_path(rel, path, sizeof(path));
  FILE *f = fopen(path, "r");
  if (!f)
    fail_msg("cannot read %s (KEYLANE_SOURCE_DIR)", path);
  kl__strbuf_t sb = KL__STRBUF_INIT;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
    kl__strbuf_add(&sb, chunk, n);
  fclose(f);
  kl__strbuf_add(&sb, "", 1);
  char *text = kl__strbuf_take(&sb, &n);
  if (!text)
    fail_msg("out of memory reading %s", path);
  return text;
}
