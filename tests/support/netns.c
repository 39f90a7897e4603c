/* setns() and CLONE_NEWNET are Linux's, declared under _GNU_SOURCE. */
#define _GNU_SOURCE
#include "netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KL_T_RELAY_PAIRS 64
#define KL_T_RELAYS (2 * KL_T_NETNS_MAX * 8)

/* One direction of a relay: accepts on listen_ip:port (in netns, when
 * named) and pipes each connection to target_ip:port. One thread, poll. */
typedef struct kl_t_relay {
  pthread_t thread;
  char netns[32]; /* "" for the root namespace */
  char listen_ip[16], target_ip[16];
  int port;
  atomic_int state; /* 0 starting, 1 listening, -1 failed */
  atomic_int stop;
} kl_t_relay_t;

struct kl_t_netns {
  int hosts;
  char ip[32];
  char names[KL_T_NETNS_MAX][32];
  char roots[KL_T_NETNS_MAX][16]; /* root side of each veth */
  char gateways[KL_T_NETNS_MAX][16];
  char gateway_list[KL_T_NETNS_MAX * 16];
  int octet; /* 10.213.<octet + i>.0/30 */
  kl_t_relay_t *relays[KL_T_RELAYS];
  int nrelays;
};

/* ---- the relay -------------------------------------------------------- */

static int kl_t_sock_addr(const char *ip, int port, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, ip, &sa->sin_addr) == 1 ? 0 : -1;
}

static int kl_t_listen(const char *ip, int port) {
  struct sockaddr_in sa;
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (fd < 0 || kl_t_sock_addr(ip, port, &sa))
    return -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A connect that gives up after a second: a cut host must not stall the
 * relay's other connections. */
static int kl_t_connect(const char *ip, int port) {
  struct sockaddr_in sa;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || kl_t_sock_addr(ip, port, &sa))
    return -1;
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  if (rc && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    rc = poll(&p, 1, 1000) == 1 &&
                 getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                 err == 0
             ? 0
             : -1;
  }
  fcntl(fd, F_SETFL, flags);
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (rc) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Copies what @p from has to @p to; -1 when either side is done. */
static int kl_t_pipe(int from, int to) {
  char buf[65536];
  ssize_t n = read(from, buf, sizeof(buf));
  if (n <= 0)
    return -1;
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(to, buf + off, (size_t)(n - off));
    if (w <= 0)
      return -1;
    off += w;
  }
  return 0;
}

static void *kl_t_relay_main(void *opaque) {
  kl_t_relay_t *r = opaque;
  if (r->netns[0]) {
    char path[96];
    snprintf(path, sizeof(path), "/var/run/netns/%s", r->netns);
    int nsfd = open(path, O_RDONLY);
    int ok = nsfd >= 0 && setns(nsfd, CLONE_NEWNET) == 0;
    if (nsfd >= 0)
      close(nsfd);
    if (!ok) {
      atomic_store(&r->state, -1);
      return NULL;
    }
  }
  int lfd = kl_t_listen(r->listen_ip, r->port);
  atomic_store(&r->state, lfd >= 0 ? 1 : -1);
  if (lfd < 0)
    return NULL;
  struct pollfd fds[1 + 2 * KL_T_RELAY_PAIRS];
  int n = 0; /* pairs: fds[1 + 2k] <-> fds[2 + 2k] */
  fds[0] = (struct pollfd){lfd, POLLIN, 0};
  while (!atomic_load(&r->stop)) {
    if (poll(fds, (nfds_t)(1 + 2 * n), 100) <= 0)
      continue;
    for (int k = n - 1; k >= 0; k--) {
      struct pollfd *a = &fds[1 + 2 * k], *b = &fds[2 + 2 * k];
      int done = 0;
      if (a->revents)
        done = kl_t_pipe(a->fd, b->fd);
      if (!done && b->revents)
        done = kl_t_pipe(b->fd, a->fd);
      if (done) {
        close(a->fd);
        close(b->fd);
        n--;
        fds[1 + 2 * k] = fds[1 + 2 * n];
        fds[2 + 2 * k] = fds[2 + 2 * n];
      }
    }
    if (fds[0].revents & POLLIN) {
      int in = accept(lfd, NULL, NULL);
      int out = in >= 0 ? kl_t_connect(r->target_ip, r->port) : -1;
      if (out < 0 || n == KL_T_RELAY_PAIRS) {
        if (in >= 0)
          close(in);
        if (out >= 0)
          close(out);
      } else {
        fds[1 + 2 * n] = (struct pollfd){in, POLLIN, 0};
        fds[2 + 2 * n] = (struct pollfd){out, POLLIN, 0};
        n++;
      }
    }
  }
  for (int k = 0; k < 2 * n; k++)
    close(fds[1 + k].fd);
  close(lfd);
  return NULL;
}

static int kl_t_relay_start(kl_t_netns_t *ns, const char *netns,
                            const char *listen_ip, const char *target_ip,
                            int port) {
  if (ns->nrelays == KL_T_RELAYS)
    return -1;
  kl_t_relay_t *r = calloc(1, sizeof(*r));
  snprintf(r->netns, sizeof(r->netns), "%s", netns);
  snprintf(r->listen_ip, sizeof(r->listen_ip), "%s", listen_ip);
  snprintf(r->target_ip, sizeof(r->target_ip), "%s", target_ip);
  r->port = port;
  if (pthread_create(&r->thread, NULL, kl_t_relay_main, r)) {
    free(r);
    return -1;
  }
  ns->relays[ns->nrelays++] = r;
  while (atomic_load(&r->state) == 0)
    usleep(1000);
  return atomic_load(&r->state) == 1 ? 0 : -1;
}

