/* keylane broker's gateway mode (cli/gateway.c). */
#ifndef KEYLANE_BROKER_CLI_GATEWAY_H
#define KEYLANE_BROKER_CLI_GATEWAY_H

#include <stdbool.h>

/** @returns true when the broker arguments ask for the HTTP gateway
 * (--listen or -b/--bootstrap), false for the embedded cluster alone. */
bool kl__broker_gateway_wanted(int argc, char **argv);

/** Runs `keylane broker` as the HTTP publish gateway; argv[0] is "broker". */
int kl__cmd_broker_gateway(int argc, char **argv);

#endif
