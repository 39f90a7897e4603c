/*
 * The fault suite: a fleet of `keylane worker` processes (ledger handler,
 * one shared LMDB store) while a publisher re-publishes a share of its
 * events with the same idempotency key, and everything production does to
 * a fleet happens to it: workers SIGKILLed and restarted, workers SIGSTOPped
 * past their session timeout (some frozen inside the window between their
 * handlers and their commit) and SIGCONTed, the leader broker of a
 * partition killed and restarted, the store directory read-only for a
 * while, and the store's file system full for a while. A share of the
 * events wait (issue 36): 10 % are credits delayed by 0.2 to 3 s, and 5 %
 * scheduled transfers, whose settle is a follow-up delayed as long, so
 * that timers come due, are fired and are applied across the kills, the
 * stops and the broker's restart; twice a second the test looks that no
 * delayed event was applied before its time (kl__ledger_gen_check_due()).
 * Then the fleet drains and the store must hold every acknowledged event
 * exactly once, each delayed one too, and nothing held.
 *
 * On KEYLANE_TEST_BOOTSTRAP's cluster (the fault suite: a real 3-node
 * Kafka, RF 3, min.insync.replicas 2, whose brokers it kills through
 * deploy/kafka/kafka.sh in KEYLANE_TEST_KAFKA_DIR), or, shorter and
 * without the broker kill, on the embedded cluster.
 *
 * With KEYLANE_TEST_STORE=postgresql (test_fault_pg, on the embedded
 * cluster) the fleet's store is a throwaway PostgreSQL server (support/
 * pg.h) instead of LMDB, and instead of the store's read-only and full
 * windows the server is restarted as `pg_ctl restart -m immediate` does,
 * twice, while the workers apply: they must reconnect by themselves and
 * lose nothing.
 *
 * Read-only: tests run as root, and root ignores file modes, so when run
 * as root the workers run as "nobody" and the store belongs to it. A
 * running worker keeps its open files writable, so the read-only window
 * shows as workers (restarted by the kill cadence) that cannot open the
 * store. Disk full: the store lives on a tmpfs of its own, mounted in a private
 * mount namespace (gone with the test), filled to ENOSPC for a while
 * while the test holds a read snapshot open, taken before the fill (so
 * LMDB cannot reuse pages freed after it), so running workers' commits
 * fail and are retried, each logged as a full file system whether LMDB
 * met ENOSPC or a write cut short (its EIO). Each of the two is skipped,
 * and says why, when this machine does not allow it.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/internal.h"
#include "support/cluster.h"
#include "support/pg.h"
#include "support/spawn.h"
#include "support/support.h"
#include "store/lmdb.h"

#define KL_F_MAX_WORKERS 8
#define KL_F_NS 1000000000LL
#define KL_F_MS 1000000LL
/* What a worker's connection logs when PostgreSQL shuts down under it. */
#define KL_F_PG_LOST "terminating connection due to immediate shutdown"
/* What a worker logs when a commit or an acquire meets a full disk. */
#define KL_F_FULL "file system holding the store is full"

/* What one run does; the real cluster's plan meets the figures. */
typedef struct kl_plan {
  const char *name;
  int partitions, workers, keys;
  int session_ms, max_poll_ms;
  int chaos_s, rate;              /* unique events per second */
  int kill_every_ms;              /* one SIGKILL of a random worker */
  int stop_every_ms, stop_ms;     /* one SIGSTOP, held stop_ms */
  int broker_at_s, broker_down_s; /* broker_at_s < 0: no broker kill */
  int ro_at_s, ro_s, full_at_s, full_s;
  int min_kills, min_stops;
  int start_hold_ms; /* > 0: no worker starts while one is frozen, nor for
                      * start_hold_ms after its SIGCONT (see the embedded
                      * plan) */
  int pg_restart_at_s[2], pg_down_ms; /* PostgreSQL: restarts (0: none) */
  int spare_s; /* a zombie is not SIGKILLed for this long after its
                * SIGCONT, to meet its fence (0: 10) */
} kl_plan_t;

static const kl_plan_t kl_plan_kafka = {.name = "Kafka 3 nodes",
                                        .partitions = 12,
                                        .workers = 4,
                                        .keys = 400,
                                        .session_ms = 3000,
                                        .max_poll_ms = 6000,
                                        .chaos_s = 150,
                                        .rate = 200,
                                        .kill_every_ms = 1150,
                                        .stop_every_ms = 5500,
                                        .stop_ms = 4500,
                                        .broker_at_s = 40,
                                        .broker_down_s = 12,
                                        .ro_at_s = 90,
                                        .ro_s = 15,
                                        .full_at_s = 8,
                                        .full_s = 10,
                                        .min_kills = 100,
                                        .min_stops = 20};
/* The embedded cluster's group coordinator needs longer sessions to settle
 * while members come and go (see keylane/embedded.h).
 *
 * start_hold_ms: librdkafka 2.0.2's mock names a new member by the address
 * of its struct ("%p", rd_kafka_mock_cgrp_member_add()), and the struct of
 * the member it freed last is usually the next one allocated: a worker
 * started (JoinGroup with no member id) after a frozen worker's session ran
 * out gets the frozen worker's member id. When that one is SIGCONTed in a
 * join state where librdkafka does not check its own session (waiting for a
 * JoinGroup/SyncGroup response or for the assign/unassign call) it goes on
 * with the old id: its Heartbeat, SyncGroup or JoinGroup lands on the new
 * member, it rejoins with that id while the mock holds the new member's
 * JoinGroup, and the mock aborts the process hosting it (the test) on
 * rdkafka_mock_cgrp.c:567 "Assertion `!member->resp' failed". So no worker
 * starts while one is frozen or held in its pause hook (it polls no
 * rebalance there, so its consumer waits in such a join state), nor until
 * the resumed or released one has spoken to the coordinator (a heartbeat
 * interval, 1 s, with room for a loaded machine);
 * kills keep their cadence (one due when no worker can be picked waits
 * for the hold to end) and their victims start once it ends.
 * Real brokers hand out unique member ids: the Kafka plan has no hold. */
static const kl_plan_t kl_plan_embedded = {.name = "embedded",
                                           .partitions = 8,
                                           .workers = 3,
                                           .keys = 200,
                                           .session_ms = 6000,
                                           .max_poll_ms = 7000,
                                           .chaos_s = 40,
                                           .rate = 150,
                                           .kill_every_ms = 6000,
                                           .stop_every_ms = 15000,
                                           .stop_ms = 7000,
                                           .broker_at_s = -1,
                                           .ro_at_s = 26,
                                           .ro_s = 8,
                                           .full_at_s = 6,
                                           .full_s = 6,
                                           .min_kills = 5,
                                           .min_stops = 2,
                                           .start_hold_ms = 3000};

typedef struct kl_slot {
  pid_t pid;          /* 0: dead, restarted after a short delay */
  int64_t dead_ns;    /* when it died */
  int64_t cont_ns;    /* stopped: SIGCONT at this time; 0 when running */
  int64_t armed_ns;   /* SIGUSR1 sent, SIGSTOP once it pauses; 0 otherwise */
  int pauses_seen;    /* "pausing" lines in its log so far */
  int64_t spare_ns;   /* not SIGKILLed before: let a zombie meet its fence */
  int64_t resumed_ns; /* its last SIGCONT; 0 when never stopped or dead */
  /* A batch held by the pause hook until SIGUSR2, sent once a newer owner
   * committed its partition past it, or KL_F_HOLD_MAX_S after the hold:
   * the store read-only or full can keep every new owner out for half a
   * minute, and a zombie released before one took over learns it lost
   * the partition instead of meeting the fence. */
  int held;
  int64_t held_ns;
  int held_p;
  uint64_t held_epoch;
  int64_t held_wm;
} kl_slot_t;

