/* What the store actions that list rows share; see store_list.h. */
#include "cli/store_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/strbuf.h"
#include "keylane/event.h"

/* @p v as a column of @p col shows it, into @p buf (@p size bytes). */
static const char *list_cell(const kl__store_col_t *col, const json_t *v,
                             char *buf, size_t size) {
  if (json_is_string(v) && !col->escaped)
    return kl__escape(buf, size, json_string_value(v), json_string_length(v));
  if (json_is_string(v))
    return json_string_value(v);
  if (json_is_integer(v)) {
    snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    return buf;
  }
  if (json_is_true(v) && col->yes)
    return col->yes;
  return col->none ? col->none : "-";
}

/* One line: the titles when @p row is NULL. */
static void list_line(const kl__store_col_t *cols, const json_t *row, char *buf,
                      size_t size) {
  for (const kl__store_col_t *c = cols; c->head; c++) {
    const char *text =
        row ? list_cell(c, json_object_get(row, c->field), buf, size) : c->head;
    printf("%s%*s", c == cols ? "" : " ", c->width, text);
  }
  putchar('\n');
}

void kl__store_list_table(const kl__store_col_t *cols, const json_t *rows,
                          const char *empty) {
  /* a key escaped is the longest cell */
  size_t i, size = KL__ESCAPED_SIZE(KL_KEY_MAX);
  json_t *row;
  char *buf = malloc(size);
  if (!json_array_size(rows) || !buf) {
    printf("%s\n", buf ? empty : "out of memory");
    free(buf);
    return;
  }
  list_line(cols, NULL, buf, size);
  json_array_foreach(rows, i, row) list_line(cols, row, buf, size);
  free(buf);
}

void kl__store_list_json(json_t *o) {
  json_dumpf(o, stdout, JSON_COMPACT);
  putchar('\n');
  json_decref(o);
}

int kl__store_list_open(const char *sub, const char *location,
                        const char *topic, kl__store_list_fn *run,
                        const void *args) {
  kl_store_t *store;
  int rc = kl__cli_store_existing(sub, location, &store);
  if (rc)
    return rc;
  if (!topic || !(rc = kl__cli_store_topic_known(sub, store, location, topic)))
    rc = run(store, args);
  kl_store_destroy(store);
  return rc;
}
