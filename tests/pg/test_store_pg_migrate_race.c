/*
 * The PostgreSQL store's schema under concurrency, on a real, throwaway
 * server: `keylane store migrate` processes and store openers (what every
 * starting worker does) released at one moment on an empty database all
 * succeed, the schema is made once, by one of them, and none trips over
 * another's tables ("already exists"). An opener that finds the schema
 * lock held waits for it, then reads the version again; past its bound it
 * says who holds the lock. One server for the suite.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "common/internal.h"
#include "keylane/store.h"
#include "support/pg_db.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "support/support.h"
#include "store/pg.h"

/* Per round: this many of each, all released by one gate. */
#define T_MIGRATORS 5
#define T_OPENERS 5
#define T_RACERS (T_MIGRATORS + T_OPENERS)
/* Rounds, each on a database of its own, all within T_RACE_MS. */
#define T_ROUNDS 8
#define T_RACE_MS 40000

static int64_t t_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The file at @p path from byte @p from on, NUL-terminated (the caller
 * frees it); "" when it cannot be read. */
static char *t_slurp(const char *path, long from) {
  FILE *f = fopen(path, "r");
  long size = 0;
  if (f && fseek(f, 0, SEEK_END) == 0)
    size = ftell(f);
  size = size > from ? size - from : 0;
  char *text = calloc(1, (size_t)size + 1);
  assert_non_null(text);
  if (f && size > 0 && fseek(f, from, SEEK_SET) == 0)
    text[fread(text, 1, (size_t)size, f)] = '\0';
  if (f)
    fclose(f);
  return text;
}

static long t_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

/* ---- the race ---------------------------------------------------------- */

static char t_logs[64]; /* the racers' logs; removed by t_logs_teardown */

typedef struct t_racer {
  pid_t pid;
  int status;
  int done;
  char log[128];
} t_racer_t;

/* A worker's start, as far as the store goes: kl_store_open() of @p uri
 * with the defaults a worker has (store.create=yes). */
static void t_open_and_exit(const char *uri) {
  kl_store_t *store = NULL;
  kl_err_t err = kl_store_open(uri, NULL, &store);
  if (err)
    fprintf(stderr, "open: %s: %s\n", kl_err_name(err), kl_err_detail());
  else
    printf("open: ok\n");
  fflush(NULL);
  kl_store_destroy(store);
  _exit(err ? 1 : 0);
}

/* Forks racer @p i: it waits until the gate's write end is closed, then
 * runs `keylane store migrate` (i < T_MIGRATORS) or, @p opener_delay_ms
 * later, opens the store; its output in r->log. Killed when the test
 * process dies. */
