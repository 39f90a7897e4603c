#include "support/pg_group.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

static kl_t_pg_t *t_pg;
static char t_why[2048];

static int kl_t_pg_group_start(int durable) {
  t_pg = kl_t_pg_start(durable, t_why, sizeof(t_why));
  if (!t_pg)
    fprintf(stderr, "pg: skipping: %s\n", t_why);
  return 0;
}

int kl_t_pg_group_setup(void **state) {
  (void)state;
  return kl_t_pg_group_start(0);
}

int kl_t_pg_group_setup_restartable(void **state) {
  (void)state;
  return kl_t_pg_group_start(KL_T_PG_RESTARTABLE);
}

int kl_t_pg_group_teardown(void **state) {
  (void)state;
  kl_t_pg_stop(t_pg);
  t_pg = NULL;
  return 0;
}

kl_t_pg_t *kl_t_pg_group(void) {
  return t_pg;
}

kl_t_pg_t *kl_t_pg_need(void) {
  if (!t_pg) {
    fprintf(stderr, "skipped: %s\n", t_why);
    skip();
  }
  return t_pg;
}
