/* The one msgpack reader (msgpack_read.h). */
#include <string.h>

#include "common/bytes.h"
#include "common/msgpack_read.h"

/* The formats 0xc0..0xdf: kind, width of the length or value that follows
 * (for fixext, 0xd4..0xd8, the body length instead, and no width). */
static const struct {
  uint8_t kind;
  uint8_t width;
  uint8_t fixed;
  const char *what;
} kl_formats[32] = {
    {KL__MP_NIL, 0, 0, "nil"},     {KL__MP_NEVER, 0, 0, "0xc1 (never used)"},
    {KL__MP_BOOL, 0, 0, "bool"},   {KL__MP_BOOL, 0, 0, "bool"},
    {KL__MP_BIN, 1, 0, "bin"},     {KL__MP_BIN, 2, 0, "bin"},
    {KL__MP_BIN, 4, 0, "bin"},     {KL__MP_EXT, 1, 0, "ext"},
    {KL__MP_EXT, 2, 0, "ext"},     {KL__MP_EXT, 4, 0, "ext"},
    {KL__MP_FLOAT, 4, 0, "float"}, {KL__MP_FLOAT, 8, 0, "float"},
    {KL__MP_INT, 1, 0, "int"},     {KL__MP_INT, 2, 0, "int"},
    {KL__MP_INT, 4, 0, "int"},     {KL__MP_INT, 8, 0, "int"},
    {KL__MP_INT, 1, 1, "int"},     {KL__MP_INT, 2, 1, "int"},
    {KL__MP_INT, 4, 1, "int"},     {KL__MP_INT, 8, 1, "int"},
    {KL__MP_EXT, 0, 1, "ext"},     {KL__MP_EXT, 0, 2, "ext"},
    {KL__MP_EXT, 0, 4, "ext"},     {KL__MP_EXT, 0, 8, "ext"},
    {KL__MP_EXT, 0, 16, "ext"},    {KL__MP_STR, 1, 0, "str"},
    {KL__MP_STR, 2, 0, "str"},     {KL__MP_STR, 4, 0, "str"},
    {KL__MP_ARRAY, 2, 0, "array"}, {KL__MP_ARRAY, 4, 0, "array"},
    {KL__MP_MAP, 2, 0, "map"},     {KL__MP_MAP, 4, 0, "map"},
};

kl__mp_reader_t kl__mp_reader(const void *data, size_t len) {
  static const uint8_t kl_no_bytes[1];
  const uint8_t *p = data ? data : kl_no_bytes; /* no arithmetic on NULL */
  return (kl__mp_reader_t){p, p, p + len};
}

size_t kl__mp_offset(const kl__mp_reader_t *rd) {
  return (size_t)(rd->p - rd->begin);
}

static bool mpr_take(kl__mp_reader_t *rd, uint64_t len, const uint8_t **out,
                     uint64_t *need) {
  if (len > (uint64_t)(rd->end - rd->p)) {
    *need = len;
    return false;
  }
  *out = rd->p;
  rd->p += len;
  return true;
}

/* Two's complement of the low @p width bytes of @p v, without relying on
 * implementation-defined conversions. */
static int64_t sign_extend(uint64_t v, unsigned width) {
  uint64_t mask = width == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * width)) - 1;
  uint64_t sign = (mask >> 1) + 1;
  return (v & sign) ? -(int64_t)(~v & mask) - 1 : (int64_t)v;
}

static double mpr_float(uint64_t bits, unsigned width) {
  if (width == 4) {
    uint32_t b32 = (uint32_t)bits;
    float f;
    memcpy(&f, &b32, sizeof(f));
    return f;
  }
  double d;
  memcpy(&d, &bits, sizeof(d));
  return d;
}

/* The value of an int or float, or the length or count of the others. */
static void mpr_argument(kl__mp_item_t *item, uint64_t v, unsigned width,
                         bool is_signed) {
  item->n = v;
  if (item->kind == KL__MP_FLOAT) {
    item->d = mpr_float(v, width);
  } else if (item->kind == KL__MP_INT && is_signed) {
    item->i = sign_extend(v, width);
  } else if (item->kind == KL__MP_INT) {
    item->big = v > INT64_MAX;
    item->i = item->big ? 0 : (int64_t)v;
  }
}

/* A 0xc0..0xdf format: its argument, then an ext's type byte. */
static bool mpr_wide(kl__mp_reader_t *rd, kl__mp_item_t *item, uint8_t b,
                     uint64_t *need) {
  unsigned width = kl_formats[b - 0xc0].width;
  unsigned fixed = kl_formats[b - 0xc0].fixed;
  item->kind = kl_formats[b - 0xc0].kind;
  item->what = kl_formats[b - 0xc0].what;
  item->b = b == 0xc3;
  const uint8_t *arg = NULL;
  if (!mpr_take(rd, width, &arg, need))
    return false;
  bool is_signed = item->kind == KL__MP_INT && fixed;
  mpr_argument(item, kl__get_be(arg, width), width, is_signed);
  if (item->kind != KL__MP_EXT)
    return true;
  if (fixed)
    item->n = fixed;
  const uint8_t *type = NULL;
  return mpr_take(rd, 1, &type, need);
}

static void mpr_fix(kl__mp_item_t *item, kl__mp_kind_t kind, const char *what,
                    uint64_t n) {
  item->kind = kind;
  item->what = what;
  item->n = n;
}

kl__mp_status_t kl__mp_next(kl__mp_reader_t *rd, kl__mp_item_t *item,
                            uint64_t *need) {
  *item = (kl__mp_item_t){.kind = KL__MP_NONE, .what = "nothing"};
  if (rd->p == rd->end) {
    *need = 1;
    return KL__MP_SHORT_HEAD;
  }
  uint8_t b = *rd->p++;
  if (b < 0x80 || b >= 0xe0) {
    mpr_fix(item, KL__MP_INT, "int", b);
    item->i = b < 0x80 ? b : (int64_t)b - 256;
  } else if (b < 0x90) {
    mpr_fix(item, KL__MP_MAP, "map", b & 0x0f);
  } else if (b < 0xa0) {
    mpr_fix(item, KL__MP_ARRAY, "array", b & 0x0f);
  } else if (b < 0xc0) {
    mpr_fix(item, KL__MP_STR, "str", b & 0x1f);
  } else if (!mpr_wide(rd, item, b, need)) {
    return KL__MP_SHORT_HEAD;
  }
  if (item->kind == KL__MP_STR || item->kind == KL__MP_BIN ||
      item->kind == KL__MP_EXT)
    return mpr_take(rd, item->n, &item->body, need) ? KL__MP_OK
                                                    : KL__MP_SHORT_BODY;
  return KL__MP_OK;
}

bool kl__mp_skip(kl__mp_reader_t *rd) {
  /* The items still to read: a container adds its elements. Each takes a
   * byte at least, so the count stays below twice the input's length. */
  uint64_t left = 1;
  while (left > 0) {
    kl__mp_item_t it;
    uint64_t need;
    if (kl__mp_next(rd, &it, &need) != KL__MP_OK)
      return false;
    left--;
    if (it.kind == KL__MP_ARRAY)
      left += it.n;
    else if (it.kind == KL__MP_MAP)
      left += 2 * it.n;
  }
  return true;
}
