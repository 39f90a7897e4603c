/* keylane inspect's view of one record (cli/inspect.c), which the
 * console's dead-letter view shows too. */
#ifndef KEYLANE_CLI_INSPECT_H
#define KEYLANE_CLI_INSPECT_H

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "keylane/event.h"

/**
 * @p m as JSON: partition, offset, the envelope decoded (key, id, type,
 * ts, payload, headers; or the bytes in base64 and the decoder's error),
 * its Kafka headers and, for a dead letter, "dead_letter" (reason, error,
 * attempts, origin, failure times).
 * @returns a new reference, json_decref()ed by the caller.
 */
json_t *kl__inspect_record_json(kl_decoder_t *decoder,
                                const rd_kafka_message_t *m);

#endif
