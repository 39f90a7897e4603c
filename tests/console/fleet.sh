# Sourced by the console's tests (tests/mock/test_console_*.sh): starts an
# embedded cluster, two workers with --metrics-listen whose exec handler
# asks to retry every event of a key "poison*" (so the key stays retrying,
# with the handler's error), publishes, and starts `keylane console` on
# both workers. Sets B (bootstrap), W1 and W2 (worker URLs), CONSOLE (the
# page's URL) and W (a scratch directory); every process it starts is
# ended by the EXIT trap, also when the test fails.
set -euo pipefail
BIN=${KEYLANE_BIN:?}
W=$(mktemp -d /tmp/keylane-console-XXXXXX)
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*" >&2
  for f in "$W"/*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
  exit 1
}
# Waits up to 15 s for PATTERN in FILE; prints the first match's group.
wait_for() {
  for _ in $(seq 150); do
    v=$(sed -n "s|$2|\\1|p" "$1" | head -n 1)
    [ -n "$v" ] && { echo "$v"; return 0; }
    sleep 0.1
  done
  return 1
}

cat >"$W/handler.py" <<'PY'
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if req.get("key", "").startswith("poison"):
        ans = {"seq": req["seq"], "status": "retry",
               "error": "poison key refused by the test handler"}
    else:
        ans = {"seq": req["seq"], "status": "ok"}
    print(json.dumps(ans), flush=True)
PY

"$BIN" broker --embedded --partitions 4 -t events >"$W/cluster.out" 2>"$W/cluster.log" &
pids+=($!)
B=$(wait_for "$W/cluster.out" '^bootstrap=\(.*\)') || fail "the embedded cluster did not start"

{
  for i in 1 2 3 4 5 6; do echo "{\"key\":\"acct-$i\",\"type\":\"t\",\"id\":\"c-$i\",\"payload\":{}}"; done
  echo '{"key":"poison-1","type":"t","id":"c-poison","payload":{}}'
} | "$BIN" publish -b "$B" -t events >/dev/null

for n in 1 2; do
  "$BIN" worker -b "$B" -t events -g console --store "$W/store" \
    --handler "exec:python3 $W/handler.py" --metrics-listen 127.0.0.1:0 \
    -X worker.max.attempts=1000 -X worker.retry.initial.ms=50 \
    -X worker.retry.max.ms=200 >"$W/worker$n.log" 2>&1 &
  pids+=($!)
done
P1=$(wait_for "$W/worker1.log" '.*serving /metrics.*(port \([0-9]*\)).*') || fail "worker 1 has no metrics port"
P2=$(wait_for "$W/worker2.log" '.*serving /metrics.*(port \([0-9]*\)).*') || fail "worker 2 has no metrics port"
W1=http://127.0.0.1:$P1
W2=http://127.0.0.1:$P2

"$BIN" console -b "$B" -t events -g console --store "$W/store" \
  --worker "$W1" --worker "$W2" --listen 127.0.0.1:0 >"$W/console.out" 2>"$W/console.log" &
pids+=($!)
CONSOLE=$(wait_for "$W/console.out" '^console=\(.*\)') || fail "the console did not start"
