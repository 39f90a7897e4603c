#include "pg.h"

#include "support/skips.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <glob.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Finds initdb: $KEYLANE_PG_BIN, the newest Debian install, then PATH
 * (bin stays "" and the commands are looked up by the shell). */
static int kl_t_pg_find_bin(char *bin, size_t size) {
  const char *env = getenv("KEYLANE_PG_BIN");
  if (env && *env) {
    snprintf(bin, size, "%s/", env);
    return 0;
  }
  glob_t g;
  int found = glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) == 0 &&
              g.gl_pathc > 0;
  if (found) {
    /* glob sorts: the last is the newest version of one digit count; prefer
     * the longest name first (16 after 9). */
    const char *best = g.gl_pathv[0];
    for (size_t i = 1; i < g.gl_pathc; i++)
      if (strlen(g.gl_pathv[i]) >= strlen(best))
        best = g.gl_pathv[i];
    snprintf(bin, size, "%.*s", (int)(strlen(best) - strlen("initdb")), best);
  }
  globfree(&g);
  if (found)
    return 0;
  bin[0] = '\0';
  return system("command -v initdb >/dev/null 2>&1") == 0 ? 0 : -1;
}

/* A port nobody listens on now. Another process may take it before the
 * server binds it; kl_t_pg_start() then tries another. */
static int kl_t_pg_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
      getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

/* Runs a shell command as the server's user. */
static int kl_t_pg_sh(const kl_t_pg_t *pg, const char *cmd) {
  char line[2048];
  if (pg->user[0])
    snprintf(line, sizeof(line), "%s -u %s -- %s",
             access("/usr/sbin/runuser", X_OK) == 0 ? "/usr/sbin/runuser"
                                                    : "runuser",
             pg->user, cmd);
  else
    snprintf(line, sizeof(line), "%s", cmd);
  return system(line);
}

/* The last lines of a log, for the reason a start failed. */
static void kl_t_pg_tail(const char *path, char *why, size_t size) {
  size_t used = strlen(why);
  FILE *f = fopen(path, "r");
  if (!f || used + 2 >= size) {
    if (f)
      fclose(f);
    return;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, n > 800 ? n - 800 : 0, SEEK_SET);
  size_t got = fread(why + used, 1, size - used - 1, f);
  why[used + got] = '\0';
  fclose(f);
}

/* As root, the server runs as an unprivileged user owning the dir. */
static int kl_t_pg_owner(kl_t_pg_t *pg) {
  if (geteuid() != 0)
    return 0;
  const char *user = getenv("KEYLANE_PG_USER");
  snprintf(pg->user, sizeof(pg->user), "%s", user && *user ? user : "postgres");
  struct passwd *pw = getpwnam(pg->user);
  if (!pw)
    return -1;
  return chown(pg->dir, pw->pw_uid, pw->pw_gid);
}

static int kl_t_pg_init(kl_t_pg_t *pg, char *why, size_t size) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "'%sinitdb' -D '%s/data' -A trust -U keylane -E UTF8 --no-sync "
           ">'%s/initdb.log' 2>&1",
           pg->bin, pg->dir, pg->dir);
  if (kl_t_pg_sh(pg, cmd) == 0)
    return 0;
  snprintf(why, size, "initdb failed:\n");
  char log[128];
  snprintf(log, sizeof(log), "%s/initdb.log", pg->dir);
  kl_t_pg_tail(log, why, size);
  return -1;
}

/* The server process, in the foreground: as root, the child becomes the
 * server's user itself; either way it asks for SIGQUIT (immediate
 * shutdown) when the thread that started it dies, so a test killed by its
 * timeout or a crash does not leave a server behind. */
static void kl_t_pg_exec(const kl_t_pg_t *pg, int durable) {
  char log[128], data[96], port[16], listen[300], sock[96];
  snprintf(log, sizeof(log), "%s/log", pg->dir);
  snprintf(data, sizeof(data), "%s/data", pg->dir);
  snprintf(port, sizeof(port), "%d", pg->port);
  snprintf(listen, sizeof(listen), "listen_addresses=%s", pg->listen);
  snprintf(sock, sizeof(sock), "unix_socket_directories=%s", pg->dir);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  if (pg->user[0]) {
    struct passwd *pw = getpwnam(pg->user);
    if (!pw || setgid(pw->pw_gid) || initgroups(pg->user, pw->pw_gid) ||
        setuid(pw->pw_uid))
      _exit(126);
  }
  prctl(PR_SET_PDEATHSIG, SIGQUIT); /* after setuid, which clears it */
  char bin[300];
  snprintf(bin, sizeof(bin), "%spostgres", pg->bin);
  const char *fast[] = {"-c", "fsync=off",
                        "-c", "full_page_writes=off",
                        "-c", "synchronous_commit=off"};
  /* KL_T_PG_RESTARTABLE: all but the last (see pg.h). */
  size_t nfast = durable == KL_T_PG_DURABLE ? 0
                 : durable == KL_T_PG_RESTARTABLE
                     ? sizeof(fast) / sizeof(fast[0]) - 2
                     : sizeof(fast) / sizeof(fast[0]);
  const char *argv[24] = {bin,
                          "-D",
                          data,
                          "-p",
                          port,
                          "-c",
                          listen,
                          "-c",
                          sock,
                          "-c",
                          "max_connections=60"};
  int argc = 11;
  for (size_t i = 0; i < nfast; i++)
    argv[argc++] = fast[i];
  argv[argc] = NULL;
  execvp(bin, (char *const *)argv);
  _exit(127);
}

