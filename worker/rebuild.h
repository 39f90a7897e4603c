/*
 * What a rebuilt store's outbox keeps. `keylane store rebuild` runs every
 * handler over the log again, so it derives every follow-up again, with a
 * new nonce in its id (event/emit_id.h): a worker on the rebuilt store
 * would publish each a second time, under a second id, and its consumer
 * would apply it twice. The log tells which were published: a follow-up
 * record in its destination topic whose id names the same source place
 * (topic, partition, offset, index) and that carries the same key, type
 * and payload (a record another producer wrote with such an id, and
 * another content, is not it); and so does the dead-letter topic for a
 * follow-up Kafka refused, which the outbox set aside there (reason
 * outbox: its redrive publishes it). Those are removed from the rebuilt
 * outbox; the others (the lost store never published them) stay, to be
 * published.
 *
 * Use: kl__rebuild_new() lists the rebuilt outbox; the caller feeds it
 * every record of each topic kl__rebuild_topic() names
 * (kl__rebuild_see()); kl__rebuild_prune() removes what was found.
 * The matching needs no Kafka, so the simulator drives it on its own log.
 *
 * Caveats: not thread safe; one rebuild at a time.
 */
#ifndef KEYLANE_WORKER_REBUILD_H
#define KEYLANE_WORKER_REBUILD_H

#include <stddef.h>
#include <stdint.h>

#include "keylane/error.h"
#include "keylane/event.h"
#include "keylane/store.h"

typedef struct kl__rebuild kl__rebuild_t;

/**
 * Lists the outbox of @p partitions (@p count of them) of @p topic in
 * @p store, as the rebuild left it.
 * @param topic  borrowed until kl__rebuild_destroy().
 * @returns KL_OK and *out (kl__rebuild_destroy() it); KL_ENOMEM or the
 *          store's error.
 */
kl_err_t kl__rebuild_new(kl_store_t *store, const char *topic,
                         const int32_t *partitions, size_t count,
                         kl__rebuild_t **out);

/** @returns the @p i th topic the listed follow-ups are for, or NULL past
 *  the last: each is to be read whole and fed to kl__rebuild_see(). */
const char *kl__rebuild_topic(const kl__rebuild_t *rb, size_t i);

/** A record of topic @p in: when it is a follow-up of a listed one's
 *  source place, that one is found. */
void kl__rebuild_see(kl__rebuild_t *rb, const char *in,
                     const kl_event_t *event);

/**
 * Removes the found follow-ups from the outbox.
 * @returns KL_OK with @p dropped and @p kept (may be NULL) set; the store's
 *          error.
 */
kl_err_t kl__rebuild_prune(kl__rebuild_t *rb, uint64_t *dropped,
                           uint64_t *kept);

/** Frees @p rb; accepts NULL. */
void kl__rebuild_destroy(kl__rebuild_t *rb);

#endif
