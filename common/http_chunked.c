/*
 * RFC 9112's chunked framing (section 7.1), checked beside http-parser.
 *
 * http-parser 2.9 as distributions build it (without HTTP_PARSER_STRICT)
 * takes any two bytes after chunk data for its CRLF, anything after a
 * chunk size up to a CR ("16 \r\n", "16;\n...\r\n") and a bare LF to end
 * the trailer section. A proxy in front that reads the same bytes by the
 * RFC sees other messages than this server does: a request smuggled past
 * it. So http.c feeds the bytes of every chunked body here
 * as well, ahead of http-parser, and refuses the request when this finds
 * them malformed:
 *
 *   chunked-body = *chunk last-chunk trailer-section CRLF
 *   chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
 *   chunk-size   = 1*HEXDIG
 *   chunk-ext    = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )
 *   ext-val      = token / quoted-string
 *   trailer-section = *( field-line CRLF )
 *
 * BWS is optional spaces or tabs; so whitespace is allowed before a ';'
 * or around '=', never at the end of the line. A size line (size and
 * extensions) is at most KL_CHUNK_LINE_MAX bytes: http-parser skips
 * extensions unbounded. The trailer lines are counted against max_header
 * by http.c (http-parser reports them as headers).
 */
#include <string.h>

#include "common/bytes.h"
#include "common/http.h"

#define KL_CHUNK_LINE_MAX 4096

enum {
  KL_CH_SIZE0, /* the first hex digit of a size */
  KL_CH_SIZE,  /* more hex digits */
  KL_CH_BWS,   /* whitespace after the size or a value: ';' must follow */
  KL_CH_NAME0, /* after ';' (and BWS): an extension's name */
  KL_CH_NAME,
  KL_CH_NAME_BWS, /* whitespace after a name: '=' or ';' must follow */
  KL_CH_VALUE0,   /* after '=' (and BWS): a token or a quoted string */
  KL_CH_TOKEN,
  KL_CH_QUOTED,
  KL_CH_QUOTED_ESC,
  KL_CH_QUOTED_END,
  KL_CH_SIZE_LF, /* the LF after the size line's CR */
  KL_CH_DATA,
  KL_CH_DATA_CR, /* the CRLF after chunk data */
  KL_CH_DATA_LF,
  KL_CH_TRAILER0, /* the start of a trailer line, or the final CRLF */
  KL_CH_TRAILER,
  KL_CH_TRAILER_LF,
  KL_CH_END_LF,
  KL_CH_DONE,
  KL_CH_BAD,
};

void kl__http_chunked_init(kl__http_chunked_t *c) {
  memset(c, 0, sizeof(*c));
  c->state = KL_CH_SIZE0;
}

bool kl__http_chunked_done(const kl__http_chunked_t *c) {
  return c->state == KL_CH_DONE;
}

static int chunked_bad(kl__http_chunked_t *c, const char *why) {
  c->state = KL_CH_BAD;
  c->why = why;
  return KL_CH_BAD;
}

/* Where a byte of the size line goes: an extension follows ';', the line
 * ends at CR; whitespace only before a ';' or around '='. */
