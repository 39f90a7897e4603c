/*
 * keylane._speedups: the publish path's checks, envelope and partition in
 * one call, for Publisher.publish(). Optional: when it cannot be built,
 * the package runs the same rules in Python (keylane/envelope.py,
 * keylane/routing.py), and tests/test_speedups.py checks that both give
 * the same bytes and partitions.
 *
 * make_id(now_ms) -> str: a UUIDv7 as keylane.envelope makes it (and
 *   kl_event_make_id()); forget_ids() drops the random pool (in a child
 *   after fork(), which must not reuse the parent's bytes).
 * encode(key, type, id, ts, payload, partitions) -> (envelope, partition)
 *   key bytes, type str, id str, ts int, payload bytes, partitions int.
 *   Returns None for anything it does not take (a limit broken, a
 *   surrogate, a reserved id or type, ts past int64): the caller then
 *   takes the Python path, which raises the error that names it. A delayed
 *   event (version 2) always takes the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define KEY_MAX 1024
#define ID_MAX 255
#define TYPE_MAX 255
#define PAYLOAD_MAX (1022 * 1024)
#define RECORD_MAX (1048588 - 128)

static uint32_t murmur2(const unsigned char *data, Py_ssize_t len) {
  const uint32_t m = 0x5bd1e995u;
  uint32_t h = 0x9747b28cu ^ (uint32_t)len;
  Py_ssize_t words = len / 4;
  for (Py_ssize_t i = 0; i < words; i++) {
    const unsigned char *p = data + i * 4;
    uint32_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    k *= m;
    k ^= k >> 24;
    k *= m;
    h *= m;
    h ^= k;
  }
  const unsigned char *tail = data + words * 4;
  switch (len & 3) {
  case 3:
    h ^= (uint32_t)tail[2] << 16;
    /* fall through */
  case 2:
    h ^= (uint32_t)tail[1] << 8;
    /* fall through */
  case 1:
    h ^= tail[0];
    h *= m;
  }
  h ^= h >> 13;
  h *= m;
  h ^= h >> 15;
  return h;
}

static size_t str_size(size_t n) {
  return n + (n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5);
}

static size_t bin_size(size_t n) {
  return n + (n < 256 ? 2 : n < 65536 ? 3 : 5);
}

static unsigned char *put_be(unsigned char *o, unsigned char format, uint64_t v,
                             int width) {
  *o++ = format;
  for (int i = width - 1; i >= 0; i--)
    *o++ = (unsigned char)(v >> (8 * i));
  return o;
}

static unsigned char *put_len(unsigned char *o, unsigned char format8,
                              size_t n) {
  if (n < 256)
    return put_be(o, format8, n, 1);
  if (n < 65536)
    return put_be(o, (unsigned char)(format8 + 1), n, 2);
  return put_be(o, (unsigned char)(format8 + 2), n, 4);
}

static unsigned char *put_str(unsigned char *o, const char *s, size_t n) {
  if (n < 32)
    *o++ = (unsigned char)(0xa0 | n);
  else
    o = put_len(o, 0xd9, n);
  memcpy(o, s, n);
  return o + n;
}

static unsigned char *put_int(unsigned char *o, int64_t v) {
  if (v >= 0 && v < 128) {
    *o++ = (unsigned char)v;
    return o;
  }
  if (v >= 0)
    return v < 256            ? put_be(o, 0xcc, (uint64_t)v, 1)
           : v < 65536        ? put_be(o, 0xcd, (uint64_t)v, 2)
           : v < 4294967296LL ? put_be(o, 0xce, (uint64_t)v, 4)
                              : put_be(o, 0xcf, (uint64_t)v, 8);
  if (v >= -32) {
    *o++ = (unsigned char)(v & 0xff);
    return o;
  }
  return v >= -128            ? put_be(o, 0xd0, (uint64_t)v, 1)
         : v >= -32768        ? put_be(o, 0xd1, (uint64_t)v, 2)
         : v >= -2147483648LL ? put_be(o, 0xd2, (uint64_t)v, 4)
                              : put_be(o, 0xd3, (uint64_t)v, 8);
}

static size_t int_size(int64_t v) {
  if (v >= -32 && v < 128)
    return 1;
  if (v >= 0)
    return v < 256 ? 2 : v < 65536 ? 3 : v < 4294967296LL ? 5 : 9;
  return v >= -128 ? 2 : v >= -32768 ? 3 : v >= -2147483648LL ? 5 : 9;
}

/* UTF-8 of a str, or NULL (error cleared) for one with surrogates. */
static const char *utf8(PyObject *s, Py_ssize_t *n) {
  const char *p = PyUnicode_AsUTF8AndSize(s, n);
  if (!p)
    PyErr_Clear();
  return p;
}

