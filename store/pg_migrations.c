/*
 * The PostgreSQL store's schema, as numbered migrations. Migration N moves
 * the schema from version N-1 to N; keylane_schema_version holds one row
 * per migration applied. A migration is never edited once released: a
 * change is a new migration.
 *
 * Who migrates: kl_store_open() creates the schema on a database where
 * keylane has created nothing yet (as the LMDB store creates its
 * environment when missing: nothing can depend on a schema that is not
 * there). An existing older schema is only moved by `keylane store
 * migrate`, run by a person: workers of the old version may still be
 * running against it, and a fleet should not change its store's shape as a
 * side effect of one worker restarting. A schema newer than this build is
 * refused (KL_ESTORE_VERSION) by both.
 *
 * Any number of openers and migrators may start at once: the schema is
 * created or migrated by one of them, under the schema lock (below); the
 * others wait for it, bounded, then find it done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "store/pg.h"

static const char *const kl_pg_migrations[KL__PG_SCHEMA_VERSION] = {
    /* 1: the store contract. Topics sort as bytes ("C"), like LMDB's keys;
     * insert times are the store clock's ms, so tests can move time. */
    "CREATE TABLE keylane_schema_version ("
    "  version integer PRIMARY KEY,"
    "  applied_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE keylane_partitions ("
    "  topic text COLLATE \"C\" NOT NULL,"
    "  partition integer NOT NULL,"
    "  epoch bigint NOT NULL DEFAULT 0,"
    "  watermark bigint NOT NULL DEFAULT 0,"
    "  applied bigint NOT NULL DEFAULT 0,"
    "  duplicates bigint NOT NULL DEFAULT 0,"
    "  dead_letters bigint NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (topic, partition));"
    "CREATE TABLE keylane_ids ("
    "  id bytea PRIMARY KEY,"
    "  mark smallint NOT NULL,"
    "  inserted_ms bigint NOT NULL);"
    "CREATE INDEX keylane_ids_inserted ON keylane_ids (inserted_ms);"
    "CREATE TABLE keylane_kv ("
    "  key bytea PRIMARY KEY,"
    "  value bytea NOT NULL);",
    /* 2: the built-in inventory handler's record of each reservation. */
    "CREATE TABLE keylane_inventory_outcomes ("
    "  id bytea PRIMARY KEY,"
    "  sku text NOT NULL,"
    "  outcome text NOT NULL CHECK (outcome IN ('reserved', 'sold_out')),"
    "  partition integer NOT NULL,"
    "  epoch bigint NOT NULL,"
    "  event_offset bigint NOT NULL,"
    "  recorded_at timestamptz NOT NULL DEFAULT now());",
    /* 3: idempotency keys scoped by topic: two topics sharing a store may
     * use one id. Which topic an older id belonged to was not recorded, so
     * each is copied to every topic the store knows: it still suppresses
     * its own event's duplicates (and, as before, the same id on the other
     * topics, until the sweep removes it). */
    "CREATE TABLE keylane_topic_ids ("
    "  topic text COLLATE \"C\" NOT NULL,"
    "  id bytea NOT NULL,"
    "  mark smallint NOT NULL,"
    "  inserted_ms bigint NOT NULL,"
    "  PRIMARY KEY (topic, id));"
    "INSERT INTO keylane_topic_ids (topic, id, mark, inserted_ms) "
    "  SELECT p.topic, i.id, i.mark, i.inserted_ms FROM keylane_ids i "
    "  CROSS JOIN (SELECT DISTINCT topic FROM keylane_partitions) p;"
    "DROP TABLE keylane_ids;"
    "ALTER TABLE keylane_topic_ids RENAME TO keylane_ids;"
    "ALTER INDEX keylane_topic_ids_pkey RENAME TO keylane_ids_pkey;"
    "CREATE INDEX keylane_ids_inserted ON keylane_ids (inserted_ms);",
    /* 4: heartbeats of an owner outside the group (replay, redrive), so
     * that a live worker it fenced sees it work (kl__store_beat()). A
     * table apart: a beat that updated the partition's row would make the
     * batch in flight, whose fence updates that row at commit, fail with
     * a serialization error. */
    "CREATE TABLE keylane_beats ("
    "  topic text COLLATE \"C\" NOT NULL,"
    "  partition integer NOT NULL,"
    "  beats bigint NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (topic, partition));",
    /* 5: the outbox: follow-up events (kl_txn_emit()) committed with their
     * batch and not yet published (pg_outbox.c). */
    "CREATE SEQUENCE keylane_outbox_seq;"
    "CREATE TABLE keylane_outbox ("
    "  topic text COLLATE \"C\" NOT NULL,"
    "  partition integer NOT NULL,"
    "  seq bigint NOT NULL,"
    "  rec bytea NOT NULL,"
    "  PRIMARY KEY (topic, partition, seq));",
    /* 6: cheaper ids for every commit. The sweep walks keylane_ids' pages
     * instead of an index on insert times, which cost an index entry and
     * a WAL record per id (a third of the id insert's records; 2.5 -> 1.7
     * ms per 1,000 ids in keylane-bench store); keylane_sweep holds the
     * page where the fleet's next sweep starts (pg_sweep_fn()). The
     * primary key leads with the id: a btree compares its first column
     * fast and a varlena's successor slowly, and ids differ where topics
     * repeat (the batch lookup 1.6 -> 1.2 ms per 1,000 ids). Rebuilding
     * the key reads the whole table once, in `keylane store migrate`. */
    "DROP INDEX keylane_ids_inserted;"
    "ALTER TABLE keylane_ids DROP CONSTRAINT keylane_ids_pkey, "
    "  ADD CONSTRAINT keylane_ids_pkey PRIMARY KEY (id, topic);"
    "CREATE TABLE keylane_sweep ("
    "  one boolean PRIMARY KEY DEFAULT true CHECK (one),"
    "  next_page bigint NOT NULL);"
    "INSERT INTO keylane_sweep (next_page) VALUES (0);",
    /* 7: idempotency keys scoped by entity key (store/store_internal.h):
     * an event's id is kept as its sid, so one id on two keys names two
     * events, whichever runs first. The ids kept so far stay unscoped;
     * keylane_meta records the newest of them, so that lookups ask for an
     * id unscoped too until those have expired (kl__store_legacy_ids()). */
    "CREATE TABLE keylane_meta ("
    "  name text PRIMARY KEY,"
    "  value bigint NOT NULL);"
    "INSERT INTO keylane_meta (name, value) "
    "  SELECT 'legacy_ids_newest_ms', max(inserted_ms) FROM keylane_ids "
    "  HAVING count(*) > 0;",
    /* 8: the identity of the record at watermark - 1 and the watermark it
     * belongs to (kl__store_last()), written by each commit's fence: a new
     * owner compares it with the log, which a recreated topic replaced. */
    "ALTER TABLE keylane_partitions ADD COLUMN last_ident bytea, "
    "  ADD COLUMN last_ident_wm bigint;",
    /* 9: the inventory handler's outcomes follow the id scoping: one id
     * on two SKUs (or two topics) names two events, so an outcome is keyed
     * by (topic, sku, id), not by its id alone, which refused the second
     * SKU's row ("duplicate key value") and dead-lettered its event. Which
     * topic an older row was recorded for was not kept: the store's only
     * topic when it knows one, else '' (nothing reads the rows back; the
     * key only has to keep new ones apart). */
    "ALTER TABLE keylane_inventory_outcomes ADD COLUMN topic text "
    "  COLLATE \"C\";"
    "UPDATE keylane_inventory_outcomes SET topic = coalesce((SELECT "
    "  min(topic) FROM keylane_partitions HAVING count(DISTINCT topic) = 1), "
    "  '');"
    "ALTER TABLE keylane_inventory_outcomes ALTER COLUMN topic SET NOT NULL, "
    "  DROP CONSTRAINT keylane_inventory_outcomes_pkey, "
    "  ADD CONSTRAINT keylane_inventory_outcomes_pkey "
    "  PRIMARY KEY (topic, sku, id);",
    /* 10: each topic sweeps its own ids, by its own fleet's retention
     * (issue 39: one fleet's sweep, store-wide, removed every topic's ids
     * by its retention). A row per topic holds where its next sweep
     * starts, and the retention and time of its last sweep that removed
     * ids (pg_sweep.c). The ids are already scoped by topic (version 3):
     * none moves, and none is swept earlier than its own fleet's
     * retention. Version 6's store-wide table is dropped, not changed: a
     * worker of an older build still running fails its sweep (which names
     * that table) rather than sweeping every topic. */
    "DROP TABLE keylane_sweep;"
    "CREATE TABLE keylane_topic_sweeps ("
    "  topic text COLLATE \"C\" PRIMARY KEY,"
    "  next_page bigint NOT NULL DEFAULT 0,"
    "  retention_ms bigint,"
    "  swept_ms bigint);",
    /* 11: each topic's owner, the Kafka cluster its log is on and the
     * consumer group of its fleet (kl__store_owner_t), recorded by the
     * first acquire of a worker of this version (issue 39: a worker on
     * another cluster with the same topic name, or with a typo'd group,
     * took the partitions nothing was applied of yet and fenced the
     * fleet). Nothing to convert: a topic without a row gets one at its
     * next acquire; an older build, which would not check it, is refused
     * by the version. */
    "CREATE TABLE keylane_topic_owners ("
    "  topic text COLLATE \"C\" PRIMARY KEY,"
    "  cluster_id text NOT NULL,"
    "  group_id text NOT NULL);",
    /* 12: a scoped id is stored id first ("the id, a NUL, the entity
     * key", kl__pg_id_out()), no longer as its sid (key first), so that
     * a batch's new ids, time-ordered (UUIDv7), land at the tail of the
     * primary key instead of one leaf page per entity key: a commit
     * dirtied a leaf per key of the batch, each a full-page image after a
     * checkpoint (16 commits of 1,000 ids after a checkpoint: 715 against
     * 243 WAL bytes per id), and the index split in the middle, half
     * full (1.6 times the pages). The ids kept so far are rewritten; the
     * unscoped ones (no NUL) stay as they are. The CHECK refuses a sid, a
     * row that starts with a NUL: a worker of an older build still
     * running, which would neither find an id stored id first nor write
     * one a newer worker finds, fails its commits instead of applying an
     * event twice. The lock first: no older worker commits a sid between
     * the rewrite and the check. */
    "LOCK TABLE keylane_ids IN ACCESS EXCLUSIVE MODE;"
    "UPDATE keylane_ids SET id = substr(id, 4 + (get_byte(id, 1) << 8 | "
    "  get_byte(id, 2))) || '\\x00'::bytea || substr(id, 4, get_byte(id, 1) "
    "  << 8 | get_byte(id, 2)) WHERE substr(id, 1, 1) = '\\x00'::bytea;"
    "ALTER TABLE keylane_ids ADD CONSTRAINT keylane_ids_stored_id_first "
    "  CHECK (substr(id, 1, 1) <> '\\x00'::bytea);",
};

