#include "support/pg_db.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/internal.h"
#include "support/pg_group.h"
#include "support/sql.h"
#include "store/store_internal.h"

static int kl_db_seq;

int kl_t_pg_db_setup(void **state) {
  if (!kl_t_pg_group())
    return 0;
  kl_t_pg_db_t *st = calloc(1, sizeof(*st));
  char name[32];
  snprintf(name, sizeof(name), "t%d", ++kl_db_seq);
  if (!st || kl_t_pg_createdb(kl_t_pg_group(), name, st->fx.where,
                              sizeof(st->fx.where)))
    return -1;
  st->admin = PQconnectdb(st->fx.where);
  if (PQstatus(st->admin) != CONNECTION_OK)
    return -1;
  *state = st;
  return 0;
}

int kl_t_pg_db_teardown(void **state) {
  kl_t_pg_db_t *st = *state;
  kl__store_set_clock(NULL);
  kl__set_now_ms(NULL);
  if (st) {
    PQfinish(st->admin);
    free(st);
  }
  return 0;
}

void kl_t_pg_terminate_others(PGconn *admin) {
  char sql[200];
  snprintf(sql, sizeof(sql),
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
           "WHERE datname = current_database() AND pid <> %d",
           PQbackendPID(admin));
  kl_t_sql(admin, sql);
}