static void t_racer_start(t_racer_t *r, int i, const int gate[2],
                          const char *uri, const char *dir,
                          int opener_delay_ms) {
  snprintf(r->log, sizeof(r->log), "%s/%s-%d.log", dir,
           i < T_MIGRATORS ? "migrate" : "open", i);
  r->done = 0;
  pid_t parent = getpid();
  r->pid = fork();
  assert_true(r->pid >= 0);
  if (r->pid)
    return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(127);
  close(gate[1]);
  int fd = open(r->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    _exit(126);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  char byte;
  while (read(gate[0], &byte, 1) < 0 && errno == EINTR)
    ;
  close(gate[0]);
  if (i >= T_MIGRATORS) {
    kl_t_sleep_ms(opener_delay_ms);
    t_open_and_exit(uri);
  }
  const char *argv[] = {kl_t_bin(), "store", "migrate", "--store", uri, NULL};
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

/* Waits for every racer until @p deadline_ms (t_ms()); kills the ones
 * still running then. @returns how many were killed. */
static int t_racers_wait(t_racer_t *racers, int64_t deadline_ms) {
  int left = T_RACERS;
  while (left > 0 && t_ms() < deadline_ms) {
    for (int i = 0; i < T_RACERS; i++)
      if (!racers[i].done &&
          waitpid(racers[i].pid, &racers[i].status, WNOHANG) == racers[i].pid)
        racers[i].done = 1, left--;
    if (left > 0)
      kl_t_sleep_ms(5);
  }
  for (int i = 0; i < T_RACERS; i++)
    if (!racers[i].done) {
      kill(racers[i].pid, SIGKILL);
      waitpid(racers[i].pid, &racers[i].status, 0);
    }
  return left;
}

/* One round on a fresh database: asserts every racer succeeded and
 * nothing said "already exists"; @returns how many migrators applied the
 * schema themselves (the rest found it made). */
static int t_race_round(kl_t_pg_t *pg, int round, const char *dir,
                        int64_t deadline_ms) {
  char name[32], uri[256], server_log[128];
  snprintf(name, sizeof(name), "race%d", round);
  assert_int_equal(kl_t_pg_createdb(pg, name, uri, sizeof(uri)), 0);
  snprintf(server_log, sizeof(server_log), "%s/log", pg->dir);
  long log_from = t_size(server_log);

  int gate[2];
  assert_int_equal(pipe(gate), 0);
  t_racer_t racers[T_RACERS];
  /* A migrator starts with an exec, a few ms an opener does not spend:
   * openers start 0, 5, 10 or 15 ms after the gate opens, so that across
   * rounds either kind gets there first. */
  for (int i = 0; i < T_RACERS; i++)
    t_racer_start(&racers[i], i, gate, uri, dir, round % 4 * 5);
  close(gate[0]);
  close(gate[1]); /* all at once */
  int killed = t_racers_wait(racers, deadline_ms);

  int applied = 0;
  char want[64];
  snprintf(want, sizeof(want), "schema version 0 -> %d\n",
           KL__PG_SCHEMA_VERSION);
  for (int i = 0; i < T_RACERS; i++) {
    char *out = t_slurp(racers[i].log, 0);
    int ok = WIFEXITED(racers[i].status) && WEXITSTATUS(racers[i].status) == 0;
    if (!ok || strstr(out, "already exists"))
      fail_msg("round %d: %s (status %d, %d killed at the deadline): %s", round,
               racers[i].log, racers[i].status, killed, out);
    free(out);
  }
  /* Under the lock a migrator finds either nothing or all: one that
   * applied part of the schema raced another. */
  for (int i = 0; i < T_MIGRATORS; i++) {
    char *out = t_slurp(racers[i].log, 0);
    int all = strcmp(out, want) == 0;
    if (!all && !strstr(out, "nothing to do"))
      fail_msg("round %d: %s: %s", round, racers[i].log, out);
    applied += all;
    free(out);
  }
  char *server = t_slurp(server_log, log_from);
  if (strstr(server, "already exists"))
    fail_msg("round %d: the server logged: %s", round, server);
  free(server);

  PGconn *admin = PQconnectdb(uri);
  assert_int_equal(PQstatus(admin), CONNECTION_OK);
  /* Each version once (its primary key), from 1 to the latest. */
  assert_int_equal(kl_t_sql(admin, "SELECT count(*) FROM "
                                   "keylane_schema_version"),
                   KL__PG_SCHEMA_VERSION);
  assert_int_equal(kl_t_sql(admin, "SELECT min(version) FROM "
                                   "keylane_schema_version"),
                   1);
  assert_int_equal(kl_t_sql(admin, "SELECT max(version) FROM "
                                   "keylane_schema_version"),
                   KL__PG_SCHEMA_VERSION);
  PQfinish(admin);
  return applied;
}

/* Five `keylane store migrate` and five store opens released together on
 * an empty database, round after round: all succeed, the latest version is
 * recorded once, and at most one migrator applied anything (an opener
 * applied it otherwise). */
static void test_migrators_and_openers_race_on_an_empty_database(void **state) {
  (void)state;
  kl_t_pg_t *pg = kl_t_pg_need();
  char dir[64];
  kl_t_tmpdir(dir);
  int64_t deadline = t_ms() + T_RACE_MS;
  int by_migrate = 0;
  for (int round = 0; round < T_ROUNDS; round++) {
    int applied = t_race_round(pg, round, dir, deadline);
    assert_in_range(applied, 0, 1);
    by_migrate += applied;
  }
  fprintf(stderr,
          "%d rounds: the schema made by `store migrate` in %d, by "
          "an opener in the others\n",
          T_ROUNDS, by_migrate);
}

static int t_logs_teardown(void **state) {
  (void)state;
  if (t_logs[0])
    kl_t_rmrf(t_logs);
  t_logs[0] = '\0';
  return 0;
}

/* ---- the lock --------------------------------------------------------- */

typedef kl_t_pg_db_t t_state_t;

/* kl_store_open() on a thread of its own, so the test can look at it
 * while it waits. */
typedef struct t_opener {
  pthread_t thread;
  const char *uri;
  kl_err_t err;
  char detail[1024];
  atomic_int done;
} t_opener_t;

static void *t_opener_main(void *opaque) {
  t_opener_t *o = opaque;
  kl_store_t *store = NULL;
  o->err = kl_store_open(o->uri, NULL, &store);
  snprintf(o->detail, sizeof(o->detail), "%s", kl_err_detail());
  kl_store_destroy(store);
  atomic_store(&o->done, 1);
  return NULL;
}

static void t_opener_start(t_opener_t *o, const char *uri) {
  o->uri = uri;
  atomic_store(&o->done, 0);
  assert_int_equal(pthread_create(&o->thread, NULL, t_opener_main, o), 0);
}

/* Joins @p o; @returns its kl_store_open()'s result. */
static kl_err_t t_opener_join(t_opener_t *o) {
  pthread_join(o->thread, NULL);
  return o->err;
}

/* Asserts @p o is still waiting, @p ms later. */
static void t_opener_waits(t_opener_t *o, int ms) {
  kl_t_sleep_ms(ms);
  if (atomic_load(&o->done))
    fail_msg("the open did not wait for the schema lock: %s",
             o->err ? o->detail : "KL_OK");
}

static void t_lock(PGconn *admin) {
  kl_t_sql(admin, "SELECT pg_advisory_lock(" KL__PG_SCHEMA_LOCK ")");
}

static void t_unlock(PGconn *admin) {
  kl_t_sql(admin, "SELECT pg_advisory_unlock(" KL__PG_SCHEMA_LOCK ")");
}

static long long t_versions(PGconn *admin) {
  return kl_t_sql(admin, "SELECT count(*) FROM keylane_schema_version");
}

/* An opener of an empty database that finds the schema being created
 * waits, then reads the version again and creates nothing: here the lock's
 * holder creates it (taking the lock once more) and keeps the lock a while
 * after. */
static void test_open_waits_for_a_creation_then_finds_it_done(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  t_lock(st->admin);
  t_opener_t o;
  t_opener_start(&o, st->fx.where);
  t_opener_waits(&o, 300);
  int from, to;
  assert_int_equal(kl__pg_migrate(st->admin, &from, &to), KL_OK);
  assert_int_equal(from, 0);
  assert_int_equal(to, KL__PG_SCHEMA_VERSION);
  t_opener_waits(&o, 300); /* the lock is still held */
  t_unlock(st->admin);
  if (t_opener_join(&o))
    fail_msg("the open after the wait: %s", o.detail);
  assert_int_equal(t_versions(st->admin), KL__PG_SCHEMA_VERSION);
}

/* An older schema: an opener waits for a migration in progress and opens
 * what it made; without one, it refuses, naming `keylane store migrate`.
 * (Version L's tables stay: only its record goes, which is all an opener
 * reads.) */
static void test_open_older_schema_decides_under_the_lock(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  char older[128], latest[128];
  snprintf(older, sizeof(older),
           "DELETE FROM keylane_schema_version WHERE version = %d",
           KL__PG_SCHEMA_VERSION);
  snprintf(latest, sizeof(latest),
           "INSERT INTO keylane_schema_version (version) VALUES (%d)",
           KL__PG_SCHEMA_VERSION);
  kl_t_sql(st->admin, older);

  t_lock(st->admin);
  t_opener_t o;
  t_opener_start(&o, st->fx.where);
  t_opener_waits(&o, 300);
  t_unlock(st->admin); /* a migrator that gave up */
  assert_int_equal(t_opener_join(&o), KL_ESTORE_VERSION);
  assert_non_null(strstr(o.detail, "keylane store migrate"));

  t_lock(st->admin);
  t_opener_start(&o, st->fx.where);
  t_opener_waits(&o, 300);
  kl_t_sql(st->admin, latest); /* a migrator that finished */
  t_unlock(st->admin);
  if (t_opener_join(&o))
    fail_msg("the open after the migration: %s", o.detail);
}

/* A newer schema is refused at once, lock or not, and never migrated. */
static void test_open_newer_schema_refused_without_waiting(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to), KL_OK);
  kl_t_sql(st->admin,
           "INSERT INTO keylane_schema_version (version) VALUES (99)");
  t_lock(st->admin);
  int64_t start = t_ms();
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, NULL, &store),
                   KL_ESTORE_VERSION);
  assert_true(t_ms() - start < 2000); /* the wait's bound is 60 s */
  assert_non_null(strstr(kl_err_detail(), "newer than this build"));
  t_unlock(st->admin);
  assert_int_equal(kl_t_sql(st->admin, "SELECT max(version) FROM "
                                       "keylane_schema_version"),
                   99);
}