/* What keylane's statements read and write at KL__PG_SCHEMA_VERSION, by
 * table (the handlers' tables are theirs to check): a schema whose version
 * row says it is current may still have been changed by hand. */
static const char kl_pg_needed_sql[] =
    "SELECT string_agg(n.tab || '.' || n.col, ', ' ORDER BY n.tab, n.col) "
    "FROM (VALUES ('keylane_schema_version', 'version'), "
    "('keylane_partitions', 'topic'), ('keylane_partitions', 'partition'), "
    "('keylane_partitions', 'epoch'), ('keylane_partitions', 'watermark'), "
    "('keylane_partitions', 'applied'), ('keylane_partitions', 'duplicates'), "
    "('keylane_partitions', 'dead_letters'), "
    "('keylane_partitions', 'last_ident'), "
    "('keylane_partitions', 'last_ident_wm'), "
    "('keylane_ids', 'topic'), ('keylane_ids', 'id'), ('keylane_ids', 'mark'), "
    "('keylane_ids', 'inserted_ms'), ('keylane_kv', 'key'), "
    "('keylane_kv', 'value'), ('keylane_beats', 'topic'), "
    "('keylane_beats', 'partition'), ('keylane_beats', 'beats'), "
    "('keylane_outbox', 'topic'), ('keylane_outbox', 'partition'), "
    "('keylane_outbox', 'seq'), ('keylane_outbox', 'rec'), "
    "('keylane_topic_sweeps', 'topic'), "
    "('keylane_topic_sweeps', 'next_page'), "
    "('keylane_topic_sweeps', 'retention_ms'), "
    "('keylane_topic_sweeps', 'swept_ms'), "
    "('keylane_topic_owners', 'topic'), "
    "('keylane_topic_owners', 'cluster_id'), "
    "('keylane_topic_owners', 'group_id'), "
    "('keylane_meta', 'name'), ('keylane_meta', 'value')) AS n(tab, col) "
    /* pg_attribute, not information_schema: that one hides the columns
     * the role has no privilege on. */
    "WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE "
    "a.attrelid = to_regclass(n.tab) AND a.attname = n.col "
    "AND NOT a.attisdropped)";