/* A read snapshot the test holds open, as a long scan or a stopped
 * process holds one in production: while it is open LMDB cannot reuse the
 * pages commits free after it, so once the pages freed before it are
 * used, every commit needs new ones, from the full file system. */
typedef struct kl_pin {
  kl__lmdb_t *lmdb;
  MDB_txn *snap;
} kl_pin_t;

/* What commits can still take without the file system: free pages LMDB
 * may reuse (freed before the pin; the highest of them) and pages the
 * data file holds past its last used one (from a write cut short). When
 * the highest reusable page is the last used one, a commit's new pages
 * follow it in one write, which the full file system cuts short: LMDB
 * then says EIO, not ENOSPC. */
typedef struct kl_room {
  uint64_t reusable, highest, slack, last_pgno;
} kl_room_t;

typedef struct kl_fault {
  const kl_plan_t *plan;
  kl_t_cluster_t *cluster;
  const char *topic, *group, *kafka_dir;
  char dir[64], store_dir[96];
  int unpriv; /* workers run as uid/gid */
  uid_t uid;
  gid_t gid;
  int tmpfs;
  char no_ro[512], no_full[160], no_broker[160];
  kl_slot_t slot[KL_F_MAX_WORKERS];
  uint64_t rnd;
  /* what happened */
  int kills, restarts, stops, stops_paused, bad_exits, ro_refused;
  double chaos_secs; /* how long the faults ran (kl_f_chaos_on()) */
  int broker_state, broker_node, broker_rc;
  pid_t broker_op;
  kl_pin_t pin;
  uint64_t ballast; /* kl_f_ballast()'s values in meta, while full */
  int ro_on, full_on, full_errors;
  int64_t full_checked;
  double ro_secs, full_secs, broker_secs;
  int64_t ro_start, full_start, broker_down_ns;

  /* PostgreSQL (KEYLANE_TEST_STORE=postgresql); store_dir is its URI */
  kl_t_pg_t *pg;      /* the server, or NULL */
  int pg_restarts;    /* done so far */
  int pg_lost;        /* worker connections the restarts broke */
  int64_t pg_down_ns; /* shut down at; 0: running */
  int64_t pg_up_ns;   /* back at, the last time */
  int64_t pg_checked_ns, pg_watermarks; /* kl_f_applying()'s */
} kl_fault_t;

static uint64_t kl_f_rand(kl_fault_t *f) {
  uint64_t x = f->rnd;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return f->rnd = x;
}

static int64_t kl_f_now(void) {
  return kl__mono_ns();
}

/* ---- worker processes -------------------------------------------------- */

static void kl_f_log_path(const kl_fault_t *f, int i, char *path, size_t n) {
  snprintf(path, n, "%s/worker-%d.log", f->dir, i);
}

static pid_t kl_f_spawn(kl_fault_t *f, int i) {
  char log[128], sess[16], parts[16], poll[64];
  kl_f_log_path(f, i, log, sizeof(log));
  snprintf(sess, sizeof(sess), "%d", f->plan->session_ms);
  snprintf(parts, sizeof(parts), "%d", f->plan->partitions);
  snprintf(poll, sizeof(poll), "kafka.max.poll.interval.ms=%d",
           f->plan->max_poll_ms);
  pid_t pid = fork();
  if (pid != 0)
    return pid;
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  if (f->unpriv && (setgroups(0, NULL) || setgid(f->gid) || setuid(f->uid)))
    _exit(126);
  /* After the uid change, which clears it: a worker dies with the test. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  execl(kl_t_bin(), "keylane", "worker", "-b", kl_t_bootstrap(f->cluster), "-t",
        f->topic, "-g", f->group, "--store", f->store_dir, "--handler",
        "ledger", "--session-timeout-ms", sess, "--partitions", parts,
        "--pause-on-sigusr1", "-X", poll, (char *)NULL);
  _exit(127);
}

static int kl_f_count(const kl_fault_t *f, int i, const char *needle) {
  char path[128], line[2048];
  kl_f_log_path(f, i, path, sizeof(path));
  FILE *fp = fopen(path, "r");
  int n = 0;
  while (fp && fgets(line, sizeof(line), fp))
    n += strstr(line, needle) != NULL;
  if (fp)
    fclose(fp);
  return n;
}

static int kl_f_count_all(const kl_fault_t *f, const char *needle) {
  int n = 0;
  for (int i = 0; i < f->plan->workers; i++)
    n += kl_f_count(f, i, needle);
  return n;
}

/* Reaps exited workers; a worker that exits by itself (not our SIGKILL)
 * while the store is read-only is one that could not open it. */
static void kl_f_reap(kl_fault_t *f, int64_t now) {
  for (int i = 0; i < f->plan->workers; i++) {
    kl_slot_t *s = &f->slot[i];
    int status;
    if (s->pid > 0 && waitpid(s->pid, &status, WNOHANG) == s->pid) {
      int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!clean && f->ro_on)
        f->ro_refused++;
      else if (!clean)
        f->bad_exits++;
      s->pid = 0, s->dead_ns = now, s->cont_ns = 0, s->armed_ns = 0;
      s->spare_ns = 0, s->resumed_ns = 0, s->held = 0;
    }
  }
}

/* 1 while PostgreSQL is down, and for a session and the start hold after
 * it is back: a worker whose rebalance callback waited out the outage
 * (its acquire retries) may have outlived its session in a join state
 * where it does not check it, as a frozen one does (see the embedded
 * plan). */
static int kl_f_pg_held(const kl_fault_t *f, int64_t now) {
  const kl_plan_t *p = f->plan;
  return f->pg_down_ns ||
         (f->pg_up_ns &&
          now - f->pg_up_ns < (p->start_hold_ms + p->session_ms) * KL_F_MS);
}

/* 1 while the plan holds worker starts: a worker is frozen, or was
 * SIGCONTed less than start_hold_ms ago (see the embedded plan). */
static int kl_f_starts_held(const kl_fault_t *f, int64_t now) {
  if (f->plan->start_hold_ms <= 0)
    return 0;
  if (kl_f_pg_held(f, now))
    return 1;
  for (int i = 0; i < f->plan->workers; i++) {
    const kl_slot_t *s = &f->slot[i];
    if (s->pid > 0 && (s->cont_ns || s->held ||
                       (s->resumed_ns && now - s->resumed_ns <
                                             f->plan->start_hold_ms * KL_F_MS)))
      return 1;
  }
  return 0;
}

static void kl_f_restart(kl_fault_t *f, int64_t now) {
  if (kl_f_starts_held(f, now))
    return;
  for (int i = 0; i < f->plan->workers; i++) {
    kl_slot_t *s = &f->slot[i];
    if (s->pid == 0 && now - s->dead_ns >= 300 * KL_F_MS) {
      s->pid = kl_f_spawn(f, i);
      s->pauses_seen = kl_f_count(f, i, "pausing partition=");
      f->restarts += s->dead_ns > 0;
    }
  }
}

