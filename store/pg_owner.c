/*
 * The PostgreSQL store's record of each topic's owner (store_internal.h,
 * kl__store_owner_t): keylane_topic_owners (schema 11), written by a
 * worker's first acquire of the topic (in the acquire's statement, pg.c)
 * and by kl__store_bind().
 */
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "store/pg.h"
#include "store/store_internal.h"

typedef struct kl_pg_owner {
  const char *topic;
  kl__store_owner_t *owner;
  const kl__store_owner_t *set;
  int found;
} kl_pg_owner_t;

static kl_err_t owner_get_fn(kl__pg_conn_t *conn, void *opaque) {
  kl_pg_owner_t *o = opaque;
  const char *values[1] = {o->topic};
  PGresult *res = PQexecParams(conn->pg,
                               "SELECT cluster_id, group_id FROM "
                               "keylane_topic_owners WHERE topic = $1::text",
                               1, NULL, values, NULL, NULL, 0);
  if (!kl__pg_ok(res)) {
    kl_err_t err = kl__pg_err(conn->pg, res, "read the topic's owner");
    PQclear(res);
    return err;
  }
  o->found = PQntuples(res) == 1;
  if (o->found) {
    snprintf(o->owner->cluster, sizeof(o->owner->cluster), "%s",
             PQgetvalue(res, 0, 0));
    snprintf(o->owner->group, sizeof(o->owner->group), "%s",
             PQgetvalue(res, 0, 1));
  }
  PQclear(res);
  return KL_OK;
}

kl_err_t kl__pg_owner(kl_store_t *store, const char *topic,
                      kl__store_owner_t *owner) {
  kl_pg_owner_t o = {topic, owner, NULL, 0};
  kl_err_t err = kl__pg_call((kl__pg_t *)store, owner_get_fn, &o);
  if (!err && !o.found)
    return kl__err(KL_ENOTFOUND,
                   "the store records no owner of topic %s: no worker of "
                   "this version took it yet",
                   topic);
  return err;
}

static kl_err_t owner_set_fn(kl__pg_conn_t *conn, void *opaque) {
  kl_pg_owner_t *o = opaque;
  const char *values[3] = {o->topic, o->set->cluster, o->set->group};
  PGresult *res = PQexecParams(
      conn->pg,
      "INSERT INTO keylane_topic_owners (topic, cluster_id, group_id) "
      "VALUES ($1::text, $2::text, $3::text) ON CONFLICT (topic) DO UPDATE "
      "SET cluster_id = EXCLUDED.cluster_id, group_id = EXCLUDED.group_id",
      3, NULL, values, NULL, NULL, 0);
  kl_err_t err = kl__pg_ok(res)
                     ? KL_OK
                     : kl__pg_err(conn->pg, res, "record the topic's owner");
  PQclear(res);
  return err;
}

kl_err_t kl__pg_bind(kl_store_t *store, const char *topic,
                     const kl__store_owner_t *owner) {
  kl_pg_owner_t o = {topic, NULL, owner, 0};
  return kl__pg_call((kl__pg_t *)store, owner_set_fn, &o);
}