kl_err_t kl__pg_schema_missing(PGconn *pg, char *missing, size_t size) {
  PGresult *res = PQexec(pg, kl_pg_needed_sql);
  kl_err_t err = KL_OK;
  if (!kl__pg_ok(res) || PQntuples(res) != 1)
    err = kl__pg_err(pg, res, "read the schema's columns");
  else
    snprintf(missing, size, "%s", PQgetvalue(res, 0, 0));
  PQclear(res);
  return err;
}

kl_err_t kl__pg_schema_version(PGconn *pg, int *version) {
  *version = 0;
  PGresult *res = PQexec(pg, "SELECT to_regclass('keylane_schema_version') "
                             "IS NOT NULL");
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(pg, res, "read the schema version");
    PQclear(res);
    return err;
  }
  int exists = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
  PQclear(res);
  if (!exists)
    return KL_OK;
  uint64_t v = 0;
  kl_err_t err = kl__pg_u64(
      pg,
      PQexec(pg,
             "SELECT coalesce(max(version), 0) FROM keylane_schema_version"),
      "read the schema version", &v);
  *version = (int)v;
  return err;
}

/*
 * The schema lock: creating the schema and every migration run under one
 * PostgreSQL advisory lock, a session lock taken before the version is read
 * and released after the last step. Not pg_advisory_xact_lock in each
 * step's transaction, for two reasons:
 *  - each migration commits in a transaction of its own, and an xact lock
 *    ends with it: two migrators could take turns at the steps;
 *  - a transaction that waited for the lock sees the catalog as its
 *    backend cached it before the wait: to_regclass() answers from that
 *    cache, where the version read before the wait left "no such table",
 *    and PostgreSQL refreshes it when a transaction starts (or locks a
 *    relation), not when an advisory lock is granted. The version read
 *    after the wait missed the tables the holder had committed meanwhile,
 *    and migration 1 ran again: `relation "keylane_schema_version" already
 *    exists`.
 * So the lock is taken in a transaction of its own, and the version is
 * read in the next one, after the wait. The key is the one earlier builds
 * lock per step: a session lock and an xact lock on one key exclude each
 * other, so an older keylane and this one never migrate at once.
 */

