/* The ledger's stored entry, shared by the handler and `keylane ledger`. */
#ifndef KEYLANE_WORKER_LEDGER_H
#define KEYLANE_WORKER_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#define KL_LEDGER_PREFIX "ledger/"
#define KL_LEDGER_VALUE_LEN 24
/* Keys are 1..KL_KEY_MAX bytes; as text with its NUL. */
#define KL_LEDGER_KEY_TEXT_MAX (1024 + 1)

typedef struct kl_ledger_entry {
  int64_t balance;
  int64_t last_seq;
  int64_t violations;
} kl_ledger_entry_t;

/* Decodes a stored value; returns 0, or -1 when it is not an entry. */
int kl__ledger_decode(const void *val, size_t len, kl_ledger_entry_t *entry);

#endif
