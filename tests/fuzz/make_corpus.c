/*
 * Writes the envelope fuzzer's seed corpus into the directory argv[1]: a few
 * valid envelopes and near-misses, each a single mutation away from valid, so
 * that the fuzzer starts at every error branch instead of at random bytes.
 * Seed format (see fuzz_envelope.c): 2-byte little-endian key length, key,
 * value. Generated at build time rather than committed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "keylane/event.h"

static const char *dir;
static int seeds;

static void write_seed(const char *name, const void *value, size_t len) {
  static const char key[] = "account-42";
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    perror(path);
    exit(1);
  }
  unsigned char klen[2] = {sizeof(key) - 1, 0};
  fwrite(klen, 1, 2, f);
  fwrite(key, 1, sizeof(key) - 1, f);
  if (len > 0)
    fwrite(value, 1, len, f);
  if (fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  seeds++;
}

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* The standard value of field @p i, or a variant of it when @p odd. */
static void pack_value(msgpack_packer *pk, int i, int odd, const char *how) {
  if (odd && strcmp(how, "str") == 0) {
    pack_str(pk, "1");
  } else if (i == 0) {
    msgpack_pack_int(pk, odd && strcmp(how, "v2") == 0 ? 2 : 1);
  } else if (i == 1) {
    pack_str(pk, "0190e6c1-8d2c-7a3b-8f00-0123456789ab");
  } else if (i == 2) {
    pack_str(pk, "credit");
  } else if (i == 3) {
    msgpack_pack_int64(pk, 1700000000000);
  } else if (i == 4) {
    msgpack_pack_bin(pk, 3);
    msgpack_pack_bin_body(pk, "abc", 3);
  } else {
    msgpack_pack_map(pk, 1);
    pack_str(pk, "trace");
    pack_str(pk, "x");
  }
}

/* An envelope with field @p odd written as @p how: "skip", "dup", "str"
 * (a str where it is not one), "v2", or "unknown" (adds field "x"). */
static void write_variant(const char *name, const char *odd, const char *how) {
  static const char *const fields[] = {"v", "id", "t", "ts", "p", "h"};
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  int skip = strcmp(how, "skip") == 0;
  int dup = strcmp(how, "dup") == 0, unknown = strcmp(how, "unknown") == 0;
  msgpack_pack_map(&pk, 6 - skip + dup + unknown);
  for (int i = 0; i < 6; i++) {
    int is_odd = strcmp(fields[i], odd) == 0;
    if (is_odd && skip)
      continue;
    pack_str(&pk, fields[i]);
    pack_value(&pk, i, is_odd, how);
  }
  if (dup || unknown) {
    pack_str(&pk, dup ? odd : "x");
    pack_str(&pk, "y");
  }
  write_seed(name, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
}

static void write_valid(void) {
  static const kl_header_t headers[] = {{"trace", 5, "00-4bf92f35-01", 14},
                                        {"empty", 5, "", 0}};
  kl_event_t ev = {.key = "k",
                   .key_len = 1,
                   .id = "id-1",
                   .id_len = 4,
                   .type = "credit",
                   .type_len = 6,
                   .ts = 1700000000000,
                   .payload = "{\"amount\":5}",
                   .payload_len = 12,
                   .headers = headers,
                   .header_count = 2};
  void *buf;
  size_t len;
  if (kl_event_encode(&ev, &buf, &len) != KL_OK)
    exit(1);
  write_seed("valid-headers", buf, len);
  write_seed("truncated", buf, len - 1);
  char *trailing = malloc(len + 1);
  memcpy(trailing, buf, len);
  trailing[len] = 0x00;
  write_seed("trailing", trailing, len + 1);
  free(trailing);
  free(buf);
  ev.header_count = 0;
  ev.headers = NULL;
  ev.payload_len = 0;
  ev.ts = -1;
  if (kl_event_encode(&ev, &buf, &len) != KL_OK)
    exit(1);
  write_seed("valid-minimal", buf, len);
  free(buf);
}

/* Formats msgpack-c never writes but other encoders may. */
static void write_wide(void) {
  static const unsigned char wide[] = {
      0xdf, 0,   0,    0,    5,    0xd9, 1,   'v',  0xcf, 0,   0,  0, 0, 0,
      0,    0,   1,    0xda, 0,    2,    'i', 'd',  0xdb, 0,   0,  0, 1, 'X',
      0xa1, 't', 0xa1, 'c',  0xa2, 't',  's', 0xd3, 0x80, 0,   0,  0, 0, 0,
      0,    0,   0xa1, 'p',  0xc6, 0,    0,   0,    2,    'h', 'i'};
  write_seed("valid-wide", wide, sizeof(wide));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  write_valid();
  write_wide();
  write_variant("version-2", "v", "v2");
  write_variant("payload-str", "p", "str");
  write_variant("ts-str", "ts", "str");
  write_variant("headers-str", "h", "str");
  write_variant("missing-id", "id", "skip");
  write_variant("missing-h", "h", "skip");
  write_variant("duplicate-id", "id", "dup");
  write_variant("unknown-field", "v", "unknown");
  write_seed("not-map", "\x91\x01", 2);
  write_seed("empty", "", 0);
  printf("make_corpus: %d seeds in %s\n", seeds, dir);
  return 0;
}