static _Atomic int schema_wait_ms;

void kl__pg_set_schema_wait_ms(int ms) {
  schema_wait_ms = ms;
}

static int schema_wait(void) {
  int ms = schema_wait_ms;
  return ms > 0 ? ms : KL__PG_SCHEMA_WAIT_MS;
}

/* The session holding the schema lock, for the error of a wait that gave
 * up, as pg_stat_activity shows it to this user: "pid 42 (user u,
 * application a, from 10.0.0.5, active: "ALTER ...")", and a way out. */
static void schema_holder(PGconn *pg, char *buf, size_t size) {
  PGresult *res = PQexec(
      pg, "SELECT a.pid, coalesce(' (' || nullif(concat_ws(', ', "
          "'user ' || a.usename, 'application ' || "
          "nullif(a.application_name, ''), 'from ' || host(a.client_addr), "
          "a.state || ': \"' || regexp_replace(left(a.query, 100), '\\s+', "
          "' ', 'g') || '\"'), '') || ')', '') "
          "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
          "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
          "(SELECT oid FROM pg_database WHERE datname = current_database()) "
          "AND l.classid::int8 = " KL__PG_SCHEMA_LOCK " >> 32 "
          "AND l.objid::int8 = " KL__PG_SCHEMA_LOCK " & 4294967295 "
          "AND l.objsubid = 1");
  if (!kl__pg_ok(res))
    snprintf(buf, size, "a session not known (reading pg_locks failed)");
  else if (PQntuples(res) == 0)
    snprintf(buf, size, "a session that has released it since: retry");
  else
    snprintf(buf, size,
             "pid %s%s: retry once it is done; if it is stuck, end it with "
             "SELECT pg_terminate_backend(%s)",
             PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1),
             PQgetvalue(res, 0, 0));
  PQclear(res);
}

