/* The ledger's stored entry, shared by the handler and `keylane ledger`. */
#ifndef KEYLANE_WORKER_LEDGER_H
#define KEYLANE_WORKER_LEDGER_H

#include <msgpack.h>
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

/* A ledger event's payload: "amount" always, "seq" for a debit and a
 * transfer (optional for a credit), "to" for a transfer, "from" in the
 * credit a transfer emits. to and from are borrowed; NULL: absent. */
typedef struct kl_ledger_args {
  int64_t amount, seq;
  int has_amount, has_seq;
  const char *to, *from;
  size_t to_len, from_len;
} kl_ledger_args_t;

/* Packs @p a into @p sb (initialised by the caller) as the payload map
 * {"to", "amount", "seq", "from"} without the fields @p a lacks; amount
 * is always packed. The one writer of the payload the handler reads. */
void kl__ledger_encode(msgpack_sbuffer *sb, const kl_ledger_args_t *a);

#endif
