/*
 * A program built only from the installed headers and library: it calls
 * the public API as a library user does, one concept per header (the
 * routing is event.h's, the handlers handlers.h's), and prints
 * "KL_EFENCED ok" when every call answered as its header says.
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <keylane/conf.h>
#include <keylane/error.h>
#include <keylane/event.h>
#include <keylane/handlers.h>
#include <keylane/store.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A refused setting is told by kl_err_detail(), the one error channel. */
static int conf_ok(void) {
  kl_conf_t *conf = kl_conf_new();
  int ok = conf && kl_conf_set(conf, "store.durability", "none") == KL_OK &&
           kl_conf_set(conf, "worker.bogus", "1") == KL_ECONF &&
           strstr(kl_err_detail(), "worker.bogus") != NULL;
  kl_conf_destroy(conf);
  return ok;
}

/* An id is marked, prefetched and looked up on its entity key: the same
 * id on another key is another event. */
static int ids_ok(const char *dir) {
  kl_store_t *store = NULL;
  kl_partition_state_t st;
  kl_txn_t *txn = NULL;
  kl_mark_t mine = KL_MARK_NONE, other = KL_MARK_APPLIED;
  const void *keys[] = {"acct-1", "acct-2"};
  const char *ids[] = {"id-1", "id-1"};
  size_t key_lens[] = {6, 6}, id_lens[] = {4, 4};
  int ok = kl_store_open(dir, NULL, &store) == KL_OK &&
           kl_store_acquire(store, "events", 0, &st) == KL_OK &&
           kl_store_begin(store, "events", 0, st.epoch, &txn) == KL_OK &&
           kl_txn_mark(txn, "acct-1", 6, "id-1", 4, KL_MARK_APPLIED) == KL_OK &&
           kl_store_commit(txn, 1) == KL_OK &&
           kl_store_begin(store, "events", 0, st.epoch, &txn) == KL_OK &&
           kl_txn_prefetch(txn, keys, key_lens, ids, id_lens, 2) == KL_OK &&
           kl_txn_seen(txn, "acct-1", 6, "id-1", 4, &mine) == KL_OK &&
           kl_txn_seen(txn, "acct-2", 6, "id-1", 4, &other) == KL_OK &&
           mine == KL_MARK_APPLIED && other == KL_MARK_NONE;
  kl_store_abort(txn);
  kl_store_destroy(store);
  return ok;
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int main(void) {
  /* What the header declares is what the library exports. */
  kl_handler_fn_t *ledger = kl_ledger_handler;
  kl_err_t (*stats)(const kl_worker_t *, kl_worker_stats_t *, size_t) =
      kl_worker_stats;
  /* "foobar" is one of Kafka's own murmur2 test vectors. */
  int ok = kl_murmur2("foobar", 6) == (uint32_t)-790332482 &&
           kl_partition("foobar", 6, 12) >= 0 && ledger && stats && conf_ok();
  char dir[] = "/tmp/keylane-consumer-XXXXXX";
  if (!mkdtemp(dir))
    return 2;
  ok = ids_ok(dir) && ok;
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  printf("%s %s\n", kl_err_name(KL_EFENCED), ok ? "ok" : "wrong");
  return ok ? 0 : 1;
}