static kl_err_t schema_lock_timeout(PGconn *pg, int wait_ms) {
  char holder[512];
  schema_holder(pg, holder, sizeof(holder));
  return kl__err(KL_ESTORE_BUSY,
                 "postgresql: waited %d ms for the keylane schema lock of "
                 "database %s (advisory lock " KL__PG_SCHEMA_LOCK "), held "
                 "while the schema is created or migrated, by %s",
                 wait_ms, PQdb(pg), holder);
}

/* Takes the schema lock, waiting schema_wait() at most. */
static kl_err_t schema_lock(PGconn *pg) {
  int wait_ms = schema_wait(), timed_out = 0;
  char sql[64];
  snprintf(sql, sizeof(sql), "SET LOCAL lock_timeout = %d", wait_ms);
  kl_err_t err = kl__pg_exec(pg, "BEGIN", "lock the schema");
  if (!err)
    err = kl__pg_exec(pg, sql, "lock the schema");
  if (!err) {
    PGresult *res =
        PQexec(pg, "SELECT pg_advisory_lock(" KL__PG_SCHEMA_LOCK ")");
    if (!kl__pg_ok(res)) {
      err = kl__pg_err(pg, res, "lock the schema");
      timed_out = strcmp(kl__pg_state(res), "55P03") == 0; /* lock_timeout */
    }
    PQclear(res);
  }
  if (!err)
    return kl__pg_exec(pg, "COMMIT", "lock the schema");
  PQclear(PQexec(pg, "ROLLBACK"));
  return timed_out ? schema_lock_timeout(pg, wait_ms) : err;
}

/* Releases the schema lock; @returns @p err, or the release's failure
 * (the caller then drops the connection, which releases it). */
static kl_err_t schema_unlock(PGconn *pg, kl_err_t err) {
  kl_err_t unlocked =
      kl__pg_exec(pg, "SELECT pg_advisory_unlock(" KL__PG_SCHEMA_LOCK ")",
                  "unlock the schema");
  return err ? err : unlocked;
}