static PyObject *encode(PyObject *self, PyObject *const *args,
                        Py_ssize_t nargs) {
  (void)self;
  if (nargs != 6 || !PyBytes_CheckExact(args[0]) ||
      !PyUnicode_CheckExact(args[1]) || !PyUnicode_CheckExact(args[2]) ||
      !PyLong_CheckExact(args[3]) || !PyBytes_CheckExact(args[4]))
    Py_RETURN_NONE;
  Py_ssize_t key_len = PyBytes_GET_SIZE(args[0]);
  const unsigned char *key = (const unsigned char *)PyBytes_AS_STRING(args[0]);
  Py_ssize_t type_len, id_len;
  const char *type = utf8(args[1], &type_len);
  const char *id = utf8(args[2], &id_len);
  int overflow = 0;
  long long ts = PyLong_AsLongLongAndOverflow(args[3], &overflow);
  long partitions = PyLong_AsLong(args[5]);
  Py_ssize_t payload_len = PyBytes_GET_SIZE(args[4]);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  if (key_len < 1 || key_len > KEY_MAX || !type || type_len < 1 ||
      type_len > TYPE_MAX || type[0] == '~' || !id || id_len < 1 ||
      id_len > ID_MAX || id[0] == '~' || memchr(id, 0, (size_t)id_len) ||
      overflow || payload_len > PAYLOAD_MAX || partitions < 1)
    Py_RETURN_NONE;
  size_t size = 1 + 2 + 1 + 3 + str_size((size_t)id_len) + 2 +
                str_size((size_t)type_len) + 3 + int_size(ts) + 2 +
                bin_size((size_t)payload_len);
  if ((size_t)key_len + size > RECORD_MAX)
    Py_RETURN_NONE;
  PyObject *value = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
  if (!value)
    return NULL;
  unsigned char *o = (unsigned char *)PyBytes_AS_STRING(value);
  memcpy(o, "\x85\xa1v\x01\xa2id", 7);
  o = put_str(o + 7, id, (size_t)id_len);
  memcpy(o, "\xa1t", 2);
  o = put_str(o + 2, type, (size_t)type_len);
  memcpy(o, "\xa2ts", 3);
  o = put_int(o + 3, ts);
  memcpy(o, "\xa1p", 2);
  o = put_len(o + 2, 0xc4, (size_t)payload_len);
  memcpy(o, PyBytes_AS_STRING(args[4]), (size_t)payload_len);
  long partition =
      (long)((murmur2(key, key_len) & 0x7fffffffu) % (uint32_t)partitions);
  PyObject *part = PyLong_FromLong(partition);
  if (!part) {
    Py_DECREF(value);
    return NULL;
  }
  PyObject *out = PyTuple_New(2);
  if (!out) {
    Py_DECREF(value);
    Py_DECREF(part);
    return NULL;
  }
  PyTuple_SET_ITEM(out, 0, value);
  PyTuple_SET_ITEM(out, 1, part);
  return out;
}

/* The id state: guarded by the GIL, which every call holds. */
enum { ID_RANDOM = 10, ID_BATCH = 400 };
static unsigned char id_pool[ID_RANDOM * ID_BATCH];
static size_t id_used = sizeof(id_pool);
static uint64_t id_last;

static int id_refill(void) {
  for (size_t off = 0; off < sizeof(id_pool); off += 200)
    if (getentropy(id_pool + off, 200) != 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
  id_used = 0;
  return 0;
}

static PyObject *make_id(PyObject *self, PyObject *arg) {
  (void)self;
  long long now_ms = PyLong_AsLongLong(arg);
  if (now_ms == -1 && PyErr_Occurred())
    return NULL;
  if (id_used == sizeof(id_pool) && id_refill() != 0)
    return NULL;
  const unsigned char *rnd = id_pool + id_used;
  id_used += ID_RANDOM;
  uint64_t stamp =
      ((uint64_t)now_ms << 12) | ((uint64_t)(rnd[0] & 0x07) << 8) | rnd[1];
  if (stamp <= id_last)
    stamp = id_last + 1;
  id_last = stamp;
  unsigned char b[16];
  for (int i = 0; i < 6; i++)
    b[i] = (unsigned char)(stamp >> (52 - 8 * i));
  b[6] = (unsigned char)(0x70 | ((stamp >> 8) & 0x0f));
  b[7] = (unsigned char)stamp;
  b[8] = (unsigned char)(0x80 | (rnd[2] & 0x3f));
  memcpy(b + 9, rnd + 3, 7);
  static const char hex[] = "0123456789abcdef";
  static const unsigned char at[16] = {0,  2,  4,  6,  9,  11, 14, 16,
                                       19, 21, 24, 26, 28, 30, 32, 34};
  char out[36];
  for (int i = 0; i < 16; i++) {
    out[at[i]] = hex[b[i] >> 4];
    out[at[i] + 1] = hex[b[i] & 0x0f];
  }
  out[8] = out[13] = out[18] = out[23] = '-';
  return PyUnicode_FromStringAndSize(out, 36);
}

static PyObject *forget_ids(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  id_used = sizeof(id_pool);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"make_id", make_id, METH_O, "make_id(now_ms) -> a UUIDv7 id"},
    {"forget_ids", forget_ids, METH_NOARGS,
     "drops the random pool (after fork, in the child)"},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(key, type, id, ts, payload, partitions) -> (envelope, "
     "partition), or None for the Python path"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "keylane._speedups",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
  return PyModule_Create(&module);
}
