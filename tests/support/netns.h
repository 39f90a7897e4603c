/*
 * Test hosts as network namespaces: each host is a namespace the test makes
 * (`ip netns add`) with a veth pair to the root namespace, host side
 * 10.213.N.2/30, root side ("the gateway") 10.213.N.1/30. Every address is
 * on the veths made here and removed by kl_t_netns_destroy(); no traffic
 * leaves the machine.
 *
 * A host reaches a service of the root namespace in two ways: a server
 * that listens on the gateway address (the throwaway PostgreSQL does), or a
 * relay (kl_t_netns_relay) that makes 127.0.0.1:PORT inside every host
 * reach 127.0.0.1:PORT of the root namespace, over the host's veth, for
 * servers that listen on loopback only (the embedded Kafka cluster).
 * Cutting a host's veth (kl_t_netns_cut) cuts both.
 *
 * Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; without them
 * kl_t_netns_new() fails and says why, so the test can skip.
 */
#ifndef KEYLANE_TESTS_SUPPORT_NETNS_H
#define KEYLANE_TESTS_SUPPORT_NETNS_H

#include <stddef.h>

typedef struct kl_t_netns kl_t_netns_t;

#define KL_T_NETNS_MAX 4

/** Makes @p hosts hosts (1..KL_T_NETNS_MAX); NULL with @p why on failure. */
kl_t_netns_t *kl_t_netns_new(int hosts, char *why, size_t why_size);

/** @returns the path of iproute2's ip, for `ip netns exec NAME CMD`. */
const char *kl_t_netns_ip(const kl_t_netns_t *ns);

/** @returns host @p i's namespace name, for `ip netns exec NAME`. */
const char *kl_t_netns_name(const kl_t_netns_t *ns, int i);

/** @returns the root side's address of host @p i's veth ("10.213.i.1"). */
const char *kl_t_netns_gateway(const kl_t_netns_t *ns, int i);

/** @returns the gateways as "10.213.0.1,10.213.1.1,...", for listeners. */
const char *kl_t_netns_gateways(const kl_t_netns_t *ns);

/** Relays 127.0.0.1:@p port of every host to the root's; 0 or -1. */
int kl_t_netns_relay(kl_t_netns_t *ns, int port);

/** Takes host @p i's veth down (@p down) or up again; 0 or -1. */
int kl_t_netns_cut(kl_t_netns_t *ns, int i, int down);

/** Stops the relays and removes the hosts and their veths; accepts NULL. */
void kl_t_netns_destroy(kl_t_netns_t *ns);

#endif
