/*
 * JSON <-> msgpack and base64; the mapping and the limits are in the
 * header. The msgpack reader is written out instead of using
 * msgpack_unpack(), which allocates count * sizeof(msgpack_object) as soon
 * as it reads a container header: a payload comes from the network.
 */
#include "common/json_msgpack.h"
#include "common/msgpack_read.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "common/hash.h"
#include "common/internal.h"
#include "common/strbuf.h"

/* ---- JSON -> msgpack ---- */

/* A packer target that refuses to grow past max; one that only counts
 * (count), or writes into a buffer known to be large enough (fixed). */
typedef struct kl_mpbuf {
  char *data;
  size_t len, cap, max;
  int over;
  int count, fixed;
} kl_mpbuf_t;

static int mpbuf_write(void *opaque, const char *buf, size_t len) {
  kl_mpbuf_t *b = opaque;
  if (len > b->max - b->len) {
    b->over = 1;
    return -1;
  }
  if (b->count || b->fixed) {
    if (b->fixed)
      memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
  }
  char *data = kl__reserve(b->data, &b->cap, b->len + len, 1, 256);
  if (!data)
    return -1;
  b->data = data;
  memcpy(b->data + b->len, buf, len);
  b->len += len;
  return 0;
}

static int pack_json(msgpack_packer *pk, const json_t *v, int depth);

static int pack_str(msgpack_packer *pk, const char *s, size_t len) {
  int rc = msgpack_pack_str(pk, len);
  return len ? rc | msgpack_pack_str_body(pk, s, len) : rc;
}

static int pack_object(msgpack_packer *pk, const json_t *v, int depth) {
  const char *key;
  json_t *item;
  int rc = msgpack_pack_map(pk, json_object_size(v));
  json_object_foreach((json_t *)v, key, item) {
    if (rc)
      break;
    rc = pack_str(pk, key, strlen(key));
    rc = rc ? rc : pack_json(pk, item, depth + 1);
  }
  return rc;
}

static int pack_array(msgpack_packer *pk, const json_t *v, int depth) {
  size_t n = json_array_size(v);
  int rc = msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n && !rc; i++)
    rc = pack_json(pk, json_array_get(v, i), depth + 1);
  return rc;
}

/* @returns 0, -1 (write refused), or -2 (too deep). */
static int pack_json(msgpack_packer *pk, const json_t *v, int depth) {
  if (depth > KL_JSON_DEPTH_MAX)
    return -2;
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return pack_object(pk, v, depth);
  case JSON_ARRAY:
    return pack_array(pk, v, depth);
  case JSON_STRING:
    return pack_str(pk, json_string_value(v), json_string_length(v));
  case JSON_INTEGER:
    return msgpack_pack_int64(pk, (int64_t)json_integer_value(v));
  case JSON_REAL:
    return msgpack_pack_double(pk, json_real_value(v));
  case JSON_TRUE:
    return msgpack_pack_true(pk);
  case JSON_FALSE:
    return msgpack_pack_false(pk);
  case JSON_NULL:
  default:
    return msgpack_pack_nil(pk);
  }
}

static kl_err_t pack_failed(int rc, const kl_mpbuf_t *b, size_t max_size) {
  if (rc == -2)
    return kl__err(KL_EINVAL, "JSON nests deeper than %d levels",
                   KL_JSON_DEPTH_MAX);
  if (b->over)
    return kl__err(KL_EINVAL,
                   "JSON value packs to more than %zu bytes of "
                   "msgpack",
                   max_size);
  return kl__err(KL_ENOMEM, "out of memory packing a JSON value");
}

kl_err_t kl__json_to_msgpack(const json_t *value, size_t max_size, void **out,
                             size_t *out_len) {
  if (!value || !out || !out_len)
    return kl__err(KL_EINVAL, "kl__json_to_msgpack: value, out and out_len "
                              "are required");
  kl_mpbuf_t b = {.max = max_size};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &b, mpbuf_write);
  int rc = pack_json(&pk, value, 1);
  if (rc == 0) {
    *out = b.data ? b.data : malloc(1);
    *out_len = b.len;
    return *out ? KL_OK : kl__err(KL_ENOMEM, "out of memory");
  }
  free(b.data);
  return pack_failed(rc, &b, max_size);
}

