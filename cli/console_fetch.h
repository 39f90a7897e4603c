/*
 * The console's client of the workers' JSON API (cli/worker_api.h): GETs
 * to several workers at once, every one bounded by one deadline, so that
 * a worker that does not answer makes its row "unreachable" and never
 * holds the page longer than the deadline.
 *
 * URLs are "http://HOST:PORT" with HOST an IPv4 address, "[IPv6]" or
 * "localhost" (127.0.0.1): no name resolution, whose time no deadline
 * bounds. HTTP/1.1 with Connection: close, as the metrics server answers
 * (one request per connection); the body is read to the connection's end.
 *
 * Caveats: blocking; runs on the caller's thread.
 */
#ifndef KEYLANE_CLI_CONSOLE_FETCH_H
#define KEYLANE_CLI_CONSOLE_FETCH_H

#include <stddef.h>
#include <sys/socket.h>

#include "keylane/error.h"

/** The most bytes of one answer read; a longer one is an error. */
#define KL__FETCH_BODY_MAX (4 * 1024 * 1024)

/** A worker's address, parsed once (kl__console_fetch_url()). */
typedef struct kl__fetch_addr {
  char url[256];  /**< as given, without a trailing '/' */
  char host[128]; /**< the Host header's value */
  struct sockaddr_storage addr;
} kl__fetch_addr_t;

/** One GET and its answer. */
typedef struct kl__fetch {
  const kl__fetch_addr_t *to; /**< borrowed */
  const char *path;           /**< "/v1/partitions"; borrowed */
  int status;                 /**< the answer's status; 0 when there is none */
  char *body; /**< NUL-terminated, malloc()ed; NULL when no answer */
  size_t body_len;
  char error[160]; /**< why there is no answer, for a person */
} kl__fetch_t;

/**
 * Parses @p url into @p out.
 * @returns KL_OK; KL_ECONF with a detail naming the URL and the form it
 *          takes.
 */
kl_err_t kl__console_fetch_url(const char *url, kl__fetch_addr_t *out);

/**
 * Makes the @p n GETs at once and waits for their answers, @p timeout_ms
 * in all. Each fetch gets status and body, or status 0 and error.
 */
void kl__console_fetch(kl__fetch_t *fetches, size_t n, int timeout_ms);

/** Frees the bodies of @p fetches. */
void kl__console_fetch_free(kl__fetch_t *fetches, size_t n);

#endif
