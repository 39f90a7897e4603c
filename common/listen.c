/* The listening socket of the gateway and the metrics server (listen.h). */
#include <netinet/in.h>
#include <string.h>

#include "common/internal.h"
#include "common/listen.h"
#include "common/units.h"

static kl_err_t listen_bad(const char *flag, const char *listen) {
  return kl__err(KL_ECONF,
                 "%s \"%s\" is not ADDR:PORT: give a numeric address and a "
                 "port of 0-65535, e.g. 127.0.0.1:8080, [::1]:8080 or :8080",
                 flag, listen ? listen : "");
}

kl_err_t kl__listen_addr(const char *flag, const char *listen,
                         struct sockaddr_storage *addr) {
  char host[128];
  const char *colon = listen ? strrchr(listen, ':') : NULL;
  int64_t port = -1;
  size_t hlen = colon ? (size_t)(colon - listen) : 0;
  if (!colon || kl__units_digits(colon + 1, strlen(colon + 1), &port) ||
      port > 65535 || hlen >= sizeof(host))
    return listen_bad(flag, listen);
  memset(addr, 0, sizeof(*addr));
  memcpy(host, listen, hlen);
  host[hlen] = '\0';
  if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') {
    host[hlen - 1] = '\0';
    if (uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)addr) == 0)
      return KL_OK;
  } else if (uv_ip4_addr(hlen ? host : "127.0.0.1", (int)port,
                         (struct sockaddr_in *)addr) == 0) {
    return KL_OK;
  }
  return kl__err(KL_ECONF,
                 "%s \"%s\": \"%.*s\" is not a numeric IPv4 or [IPv6] "
                 "address (use 127.0.0.1, 0.0.0.0 or [::1])",
                 flag, listen, (int)hlen, listen);
}

bool kl__listen_loopback(const struct sockaddr_storage *addr) {
  if (addr->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) ==
           127;
  if (addr->ss_family != AF_INET6)
    return false;
  const struct in6_addr *a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a6) ||
         (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
}

kl_err_t kl__listen_start(uv_tcp_t *tcp, const char *flag, const char *listen,
                          int backlog, uv_connection_cb on_conn, int *port) {
  struct sockaddr_storage addr;
  kl_err_t err = kl__listen_addr(flag, listen, &addr);
  if (err)
    return err;
  int rc = uv_tcp_bind(tcp, (struct sockaddr *)&addr, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)tcp, backlog, on_conn);
  if (rc != 0)
    return kl__err(KL_EIO,
                   "%s %s: cannot listen: %s; pick another port or "
                   "address",
                   flag, listen, uv_strerror(rc));
  struct sockaddr_storage bound;
  int len = sizeof(bound);
  uv_tcp_getsockname(tcp, (struct sockaddr *)&bound, &len);
  *port = ntohs(bound.ss_family == AF_INET6
                    ? ((struct sockaddr_in6 *)&bound)->sin6_port
                    : ((struct sockaddr_in *)&bound)->sin_port);
  return KL_OK;
}
