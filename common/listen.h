/*
 * The listening socket of keylane's HTTP servers, the publish gateway
 * (broker/gateway.c) and the worker's metrics server
 * (cli/metrics_server.c): one address syntax, one bind, one way to read
 * the port that port 0 got.
 */
#ifndef KEYLANE_COMMON_LISTEN_H
#define KEYLANE_COMMON_LISTEN_H

#include <stdbool.h>
#include <sys/socket.h>

#include <uv.h>

#include "keylane/error.h"

/**
 * Parses @p listen: "127.0.0.1:8080", "[::1]:8080", or ":8080" (loopback).
 * Port 0 asks the kernel for a free one.
 * @param flag  the option that gave it ("--listen"), named in messages.
 * @returns KL_OK, or KL_ECONF naming the value and the form expected.
 */
kl_err_t kl__listen_addr(const char *flag, const char *listen,
                         struct sockaddr_storage *addr);

/**
 * @returns true when @p addr (from kl__listen_addr()) is a loopback
 *          address (127.0.0.0/8, ::1, or ::ffff:127.x.y.z), which only
 *          this host reaches; false for any other, 0.0.0.0 and :: too.
 */
bool kl__listen_loopback(const struct sockaddr_storage *addr);

/**
 * Binds @p tcp (initialised on its loop) to @p listen and listens with
 * @p backlog, calling @p on_conn for each connection.
 * @param port  set to the bound port (the kernel's pick for port 0).
 * @returns KL_OK, KL_ECONF for an address kl__listen_addr() refuses, or
 *          KL_EIO when the address cannot be bound (in use, not local).
 *          On failure @p tcp is left open: the caller closes it.
 * @remark  Runs on the thread of @p tcp's loop.
 */
kl_err_t kl__listen_start(uv_tcp_t *tcp, const char *flag, const char *listen,
                          int backlog, uv_connection_cb on_conn, int *port);

#endif
