#include "support/support.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "keylane/handlers.h"
#include "store/store_internal.h"
#include "worker/replay.h"

/* The directories kl_t_tmpdir() made and kl_t_rmrf() did not remove yet,
 * named at the process's exit: a test that fails keeps its own, to read. */
enum { KL_T_DIRS = 256 };
static struct {
  pthread_mutex_t mu;
  pid_t pid; /* the process that made them, not a child of it */
  int n;
  char dir[KL_T_DIRS][64];
} kl_t_dirs = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void kl_t_dirs_kept(void) {
  if (getpid() != kl_t_dirs.pid)
    return;
  for (int i = 0; i < kl_t_dirs.n; i++)
    if (kl_t_dirs.dir[i][0])
      fprintf(stderr,
              "kept %s: the test that made it failed (or did not "
              "remove it with kl_t_rmrf())\n",
              kl_t_dirs.dir[i]);
}

void kl_t_tmpdir(char *dir) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp)
    tmp = "/tmp";
  if (snprintf(dir, 64, "%s/keylane-test-XXXXXX", tmp) >= 64) {
    fprintf(stderr,
            "TMPDIR=%s is too long for a test's directory (%s/"
            "keylane-test-XXXXXX in 63 bytes): use a shorter one\n",
            tmp, tmp);
    abort();
  }
  if (!mkdtemp(dir)) {
    fprintf(stderr, "cannot make a test directory %s: %s\n", dir,
            strerror(errno));
    abort();
  }
  pthread_mutex_lock(&kl_t_dirs.mu);
  if (!kl_t_dirs.pid) {
    kl_t_dirs.pid = getpid();
    atexit(kl_t_dirs_kept);
  }
  if (kl_t_dirs.n < KL_T_DIRS && kl_t_dirs.pid == getpid())
    snprintf(kl_t_dirs.dir[kl_t_dirs.n++], 64, "%s", dir);
  pthread_mutex_unlock(&kl_t_dirs.mu);
}

void kl_t_rmrf(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
  pthread_mutex_lock(&kl_t_dirs.mu);
  for (int i = 0; i < kl_t_dirs.n; i++)
    if (strcmp(kl_t_dirs.dir[i], dir) == 0)
      kl_t_dirs.dir[i][0] = '\0';
  pthread_mutex_unlock(&kl_t_dirs.mu);
}

void kl_t_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

void kl_t_stderr_begin(kl_t_stderr_t *log) {
  char path[] = "/tmp/keylane-test-log-XXXXXX";
  log->fd = mkstemp(path);
  if (log->fd < 0) {
    perror("mkstemp");
    abort();
  }
  unlink(path);
  log->saved = dup(STDERR_FILENO);
  dup2(log->fd, STDERR_FILENO);
}

char *kl_t_stderr_end(kl_t_stderr_t *log) {
  dup2(log->saved, STDERR_FILENO);
  close(log->saved);
  off_t len = lseek(log->fd, 0, SEEK_END);
  char *text = malloc(len > 0 ? (size_t)len + 1 : 1);
  ssize_t n = text && len > 0 ? pread(log->fd, text, (size_t)len, 0) : 0;
  close(log->fd);
  if (!text)
    abort();
  text[n > 0 ? n : 0] = '\0';
  fputs(text, stderr);
  return text;
}

kl_producer_t *kl_t_producer(const char *bootstrap, kl__ledger_gen_t *gen) {
  kl_conf_t *conf = kl_conf_new();
  kl_producer_t *producer = NULL;
  if (kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap) ||
      kl_producer_new(conf, kl__ledger_gen_on_delivery, gen, &producer))
    fprintf(stderr, "producer: %s\n", kl_err_detail());
  kl_conf_destroy(conf);
  return producer;
}

static void *kl_t_worker_main(void *opaque) {
  kl_t_worker_t *tw = opaque;
  tw->result = kl_worker_run(tw->worker);
  snprintf(tw->detail, sizeof(tw->detail), "%s", kl_err_detail());
  return NULL;
}

kl_t_worker_t *kl_t_worker_new(const char *bootstrap, const char *topic,
                               const char *group, kl_store_t *store,
                               const char *const *extra) {
  return kl_t_worker_new_with(bootstrap, topic, group, store, extra,
                              kl_ledger_handler, NULL);
}

kl_t_worker_t *kl_t_worker_new_with(const char *bootstrap, const char *topic,
                                    const char *group, kl_store_t *store,
                                    const char *const *extra,
                                    kl_handler_fn_t *handler, void *opaque) {
  kl_conf_t *conf = kl_conf_new();
  kl_t_worker_t *tw = calloc(1, sizeof(*tw));
  int bad = kl_conf_set(conf, "kafka.bootstrap.servers", bootstrap) ||
            kl_conf_set(conf, "worker.group", group);
  for (size_t i = 0; !bad && extra && extra[i]; i++) {
    char key[128];
    const char *eq = strchr(extra[i], '=');
    snprintf(key, sizeof(key), "%.*s", (int)(eq - extra[i]), extra[i]);
    bad = kl_conf_set(conf, key, eq + 1) != KL_OK;
  }
  if (bad || kl_worker_new(conf, topic, store, handler, opaque, &tw->worker)) {
    fprintf(stderr, "worker: %s\n", kl_err_detail());
    abort();
  }
  kl_conf_destroy(conf);
  return tw;
}

void kl_t_worker_go(kl_t_worker_t *tw) {
  pthread_create(&tw->thread, NULL, kl_t_worker_main, tw);
}