/* What kl__json_to_msgpack_in() packs on its stack before asking for
 * memory: the payloads of most events. */
#define KL_MP_STACK 1024

kl_err_t kl__json_to_msgpack_in(const json_t *value, size_t max_size,
                                kl__alloc_fn_t *alloc, void *ctx,
                                const void **out, size_t *out_len) {
  if (!value || !alloc || !out || !out_len)
    return kl__err(KL_EINVAL, "kl__json_to_msgpack_in: value, alloc, out and "
                              "out_len are required");
  /* Packed on the stack and copied: one walk over the value. Longer than
   * the stack, it is walked twice (to measure, then to write in place):
   * still no malloc(). */
  char stack[KL_MP_STACK];
  bool small = max_size <= sizeof(stack);
  kl_mpbuf_t b = {
      .data = stack, .max = small ? max_size : sizeof(stack), .fixed = 1};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &b, mpbuf_write);
  int rc = pack_json(&pk, value, 1);
  if (rc && b.over && !small) {
    b = (kl_mpbuf_t){.max = max_size, .count = 1};
    rc = pack_json(&pk, value, 1);
  }
  if (rc)
    return pack_failed(rc, &b, max_size);
  char *data = alloc(ctx, b.len ? b.len : 1);
  if (!data)
    return kl__err(KL_ENOMEM, "out of memory for a %zu-byte payload", b.len);
  if (b.data == stack) {
    memcpy(data, stack, b.len);
  } else {
    /* Written where it stays: the size is known, nothing can fail. */
    b = (kl_mpbuf_t){.data = data, .max = b.len, .fixed = 1};
    pack_json(&pk, value, 1);
  }
  *out = data;
  *out_len = b.len;
  return KL_OK;
}

/* ---- msgpack -> JSON ---- */

static kl_err_t mprd_fail(const kl__mp_reader_t *rd, const char *what) {
  return kl__err(KL_EINVAL, "msgpack at byte %zu: %s", kl__mp_offset(rd), what);
}

static kl_err_t mp_value(kl__mp_reader_t *rd, int depth, int nest,
                         json_t **out);
static kl_err_t mp_short(kl__mp_reader_t *rd, const kl__mp_item_t *it,
                         kl__mp_status_t status);

/* Every element takes at least one byte: a count above the bytes left is
 * truncated input, found before anything is allocated. */
static kl_err_t mp_count_check(const kl__mp_reader_t *rd, uint64_t n,
                               unsigned per) {
  if (n > (uint64_t)(rd->end - rd->p) / per)
    return mprd_fail(rd, "a container claims more elements than bytes "
                         "remain (truncated)");
  return KL_OK;
}

static kl_err_t mp_array(kl__mp_reader_t *rd, uint64_t n, int depth, int nest,
                         json_t **out) {
  kl_err_t err = mp_count_check(rd, n, 1);
  json_t *arr = err ? NULL : json_array();
  if (!err && !arr)
    err = kl__err(KL_ENOMEM, "out of memory");
  for (uint64_t i = 0; i < n && !err; i++) {
    json_t *item;
    if (!(err = mp_value(rd, depth + 1, nest, &item)) &&
        json_array_append_new(arr, item))
      err = kl__err(KL_ENOMEM, "out of memory");
  }
  if (err)
    json_decref(arr);
  else
    *out = arr;
  return err;
}

/* JSON keys are strings: anything else is refused before it is read, as
 * is one that is not UTF-8. @returns the key, borrowed from the input, in
 * @p key, and where it starts in @p at. */
