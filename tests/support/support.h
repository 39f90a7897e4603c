/* Shared test fixtures: temp dirs, clusters, workers on threads. */
#ifndef KEYLANE_TESTS_SUPPORT_H
#define KEYLANE_TESTS_SUPPORT_H

#include <pthread.h>
#include <stdint.h>

#include "keylane/embedded.h"
#include "keylane/producer.h"
#include "keylane/store.h"
#include "keylane/worker.h"
#include "cli/ledger_gen.h"

/* Makes a fresh directory $TMPDIR/keylane-test-XXXXXX (TMPDIR: /tmp when
 * unset) into @p dir (64). A test removes it with kl_t_rmrf() when it
 * passes; one that fails keeps it, and the process names what it kept
 * when it exits. */
void kl_t_tmpdir(char *dir);
void kl_t_rmrf(const char *dir);
void kl_t_sleep_ms(int ms);

/* A producer whose deliveries feed @p gen. */
kl_producer_t *kl_t_producer(const char *bootstrap, kl__ledger_gen_t *gen);

/* Produces one raw record (no envelope made) to @p topic's @p partition
 * with Kafka headers @p hdrs (name, value, ..., NULL; may be NULL) and
 * waits for its acknowledgement. @returns 0, or -1 (printed to stderr). */
int kl_t_produce_raw(const char *bootstrap, const char *topic,
                     int32_t partition, const char *key, const void *value,
                     size_t len, const char *const *hdrs);

/* kl_t_produce_raw() with the record's timestamp (ms; 0: now), as any
 * producer may set it. */
int kl_t_produce_raw_at(const char *bootstrap, const char *topic,
                        int32_t partition, const char *key, const void *value,
                        size_t len, const char *const *hdrs, int64_t timestamp);

/* Produces a ledger credit {"amount": amount (0..127), "seq": 1} of
 * @p key with id @p id as a keylane envelope, raw (kl_t_produce_raw()):
 * past every check of kl_publish(), as another producer could write it.
 * @returns 0, or -1 (printed to stderr). */
int kl_t_produce_credit(const char *bootstrap, const char *topic,
                        int32_t partition, const char *key, const char *id,
                        int amount);

/* kl_t_produce_credit() under the Kafka key @p record_key, which need not
 * be @p key nor keep its limit (a record that does not decode). */
int kl_t_produce_credit_under(const char *bootstrap, const char *topic,
                              int32_t partition, const char *record_key,
                              const char *key, const char *id, int amount);

/* A worker running kl_worker_run() on its own thread. */
typedef struct kl_t_worker {
  kl_worker_t *worker;
  pthread_t thread;
  kl_err_t result;
  char detail[512]; /* kl_err_detail() of the worker's thread at its end */
} kl_t_worker_t;

/* Starts a ledger worker; @p extra is "key=value" pairs, NULL-terminated. */
kl_t_worker_t *kl_t_worker_start(const char *bootstrap, const char *topic,
                                 const char *group, kl_store_t *store,
                                 const char *const *extra);
/* The same in two steps, to set test hooks before it runs. */
kl_t_worker_t *kl_t_worker_new(const char *bootstrap, const char *topic,
                               const char *group, kl_store_t *store,
                               const char *const *extra);
/* The same with another handler than the ledger's. */
kl_t_worker_t *kl_t_worker_new_with(const char *bootstrap, const char *topic,
                                    const char *group, kl_store_t *store,
                                    const char *const *extra,
                                    kl_handler_fn_t *handler, void *opaque);
void kl_t_worker_go(kl_t_worker_t *tw);
/* Stops, joins and frees it; returns what kl_worker_run() returned. */
kl_err_t kl_t_worker_stop(kl_t_worker_t *tw);

/* Records @p group as the owner of @p topic in @p store, its cluster
 * kept (what `keylane store bind` does for a renamed group). */
void kl_t_store_rebind(kl_store_t *store, const char *topic, const char *group);

/* The events the @p n workers @p tw applied between them, once that adds
 * up to @p want, or after @p ms. A worker counts a batch just after its
 * store commit, which a test may see first (kl__ledger_gen_wait()): read
 * at once, the stats can miss the last batch. */
uint64_t kl_t_workers_applied(kl_t_worker_t *const *tw, size_t n, uint64_t want,
                              int ms);

/* This process's log (its stderr) goes to a file from kl_t_stderr_begin()
 * until kl_t_stderr_end(), which copies it to the real stderr and returns
 * it: malloc()ed, NUL-terminated, the caller's to free. Not nested. */
typedef struct kl_t_stderr {
  int saved; /* the real stderr */
  int fd;    /* the file it goes to meanwhile */
} kl_t_stderr_t;
void kl_t_stderr_begin(kl_t_stderr_t *log);
char *kl_t_stderr_end(kl_t_stderr_t *log);

/* The binary under test (KEYLANE_BIN) */
const char *kl_t_bin(void);
/* Points KEYLANE_BIN at KEYLANE_BUILD_DIR's bin/keylane-bench, for the
 * tests that run the benchmark; a cmocka group setup (@p state unused). */
int kl_t_use_bench(void **state);

/* Rebuilds @p topic from its whole log into @p store, as `keylane store
 * rebuild` does, in this process (so on the test's store clock), with
 * @p conf (its bootstrap servers and any keys the rebuild is to judge
 * by) and @p handler; its partitions' sums in *@p totals (NULL: none).
 * Fails the test when the rebuild cannot start. */
struct kl__replay_part;
void kl_t_rebuild_into(const kl_conf_t *conf, const char *topic,
                       kl_store_t *store, kl_handler_fn_t *handler,
                       void *handler_opaque, struct kl__replay_part *totals);

#endif
