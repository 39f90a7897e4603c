#!/usr/bin/env bash
# The C handler of docs/exec-protocol.md, deploy/examples/handler_so.c,
# as a reader builds it: compiled against include/ alone, loaded by
# `keylane worker --handler so:PATH` on an embedded cluster; its counts are
# in the store, and an event of another type is a dead letter.
set -euo pipefail
SRC=${KEYLANE_SOURCE_DIR:?}
BIN=${KEYLANE_BIN:?}
W=$(mktemp -d /tmp/keylane-handler-so-XXXXXX)
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
# The bytes the handler stored under KEY (decimal text), or nothing.
count_of() {
  "$BIN" store get "$1" --store "$W/store" --json 2>/dev/null |
    python3 -c 'import base64, json, sys; print(base64.b64decode(json.load(sys.stdin)["value_b64"]).decode())'
}

${CC:-cc} -std=c11 -Wall -Wextra -Werror -shared -fPIC -I "$SRC/include" \
  -o "$W/handler_so.so" "$SRC/deploy/examples/handler_so.c"

"$BIN" broker --embedded --partitions 4 -t events >"$W/cluster.out" 2>"$W/cluster.log" &
pids+=($!)
for _ in $(seq 100); do grep -q bootstrap= "$W/cluster.out" && break; sleep 0.1; done
B=$(sed -n 's/^bootstrap=//p' "$W/cluster.out")
[ -n "$B" ] || fail "the embedded cluster did not start: $(cat "$W/cluster.log")"

{
  for i in 1 2 3; do echo "{\"key\":\"k1\",\"type\":\"count\",\"id\":\"so-k1-$i\",\"payload\":{}}"; done
  echo '{"key":"k2","type":"count","id":"so-k2-1","payload":{}}'
  echo '{"key":"k2","type":"other","id":"so-k2-2","payload":{}}'
} | "$BIN" publish -b "$B" -t events >/dev/null

"$BIN" worker -b "$B" -t events -g so --store "$W/store" \
  --handler "so:$W/handler_so.so" >"$W/worker.log" 2>&1 &
WP=$!
pids+=($WP)
for _ in $(seq 150); do
  [ "$(count_of count/k1 || true)" = 3 ] &&
    "$BIN" store get --id so-k2-2 --store "$W/store" >/dev/null 2>&1 && break
  kill -0 "$WP" 2>/dev/null || fail "the worker exited: $(tail "$W/worker.log")"
  sleep 0.2
done
kill -TERM "$WP"
wait "$WP" || fail "the worker did not stop cleanly: $(tail "$W/worker.log")"

got=$(count_of count/k1) || fail "no count/k1: $(tail "$W/worker.log")"
[ "$got" = 3 ] || fail "count/k1 is \"$got\", want 3"
got=$(count_of count/k2) || fail "no count/k2"
[ "$got" = 1 ] || fail "count/k2 is \"$got\", want 1"
got=$("$BIN" store get --id so-k2-2 --store "$W/store" --json)
grep -q dead_letter <<<"$got" || fail "so-k2-2 is not a dead letter: $got"
echo "ok: the so: handler counted k1=3 k2=1 and dead-lettered the other type"