static kl_err_t mp_key_read(kl__mp_reader_t *rd, kl__mp_reader_t *at,
                            const char **key, size_t *len) {
  uint8_t b = rd->p < rd->end ? *rd->p : 0xa0;
  if (!((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)))
    return mprd_fail(rd, "a map key is not a string; JSON keys are");
  *at = *rd;
  kl__mp_item_t it;
  uint64_t need;
  kl__mp_status_t status = kl__mp_next(rd, &it, &need);
  if (status != KL__MP_OK)
    return mp_short(rd, &it, status);
  *key = (const char *)it.body;
  *len = (size_t)it.n;
  if (kl__utf8_valid_len(*key, *len, true) < *len)
    return mprd_fail(at, "a string is not valid UTF-8");
  return KL_OK;
}

/* A key the JSON reader would refuse besides: a NUL in it, or one seen
 * before in the map (JSON_REJECT_DUPLICATES), so that one body means one
 * thing in either encoding. */
static kl_err_t mp_key_refused(const kl__mp_reader_t *at, const char *key,
                               size_t len, const char *why) {
  /* Escaped: "%s" of a key that holds a NUL would show it cut there. */
  char shown[KL__ESCAPED_SIZE(64)];
  return kl__err(KL_EINVAL, "msgpack at byte %zu: the map key \"%s\" %s",
                 kl__mp_offset(at), kl__escape(shown, sizeof(shown), key, len),
                 why);
}

/* The key goes into @p obj at once, holding null until its value is read:
 * that one insertion says, by the map's size, whether it was there before,
 * where a string value made of it, a lookup and the insertion took twice
 * the work. */
static kl_err_t mp_key(kl__mp_reader_t *rd, json_t *obj, const char **key,
                       size_t *len) {
  kl__mp_reader_t at;
  kl_err_t err = mp_key_read(rd, &at, key, len);
  if (err)
    return err;
  size_t before = json_object_size(obj);
  if (json_object_setn_new_nocheck(obj, *key, *len, json_null()))
    return kl__err(KL_ENOMEM, "out of memory");
  if (memchr(*key, '\0', *len))
    return mp_key_refused(&at, *key, *len, "holds a NUL byte");
  if (json_object_size(obj) == before)
    return mp_key_refused(&at, *key, *len, "appears twice");
  return KL_OK;
}

static kl_err_t mp_map(kl__mp_reader_t *rd, uint64_t n, int depth, int nest,
                       json_t **out) {
  kl_err_t err = mp_count_check(rd, n, 2);
  json_t *obj = err ? NULL : json_object();
  if (!err && !obj)
    err = kl__err(KL_ENOMEM, "out of memory");
  for (uint64_t i = 0; i < n && !err; i++) {
    const char *key = NULL;
    size_t len = 0;
    json_t *item;
    if (!(err = mp_key(rd, obj, &key, &len)) &&
        !(err = mp_value(rd, depth + 1, nest, &item)) &&
        json_object_setn_new_nocheck(obj, key, len, item))
      err = kl__err(KL_ENOMEM, "out of memory");
  }
  if (err)
    json_decref(obj);
  else
    *out = obj;
  return err;
}

static kl_err_t mp_bin(const kl__mp_item_t *it, json_t **out) {
  size_t len = kl__base64_encoded_len((size_t)it->n);
  char small[1024];
  char *text = len < sizeof(small) ? small : malloc(len + 1);
  if (!text)
    return kl__err(KL_ENOMEM, "out of memory");
  kl__base64_encode(it->body, (size_t)it->n, text);
  json_t *obj = json_object();
  /* The value's reference is the object's, or let go of on failure. */
  int failed = json_object_set_new_nocheck(obj, "$base64",
                                           json_stringn_nocheck(text, len));
  if (text != small)
    free(text);
  if (failed) {
    json_decref(obj);
    return kl__err(KL_ENOMEM, "out of memory");
  }
  *out = obj;
  return KL_OK;
}

static kl_err_t mp_short(kl__mp_reader_t *rd, const kl__mp_item_t *it,
                         kl__mp_status_t status) {
  char what[64];
  if (it->kind == KL__MP_NONE)
    return mprd_fail(rd, "input ends where a value should be (truncated)");
  snprintf(what, sizeof(what), "a %s %s (truncated)", it->what,
           status == KL__MP_SHORT_BODY ? "runs past the end"
                                       : "ends in its header");
  return mprd_fail(rd, what);
}