static int ext_next(kl__http_chunked_t *c, unsigned char ch, int state) {
  bool ws = ch == ' ' || ch == '\t';
  switch (state) {
  case KL_CH_SIZE:
    if (kl__hex_value(ch) >= 0) {
      if (c->size >> 60)
        return chunked_bad(c, "a chunk size is over 2^64");
      c->size = c->size << 4 | (uint64_t)kl__hex_value(ch);
      return KL_CH_SIZE;
    }
    return ch == ';'    ? KL_CH_NAME0
           : ch == '\r' ? KL_CH_SIZE_LF
           : ws         ? KL_CH_BWS
                        : chunked_bad(c, "a chunk size holds a byte "
                                                 "that is not a hex digit");
  case KL_CH_BWS:
    return ws ? KL_CH_BWS
           : ch == ';'
               ? KL_CH_NAME0
               : chunked_bad(c, "whitespace ends a chunk-size line (only a ';' "
                                "and a chunk extension may follow it)");
  case KL_CH_NAME0:
    return ws ? KL_CH_NAME0
           : kl__http_tchar(ch)
               ? KL_CH_NAME
               : chunked_bad(c, "a chunk extension has no name");
  case KL_CH_NAME:
    return kl__http_tchar(ch) ? KL_CH_NAME
           : ch == '='        ? KL_CH_VALUE0
           : ch == ';'        ? KL_CH_NAME0
           : ch == '\r'       ? KL_CH_SIZE_LF
           : ws               ? KL_CH_NAME_BWS
                : chunked_bad(c, "a chunk extension's name holds a "
                                 "byte names may not hold");
  case KL_CH_NAME_BWS:
    return ws          ? KL_CH_NAME_BWS
           : ch == '=' ? KL_CH_VALUE0
           : ch == ';'
               ? KL_CH_NAME0
               : chunked_bad(c, "whitespace ends a chunk-size line (only "
                                "'=' or ';' may follow an extension's name)");
  case KL_CH_VALUE0:
    return ws                   ? KL_CH_VALUE0
           : ch == '"'          ? KL_CH_QUOTED
           : kl__http_tchar(ch) ? KL_CH_TOKEN
                                : chunked_bad(c, "a chunk extension's value is "
                                                 "neither a token nor quoted");
  case KL_CH_TOKEN:
    return kl__http_tchar(ch) ? KL_CH_TOKEN
           : ch == ';'        ? KL_CH_NAME0
           : ch == '\r'       ? KL_CH_SIZE_LF
           : ws               ? KL_CH_BWS
                : chunked_bad(c, "a chunk extension's value holds "
                                 "a byte tokens may not hold");
  case KL_CH_QUOTED: /* qdtext: HTAB, SP, VCHAR but '"' and '\', obs-text */
    return ch == '"'    ? KL_CH_QUOTED_END
           : ch == '\\' ? KL_CH_QUOTED_ESC
           : ws || (ch >= 0x21 && ch != 0x7f)
               ? KL_CH_QUOTED
               : chunked_bad(c, "a chunk extension's quoted value holds a "
                                "control byte or is not closed");
  case KL_CH_QUOTED_ESC:
    return ws || (ch >= 0x21 && ch != 0x7f)
               ? KL_CH_QUOTED
               : chunked_bad(c, "a chunk extension's quoted value escapes "
                                "a control byte");
  default: /* KL_CH_QUOTED_END */
    return ch == ';'    ? KL_CH_NAME0
           : ch == '\r' ? KL_CH_SIZE_LF
           : ws         ? KL_CH_BWS
                        : chunked_bad(c, "a byte follows a chunk extension's "
                                                 "quoted value");
  }
}

/* The states that take one given byte, where it leads, and what it means
 * when another comes. */
static const struct {
  uint8_t state;
  char want;
  uint8_t next;
  const char *why;
} kl_one_byte[] = {
    {KL_CH_DATA_CR, '\r', KL_CH_DATA_LF,
     "chunk data is not followed by CRLF (or is longer than its size)"},
    {KL_CH_DATA_LF, '\n', KL_CH_SIZE0, "chunk data is not followed by CRLF"},
    {KL_CH_TRAILER_LF, '\n', KL_CH_TRAILER0,
     "a trailer line holds a CR that is not followed by LF"},
    {KL_CH_END_LF, '\n', KL_CH_DONE, "the chunked body does not end in CRLF"},
};

/* One byte outside chunk data; @returns the next state. */
static int chunked_step(kl__http_chunked_t *c, unsigned char ch) {
  for (size_t i = 0; i < sizeof(kl_one_byte) / sizeof(kl_one_byte[0]); i++)
    if (kl_one_byte[i].state == c->state)
      return ch == (unsigned char)kl_one_byte[i].want
                 ? kl_one_byte[i].next
                 : chunked_bad(c, kl_one_byte[i].why);
  switch (c->state) {
  case KL_CH_SIZE0:
    c->line = 1;
    if (kl__hex_value(ch) < 0)
      return chunked_bad(c, "a chunk-size line does not start with a hex "
                            "digit");
    c->size = (uint64_t)kl__hex_value(ch);
    return KL_CH_SIZE;
  case KL_CH_SIZE_LF:
    if (ch != '\n')
      return chunked_bad(c, "a chunk-size line does not end in CRLF");
    return c->size ? KL_CH_DATA : KL_CH_TRAILER0;
  case KL_CH_TRAILER0: /* a CR here ends the section, else begins a line */
  case KL_CH_TRAILER:
    if (ch == '\n')
      return chunked_bad(c, "a trailer line, or the trailer section, ends "
                            "in a bare LF, not CRLF");
    return ch != '\r'                   ? KL_CH_TRAILER
           : c->state == KL_CH_TRAILER0 ? KL_CH_END_LF
                                        : KL_CH_TRAILER_LF;
  default: /* the size line after its first digit */
    if (++c->line > KL_CHUNK_LINE_MAX)
      return chunked_bad(c, "a chunk-size line (size and extensions) is "
                            "longer than 4096 bytes");
    return ext_next(c, ch, c->state);
  }
}

int kl__http_chunked_scan(kl__http_chunked_t *c, const char *buf, size_t len) {
  size_t i = 0;
  while (i < len && c->state != KL_CH_DONE && c->state != KL_CH_BAD) {
    if (c->state == KL_CH_DATA) {
      uint64_t n = len - i < c->size ? len - i : c->size;
      c->size -= n;
      i += (size_t)n;
      if (!c->size)
        c->state = KL_CH_DATA_CR;
      continue;
    }
    c->state = (uint8_t)chunked_step(c, (unsigned char)buf[i++]);
  }
  return c->state == KL_CH_BAD ? -1 : 0;
}
