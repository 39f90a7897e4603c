/* SQL from a test (sql.h). */
#include "support/sql.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

long long kl_t_sql(PGconn *pg, const char *sql) {
  PGresult *res = PQexec(pg, sql);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(res));
  long long v = s == PGRES_TUPLES_OK && PQntuples(res) > 0
                    ? strtoll(PQgetvalue(res, 0, 0), NULL, 10)
                    : 0;
  PQclear(res);
  return v;
}
