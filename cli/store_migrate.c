/* keylane store migrate: brings a PostgreSQL store's schema to this
 * build's version (see store/pg_migrations.c for who migrates). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "keylane/store.h"
#include "cli/store.h"
#include "store/store_internal.h"
#include "store/location.h"

#define SUB "store migrate"

typedef struct migrate_args {
  const char *location;
} migrate_args_t;

static const kl__opt_t migrate_opts[] = {
    {.name = "store",
     .kind = KL__OPT_STRING,
     .meta = "STORE",
     .off = offsetof(migrate_args_t, location),
     .required = "",
     .help = "postgresql://... URI (or an LMDB directory)"},
    {0}};

static const kl__cmd_t migrate_cmd = {
    .name = SUB,
    .usage = "--store STORE",
    .about =
        "Applies the schema migrations a PostgreSQL store lacks, each in its "
        "own\n"
        "transaction; safe to run twice, and beside running workers of the "
        "same\n"
        "version. A worker never creates nor upgrades the schema\n"
        "(store.pg.migrate=never, its default): run this on an empty "
        "database\n"
        "before the first worker starts, and to upgrade, stop the workers of "
        "the\n"
        "older version, run this, then start the new ones. A schema newer "
        "than\n"
        "this build is refused.\n"
        "An LMDB store is migrated in place when it is opened (by a worker "
        "or\n"
        "by this command): stop the workers of the older version first; they\n"
        "would go on writing the old layout, and an older keylane refuses a\n"
        "migrated store. A directory holding no store is refused: this "
        "command\n"
        "creates none there.\n",
    .opts = migrate_opts,
    .examples = "  keylane store migrate --store postgresql://kl@db/kl\n"};

/* An LMDB store migrates when opened: this opens an existing one, and
 * never starts one at a mistyped path. */
static int migrate_lmdb(const char *dir) {
  kl_store_t *store;
  int version = 0, latest = 0;
  int rc = kl__cli_store_existing(SUB, dir, &store);
  if (rc)
    return rc;
  if (kl__store_version(store, &version, &latest)) {
    kl_store_destroy(store);
    return kl__cli_fail(SUB, "cannot read the store %s's version: %s", dir,
                        kl_err_detail());
  }
  kl_store_destroy(store);
  printf("LMDB store %s: format version %d, the latest this build knows "
         "(an older format is migrated when the store is opened)\n",
         dir, version);
  return KL_EXIT_OK;
}

static int migrate_pg(const char *uri) {
  int from = 0, to = 0;
  kl_err_t err = kl__store_pg_migrate(uri, &from, &to);
  if (err)
    return kl__cli_fail(SUB, "%s", kl_err_detail());
  if (from == to)
    printf("schema version %d, the latest this build knows: nothing to do\n",
           to);
  else
    printf("schema version %d -> %d\n", from, to);
  return KL_EXIT_OK;
}

int kl__cmd_store_migrate(int argc, char **argv) {
  migrate_args_t a = {0};
  int first;
  int rc = kl__opts_parse(&migrate_cmd, argc, argv, &a, NULL, &first);
  if (rc >= 0)
    return rc;
  const char *location = a.location;
  if (kl__location_is_pg(location))
    return migrate_pg(location);
  return migrate_lmdb(location);
}
