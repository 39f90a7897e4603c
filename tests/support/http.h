/*
 * HTTP for the gateway's tests and benchmark: a blocking HTTP/1.1 client on
 * raw sockets (responses parsed by http-parser, so pipelined responses are
 * split exactly), and the gateway run in-process on its own thread.
 */
#ifndef KEYLANE_TESTS_SUPPORT_HTTP_H
#define KEYLANE_TESTS_SUPPORT_HTTP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "broker/gateway.h"

/** One response. Free with kl_t_http_resp_free(). */
typedef struct kl_t_http_resp {
  int status;
  char *body; /* NUL terminated */
  size_t body_len;
  char headers[4096]; /* "name: value\n" lines, names lowercased */
  bool keep_alive;
} kl_t_http_resp_t;

typedef struct kl_t_http kl_t_http_t;

/** Connects to 127.0.0.1:@p port; NULL on failure. */
kl_t_http_t *kl_t_http_open(int port);
void kl_t_http_close(kl_t_http_t *http);
int kl_t_http_fd(const kl_t_http_t *http);

/** Sends every byte of @p data; 0, or -1 when the connection failed. */
int kl_t_http_send(kl_t_http_t *http, const void *data, size_t len);

/** Formats a request (Host, Content-Length and @p extra header lines
 * "Name: value\r\n..." included) into a malloc()ed string. */
char *kl_t_http_format(const char *method, const char *path, const char *extra,
                       const void *body, size_t body_len, size_t *len);

/** kl_t_http_format() and kl_t_http_send(). */
int kl_t_http_request(kl_t_http_t *http, const char *method, const char *path,
                      const char *extra, const void *body, size_t body_len);

/**
 * Reads the next response (in the order the requests were sent).
 * @returns 0; -1 on a timeout, a closed connection or a malformed response.
 */
int kl_t_http_recv(kl_t_http_t *http, kl_t_http_resp_t *resp, int timeout_ms);

/** @returns the value of response header @p name (lowercase), or NULL. */
const char *kl_t_http_header(const kl_t_http_resp_t *resp, const char *name,
                             char *out, size_t size);

void kl_t_http_resp_free(kl_t_http_resp_t *resp);

/** One request on a new connection: open, send, receive, close. */
int kl_t_http_once(int port, const char *method, const char *path,
                   const char *extra, const char *body, kl_t_http_resp_t *resp);

/** Waits until the gateway at @p port has seen Kafka (/healthz answers
 * 200): a request before that is refused 503. Fails the test after 10 s. */
void kl_t_http_wait_up(int port);

/** A gateway serving on its own thread. */
typedef struct kl_t_gateway {
  kl__gateway_t *gateway;
  pthread_t thread;
  int port;
} kl_t_gateway_t;

/**
 * Starts a gateway on 127.0.0.1, a free port, for @p bootstrap. @p opts may
 * be NULL (the defaults); its listen address is replaced. @p extra holds
 * "key=value" conf pairs, NULL-terminated; may be NULL. Aborts on failure.
 */
kl_t_gateway_t *kl_t_gateway_start(const char *bootstrap,
                                   const kl__gateway_opts_t *opts,
                                   const char *const *extra);

/** Stops, joins and frees it. */
void kl_t_gateway_stop(kl_t_gateway_t *tg);

#endif