/* What a scalar must be to have a JSON form: @returns KL_OK, or the fault
 * at offset @p at. */
static kl_err_t mp_scalar_check(const kl__mp_reader_t *rd, size_t at,
                                const kl__mp_item_t *it) {
  kl__mp_reader_t here = *rd;
  here.p = here.begin + at;
  switch (it->kind) {
  case KL__MP_INT:
    return it->big ? mprd_fail(&here, "an integer above 2^63-1 has no JSON "
                                      "form here")
                   : KL_OK;
  case KL__MP_FLOAT:
    return isfinite(it->d)
               ? KL_OK
               : mprd_fail(&here, "NaN or infinity has no JSON form");
  case KL__MP_STR:
    return kl__utf8_valid_len((const char *)it->body, (size_t)it->n, true) <
                   it->n
               ? mprd_fail(&here, "a string is not valid UTF-8")
               : KL_OK;
  case KL__MP_EXT:
    return mprd_fail(&here, "ext values have no JSON form");
  case KL__MP_NEVER:
    return mprd_fail(&here, "0xc1 is not a msgpack type");
  default:
    return KL_OK;
  }
}

/* The scalars; a container's elements are read by the caller. */
static kl_err_t mp_scalar(const kl__mp_reader_t *rd, size_t at,
                          const kl__mp_item_t *it, json_t **out) {
  kl_err_t err = mp_scalar_check(rd, at, it);
  if (err)
    return err;
  switch (it->kind) {
  case KL__MP_NIL:
    *out = json_null();
    return KL_OK;
  case KL__MP_BOOL:
    *out = json_boolean(it->b);
    return KL_OK;
  case KL__MP_INT:
    *out = json_integer((json_int_t)it->i);
    break;
  case KL__MP_FLOAT:
    *out = json_real(it->d);
    break;
  case KL__MP_STR:
    *out = json_stringn_nocheck((const char *)it->body, (size_t)it->n);
    break;
  default: /* KL__MP_BIN: the only kind left that mp_scalar_check() lets by */
    return mp_bin(it, out);
  }
  return *out ? KL_OK : kl__err(KL_ENOMEM, "out of memory");
}

/* Reads the head of the value at @p rd, nested @p depth deep (every value
 * counted) and checked against @p nest levels unless 0: KL_JSON_DEPTH_MAX
 * as kl__json_to_msgpack() packs, or JSON_PARSER_MAX_DEPTH for a whole
 * body, as jansson reads a JSON text. An item, or a container's count;
 * @p at gets its offset. */
static kl_err_t mp_head(kl__mp_reader_t *rd, int depth, int nest, size_t *at,
                        kl__mp_item_t *it) {
  *at = kl__mp_offset(rd);
  if (nest && depth > nest)
    return mprd_fail(rd, "nesting is deeper than the limit");
  uint64_t need;
  kl__mp_status_t status = kl__mp_next(rd, it, &need);
  return status == KL__MP_OK ? KL_OK : mp_short(rd, it, status);
}

static kl_err_t mp_value(kl__mp_reader_t *rd, int depth, int nest,
                         json_t **out) {
  size_t at;
  kl__mp_item_t it;
  kl_err_t err = mp_head(rd, depth, nest, &at, &it);
  if (err)
    return err;
  if (it.kind == KL__MP_ARRAY)
    return mp_array(rd, it.n, depth, nest, out);
  if (it.kind == KL__MP_MAP)
    return mp_map(rd, it.n, depth, nest, out);
  return mp_scalar(rd, at, &it, out);
}

static kl_err_t mp_to_json(const void *data, size_t len, int nest,
                           json_t **out) {
  if ((!data && len) || !out)
    return kl__err(KL_EINVAL, "kl__msgpack_to_json: data and out are required");
  kl__mp_reader_t rd = kl__mp_reader(data, len);
  json_t *value;
  kl_err_t err = mp_value(&rd, 1, nest, &value);
  if (err)
    return err;
  if (rd.p != rd.end) {
    json_decref(value);
    return mprd_fail(&rd, "trailing bytes after the value");
  }
  *out = value;
  return KL_OK;
}