/* A random running, not stopped, worker; -1 when there is none. */
static int kl_f_pick(kl_fault_t *f) {
  int n = f->plan->workers, start = (int)(kl_f_rand(f) % (uint64_t)n);
  for (int k = 0; k < n; k++) {
    int i = (start + k) % n;
    if (f->slot[i].pid > 0 && !f->slot[i].cont_ns && !f->slot[i].armed_ns &&
        !f->slot[i].held && kl_f_now() >= f->slot[i].spare_ns)
      return i;
  }
  return -1;
}

/* 1 when a kill now could leave a held zombie without a worker to take
 * its partition over and commit (its fence): where starts are held (the
 * embedded plan) none starts until the zombie is released, so one worker
 * besides the victim must stay running. */
static int kl_f_kill_strands(const kl_fault_t *f) {
  int zombie = 0, running = 0;
  for (int i = 0; i < f->plan->workers; i++) {
    const kl_slot_t *s = &f->slot[i];
    if (s->pid > 0 && (s->held || s->armed_ns))
      zombie = 1;
    else if (s->pid > 0 && !s->cont_ns)
      running++;
  }
  return f->plan->start_hold_ms > 0 && zombie && running < 2;
}

/* 1 when it killed one; 0 when no worker could be picked. */
static int kl_f_kill(kl_fault_t *f, int64_t now) {
  int i = kl_f_pick(f);
  if (i < 0 || kl_f_kill_strands(f))
    return 0;
  kill(f->slot[i].pid, SIGKILL);
  waitpid(f->slot[i].pid, NULL, 0);
  f->slot[i].pid = 0, f->slot[i].dead_ns = now;
  f->kills++;
  return 1;
}

static void kl_f_resume(kl_fault_t *f, int i, int64_t now) {
  kill(f->slot[i].pid, SIGCONT);
  f->slot[i].cont_ns = f->slot[i].armed_ns = 0;
  f->slot[i].resumed_ns = now;
}

static void kl_f_freeze(kl_fault_t *f, int i, int64_t now) {
  kill(f->slot[i].pid, SIGSTOP);
  f->slot[i].armed_ns = 0;
  f->slot[i].cont_ns = now + f->plan->stop_ms * KL_F_MS;
  f->stops++;
}

/* 1 when every worker runs: none dead, none frozen. */
static int kl_f_fleet_whole(const kl_fault_t *f) {
  for (int i = 0; i < f->plan->workers; i++)
    if (f->slot[i].pid <= 0 || f->slot[i].cont_ns)
      return 0;
  return 1;
}

/* The longest a zombie's batch is held: the worker's pause hook lets go
 * by itself after 60 s (cli/worker.c), a margin before that. */
#define KL_F_HOLD_MAX_S 50

/* Every other stop first arms the pause hook, so that the worker freezes
 * between its handlers and its commit: the zombie that must be fenced. It
 * arms one only while the rest of the fleet runs, so that another worker
 * is there to take the zombie's partition over (where starts are held, a
 * dead one would not start until the zombie is released). */
static void kl_f_stop(kl_fault_t *f, int64_t now) {
  int i = kl_f_pick(f);
  if (i < 0)
    return;
  if (f->stops % 2 == 0 && kl_f_fleet_whole(f)) {
    kill(f->slot[i].pid, SIGUSR1);
    f->slot[i].armed_ns = now;
  } else {
    kl_f_freeze(f, i, now);
  }
}

static void kl_f_tick_stops(kl_fault_t *f, kl_store_t *store, int64_t now) {
  for (int i = 0; i < f->plan->workers; i++) {
    kl_slot_t *s = &f->slot[i];
    kl_partition_state_t st;
    if (s->pid > 0 && s->armed_ns) {
      int seen = kl_f_count(f, i, "pausing partition=");
      if (seen > s->pauses_seen &&
          kl_t_find_pause(f->dir, i, &s->held_p, &s->held_epoch) &&
          kl_store_partition(store, f->topic, s->held_p, &st) == KL_OK) {
        s->pauses_seen = seen;
        s->held = 1, s->held_wm = st.watermark, s->held_ns = now;
        f->stops_paused++;
        kl_f_freeze(f, i, now);
        s->spare_ns =
            s->cont_ns + (f->plan->spare_s ? f->plan->spare_s : 10) * KL_F_NS;
      } else if (now - s->armed_ns > 2 * KL_F_NS) {
        kl_f_freeze(f, i, now); /* no batch came: a plain freeze */
      }
    }
    if (s->pid > 0 && s->cont_ns && now >= s->cont_ns)
      kl_f_resume(f, i, now);
    if (s->pid > 0 && s->held && !s->cont_ns &&
        ((kl_store_partition(store, f->topic, s->held_p, &st) == KL_OK &&
          st.epoch > s->held_epoch && st.watermark > s->held_wm) ||
         now - s->held_ns > KL_F_HOLD_MAX_S * KL_F_NS)) {
      kill(s->pid, SIGUSR2);
      s->held = 0;
      s->resumed_ns = now; /* it polls its consumer again from now */
      /* spared a little longer: the commit it now makes meets the fence */
      int64_t meet = now + 5 * KL_F_NS;
      s->spare_ns = s->spare_ns > meet ? s->spare_ns : meet;
    }
  }
}

/* ---- the store's file system ------------------------------------------- */

static void kl_f_chmod_store(kl_fault_t *f, int writable) {
  static const char *const files[] = {"data.mdb", "lock.mdb"};
  for (size_t k = 0; k < 2; k++) {
    char path[160];
    snprintf(path, sizeof(path), "%s/%s", f->store_dir, files[k]);
    chmod(path, writable ? 0644 : 0444);
  }
  chmod(f->store_dir, writable ? 0755 : 0555);
}

static void kl_f_fill(kl_fault_t *f) {
  char path[160], block[1 << 16];
  snprintf(path, sizeof(path), "%s/filler", f->store_dir);
  memset(block, 0xa5, sizeof(block));
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  while (fd >= 0 && write(fd, block, sizeof(block)) > 0)
    ;
  if (fd >= 0)
    close(fd);
}

/* Holds a read snapshot of @p store until kl_f_unfill(). */
static void kl_f_pin(kl_fault_t *f, kl_store_t *store) {
  f->pin.lmdb = (kl__lmdb_t *)store;
  kl_err_t err = kl__lmdb_read_begin(f->pin.lmdb, &f->pin.snap);
  if (err)
    fail_msg("fault: cannot pin a read snapshot: %s", kl_err_detail());
}

/* Adds one record of LMDB's free database (dbi 0): the txn that freed
 * the pages, then their list (MDB_IDs, the first their count). */
static void kl_f_room_add(const MDB_val *key, const MDB_val *val, size_t pinned,
                          kl_room_t *room) {
  size_t txnid, ids[2];
  memcpy(&txnid, key->mv_data, sizeof(txnid));
  if (txnid >= pinned)
    return; /* freed after the pin: LMDB keeps them */
  memcpy(ids, val->mv_data, sizeof(ids[0]));
  room->reusable += ids[0];
  for (size_t i = 1; i <= ids[0]; i++) {
    memcpy(&ids[1], (const char *)val->mv_data + i * sizeof(ids[0]),
           sizeof(ids[1]));
    room->highest = ids[1] > room->highest ? ids[1] : room->highest;
  }
}

/* The pages freed before the pin, as seen from a snapshot taken now. */
static void kl_f_reusable(kl__lmdb_t *lmdb, size_t pinned, kl_room_t *room) {
  MDB_txn *snap;
  MDB_cursor *cur;
  MDB_val key, val;
  if (kl__lmdb_read_begin(lmdb, &snap) != KL_OK)
    return;
  int rc = mdb_cursor_open(snap, 0, &cur);
  for (rc = rc ? rc : mdb_cursor_get(cur, &key, &val, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT))
    kl_f_room_add(&key, &val, pinned, room);
  if (rc == MDB_NOTFOUND)
    mdb_cursor_close(cur);
  kl__lmdb_read_end(lmdb, snap);
}

