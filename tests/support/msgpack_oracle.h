/*
 * What the gateway's reading of a msgpack publish body must equal
 * (broker/gateway_body.c reads it from its bytes: kl__msgpack_check(),
 * kl__jevent_parse_mp()): the body made the JSON document it stands for
 * (kl__msgpack_body_to_json()) and its events read by the JSON body's
 * rules, kl__jevent_parse(), as the gateway read it before, with two
 * differences. Where the msgpack's "payload" is a bin, the payload is its
 * bytes (before, the JSON form of a bin, {"$base64": STR}, was taken for
 * a bin wherever it came from, so a map of that shape was stored as the
 * bytes its string encodes). And a body nests as deep as a JSON body may
 * (before, its containers counted against a payload's limit of 64 values).
 * Shared by the fuzzer (tests/fuzz/fuzz_gateway_body.c) and
 * tests/unit/test_gateway_msgpack.c.
 */
#ifndef KEYLANE_TESTS_SUPPORT_MSGPACK_ORACLE_H
#define KEYLANE_TESTS_SUPPORT_MSGPACK_ORACLE_H

#include <stddef.h>

#include "broker/gateway_internal.h"

/**
 * Reads @p body (@p len bytes) the oracle's way and compares it with
 * kl__gw_batch_decode()'s @p status and @p batch for the same body and
 * @p max_events: both refused, or the same events, field by field (a
 * "delay" read a moment apart may differ by 5 s).
 * @returns NULL when they agree; else @p why, saying what differs.
 */
const char *kl_msgpack_oracle_diff(const void *body, size_t len,
                                   size_t max_events, int status,
                                   const kl__gw_batch_t *batch, char *why,
                                   size_t size);

#endif