/* Past its bound, an opener (and `keylane store migrate`) gives up with
 * KL_ESTORE_BUSY, naming the lock and the session that holds it, having
 * created nothing. */
static void test_wait_gives_up_naming_the_holder(void **state) {
  kl_t_pg_need();
  t_state_t *st = *state;
  kl_t_sql(st->admin, "SET application_name = 't-holder'");
  t_lock(st->admin);
  kl__pg_set_schema_wait_ms(500);
  char pid[32];
  snprintf(pid, sizeof(pid), "pid %d (", PQbackendPID(st->admin));
  int64_t start = t_ms();
  kl_store_t *store = NULL;
  assert_int_equal(kl_store_open(st->fx.where, NULL, &store), KL_ESTORE_BUSY);
  int64_t waited = t_ms() - start;
  assert_in_range(waited, 450, 10000);
  const char *said = kl_err_detail();
  fprintf(stderr, "the open said: %s\n", said);
  assert_non_null(strstr(said, "advisory lock " KL__PG_SCHEMA_LOCK));
  assert_non_null(strstr(said, pid));
  assert_non_null(strstr(said, "application t-holder"));
  assert_non_null(strstr(said, "pg_terminate_backend"));
  int from, to;
  assert_int_equal(kl__store_pg_migrate(st->fx.where, &from, &to),
                   KL_ESTORE_BUSY);
  assert_non_null(strstr(kl_err_detail(), pid));
  assert_int_equal(kl_t_sql(st->admin, "SELECT count(*) FROM pg_tables WHERE "
                                       "tablename LIKE 'keylane%'"),
                   0);
  t_unlock(st->admin);
  kl_store_destroy(kl_t_store_open(st->fx.where, NULL));
  assert_int_equal(t_versions(st->admin), KL__PG_SCHEMA_VERSION);
}

static int t_db_teardown(void **state) {
  kl__pg_set_schema_wait_ms(0);
  return kl_t_pg_db_teardown(state);
}

#define T(name)                                                                \
  cmocka_unit_test_setup_teardown(name, kl_t_pg_db_setup, t_db_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(
          test_migrators_and_openers_race_on_an_empty_database,
          t_logs_teardown),
      T(test_open_waits_for_a_creation_then_finds_it_done),
      T(test_open_older_schema_decides_under_the_lock),
      T(test_open_newer_schema_refused_without_waiting),
      T(test_wait_gives_up_naming_the_holder),
  };
  return cmocka_run_group_tests(tests, kl_t_pg_group_setup,
                                kl_t_pg_group_teardown);
}