static void kl_f_room(const kl_fault_t *f, kl_room_t *room) {
  MDB_envinfo info;
  MDB_stat st;
  struct stat sb;
  char path[160];
  snprintf(path, sizeof(path), "%s/data.mdb", f->store_dir);
  mdb_env_info(f->pin.lmdb->env, &info);
  mdb_env_stat(f->pin.lmdb->env, &st);
  uint64_t pages =
      stat(path, &sb) == 0 ? (uint64_t)sb.st_size / st.ms_psize : 0;
  memset(room, 0, sizeof(*room));
  room->last_pgno = info.me_last_pgno;
  room->slack =
      pages > info.me_last_pgno + 1 ? pages - info.me_last_pgno - 1 : 0;
  kl_f_reusable(f->pin.lmdb, mdb_txn_id(f->pin.snap), room);
}

static void kl_f_print_room(const kl_fault_t *f, const char *when) {
  kl_room_t room;
  kl_f_room(f, &room);
  fprintf(stderr,
          "fault: %s: %" PRIu64 " reusable free pages (highest %" PRIu64
          "), %" PRIu64
          " pages of the data file past its last used page %" PRIu64 "%s\n",
          when, room.reusable, room.highest, room.slack, room.last_pgno,
          room.reusable && room.highest == room.last_pgno
              ? ": a commit needing more now is cut short (EIO)"
              : "");
}

/* Values of a page each in meta, one per free page LMDB may reuse (and a
 * few more), put (or with @p del removed) in one write transaction. */
#define KL_F_BALLAST "fault.ballast."
typedef struct kl_ballast {
  uint64_t first, values;
  int del;
} kl_ballast_t;

static int kl_f_ballast_fn(kl__lmdb_t *lmdb, MDB_txn *mtxn, void *ctx,
                           kl_err_t *stop) {
  kl_ballast_t *b = ctx;
  char key[40], val[3000]; /* past half a page: an overflow page each */
  (void)stop;
  memset(val, 0x5a, sizeof(val));
  for (uint64_t i = b->first; i < b->first + b->values; i++) {
    MDB_val k = {(size_t)snprintf(key, sizeof(key), KL_F_BALLAST "%" PRIu64, i),
                 key},
            v = {sizeof(val), val};
    int rc = b->del ? mdb_del(mtxn, lmdb->meta, &k, NULL)
                    : mdb_put(mtxn, lmdb->meta, &k, &v, 0);
    if (rc && !(b->del && rc == MDB_NOTFOUND))
      return rc;
  }
  return 0;
}

/* Takes the free pages a commit could reuse, while the file system still
 * has room: the workers' next commits then need pages the full file
 * system refuses. Left to the workers, the pages lasted the whole window
 * once a commit wrote a few pages (ids in time order, LMDB format 6), and
 * no commit failed. */
static void kl_f_ballast(kl_fault_t *f, int del) {
  kl_ballast_t b = {0, f->ballast, 1};
  if (del) {
    if (f->ballast &&
        kl__lmdb_write(f->pin.lmdb, "fault ballast", kl_f_ballast_fn, &b))
      fail_msg("fault: cannot remove the ballast: %s", kl_err_detail());
    f->ballast = 0;
    return;
  }
  /* A SIGKILLed worker's reader slot keeps the pages freed after its
   * snapshot from reuse until a check clears it, which a later commit's
   * may: clear them first, and take again what is still reusable. */
  int dead = 0;
  mdb_reader_check(f->pin.lmdb->env, &dead);
  kl_room_t room;
  kl_f_room(f, &room);
  for (int i = 0; i < 4 && room.reusable; i++) {
    b = (kl_ballast_t){f->ballast, room.reusable + 8, 0};
    if (kl__lmdb_write(f->pin.lmdb, "fault ballast", kl_f_ballast_fn, &b))
      fail_msg("fault: cannot put the ballast: %s", kl_err_detail());
    f->ballast += b.values;
    kl_f_room(f, &room);
  }
}

static void kl_f_unfill(kl_fault_t *f) {
  char path[160];
  snprintf(path, sizeof(path), "%s/filler", f->store_dir);
  unlink(path);
  if (f->ballast && f->pin.lmdb)
    kl_f_ballast(f, 1);
  if (f->pin.snap) {
    kl__lmdb_read_end(f->pin.lmdb, f->pin.snap);
    f->pin.snap = NULL;
  }
}

/* Can a worker running as uid/gid run the binary and write the store? */
static int kl_f_probe_user(kl_fault_t *f) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) || setgid(f->gid) || setuid(f->uid))
      _exit(1);
    _exit(access(kl_t_bin(), X_OK) || access(f->store_dir, W_OK) ? 2 : 0);
  }
  int status = -1;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

/* The store directory: on a tmpfs of its own when mounts are allowed,
 * and owned by "nobody" when we are root. */
static void kl_f_store_setup(kl_fault_t *f) {
  snprintf(f->store_dir, sizeof(f->store_dir), "%s/store", f->dir);
  mkdir(f->store_dir, 0755);
  if (unshare(CLONE_NEWNS) == 0 &&
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
      mount("tmpfs", f->store_dir, "tmpfs", 0, "size=256m,mode=0755") == 0)
    f->tmpfs = 1;
  else
    snprintf(f->no_full, sizeof(f->no_full),
             "skipped: cannot mount a tmpfs here (%s)", strerror(errno));
  if (geteuid() != 0)
    return;
  struct passwd *pw = getpwnam("nobody");
  if (!pw) {
    snprintf(f->no_ro, sizeof(f->no_ro),
             "skipped: running as root and "
             "there is no user nobody to run the workers as");
    return;
  }
  f->uid = pw->pw_uid, f->gid = pw->pw_gid;
  if (chown(f->store_dir, f->uid, f->gid) == 0 && kl_f_probe_user(f) == 0)
    f->unpriv = 1;
  else
    snprintf(f->no_ro, sizeof(f->no_ro),
             "skipped: as root, and nobody "
             "cannot run %s or write %s",
             kl_t_bin(), f->store_dir);
}

/* The files the test's own kl_store_open() made belong to the workers. */
static void kl_f_store_own(kl_fault_t *f) {
  static const char *const files[] = {"data.mdb", "lock.mdb"};
  for (size_t k = 0; f->unpriv && k < 2; k++) {
    char path[160];
    snprintf(path, sizeof(path), "%s/%s", f->store_dir, files[k]);
    if (chown(path, f->uid, f->gid) != 0)
      fprintf(stderr, "fault: chown %s: %s\n", path, strerror(errno));
  }
}

/* ---- the broker -------------------------------------------------------- */

