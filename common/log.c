#include "common/log.h"

#include "common/strbuf.h"

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

static int log_format_parse(const char *s);

kl_err_t kl__log_env_check(void) {
  char text[KL__ESCAPED_SIZE(32)];
  const char *s = getenv("KEYLANE_LOG");
  if (log_env_level() < 0)
    return kl__err(KL_ECONF,
                   "KEYLANE_LOG=\"%s\" is not a log level: set it to error, "
                   "warn, info or debug, or unset it (info)",
                   kl__escape(text, sizeof(text), s, strlen(s)));
  s = getenv("KEYLANE_LOG_FORMAT");
  if (log_format_parse(s) < 0)
    return kl__err(KL_ECONF,
                   "KEYLANE_LOG_FORMAT=\"%s\" is not a log format: use text "
                   "(the default) or json",
                   kl__escape(text, sizeof(text), s, strlen(s)));
  return KL_OK;
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

/* KEYLANE_LOG_FORMAT: "text" (NULL too) or "json"; -1 when unknown. */
static int log_format_parse(const char *s) {
  if (!s || !*s || strcasecmp(s, "text") == 0)
    return 0;
  return strcasecmp(s, "json") == 0 ? 1 : -1;
}

static int log_json(void) {
  static int json = -1;
  if (json < 0)
    json = log_format_parse(getenv("KEYLANE_LOG_FORMAT")) == 1;
  return json;
}

int kl__log_enabled(kl__log_level_t level) {
  return level <= log_threshold();
}

/* The 32 hex digits of the trace id and the 16 of the span id, or empty. */
static _Thread_local char kl_log_trace_id[33];
static _Thread_local char kl_log_span_id[17];

void kl__log_trace_set(const char *traceparent) {
  if (!traceparent) {
    kl_log_trace_id[0] = kl_log_span_id[0] = '\0';
    return;
  }
  snprintf(kl_log_trace_id, sizeof(kl_log_trace_id), "%.32s", traceparent + 3);
  snprintf(kl_log_span_id, sizeof(kl_log_span_id), "%.16s", traceparent + 36);
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

/* @p s as a JSON string, quotes included, into @p out (@p size bytes):
 * control bytes as \u00XX, and a byte that is not part of valid UTF-8 as
 * the text \xHH (as kl__escape() writes it), so the line stays valid JSON
 * whatever a message quotes. @returns the length written. */
static int log_json_str(const char *s, int n, char *out, size_t size) {
  size_t o = 0;
  out[o++] = '"';
  for (int i = 0; i < n && o + 12 < size;) {
    const unsigned char *c = (const unsigned char *)s + i;
    size_t seq = kl__utf8_seq(c, (size_t)(n - i));
    if (seq > 1) {
      memcpy(out + o, c, seq);
      o += seq;
    } else if (seq == 0) {
      o += (size_t)snprintf(out + o, size - o, "\\\\x%02x", c[0]);
    } else if (c[0] == '"' || c[0] == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c[0];
    } else if (c[0] < 0x20 || c[0] == 0x7f) {
      o += (size_t)snprintf(out + o, size - o, "\\u%04x", c[0]);
    } else {
      out[o++] = (char)c[0];
    }
    i += seq ? (int)seq : 1;
  }
  out[o++] = '"';
  return (int)o;
}

/* One line of the text format: "TIME LEVEL [PID] component: message". */
static int log_text_line(char *line, size_t size, const char *ts,
                         kl__log_level_t level, const char *component,
                         const char *msg, int len) {
  int n = snprintf(line, size, "%s %s [%d] %s: ", ts, kl_level_names[level],
                   (int)getpid(), component);
  n += log_one_line(msg, len, line + n, size - (size_t)n - 1);
  if (kl_log_trace_id[0] && n < (int)size - 1)
    n += snprintf(line + n, size - (size_t)n - 1, " trace_id=%s span_id=%s",
                  kl_log_trace_id, kl_log_span_id);
  return n;
}

/* One line of the JSON format: {"ts":..,"level":..,"pid":..,
 * "component":..,"msg":..[,"trace_id":..,"span_id":..]}. */
static int log_json_line(char *line, size_t size, const char *ts,
                         kl__log_level_t level, const char *component,
                         const char *msg, int len) {
  int n = snprintf(line, size,
                   "{\"ts\":\"%s\",\"level\":\"%s\",\"pid\":%d,"
                   "\"component\":",
                   ts, kl_level_names[level], (int)getpid());
  n += log_json_str(component, (int)strlen(component), line + n,
                    size - (size_t)n - 64);
  n += snprintf(line + n, size - (size_t)n, ",\"msg\":");
  n += log_json_str(msg, len, line + n, size - (size_t)n - 64);
  if (kl_log_trace_id[0])
    n += snprintf(line + n, size - (size_t)n,
                  ",\"trace_id\":\"%s\",\"span_id\":\"%s\"", kl_log_trace_id,
                  kl_log_span_id);
  line[n++] = '}';
  return n;
}

void kl__log(kl__log_level_t level, const char *component, const char *fmt,
             ...) {
  if (!kl__log_enabled(level))
    return;
  struct timespec now;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &now);
  gmtime_r(&now.tv_sec, &tm);
  char ts[96];
  snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
           tm.tm_sec, now.tv_nsec / 1000000);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (len < 0)
    len = 0;
  if (len > (int)sizeof(msg) - 1)
    len = (int)sizeof(msg) - 1;
  /* Room for a message whose every byte is escaped as \u00XX. */
  char line[6 * sizeof(msg) + 512];
  int n =
      log_json()
          ? log_json_line(line, sizeof(line), ts, level, component, msg, len)
          : log_text_line(line, sizeof(line), ts, level, component, msg, len);
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