kl_err_t kl__msgpack_to_json(const void *data, size_t len, json_t **out) {
  return mp_to_json(data, len, KL_JSON_DEPTH_MAX, out);
}

kl_err_t kl__msgpack_body_to_json(const void *data, size_t len, json_t **out) {
  return mp_to_json(data, len, JSON_PARSER_MAX_DEPTH, out);
}

/* ---- msgpack -> the msgpack of its JSON form ---- */

/* One walk of kl__msgpack_repack_in() over a value: it checks the value
 * by kl__msgpack_to_json()'s rules when check is set, and writes what
 * kl__json_to_msgpack() makes of its JSON form into b when write is. */
typedef struct kl_repack {
  kl_mpbuf_t b;
  msgpack_packer pk;
  bool check, write;
  int nest;   /**< the limit a check holds it to */
  size_t max; /**< the caller's max_size, for the message */
  kl__alloc_fn_t *alloc;
  void *ctx;
} kl_repack_t;

/* A map's keys so far, to find one given twice: a list on the stack for
 * a map of at most KL_KEYSET_LIST keys (an event's, mostly), else open
 * addressing over a table of at least twice the map's entries. */
enum { KL_KEYSET_LIST = 8 };
typedef struct kl_keyslot {
  const char *p; /**< NULL: free */
  size_t len;
} kl_keyslot_t;
typedef struct kl_keyset {
  kl_keyslot_t list[KL_KEYSET_LIST], *table;
  size_t listed; /**< keys in list, or SIZE_MAX: in table */
  size_t mask;
} kl_keyset_t;

static kl_err_t keyset_init(kl_keyset_t *ks, uint64_t n, kl_repack_t *w) {
  ks->listed = n <= KL_KEYSET_LIST ? 0 : SIZE_MAX;
  if (ks->listed == 0)
    return KL_OK;
  size_t size = 2 * KL_KEYSET_LIST;
  while (size < 2 * n) /* n is at most the bytes left: no overflow */
    size *= 2;
  ks->table = w->alloc(w->ctx, size * sizeof(ks->table[0]));
  if (!ks->table)
    return kl__err(KL_ENOMEM, "out of memory for a map of %" PRIu64 " keys", n);
  memset(ks->table, 0, size * sizeof(ks->table[0]));
  ks->mask = size - 1;
  return KL_OK;
}

/* Adds @p key. @returns whether it was there already. */
static bool keyset_seen(kl_keyset_t *ks, const char *key, size_t len) {
  if (ks->listed != SIZE_MAX) {
    for (size_t i = 0; i < ks->listed; i++)
      if (ks->list[i].len == len && memcmp(ks->list[i].p, key, len) == 0)
        return true;
    ks->list[ks->listed++] = (kl_keyslot_t){key ? key : "", len};
    return false;
  }
  for (size_t i = (size_t)kl__hash(key, len) & ks->mask;;
       i = (i + 1) & ks->mask) {
    kl_keyslot_t *s = &ks->table[i];
    if (!s->p) {
      *s = (kl_keyslot_t){key ? key : "", len};
      return false;
    }
    if (s->len == len && memcmp(s->p, key, len) == 0)
      return true;
  }
}

static kl_err_t rp_full(const kl_repack_t *w) {
  if (w->b.over)
    return kl__err(KL_EINVAL,
                   "JSON value packs to more than %zu bytes of "
                   "msgpack",
                   w->max);
  return kl__err(KL_ENOMEM, "out of memory packing a value");
}