/* ---- hosts ------------------------------------------------------------ */

static int kl_t_ip(const kl_t_netns_t *ns, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int kl_t_ip(const kl_t_netns_t *ns, const char *fmt, ...) {
  char args[256], cmd[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1", ns->ip, args);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *kl_t_find_ip(void) {
  static const char *const paths[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip",
                                      "/bin/ip"};
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
    if (access(paths[i], X_OK) == 0)
      return paths[i];
  return NULL;
}

static int kl_t_host_up(kl_t_netns_t *ns, int i) {
  const char *name = ns->names[i];
  int net = ns->octet + i;
  char peer[16];
  snprintf(ns->roots[i], sizeof(ns->roots[i]), "kl%dr%d",
           (int)getpid() % 100000, i);
  snprintf(peer, sizeof(peer), "kl%dp%d", (int)getpid() % 100000, i);
  snprintf(ns->gateways[i], sizeof(ns->gateways[i]), "10.213.%d.1", net);
  return kl_t_ip(ns, "netns add %s", name) ||
         kl_t_ip(ns, "link add %s type veth peer name %s", ns->roots[i],
                 peer) ||
         kl_t_ip(ns, "link set %s netns %s", peer, name) ||
         kl_t_ip(ns, "addr add 10.213.%d.1/30 dev %s", net, ns->roots[i]) ||
         kl_t_ip(ns, "link set %s up", ns->roots[i]) ||
         kl_t_ip(ns, "-n %s addr add 10.213.%d.2/30 dev %s", name, net, peer) ||
         kl_t_ip(ns, "-n %s link set %s up", name, peer) ||
         kl_t_ip(ns, "-n %s link set lo up", name);
}

kl_t_netns_t *kl_t_netns_new(int hosts, char *why, size_t why_size) {
  const char *ip = kl_t_find_ip();
  if (geteuid() != 0 || !ip || hosts < 1 || hosts > KL_T_NETNS_MAX) {
    snprintf(why, why_size, "%s",
             geteuid() != 0 ? "network namespaces need root"
             : !ip          ? "iproute2 (ip) is not installed"
                            : "kl_t_netns_new: 1..4 hosts");
    return NULL;
  }
  kl_t_netns_t *ns = calloc(1, sizeof(*ns));
  snprintf(ns->ip, sizeof(ns->ip), "%s", ip);
  ns->octet = (int)(getpid() % 60) * 4;
  for (int i = 0; i < hosts; i++) {
    snprintf(ns->names[i], sizeof(ns->names[i]), "kl%dh%d",
             (int)getpid() % 100000, i);
    ns->hosts = i + 1; /* so that destroy removes what was made */
    if (kl_t_host_up(ns, i)) {
      snprintf(why, why_size,
               "cannot make network namespace %s with a "
               "veth pair (ip netns add, ip link add ... type "
               "veth): not permitted on this machine?",
               ns->names[i]);
      kl_t_netns_destroy(ns);
      return NULL;
    }
    size_t len = strlen(ns->gateway_list);
    snprintf(ns->gateway_list + len, sizeof(ns->gateway_list) - len, "%s%s",
             i ? "," : "", ns->gateways[i]);
  }
  return ns;
}

const char *kl_t_netns_ip(const kl_t_netns_t *ns) {
  return ns->ip;
}

const char *kl_t_netns_name(const kl_t_netns_t *ns, int i) {
  return ns->names[i];
}

const char *kl_t_netns_gateway(const kl_t_netns_t *ns, int i) {
  return ns->gateways[i];
}

const char *kl_t_netns_gateways(const kl_t_netns_t *ns) {
  return ns->gateway_list;
}

int kl_t_netns_relay(kl_t_netns_t *ns, int port) {
  for (int i = 0; i < ns->hosts; i++)
    if (kl_t_relay_start(ns, "", ns->gateways[i], "127.0.0.1", port) ||
        kl_t_relay_start(ns, ns->names[i], "127.0.0.1", ns->gateways[i], port))
      return -1;
  return 0;
}

int kl_t_netns_cut(kl_t_netns_t *ns, int i, int down) {
  return kl_t_ip(ns, "link set %s %s", ns->roots[i], down ? "down" : "up");
}

void kl_t_netns_destroy(kl_t_netns_t *ns) {
  if (!ns)
    return;
  for (int k = 0; k < ns->nrelays; k++)
    atomic_store(&ns->relays[k]->stop, 1);
  for (int k = 0; k < ns->nrelays; k++) {
    pthread_join(ns->relays[k]->thread, NULL);
    free(ns->relays[k]);
  }
  /* Removing a namespace removes its end of the veth, and so the pair. */
  for (int i = 0; i < ns->hosts; i++) {
    kl_t_ip(ns, "link del %s", ns->roots[i]);
    kl_t_ip(ns, "netns del %s", ns->names[i]);
  }
  free(ns);
}
