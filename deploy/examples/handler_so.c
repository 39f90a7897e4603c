/*
 * A C handler for `keylane worker --handler so:PATH[:SYMBOL]`
 * (docs/exec-protocol.md, "A C handler"): counts the events of type
 * "count" per key, in the store, under "count/<key>" as decimal text.
 * Any other type is a permanent failure (a dead letter).
 *
 * Build against the installed headers and run:
 *   cc -shared -fPIC -I include -o handler_so.so deploy/examples/handler_so.c
 *   keylane worker -b HOST:9092 -t events --store /var/lib/keylane \
 *       --handler so:$PWD/handler_so.so
 * The worker looks up the symbol keylane_handler; so:PATH:SYMBOL names
 * another one. The function runs on several executor threads at once
 * (never two events of one key at once): keep no unguarded global state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keylane/store.h>
#include <keylane/worker.h>

kl_handler_result_t keylane_handler(void *opaque, const kl_event_t *event,
                                    const kl_fence_t *fence, kl_txn_t *txn,
                                    char *errbuf, size_t errbuf_size) {
  (void)opaque;
  (void)fence; /* an external resource would check it; the store needs not */
  if (event->type_len != 5 || memcmp(event->type, "count", 5) != 0) {
    snprintf(errbuf, errbuf_size, "unknown event type \"%.*s\": want count",
             (int)event->type_len, event->type);
    return KL_HANDLER_FAIL;
  }
  char key[300];
  int key_len = snprintf(key, sizeof(key), "count/%.*s", (int)event->key_len,
                         (const char *)event->key);
  if (key_len < 0 || (size_t)key_len >= sizeof(key)) {
    snprintf(errbuf, errbuf_size, "key is longer than 290 bytes");
    return KL_HANDLER_FAIL;
  }
  const void *val;
  size_t val_len;
  long long count = 0;
  kl_err_t err = kl_txn_get(txn, key, (size_t)key_len, &val, &val_len);
  if (err == KL_OK) {
    char text[32];
    snprintf(text, sizeof(text), "%.*s", (int)val_len, (const char *)val);
    count = strtoll(text, NULL, 10);
  } else if (err != KL_ENOTFOUND) {
    /* The store failed under us: the worker runs the event again. */
    snprintf(errbuf, errbuf_size, "reading %s: %s", key, kl_strerror(err));
    return KL_HANDLER_RETRY;
  }
  char text[32];
  int text_len = snprintf(text, sizeof(text), "%lld", count + 1);
  err = kl_txn_put(txn, key, (size_t)key_len, text, (size_t)text_len);
  if (err != KL_OK) {
    snprintf(errbuf, errbuf_size, "writing %s: %s", key, kl_strerror(err));
    return KL_HANDLER_RETRY;
  }
  return KL_HANDLER_OK;
}