/* A bin's JSON form, {"$base64": STR}, its text written a piece at a time. */
static int rp_bin(kl_repack_t *w, const kl__mp_item_t *it) {
  enum { PIECE = 768 }; /* a multiple of 3: no padding but in the last */
  size_t n = (size_t)it->n;
  int rc = msgpack_pack_map(&w->pk, 1);
  rc = rc ? rc : pack_str(&w->pk, "$base64", 7);
  rc = rc ? rc : msgpack_pack_str(&w->pk, kl__base64_encoded_len(n));
  if (w->b.count) /* measured: the text's length is enough */
    return rc ? rc : mpbuf_write(&w->b, NULL, kl__base64_encoded_len(n));
  char text[PIECE / 3 * 4 + 1];
  for (size_t i = 0; i < n && !rc; i += PIECE) {
    size_t take = n - i < PIECE ? n - i : PIECE;
    kl__base64_encode(it->body + i, take, text);
    rc = msgpack_pack_str_body(&w->pk, text, kl__base64_encoded_len(take));
  }
  return rc;
}

static kl_err_t rp_value(kl_repack_t *w, kl__mp_reader_t *rd, int depth);

static kl_err_t rp_map(kl_repack_t *w, kl__mp_reader_t *rd, uint64_t n,
                       int depth) {
  kl_keyset_t ks = {.table = NULL}; /* set up only when checking */
  kl_err_t err = w->check ? keyset_init(&ks, n, w) : KL_OK;
  if (!err && w->write && msgpack_pack_map(&w->pk, (size_t)n))
    err = rp_full(w);
  for (uint64_t i = 0; i < n && !err; i++) {
    kl__mp_reader_t at;
    const char *key;
    size_t len;
    err = mp_key_read(rd, &at, &key, &len);
    if (!err && w->check && memchr(key, '\0', len))
      err = mp_key_refused(&at, key, len, "holds a NUL byte");
    if (!err && w->check && keyset_seen(&ks, key, len))
      err = mp_key_refused(&at, key, len, "appears twice");
    if (!err && w->write && pack_str(&w->pk, key, len))
      err = rp_full(w);
    if (!err)
      err = rp_value(w, rd, depth + 1);
  }
  return err;
}

static kl_err_t rp_value(kl_repack_t *w, kl__mp_reader_t *rd, int depth) {
  size_t at;
  kl__mp_item_t it;
  kl_err_t err = mp_head(rd, depth, w->check ? w->nest : 0, &at, &it);
  if (err)
    return err;
  bool box = it.kind == KL__MP_ARRAY || it.kind == KL__MP_MAP;
  err = !w->check ? KL_OK
        : box     ? mp_count_check(rd, it.n, it.kind == KL__MP_MAP ? 2 : 1)
                  : mp_scalar_check(rd, at, &it);
  if (err)
    return err;
  if (it.kind == KL__MP_MAP)
    return rp_map(w, rd, it.n, depth);
  if (it.kind == KL__MP_ARRAY) {
    if (w->write && msgpack_pack_array(&w->pk, (size_t)it.n))
      return rp_full(w);
    for (uint64_t i = 0; i < it.n && !err; i++)
      err = rp_value(w, rd, depth + 1);
    return err;
  }
  if (!w->write)
    return KL_OK;
  int rc;
  switch (it.kind) {
  case KL__MP_NIL:
    rc = msgpack_pack_nil(&w->pk);
    break;
  case KL__MP_BOOL:
    rc = it.b ? msgpack_pack_true(&w->pk) : msgpack_pack_false(&w->pk);
    break;
  case KL__MP_INT:
    rc = msgpack_pack_int64(&w->pk, it.i);
    break;
  case KL__MP_FLOAT:
    rc = msgpack_pack_double(&w->pk, it.d);
    break;
  case KL__MP_STR:
    rc = pack_str(&w->pk, (const char *)it.body, (size_t)it.n);
    break;
  default: /* KL__MP_BIN: the only kind left that mp_scalar_check() lets by */
    rc = rp_bin(w, &it);
    break;
  }
  return rc ? rp_full(w) : KL_OK;
}

