#include "common/sqlstate.h"

#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int sqlstate_in(const char *state, const char *const *states, size_t n) {
  for (size_t i = 0; state && i < n; i++)
    if (strcmp(state, states[i]) == 0)
      return 1;
  return 0;
}

int kl__sqlstate_transient(const char *state) {
  static const char *const states[] = {
      "40001", /* serialization_failure */
      "40P01", /* deadlock_detected */
      "55P03", /* lock_not_available (lock_timeout) */
      "57014", /* query_canceled (statement_timeout) */
      "57P01", /* admin_shutdown (pg_terminate_backend) */
      "57P02", /* crash_shutdown */
      "57P03", /* cannot_connect_now */
      "25P03", /* idle_in_transaction_session_timeout */
  };
  if (state && (strncmp(state, "08", 2) == 0 || strncmp(state, "53", 2) == 0))
    return 1; /* connection exception, insufficient resources */
  return sqlstate_in(state, states, N_OF(states));
}

int kl__sqlstate_setup(const char *state) {
  static const char *const states[] = {
      "42501", /* insufficient_privilege (a REVOKE) */
      "42P01", /* undefined_table */
      "42703", /* undefined_column */
      "25006", /* read_only_sql_transaction */
  };
  return sqlstate_in(state, states, N_OF(states));
}
