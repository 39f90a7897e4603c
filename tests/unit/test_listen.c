/*
 * The listening socket shared by the gateway and the metrics server
 * (common/listen.h): the address forms both accept, the messages for the
 * ones they refuse, and the port read back after binding port 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <netinet/in.h>

#include "common/listen.h"
#include "keylane/error.h"

static void test_addresses_accepted(void **state) {
  (void)state;
  struct sockaddr_storage addr;
  assert_int_equal(kl__listen_addr("--listen", "127.0.0.1:8080", &addr), KL_OK);
  assert_int_equal(addr.ss_family, AF_INET);
  assert_int_equal(ntohs(((struct sockaddr_in *)&addr)->sin_port), 8080);
  assert_int_equal(kl__listen_addr("--listen", "[::1]:9464", &addr), KL_OK);
  assert_int_equal(addr.ss_family, AF_INET6);
  assert_int_equal(ntohs(((struct sockaddr_in6 *)&addr)->sin6_port), 9464);
  /* No host is loopback, not every interface. */
  assert_int_equal(kl__listen_addr("--listen", ":0", &addr), KL_OK);
  assert_int_equal(((struct sockaddr_in *)&addr)->sin_addr.s_addr,
                   htonl(INADDR_LOOPBACK));
}

static void kl_t_refused(const char *listen, const char *says) {
  struct sockaddr_storage addr;
  assert_int_equal(kl__listen_addr("--metrics-listen", listen, &addr),
                   KL_ECONF);
  const char *detail = kl_err_detail();
  if (!strstr(detail, "--metrics-listen") || !strstr(detail, says))
    fail_msg("%s: \"%s\" does not say \"%s\"", listen, detail, says);
}

static void test_addresses_refused(void **state) {
  (void)state;
  kl_t_refused("8080", "is not ADDR:PORT");
  kl_t_refused("127.0.0.1:", "is not ADDR:PORT");
  kl_t_refused("127.0.0.1:65536", "port of 0-65535");
  kl_t_refused("127.0.0.1:-1", "is not ADDR:PORT");
  kl_t_refused("localhost:80", "\"localhost\" is not a numeric IPv4");
  kl_t_refused("[]:80", "\"[]\" is not a numeric");
  kl_t_refused("[::1:80", "is not a numeric");
  char longhost[200];
  memset(longhost, '1', sizeof(longhost));
  snprintf(longhost + 150, 10, ":80");
  kl_t_refused(longhost, "is not ADDR:PORT");
}

/* What the gateway warns about without tokens: any address but loopback. */
static void test_loopback(void **state) {
  (void)state;
  static const struct {
    const char *listen;
    bool loopback;
  } cases[] = {{"127.0.0.1:80", true},
               {"127.9.8.7:80", true},
               {":80", true},
               {"[::1]:80", true},
               {"[::ffff:127.0.0.1]:80", true},
               {"0.0.0.0:80", false},
               {"10.0.0.1:80", false},
               {"128.0.0.1:80", false},
               {"[::]:80", false},
               {"[fe80::1]:80", false},
               {"[::ffff:10.0.0.1]:80", false}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct sockaddr_storage addr;
    assert_int_equal(kl__listen_addr("--listen", cases[i].listen, &addr),
                     KL_OK);
    if (kl__listen_loopback(&addr) != cases[i].loopback)
      fail_msg("%s: loopback is %d", cases[i].listen, !cases[i].loopback);
  }
}

static void kl_t_on_conn(uv_stream_t *server, int status) {
  (void)server, (void)status;
}

static void test_bound_port_read_back(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  uv_tcp_t a, b;
  uv_tcp_init(&loop, &a);
  uv_tcp_init(&loop, &b);
  int port = -1;
  assert_int_equal(
      kl__listen_start(&a, "--listen", "127.0.0.1:0", 16, kl_t_on_conn, &port),
      KL_OK);
  assert_true(port > 0 && port <= 65535);
  /* The same port again: refused, with the fix. */
  char taken[32];
  snprintf(taken, sizeof(taken), "127.0.0.1:%d", port);
  int port2 = -1;
  assert_int_equal(
      kl__listen_start(&b, "--listen", taken, 16, kl_t_on_conn, &port2),
      KL_EIO);
  assert_non_null(strstr(kl_err_detail(), "pick another port"));
  assert_non_null(strstr(kl_err_detail(), taken));
  uv_close((uv_handle_t *)&a, NULL);
  uv_close((uv_handle_t *)&b, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addresses_accepted),
      cmocka_unit_test(test_addresses_refused),
      cmocka_unit_test(test_loopback),
      cmocka_unit_test(test_bound_port_read_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