kl_err_t kl__msgpack_repack_in(kl__mp_reader_t *rd, int depth, size_t max_size,
                               kl__alloc_fn_t *alloc, void *ctx,
                               const void **out, size_t *out_len) {
  if (!rd || !alloc || !out || !out_len)
    return kl__err(KL_EINVAL, "kl__msgpack_repack_in: rd, alloc, out and "
                              "out_len are required");
  /* As kl__json_to_msgpack_in(): packed on the stack and copied, or
   * walked again to measure and a third time to write in place. */
  const kl__mp_reader_t start = *rd;
  char stack[KL_MP_STACK];
  bool small = max_size <= sizeof(stack);
  kl_repack_t w = {.check = true,
                   .write = true,
                   .nest = KL_JSON_DEPTH_MAX,
                   .max = max_size,
                   .alloc = alloc,
                   .ctx = ctx};
  w.b = (kl_mpbuf_t){
      .data = stack, .max = small ? max_size : sizeof(stack), .fixed = 1};
  msgpack_packer_init(&w.pk, &w.b, mpbuf_write);
  kl_err_t err = rp_value(&w, rd, depth);
  if (err && w.b.over && !small) {
    *rd = start;
    w.b = (kl_mpbuf_t){.max = max_size, .count = 1};
    err = rp_value(&w, rd, depth);
  }
  if (err)
    return err;
  char *data = alloc(ctx, w.b.len ? w.b.len : 1);
  if (!data)
    return kl__err(KL_ENOMEM, "out of memory for a %zu-byte payload", w.b.len);
  if (w.b.data == stack) {
    memcpy(data, stack, w.b.len);
  } else {
    /* Checked and measured: written where it stays, nothing can fail. */
    const kl__mp_reader_t end = *rd;
    *rd = start;
    w.check = false;
    w.b = (kl_mpbuf_t){.data = data, .max = w.b.len, .fixed = 1};
    rp_value(&w, rd, depth);
    *rd = end;
  }
  *out = data;
  *out_len = w.b.len;
  return KL_OK;
}

kl_err_t kl__msgpack_check(const void *data, size_t len, kl__alloc_fn_t *alloc,
                           void *ctx) {
  kl__mp_reader_t rd = kl__mp_reader(data, len);
  kl_repack_t w = {
      .check = true, .nest = JSON_PARSER_MAX_DEPTH, .alloc = alloc, .ctx = ctx};
  kl_err_t err = rp_value(&w, &rd, 1);
  if (!err && rd.p != rd.end)
    err = mprd_fail(&rd, "trailing bytes after the value");
  return err;
}

/* ---- base64 ---- */

static const char kl_b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t kl__base64_encoded_len(size_t len) {
  return (len + 2) / 3 * 4;
}

void kl__base64_encode(const void *data, size_t len, char *out) {
  const uint8_t *p = data;
  size_t i = 0;
  for (; i + 2 < len; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *out++ = kl_b64[v >> 18];
    *out++ = kl_b64[(v >> 12) & 63];
    *out++ = kl_b64[(v >> 6) & 63];
    *out++ = kl_b64[v & 63];
  }
  if (i < len) {
    uint32_t v =
        (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0);
    *out++ = kl_b64[v >> 18];
    *out++ = kl_b64[(v >> 12) & 63];
    *out++ = i + 1 < len ? kl_b64[(v >> 6) & 63] : '=';
    *out++ = '=';
  }
  *out = '\0';
}

/* Each character's value plus one; 0 for one that is not base64 ('='
 * and NUL included): a lookup, where a search of kl_b64 took a fifth of
 * a msgpack gateway request's time. */
