/*
 * libFuzzer target for the gateway's request handling: the whole gateway
 * (http-parser and its callbacks, the request FIFO, routes, limits, body
 * validation) runs in-process on its own thread with no Kafka reachable;
 * each input is sent as the bytes of one client connection, which then
 * half-closes, and the answers are read until the gateway closes.
 * Whatever the bytes:
 * - the gateway neither crashes, overreads, leaks (ASan) nor hangs: every
 *   connection is closed within the read timeout;
 * - whatever it sends is a sequence of HTTP/1.1 responses, the first
 *   starting "HTTP/1.1 ", each status a 3-digit code it knows.
 * Seeds: tests/fuzz/run.sh writes a few requests (a publish, pipelined
 * requests, chunked bodies, the framing RFC 9112 refuses).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"
#include "broker/gateway.h"
#include "common/internal.h"
#include "keylane/conf.h"

static kl__gateway_t *kl_gw;
static pthread_t kl_gw_thread;
static int kl_port;

static void *kl_gw_main(void *opaque) {
  kl__gateway_run(opaque);
  return NULL;
}

/* At libFuzzer's exit: the gateway's thread ends first, so that the
 * process's exit handlers never run under a gateway still serving (a
 * "deadly signal" after the last run, seen once). Its producer, with
 * events for an unreachable Kafka, is left to the exit. */
static void kl_gw_end(void) {
  kl__gateway_stop(kl_gw);
  pthread_join(kl_gw_thread, NULL);
}

static void kl_gw_start(void) {
  kl_conf_t *conf = kl_conf_new();
  CHECK(kl_conf_set(conf, "kafka.bootstrap.servers", "127.0.0.1:1") == KL_OK);
  CHECK(kl_conf_set(conf, "kafka.log_level", "0") == KL_OK);
  static kl__gateway_opts_t o;
  kl__gateway_opts_default(&o);
  o.listen = "127.0.0.1:0";
  o.max_body = 64 * 1024;
  o.max_header = 4096;
  o.max_pipeline = 8;
  o.request_timeout_ms = 2000;
  o.drain_timeout_ms = 0; /* at the exit: nothing waits for Kafka */
  o.allow_origins = "https://app.example.com";
  o.allow_topics = "events*";
  CHECK(kl__gateway_new(conf, &o, &kl_gw) == KL_OK);
  kl_conf_destroy(conf);
  kl_port = kl__gateway_port(kl_gw);
  CHECK(pthread_create(&kl_gw_thread, NULL, kl_gw_main, kl_gw) == 0);
  atexit(kl_gw_end);
}

/* connect(), waiting it out when a signal (libFuzzer's timers) interrupts
 * it: the connection then goes on in the background. @returns 0 or -1. */
static int kl_connect(int fd, const struct sockaddr_in *addr) {
  if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0)
    return 0;
  if (errno != EINTR)
    return -1;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  while (poll(&p, 1, 8000) < 0 && errno == EINTR)
    ;
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
    return -1;
  errno = err;
  return err ? -1 : 0;
}

/* Checks that @p out (@p len bytes) is HTTP/1.1 responses. */
static void kl_check_responses(const char *out, size_t len) {
  if (len == 0)
    return; /* closed without an answer: a request cut by the half-close */
  CHECK(len >= 12 && memcmp(out, "HTTP/1.1 ", 9) == 0);
  for (size_t i = 0; i + 12 <= len; i++)
    if (memcmp(out + i, "HTTP/1.1 ", 9) == 0 &&
        (i == 0 || out[i - 1] == '\n')) {
      int code = (out[i + 9] - '0') * 100 + (out[i + 10] - '0') * 10 +
                 (out[i + 11] - '0');
      CHECK(code >= 100 && code <= 599);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!kl_gw)
    kl_gw_start();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)kl_port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (kl_connect(fd, &addr) != 0) {
    fprintf(stderr, "connect: %s\n", strerror(errno));
    CHECK(!"the gateway takes connections");
  }
  struct timeval tv = {8, 0}; /* a hang is a finding (-timeout=10) */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; /* refused and closed before the rest */
    sent += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  static char out[1 << 20];
  size_t len = 0;
  for (;;) {
    ssize_t n = recv(fd, out + len, sizeof(out) - len, 0);
    if (n < 0 && errno == EINTR)
      continue; /* libFuzzer's timer signal */
    if (n == 0 || (n < 0 && len > 0 && len == sizeof(out)))
      break;
    if (n < 0) {
      if (errno != ECONNRESET) /* a timeout (EAGAIN) is a hang */
        fprintf(stderr, "recv after %zu bytes: %s\n", len, strerror(errno));
      CHECK(errno == ECONNRESET);
      break;
    }
    len += (size_t)n;
    if (len == sizeof(out))
      break;
  }
  /* Closed by a reset, not a FIN: thousands of connections a second would
   * otherwise leave as many ports in TIME_WAIT and run out of them. */
  struct linger hard = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  close(fd);
  kl_check_responses(out, len);
  return 0;
}