/* Starts the server and waits until it accepts connections (60 s). */
static int kl_t_pg_run(kl_t_pg_t *pg, int durable) {
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0)
    kl_t_pg_exec(pg, durable);
  char conninfo[128];
  snprintf(conninfo, sizeof(conninfo),
           "host=127.0.0.1 port=%d dbname=postgres user=keylane "
           "connect_timeout=2",
           pg->port);
  for (int i = 0; i < 600; i++) {
    if (PQping(conninfo) == PQPING_OK) {
      pg->pid = pid;
      return 0;
    }
    if (waitpid(pid, NULL, WNOHANG) == pid)
      return -1; /* it exited: the log says why (a port taken, ...) */
    usleep(100 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

kl_t_pg_t *kl_t_pg_start(int durable, char *why, size_t why_size) {
  return kl_t_pg_start_on(durable, NULL, NULL, why, why_size);
}

/* Lets clients of @p net in without a password, as initdb -A trust does
 * for loopback. */
static int kl_t_pg_trust(const kl_t_pg_t *pg, const char *net) {
  char path[128];
  snprintf(path, sizeof(path), "%s/data/pg_hba.conf", pg->dir);
  FILE *f = fopen(path, "a");
  if (!f)
    return -1;
  fprintf(f, "host all all %s trust\n", net);
  return fclose(f);
}

static kl_t_pg_t *kl_t_pg_try(int durable, const char *also_listen,
                              const char *trust_net, char *why,
                              size_t why_size) {
  kl_t_pg_t *pg = calloc(1, sizeof(*pg));
  pg->durable = durable;
  snprintf(pg->listen, sizeof(pg->listen), "127.0.0.1%s%s",
           also_listen ? "," : "", also_listen ? also_listen : "");
  snprintf(why, why_size, "%s", "");
  if (kl_t_pg_find_bin(pg->bin, sizeof(pg->bin))) {
    snprintf(why, why_size,
             "PostgreSQL is not installed: run "
             "deploy/install-deps.sh --test (apt-get install "
             "postgresql), or set KEYLANE_PG_BIN");
    free(pg);
    return NULL;
  }
  snprintf(pg->dir, sizeof(pg->dir), "/tmp/keylane-pg-XXXXXX");
  if (!mkdtemp(pg->dir) || kl_t_pg_owner(pg)) {
    snprintf(why, why_size, "cannot prepare %s for user %s", pg->dir, pg->user);
    kl_t_pg_stop(pg);
    return NULL;
  }
  if (kl_t_pg_init(pg, why, why_size) ||
      (trust_net && kl_t_pg_trust(pg, trust_net))) {
    kl_t_pg_stop(pg);
    return NULL;
  }
  for (int attempt = 0; attempt < 3 && !pg->running; attempt++) {
    pg->port = kl_t_pg_free_port();
    pg->running = pg->port > 0 && kl_t_pg_run(pg, durable) == 0;
  }
  if (!pg->running) {
    char log[128];
    snprintf(why, why_size, "the server did not start:\n");
    snprintf(log, sizeof(log), "%s/log", pg->dir);
    kl_t_pg_tail(log, why, why_size);
    kl_t_pg_stop(pg);
    return NULL;
  }
  return pg;
}

/* A server that does not start is missing, for KEYLANE_TEST_REQUIRE
 * (support/skips.h): make test then fails the tests that need it. */
kl_t_pg_t *kl_t_pg_start_on(int durable, const char *also_listen,
                            const char *trust_net, char *why, size_t why_size) {
  kl_t_pg_t *pg = kl_t_pg_try(durable, also_listen, trust_net, why, why_size);
  if (!pg)
    kl_t_missing("postgresql", why);
  return pg;
}

void kl_t_pg_halt(kl_t_pg_t *pg) {
  if (pg->running && kill(pg->pid, SIGQUIT) == 0)
    waitpid(pg->pid, NULL, 0);
  pg->running = 0;
}

int kl_t_pg_restart(kl_t_pg_t *pg, int down_ms) {
  kl_t_pg_halt(pg);
  usleep((useconds_t)down_ms * 1000);
  return kl_t_pg_resume(pg);
}

int kl_t_pg_resume(kl_t_pg_t *pg) {
  pg->running = kl_t_pg_run(pg, pg->durable) == 0;
  if (!pg->running)
    fprintf(stderr, "pg: the server in %s did not come back on port %d\n",
            pg->dir, pg->port);
  return pg->running ? 0 : -1;
}

void kl_t_pg_stop(kl_t_pg_t *pg) {
  if (!pg)
    return;
  char cmd[512];
  if (pg->running && kill(pg->pid, SIGQUIT) == 0 &&
      waitpid(pg->pid, NULL, 0) != pg->pid)
    fprintf(stderr, "pg: could not stop the server in %s\n", pg->dir);
  if (pg->dir[0] && strcmp(pg->dir, "/tmp/keylane-pg-XXXXXX") != 0) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", pg->dir);
    if (system(cmd) != 0)
      fprintf(stderr, "pg: could not remove %s\n", pg->dir);
  }
  free(pg);
}

int kl_t_pg_tls(kl_t_pg_t *pg, char *ca, char *other_ca, size_t size) {
  char cmd[2048], admin[128];
  const char *t = pg->dir;
  snprintf(cmd, sizeof(cmd),
           "set -e; cd '%s'; umask 077; "
           "for c in ca other-ca; do openssl req -x509 -newkey rsa:2048 "
           "-nodes -days 2 -subj \"/CN=keylane test pg $c\" -keyout $c.key "
           "-out $c.pem 2>/dev/null; done; "
           "openssl req -new -newkey rsa:2048 -nodes -keyout server.key "
           "-subj /CN=localhost -out server.csr 2>/dev/null; "
           "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' "
           ">server.ext; "
           "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
           "-CAcreateserial -days 2 -extfile server.ext -out server.pem "
           "2>/dev/null; chmod 644 ca.pem other-ca.pem; "
           "%s%s%s",
           t, pg->user[0] ? "chown " : "", pg->user[0] ? pg->user : "",
           pg->user[0] ? " server.key server.pem" : "true");
  if (system(cmd) != 0) {
    fprintf(stderr, "pg: could not make the TLS files in %s\n", t);
    return -1;
  }
  kl_t_pg_admin_uri(pg, admin, sizeof(admin));
  PGconn *conn = PQconnectdb(admin);
  char sql[3][512];
  snprintf(sql[0], sizeof(sql[0]),
           "ALTER SYSTEM SET ssl_cert_file = '%s/server.pem'", t);
  snprintf(sql[1], sizeof(sql[1]),
           "ALTER SYSTEM SET ssl_key_file = '%s/server.key'", t);
  snprintf(sql[2], sizeof(sql[2]), "ALTER SYSTEM SET ssl = on");
  int ok = PQstatus(conn) == CONNECTION_OK;
  for (int i = 0; ok && i < 4; i++) {
    PGresult *res = PQexec(conn, i < 3 ? sql[i] : "SELECT pg_reload_conf()");
    ok = PQresultStatus(res) == (i < 3 ? PGRES_COMMAND_OK : PGRES_TUPLES_OK);
    if (!ok)
      fprintf(stderr, "pg: turning TLS on: %s", PQerrorMessage(conn));
    PQclear(res);
  }
  PQfinish(conn);
  snprintf(ca, size, "%s/ca.pem", t);
  snprintf(other_ca, size, "%s/other-ca.pem", t);
  /* the reload is asynchronous: wait until a TLS session is accepted */
  char probe[512];
  snprintf(probe, sizeof(probe),
           "host=127.0.0.1 port=%d dbname=postgres user=keylane "
           "sslmode=verify-full sslrootcert=%s connect_timeout=2",
           pg->port, ca);
  for (int i = 0; ok && i < 50; i++) {
    if (PQping(probe) == PQPING_OK)
      return 0;
    usleep(100 * 1000);
  }
  fprintf(stderr, "pg: the server in %s took no TLS session\n", t);
  return -1;
}

void kl_t_pg_admin_uri(const kl_t_pg_t *pg, char *uri, size_t uri_size) {
  snprintf(uri, uri_size, "postgresql://keylane@127.0.0.1:%d/postgres",
           pg->port);
}

int kl_t_pg_createdb(kl_t_pg_t *pg, const char *name, char *uri,
                     size_t uri_size) {
  char admin[128], sql[160];
  kl_t_pg_admin_uri(pg, admin, sizeof(admin));
  PGconn *conn = PQconnectdb(admin);
  snprintf(sql, sizeof(sql), "CREATE DATABASE \"%s\"", name);
  PGresult *res = PQstatus(conn) == CONNECTION_OK ? PQexec(conn, sql) : NULL;
  int ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
  if (!ok)
    fprintf(stderr, "pg: CREATE DATABASE %s: %s", name, PQerrorMessage(conn));
  PQclear(res);
  PQfinish(conn);
  snprintf(uri, uri_size, "postgresql://keylane@127.0.0.1:%d/%s", pg->port,
           name);
  return ok ? 0 : -1;
}
