/*
 * The embedded cluster's brokers (broker/embedded.c) answer without
 * Nagle's delay: every connection they accept has TCP_NODELAY. With Nagle
 * on, a broker's response written while the client had not acknowledged
 * the one before waited for the client's delayed ACK, and a produce to
 * three partitions or more was acknowledged in 44 ms instead of a fraction
 * of one: the demo, the benchmarks and the tests all ran on that.
 *
 * The check looks at the broker's side of a connection this test opens:
 * the brokers run in this process, so their sockets are among its fds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "keylane/embedded.h"
#include "support/support.h"

/* The port of "127.0.0.1:PORT[,...]". */
static int t_port(const char *bootstrap) {
  const char *colon = strchr(bootstrap, ':');
  assert_non_null(colon);
  return atoi(colon + 1);
}

/* A socket of this process whose local port is @p port and that does not
 * listen: a connection the broker accepted. -1 when there is none yet. */
static int t_accepted_fd(int port) {
  for (int fd = 0; fd < 4096; fd++) {
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    int listening = 0;
    socklen_t olen = sizeof(listening);
    if (getsockname(fd, (struct sockaddr *)&sin, &len) != 0 ||
        sin.sin_family != AF_INET || ntohs(sin.sin_port) != port ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) != 0 ||
        listening)
      continue;
    return fd;
  }
  return -1;
}

static void test_brokers_send_without_nagle(void **state) {
  (void)state;
  kl_embedded_t *embedded;
  assert_int_equal(kl_embedded_new(1, "nagle", 1, &embedded), KL_OK);
  int port = t_port(kl_embedded_bootstrap(embedded));
  int client = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(client >= 0);
  struct sockaddr_in to = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(client, (struct sockaddr *)&to, sizeof(to)), 0);
  int fd = -1;
  for (int t = 0; t < 5000 && fd < 0; t += 10) {
    fd = t_accepted_fd(port);
    if (fd < 0)
      kl_t_sleep_ms(10);
  }
  if (fd < 0)
    fail_msg("the broker on port %d accepted no connection in 5 s", port);
  int nodelay = 0;
  socklen_t len = sizeof(nodelay);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  assert_int_equal(nodelay, 1);
  close(client);
  kl_embedded_destroy(embedded);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_brokers_send_without_nagle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
