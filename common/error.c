/* The error table's functions and the per-thread error detail. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"

static const struct {
  const char *name;
  const char *desc;
  bool retriable;
} kl_errs[] = {
#define KL__ERR_ROW(name, retriable, desc) {"KL_" #name, desc, retriable},
    KL_ERR_MAP(KL__ERR_ROW)
#undef KL__ERR_ROW
};

static _Thread_local char kl_detail[1024];

static bool err_known(kl_err_t err) {
  return (int)err >= 0 && err < KL_ERR__COUNT;
}

const char *kl_strerror(kl_err_t err) {
  return err_known(err) ? kl_errs[err].desc : "unknown error";
}

const char *kl_err_name(kl_err_t err) {
  return err_known(err) ? kl_errs[err].name : "KL_EUNKNOWN";
}

bool kl_err_is_retriable(kl_err_t err) {
  return err_known(err) && kl_errs[err].retriable;
}

const char *kl_err_detail(void) {
  return kl_detail;
}

/* Formats into a buffer of its own first: a caller may pass the detail
 * itself as an argument (kl__err(err, "what: %s", kl_err_detail())), which
 * vsnprintf() into that same buffer would overwrite as it reads it. */
kl_err_t kl__err(kl_err_t err, const char *fmt, ...) {
  char text[sizeof(kl_detail)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  memcpy(kl_detail, text, sizeof(text));
  return err;
}

void kl__err_clear(void) {
  kl_detail[0] = '\0';
}
