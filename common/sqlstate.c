#include "common/sqlstate.h"

#include <string.h>

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
  if (!state)
    return 0;
  if (strncmp(state, "08", 2) == 0 || strncmp(state, "53", 2) == 0)
    return 1; /* connection exception, insufficient resources */
  for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
    if (strcmp(state, states[i]) == 0)
      return 1;
  return 0;
}
