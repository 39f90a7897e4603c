#include "cli/cli.h"

#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/config_file.h"
#include "common/conf.h"
#include "common/internal.h"
#include "common/strbuf.h"
#include "keylane/event.h"
#include "store/location.h"

volatile int kl__cli_stop;

static void cli_vprint(const char *sub, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void cli_vprint(const char *sub, const char *fmt, va_list ap) {
  fprintf(stderr, "keylane %s: ", sub);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

int kl__cli_usage(const char *sub, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_vprint(sub, fmt, ap);
  va_end(ap);
  fprintf(stderr, "try 'keylane %s --help'\n", sub);
  return KL_EXIT_USAGE;
}

int kl__cli_fail(const char *sub, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cli_vprint(sub, fmt, ap);
  va_end(ap);
  return KL_EXIT_FAIL;
}

int kl__cli_conf_set(const char *sub, kl_conf_t *conf, const char *key,
                     const char *value) {
  if (kl_conf_set(conf, key, value) != KL_OK) {
    kl__cli_usage(sub, "%s", kl_err_detail());
    return -1;
  }
  return 0;
}

int kl__cli_conf_x(const char *sub, kl_conf_t *conf, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg) {
    kl__cli_usage(sub, "-X takes name=value, got \"%s\"", arg);
    return -1;
  }
  char key[256];
  size_t n = (size_t)(eq - arg);
  if (n >= sizeof(key)) {
    kl__cli_usage(sub, "-X name is longer than %zu bytes", sizeof(key) - 1);
    return -1;
  }
  memcpy(key, arg, n);
  key[n] = '\0';
  /* Like kcat, a bare librdkafka property is accepted too; a name with
   * keylane's prefixes (worker., store., ...) is keylane's, known or not. */
  char full[300];
  const char *name = key;
  if (strncmp(key, "kafka.", 6) != 0 && !kl__conf_keylane_prefix(key)) {
    snprintf(full, sizeof(full), "kafka.%s", key);
    name = full;
  }
  if (kl__cli_conf_set(sub, conf, name, eq + 1))
    return -1;
  kl__config_note(name, "-X");
  return 0;
}

kl_err_t kl__cli_pos_parse(const kl__opt_t *opt, const char *text,
                           void *field) {
  kl__cli_pos_t *pos = field;
  if (kl__pos_parse(text, kl__now_ms(), &pos->pos) != KL_OK) {
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", kl_err_detail());
    return kl__err(KL_EINVAL, "--%s: %s", opt->name, detail);
  }
  pos->given = 1;
  return KL_OK;
}

kl_err_t kl__cli_key_parse(const kl__opt_t *opt, const char *text,
                           void *field) {
  size_t len = strlen(text);
  if (len < 1 || len > KL_KEY_MAX)
    return kl__err(KL_EINVAL,
                   "--%s takes an entity key of 1 to %d bytes; this one is "
                   "%zu",
                   opt->name, KL_KEY_MAX, len);
  *(const char **)field = text;
  return KL_OK;
}

int kl__cli_store_open(const char *sub, const char *location,
                       const kl_conf_t *conf, bool create, kl_store_t **store) {
  kl_conf_t *own = conf ? kl_conf_dup(conf) : kl_conf_new();
  kl_err_t err =
      own ? kl_conf_set(own, "store.create", create ? "yes" : "no") : KL_ENOMEM;
  if (!err)
    err = kl_store_open(location, own, store);
  kl_conf_destroy(own);
  if (err == KL_ENOTFOUND) /* the detail names the location and the fix */
    return kl__cli_fail(sub, "%s", kl_err_detail());
  char shown[KL__LOCATION_MAX];
  if (err)
    return kl__cli_fail(sub, "cannot open the store %s: %s",
                        kl__location_redact(location, shown, sizeof(shown)),
                        kl_err_detail());
  return KL_EXIT_OK;
}

int kl__cli_store_existing(const char *sub, const char *location,
                           kl_store_t **store) {
  return kl__cli_store_open(sub, location, NULL, false, store);
}

/* The topics a store holds, listed once each (they come ordered by
 * topic), the first KL_TOPICS_SHOWN of them by name. */
#define KL_TOPICS_SHOWN 10
typedef struct kl_topics {
  const char *want;
  int found;
  size_t count;
  char last[256];
  kl__strbuf_t names;
} kl_topics_t;

static int topics_cb(void *opaque, const char *topic, int32_t partition,
                     const kl_partition_state_t *state) {
  kl_topics_t *t = opaque;
  (void)partition, (void)state;
  if (strcmp(topic, t->want) == 0)
    return t->found = 1;
  if (t->count && strcmp(topic, t->last) == 0)
    return 0;
  if (t->count++ < KL_TOPICS_SHOWN)
    kl__strbuf_printf(&t->names, "%s%s", t->count > 1 ? ", " : "", topic);
  snprintf(t->last, sizeof(t->last), "%s", topic);
  return 0;
}

int kl__cli_store_topic_known(const char *sub, kl_store_t *store,
                              const char *location, const char *topic) {
  kl_topics_t t = {.want = topic, .names = KL__STRBUF_INIT};
  kl_err_t err = kl_store_foreach_partition(store, topics_cb, &t);
  char shown[KL__LOCATION_MAX];
  kl__location_redact(location, shown, sizeof(shown));
  int rc = KL_EXIT_OK;
  if (err)
    rc = kl__cli_fail(sub, "cannot list the partitions of the store %s: %s",
                      shown, kl_err_detail());
  else if (!t.found && !t.count)
    rc = kl__cli_fail(sub,
                      "the store %s has no partition of topic %s, nor of "
                      "any other: no worker has taken one there yet; check "
                      "--store",
                      shown, topic);
  else if (!t.found)
    rc = kl__cli_fail(sub,
                      "the store %s has no partition of topic %s; it has "
                      "%s %s%s: check -t and --store",
                      shown, topic, t.count > 1 ? "topics" : "topic",
                      kl__strbuf_ok(&t.names) ? t.names.data : "(?)",
                      t.count > KL_TOPICS_SHOWN ? " and more" : "");
  kl__strbuf_free(&t.names);
  return rc;
}

static void cli_signal(int sig) {
  (void)sig;
  kl__cli_stop = 1;
}

void kl__cli_on_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = cli_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

const char *kl__cli_self(void) {
  static char path[4096];
  if (!path[0]) {
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n <= 0)
      strcpy(path, "keylane");
    else
      path[n] = '\0';
  }
  return path;
}