kl_t_worker_t *kl_t_worker_start(const char *bootstrap, const char *topic,
                                 const char *group, kl_store_t *store,
                                 const char *const *extra) {
  kl_t_worker_t *tw = kl_t_worker_new(bootstrap, topic, group, store, extra);
  kl_t_worker_go(tw);
  return tw;
}

kl_err_t kl_t_worker_stop(kl_t_worker_t *tw) {
  kl_worker_stop(tw->worker);
  pthread_join(tw->thread, NULL);
  kl_err_t err = tw->result;
  kl_worker_destroy(tw->worker);
  free(tw);
  return err;
}

void kl_t_store_rebind(kl_store_t *store, const char *topic,
                       const char *group) {
  kl__store_owner_t was, owner;
  if (kl__store_owner(store, topic, &was) ||
      kl__store_owner_make(&owner, was.cluster, group) ||
      kl__store_bind(store, topic, &owner)) {
    fprintf(stderr, "cannot bind topic %s to group %s: %s\n", topic, group,
            kl_err_detail());
    abort();
  }
}

uint64_t kl_t_workers_applied(kl_t_worker_t *const *tw, size_t n, uint64_t want,
                              int ms) {
  uint64_t sum = 0;
  for (int t = 0;; t += 10) {
    sum = 0;
    for (size_t i = 0; i < n; i++) {
      kl_worker_stats_t st;
      kl_worker_stats(tw[i]->worker, &st, sizeof(st));
      sum += st.applied;
    }
    if (sum >= want || t >= ms)
      return sum;
    kl_t_sleep_ms(10);
  }
}

const char *kl_t_bin(void) {
  const char *bin = getenv("KEYLANE_BIN");
  return bin ? bin : "build/bin/keylane";
}

int kl_t_use_bench(void **state) {
  (void)state;
  const char *build = getenv("KEYLANE_BUILD_DIR");
  char path[1024];
  snprintf(path, sizeof(path), "%s/bin/keylane-bench", build ? build : "build");
  setenv("KEYLANE_BIN", path, 1);
  return 0;
}

int kl_t_produce_credit(const char *bootstrap, const char *topic,
                        int32_t partition, const char *key, const char *id,
                        int amount) {
  return kl_t_produce_credit_under(bootstrap, topic, partition, key, key, id,
                                   amount);
}

int kl_t_produce_credit_under(const char *bootstrap, const char *topic,
                              int32_t partition, const char *record_key,
                              const char *key, const char *id, int amount) {
  const unsigned char payload[] = {
      0x82, 0xa6, 'a', 'm', 'o', 'u', 'n', 't', (unsigned char)amount,
      0xa3, 's',  'e', 'q', 0x01};
  kl_event_t ev = {.key = key,
                   .key_len = strlen(key),
                   .id = id,
                   .id_len = strlen(id),
                   .type = "credit",
                   .type_len = 6,
                   .ts = 1,
                   .payload = payload,
                   .payload_len = sizeof(payload)};
  void *env;
  size_t len;
  if (kl_event_encode(&ev, &env, &len) != KL_OK) {
    fprintf(stderr, "kl_t_produce_credit: %s\n", kl_err_detail());
    return -1;
  }
  int rc =
      kl_t_produce_raw(bootstrap, topic, partition, record_key, env, len, NULL);
  free(env);
  return rc;
}

int kl_t_produce_raw(const char *bootstrap, const char *topic,
                     int32_t partition, const char *key, const void *value,
                     size_t len, const char *const *hdrs) {
  return kl_t_produce_raw_at(bootstrap, topic, partition, key, value, len, hdrs,
                             0);
}

int kl_t_produce_raw_at(const char *bootstrap, const char *topic,
                        int32_t partition, const char *key, const void *value,
                        size_t len, const char *const *hdrs,
                        int64_t timestamp) {
  char errstr[256];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                    sizeof(errstr));
  rd_kafka_t *rk =
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
  if (!rk) {
    fprintf(stderr, "kl_t_produce_raw: %s\n", errstr);
    return -1;
  }
  rd_kafka_headers_t *h = rd_kafka_headers_new(8);
  for (size_t i = 0; hdrs && hdrs[i]; i += 2)
    rd_kafka_header_add(h, hdrs[i], -1, hdrs[i + 1], -1);
  rd_kafka_resp_err_t err = rd_kafka_producev(
      rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
      RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE((void *)value, len),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h),
      RD_KAFKA_V_TIMESTAMP(timestamp), RD_KAFKA_V_END);
  if (err)
    rd_kafka_headers_destroy(h); /* not taken on failure */
  else
    err = rd_kafka_flush(rk, 10000);
  rd_kafka_destroy(rk);
  if (err)
    fprintf(stderr, "kl_t_produce_raw to %s: %s\n", topic,
            rd_kafka_err2str(err));
  return err ? -1 : 0;
}

void kl_t_rebuild_into(const kl_conf_t *conf, const char *topic,
                       kl_store_t *store, kl_handler_fn_t *handler,
                       void *handler_opaque, kl__replay_part_t *totals) {
  kl__replay_opts_t o = {.conf = conf,
                         .topic = topic,
                         .store = store,
                         .handler = handler,
                         .handler_opaque = handler_opaque,
                         .rebuild = 1,
                         .from = {KL__POS_BEGINNING, 0},
                         .to = {KL__POS_END, 0}};
  kl__replay_t *r;
  if (kl__replay_new(&o, &r) || kl__replay_run(r)) {
    fprintf(stderr, "the rebuild of %s did not start: %s\n", topic,
            kl_err_detail());
    abort();
  }
  if (totals)
    kl__replay_totals(r, totals);
  kl__replay_destroy(r);
}
