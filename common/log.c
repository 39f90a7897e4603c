#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/strbuf.h"

static const char *const kl_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

/* @returns KEYLANE_LOG's level: INFO when unset or empty, -1 when it
 * names none. */
static int log_env_level(void) {
  const char *s = getenv("KEYLANE_LOG");
  if (!s || !*s)
    return KL_LOG_INFO;
  for (int i = 0; i <= KL_LOG_DEBUG; i++)
    if (strcasecmp(s, kl_level_names[i]) == 0)
      return i;
  return -1;
}

kl_err_t kl__log_env_check(void) {
  if (log_env_level() >= 0)
    return KL_OK;
  const char *s = getenv("KEYLANE_LOG");
  char text[KL__ESCAPED_SIZE(32)];
  return kl__err(KL_ECONF,
                 "KEYLANE_LOG=\"%s\" is not a log level: set it to error, "
                 "warn, info or debug, or unset it (info)",
                 kl__escape(text, sizeof(text), s, strlen(s)));
}

static kl__log_level_t log_threshold(void) {
  static int level = -1;
  if (level < 0) {
    int env = log_env_level();
    level = env < 0 ? KL_LOG_INFO : env;
    if (env < 0 && kl__log_env_check()) /* said once, by a library user */
      kl__log(KL_LOG_WARN, "log", "%s; logging at info", kl_err_detail());
  }
  return (kl__log_level_t)level;
}

int kl__log_enabled(kl__log_level_t level) {
  return level <= log_threshold();
}

/* " trace_id=... span_id=...", or empty. */
static _Thread_local char kl_log_trace[96];

void kl__log_trace_set(const char *traceparent) {
  if (!traceparent) {
    kl_log_trace[0] = '\0';
    return;
  }
  snprintf(kl_log_trace, sizeof(kl_log_trace), " trace_id=%.32s span_id=%.16s",
           traceparent + 3, traceparent + 36);
}

/* Control characters in @p msg[0, n) as \xHH, as kl__escape() writes
 * them: a message that quotes another program's text (libpq's errors
 * span lines) still makes one line. @returns the length written. */
static int log_one_line(const char *msg, int n, char *out, size_t size) {
  size_t o = 0;
  for (int i = 0; i < n && o + 5 < size; i++) {
    unsigned char c = (unsigned char)msg[i];
    if (c >= 0x20 && c != 0x7f)
      out[o++] = (char)c;
    else
      o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
  }
  return (int)o;
}

void kl__log(kl__log_level_t level, const char *component, const char *fmt,
             ...) {
  if (!kl__log_enabled(level))
    return;
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(
      line, sizeof(line),
      "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s [%d] %s: ", tm.tm_year + 1900,
      tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
      ts.tv_nsec / 1000000, kl_level_names[level], (int)getpid(), component);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (len < 0)
    len = 0;
  if (len > (int)sizeof(msg) - 1)
    len = (int)sizeof(msg) - 1;
  n += log_one_line(msg, len, line + n, sizeof(line) - (size_t)n - 1);
  if (kl_log_trace[0] && n < (int)sizeof(line) - 1)
    n += snprintf(line + n, sizeof(line) - (size_t)n - 1, "%s", kl_log_trace);
  if (n > (int)sizeof(line) - 2)
    n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}

void kl__oom(const char *comp) {
  kl__log(KL_LOG_ERROR, comp,
          "out of memory: exiting; a restarted worker resumes from what the "
          "store holds");
  abort();
}

void *kl__xcalloc(size_t n, size_t size, const char *comp) {
  void *p = calloc(n ? n : 1, size);
  if (!p)
    kl__oom(comp);
  return p;
}