static pid_t kl_f_kafka_sh(kl_fault_t *f, const char *verb, int node) {
  char script[512], n[16];
  const char *src = getenv("KEYLANE_SOURCE_DIR");
  snprintf(script, sizeof(script), "%s/deploy/kafka/kafka.sh", src ? src : ".");
  snprintf(n, sizeof(n), "%d", node);
  pid_t pid = fork();
  if (pid == 0) {
    execlp("bash", "bash", script, verb, n, "--dir", f->kafka_dir,
           (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* kill the leader of partition 0, keep it down, restart it; one step per
 * call, never blocking. */
static void kl_f_tick_broker(kl_fault_t *f, int64_t now, int64_t t0) {
  const kl_plan_t *p = f->plan;
  int status;
  switch (f->broker_state) {
  case 0:
    if (f->no_broker[0] || now - t0 < p->broker_at_s * KL_F_NS)
      return;
    f->broker_node = kl_t_leader(f->cluster, f->topic, 0);
    if (f->broker_node < 1) {
      snprintf(f->no_broker, sizeof(f->no_broker),
               "failed: no leader of "
               "partition 0 in the metadata");
      return;
    }
    fprintf(stderr, "fault: killing broker %d, the leader of partition 0\n",
            f->broker_node);
    f->broker_op = kl_f_kafka_sh(f, "kill-node", f->broker_node);
    f->broker_state = 1;
    return;
  case 1:
    if (waitpid(f->broker_op, &status, WNOHANG) != f->broker_op)
      return;
    f->broker_down_ns = now;
    f->broker_state = 2;
    return;
  case 2:
    if (now - f->broker_down_ns < p->broker_down_s * KL_F_NS)
      return;
    f->broker_op = kl_f_kafka_sh(f, "restart-node", f->broker_node);
    f->broker_state = 3;
    return;
  case 3:
    if (waitpid(f->broker_op, &status, WNOHANG) != f->broker_op)
      return;
    f->broker_rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    f->broker_secs = (double)(now - f->broker_down_ns) / KL_F_NS;
    fprintf(stderr, "fault: broker %d back after %.1f s (rc %d)\n",
            f->broker_node, f->broker_secs, f->broker_rc);
    f->broker_state = 4;
    return;
  default:
    return;
  }
}

/* ---- the PostgreSQL server --------------------------------------------- */

/* The embedded plan with the fleet on PostgreSQL, whose server restarts
 * twice instead of the store's read-only and full windows (LMDB's), each
 * once the fleet applies after its time (kl_f_tick_pg()); 30 s longer, as
 * the embedded group spends much of a run rebalancing, and with kills
 * farther apart, so that a frozen owner's partition finds a new owner
 * before the run ends (the fence the run checks). */
static const kl_plan_t *kl_f_plan_pg(void) {
  static kl_plan_t plan;
  plan = kl_plan_embedded;
  plan.name = "embedded, PostgreSQL store";
  plan.chaos_s = 70;
  plan.kill_every_ms = 9000; /* the restarts make the group rebalance too */
  plan.spare_s = 20;         /* so its partition may take that long to move */
  plan.pg_restart_at_s[0] = 12;
  plan.pg_restart_at_s[1] = 32;
  plan.pg_down_ms = 1500;
  return &plan;
}

/* The store on a throwaway PostgreSQL (kept across an immediate restart:
 * KL_T_PG_RESTARTABLE); the test skips when there is none. */
static void kl_f_pg_setup(kl_fault_t *f) {
  char why[2048];
  if (!(f->pg = kl_t_pg_start(KL_T_PG_RESTARTABLE, why, sizeof(why)))) {
    fprintf(stderr, "skipped: %s\n", why);
    skip();
  }
  assert_int_equal(
      kl_t_pg_createdb(f->pg, "fault", f->store_dir, sizeof(f->store_dir)), 0);
  static const char none[] = "none on PostgreSQL: its server restarts instead";
  snprintf(f->no_ro, sizeof(f->no_ro), "%s", none);
  snprintf(f->no_full, sizeof(f->no_full), "%s", none);
}

static int kl_f_sum_watermarks(void *opaque, const char *topic,
                               int32_t partition,
                               const kl_partition_state_t *state) {
  (void)topic, (void)partition;
  *(int64_t *)opaque += state->watermark;
  return 0;
}

/* 1 when the fleet applied something since the last call (every 500 ms at
 * most): a restart then meets workers inside their batches, not a group
 * that owns nothing while it rebalances. */
static int kl_f_applying(kl_fault_t *f, kl_store_t *store, int64_t now) {
  if (now - f->pg_checked_ns < 500 * KL_F_MS)
    return 0;
  int64_t sum = 0;
  f->pg_checked_ns = now;
  if (kl_store_foreach_partition(store, kl_f_sum_watermarks, &sum) != KL_OK)
    return 0;
  int moved = f->pg_watermarks && sum > f->pg_watermarks;
  f->pg_watermarks = sum;
  return moved;
}

/* 1 while a resumed zombie may still be waiting to meet its fence (held
 * until SIGUSR2, then its spare time): a restart would break its batch's
 * connection first. */
static int kl_f_zombie(const kl_fault_t *f, int64_t now) {
  for (int i = 0; i < f->plan->workers; i++)
    if (f->slot[i].pid > 0 && (f->slot[i].held || now < f->slot[i].spare_ns))
      return 1;
  return 0;
}

/* Restarts the server at the plan's times, once the fleet is applying
 * (10 s later at the latest) and no worker is frozen (nor just resumed:
 * kl_f_starts_held()), as `pg_ctl restart -m immediate` does: the
 * publisher and the faults go on while it is down, and only its start
 * (crash recovery) blocks the loop. A frozen zombie's connection would
 * break under it, and its batch fail for that instead of meeting the
 * fence the run checks. */
static void kl_f_tick_pg(kl_fault_t *f, kl_store_t *store, int64_t now,
                         double t) {
  const kl_plan_t *p = f->plan;
  int i = f->pg_restarts;
  if (f->pg_down_ns && now - f->pg_down_ns >= p->pg_down_ms * KL_F_MS) {
    if (kl_t_pg_resume(f->pg) != 0)
      fail_msg("fault: the PostgreSQL server did not come back");
    f->pg_down_ns = 0;
    f->pg_up_ns = kl_f_now();
    f->pg_restarts++;
  } else if (f->pg && !f->pg_down_ns && i < 2 && p->pg_restart_at_s[i] &&
             t >= p->pg_restart_at_s[i] && !kl_f_starts_held(f, now) &&
             !kl_f_zombie(f, now) &&
             (kl_f_applying(f, store, now) ||
              t >= p->pg_restart_at_s[i] + 10)) {
    fprintf(stderr, "fault: PostgreSQL shut down (immediate), back in %d ms\n",
            p->pg_down_ms);
    kl_t_pg_halt(f->pg);
    f->pg_down_ns = now;
  }
}

/* ---- the windows ------------------------------------------------------- */

static void kl_f_tick_windows(kl_fault_t *f, kl_store_t *store, int64_t now,
                              int64_t t0) {
  const kl_plan_t *p = f->plan;
  double t = (double)(now - t0) / KL_F_NS;
  kl_f_tick_pg(f, store, now, t);
  if (f->unpriv && !f->ro_on && !f->ro_start && t >= p->ro_at_s) {
    fprintf(stderr, "fault: store read-only for %d to %d s\n", p->ro_s,
            3 * p->ro_s);
    kl_f_chmod_store(f, 0);
    f->ro_on = 1, f->ro_start = now;
  } else if (f->ro_on && t >= p->ro_at_s + p->ro_s &&
             (f->ro_refused > 0 || t >= p->ro_at_s + 3 * p->ro_s)) {
    /* Held until a worker start was refused, within bounds: on the
     * embedded plan a freeze that began just before the window holds
     * every start (start_hold_ms) up to its end. */
    kl_f_chmod_store(f, 1);
    f->ro_on = 0, f->ro_secs = (double)(now - f->ro_start) / KL_F_NS;
  }
  if (f->tmpfs && !f->full_on && !f->full_start && t >= p->full_at_s) {
    fprintf(stderr, "fault: store's file system full, for %d to %d s\n",
            p->full_s, 3 * p->full_s);
    kl_f_pin(f, store); /* first: no page freed after the fill is reused */
    kl_f_ballast(f, 0);
    kl_f_fill(f);
    kl_f_print_room(f, "pinned, then filled");
    f->full_on = 1, f->full_start = now;
  } else if (f->full_on && now - f->full_checked > KL_F_NS) {
    f->full_checked = now;
    f->full_errors = kl_f_count_all(f, KL_F_FULL);
  }
  /* Held until a commit has failed on it, within bounds: LMDB first
   * reuses the pages freed before the pin. */
  if (f->full_on && t >= p->full_at_s + p->full_s &&
      (f->full_errors > 0 || t >= p->full_at_s + 3 * p->full_s)) {
    if (f->full_errors == 0)
      kl_f_print_room(f, "no full-disk error logged");
    kl_f_unfill(f);
    f->full_on = 0, f->full_secs = (double)(now - f->full_start) / KL_F_NS;
  }
}

/* ---- the run ----------------------------------------------------------- */

typedef struct kl_pub {
  kl__ledger_gen_t *gen;
  kl_producer_t *producer;
  uint64_t sent, errors;
  int64_t next_due_ns; /* kl_f_check_due()'s next look */
} kl_pub_t;

/* Twice a second: no delayed event applied before its time. A look the
 * store refuses (PostgreSQL restarting) is not counted. */
static void kl_f_check_due(kl_fault_t *f, kl_pub_t *pub, kl_store_t *store,
                           int64_t now) {
  if (now < pub->next_due_ns)
    return;
  pub->next_due_ns = now + 500 * KL_F_MS;
  kl__ledger_gen_check_due(pub->gen, store, f->topic);
}

/* Every how many events one is a transfer between two accounts, whose
 * credit goes through the outbox (the bank test). */
#define KL_F_TRANSFER_EVERY 5

static int kl_f_is_transfer(uint64_t n) {
  return n % KL_F_TRANSFER_EVERY == KL_F_TRANSFER_EVERY - 1;
}

/* Event @p n of the run: of every 20, 4 transfers (one of them
 * scheduled) and 2 delayed credits, each waiting 0.2 to 3 s. */
static kl_err_t kl_f_publish_one(kl_fault_t *f, kl_pub_t *pub, uint64_t n) {
  int64_t delay_ms = 200 + (int64_t)(n * 7919 % 2801);
  if (n % 20 == 19)
    return kl__ledger_gen_scheduled(pub->gen, pub->producer, f->topic,
                                    delay_ms);
  if (n % 20 == 2 || n % 20 == 12)
    return kl__ledger_gen_delayed(pub->gen, pub->producer, f->topic, delay_ms);
  return kl_f_is_transfer(n)
             ? kl__ledger_gen_transfer(pub->gen, pub->producer, f->topic)
             : kl__ledger_gen_publish(pub->gen, pub->producer, f->topic);
}

/* Publishes what is due at the plan's rate (kl_f_publish_one()); one
 * re-publish of an earlier event, same idempotency key, after every 16th
 * (6.25 %). */
static void kl_f_publish(kl_fault_t *f, kl_pub_t *pub, int64_t now,
                         int64_t t0) {
  uint64_t due = (uint64_t)((double)(now - t0) / KL_F_NS * f->plan->rate);
  for (int n = 0; pub->sent < due && n < 100; n++) {
    kl_err_t err = kl_f_publish_one(f, pub, pub->sent);
    if (!err && pub->sent % 16 == 15)
      err = kl__ledger_gen_republish(pub->gen, pub->producer, f->topic);
    pub->errors += err != KL_OK;
    pub->sent++;
  }
  kl_producer_poll(pub->producer, 0);
}

/* 1 while the chaos phase goes on: its planned length, and up to as long
 * again while the plan's kills or stops are short (a run whose workers
 * were refused or frozen much of the time must still make its counts). */
static int kl_f_chaos_on(const kl_fault_t *f, int64_t elapsed) {
  const kl_plan_t *p = f->plan;
  if (elapsed < p->chaos_s * KL_F_NS)
    return 1;
  return elapsed < 2 * p->chaos_s * KL_F_NS &&
         (f->kills < p->min_kills || f->stops < p->min_stops);
}

static void kl_f_chaos(kl_fault_t *f, kl_pub_t *pub, kl_store_t *store) {
  const kl_plan_t *p = f->plan;
  int64_t t0 = kl_f_now(), now = t0;
  int64_t period = p->kill_every_ms * KL_F_MS;
  int64_t next_kill = t0 + period;
  int64_t next_stop = t0 + p->stop_every_ms / 2 * KL_F_MS;
  int64_t next_note = t0 + 10 * KL_F_NS;
  while (kl_f_chaos_on(f, now - t0)) {
    kl_f_publish(f, pub, now, t0);
    kl_f_check_due(f, pub, store, now);
    kl_f_reap(f, now);
    kl_f_restart(f, now);
    kl_f_tick_stops(f, store, now);
    kl_f_tick_windows(f, store, now, t0);
    if (p->broker_at_s >= 0)
      kl_f_tick_broker(f, now, t0);
    /* A kill due when no worker can be picked (all dead, frozen, held or
     * spared) is tried again on every tick until one is: refused starts
     * and frozen workers must not cost the run its kills. One late by
     * more than half a period is followed by the next half a period
     * later, not at once. */
    if (now >= next_kill && kl_f_kill(f, now)) {
      next_kill += period;
      if (next_kill < now + period / 2)
        next_kill = now + period / 2;
    }
    if (now >= next_stop)
      kl_f_stop(f, now), next_stop += p->stop_every_ms * KL_F_MS;
    if (now >= next_note) {
      fprintf(stderr,
              "fault: %.0f s: %" PRIu64 " published, %d SIGKILL, "
              "%d SIGSTOP\n",
              (double)(now - t0) / KL_F_NS, kl__ledger_gen_published(pub->gen),
              f->kills, f->stops);
      next_note += 10 * KL_F_NS;
    }
    kl_t_sleep_ms(10);
    now = kl_f_now();
  }
  f->chaos_secs = (double)(now - t0) / KL_F_NS;
}

/* Ends every fault, then lets the fleet apply everything; 0 on success. */
static int kl_f_drain(kl_fault_t *f, kl_pub_t *pub, kl_store_t *store) {
  if (f->ro_on) {
    kl_f_chmod_store(f, 1), f->ro_on = 0;
    f->ro_secs = (double)(kl_f_now() - f->ro_start) / KL_F_NS;
  }
  if (f->full_on)
    kl_f_unfill(f), f->full_on = 0;
  for (int i = 0; i < f->plan->workers; i++)
    if (f->slot[i].pid > 0 && (f->slot[i].cont_ns || f->slot[i].armed_ns))
      kl_f_resume(f, i, kl_f_now());
  for (int t = 0; f->broker_state >= 1 && f->broker_state <= 3; t++) {
    kl_f_tick_broker(f, kl_f_now(), 0);
    kl_producer_poll(pub->producer, 100);
    if (t > 1800)
      break;
  }
  if (kl_flush(pub->producer, 120000) != KL_OK)
    fprintf(stderr, "fault: %" PRId64 " events still unacknowledged\n",
            kl_producer_inflight(pub->producer));
  for (int s = 0; s < 240; s++) {
    int64_t now = kl_f_now();
    kl_f_check_due(f, pub, store, now);
    kl_f_reap(f, now);
    kl_f_restart(f, now);
    kl_f_tick_stops(f, store, now);
    int held = 0;
    for (int i = 0; i < f->plan->workers; i++)
      held |= f->slot[i].pid > 0 && f->slot[i].held;
    if (kl__ledger_gen_wait(pub->gen, store, f->topic, 0, 1000) == 0 && !held)
      return 0;
  }
  return -1;
}

static int kl_f_stop_fleet(kl_fault_t *f) {
  int clean = 0;
  for (int i = 0; i < f->plan->workers; i++)
    if (f->slot[i].pid > 0)
      kill(f->slot[i].pid, SIGTERM);
  for (int i = 0; i < f->plan->workers; i++) {
    int status = 0;
    for (int t = 0; f->slot[i].pid > 0 && t < 600; t++) {
      if (waitpid(f->slot[i].pid, &status, WNOHANG) == f->slot[i].pid) {
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        f->slot[i].pid = 0;
      } else {
        kl_t_sleep_ms(50);
      }
    }
    if (f->slot[i].pid > 0) {
      kill(f->slot[i].pid, SIGKILL);
      waitpid(f->slot[i].pid, NULL, 0);
    }
  }
  return clean;
}

/* What the run ends with: the publisher's and the store's counts, and
 * what they imply. */
typedef struct kl_figures {
  kl__ledger_verdict_t v;
  uint64_t published, republished, acked, failed, ids;
  /* Every unique event has one idempotency key, and so has each
   * transfer's credit and each scheduled transfer's settle (follow-ups).
   * An acknowledged event or a follow-up whose key the store lacks is
   * lost; applies beyond one per key are doubles; a fenced owner's commit
   * would show as both a double and a duplicate the next owner skipped
   * beyond those re-published, the follow-ups an outbox published again
   * after its worker died and the timers' firing records beyond one each
   * (read from the log: v.follow_up_copies, v.firing_copies). */
  uint64_t lost, twice, extra_dups;
  int fenced, full_errors, clean, drained;
  double drain_s;
} kl_figures_t;

static void kl_f_figures(kl_fault_t *f, kl_pub_t *pub, kl_store_t *store,
                         kl_figures_t *g) {
  assert_int_equal(kl__ledger_gen_read_follow_ups(
                       pub->gen, store, kl_t_bootstrap(f->cluster), f->topic),
                   KL_OK);
  assert_int_equal(kl__ledger_gen_verify(pub->gen, store, f->topic, &g->v),
                   KL_OK);
  assert_int_equal(kl_store_id_count(store, &g->ids), KL_OK);
  g->published = kl__ledger_gen_published(pub->gen);
  g->republished = kl__ledger_gen_republished(pub->gen);
  g->acked = kl__ledger_gen_acked(pub->gen);
  g->failed = kl__ledger_gen_failed(pub->gen);
  uint64_t keyed = g->published + g->v.transfers + g->v.scheduled;
  g->lost = keyed > g->ids ? keyed - g->ids : 0;
  g->twice = g->v.applied > g->ids ? g->v.applied - g->ids : 0;
  uint64_t expected_dups =
      g->republished + g->v.follow_up_copies + g->v.firing_copies;
  g->extra_dups =
      g->v.duplicates > expected_dups ? g->v.duplicates - expected_dups : 0;
  g->fenced = kl_f_count_all(f, "fenced partition=");
  g->full_errors = kl_f_count_all(f, KL_F_FULL);
  f->pg_lost = kl_f_count_all(f, KL_F_PG_LOST);
}

#define KL_F_ROW "  %-34s "

static void kl_f_print_faults(const kl_fault_t *f, const kl_figures_t *g) {
  const kl_plan_t *p = f->plan;
  printf(KL_F_ROW "%d SIGKILL, each restarted (%d starts after a death, "
                  "refused ones included), %d SIGSTOP past the %d ms session "
                  "(%d frozen between handler and commit)\n",
         "faults", f->kills, f->restarts, f->stops, p->session_ms,
         f->stops_paused);
  if (f->broker_state == 4)
    printf(KL_F_ROW "broker %d, leader of partition 0, killed; back after "
                    "%.1f s (restart rc %d)\n",
           "broker", f->broker_node, f->broker_secs, f->broker_rc);
  else
    printf(KL_F_ROW "%s\n", "broker",
           f->no_broker[0] ? f->no_broker : "not done");
  if (f->unpriv)
    printf(KL_F_ROW "%.1f s; %d worker starts refused by it\n",
           "store read-only", f->ro_secs, f->ro_refused);
  else
    printf(KL_F_ROW "%s\n", "store read-only", f->no_ro);
  if (f->tmpfs)
    printf(KL_F_ROW "%.1f s; %d commit or acquire errors logged\n",
           "store file system full", f->full_secs, g->full_errors);
  else
    printf(KL_F_ROW "%s\n", "store file system full", f->no_full);
  if (f->pg)
    printf(KL_F_ROW "%d restarts (immediate shutdown, %d ms down each), "
                    "%d worker connections broken by them\n",
           "PostgreSQL server", f->pg_restarts, p->pg_down_ms, f->pg_lost);
  printf(KL_F_ROW "%d of %d exited 0 on SIGTERM; %d other failed exits\n",
         "fleet at the end", g->clean, p->workers, f->bad_exits);
}

static void kl_f_print(const kl_fault_t *f, const kl_pub_t *pub,
                       const kl_figures_t *g) {
  const kl_plan_t *p = f->plan;
  const kl__ledger_verdict_t *v = &g->v;
  printf("fault suite on %s: %.0f s of faults, drained in %.1f s%s\n", p->name,
         f->chaos_secs, g->drain_s, g->drained ? " (NOT caught up)" : "");
  printf(KL_F_ROW "%" PRIu64 " over %" PRIu64 " keys\n", "published (unique)",
         g->published, v->keys);
  printf(KL_F_ROW "%" PRIu64 " (%.1f %%)\n", "re-published, same id",
         g->republished,
         g->published ? 100.0 * (double)g->republished / (double)g->published
                      : 0);
  printf(KL_F_ROW "%" PRIu64 " (not acknowledged: %" PRIu64
                  ", not queued: %" PRIu64 ")\n",
         "acknowledged by Kafka (acks=all)", g->acked, g->failed, pub->errors);
  printf(KL_F_ROW "%" PRIu64 " (each credits another account through the "
                  "outbox)\n",
         "transfers", v->transfers);
  printf(KL_F_ROW "%s: total %" PRId64 ", credits less debits %" PRId64 "\n",
         "money conserved", v->total_ok ? "yes" : "NO", v->total,
         v->total_expected);
  printf(KL_F_ROW "%" PRIu64 " (%.1f %% of the unique events: delayed "
                  "credits, and %" PRIu64 " scheduled transfers' settles), "
                  "0.2 to 3 s ahead; %" PRIu64 " applied, %" PRIu64
                  " of them before their time in %" PRIu64 " looks\n",
         "delayed events", v->delayed,
         g->published ? 100.0 * (double)v->delayed / (double)g->published : 0,
         v->scheduled, v->delayed_applied, v->early, v->due_checks);
  printf(KL_F_ROW "%" PRId64 " held at the end\n", "scheduled transfers",
         v->held);
  printf(KL_F_ROW "%" PRIu64
                  " beyond one per timer (duplicates), at most %" PRIu64
                  " for one timer\n",
         "timers' firing records", v->firing_copies, v->firing_max);
  printf(KL_F_ROW "%" PRIu64 "\n", "applied", v->applied);
  printf(KL_F_ROW "%" PRIu64 " (of them follow-ups the outbox published again "
                  "after a kill: %" PRIu64 ")\n",
         "duplicates suppressed", v->duplicates, v->follow_up_copies);
  printf(KL_F_ROW "%" PRIu64 "\n", "idempotency keys in the store", g->ids);
  printf(KL_F_ROW "%" PRIu64 "\n", "lost", g->lost);
  printf(KL_F_ROW "%" PRIu64 "\n", "idempotency keys applied twice", g->twice);
  printf(KL_F_ROW "%" PRIu64 "\n", "per-key order violations", v->violations);
  printf(KL_F_ROW "%" PRIu64 " (fenced batches logged: %d)\n",
         "commits by a fenced owner", g->extra_dups + g->twice, g->fenced);
  printf(KL_F_ROW "%" PRIu64 " of %" PRIu64 " keys match (wrong: %" PRIu64
                  "), %" PRIu64 " of %d partitions caught up\n",
         "balances and last seq", v->keys_ok, v->keys, v->keys_bad,
         v->caught_up, p->partitions);
  kl_f_print_faults(f, g);
  fflush(stdout);
}

static void kl_f_assert(const kl_fault_t *f, const kl_figures_t *g) {
  const kl_plan_t *p = f->plan;
  assert_int_equal(g->drained, 0);
  assert_int_equal(g->failed, 0);
  assert_int_equal(g->acked, g->published + g->republished);
  assert_true(g->republished * 20 >= g->published); /* >= 5 % */
  assert_int_equal(g->lost, 0);
  assert_int_equal(g->twice, 0);
  assert_int_equal(g->extra_dups, 0);
  assert_int_equal(g->v.violations, 0);
  assert_int_equal(g->v.keys_bad, 0);
  assert_int_equal(g->v.keys_ok, g->v.keys);
  assert_int_equal(g->v.applied,
                   g->published + g->v.transfers + g->v.scheduled);
  assert_int_equal(g->v.duplicates,
                   g->republished + g->v.follow_up_copies + g->v.firing_copies);
  assert_true(g->v.transfers > 0);
  /* the delayed events: each applied once, none early, nothing held */
  assert_true(g->v.scheduled > 0);
  assert_true(g->v.delayed * 10 >= g->published); /* >= 10 %: 15 % planned */
  assert_int_equal(g->v.delayed_applied, g->v.delayed);
  assert_int_equal(g->v.early, 0);
  assert_true(g->v.due_checks >= 10);
  assert_int_equal(g->v.held, 0);
  assert_int_equal(g->v.total, g->v.total_expected); /* money conserved */
  assert_true(g->v.total_ok);
  assert_true(g->v.ok);
  assert_true(f->kills >= p->min_kills);
  assert_true(f->stops >= p->min_stops);
  assert_true(g->fenced >= 1 || f->stops_paused == 0);
  if (p->broker_at_s >= 0 && f->kafka_dir && *f->kafka_dir) {
    assert_int_equal(f->broker_state, 4);
    assert_int_equal(f->broker_rc, 0);
  }
  if (f->unpriv)
    assert_true(f->ro_refused >= 1);
  if (f->tmpfs)
    assert_true(g->full_errors >= 1);
  if (f->pg) {
    assert_int_equal(f->pg_restarts, 2);
    assert_true(f->pg_lost >= 1);
  }
}

/* The plan by the cluster, a directory for logs and the store, the store,
 * the cluster and its topic. */
static void kl_f_setup(kl_fault_t *f, kl_store_t **store) {
  memset(f, 0, sizeof(*f));
  f->rnd = 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid();
  const char *boot = getenv("KEYLANE_TEST_BOOTSTRAP");
  const char *kind = getenv("KEYLANE_TEST_STORE");
  f->plan = boot && *boot ? &kl_plan_kafka : &kl_plan_embedded;
  if (kind && strcmp(kind, "postgresql") == 0)
    f->plan = kl_f_plan_pg();
  f->kafka_dir = getenv("KEYLANE_TEST_KAFKA_DIR");
  if (f->plan->broker_at_s < 0)
    snprintf(f->no_broker, sizeof(f->no_broker),
             "none on the embedded cluster");
  else if (!(f->kafka_dir && *f->kafka_dir))
    snprintf(f->no_broker, sizeof(f->no_broker),
             "skipped: KEYLANE_TEST_KAFKA_DIR names no kafka.sh cluster");
  snprintf(f->dir, sizeof(f->dir), "/tmp/keylane-fault-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  chmod(f->dir, 0755);
  /* Before any thread exists: the mount namespace is the calling
   * thread's, and the workers are forked from this one. */
  if (f->plan->pg_down_ms)
    kl_f_pg_setup(f);
  else
    kl_f_store_setup(f);
  assert_int_equal(
      kl_t_cluster_new(3, "fault", f->plan->partitions, &f->cluster), KL_OK);
  f->topic = kl_t_topic(f->cluster);
  f->group = kl_t_group(f->cluster, "fault");
  assert_int_equal(kl_store_open(f->store_dir, NULL, store), KL_OK);
  kl_f_store_own(f);
}

static void test_fleet_under_faults(void **state) {
  kl_fault_t f;
  kl_store_t *store;
  kl_f_setup(&f, &store);
  const kl_plan_t *p = f.plan;
  kl_pub_t pub = {kl__ledger_gen_new(p->keys, p->partitions, 0), NULL, 0, 0, 0};
  pub.producer = kl_t_producer(kl_t_bootstrap(f.cluster), pub.gen);
  assert_non_null(pub.producer);
  fprintf(stderr,
          "fault: %s at %s, topic %s (%d partitions), %d workers%s, "
          "store %s%s; logs in %s\n",
          p->name, kl_t_bootstrap(f.cluster), f.topic, p->partitions,
          p->workers, f.unpriv ? " as nobody" : "", f.store_dir,
          f.tmpfs ? " (tmpfs)" : "", f.dir);

  kl_figures_t g = {0};
  kl_f_restart(&f, kl_f_now());
  assert_int_equal(kl__ledger_gen_wait(pub.gen, store, f.topic, 1, 60000), 0);
  kl_f_chaos(&f, &pub, store);
  int64_t t_drain = kl_f_now();
  g.drained = kl_f_drain(&f, &pub, store);
  g.drain_s = (double)(kl_f_now() - t_drain) / KL_F_NS;
  g.clean = kl_f_stop_fleet(&f);
  kl_f_figures(&f, &pub, store, &g);
  kl_f_print(&f, &pub, &g);

  kl_producer_destroy(pub.producer);
  kl__ledger_gen_destroy(pub.gen);
  kl_store_destroy(store);
  kl_t_cluster_destroy(f.cluster);
  kl_t_pg_stop(f.pg);
  if (f.tmpfs)
    umount2(f.store_dir, MNT_DETACH);
  /* Kept when a check below fails, so that its logs show why. */
  if (g.v.ok && g.lost + g.twice + g.extra_dups == 0 &&
      (!f.tmpfs || g.full_errors >= 1) &&
      (g.fenced >= 1 || f.stops_paused == 0) && !getenv("KEYLANE_TEST_KEEP"))
    kl_t_rmrf(f.dir);
  else
    fprintf(stderr, "fault: worker logs kept in %s\n", f.dir);
  kl_f_assert(&f, &g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fleet_under_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
