/*
 * A throwaway PostgreSQL server for tests and benchmarks: initdb in a
 * fresh temp dir, listening on 127.0.0.1 only, on a free port, with its
 * unix socket in the temp dir; stopped and removed by kl_t_pg_stop().
 *
 * The binaries are found in $KEYLANE_PG_BIN, else the newest
 * /usr/lib/postgresql/N/bin (Debian's postgresql package), else PATH.
 * As root (CI), the server runs as the unprivileged user "postgres" (or
 * $KEYLANE_PG_USER), since initdb and postgres refuse to run as root.
 * The server is a child of the thread that starts it and gets SIGQUIT
 * when that thread dies: start and stop it from the same thread.
 *
 * No cmocka here: the benchmark links this file too.
 */
#ifndef KEYLANE_TESTS_SUPPORT_PG_H
#define KEYLANE_TESTS_SUPPORT_PG_H

#include <stddef.h>
#include <sys/types.h>

typedef struct kl_t_pg {
  char dir[64];  /* the temp dir: data/, the socket, the log */
  char bin[256]; /* where initdb and postgres are */
  char user[64]; /* who the server runs as; "" for the caller */
  int port;
  int running;
  pid_t pid;        /* the postmaster, a child of the starting thread */
  char listen[256]; /* listen_addresses */
  int durable;      /* as given to kl_t_pg_start(), for kl_t_pg_restart() */
} kl_t_pg_t;

/* kl_t_pg_start()'s @p durable: fsync and synchronous_commit on
 * (benchmarks), or commits that survive an immediate shutdown of the
 * server (synchronous_commit on; without fsync, which only a crash of the
 * machine needs), for tests that restart it. 0: neither, fastest. */
#define KL_T_PG_DURABLE 1
#define KL_T_PG_RESTARTABLE 2

/* SQL that undoes schema 12 of a store (for a test that rebuilds an older
 * schema): the ids stored key first again, as sids, and no CHECK. The
 * caller deletes the version rows. */
#define KL_T_PG_UNDO_12                                                        \
  "ALTER TABLE keylane_ids DROP CONSTRAINT keylane_ids_stored_id_first;"       \
  "UPDATE keylane_ids SET id = '\\x00'::bytea || int2send((length(id) - "      \
  "  position('\\x00'::bytea IN id))::int2) || substr(id, "                    \
  "  position('\\x00'::bytea IN id) + 1) || substr(id, 1, "                    \
  "  position('\\x00'::bytea IN id) - 1) WHERE position('\\x00'::bytea IN "    \
  "  id) > 0;"

/**
 * Initializes and starts a server. @p durable: 0, KL_T_PG_DURABLE or
 * KL_T_PG_RESTARTABLE (below); tests use 0 for speed unless they restart it.
 * @returns the server, or NULL when PostgreSQL is not installed or did not
 *          start; @p why (size @p why_size) then says which, and the log,
 *          and kl_t_missing("postgresql", why) records it (support/skips.h).
 */
kl_t_pg_t *kl_t_pg_start(int durable, char *why, size_t why_size);

/**
 * The same, also listening on @p also_listen (comma-separated addresses,
 * e.g. the gateways of support/netns.h) and trusting clients of
 * @p trust_net (CIDR, e.g. "10.213.0.0/16"); either may be NULL.
 */
kl_t_pg_t *kl_t_pg_start_on(int durable, const char *also_listen,
                            const char *trust_net, char *why, size_t why_size);

/**
 * Restarts the server as `pg_ctl restart -m immediate` does: SIGQUIT to
 * the postmaster (every backend dies at once, its clients' connections
 * break), @p down_ms with no server, then the same data directory on the
 * same port, after crash recovery. From the thread that started it (see
 * above). Start the server KL_T_PG_RESTARTABLE, or commits acknowledged
 * just before may be lost.
 * @returns 0, or -1 when it did not come back (printed to stderr).
 */
int kl_t_pg_restart(kl_t_pg_t *pg, int down_ms);

/** kl_t_pg_restart() in two halves, for a caller that goes on working
 *  while the server is down: the immediate shutdown, then the start
 *  (which waits until the server accepts connections). */
void kl_t_pg_halt(kl_t_pg_t *pg);
int kl_t_pg_resume(kl_t_pg_t *pg);

/** Stops the server (immediate shutdown), removes its dir, frees @p pg. */
void kl_t_pg_stop(kl_t_pg_t *pg);

/**
 * Creates database @p name and writes its URI into @p uri.
 * @returns 0, or -1 (printed to stderr).
 */
int kl_t_pg_createdb(kl_t_pg_t *pg, const char *name, char *uri,
                     size_t uri_size);

/**
 * Turns TLS on (ssl=on, reloaded): a CA made with openssl for this server,
 * its certificate for 127.0.0.1 and localhost, and another CA that signed
 * nothing. Plain connections are still accepted.
 * @param ca        receives the CA's path (for sslrootcert);
 * @param other_ca  receives the other CA's path (a client trusting it must
 *                  fail verify-full). Both @p size bytes.
 * @returns 0, or -1 (printed to stderr).
 */
int kl_t_pg_tls(kl_t_pg_t *pg, char *ca, char *other_ca, size_t size);

/** The URI of the maintenance database "postgres", for admin statements. */
void kl_t_pg_admin_uri(const kl_t_pg_t *pg, char *uri, size_t uri_size);

#endif