static const uint8_t kl_b64_value[256] = {
    ['A'] = 1,  ['B'] = 2,  ['C'] = 3,  ['D'] = 4,  ['E'] = 5,  ['F'] = 6,
    ['G'] = 7,  ['H'] = 8,  ['I'] = 9,  ['J'] = 10, ['K'] = 11, ['L'] = 12,
    ['M'] = 13, ['N'] = 14, ['O'] = 15, ['P'] = 16, ['Q'] = 17, ['R'] = 18,
    ['S'] = 19, ['T'] = 20, ['U'] = 21, ['V'] = 22, ['W'] = 23, ['X'] = 24,
    ['Y'] = 25, ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29, ['d'] = 30,
    ['e'] = 31, ['f'] = 32, ['g'] = 33, ['h'] = 34, ['i'] = 35, ['j'] = 36,
    ['k'] = 37, ['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41, ['p'] = 42,
    ['q'] = 43, ['r'] = 44, ['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48,
    ['w'] = 49, ['x'] = 50, ['y'] = 51, ['z'] = 52, ['0'] = 53, ['1'] = 54,
    ['2'] = 55, ['3'] = 56, ['4'] = 57, ['5'] = 58, ['6'] = 59, ['7'] = 60,
    ['8'] = 61, ['9'] = 62, ['+'] = 63, ['/'] = 64};

static int b64_value(char c) {
  return (int)kl_b64_value[(unsigned char)c] - 1;
}

/* Decodes one 4-character group; @p last allows its padding. */
static int b64_group(const char *s, int last, uint8_t *out, size_t *n) {
  int v[4];
  int pad = last ? (s[3] == '=') + (s[2] == '=' && s[3] == '=') : 0;
  for (int i = 0; i < 4 - pad; i++)
    if ((v[i] = b64_value(s[i])) < 0)
      return i;
  for (int i = 4 - pad; i < 4; i++)
    v[i] = 0;
  uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
               (uint32_t)v[2] << 6 | (uint32_t)v[3];
  out[0] = (uint8_t)(w >> 16);
  out[1] = (uint8_t)(w >> 8);
  out[2] = (uint8_t)w;
  *n = 3 - (size_t)pad;
  return -1;
}

/* Decodes @p text into @p buf (len / 4 * 3 + 1 bytes), @p len a multiple
 * of 4. */
static kl_err_t b64_decode_into(const char *text, size_t len, uint8_t *buf,
                                size_t *out_len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t n = 0, i = 0;
  /* The groups before the last, where no padding may be: four lookups
   * and one test each. A group with a character outside the alphabet is
   * left to b64_group(), which names it. */
  for (; i + 4 < len; i += 4) {
    uint32_t a = kl_b64_value[s[i]], b = kl_b64_value[s[i + 1]],
             c = kl_b64_value[s[i + 2]], d = kl_b64_value[s[i + 3]];
    if (!a || !b || !c || !d)
      break;
    uint32_t w = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6 | (d - 1);
    buf[n++] = (uint8_t)(w >> 16);
    buf[n++] = (uint8_t)(w >> 8);
    buf[n++] = (uint8_t)w;
  }
  for (; i < len; i += 4) {
    size_t got;
    int bad = b64_group(text + i, i + 4 == len, buf + n, &got);
    if (bad >= 0)
      return kl__err(KL_EINVAL,
                     "base64 has an invalid character at offset "
                     "%zu",
                     i + (size_t)bad);
    n += got;
  }
  *out_len = n;
  return KL_OK;
}

static kl_err_t b64_len_check(size_t len) {
  if (len % 4)
    return kl__err(KL_EINVAL,
                   "base64 is %zu characters, not a multiple of 4 "
                   "(padding with '=' is required)",
                   len);
  return KL_OK;
}

kl_err_t kl__base64_decode(const char *text, size_t len, void **out,
                           size_t *out_len) {
  kl_err_t err = b64_len_check(len);
  if (err)
    return err;
  uint8_t *buf = malloc(len / 4 * 3 + 1);
  if (!buf)
    return kl__err(KL_ENOMEM, "out of memory decoding base64");
  if ((err = b64_decode_into(text, len, buf, out_len))) {
    free(buf);
    return err;
  }
  *out = buf;
  return KL_OK;
}

kl_err_t kl__base64_decode_in(const char *text, size_t len,
                              kl__alloc_fn_t *alloc, void *ctx,
                              const void **out, size_t *out_len) {
  kl_err_t err = b64_len_check(len);
  if (err)
    return err;
  uint8_t *buf = alloc(ctx, len / 4 * 3 + 1);
  if (!buf)
    return kl__err(KL_ENOMEM, "out of memory decoding base64");
  if ((err = b64_decode_into(text, len, buf, out_len)))
    return err; /* the allocator's: it is not freed one by one */
  *out = buf;
  return KL_OK;
}
