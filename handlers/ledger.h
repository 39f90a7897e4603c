/* The ledger's stored entry, shared by the handler and `keylane ledger`. */
#ifndef KEYLANE_HANDLERS_LEDGER_H
#define KEYLANE_HANDLERS_LEDGER_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "keylane/store.h"

/*
 * Where the entries live. A key's entry is scoped by its topic,
 * "ledger:" TOPIC "/" KEY, so that the owners of two topics sharing a
 * store are never two writers of one row (docs/design.md, "One writer per
 * row"); a topic name holds no '/' (Kafka's names are [a-zA-Z0-9._-]), so
 * the first '/' ends it. Entries written before were unscoped,
 * "ledger/" KEY: the handler never writes those again, and a topic's
 * entry created while one exists starts from it (its base, below).
 */
#define KL_LEDGER_PREFIX "ledger:"
#define KL_LEDGER_LEGACY_PREFIX "ledger/"
/* Stored: balance, last seq, violations; and the base, when not 0; and
 * after it held and delayed, when either is not 0. */
#define KL_LEDGER_VALUE_LEN 24
#define KL_LEDGER_VALUE_BASE_LEN 32
#define KL_LEDGER_VALUE_HELD_LEN 48
/* Keys are 1..KL_KEY_MAX bytes; as text with its NUL. */
#define KL_LEDGER_KEY_TEXT_MAX (1024 + 1)
/* The longest store key kl__ledger_key() writes. */
#define KL_LEDGER_STORE_KEY_MAX (sizeof(KL_LEDGER_PREFIX) + 249 + 1024)

typedef struct kl_ledger_entry {
  int64_t balance;
  int64_t last_seq;
  int64_t violations;
  /* The balance of the unscoped entry this one started from (0: none):
   * counted once in kl__ledger_walk()'s sum, however many topics started
   * from it. */
  int64_t base;
  /* Reserved by scheduled transfers not settled yet: taken from the
   * balance, owed to their destinations (money is balance + held). */
  int64_t held;
  /* Delayed events (not_before > 0) applied: a reader that knows what
   * was published and when it was due checks that none ran early. */
  int64_t delayed;
} kl_ledger_entry_t;

/* Decodes a stored value; returns 0, or -1 when it is not an entry. */
int kl__ledger_decode(const void *val, size_t len, kl_ledger_entry_t *entry);

/* Writes the store key of @p key's entry on @p topic into @p out
 * (KL_LEDGER_STORE_KEY_MAX bytes). @returns its length. */
size_t kl__ledger_key(const char *topic, const void *key, size_t key_len,
                      unsigned char *out);

/* Called by kl__ledger_walk() per key, in key order; nonzero stops. */
typedef int(kl_ledger_row_cb_t)(void *opaque, const void *key, size_t key_len,
                                const kl_ledger_entry_t *entry);

/**
 * The ledger's entries, from one snapshot per prefix. With @p topic, that
 * topic's entries as its owners keep them (an inherited base included).
 * With NULL, per key the sum over every topic and the unscoped entry:
 * the unscoped balance plus each topic's change since it started from it
 * (balance - base), the largest last seq, the violations added (base 0).
 * @returns KL_OK, the scan's failure, KL_ENOMEM, or KL_EINVAL when a key's
 *          sum leaves int64 (named in kl_err_detail()).
 */
kl_err_t kl__ledger_walk(kl_store_t *store, const char *topic,
                         kl_ledger_row_cb_t *cb, void *opaque);

/* A ledger event's payload: "amount" always, "seq" for a debit and a
 * transfer (optional for a credit), "to" for a transfer and a settle,
 * "at" for a scheduled transfer (ms since the Unix epoch), "from" in the
 * credit a transfer emits. to and from are borrowed; NULL: absent. */
typedef struct kl_ledger_args {
  int64_t amount, seq, at;
  int has_amount, has_seq, has_at;
  const char *to, *from;
  size_t to_len, from_len;
} kl_ledger_args_t;

/* Reads the payload map @p buf into @p a (a->to points into @p buf); the
 * first field the ledger reads ("amount", "seq", "to", "at") that the map has
 * twice goes to *twice: it would take the last one over the first, and
 * the producer may have meant either. Other fields, whatever their type,
 * are passed over. Nothing is allocated: it runs once per event.
 * @returns 0 for one whole msgpack map, -1 otherwise. */
int kl__ledger_payload(const void *buf, size_t len, kl_ledger_args_t *a,
                       const char **twice);

/* Packs @p a into @p sb (initialised by the caller) as the payload map
 * {"to", "amount", "seq", "at", "from"} without the fields @p a lacks; amount
 * is always packed. The one writer of the payload the handler reads. */
void kl__ledger_encode(msgpack_sbuffer *sb, const kl_ledger_args_t *a);

#endif