static kl_err_t pg_newer(int version) {
  return kl__err(KL_ESTORE_VERSION,
                 "postgresql: the keylane schema is at version %d, newer than "
                 "this build knows (%d): a newer keylane migrated it; run that "
                 "version (a schema is never migrated back)",
                 version, KL__PG_SCHEMA_VERSION);
}

/* Applies migration @p version in a transaction of its own: a failure
 * leaves the schema at the version before it. Under the schema lock. */
static kl_err_t pg_apply(PGconn *pg, int version) {
  char sql[96];
  snprintf(sql, sizeof(sql),
           "INSERT INTO keylane_schema_version (version) VALUES (%d)", version);
  kl_err_t err = kl__pg_exec(pg, "BEGIN", "begin a schema migration");
  if (!err)
    err = kl__pg_exec(pg, kl_pg_migrations[version - 1],
                      "apply a schema migration");
  if (!err)
    err = kl__pg_exec(pg, sql, "record a schema migration");
  if (!err && !(err = kl__pg_exec(pg, "COMMIT", "commit a schema migration")))
    return KL_OK;
  PQclear(PQexec(pg, "ROLLBACK"));
  return err;
}

/* Applies the migrations above @p version, under the schema lock;
 * @p to receives the version reached. */
static kl_err_t migrate_from(PGconn *pg, int version, int *to) {
  *to = version;
  if (version > KL__PG_SCHEMA_VERSION)
    return pg_newer(version);
  while (version < KL__PG_SCHEMA_VERSION) {
    kl_err_t err = pg_apply(pg, version + 1);
    if (err)
      return err;
    *to = ++version;
  }
  return KL_OK;
}

kl_err_t kl__pg_migrate(PGconn *pg, int *from, int *to) {
  *from = *to = 0;
  kl_err_t err = schema_lock(pg);
  if (err)
    return err;
  err = kl__pg_schema_version(pg, from); /* after the wait: see above */
  if (!err)
    err = migrate_from(pg, *from, to);
  return schema_unlock(pg, err);
}

/* What an opener does with the version it read under the schema lock. */
static kl_err_t open_locked(PGconn *pg, int version, int create) {
  int to;
  if (version == 0 && !create)
    return kl__err(KL_ENOTFOUND,
                   "postgresql: database %s holds no keylane "
                   "store: this command does not create one; "
                   "check --store",
                   PQdb(pg));
  if (version == 0 || version > KL__PG_SCHEMA_VERSION)
    return migrate_from(pg, version, &to); /* creates it, or says why not */
  if (version < KL__PG_SCHEMA_VERSION)
    return kl__err(KL_ESTORE_VERSION,
                   "postgresql: the keylane schema of database %s is at "
                   "version %d, this build needs %d: stop the workers of the "
                   "older version, then run `keylane store migrate --store "
                   "URI`",
                   PQdb(pg), version, KL__PG_SCHEMA_VERSION);
  return KL_OK;
}

kl_err_t kl__pg_schema_open(PGconn *pg, int create) {
  int version;
  kl_err_t err = kl__pg_schema_version(pg, &version);
  if (err)
    return err;
  /* Final answers without the lock: a version is recorded in the
   * transaction of its migration, and versions only go up. */
  if (version == KL__PG_SCHEMA_VERSION)
    return KL_OK;
  if (version > KL__PG_SCHEMA_VERSION)
    return pg_newer(version);
  /* Empty or older: another process may be creating or migrating it. */
  if ((err = schema_lock(pg)))
    return err;
  err = kl__pg_schema_version(pg, &version);
  if (!err)
    err = open_locked(pg, version, create);
  return schema_unlock(pg, err);
}

kl_err_t kl__store_pg_migrate(const char *uri, int *from, int *to) {
  PGconn *pg;
  kl_err_t err =
      kl__pg_connect(uri, kl__pg_connect_timeout_s(NULL), KL_ESTORE, &pg);
  if (err)
    return err;
  err = kl__pg_migrate(pg, from, to);
  PQfinish(pg);
  return err;
}
