/* keylane broker's gateway mode (cli/broker_gateway.c). */
#ifndef KEYLANE_CLI_BROKER_GATEWAY_H
#define KEYLANE_CLI_BROKER_GATEWAY_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/opts.h"

/** The embedded cluster's settings, which both modes of keylane broker
 *  take. */
typedef struct kl__broker_embedded {
  int embedded; /**< --embedded: run librdkafka's mock cluster */
  const char *topic;
  int64_t partitions, brokers;
} kl__broker_embedded_t;

/** The options of kl__broker_embedded_t, for the table of an args struct
 *  of @p type whose member @p m is one; @p with prefixes their help. */
#define KL__BROKER_EMBEDDED_OPTS(type, m, with)                                \
  {.name = "embedded",                                                         \
   .kind = KL__OPT_FLAG,                                                       \
   .off = offsetof(type, m.embedded),                                          \
   .help = "run an embedded Kafka-protocol cluster"},                          \
      {.name = "topic",                                                        \
       .letter = 't',                                                          \
       .kind = KL__OPT_STRING,                                                 \
       .meta = "TOPIC",                                                        \
       .def = "events",                                                        \
       .off = offsetof(type, m.topic),                                         \
       .help = with "topic to create"},                                        \
      {.name = "partitions",                                                   \
       .kind = KL__OPT_COUNT,                                                  \
       .min = 1,                                                               \
       .max = 100000,                                                          \
       .def = "8",                                                             \
       .off = offsetof(type, m.partitions),                                    \
       .help = with "its partition count, 1..100000"},                         \
  {                                                                            \
    .name = "brokers", .kind = KL__OPT_COUNT, .min = 1, .max = 16, .def = "3", \
    .off = offsetof(type, m.brokers),                                          \
    .help = with "brokers in the cluster, 1..16"                               \
  }

/** @returns true when the broker arguments ask for the HTTP gateway
 * (--listen or -b/--bootstrap), false for the embedded cluster alone. */
bool kl__broker_gateway_wanted(int argc, char **argv);

/** Runs `keylane broker` as the HTTP publish gateway; argv[0] is "broker". */
int kl__cmd_broker_gateway(int argc, char **argv);

#endif
